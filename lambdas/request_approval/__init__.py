"""Lambda package of the request_approval workflow step (handler string: request_approval.handler.handler)."""

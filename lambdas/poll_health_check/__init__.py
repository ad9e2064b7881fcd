"""Lambda package of the poll_health_check workflow step (handler string: poll_health_check.handler.handler)."""

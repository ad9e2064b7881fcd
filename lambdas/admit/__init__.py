"""Lambda package of the admit workflow step (handler string: admit.handler.handler)."""

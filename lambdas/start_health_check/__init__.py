"""Lambda package of the start_health_check workflow step (handler string: start_health_check.handler.handler)."""

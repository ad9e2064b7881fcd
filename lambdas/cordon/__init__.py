"""Lambda package of the cordon workflow step (handler string: cordon.handler.handler)."""

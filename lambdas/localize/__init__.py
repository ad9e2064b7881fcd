"""Lambda package of the localize workflow step (handler string: localize.handler.handler)."""

"""Lambda package of the screen workflow step (handler string: screen.handler.handler)."""

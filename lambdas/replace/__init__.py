"""Lambda package of the replace workflow step (handler string: replace.handler.handler)."""

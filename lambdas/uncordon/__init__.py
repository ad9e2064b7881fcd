"""Lambda package of the uncordon workflow step (handler string: uncordon.handler.handler)."""

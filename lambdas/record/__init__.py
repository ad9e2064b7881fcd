"""Lambda package of the record workflow step (handler string: record.handler.handler)."""

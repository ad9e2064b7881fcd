"""One construct per concern; `infra.stack.SdcGuardStack` composes them."""

"""What every model shares: extra keys ignored, and parsing at the edge with typed errors.

Parse once at the edge (``parse_step``), then logic code works on typed objects. Every model of a
workflow state ignores extra keys: each step receives the whole Map item state and reads only what
it needs (docs/CONTRACT.md, "Workflow state").
"""

from __future__ import annotations

from typing import Any, TypeVar

from aws_lambda_powertools.utilities.parser import parse
from pydantic import BaseModel, ConfigDict, ValidationError

from ..errors import InvalidStepInput


class Model(BaseModel):
    """Base of the workflow's models: extra keys ignored, fields settable by name or alias."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)


M = TypeVar("M", bound=BaseModel)


def parse_step(event: Any, model: type[M]) -> M:
    """Parse a step's input with Powertools Parser; a mismatch is ``InvalidStepInput``."""
    try:
        return parse(event=event, model=model)
    except (ValidationError, ValueError, TypeError) as exc:
        raise InvalidStepInput(f"{model.__name__}: {first_errors(exc)}") from exc


def first_errors(exc: Exception, limit: int = 3) -> str:
    """A short, one-line description of a validation failure."""
    cause = exc.__cause__ if not isinstance(exc, ValidationError) else exc
    if isinstance(cause, ValidationError):
        parts = [
            f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}"
            for err in cause.errors()[:limit]
        ]
        return "; ".join(parts)
    return str(exc)


__all__ = ["Model", "first_errors", "parse_step"]

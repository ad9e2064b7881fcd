"""What every model shares: extra keys ignored, and parsing at the edge with typed errors.

Parse once at the edge (``parse_step``), then logic code works on typed objects. Every model of a
workflow state ignores extra keys: each step receives the whole Map item state and reads only what
it needs (docs/CONTRACT.md, "Workflow state").
"""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from aws_lambda_powertools.utilities.parser import parse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import InvalidStepInput

LEDGER_INT_LIMIT = 2**63
"""Every integer a report or a workflow state carries (steps, ranks, counts) is below this: the
ledger is DynamoDB, whose Number holds 38 significant digits, and a step of ``10**40`` once
made the record step raise ``decimal.Inexact`` after the node was cordoned (no event, no
message). 2**63 (19 digits, a signed 64-bit integer, what torch and the agent count steps in)
leaves every real value in range and refuses the rest at parse, naming the field."""

LedgerInt = Annotated[int, Field(ge=0, lt=LEDGER_INT_LIMIT)]
"""A step, rank or count: ``0 <= value < LEDGER_INT_LIMIT``."""

LedgerRank = Annotated[int, Field(gt=-LEDGER_INT_LIMIT, lt=LEDGER_INT_LIMIT)]
"""A rank in a report's lists (pairs, culprits, suspects, verdicts): a signed 64-bit integer,
within the ledger's range. Not refused below 0 here, as the reports have always been read (what
a rank names is checked where it is used: a node, a pod, HyperPod)."""

LedgerFloat = Annotated[float, Field(ge=0, le=2**53, allow_inf_nan=False)]
"""A metric value a report carries (a count of ranks, pairs or tensors): finite, non-negative,
and an integer below 2**53 stays exact in a float and in a DynamoDB Number."""


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


__all__ = [
    "LEDGER_INT_LIMIT",
    "LedgerFloat",
    "LedgerInt",
    "LedgerRank",
    "Model",
    "first_errors",
    "parse_step",
]

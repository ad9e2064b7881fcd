"""The record step's input: a transition, whether to notify, and whatever state the workflow
had (a Map item's, localize's output, or the raw event)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import Model as _Model
from .results import StepResults
from .state import Alarm, Suspect

Transition = Literal[
    "ambiguous",
    "no_suspects",
    "duplicate",
    "circuit_open",
    "cordoned",
    "health_check_passed",
    "health_check_failed",
    "health_check_timed_out",
    "replaced_by_hyperpod",
    "awaiting_approval",
    "approved",
    "rejected",
    "released",
    "approval_timed_out",
    "replaced",
    "failed",
    "abandoned",
    "shadow",
]


class StepError(_Model):
    """The ``{Error, Cause}`` object a Catch puts in the state."""

    error: str = Field(default="", alias="Error")
    cause: str = Field(default="", alias="Cause")


class RecordState(StepResults):
    """The state record receives: a Map item's state, localize's output, or the raw event."""

    alarm: Alarm | None = None
    suspect: Suspect | None = None
    suspects: list[Suspect] = Field(default_factory=list)
    execution: str = ""
    item: int | None = None


class RecordInput(_Model):
    """Input of record."""

    transition: Transition
    notify: bool = False
    state: RecordState = Field(default_factory=RecordState)
    error: StepError | None = None
    execution: str = ""
    """``$$.Execution.Id``, set by the workflow on every record task (the state may lack it)."""


class RecordResult(_Model):
    """Output of record."""

    recorded: bool = True


__all__ = ["RecordInput", "RecordResult", "RecordState", "StepError", "Transition"]

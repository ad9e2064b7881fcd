"""The record step's input: a transition, whether to notify, and whatever state the workflow
had (a Map item's, localize's output, or the raw event)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .alarm_event import AlarmContributor
from .base import Model as _Model
from .results import StepResults
from .state import Alarm, PendingNode, Refusal, Suspect

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
    "refused",
]


class StepError(_Model):
    """The ``{Error, Cause}`` object a Catch puts in the state."""

    error: str = Field(default="", alias="Error")
    cause: str = Field(default="", alias="Cause")


class EventDetail(_Model):
    """What record reads of a raw alarm event (a failure before localize normalised it): the
    alarm and its contributor, which name the alarm episode."""

    alarm_name: str = Field(default="", alias="alarmName", max_length=255)
    alarm_contributor: AlarmContributor | None = Field(default=None, alias="alarmContributor")


class RecordState(StepResults):
    """The state record receives: a Map item's state, localize's output, or the raw event."""

    alarm: Alarm | None = None
    suspect: Suspect | None = None
    suspects: list[Suspect] = Field(default_factory=list)
    pending: PendingNode | list[PendingNode] | None = None
    refused: list[Refusal] = Field(default_factory=list)
    refused_count: int = 0
    execution: str = ""
    item: int | None = None
    detail: EventDetail | None = None


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


__all__ = ["EventDetail", "RecordInput", "RecordResult", "RecordState", "StepError", "Transition"]

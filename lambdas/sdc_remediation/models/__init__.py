"""Pydantic models: what crosses the workflow (the alarm event, the agent's report, each step's
input and output). Parsed once at the edge; logic code works on these typed objects.

- ``base``: the shared base model and ``parse_step`` (a mismatch is ``InvalidStepInput``);
- ``alarm_event``: the EventBridge "CloudWatch Alarm State Change" event (the workflow input);
- ``report``: the agent's ``sdc.alarm/v1`` report and ``sdc.rankmap/v1`` rank map;
- ``state``: the alarm, the suspects, the Map item's state (bounded);
- ``results``: what each per-node step returns;
- ``record``: the record step's input;
- ``canary``: a canary run as the ledger holds it, and its steps.
"""

from __future__ import annotations

from .alarm_event import AlarmStateChangeEvent, parse_alarm_event
from .base import parse_step
from .record import RecordInput, RecordResult, RecordState, StepError, Transition
from .report import RankInfo, RankMap, Report, ReportMetric, VerdictEntry
from .results import (
    Admission,
    ApprovalDecision,
    CordonResult,
    HealthResult,
    HealthStatus,
    ReplaceResult,
    ScreenResult,
    ScreenStatus,
)
from .state import (
    Alarm,
    ApprovalRequestInput,
    ItemState,
    LateInput,
    LocalizeResult,
    PendingNode,
    PollInput,
    Refusal,
    Suspect,
)

__all__ = [
    "Admission",
    "Alarm",
    "AlarmStateChangeEvent",
    "ApprovalDecision",
    "ApprovalRequestInput",
    "CordonResult",
    "HealthResult",
    "HealthStatus",
    "ItemState",
    "LateInput",
    "LocalizeResult",
    "PendingNode",
    "PollInput",
    "RankInfo",
    "RankMap",
    "RecordInput",
    "RecordResult",
    "RecordState",
    "Refusal",
    "ReplaceResult",
    "Report",
    "ReportMetric",
    "ScreenResult",
    "ScreenStatus",
    "StepError",
    "Suspect",
    "Transition",
    "VerdictEntry",
    "parse_alarm_event",
    "parse_step",
]

"""The live canary: a synthetic SDC event that walks the deployed chain and closes itself.

A schedule invokes the canary function (``start.start_run``): it records a run in the ledger,
writes an ``sdc.alarm/v1`` report for the reserved canary job and node (``sdc_contract.canary``)
into the agent's report log group, and puts the canary's datum on its own SDC series. From there
the real path runs: the canary's alarm fires, the EventBridge rule starts the workflow, localize
accepts the report (only for the reserved node, only for a run the ledger holds:
``logic/localize/canary.py``), and every step acts on a ``targets.canary.CanaryNode`` instead of
a HyperPod node: admit reads the guard without claiming a slot, cordon, the deep health check
and replace run in dry run, request_approval stores the canary's approval as for a person and
invokes the approve function to settle it (``approval``: nobody is paged), and the record step
writes each step on the run, then closes it and puts ``canary_completed``.

The canary alarm fires when no ``canary_completed`` arrived in its window; the canary function
then says where the newest run stopped (``watch.check``).

Safety: the reserved instance id is never a node of the cluster; localize refuses a canary report
naming any other node and a training report naming the canary's; a suspect carries
``canary_run`` only for the reserved node (``models.Suspect``); every step runs a canary under
DRY_RUN. Pods can write reports but not the ledger, so a pod cannot pass a report off as a
canary run.

Modules: ``start`` (the schedule), ``approval`` (the approve function's side), ``watch`` (the
canary alarm's side). The run's model is ``models.canary``, its table ``dal.canary_runs``.
"""

from __future__ import annotations

from .approval import (
    APPROVER,
    SETTLE_ACTION,
    CanaryApprovalRefused,
    ask_approve,
    canary_run_of,
    settle_approval,
)
from .start import canary_report, start_run
from .watch import Stop, check, stopped_at

__all__ = [
    "APPROVER",
    "SETTLE_ACTION",
    "CanaryApprovalRefused",
    "Stop",
    "ask_approve",
    "canary_report",
    "canary_run_of",
    "check",
    "settle_approval",
    "start_run",
    "stopped_at",
]

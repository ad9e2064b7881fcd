"""The canary's approval, settled by the approve function: request_approval stores it as for a
person and asks the approve function (``ask_approve``) to approve it as the canary
(``settle_approval``), through the same claim and SendTaskSuccess a person's decision takes.
So the approve function stays the only one that sends task results, and the canary proves it
works."""

from __future__ import annotations

import json
from typing import Any

import sdc_contract as contract

from ...clients import functions
from ...config import Settings
from ...dal.approvals import Approvals
from ...dal.canary_runs import RunStore
from ...errors import ApprovalAlreadyDecided, ConfigurationError, RemediationError
from ...models import ApprovalDecision
from ...models.canary import FAILED
from ...observability import logger

APPROVER = "sdc-guard canary (no person: a synthetic event on the reserved canary node)"
SETTLE_ACTION = "settle_canary_approval"
"""The ``action`` of the event request_approval invokes the approve function with (directly, not
through its URL): ``{"action": SETTLE_ACTION, "approval_id": ...}``."""
CANARY_REMEDIATION_PREFIX = "c-"
"""A canary remediation's id starts with this (``targets.canary.CanaryNode.admit``)."""


class CanaryApprovalRefused(RemediationError):
    """A direct ``settle_canary_approval`` event named an approval that is not the canary's:
    nothing is sent, the record is unchanged."""


def settle_event(approval_id: str) -> dict[str, str]:
    """The event request_approval invokes the approve function with."""
    return {"action": SETTLE_ACTION, "approval_id": approval_id}


def ask_approve(settings: Settings, approval_id: str) -> None:
    """Invoke the approve function (asynchronously, ``Event``) to settle the canary's approval.

    Asynchronously: the approve function sends SendTaskSuccess after this step returned, the
    order a person's decision takes, and neither function's timeout depends on the other's. An
    invoke Lambda refuses (denied, no such function) raises here and fails the step; an approve
    function that fails writes its error on the run (``settle_approval``), and the run then
    stops at ``approved``, which the canary alarm's message names.
    """
    function = settings.approve_function
    if not function:
        raise ConfigurationError(
            f"{contract.APPROVE_FUNCTION} is not set: request_approval cannot ask the approve "
            "function to settle the canary's approval (infra sets it when the canary is on)"
        )
    status = functions.invoke_event(function, settle_event(approval_id))
    if status != 202:
        raise ConfigurationError(
            f"the approve function {function} did not queue the canary approval {approval_id} "
            f"(status {status})"
        )
    logger.info("canary approval sent to the approve function", extra={"approval_id": approval_id})


def canary_run_of(item: dict[str, Any], settings: Settings) -> str:
    """The run id of an approval record that is the canary's: its node is the reserved canary
    node, its remediation a canary's, and its evidence names an open canary run in the ledger.
    Anything else is ``CanaryApprovalRefused``."""
    approval_id = item.get("approval_id", "?")
    refused = f"approval {approval_id} is not a canary approval"
    if (
        item.get("instance_id") != contract.CANARY_INSTANCE_ID
        or item.get("node_name") != contract.CANARY_NODE_NAME
    ):
        raise CanaryApprovalRefused(
            f"{refused}: its node is {item.get('node_name')!r} ({item.get('instance_id')!r}), "
            f"not the reserved canary node {contract.CANARY_NODE_NAME}; only a person decides it, "
            "through the approve function's URL"
        )
    evidence = json.loads(item.get("evidence") or "{}")
    run_id = evidence.get("canary_run")
    remediation = str(item.get("remediation_id") or "")
    if not isinstance(run_id, str) or not remediation.startswith(CANARY_REMEDIATION_PREFIX):
        raise CanaryApprovalRefused(
            f"{refused}: remediation {remediation!r} with canary run {run_id!r} is no canary "
            "remediation"
        )
    run = RunStore(settings.ledger_table, settings.hyperpod_cluster_name).get(run_id)
    if run is None or run.completed:
        raise CanaryApprovalRefused(f"{refused}: run {run_id!r} is not an open canary run")
    return run.run_id


def settle_approval(settings: Settings, approval_id: str) -> ApprovalDecision | None:
    """The approve function's side: approve the canary's approval ``approval_id`` as
    ``APPROVER``, through the same claim and SendTaskSuccess a person's decision takes.

    ``CanaryApprovalRefused`` (nothing sent) unless the record is the canary's. None when it was
    already decided (a retried invoke). Any other failure is written on the run, then raised.
    """
    approvals = Approvals(settings.approvals_table)
    run_id = canary_run_of(approvals.get(approval_id), settings)
    try:
        return approvals.decide(
            approval_id, "approve", reason=f"canary run {run_id}", approver=APPROVER
        )
    except ApprovalAlreadyDecided:
        logger.info("canary approval already decided", extra={"approval_id": approval_id})
        return None
    except Exception as exc:
        try:
            RunStore(settings.ledger_table, settings.hyperpod_cluster_name).reach(
                run_id,
                FAILED,
                error=f"the approve function could not settle canary approval {approval_id}: "
                f"{type(exc).__name__}: {exc}",
            )
        except Exception:  # the send's error is the one to raise; this one is only logged
            logger.exception("could not write the failed canary approval on the run")
        raise


__all__ = [
    "APPROVER",
    "SETTLE_ACTION",
    "CanaryApprovalRefused",
    "ask_approve",
    "canary_run_of",
    "settle_approval",
    "settle_event",
]

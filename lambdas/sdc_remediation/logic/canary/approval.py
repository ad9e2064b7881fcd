"""The canary's approval, settled through the approve function's URL: request_approval stores it
as for a person and calls the URL (``ask_approve``: a SigV4-signed request with its own role's
credentials, the canary's own action ``settle_canary_approval``); the approve function approves it
as the canary (``settle_approval``) through the same claim and SendTaskSuccess a person's decision
takes, and only if the record is the canary's.

So no role invokes the approve function except through its URL (IAM conditions every grant on
``lambda:InvokedViaFunctionUrl``: a direct invoke could carry a made-up ``requestContext``), the
approve function stays the only one that sends task results, and the canary proves the URL, its
authentication and the function work."""

from __future__ import annotations

import json
from typing import Any

import sdc_contract as contract

from ... import clock
from ...clients.approval_url import ApprovalService
from ...config import Settings
from ...dal.approvals import Approvals
from ...dal.canary_runs import RunStore
from ...errors import ApprovalAlreadyDecided, ConfigurationError, RemediationError
from ...models import ApprovalDecision
from ...models.canary import FAILED
from ...observability import logger

APPROVER = "sdc-guard canary (no person: a synthetic event on the reserved canary node)"
SETTLE_ACTION = "settle_canary_approval"
"""The canary's own action on the approve function's URL: ``{"action": SETTLE_ACTION,
"approval_id": ...}``, which settles a canary approval and nothing else."""
CANARY_REMEDIATION_PREFIX = "c-"
"""A canary remediation's id starts with this (``targets.canary.CanaryNode.admit``)."""


class CanaryApprovalRefused(RemediationError):
    """A direct ``settle_canary_approval`` event named an approval that is not the canary's:
    nothing is sent, the record is unchanged."""


def ask_approve(settings: Settings, approval_id: str) -> None:
    """Ask the approve function, through its URL, to settle the canary's approval.

    Synchronous: the URL answers when the approve function has sent the decision (the workflow
    then resumes). A refusal or a failure raises here and fails the step; the approve function
    writes its own failure on the run (``settle_approval``), so the run stops at ``approved``,
    which the canary alarm's message names.
    """
    url = settings.approval_url
    if not url:
        raise ConfigurationError(
            f"{contract.APPROVAL_URL} is not set: request_approval cannot ask the approve "
            "function to settle the canary's approval (infra sets it on request_approval)"
        )
    result = ApprovalService(url).call(SETTLE_ACTION, approval_id=approval_id)
    logger.info(
        "canary approval settled through the approve function's URL",
        extra={"approval_id": approval_id, "already_decided": result.get("already_decided")},
    )


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
    if run is None or not run.is_open(clock.now()):
        raise CanaryApprovalRefused(
            f"{refused}: run {run_id!r} is not an open canary run (completed, or expired "
            "after canaryTimeout)"
        )
    return run.run_id


def settle_approval(
    settings: Settings, approval_id: str, caller: str = ""
) -> ApprovalDecision | None:
    """The approve function's side: approve the canary's approval ``approval_id`` as
    ``APPROVER``, through the same claim and SendTaskSuccess a person's decision takes;
    ``caller`` (the principal the URL authenticated) goes into the reason.

    ``CanaryApprovalRefused`` (nothing sent) unless the record is the canary's. None when it was
    already decided (a retried call). Any other failure is written on the run, then raised.
    """
    approvals = Approvals(settings.approvals_table)
    run_id = canary_run_of(approvals.get(approval_id), settings)
    reason = f"canary run {run_id}" + (f", settled through the URL by {caller}" if caller else "")
    try:
        return approvals.decide(approval_id, "approve", reason=reason, approver=APPROVER)
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
]

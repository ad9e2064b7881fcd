"""HyperPod deep health check: start it for the suspect's instance, then poll its outcome.

Progress is read from two places, since either can lag: DescribeClusterNode's instance status
(``DeepHealthCheckInProgress``, ``Failure``, ...) and the node labels HyperPod maintains
(``sagemaker.amazonaws.com/deep-health-check-status``: InProgress | Passed | Failed, and
``sagemaker.amazonaws.com/node-health-status``). An instance that disappears from the cluster
after the check was started was replaced by HyperPod's automatic node recovery.

A verdict label can be stale: it stays ``Passed``/``Failed`` from an earlier check (cluster
creation, a previous remediation) until HyperPod starts the new one. So the poll accepts a
verdict label only once this check was seen running (label ``InProgress`` or instance status
``DeepHealthCheckInProgress``, remembered in ``seen_in_progress``) or when the label differs from
the one the node had before the check (``label_before``, read by cordon, which runs just before
and has Kubernetes access). Until then it reports ``in_progress``, and ``timed_out`` after
``HEALTH_CHECK_TIMEOUT_SECONDS``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import botocore.exceptions

from .. import aws, clock
from ..clients import hyperpod
from ..clients.hyperpod import DHC_LABEL, DHC_RUNNING, FAILED_HEALTH, HEALTH_LABEL
from ..clients.kube import KubeApi, node_labels
from ..config import Settings
from ..errors import AwsApiUnavailable, HealthCheckRejected, NodeNotFound
from ..models import CordonResult, HealthResult, HealthStatus, PollInput, Suspect
from ..observability import logger

# Kept importable under their old names (tests and tools use them).
describe_node = hyperpod.describe_node
__all__ = ["DHC_LABEL", "HEALTH_LABEL", "classify", "describe_node", "poll", "start"]


def start(
    settings: Settings,
    suspect: Suspect,
    cordon: CordonResult | None = None,
    kube: Callable[[], KubeApi] | None = None,
) -> HealthResult:
    """Start the configured deep health checks on the suspect's instance (idempotent).

    ``cordon`` is the cordon step's result: its ``health_check_label`` (the verdict label left
    by an earlier check) becomes ``label_before``, so the poll does not mistake it for this
    check's verdict. Without a cordon (a shadowed alarm's check: the node is not cordoned) the
    label is read here, through ``kube``: an old ``Failed`` label must not count as this
    check's either.
    """
    cluster = settings.hyperpod_cluster_name
    checks = settings.health_checks
    started_at = clock.iso(clock.now())
    if cordon is not None:
        label_before = cordon.health_check_label
    elif kube is not None:
        label_before = _label(kube(), suspect.node_name).get(DHC_LABEL)
    else:
        label_before = None
    if settings.dry_run:
        logger.info(
            "dry run: would start deep health check",
            extra={"instance": suspect.instance_id, "checks": checks},
        )
        return HealthResult(
            status="in_progress",
            started_at=started_at,
            checks=checks,
            dry_run=True,
            detail="dry run: no health check started",
            label_before=label_before,
        )
    details = hyperpod.require_node(cluster, suspect.instance_id)
    if hyperpod.instance_status(details) == DHC_RUNNING:
        # A retry after our own successful call, or someone else's check: don't start another.
        return _already_running(started_at, checks, label_before)
    try:
        hyperpod.start_health_check(cluster, suspect.instance_group, suspect.instance_id, checks)
    except botocore.exceptions.ClientError as exc:
        raise HealthCheckRejected(
            f"StartClusterHealthCheck refused {suspect.instance_id}: {aws.error_code(exc)}: "
            f"{exc.response.get('Error', {}).get('Message', '')}"
        ) from exc
    except AwsApiUnavailable as exc:
        # Sent once, answer lost or 5xx: the check may have started. HyperPod's own view
        # settles it; if it shows no check, the workflow retries the step (which describes
        # again before sending).
        settled = hyperpod.describe_node(cluster, suspect.instance_id)
        if hyperpod.instance_status(settled) != DHC_RUNNING:
            raise
        logger.info(
            "StartClusterHealthCheck's answer was lost but the check is running",
            extra={"instance": suspect.instance_id, "error": str(exc)[:300]},
        )
        return _already_running(started_at, checks, label_before)
    logger.info(
        "started deep health check",
        extra={"instance": suspect.instance_id, "group": suspect.instance_group, "checks": checks},
    )
    return HealthResult(
        status="in_progress", started_at=started_at, checks=checks, label_before=label_before
    )


def _already_running(started_at: str, checks: list[str], label_before: str | None) -> HealthResult:
    return HealthResult(
        status="in_progress",
        started_at=started_at,
        checks=checks,
        detail="a deep health check was already in progress",
        label_before=label_before,
        seen_in_progress=True,
    )


def _label(kube: KubeApi, node_name: str) -> dict[str, str]:
    try:
        return node_labels(kube.get_node(node_name))
    except NodeNotFound:
        return {}


def classify(status: str | None, labels: dict[str, str]) -> tuple[HealthStatus, str]:
    """The outcome from the instance status (None: instance gone) and the node labels."""
    dhc, health = labels.get(DHC_LABEL), labels.get(HEALTH_LABEL)
    detail = f"instance status={status}, {DHC_LABEL}={dhc}, {HEALTH_LABEL}={health}"
    if hyperpod.is_leaving(status):
        return "replaced_by_hyperpod", detail
    if dhc == "Failed" or status == "Failure" or health in FAILED_HEALTH:
        return "failed", detail
    if status == DHC_RUNNING or dhc == "InProgress":
        return "in_progress", detail
    if dhc == "Passed" and status == "Running":
        return "passed", detail
    # Running without a verdict label: HyperPod has not picked the request up yet.
    return "in_progress", detail


def poll(settings: Settings, state: PollInput, kube: Callable[[], KubeApi]) -> HealthResult:
    """One poll: in_progress, passed, failed, replaced_by_hyperpod or timed_out."""
    previous = state.health
    if previous.dry_run:
        # Nothing was started; report a pass so the dry run walks the approval path too.
        return previous.model_copy(
            update={"status": "passed", "detail": "dry run: no health check was started"}
        )
    details = hyperpod.describe_node(settings.hyperpod_cluster_name, state.suspect.instance_id)
    status = hyperpod.instance_status(details)
    labels = _label(kube(), state.suspect.node_name) if details is not None else {}
    dhc = labels.get(DHC_LABEL)
    seen = previous.seen_in_progress or status == DHC_RUNNING or dhc == "InProgress"
    stale = not seen and dhc in ("Passed", "Failed") and dhc == previous.label_before
    if stale:
        # An earlier check's verdict: judge by the rest (instance status, node health) only.
        outcome, detail = classify(status, {k: v for k, v in labels.items() if k != DHC_LABEL})
        detail = (
            f"{detail}; {DHC_LABEL}={dhc} is unchanged since before this check and the check "
            "was not seen running yet, so it is not taken as this check's verdict"
        )
    else:
        outcome, detail = classify(status, labels)
    if outcome == "in_progress":
        deadline = clock.parse_iso(previous.started_at) + timedelta(
            seconds=settings.health_check_timeout_seconds
        )
        if clock.now() >= deadline:
            outcome, detail = (
                "timed_out",
                f"no result after {settings.health_check_timeout_seconds}s; {detail}",
            )
    logger.info("health check poll", extra={"outcome": outcome, "detail": detail})
    return HealthResult(
        status=outcome,
        started_at=previous.started_at,
        checks=previous.checks,
        detail=detail,
        label_before=previous.label_before,
        seen_in_progress=seen,
    )

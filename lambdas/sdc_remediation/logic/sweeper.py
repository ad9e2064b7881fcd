"""The sweeper: close remediations whose execution is no longer running.

Whatever kills an execution between admission and its last record (the execution timed out or
was aborted, a States.Runtime error, a record step that could not write), the node's STATE stays
open: the node becomes a permanent ``duplicate`` and its guard slot leaks. The sweeper runs on a
schedule, asks Step Functions about the execution of every open remediation
(DescribeExecution), and closes those whose execution ended as ``abandoned`` with the
execution's status. The node stays cordoned and keeps counting against the guard until released
(``sdc-remediation release``): nobody decided about it. One message per sweep lists them.

Held nodes count against the guard's out-of-service fraction until released, so a forgotten one
shrinks the room for real findings: once a day the sweeper reminds the on-call of every node held
longer than a day (``REMIND_AFTER_SECONDS``), in one message.

Then the flood watch (``logic/flood_watch.py``): when an SDC alarm's recently active job series
near the 500 its Metrics Insights query returns (made-up JobNames), the on-call is told, at most
once every 6 hours. Its failure (AWS unreachable, throttled, denied) is logged and counted
(``flood_watch_failed``), never the end of the sweep.

Last, the backstop (``logic/backstop.py``): reports in the report group that no remediation
took up (a flood of made-up JobNames can keep a real job's contributor out of ALARM) start the
workflow, bounded per sweep.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypedDict

from sdc_contract.names import node_name_of

from .. import clock, text
from ..clients import sns
from ..clients.stepfunctions import execution_status
from ..config import Settings
from ..dal.events import encode_detail
from ..dal.ledger import Ledger
from ..observability import logger, metrics
from . import notify
from .backstop import BackstopResult, backstop
from .flood_watch import FloodWatchResult, flood_watch
from .periodic import publish_when_due

REMIND_AFTER_SECONDS = 86400
"""A node held longer than this is in the daily reminder."""
REMIND_EVERY_SECONDS = 86400
"""At most one reminder per this period."""


@dataclass
class SweepResult:
    """What one sweep did."""

    checked: int = 0
    abandoned: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    reminded: list[str] = field(default_factory=list)
    """The long-held nodes this sweep reminded the on-call of (empty: no reminder due)."""
    backstop: BackstopResult = field(default_factory=lambda: BackstopResult(enabled=False))
    """The reports no remediation took up, started by this sweep (``logic/backstop.py``)."""
    flood_watch: FloodWatchResult = field(default_factory=FloodWatchResult)
    """The SDC alarms' recently active series, counted against their limit
    (``logic/flood_watch.py``)."""

    def as_dict(self) -> dict[str, Any]:
        """The handler's JSON answer."""
        return {
            "checked": self.checked,
            "abandoned": self.abandoned,
            "skipped": self.skipped,
            "reminded": self.reminded,
            "flood_watch": self.flood_watch.as_dict(),
            "backstop": self.backstop.as_dict(),
        }


def sweep(settings: Settings) -> SweepResult:
    """Close every open remediation whose execution is not RUNNING as ``abandoned``."""
    ledger = Ledger(settings.ledger_table)
    result = SweepResult()
    for state in ledger.open_remediations():
        result.checked += 1
        instance_id = str(state["pk"])
        execution = str(state.get("execution") or "")
        if not execution.startswith("arn:"):
            # Not written by the workflow (no execution to ask about): left to a human.
            result.skipped.append(instance_id)
            logger.warning("open remediation without an execution ARN", extra={"pk": instance_id})
            continue
        status = execution_status(execution)
        if status == "RUNNING":
            continue
        cluster = str(state.get("cluster") or settings.hyperpod_cluster_name)
        rid = str(state["remediation_id"])
        release_hold = True if settings.dry_run else None
        if not ledger.close(cluster, instance_id, rid, "abandoned", release_hold=release_hold):
            continue  # closed meanwhile by the workflow itself
        ledger.record(
            instance_id,
            rid,
            "abandoned",
            {
                "cluster": cluster,
                "node_name": state.get("node_name"),
                "execution": execution,
                "error": f"ExecutionNotRunning: the execution is {status}; closed by the sweeper",
                "dry_run": settings.dry_run,
                "detail": encode_detail({"execution_status": status}),
            },
            update_status=False,
        )
        result.abandoned.append(
            {
                "instance_id": instance_id,
                "node_name": state.get("node_name"),
                "remediation_id": rid,
                "execution": execution,
                "execution_status": status,
            }
        )
    # Every sweep reports how many remediations were open and how many it closed (a steady
    # count of open ones is also the dashboard's "in flight" line).
    metrics.add_dimension(name="ClusterName", value=settings.hyperpod_cluster_name)
    metrics.add_metric(name="open_remediations", unit="Count", value=result.checked)
    metrics.add_metric(name="abandoned", unit="Count", value=len(result.abandoned))
    if result.abandoned:
        subject = (
            f"{notify.subject_prefix(settings.dry_run)} abandoned: "
            f"{len(result.abandoned)} remediation(s) whose execution ended"
        )
        body = {
            "transition": "abandoned",
            "why": "their workflow execution ended without recording an outcome; each node is "
            "left as it was (cordoned) and counts against the blast-radius guard until "
            "`sdc-remediation release NODE`",
            "remediations": result.abandoned,
        }
        try:
            sns.publish(settings.topic_arn, subject[:100], json.dumps(body, indent=2))
        except Exception:  # recorded in the ledger and counted above; the rest of the sweep goes on
            logger.exception("the abandoned notice was not sent; the sweep goes on")
            metrics.add_metric(name="notice_failed", unit="Count", value=1)
    result.reminded = remind_long_held(ledger, settings)
    result.flood_watch = watch_for_floods(settings, ledger)
    # Last: what it does not finish (its bounds) the next sweep goes on with.
    result.backstop = backstop(settings, ledger)
    if result.backstop.started:
        # Only when it started one (a metric billed only in the hours it has data).
        metrics.add_metric(
            name="backstop_started", unit="Count", value=len(result.backstop.started)
        )
    logger.info("swept", extra=result.as_dict())
    return result


def watch_for_floods(settings: Settings, ledger: Ledger) -> FloodWatchResult:
    """The flood watch, which never ends the sweep: whatever it raises (AWS unreachable,
    throttled, its permission denied) is logged and counted, and the sweep goes on. Its metrics
    are put only when there is something to see (nothing billed while all is well)."""
    try:
        found = flood_watch(settings, ledger)
    except Exception as exc:  # advisory: the reminders and the backstop go on
        logger.exception("flood watch failed; the sweep goes on")
        metrics.add_metric(name="flood_watch_failed", unit="Count", value=1)
        return FloodWatchResult(error=f"{type(exc).__name__}: {text.printable(exc, 300)}")
    if found.blind:
        metrics.add_metric(name="series_flood", unit="Count", value=found.most[1])
    return found


class HeldNode(TypedDict):
    """One node of the daily reminder."""

    node: str
    held_since: str
    held_hours: float
    remediation_id: str | None


def remind_long_held(ledger: Ledger, settings: Settings) -> list[str]:
    """Once a day, one message naming every node held longer than a day (they still count
    against MAX_FRACTION); the node names reminded (empty when none or not due)."""
    cluster = settings.hyperpod_cluster_name
    now = int(clock.now().timestamp())
    long_held = [h for h in ledger.held(cluster) if now - int(h["at"]) > REMIND_AFTER_SECONDS]
    if not long_held:
        return []
    nodes: list[HeldNode] = [
        {
            "node": node_name_of(str(h["instance_id"])),
            "held_since": clock.iso(datetime.fromtimestamp(int(h["at"]), UTC)),
            "held_hours": round((now - int(h["at"])) / 3600, 1),
            "remediation_id": h.get("remediation_id"),
        }
        for h in long_held
    ]
    subject = (
        f"{notify.subject_prefix(settings.dry_run)} reminder: {len(nodes)} node(s) held by the "
        "guard for more than a day"
    )
    body = {
        "summary": (
            "These nodes were cordoned by sdc-guard more than a day ago and nobody released "
            "them: each counts against the blast-radius guard's out-of-service fraction "
            "(MAX_FRACTION) until released. Uncordon (kubectl uncordon NODE) or replace each, "
            "then `sdc-remediation release NODE`. This reminder comes once a day."
        ),
        "cluster": cluster,
        "nodes": nodes,
    }
    try:
        sent = publish_when_due(
            ledger,
            cluster,
            "held-reminder",
            REMIND_EVERY_SECONDS,
            topic_arn=settings.topic_arn,
            subject=subject,
            message=json.dumps(body, indent=2),
        )
    except Exception:  # the claim was given back; the flood watch and the backstop go on
        logger.exception("the held-node reminder was not sent; the next sweep tries again")
        metrics.add_metric(name="reminder_failed", unit="Count", value=1)
        return []
    return [n["node"] for n in nodes] if sent else []

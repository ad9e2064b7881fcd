"""Shadow mode (``CHECK_MODES``): an alarm of a check x verdict that is not enforced yet is
localized, admitted as shadow, notified with its evidence and what sdc-guard would have done,
and recorded; no node is cordoned, checked or replaced.

A shadow admission claims nothing of the enforced guard: the node's STATE and the blast-radius
guard are only read, to say whether the guard would have admitted it. A noisy check in shadow
therefore never uses the guard's budget that the enforced checks need. It does claim its report
(one shadow record per report: a flapping alarm re-reading it is a duplicate). Its ``shadow``
outcome goes to the ledger like any other, so ``sdc-remediation stats`` shows the check's alarms
before it is enforced (never in its precision: nothing decided them).

With ``shadowHealthCheck`` the deep health check runs on the uncordoned node, which disrupts
what runs there: it goes through a guard of its own (``dal.shadow_guard``), a fraction of the
cluster like the enforced guard's (``MAX_FRACTION``) and never the enforced checks' budget. An
alarm naming more nodes than that fraction, or a node beyond it, is recorded without a check.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..dal import shadow_guard
from ..dal.ledger import Ledger
from ..models import Admission, ItemState, RecordInput
from . import admission, notify
from .admission import AdmitRequest

WOULD_HAVE = "would have cordoned"
"""What every shadow message says (with the node), so nobody mistakes it for an action."""


def remediation_id(req: AdmitRequest) -> str:
    """A shadow remediation's id: stable for a retried admit of the same execution and item."""
    key = f"{req.execution}#{req.item}#{req.instance_id}".encode()
    return f"s-{hashlib.sha256(key).hexdigest()[:16]}"


def admit(ledger: Ledger, req: AdmitRequest, *, health_check: bool = False) -> Admission:
    """Admit as shadow: say what the guard would have decided, claim only the report (and, for
    ``health_check``, a slot of the shadow guard)."""
    rid = remediation_id(req)
    taken = ledger.claim_report(req, rid)
    if taken is not None:
        return Admission(
            decision="duplicate",
            remediation_id=taken.get("remediation_id"),
            reason=f"this report already raised {taken.get('remediation_id')}: one record per "
            "report",
            mode="shadow",
        )
    would = ledger.would_admit(req, admission.decide)
    if would.decision == "admitted":
        verdict = "enforced, the blast-radius guard would have admitted it"
    else:
        verdict = f"enforced, the guard would have answered {would.decision}: {would.reason}"
    check = False
    note = ""
    if health_check:
        limit = admission.max_open(req.cluster_nodes, req.max_fraction)
        check, why = shadow_guard.admit(ledger.table, req, limit)
        note = f"; deep health check: {why}"
    return Admission(
        decision="admitted",
        remediation_id=rid,
        reason=f"shadow mode: nothing is cordoned ({verdict}){note}",
        mode="shadow",
        shadow_health_check=check,
    )


def message(inp: RecordInput, cluster: str, *, dry_run: bool = False) -> tuple[str, str]:
    """Subject and body of a shadow notification: the evidence and "would have cordoned"."""
    st = inp.state
    suspect = st.suspect
    node = suspect.node_name if suspect else f"cluster {cluster}"
    subject = f"{notify.subject_prefix(dry_run)} shadow: {WOULD_HAVE} {node}"
    if suspect is not None:
        subject += f" ({suspect.check}, {suspect.verdict})"
    body: dict[str, Any] = {
        "transition": "shadow",
        "summary": (
            f"sdc-guard {WOULD_HAVE} {node}, run a deep health check and asked to replace it; "
            f"{suspect.check}/{suspect.verdict} is in shadow mode (CHECK_MODES), so nothing was "
            "touched. Compare with what you find, and with `sdc-remediation stats`, before "
            "enforcing it."
            if suspect
            else f"sdc-guard {WOULD_HAVE} a node; nothing was touched (shadow mode)."
        ),
        "cluster": cluster,
        "execution": st.execution,
    }
    if st.admission is not None:
        body["admission"] = st.admission.model_dump()
    if st.alarm is not None and suspect is not None:
        # The same evidence an approver would have seen (request_approval's), minus history.
        item = ItemState(alarm=st.alarm, suspect=suspect, execution=st.execution)
        item = item.model_copy(update={"admission": st.admission, "health": st.health})
        body["evidence"] = notify.evidence(item, [])
    if st.health is not None:
        # `shadowHealthCheck`: the deep health check ran on the uncordoned node.
        body["health_check"] = (
            f"the deep health check ran in shadow: {st.health.status} ({st.health.detail})"
        )
    return subject[:100], json.dumps(body, indent=2, default=str)


__all__ = ["WOULD_HAVE", "admit", "message", "remediation_id"]

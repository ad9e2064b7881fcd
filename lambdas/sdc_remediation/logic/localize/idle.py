"""Idle-screen reports in localize: a report of the reserved job ``IDLE_SCREEN_JOB`` is the idle
screener's (``logic/idle_screen.py``) only when it names one rank on one node and the ledger
holds that node's last screen as ``reproduced`` at the report's very time. Pods can write
reports (in streams named by the job, any stream) but not the ledger, so a pod cannot pass a
report off as a screen's, nor point a real screen's alarm at another node."""

from __future__ import annotations

import sdc_contract as contract

from ... import clock
from ...config import Settings
from ...dal.screens import ScreenStore
from ...errors import UntrustedReport
from ...models import Report


def verify_report(report: Report, settings: Settings) -> str:
    """The node an idle-screen report names, refused (``UntrustedReport``) unless the
    screener recorded a reproduced screen of that node at the report's time."""
    where = f"idle-screen report of job {report.job}"
    if report.job != contract.IDLE_SCREEN_JOB or report.canary_run is not None:
        raise UntrustedReport(
            f"{where}: only job {contract.IDLE_SCREEN_JOB} reports without a canary_run are the "
            "idle screener's",
            field="job",
        )
    info = report.ranks.get("0")
    if set(report.ranks) != {"0"} or sorted(set(report.suspects or [])) != [0] or info is None:
        raise UntrustedReport(
            f"{where}: an idle screen names rank 0 on one node, and only it", field="ranks"
        )
    node = info.node_name or ""
    entry = ScreenStore(settings.ledger_table, settings.hyperpod_cluster_name).get(node)
    if (
        entry is None
        or entry.last_outcome != "reproduced"
        or entry.last_at != clock.iso(report.time)
    ):
        raise UntrustedReport(
            f"{where}: the ledger holds no reproduced screen of node {node[:80]!r} at "
            f"{clock.iso(report.time)} (only the idle screener records screens)",
            field="ranks.0.node_name",
        )
    return node


__all__ = ["verify_report"]

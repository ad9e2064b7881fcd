"""Canary reports in localize: a canary report names the reserved canary node alone and an open
run in the ledger; a training report never names the reserved node. Pods can write reports but
not the ledger, so a pod cannot pass a report off as a canary run (``logic/canary``)."""

from __future__ import annotations

import sdc_contract as contract

from ... import clock
from ...config import Settings
from ...dal.canary_runs import RunStore
from ...errors import UntrustedReport
from ...models import Report


def verify_report(report: Report, settings: Settings) -> str:
    """The run id of a canary report, refused (``UntrustedReport``) unless it names only the
    reserved canary node and belongs to an open run the canary function recorded."""
    where = f"canary report of job {report.job}"
    if report.job != contract.CANARY_JOB or report.canary_run is None:
        raise UntrustedReport(
            f"{where}: only job {contract.CANARY_JOB} reports with a canary_run are canaries",
            field="canary_run",
        )
    # Every rank it names, blamed or not: a canary report names the reserved node alone.
    for rank in sorted({*(report.suspects or []), *map(int, report.ranks)}):
        info = report.ranks.get(str(rank))
        if (
            info is None
            or info.node_name != contract.CANARY_NODE_NAME
            or info.instance_id != contract.CANARY_INSTANCE_ID
        ):
            raise UntrustedReport(
                f"{where}: rank {rank} must be on the reserved canary node "
                f"{contract.CANARY_NODE_NAME} ({contract.CANARY_INSTANCE_ID}); a canary never "
                "names a real node",
                field=f"ranks.{rank}",
            )
    run = RunStore(settings.ledger_table, settings.hyperpod_cluster_name).get(report.canary_run)
    if run is None or not run.is_open(clock.now()):
        raise UntrustedReport(
            f"{where}: run {report.canary_run!r} is not an open canary run in the ledger "
            "(only the canary function starts runs, and a run expires after canaryTimeout)",
            field="canary_run",
        )
    return run.run_id


def refuse_reserved_node(report: Report) -> None:
    """A training report that names the canary's node is ``UntrustedReport``."""
    for rank, info in report.ranks.items():
        if (
            info.instance_id == contract.CANARY_INSTANCE_ID
            or info.node_name == contract.CANARY_NODE_NAME
        ):
            raise UntrustedReport(
                f"job {report.job} rank {rank} names the reserved canary node "
                f"{contract.CANARY_NODE_NAME}, which only canary runs may name",
                field=f"ranks.{rank}",
            )


__all__ = ["refuse_reserved_node", "verify_report"]

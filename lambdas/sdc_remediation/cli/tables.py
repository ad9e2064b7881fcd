"""Terminal tables of the operator CLI (``stats``, ``history NODE``), laid out by ``tabulate``.

Only the CLI imports this module: the Lambda handlers never render tables. Every cell that
comes from the ledger passes through ``cell`` (``text.printable``): a job name, a reason or an
approver's text may hold an escape sequence, and a terminal would run it.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable

from tabulate import tabulate

from .. import text
from ..logic.outcomes import Remediation, classify
from ..logic.stats import FEW_EVENTS, PRECISION_DEFINITION, SCREEN_AGREEMENT_DEFINITION, CheckStats
from ..models.canary import STEPS, Run

_STATS_HEADERS = (
    "check",
    "verdict",
    "alarms",
    "confirmed\nby health\ncheck",
    "replaced",
    "rejected",
    "released",
    "approval\ntimed out",
    "shadow",
    "repeat\noffenders",
    "precision",
    "95%\ninterval",
    "screen\nagreed/\ndisagreed/\nno evidence",
    "note",
)


CELL_CHARS = 120
"""A cell longer than this is cut (the JSON output has everything)."""


def cell(value: object) -> str:
    """A ledger value as a table cell: printable, one line, bounded."""
    return text.printable(value, CELL_CHARS)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def stats_table(rows: Iterable[CheckStats], *, scope: str) -> str:
    """The ``stats`` report: one row per check x verdict, then the precision's definition."""
    body = []
    for row in rows:
        if row.decided == 0:
            note = "no decided remediation yet"
        elif row.few_events:
            note = f"few events ({row.decided} decided < {FEW_EVENTS}): do not act on this alone"
        else:
            note = f"{row.decided} decided"
        body.append(
            (
                cell(row.check),
                cell(row.verdict),
                row.alarms,
                row.confirmed,
                row.replaced,
                row.rejected,
                row.released,
                row.timed_out,
                row.shadow,
                row.repeat_offenders,
                _percent(row.precision),
                "-" if row.low is None else f"{_percent(row.low)}-{_percent(row.high)}",
                f"{row.screen_agreed}/{row.screen_disagreed}/{row.screen_no_evidence}",
                note,
            )
        )
    if not body:
        return f"No remediations recorded ({scope})."
    return "\n".join(
        [
            f"sdc-guard alarms per check x verdict ({scope})",
            tabulate(body, headers=_STATS_HEADERS, tablefmt="simple"),
            "",
            textwrap.fill(PRECISION_DEFINITION, width=100),
            textwrap.fill(SCREEN_AGREEMENT_DEFINITION, width=100),
        ]
    )


def _step(transition: dict[str, object]) -> str:
    line = str(transition["transition"])
    if transition.get("approver"):
        line += f" by {transition['approver']}"
    if transition.get("reason"):
        line += f" ({transition['reason']})"
    return cell(line)


def remediations_table(remediations: Iterable[Remediation]) -> str:
    """``history NODE``: one row per remediation of the node with its transitions in order."""
    body = [
        (
            cell(r.first_at),
            cell(r.remediation_id),
            cell(f"{r.check}/{r.verdict}"),
            cell(r.job or "-"),
            r.outcome + (" (dry run)" if r.dry_run else ""),
            classify(r),
            "\n".join(_step(t) for t in r.transitions),
            cell(r.screen or "-"),
        )
        for r in remediations
    ]
    if not body:
        return "No remediations recorded for this node."
    return tabulate(
        body,
        headers=(
            "first at",
            "remediation",
            "check/verdict",
            "job",
            "outcome",
            "alarm was",
            "transitions",
            "screen",
        ),
        tablefmt="simple_grid",
    )


def canary_table(run: Run | None) -> str:
    """``canary``: the newest canary run's steps in order, and where it stands."""
    if run is None:
        return "No canary run recorded for this cluster (is canarySchedule off?)."
    reached = {s["step"]: s["at"] for s in run.steps}
    rows = [(name, cell(reached.get(name, "-")), what) for name, what in STEPS]
    if "failed" in reached:
        rows.append(("failed", cell(reached["failed"]), cell(run.error or "-")))
    if run.completed:
        status = "completed"
    elif run.stopped_at:
        status = f"stopped at {run.stopped_at} (the canary alarm fired)"
    else:
        status = "in progress (or stopped: the canary alarm names the step once its window ends)"
    table = tabulate(rows, headers=("step", "reached at", "what it proves"), tablefmt="simple_grid")
    return f"canary run {cell(run.run_id)}, started {cell(run.started_at)}: {status}\n{table}"


__all__ = ["canary_table", "remediations_table", "stats_table"]

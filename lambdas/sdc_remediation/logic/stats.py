"""Per check x verdict precision of sdc-guard's alarms, from the ledger (``sdc-remediation
stats``; the auto-approval policy reads the same numbers).

Precision is right / (right + wrong), with right and wrong as ``outcomes.classify`` defines
them; undecided remediations are left out of both. The interval is the Wilson score interval
(95 %), which stays inside [0, 1] and is honest with few events, where the plain p +- z*se is
not. Under ``FEW_EVENTS`` decided remediations the row says so: the estimate is not yet a basis
for enforcing a check or approving without a person.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

from .outcomes import Remediation, classify

Z_95 = 1.959963984540054
"""The standard normal quantile of a two-sided 95 % interval."""
FEW_EVENTS = 10
"""Below this many decided remediations a row is marked "few events"."""

PRECISION_DEFINITION = (
    "precision = right / (right + wrong) per check x verdict, over remediations the guard "
    "admitted and the health check or a person decided. Right: the deep health check failed, "
    "or a person approved the replacement and the job's alarms stopped. Wrong: a person "
    "rejected (or released) the node, or approved and another node of the same job alarmed "
    "within the window. Undecided (shadow, refused, duplicate, in flight, timed out, failed, "
    "abandoned, approved by the policy alone, a recurrence alone) counts in neither. One report "
    "is one remediation. Interval: Wilson score, 95 %."
)

SCREEN_AGREEMENT_DEFINITION = (
    "screen agreement per check x verdict, one per remediation: agreed = the node screen "
    "reproduced the fault on the node the job named; disagreed = the screen ran clean (not an "
    "exoneration: it counts in neither right nor wrong); no evidence = inconclusive, failed, not "
    "configured, skipped or no screen."
)

_DURATION = re.compile(r"^\s*(\d+)\s*([smhdw])\s*$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> timedelta:
    """``30d``, ``12h``, ``2w``, ``90m``, ``45s`` as a timedelta; ValueError names the format."""
    match = _DURATION.match(text)
    if not match or int(match.group(1)) <= 0:
        raise ValueError(f"expected a positive duration like 30d, 12h or 2w, got {text!r}")
    return timedelta(seconds=int(match.group(1)) * _UNIT[match.group(2)])


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float] | None:
    """The Wilson score interval of a binomial proportion (None when ``n`` is 0)."""
    if n <= 0:
        return None
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be within 0..{n}, got {successes}")
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    # At 0 or n the bound is exactly 0 or 1; the formula leaves a rounding error there.
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


@dataclass(frozen=True)
class CheckStats:
    """One row of ``stats``: what became of one check x verdict's alarms."""

    check: str
    verdict: str
    alarms: int
    """Remediations (one alarm on one node), admitted or not."""
    confirmed: int
    """The deep health check failed (hardware confirmed)."""
    replaced: int
    rejected: int
    released: int
    timed_out: int
    """The approval timed out."""
    shadow: int
    """Run in shadow mode (localized and notified, nothing cordoned)."""
    repeat_offenders: int
    right: int
    wrong: int
    precision: float | None
    low: float | None
    high: float | None
    jobs: int = 0
    """Distinct jobs among the decided remediations."""
    screen_agreed: int = 0
    """Remediations whose node screen reproduced the fault (agreed with the job)."""
    screen_disagreed: int = 0
    """... whose screen ran clean (disagreed; not an exoneration)."""
    screen_no_evidence: int = 0
    """... whose screen gave no evidence (inconclusive, failed, not configured, skipped, none)."""

    @property
    def decided(self) -> int:
        """Remediations the precision counts (right + wrong)."""
        return self.right + self.wrong

    @property
    def few_events(self) -> bool:
        """Too few decided remediations to trust the estimate."""
        return self.decided < FEW_EVENTS

    def as_dict(self) -> dict[str, object]:
        """The row as JSON-ready data (``stats --json``)."""
        return {**asdict(self), "decided": self.decided, "few_events": self.few_events}


def check_stats(check: str, verdict: str, remediations: Iterable[Remediation]) -> CheckStats:
    """The row of one check x verdict over ``remediations`` (recurrences already marked)."""
    rows = [r for r in remediations if r.check == check and r.verdict == verdict]
    kinds = [classify(r) for r in rows]
    right, wrong = kinds.count("right"), kinds.count("wrong")
    interval = wilson_interval(right, right + wrong)
    jobs = {r.job for r, kind in zip(rows, kinds, strict=True) if kind != "undecided"}
    return CheckStats(
        check=check,
        verdict=verdict,
        alarms=len(rows),
        confirmed=sum(r.confirmed for r in rows),
        replaced=sum(r.replaced for r in rows),
        rejected=sum(r.rejected for r in rows),
        released=sum(r.outcome == "released" for r in rows),
        timed_out=sum(r.outcome == "approval_timed_out" for r in rows),
        shadow=sum(r.outcome == "shadow" for r in rows),
        repeat_offenders=sum(r.repeat for r in rows),
        right=right,
        wrong=wrong,
        precision=right / (right + wrong) if right + wrong else None,
        low=interval[0] if interval else None,
        high=interval[1] if interval else None,
        jobs=len(jobs),
        screen_agreed=sum(r.screen_agreement == "agreed" for r in rows),
        screen_disagreed=sum(r.screen_agreement == "disagreed" for r in rows),
        screen_no_evidence=sum(r.screen_agreement == "no_evidence" for r in rows),
    )


def one_per_job(remediations: Iterable[Remediation]) -> list[Remediation]:
    """The decided remediations with at most one per job (its latest): what the auto-approval
    policy counts, so no one job (a pod that writes reports at will) makes up its evidence."""
    latest: dict[str | None, Remediation] = {}
    for r in remediations:
        if classify(r) == "undecided":
            continue
        if r.job not in latest or r.first_at >= latest[r.job].first_at:
            latest[r.job] = r
    return list(latest.values())


def table(remediations: Iterable[Remediation]) -> list[CheckStats]:
    """One row per check x verdict that raised at least one remediation, sorted by name."""
    items = list(remediations)
    keys = sorted({(r.check, r.verdict) for r in items})
    return [check_stats(check, verdict, items) for check, verdict in keys]


def window_start(now: datetime, since: timedelta | None) -> datetime | None:
    """Where a ``--since`` window begins (None: all of the ledger)."""
    return None if since is None else now - since


__all__ = [
    "FEW_EVENTS",
    "PRECISION_DEFINITION",
    "SCREEN_AGREEMENT_DEFINITION",
    "CheckStats",
    "check_stats",
    "one_per_job",
    "parse_duration",
    "table",
    "wilson_interval",
    "window_start",
]

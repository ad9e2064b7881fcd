"""The one protocol every check follows, so that the coordinator drives the four alike.

The coordinator (``sdc_agent._coordinator``) holds its checks in one tuple, in a fixed order,
and calls each at the same points of a step on every rank:

- :meth:`Check.seeds` before the step, to decide whether the step's computation is seeded (a
  check whose candidates are confirmed by replaying the step needs the step to be replayable
  exactly, dropout included);
- :meth:`Check.begin_step` before its forward pass, with the step's :class:`StepStart`;
- :meth:`Check.end_step` once its forward and backward are over;
- :meth:`Check.take_flag` at check 1's one host read: a check's contribution to the step's
  flag reduction (a one-element device tensor, nonzero when it flagged the step), so that every
  check's per-step verdict travels in the same small all-reduce;
- :attr:`Check.decides_now` after that read: a check that flagged something at this step needs
  its candidates judged while every rank still holds the step's exact state (no rank has
  applied it), so every rank waits for the reduction at once;
- :meth:`Check.describe` for ``Guard.coverage()``: what the check really does in this job, from
  the entry :func:`sdc_agent.coverage.describe` plans from the schedule and the layout.

Judging is each check's own: its inputs differ (a flag table, replayed rows, a weight
comparison) and the agreement protocol fixes its order (the coordinator's module docstring).

The calls that may be collective (a check's flag can need the ranks to agree on a threshold
first) happen on every rank at the same point, in the tuple's order, so the collectives pair up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class StepStart:
    """What every check knows before a step's forward pass (the same on every rank)."""

    step: int
    """The training step."""
    audit: bool = False
    """The replay audit runs at this step."""
    deterministic: bool = False
    """The step runs on deterministic kernels (an audit step with ``deterministic_audits``)."""
    position: int = 0
    """The micro-batch the audit replays (accumulation)."""
    seeded: bool = False
    """The step's RNG is seeded from (step, rank), so a confirmation can replay it exactly."""


class Check:
    """One of the guard's checks, as the coordinator drives it through a step (the module
    docstring). The defaults are what a check that takes no part in a hook does: nothing, no
    flag, no seeding, and the planned coverage as it is."""

    coverage_key: str = ""
    """Its entry in ``Guard.coverage()["checks"]``."""

    def seeds(self, step: int) -> bool:
        """Whether ``step`` must be seeded for this check (the same on every rank)."""
        return False

    def begin_step(self, start: StepStart) -> None:
        """Before the step's forward pass (local)."""

    def end_step(self) -> None:
        """The step's forward and backward are over (local; idempotent)."""

    def take_flag(self) -> torch.Tensor | None:
        """This check's flag for the step's reduction: a one-element tensor, nonzero when it
        flagged the step; None when it checked nothing this step (may be collective, at the
        same point on every rank)."""
        return None

    @property
    def decides_now(self) -> bool:
        """Whether this step's flags must be judged at once, with every rank at the step (the
        same on every rank)."""
        return False

    def describe(self, planned: dict[str, Any]) -> dict[str, Any]:
        """This check's part of ``Guard.coverage()``: ``planned`` (what the schedule and the
        layout plan for it, ``{}`` when they plan nothing) amended with what it found at run
        time."""
        return planned

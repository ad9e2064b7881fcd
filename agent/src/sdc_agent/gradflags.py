"""Check 1's agreement: every rank's two non-finite flags, exchanged without stalling the step.

Each rank knows after backward whether its own LOCAL gradient (from the comm hook) and its own
REDUCED gradient are finite; whether to apply the step must be decided the same way everywhere.
A blocking all-gather per step would make every rank wait for the slowest to be scheduled before
its optimizer step. Instead the flags travel in an asynchronous all-gather that completes during
the next step's forward and backward, and a rank waits for it only when it has a reason to:

* its own flags are bad (it must not apply the step, and wants the others' view), or
* the step is an audit step, or a collective check or a checkpoint follows, or the loop ends.

When every rank flagged something (a NaN anywhere reaches every rank's reduced gradient through
the sum, so this is the usual case) every rank is waiting at the same step and decides at once.
When only some ranks did (a corruption after the all-reduce on one rank), those ranks drop their
gradients and carry on; every rank settles the exchange at the next agreement point and returns
the same alarm, naming the step at which it happened. No rank ever applies a non-finite gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class FlagTable:
    """Every DP rank's flags for one step, as gathered."""

    step: int
    local: tuple[bool, ...]
    """Per DP rank: its local gradient (before the all-reduce) held a NaN/Inf."""
    reduced: tuple[bool, ...]
    """Per DP rank: its reduced (clipped) gradient norm was NaN/Inf."""

    @property
    def nonfinite(self) -> list[int]:
        """DP ranks whose local gradient was non-finite."""
        return [dp for dp, bad in enumerate(self.local) if bad]

    @property
    def clean(self) -> bool:
        """No rank flagged anything: the step may be applied everywhere."""
        return not any(self.local) and not any(self.reduced)

    @property
    def unanimous(self) -> bool:
        """Every rank flagged something, so every rank waited for this table at the same step."""
        return all(lo or re for lo, re in zip(self.local, self.reduced, strict=True))


class FlagExchange:
    """One step's asynchronous all-gather of ``[local_bad, reduced_bad]`` (int64) per DP rank.

    Every rank must create one per step, in the same order as its other collectives; reading the
    table waits for it (the only blocking part).
    """

    def __init__(
        self, step: int, flags: torch.Tensor, group: dist.ProcessGroup | None, world: int
    ) -> None:
        """Launch the all-gather of this rank's two flags."""
        self.step = step
        self._gathered = [torch.empty_like(flags) for _ in range(world)]
        self._work = dist.all_gather(self._gathered, flags, group=group, async_op=True)
        self._table: FlagTable | None = None

    def table(self) -> FlagTable:
        """Wait for the exchange (once) and return every rank's flags."""
        if self._table is None:
            self._work.wait()
            rows = torch.stack(self._gathered).cpu().tolist()
            self._table = FlagTable(
                step=self.step,
                local=tuple(bool(lo) for lo, _ in rows),
                reduced=tuple(bool(re) for _, re in rows),
            )
            self._gathered = []
        return self._table

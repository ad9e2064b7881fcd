"""Check 3: are the replicas' weights still bit-identical, and if not, whose copy is wrong?

:class:`DivergenceCheck` is one comparison (fingerprints + one all-reduce, an all-gather only when
copies differ); :class:`WeightCheck` is the guard's check 3: comparisons run at once (before a
checkpoint, after a load) or launched after an update and judged at the next agreement point.
"""

from __future__ import annotations

import abc
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from .fingerprint import fingerprints, table_digest
from .topology import collective_device, group_ranks

if TYPE_CHECKING:
    from .alarm import Alarm
    from .reporting import Reporter


@dataclass(frozen=True)
class DivergenceReport:
    """The outcome of one weight fingerprint comparison; identical on every rank.

    ``ranks``: global ranks whose copy of some tensor differs from a strict majority of replicas.
    ``tensors``: names of the tensors whose copies disagree. ``unattributable``: some tensor has
    no strict majority (two replicas, or a split), so nobody is named for it. ``digest``: a digest
    of the fingerprint table every replica agreed on (None when they did not agree).
    """

    ranks: list[int] = field(default_factory=list)
    tensors: list[str] = field(default_factory=list)
    unattributable: bool = False
    digest: str | None = None

    @property
    def agreed(self) -> bool:
        """True when every replica holds bit-identical weights."""
        return not self.tensors


def _named_tensors(
    params: nn.Module | Iterable[torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
) -> list[tuple[str, torch.Tensor]]:
    """Accept a module, tensors, or (name, tensor) pairs; name unnamed tensors by position."""
    if isinstance(params, nn.Module):
        return list(params.named_parameters())
    named = []
    for i, item in enumerate(params):
        if isinstance(item, tuple):
            named.append((str(item[0]), item[1]))
        else:
            named.append((f"tensor[{i}]", item))
    return named


def name_minority_copies(
    table: torch.Tensor, names: list[str], ranks: list[int]
) -> DivergenceReport:
    """Name the minority copies of each disagreeing tensor in a gathered [world, P, 2] table."""
    disagreeing = (table != table[0]).any(dim=2).any(dim=0).nonzero().flatten().tolist()
    world = table.shape[0]
    named: set[int] = set()
    unattributable = False
    for column in disagreeing:
        copies = [tuple(table[r, column].tolist()) for r in range(world)]
        value, count = Counter(copies).most_common(1)[0]
        if count * 2 > world:
            named.update(ranks[r] for r in range(world) if copies[r] != value)
        else:
            unattributable = True
    return DivergenceReport(
        ranks=sorted(named),
        tensors=[names[c] for c in disagreeing],
        unattributable=unattributable,
        digest=None,
    )


class ReplicaComparison(abc.ABC):
    """A fingerprint table compared across the copies of a group in one launched all-reduce:
    the part :class:`DivergenceCheck` (DDP replicas) and the sharded check (HSDP shard replicas)
    share."""

    _table: torch.Tensor
    _report: DivergenceReport | None

    def _launch(self, table: torch.Tensor, group: dist.ProcessGroup | None) -> None:
        """Launch the comparison of ``table`` (on the group's collective device) over ``group``."""
        self._table = table
        # ~x is a monotone decreasing bijection on int64 without overflow (unlike -x at -2**63),
        # so max(~x) == ~min(x): one all-reduce yields both extremes.
        self._extremes = torch.cat([table, torch.bitwise_not(table)])
        self._work = dist.all_reduce(
            self._extremes, op=dist.ReduceOp.MAX, group=group, async_op=True
        )
        self._report = None

    def wait(self) -> None:
        """Wait for the all-reduce without judging (when the result is no longer needed)."""
        if self._work is not None:
            self._work.wait()
            self._work = None

    def _copies_agree(self) -> bool:
        """Wait for the all-reduce; True when every copy's table equals this rank's."""
        self.wait()
        rows = len(self._table)
        highest = self._extremes[:rows]
        lowest = torch.bitwise_not(self._extremes[rows:])
        return bool(torch.equal(highest, lowest))

    @abc.abstractmethod
    def report(self) -> DivergenceReport:
        """The comparison's outcome, identical on every rank (each kind of comparison says how
        it names the copies that differ)."""


class DivergenceCheck(ReplicaComparison):
    """One weight comparison in flight: the fingerprints are taken and the all-reduce launched
    when it is made; :meth:`report` waits for the result.

    Collective over ``dp_group`` (None: WORLD): make it on every rank with the same tensors, in
    the same order as the other collectives, and call :meth:`report` on every rank. Made and
    reported at once it is :func:`find_divergent_ranks`; the guard reports its periodic checks a
    step later, so that no rank waits for the slowest one in the common case.
    """

    def __init__(
        self,
        params: nn.Module | Iterable[torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
        dp_group: dist.ProcessGroup | None = None,
    ) -> None:
        """Fingerprint ``params`` now (their values at this moment) and launch the all-reduce."""
        named = _named_tensors(params)
        self._names = [n for n, _ in named]
        self._group = dp_group
        self._launch(fingerprints([t for _, t in named]).to(collective_device(dp_group)), dp_group)

    def report(self) -> DivergenceReport:
        """The comparison's outcome, identical on every rank (collective when copies differ)."""
        if self._report is None:
            if self._copies_agree():
                self._report = DivergenceReport(digest=table_digest(self._table))
            else:
                world = dist.get_world_size(self._group)
                gathered = [torch.empty_like(self._table) for _ in range(world)]
                dist.all_gather(gathered, self._table, group=self._group)
                self._report = name_minority_copies(
                    torch.stack(gathered).cpu(), self._names, group_ranks(self._group)
                )
        return self._report


def find_divergent_ranks(
    params: nn.Module | Iterable[torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
    dp_group: dist.ProcessGroup | None = None,
) -> DivergenceReport:
    """Compare every replica's weight fingerprints; name the ranks whose copy is in a minority.

    Collective over ``dp_group`` (None: WORLD): call it on every rank with the same tensors.
    The common case costs one all-reduce of 4 int64 per tensor (element-wise max of the table
    and of its bitwise complement, i.e. max and min at once); only when copies disagree is the
    whole table all-gathered to attribute the difference. A rank is named only when its copy of a
    tensor differs from a strict majority of replicas; two copies, or no strict majority, are
    reported as ``unattributable`` without a name.
    """
    return DivergenceCheck(params, dp_group).report()


class WeightCheck:
    """Check 3 for one guard: compares every replica's weights and reports the verdict.

    Collective like :class:`DivergenceCheck`: every rank calls :meth:`compare_now` and
    :meth:`launch` at the same steps, and settles what :meth:`launch` started at the same
    agreement point (:meth:`take_in_flight` then :meth:`judge` or :meth:`DivergenceCheck.wait`).
    """

    def __init__(
        self,
        named_weights: list[tuple[str, torch.Tensor]],
        dp_group: dist.ProcessGroup | None,
        reporter: Reporter,
    ) -> None:
        """``named_weights``: what every replica must hold bit-identically."""
        self._named_weights = named_weights
        self._group = dp_group
        self._reporter = reporter
        self._in_flight: tuple[int, ReplicaComparison] | None = None

    def _start_comparison(self) -> ReplicaComparison:
        """Fingerprint the weights as they are now and launch their comparison."""
        return DivergenceCheck(self._named_weights, self._group)

    def compare_now(self, step: int) -> Alarm | None:
        """Compare the weights as they are now, after ``step``'s update (collective, blocking)."""
        return self.judge(step, self._start_comparison())

    def launch(self, step: int) -> None:
        """Fingerprint the weights after ``step``'s update and launch their comparison; it is
        judged at the next agreement point."""
        if self._in_flight is not None:
            raise RuntimeError(
                "sdc_agent: a weight check is still in flight; call check_gradients (or "
                "Guard.finish) between two after_update calls"
            )
        self._in_flight = (step, self._start_comparison())

    def take_in_flight(self) -> tuple[int, ReplicaComparison] | None:
        """The launched comparison (the step it was taken after), now owned by the caller."""
        in_flight, self._in_flight = self._in_flight, None
        return in_flight

    def judge(self, step: int, check: ReplicaComparison) -> Alarm | None:
        """Check 3's verdict on a comparison of the weights after ``step``'s update: records the
        pass and the agreed digest, or logs, publishes and returns the Alarm."""
        report = check.report()
        reporter = self._reporter
        if report.agreed:
            reporter.passes.last_weight_check_pass = step
            reporter.passes.last_weights_digest = report.digest
            reporter.record_pass("weights", step)
            return None
        return reporter.log_and_publish(reporter.weights_alarm(step, report))

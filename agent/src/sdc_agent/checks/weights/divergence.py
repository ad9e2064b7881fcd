"""Check 3's comparison of whole replicas: are their weights still bit-identical, and if not,
whose copy is wrong?

:class:`DivergenceCheck` is one comparison (fingerprints + one all-reduce, an all-gather only when
copies differ); :func:`find_divergent_ranks` makes one and waits for it. The guard's check 3
(:mod:`.check`) runs them at once (before a checkpoint, after a load) or launches one after an
update and judges it at the next agreement point; sharded weights are compared shard by shard
(:mod:`.sharded`).
"""

from __future__ import annotations

import abc
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn

from ...fingerprint import fingerprints, table_digest
from ...topology import collective_device, group_ranks
from .report import DivergenceReport, name_minority_copies


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

"""Check 3's verdict on one comparison, and the rule that names a copy: a strict majority.

Pure logic over a gathered fingerprint table (no collectives), so that the whole-replica
comparison (:mod:`.divergence`), the per-shard one (:mod:`.sharded`) and the alarm built from
their report (:mod:`sdc_agent.reporting`) share it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch


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

"""Check 3 on a sharded model: each shard compared across its replicas (HSDP).

Under HSDP every shard has one copy per replica (the mesh's ``replicate`` dimension), and those
copies must stay bit-identical, as DDP's replicas must. :class:`ShardedDivergenceCheck` fingerprints
this rank's local shard of every parameter and compares it with its replicas' in one all-reduce
over the replicate group (max and min at once, as :class:`~.divergence.DivergenceCheck`
does). So that every rank returns the same verdict, one small all-gather over the shard group
then tells each rank whether any shard's replicas disagreed, together with each shard's digest;
only when some disagree are the whole tables all-gathered (over every rank) to name the minority
copies, shard by shard: a strict majority needs >= 3 replicas; with 2, the divergence is reported
with nobody named (``unattributable``) and the next audit decides.

The digest a checkpoint is tagged with is one per shard (the fingerprint table of that shard,
agreed by its replicas), combined in shard order into one: it names the sharded checkpoint's
weights as a whole, identical on every rank.

Under full sharding a shard has a single copy: :class:`~.check.WeightCheckOff` stands in,
comparing nothing (the adapter logs this at start).

The layout comes from the parallelism adapter (:class:`~sdc_agent.parallel.adapter.WeightReplicas`):
which ranks hold copies of which shard, and the groups to compare them over.
"""

from __future__ import annotations

import hashlib
import struct

import torch
import torch.distributed as dist

from ...fingerprint import fingerprints, table_digest
from ...parallel.adapter import WeightReplicas
from .divergence import ReplicaComparison
from .report import DivergenceReport, name_minority_copies

_DIGEST_WORDS = 4
"""A sha256 hex digest as four int64 words (the all-gather carries integers)."""


def _digest_words(digest: str) -> list[int]:
    return list(struct.unpack("<4q", bytes.fromhex(digest)))


def _words_digest(words: list[int]) -> str:
    return struct.pack("<4q", *words).hex()


class ShardedDivergenceCheck(ReplicaComparison):
    """One comparison of every shard with its replicas, launched when made (see the module
    docstring). Collective: make it and call :meth:`report` (or :meth:`wait`) on every rank."""

    def __init__(self, replicas: WeightReplicas) -> None:
        """Fingerprint this rank's shards now and launch the all-reduce over its replicas."""
        self._replicas = replicas
        self._names = [name for name, _ in replicas.named_weights]
        shards = [p.to_local() for _, p in replicas.named_weights]  # type: ignore[attr-defined]  # the sharded layouts' weights are DTensors, typed Tensor
        self._launch(fingerprints(shards).to(replicas.collective_device), replicas.replica_group)

    def report(self) -> DivergenceReport:
        """The comparison's outcome, identical on every rank (collective: one small all-gather
        over the shard group; the tables over every rank only when copies differ)."""
        if self._report is not None:
            return self._report
        agreed_here = self._copies_agree()
        layout = self._replicas
        mine = torch.tensor(
            [int(not agreed_here), *_digest_words(table_digest(self._table))],
            dtype=torch.int64,
            device=layout.collective_device,
        )
        per_shard = [torch.empty_like(mine) for _ in range(layout.shards)]
        dist.all_gather(per_shard, mine, group=layout.shard_group)
        shard_rows = [r.cpu().tolist() for r in per_shard]  # in shard order
        if not any(r[0] for r in shard_rows):
            combined = hashlib.sha256(
                "".join(_words_digest(r[1 : 1 + _DIGEST_WORDS]) for r in shard_rows).encode()
            ).hexdigest()
            self._report = DivergenceReport(digest=combined)
            return self._report
        names_of_shard = layout.names_of_shard or (tuple(self._names),) * layout.shards
        # Pipeline stages hold different weights: pad every table to the longest.
        table = self._table
        longest = max(len(names) for names in names_of_shard)
        if len(table) < longest:
            table = torch.cat([table, table.new_zeros((longest - len(table), *table.shape[1:]))])
        gathered = [torch.empty_like(table) for _ in range(layout.ranks)]
        dist.all_gather(gathered, table, group=layout.group)
        tables = torch.stack(gathered).cpu()
        ranks: set[int] = set()
        tensors: list[str] = []
        unattributable = False
        for copies, names in zip(layout.replicas_of_shard, names_of_shard, strict=True):
            shard_report = name_minority_copies(
                tables[list(copies), : len(names)], list(names), list(copies)
            )
            ranks.update(shard_report.ranks)
            tensors += [t for t in shard_report.tensors if t not in tensors]
            unattributable = unattributable or shard_report.unattributable
        self._report = DivergenceReport(
            ranks=sorted(ranks), tensors=tensors, unattributable=unattributable, digest=None
        )
        return self._report

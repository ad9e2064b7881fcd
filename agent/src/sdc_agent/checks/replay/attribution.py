"""Check 2's attribution: which replay comparisons disagree, and whom a disagreement blames.

Pure logic over DP ranks (0..world-1); no collectives, no tensors. Rank r replays the micro-batch
of target t = (r + offset) % world, so every rank sits in two comparisons: as the target of
r - offset and as the replayer of r + offset. A rank in two mismatched comparisons computed wrong
both times: it is the culprit. A single mismatch is settled by a confirmation: the third GPU
(target + offset, on a third node) and the target itself replay the target's batch once more.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ...alarm import VerdictKind

if TYPE_CHECKING:
    from typing import Self  # Python 3.11; only read by the type checker here

ROW_WIDTH = 9
"""Int64 values per outcome in the collectives: loss bits, two digest words, finite, valid, the
digest of the batch the computation's forward consumed, the digest of the batch its owner trained
on (known only to the owner), the set-up flags (:data:`WRAPPER_IN_REPLAY` ...), and the digest of
the whole micro-batch a replay's ``rebuild_batch`` returned (labels included)."""

WRAPPER_IN_REPLAY = 1
"""Set-up flag: ``compute_loss`` ran the training wrapper (DDP) during a replay instead of the
module it was given."""
SELF_LOSS_DIFFERS = 2
"""Preflight flag: two replays of the rank's own micro-batch on its own GPU gave different losses."""
SELF_GRADS_DIFFER = 4
"""Preflight flag: ... the same loss, but different gradients."""
SELF_DIFFERS_FROM_TRAINING = 8
"""Preflight flag: the rank's replay of its own micro-batch differs from its training."""
NONDETERMINISTIC_OP = 16
"""An op without a deterministic kernel ran in the computation (deterministic mode warned)."""
SELF_REBUILD_DIFFERS = 32
"""Preflight flag: two calls of the rank's ``rebuild_batch`` for its own micro-batch returned
different micro-batches (randomness in the loader, or a cached batch changed in place)."""

FAILED_ROW = [0, 0, 0, 0, 2, 0, 0, 0, 0]
"""Sent instead of an outcome when a replay raised: the collective still completes everywhere,
and nobody is judged on a computation that did not happen."""


def is_failed(row: list[int]) -> bool:
    """Whether ``row`` is :data:`FAILED_ROW` (a replay that raised)."""
    return row[4] == FAILED_ROW[4]


@dataclass(frozen=True)
class Outcome:
    """What one computation of one micro-batch produced, reduced to comparable bits."""

    loss_bits: int
    grad_digest: tuple[int, int]
    finite: bool
    batch: int = 0
    """Digest of the micro-batch(es) this computation consumed (0: not recorded)."""
    trained: int = 0
    """Digest of the micro-batch(es) the computation's owner trained on, sent by the owner only
    (0: unknown to the writer of the row)."""
    flags: int = 0
    """Set-up and preflight flags (:data:`WRAPPER_IN_REPLAY` ...)."""
    rebuilt: int = 0
    """Digest of everything ``rebuild_batch`` returned for a replay, as ``compute_loss`` received
    it (the labels too, which the forward never sees); 0 for a training computation. Two replays
    of one target's batch on two ranks must agree on it (:func:`.setup.rebuild_finding`)."""

    def matches(self, other: Outcome, *, compare_grads: bool) -> bool:
        """Bit-for-bit agreement of the loss (and of every gradient, with deterministic kernels)."""
        if self.finite != other.finite or self.loss_bits != other.loss_bits:
            return False
        return not compare_grads or self.grad_digest == other.grad_digest

    def to_row(self) -> list[int]:
        """The outcome as ROW_WIDTH int64 values (the last one marks the row as filled)."""
        return [
            self.loss_bits,
            *self.grad_digest,
            int(self.finite),
            1,
            self.batch,
            self.trained,
            self.flags,
            self.rebuilt,
        ]

    @classmethod
    def from_row(cls, row: list[int]) -> Outcome:
        """Inverse of :meth:`to_row`."""
        if len(row) != ROW_WIDTH or row[4] != 1:
            raise ValueError(f"not a filled outcome row: {row!r}")
        return cls(
            loss_bits=row[0],
            grad_digest=(row[1], row[2]),
            finite=bool(row[3]),
            batch=row[5],
            trained=row[6],
            flags=row[7],
            rebuilt=row[8],
        )


def replay_target(replayer: int, world: int, offset: int) -> int:
    """The DP rank whose micro-batch ``replayer`` recomputes."""
    return (replayer + offset) % world


def third_gpu(target: int, world: int, offset: int) -> int:
    """The DP rank that settles a dispute over ``target``'s batch (neither target nor replayer)."""
    return (target + offset) % world


def find_mismatches(
    own: Sequence[Any],
    replayed: Sequence[Any],
    offset: int,
    *,
    compare_grads: bool,
    differs: Callable[[Any, Any], bool] | None = None,
) -> list[tuple[int, int]]:
    """(target, replayer) pairs whose results differ; ``replayed[r]`` is r's replay of its target.

    ``differs(own, replayed)``: when two results count as different (default: not
    :meth:`Outcome.matches`; a pipeline stage's compares only what it computed itself)."""
    world = len(own)
    pairs = []
    for replayer in range(world):
        target = replay_target(replayer, world, offset)
        if differs is not None:
            mismatched = differs(own[target], replayed[replayer])
        else:
            mismatched = not own[target].matches(replayed[replayer], compare_grads=compare_grads)
        if mismatched:
            pairs.append((target, replayer))
    return sorted(pairs)


def find_culprits(pairs: list[tuple[int, int]]) -> list[int]:
    """Ranks in two mismatched comparisons: wrong as target AND as replayer."""
    counts = Counter(rank for pair in pairs for rank in pair)
    return sorted(rank for rank, n in counts.items() if n >= 2)


def unexplained(pairs: list[tuple[int, int]], culprits: list[int]) -> list[tuple[int, int]]:
    """Mismatched pairs that no culprit accounts for: each needs a confirmation."""
    blamed = set(culprits)
    return [p for p in pairs if not blamed.intersection(p)]


def confirmation_jobs(
    targets: list[int], world: int, offset: int, me: int
) -> list[tuple[int, int, int]]:
    """(slot, column, target) replays rank ``me`` runs to confirm ``targets``.

    Slot i holds two replays of ``targets[i]``'s batch: column 0 by the third GPU, column 1 by
    the target itself (never the target alone: the third is what makes the verdict).
    """
    jobs = []
    for slot, target in enumerate(targets):
        if third_gpu(target, world, offset) == me:
            jobs.append((slot, 0, target))
        if target == me:
            jobs.append((slot, 1, target))
    return jobs


class Comparable(Protocol):
    """What :func:`mismatch_verdict` compares: a replay's outcome (:class:`Outcome`, or the
    pipeline's per-stage ``PipelineOutcome``), equal or not to another of its kind."""

    def matches(self, other: Self, *, compare_grads: bool) -> bool:
        """Whether the two computed the same bits (the gradients' too, ``compare_grads``)."""
        ...


_Compared = TypeVar("_Compared", bound=Comparable)


def mismatch_verdict(
    original: _Compared,
    replayed: _Compared,
    third: _Compared,
    again: _Compared,
    *,
    compare_grads: bool,
) -> tuple[VerdictKind, str]:
    """Settle one mismatched pair; returns (kind, who): who is "target", "replayer" or "".

    ``original``: the target's own training computation; ``replayed``: the replayer's;
    ``third``: the third GPU's replay; ``again``: the target's replay of its own batch.
    """

    def same(a: _Compared, b: _Compared) -> bool:
        return a.matches(b, compare_grads=compare_grads)

    if same(third, original):
        return "replayer_wrong", "replayer"
    if same(third, replayed):
        # Two GPUs on two other nodes agree: the target's original result was wrong.
        return ("transient", "target") if same(again, third) else ("persistent", "target")
    return "unclear", ""


def nonfinite_verdict(
    third: Outcome, again: Outcome, *, compare_grads: bool
) -> tuple[VerdictKind, str]:
    """Settle a non-finite local gradient; who is "target" or "" (nobody).

    A third GPU (on another node) that also gets a non-finite result on the same batch means
    the batch or the numerics (an fp16 overflow, a poisoned batch), not the GPU, is at fault:
    ``reproducible``, and nobody is blamed.
    """
    if not third.finite:
        return "reproducible", ""
    if not again.finite:
        return "persistent", "target"
    if again.matches(third, compare_grads=compare_grads):
        return "transient", "target"
    return "unclear", "target"


# ---------------------------------------------------------------- ranks that compute together
def first_divergence(own: Sequence[Sequence[int]], replayed: Sequence[Sequence[int]]) -> int:
    """The index of the first local result (a row of fingerprints, in the order the rank
    computed them) where ``own`` and ``replayed`` differ; their common length when one is the
    other's prefix or they are equal (then only the loss, computed after them, differed)."""
    for index, (a, b) in enumerate(zip(own, replayed, strict=False)):
        if list(a) != list(b):
            return index
    return min(len(own), len(replayed))


def earliest_local_mismatches(
    pairs: list[tuple[int, int]],
    first: dict[tuple[int, int], int],
    group_of: Sequence[int],
) -> list[tuple[int, int]]:
    """The mismatched (target, replayer) pairs at which the divergence is EARLIEST among the
    pairs of the same two groups of ranks that compute together (tensor parallel groups).

    Rank r of group G replays rank r + offset of group H, and every rank of G replays H's
    micro-batch, each its own slice: the pairs between G and H, one per slice. ``first[pair]``
    is the index of the first local result where the pair differs (:func:`first_divergence`).
    A rank's local results up to that index were computed from results that agreed, so the
    ranks that diverged first computed wrong themselves; the ranks of the same groups that
    diverged later only received a wrong result through a collective that mixes the slices
    (a row-parallel all-reduce). Those later pairs are dropped, and the ring's attribution
    (:func:`find_culprits`, confirmations) runs on what is left, slice by slice: it names the
    GPU, not its group. Ranks alone in their group keep every pair.
    """
    earliest: dict[tuple[int, int], int] = {}
    for pair in pairs:
        key = (group_of[pair[0]], group_of[pair[1]])
        earliest[key] = min(earliest.get(key, first[pair]), first[pair])
    return sorted(
        pair for pair in pairs if first[pair] == earliest[(group_of[pair[0]], group_of[pair[1]])]
    )

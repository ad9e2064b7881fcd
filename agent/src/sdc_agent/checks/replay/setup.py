"""Set-up findings: what the audit rules out before it may name a GPU.

A replay comparison names hardware only when the replay recomputed the target's very
micro-batch, with the same code, on kernels that give the same bits twice. Each rule below
catches one way that fails, from the rows every rank gathered (pure logic, the same on every
rank). A finding is the job's set-up (``setup`` in the report): it names nobody, publishes no
per-node series (nothing is cordoned), and says which check failed and how to fix it
(docs/recovery.md, "False alarms").

A single faulty GPU sits in exactly two comparisons of its ring (as target and as replayer), so a
ring with more mismatched comparisons than that is not one GPU's doing (:func:`pattern_finding`);
neither is a batch that differs before any result is compared (:func:`batch_finding`), a replay
that ran the training wrapper (:func:`wrapper_finding`), nor the preflight's findings
(:func:`preflight_finding`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from sdc_contract.report import SetupCause

from ...errors import SdcAgentError
from .attribution import (
    SELF_DIFFERS_FROM_TRAINING,
    SELF_GRADS_DIFFER,
    SELF_LOSS_DIFFERS,
    SELF_REBUILD_DIFFERS,
    WRAPPER_IN_REPLAY,
    Outcome,
    replay_target,
)


class AuditSetupError(SdcAgentError, RuntimeError):
    """The audit found the job's set-up wrong (``Schedule(on_setup_error="stop")``): raised on
    every rank at the same point, after the report was published; the message names the check
    that failed and how to fix it."""


@dataclass(frozen=True)
class SetupFinding:
    """One check of the user's set-up that failed: the report's ``setup`` entry."""

    cause: SetupCause
    detail: str
    """What was seen (ranks, steps)."""
    fix: str
    """What to change."""
    pairs: tuple[tuple[int, int], ...] = ()
    """The (target, replayer) comparisons concerned (DP ranks), if any."""

    def to_dict(self, audits: str) -> dict[str, Any]:
        """The report's ``setup`` entry (``audits``: ``off`` or ``stopped``)."""
        return {"cause": self.cause, "detail": self.detail, "fix": self.fix, "audits": audits}

    def message(self) -> str:
        """One line for a log or an error."""
        return f"{self.cause}: {self.detail}. Fix: {self.fix}"


_REBUILD_FIX = (
    "rebuild_batch(step, rank) must return exactly the micro-batch global `rank` trained on at "
    "`step` (with grad_accum = N, the same N micro-batches): seed the loader from (step, rank) "
    "or index the dataset by them, and after a resume shift it with the start step"
)


def batch_finding(
    owns: Sequence[Outcome], replays: Sequence[Outcome], offset: int, global_rank: Any
) -> SetupFinding | None:
    """The comparisons whose replay consumed another batch than its target trained on.

    ``owns[t]`` carries what DP rank t trained on (``trained``), ``replays[r]`` what r's
    replay of its target was fed (``batch``); 0 on either side means not recorded."""
    world = len(owns)
    pairs = []
    for replayer in range(world):
        target = replay_target(replayer, world, offset)
        trained, rebuilt = owns[target].trained, replays[replayer].batch
        if trained and rebuilt and trained != rebuilt:
            pairs.append((target, replayer))
    if not pairs:
        return None
    shown = ", ".join(
        f"rank {global_rank(r)}'s rebuild_batch(step, {global_rank(t)})" for t, r in pairs[:8]
    )
    more = f" and {len(pairs) - 8} more" if len(pairs) > 8 else ""
    return SetupFinding(
        cause="rebuild_batch_mismatch",
        detail=(
            f"{len(pairs)} of {world} replays were fed another batch than their target trained "
            f"on: {shown}{more} returned inputs whose fingerprint differs from what that rank's "
            "forward received in training"
        ),
        fix=_REBUILD_FIX,
        pairs=tuple(sorted(pairs)),
    )


def wrapper_finding(replays: Sequence[Outcome], global_rank: Any) -> SetupFinding | None:
    """Replays whose ``compute_loss`` ran the training wrapper instead of the given module."""
    ranks = [global_rank(r) for r, o in enumerate(replays) if o.flags & WRAPPER_IN_REPLAY]
    if not ranks:
        return None
    return SetupFinding(
        cause="compute_loss_ignores_model",
        detail=(
            f"on ranks {ranks[:8]}, compute_loss(model, batch) called the training model "
            "(the DDP wrapper) during a replay instead of the bare module it was given"
        ),
        fix=(
            "use the `model` argument inside compute_loss (the guard passes the DDP model in "
            "training and the bare module in replays), never a global or closed-over model"
        ),
    )


def rings_of(world: int, offset: int) -> list[list[int]]:
    """The rings of the replay permutation r -> (r + offset) % world, each in ring order."""
    seen: set[int] = set()
    rings = []
    for start in range(world):
        if start in seen:
            continue
        ring = [start]
        seen.add(start)
        nxt = replay_target(start, world, offset)
        while nxt != start:
            ring.append(nxt)
            seen.add(nxt)
            nxt = replay_target(nxt, world, offset)
        rings.append(ring)
    return rings


def pattern_finding(
    pairs: Sequence[tuple[int, int]], world: int, offset: int, global_rank: Any
) -> SetupFinding | None:
    """A ring with more mismatched comparisons than one faulty GPU explains (two: as target
    and as replayer). Two rings with one fault each stay a hardware finding."""
    crowded = []
    for ring in rings_of(world, offset):
        members = set(ring)
        in_ring = [p for p in pairs if p[0] in members]
        if len(in_ring) > 2:
            crowded.append((ring, in_ring))
    if not crowded:
        return None
    ring, in_ring = max(crowded, key=lambda c: len(c[1]))
    every = sum(len(c[1]) for c in crowded) == sum(len(c[0]) for c in crowded)
    return SetupFinding(
        cause="more_than_one_gpu",
        detail=(
            f"{len(in_ring)} of the {len(ring)} comparisons of the ring of ranks "
            f"{[global_rank(r) for r in ring][:8]} mismatched"
            + (" (every comparison)" if every else "")
            + "; one faulty GPU mismatches at most two (as target and as replayer): training "
            "and replays compute differently (compute_loss, rebuild_batch, or model state that "
            "differs between training and replay)"
        ),
        fix=(
            "make a replay compute what training computed: rebuild_batch returns the trained "
            "micro-batch, compute_loss uses its `model` argument and no state outside it "
            "(a counter, a random draw not from torch's generator); see docs/recovery.md, "
            "'False alarms'"
        ),
        pairs=tuple(sorted(pairs)),
    )


@dataclass(frozen=True)
class Preflight:
    """What the first audit's self-replays showed (the same on every rank)."""

    compare_grads: bool
    """Two replays of one micro-batch on one GPU gave the same gradient bits everywhere."""
    finding: SetupFinding | None
    """A preflight failure (nondeterministic losses, every rank's replay off its training)."""
    notes: tuple[str, ...] = ()
    """What the preflight changed, for ``coverage()``."""


def preflight(owns: Sequence[Outcome], global_rank: Any, *, compare_grads: bool) -> Preflight:
    """Judge the preflight flags every rank set in its own row (``compare_grads``: the audit
    compares gradients today)."""
    world = len(owns)
    unrepeatable = [global_rank(r) for r, o in enumerate(owns) if o.flags & SELF_REBUILD_DIFFERS]
    if unrepeatable:
        return Preflight(
            compare_grads=compare_grads,
            finding=SetupFinding(
                cause="rebuild_batch_mismatch",
                detail=(
                    f"on ranks {unrepeatable[:8]}, two calls of rebuild_batch(step, rank) for the "
                    "same step returned different micro-batches (inputs or labels): the loader "
                    "draws randomness that is not seeded from (step, rank), or a cached batch "
                    "was changed in place (by compute_loss or the training loop)"
                ),
                fix=_REBUILD_FIX + "; never return a tensor that training changes in place",
            ),
        )
    loss_differs = [global_rank(r) for r, o in enumerate(owns) if o.flags & SELF_LOSS_DIFFERS]
    grads_differ = [global_rank(r) for r, o in enumerate(owns) if o.flags & SELF_GRADS_DIFFER]
    off_training = [
        global_rank(r) for r, o in enumerate(owns) if o.flags & SELF_DIFFERS_FROM_TRAINING
    ]
    if loss_differs:
        return Preflight(
            compare_grads=False,
            finding=SetupFinding(
                cause="nondeterministic_replay",
                detail=(
                    f"two replays of the same micro-batch on the same GPU gave different losses "
                    f"on ranks {loss_differs[:8]}: a kernel outside torch's deterministic mode "
                    "(flash_attn, Transformer Engine, Liger/Apex atomics, torch.compile "
                    "autotuning) or randomness not drawn from torch's generator runs in the "
                    "forward, so no replay can be compared bit for bit"
                ),
                fix=(
                    "use deterministic kernels on audit steps (e.g. attn_implementation='sdpa' "
                    "instead of 'flash_attention_2'), draw randomness from torch's generator, "
                    "or turn the audit off with Schedule(audit_every=0) and rely on the other "
                    "checks"
                ),
            ),
        )
    notes: list[str] = []
    if grads_differ and compare_grads:
        notes.append(
            f"gradients are not compared: two replays of one micro-batch on one GPU gave the "
            f"same loss but different gradient bits on ranks {grads_differ[:8]} (a backward "
            "kernel outside deterministic mode); the audit compares the loss bits only"
        )
    if len(off_training) == world and world > 0:
        return Preflight(
            compare_grads=compare_grads and not grads_differ,
            finding=SetupFinding(
                cause="replay_differs_from_training",
                detail=(
                    "on every rank, replaying its own micro-batch of the first audited step "
                    "gave another result than its training did, while two replays agreed: "
                    "training and replay do not compute the same thing"
                ),
                fix=(
                    "compute_loss must return the same loss for the DDP model and for its bare "
                    "module, and rebuild_batch the trained micro-batch; with gradient "
                    "accumulation outside the guard, accumulate inside it "
                    "(Schedule(grad_accum=N)); see docs/recovery.md, 'False alarms'"
                ),
            ),
            notes=tuple(notes),
        )
    return Preflight(
        compare_grads=compare_grads and not grads_differ, finding=None, notes=tuple(notes)
    )


def third_batch_finding(target: int, third: int) -> SetupFinding:
    """The finding for a confirmation whose third GPU (global rank ``third``) rebuilt another
    batch for global rank ``target`` than ``target`` trained on, while its replayer's matched."""
    return SetupFinding(
        cause="rebuild_batch_mismatch",
        detail=(
            f"rank {third}'s rebuild_batch(step, {target}) returned another batch than rank "
            f"{target} trained on, while its replayer's rebuild matched: rebuild_batch depends "
            "on the rank that calls it"
        ),
        fix=_REBUILD_FIX,
    )


def rebuild_finding(
    target: int, replays: Sequence[tuple[int, Outcome]], global_rank: Any
) -> SetupFinding | None:
    """Replays of DP rank ``target``'s batch on several ranks (``(dp rank, outcome)``: its
    replayer, its third GPU, the target itself) whose ``rebuild_batch`` returned different
    micro-batches (:attr:`.attribution.Outcome.rebuilt`, labels included): whatever their results,
    they did not compute the same thing, so a dispute between them says nothing about a GPU.
    The ranks whose rebuild differs from the others' are named as the set-up's, never as GPUs."""
    known = [(rank, o.rebuilt) for rank, o in replays if o.rebuilt]
    digests = {d for _, d in known}
    if len(digests) < 2:
        return None
    counts = {d: sum(1 for _, e in known if e == d) for d in digests}
    usual = max(counts, key=lambda d: counts[d])
    tie = sum(1 for n in counts.values() if n == counts[usual]) > 1
    odd = [rank for rank, d in known if tie or d != usual]
    rest = [rank for rank, d in known if rank not in odd]
    who = ", ".join(f"rank {global_rank(r)}'s" for r in odd)
    than = f" than rank(s) {[global_rank(r) for r in rest]} rebuilt" if rest else " from each other"
    return SetupFinding(
        cause="rebuild_batch_mismatch",
        detail=(
            f"{who} rebuild_batch(step, {global_rank(target)}) returned another micro-batch "
            f"(inputs or labels){than}: rebuild_batch depends on the rank that calls it, so the "
            "replays of that batch cannot be compared"
        ),
        fix=_REBUILD_FIX,
    )


def compute_signature(device: torch.device) -> str:
    """What decides whether two ranks compute the same bits for the same work: the torch and
    CUDA (cuBLAS) versions, and the GPU model, compute capability and SM count (cuBLAS picks
    its kernels by them), or on the CPU the intra-op thread count (1 vs 2 threads changes the
    bits of a reduction)."""
    parts = [f"torch {torch.__version__}"]
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        parts += [
            f"cuda {torch.version.cuda}",
            f"{props.name} sm_{props.major}{props.minor} x{props.multi_processor_count}",
        ]
    else:
        parts.append(f"{device.type} threads {torch.get_num_threads()}")
    return "; ".join(parts)


def heterogeneity_finding(signatures: Sequence[str], ranks: Sequence[int]) -> SetupFinding | None:
    """Ranks whose compute signatures (:func:`compute_signature`) differ: a replay on one of
    them cannot reproduce another's bits, so every comparison across them would mismatch and
    name a healthy GPU. ``ranks``: the global rank of each signature."""
    groups: dict[str, list[int]] = {}
    for signature, rank in zip(signatures, ranks, strict=True):
        groups.setdefault(signature, []).append(rank)
    if len(groups) < 2:
        return None
    shown = "; ".join(f"ranks {members[:6]}: {sig}" for sig, members in groups.items())
    return SetupFinding(
        cause="heterogeneous_ranks",
        detail=(
            f"the ranks do not compute alike ({shown}): bit-for-bit replays across them "
            "cannot agree"
        ),
        fix=(
            "run the job on one GPU model and SM count with one torch/CUDA build everywhere (one "
            "HyperPod instance group, one image), and on the CPU the same torch.set_num_threads "
            "on every rank; or set Schedule(audit_every=0)"
        ),
    )


def repeated_failure(step: int, failed: Sequence[int], count: int) -> SetupFinding:
    """The finding for audits whose replays kept raising (``count`` audits in a row)."""
    return SetupFinding(
        cause="rebuild_batch_failed",
        detail=(
            f"replays raised on ranks {list(failed)[:8]} in {count} audits in a row (the last at "
            f"step {step}; each rank's log has the traceback): rebuild_batch or compute_loss "
            "cannot recompute a trained micro-batch"
        ),
        fix=_REBUILD_FIX,
    )


__all__ = [
    "AuditSetupError",
    "Preflight",
    "SetupFinding",
    "batch_finding",
    "compute_signature",
    "heterogeneity_finding",
    "pattern_finding",
    "preflight",
    "rebuild_finding",
    "repeated_failure",
    "rings_of",
    "third_batch_finding",
    "wrapper_finding",
]

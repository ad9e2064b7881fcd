"""The DDP comm hook: per-bucket statistics of the gradient, before and after the all-reduce.

After the all-reduce the local gradient is gone (the bucket holds the average), so everything the
checks need from it is recorded here: a float32 sum of each local bucket on every step (check 1)
and, on audit steps, each parameter's gradient fingerprint (check 2). The reduced bucket's sum is
taken as its all-reduce completes (on the communication thread or stream, overlapping the rest
of backward), so check 1 reads no gradient after backward. A sum is finite exactly when every
element is (NaN and Inf propagate, +Inf + -Inf is NaN) unless the values are near 3e38; a squared
norm would overflow on finite gradients from 1.8e19 and costs more per element. The hook never
changes gradient values: the reduction is torch's own ``allreduce_hook``. Nothing here
synchronises the device.
"""

# No `from __future__ import annotations` here: DDP inspects the hook's annotations at runtime
# and requires real dist.GradBucket / torch.futures.Future[torch.Tensor] objects.
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from .fingerprint import fingerprints

ReducedTap = Callable[[dist.GradBucket, torch.Tensor], None]


@dataclass
class GradStatsState:
    """State of :func:`grad_stats_hook`; one per guarded DDP model."""

    process_group: dist.ProcessGroup | None
    """Group the gradients are averaged over (None: WORLD), as for torch's own hooks."""
    param_index: dict[int, int]
    """``id(parameter)`` -> row of that parameter in the guard's fingerprint tables."""
    capture_fingerprints: bool = False
    """Set by the guard on audit steps, before the forward pass."""
    local_sums: list[torch.Tensor] = field(default_factory=list)
    """Per bucket of this step: float32 sum of the LOCAL gradient (before the all-reduce)."""
    reduced_sums: list[torch.Tensor] = field(default_factory=list)
    """Per bucket of this step: float32 sum of the REDUCED gradient (appended as each bucket's
    all-reduce completes, possibly on a communication thread; list.append is atomic)."""
    local_fingerprints: torch.Tensor | None = None
    """[num_params, 2] int64 fingerprints of the local gradients (audit steps only)."""
    reduced_taps: list[ReducedTap] = field(default_factory=list)
    """Callables that see each reduced bucket (used by fault drills; empty in production)."""

    def arm(self, *, capture_fingerprints: bool, device: torch.device) -> None:
        """Reset the per-step statistics before a forward pass."""
        self.local_sums = []
        self.reduced_sums = []
        self.capture_fingerprints = capture_fingerprints
        self.local_fingerprints = (
            torch.zeros((len(self.param_index), 2), dtype=torch.int64, device=device)
            if capture_fingerprints
            else None
        )


def grad_stats_hook(
    state: GradStatsState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Record the local bucket's statistics, all-reduce it exactly as DDP's default does, and
    record the reduced bucket's sum when the reduction completes."""
    buffer = bucket.buffer()
    # float32 accumulation: an fp16/bf16 bucket's sum would overflow long before its values do.
    state.local_sums.append(buffer.sum(dtype=torch.float32))
    if state.capture_fingerprints and state.local_fingerprints is not None:
        # One batched call per bucket: the per-call overhead dominates for small parameters.
        rows = [state.param_index[id(param)] for param in bucket.parameters()]
        table = fingerprints(bucket.gradients())
        state.local_fingerprints[rows] = table.to(state.local_fingerprints.device)

    def after_reduction(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
        reduced = fut.value()
        for tap in state.reduced_taps:
            tap(bucket, reduced)
        state.reduced_sums.append(reduced.sum(dtype=torch.float32))
        return reduced

    return default_hooks.allreduce_hook(state.process_group, bucket).then(after_reduction)

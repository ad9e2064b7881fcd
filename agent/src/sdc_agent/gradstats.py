"""The DDP comm hook: per-bucket statistics of the LOCAL gradient, taken before the all-reduce.

After the all-reduce the local gradient is gone (the bucket holds the average), so everything the
checks need from it is recorded here: the local squared norm on every step (check 1) and, on audit
steps, each parameter's gradient fingerprint (check 2). The hook never changes gradient values:
the reduction is torch's own ``allreduce_hook``. Nothing here synchronises the device.
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
    local_sq_norm: torch.Tensor | None = None
    """Sum over this step's buckets of the squared L2 norm of the local gradient."""
    local_fingerprints: torch.Tensor | None = None
    """[num_params, 2] int64 fingerprints of the local gradients (audit steps only)."""
    reduced_taps: list[ReducedTap] = field(default_factory=list)
    """Callables that see each reduced bucket (used by fault drills; empty in production)."""

    def arm(self, *, capture_fingerprints: bool, device: torch.device) -> None:
        """Reset the per-step statistics before a forward pass."""
        self.local_sq_norm = None
        self.capture_fingerprints = capture_fingerprints
        self.local_fingerprints = (
            torch.zeros((len(self.param_index), 2), dtype=torch.int64, device=device)
            if capture_fingerprints
            else None
        )


def grad_stats_hook(
    state: GradStatsState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Record the local bucket's statistics, then all-reduce it exactly as DDP's default does."""
    buffer = bucket.buffer()
    # float32 accumulation: an fp16/bf16 bucket's norm would overflow long before its values do.
    sq = torch.linalg.vector_norm(buffer, dtype=torch.float32).square()
    state.local_sq_norm = sq if state.local_sq_norm is None else state.local_sq_norm + sq
    if state.capture_fingerprints and state.local_fingerprints is not None:
        # One batched call per bucket: the per-call overhead dominates for small parameters.
        rows = [state.param_index[id(param)] for param in bucket.parameters()]
        table = fingerprints(bucket.gradients())
        state.local_fingerprints[rows] = table.to(state.local_fingerprints.device)
    future = default_hooks.allreduce_hook(state.process_group, bucket)
    if not state.reduced_taps:
        return future

    def run_taps(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
        reduced = fut.value()
        for tap in state.reduced_taps:
            tap(bucket, reduced)
        return reduced

    return future.then(run_taps)

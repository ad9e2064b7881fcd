"""Check 1's per-step record: what the gradient taps saw of this rank's local and reduced gradient.

The DDP comm hook (:mod:`.comm_hook`) and the post-accumulate-grad taps of a wrapper without one
(FSDP2, :mod:`.taps`) write into the same :class:`GradStatsState`, so the flag exchange
(:mod:`.exchange`) does not know which of them ran.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

ReducedTap = Callable[[dist.GradBucket, torch.Tensor], None]
"""``tap(bucket, reduced)``: sees each reduced bucket (DDP) or reduced shard (FSDP2)."""


@dataclass
class GradStatsState:
    """What check 1's taps recorded this step; one per guarded model (and one per FSDP2 replay)."""

    process_group: dist.ProcessGroup | None
    """Group the gradients are averaged over (None: WORLD), as for torch's own hooks."""
    param_index: dict[int, int]
    """``id(parameter)`` -> row of that parameter in the guard's fingerprint tables."""
    capture_fingerprints: bool = False
    """Set by the guard on audit steps, before the forward pass."""
    local_flags: list[torch.Tensor] = field(default_factory=list)
    """Per bucket (DDP) or tapped parameter (FSDP2) of this step: one float32 element, nonzero when the LOCAL gradient (before the
    all-reduce) held a NaN/Inf."""
    reduced_sums: list[torch.Tensor] = field(default_factory=list)
    """Per bucket of this step: float32 sum of the REDUCED gradient (appended as each bucket's
    all-reduce completes, possibly on a communication thread; list.append is atomic)."""
    local_fingerprints: torch.Tensor | None = None
    """[num_params, 2] int64 fingerprints of the local gradients (audit steps only)."""
    reduced_taps: list[ReducedTap] = field(default_factory=list)
    """Callables that see each reduced bucket (used by fault drills; empty in production)."""

    def arm(self, *, capture_fingerprints: bool, device: torch.device) -> None:
        """Reset the per-step statistics before a forward pass."""
        self.local_flags = []
        self.reduced_sums = []
        self.capture_fingerprints = capture_fingerprints
        self.local_fingerprints = (
            torch.zeros((len(self.param_index), 2), dtype=torch.int64, device=device)
            if capture_fingerprints
            else None
        )

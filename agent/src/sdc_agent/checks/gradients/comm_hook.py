"""Check 1 under DDP: the comm hook that flags each local bucket and sums each reduced one.

The comm hook (:func:`grad_stats_hook`) records per-bucket statistics of the gradient before and
after the all-reduce. After the all-reduce the local gradient is gone (the bucket holds the
average), so everything the checks need from it is recorded here: whether each local bucket holds
a NaN/Inf, on every step (check 1), and on audit steps each parameter's gradient fingerprint
(check 2). The reduced bucket's sum is taken as its all-reduce completes (on the communication
thread or stream, overlapping the rest of backward), so check 1 reads no gradient after backward.
A sum is finite exactly when every element is (NaN and Inf propagate, +Inf + -Inf is NaN) unless
the values are near 3e38; a squared norm would overflow on finite gradients from 1.8e19 and costs
more. Replays measure finiteness with :func:`~.finiteness.all_finite`, element by element as the
fused kernel does, so a replay never calls a finite gradient non-finite.

The reduction is an all-reduce of the bucket divided by the world size, as DDP's own: torch's
Python ``allreduce_hook`` divides in a pass of its own, which a Python hook cannot avoid; here that
pass also checks the local values (torch's fused GradScaler kernel: multiply by 1/world and flag
any NaN/Inf in one pass), so the local check costs nothing extra. Multiplying by the reciprocal is
what DDP does without a hook. Where that kernel does not support the device or dtype, a float32
sum and ``div_`` do the same in two passes. Nothing here synchronises the device.
"""

# No `from __future__ import annotations` here: DDP inspects the hook's annotations at runtime
# and requires real dist.GradBucket / torch.futures.Future[torch.Tensor] objects.
import functools

import torch
import torch.distributed as dist

from ...fingerprint import fingerprints
from . import finiteness
from .stats import GradStatsState


def grad_stats_hook(
    state: GradStatsState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Record the local bucket's statistics, all-reduce it exactly as DDP's default does, and
    record the reduced bucket's sum when the reduction completes."""
    buffer = bucket.buffer()
    if state.capture_fingerprints and state.local_fingerprints is not None:
        # One batched call per bucket: the per-call overhead dominates for small parameters.
        device = state.local_fingerprints.device
        rows = _rows(tuple(state.param_index[id(param)] for param in bucket.parameters()), device)
        table = fingerprints(bucket.gradients())
        state.local_fingerprints[rows] = table.to(device)
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    if group is None:  # WORLD is None only before init_process_group, and DDP needs it
        raise RuntimeError("sdc_agent: the default process group is not initialized")
    state.local_flags.append(divide_and_check(buffer, group.size()))

    def after_reduction(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        reduced = fut.value()[0]
        for tap in state.reduced_taps:
            tap(bucket, reduced)
        # float32 accumulation: an fp16/bf16 bucket's sum would overflow long before its values.
        state.reduced_sums.append(reduced.sum(dtype=torch.float32))
        return reduced

    return dist.all_reduce(buffer, group=group, async_op=True).get_future().then(after_reduction)


@functools.lru_cache(maxsize=4096)
def _rows(rows: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """A bucket's fingerprint-table rows as an int64 index on ``device``, made once per bucket
    layout: indexing with a Python list copies it to the device on every audit step, and on a
    GPU that pageable copy blocks the host once per bucket (only read, never written)."""
    return torch.tensor(rows, dtype=torch.int64, device=device)


def _fused_supported(buffer: torch.Tensor) -> bool:
    """Whether torch's fused non-finite check and scale runs on this device type and dtype.

    Not for float64: its scale is a float32 tensor, so 1/world would be rounded to float32.
    """
    return buffer.dtype != torch.float64 and finiteness.fused_supported(buffer)


@functools.lru_cache(maxsize=16)
def _inverse(device: torch.device, world: int) -> torch.Tensor:
    """1/world as the fused kernel's float32 scale on ``device``, made once (it only reads it)."""
    return torch.full((1,), 1.0 / world, dtype=torch.float32, device=device)


def divide_and_check(buffer: torch.Tensor, world: int) -> torch.Tensor:
    """Multiply ``buffer`` by 1/world in place; a one-element float32 tensor on its device that
    is nonzero when ``buffer`` held a NaN/Inf before (one pass where torch's fused kernel allows)."""
    found = torch.zeros(1, dtype=torch.float32, device=buffer.device)
    if _fused_supported(buffer):
        torch._amp_foreach_non_finite_check_and_unscale_(
            [buffer], found, _inverse(buffer.device, world)
        )
        return found
    # Element by element (a float32 sum of huge finite float64 values would overflow).
    finiteness.mark_non_finite([buffer], found)
    buffer.mul_(1.0 / world)
    return found

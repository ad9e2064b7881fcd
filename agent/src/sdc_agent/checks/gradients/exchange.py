"""Check 1, non-finite gradients: the DDP comm hook, the per-step flags, and their settling.

The comm hook (:func:`grad_stats_hook`) records per-bucket statistics of the gradient before and
after the all-reduce. After the all-reduce the local gradient is gone (the bucket holds the
average), so everything the checks need from it is recorded here: whether each local bucket holds
a NaN/Inf, on every step (check 1), and on audit steps each parameter's gradient fingerprint
(check 2). The reduced bucket's sum is taken as its all-reduce completes (on the communication
thread or stream, overlapping the rest of backward), so check 1 reads no gradient after backward.
A sum is finite exactly when every element is (NaN and Inf propagate, +Inf + -Inf is NaN) unless
the values are near 3e38; a squared norm would overflow on finite gradients from 1.8e19 and costs
more. Replays measure finiteness with :func:`all_finite`, element by element as the fused kernel
does, so a replay never calls a finite gradient non-finite.

The reduction is an all-reduce of the bucket divided by the world size, as DDP's own: torch's
Python ``allreduce_hook`` divides in a pass of its own, which a Python hook cannot avoid; here that
pass also checks the local values (torch's fused GradScaler kernel: multiply by 1/world and flag
any NaN/Inf in one pass), so the local check costs nothing extra. Multiplying by the reciprocal is
what DDP does without a hook. Where that kernel does not support the device or dtype, a float32
sum and ``div_`` do the same in two passes. Nothing here synchronises the device.

The agreement (:class:`FlagExchange`): each rank knows after backward whether its own LOCAL
gradient and its own REDUCED gradient are finite; whether to apply the step must be decided the
same way everywhere. A blocking collective per step would make every rank wait for the slowest
to be scheduled before its optimizer step, and one whose size grows with the number of ranks
would not scale. So every step issues one asynchronous all-reduce (MAX) of four int64 (any
local NaN/Inf, any reduced NaN/Inf, any online sensor flag (:mod:`sdc_agent.sensors`), any rank
clean): its size does not depend on the world size
and tree algorithms make its latency logarithmic in it. It completes during the next step's
forward and backward, and a rank waits for it only when it has a reason to:

* its own flags are bad (it must not apply the step, and wants to know whether every rank saw it),
* the step is an audit step, or a collective check or a checkpoint follows, or the loop ends.

Only when something is set does a second collective, an all-gather of each rank's two flags, say
WHICH ranks' local gradient was non-finite (:meth:`FlagExchange.table`). Every rank learns from
the reduction that something is set, and every rank asks for the table at the same agreement
point, so every rank issues that gather: no rank is left waiting in it.

When every rank flagged something (a NaN anywhere reaches every rank's reduced gradient through
the sum, so this is the usual case) every rank is waiting at the same step and decides at once.
When only some ranks did (a corruption after the all-reduce on one rank), those ranks drop their
gradients and carry on; every rank settles the exchange at the next agreement point and returns
the same alarm, naming the step at which it happened. No rank ever applies a non-finite gradient.
"""

# No `from __future__ import annotations` here: DDP inspects the hook's annotations at runtime
# and requires real dist.GradBucket / torch.futures.Future[torch.Tensor] objects.
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from . import finiteness
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
    local_flags: list[torch.Tensor] = field(default_factory=list)
    """Per bucket of this step: one float32 element, nonzero when the LOCAL gradient (before the
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


def grad_stats_hook(
    state: GradStatsState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Record the local bucket's statistics, all-reduce it exactly as DDP's default does, and
    record the reduced bucket's sum when the reduction completes."""
    buffer = bucket.buffer()
    if state.capture_fingerprints and state.local_fingerprints is not None:
        # One batched call per bucket: the per-call overhead dominates for small parameters.
        rows = [state.param_index[id(param)] for param in bucket.parameters()]
        table = fingerprints(bucket.gradients())
        state.local_fingerprints[rows] = table.to(state.local_fingerprints.device)
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    state.local_flags.append(divide_and_check(buffer, group.size()))

    def after_reduction(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        reduced = fut.value()[0]
        for tap in state.reduced_taps:
            tap(bucket, reduced)
        # float32 accumulation: an fp16/bf16 bucket's sum would overflow long before its values.
        state.reduced_sums.append(reduced.sum(dtype=torch.float32))
        return reduced

    return dist.all_reduce(buffer, group=group, async_op=True).get_future().then(after_reduction)


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


def all_finite(tensors: Sequence[torch.Tensor | None]) -> bool:
    """Whether every element of every tensor is finite (None entries are skipped); one sync.

    Element by element, as the comm hook's fused kernel tests a bucket: huge finite values
    (1e30) are finite here, where a squared norm would overflow to Inf.
    """
    present = [t for t in tensors if t is not None]
    if not present:
        return True
    flag = finiteness.new_flag(present[0].device)
    finiteness.mark_non_finite(present, flag)
    return not bool(flag)


@dataclass(frozen=True)
class FlagSummary:
    """What one step's reduced flags say, without naming anyone (identical on every rank)."""

    step: int
    any_local: bool
    """Some rank's local gradient (before the all-reduce) held a NaN/Inf."""
    any_reduced: bool
    """Some rank's reduced (clipped) gradient was NaN/Inf."""
    unanimous: bool
    """Every rank flagged something, so every rank waits for the verdict at the same step."""
    any_sensor: bool = False
    """Some rank's online GEMM sensor flagged a candidate (sdc_agent.sensors)."""

    @property
    def clean(self) -> bool:
        """No rank flagged anything: the step may be applied everywhere."""
        return not self.any_local and not self.any_reduced and not self.any_sensor


@dataclass(frozen=True)
class FlagTable:
    """Every DP rank's flags for one step."""

    step: int
    local: tuple[bool, ...]
    """Per DP rank: its local gradient (before the all-reduce) held a NaN/Inf."""
    reduced: tuple[bool, ...]
    """Per DP rank: its reduced (clipped) gradient norm was NaN/Inf."""
    sensor: tuple[bool, ...] = ()
    """Per DP rank: an online GEMM sensor flagged a candidate (empty: none did)."""

    @property
    def nonfinite(self) -> list[int]:
        """DP ranks whose local gradient was non-finite."""
        return [dp for dp, bad in enumerate(self.local) if bad]

    @property
    def sensor_flagged(self) -> list[int]:
        """DP ranks whose online GEMM sensors flagged a candidate."""
        return [dp for dp, bad in enumerate(self.sensor) if bad]

    @property
    def clean(self) -> bool:
        """No rank flagged anything: the step may be applied everywhere."""
        return not any(self.local) and not any(self.reduced) and not any(self.sensor)

    @property
    def unanimous(self) -> bool:
        """Every rank flagged something, so every rank waited for this table at the same step."""
        sensor = self.sensor or (False,) * len(self.local)
        return all(
            lo or re or se for lo, re, se in zip(self.local, self.reduced, sensor, strict=True)
        )


class FlagExchange:
    """One step's flags: an asynchronous all-reduce (MAX) of four int64, then, only when
    something is set, an all-gather of each rank's ``[local_bad, reduced_bad, sensor_flag]``.

    Every rank must create one per step, in the same order as its other collectives.
    :meth:`summary` waits for the reduction (not a collective of its own; any rank may call it
    at any time). :meth:`table` is collective when the summary is not clean: every rank must
    call it at the same point.
    """

    def __init__(
        self,
        step: int,
        flags: torch.Tensor | Sequence[int],
        group: dist.ProcessGroup | None,
        world: int,
        *,
        device: torch.device | None = None,
    ) -> None:
        """Launch the reduction of this rank's flags ``[local_bad, reduced_bad]`` (and
        ``sensor_flag``, 0 when left out): an int64 tensor (judged on its device), or the same
        values already read to the host (the guard's per-step path: the reduction's four
        integers are then made in one allocation on ``device``, the collective's device, and
        this rank's flags as a tensor only if the per-rank table is gathered)."""
        self.step = step
        self._group = group
        self._world = world
        self._device = device
        self._own: tuple[int, int, int] | None = None
        self._flags: torch.Tensor | None = None
        if isinstance(flags, torch.Tensor):
            if flags.numel() == 2:  # SENSORS: the third flag is the online sensors' (0: none)
                flags = torch.cat([flags.reshape(2), flags.new_zeros(1)])
            self._flags = flags
            clean = (flags.sum() == 0).to(flags.dtype).reshape(1)
            self._reduced = torch.cat([flags.reshape(3), clean])
        else:
            local, reduced, sensor = (*map(int, map(bool, flags)), 0)[:3]
            self._own = (local, reduced, sensor)
            clean = int(not (local or reduced or sensor))
            self._reduced = torch.tensor(
                [local, reduced, sensor, clean], dtype=torch.int64, device=device
            )
        self._work = dist.all_reduce(
            self._reduced, op=dist.ReduceOp.MAX, group=group, async_op=True
        )
        self._summary: FlagSummary | None = None
        self._table: FlagTable | None = None

    def summary(self) -> FlagSummary:
        """Wait for the reduction (once) and say whether any rank flagged anything."""
        if self._summary is None:
            self._work.wait()
            any_local, any_reduced, any_sensor, any_clean = self._reduced.tolist()
            self._summary = FlagSummary(
                step=self.step,
                any_local=bool(any_local),
                any_reduced=bool(any_reduced),
                unanimous=not any_clean,
                any_sensor=bool(any_sensor),
            )
        return self._summary

    def table(self) -> FlagTable:
        """Every rank's flags (collective when something is set; see the class docstring)."""
        if self._table is None:
            summary = self.summary()
            if summary.clean:
                self._table = FlagTable(
                    step=self.step, local=(False,) * self._world, reduced=(False,) * self._world
                )
            else:
                mine = self._flags
                if mine is None:
                    mine = torch.tensor(self._own, dtype=torch.int64, device=self._device)
                gathered = [torch.empty_like(mine) for _ in range(self._world)]
                dist.all_gather(gathered, mine, group=self._group)
                rows = torch.stack(gathered).cpu().tolist()
                self._table = FlagTable(
                    step=self.step,
                    local=tuple(bool(lo) for lo, _, _ in rows),
                    reduced=tuple(bool(re) for _, re, _ in rows),
                    sensor=tuple(bool(se) for _, _, se in rows),
                )
        return self._table


class GradientCheck:
    """Check 1 for one guarded model: the hook's state, this step's flags, and the exchange
    in flight until it is settled.

    The parallelism adapter registers :attr:`hook` with :attr:`hook_state`; the guard arms the
    check before each forward pass and calls :meth:`exchange` after backward on every rank.
    """

    hook = staticmethod(grad_stats_hook)
    """The DDP comm hook (see :func:`grad_stats_hook`)."""

    def __init__(
        self, params: list[torch.nn.Parameter], dp_group: dist.ProcessGroup | None, world: int
    ) -> None:
        """``params``: the trainable parameters in the order of the fingerprint tables."""
        self.params = params
        self.dp_group = dp_group
        self.world = world
        self.hook_state = GradStatsState(
            process_group=dp_group, param_index={id(p): i for i, p in enumerate(params)}
        )
        self.pending: FlagExchange | None = None
        """The newest step's exchange while some rank has not read it; settled by the guard."""

    def arm(self, *, capture_fingerprints: bool, device: torch.device) -> None:
        """Reset the hook's per-step statistics before a forward pass."""
        self.hook_state.arm(capture_fingerprints=capture_fingerprints, device=device)

    def disarm(self) -> None:
        """Stop capturing fingerprints (the step's backward is over)."""
        self.hook_state.capture_fingerprints = False

    @property
    def local_fingerprints(self) -> torch.Tensor | None:
        """[num_params, 2] int64 fingerprints of this step's local gradients (audit steps)."""
        return self.hook_state.local_fingerprints

    def add_reduced_tap(self, tap: ReducedTap) -> None:
        """Let ``tap(bucket, reduced)`` see each reduced bucket (fault drills use it)."""
        self.hook_state.reduced_taps.append(tap)

    def require_reduction(self) -> None:
        """Raise when the hook did not run this step (no all-reduce: nothing to judge)."""
        state = self.hook_state
        if not state.local_flags or len(state.reduced_sums) != len(state.local_flags):
            raise RuntimeError(
                "check_gradients: DDP's all-reduce did not run this step; call it after "
                "loss.backward() on the DDP model, outside no_sync()"
            )

    def exchange(
        self,
        step: int,
        *,
        max_grad_norm: float | None,
        device: torch.device,
        sensor_flag: torch.Tensor | None = None,
    ) -> tuple[FlagExchange, bool]:
        """Launch ``step``'s flag exchange (collective); returns it and whether this rank's own
        flags are bad (one host read, as the sync GradScaler makes).

        Clips the reduced gradient to ``max_grad_norm`` when set. ``sensor_flag``: a one-element
        tensor, nonzero when an online sensor flagged this step (travels in the same
        reduction). Raises when the hook did not run this step (see :meth:`require_reduction`).
        """
        self.require_reduction()
        state = self.hook_state
        local_flags = state.local_flags
        reduced = torch.stack(state.reduced_sums)
        if max_grad_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(self.params, max_grad_norm).detach()
            if isinstance(norm, DTensor):
                # FSDP2: the norm of the sharded gradients, reduced over the shards here
                # (collective; every rank reaches it at the same point).
                norm = norm.full_tensor()
            reduced = torch.cat([reduced, norm.reshape(1).to(reduced)])
        parts = [*local_flags, reduced]
        if sensor_flag is not None:  # SENSORS: one more int64 in the same per-step reduction
            parts.append(sensor_flag.reshape(1).to(reduced))
        # One host read of every value this rank judges (on a GPU, the sync the GradScaler
        # makes too); the verdicts are then Python, and the reduction's integers are made once.
        values = torch.cat(parts).tolist()
        count = len(local_flags)
        local_bad = any(values[:count])  # each local flag is nonzero when its bucket was bad
        end = count + reduced.numel()
        reduced_bad = not all(map(math.isfinite, values[count:end]))
        sensor_bad = sensor_flag is not None and bool(values[end])
        exchange = FlagExchange(
            step, (local_bad, reduced_bad, sensor_bad), self.dp_group, self.world, device=device
        )
        return exchange, local_bad or reduced_bad or sensor_bad

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
would not scale. So every step issues one asynchronous all-reduce (MAX) of three int64 (any
local NaN/Inf, any reduced NaN/Inf, any rank clean): its size does not depend on the world size
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

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


_FUSED_SUPPORT: dict[tuple[str, torch.dtype], bool] = {}


def _fused_supported(buffer: torch.Tensor) -> bool:
    """Whether torch's fused non-finite check and scale runs on this device type and dtype.

    Not for float64: its scale is a float32 tensor, so 1/world would be rounded to float32.
    """
    key = (buffer.device.type, buffer.dtype)
    if buffer.dtype == torch.float64:
        return False
    if key not in _FUSED_SUPPORT:
        probe = torch.ones(4, dtype=buffer.dtype, device=buffer.device)
        found = torch.zeros(1, dtype=torch.float32, device=buffer.device)
        try:
            torch._amp_foreach_non_finite_check_and_unscale_([probe], found, found + 0.5)
            _FUSED_SUPPORT[key] = True
        except (AttributeError, NotImplementedError, RuntimeError):
            _FUSED_SUPPORT[key] = False
    return _FUSED_SUPPORT[key]


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
    found += ~torch.isfinite(buffer.sum(dtype=torch.float32))
    buffer.mul_(1.0 / world)
    return found


def all_finite(tensors: Sequence[torch.Tensor | None]) -> bool:
    """Whether every element of every tensor is finite (None entries are skipped); one sync.

    Element by element, as the comm hook's fused kernel tests a bucket: huge finite values
    (1e30) are finite here, where a squared norm would overflow to Inf.
    """
    flags = [torch.isfinite(t).all() for t in tensors if t is not None]
    if not flags:
        return True
    return bool(torch.stack(flags).all())


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

    @property
    def clean(self) -> bool:
        """No rank flagged anything: the step may be applied everywhere."""
        return not self.any_local and not self.any_reduced


@dataclass(frozen=True)
class FlagTable:
    """Every DP rank's flags for one step."""

    step: int
    local: tuple[bool, ...]
    """Per DP rank: its local gradient (before the all-reduce) held a NaN/Inf."""
    reduced: tuple[bool, ...]
    """Per DP rank: its reduced (clipped) gradient norm was NaN/Inf."""

    @property
    def nonfinite(self) -> list[int]:
        """DP ranks whose local gradient was non-finite."""
        return [dp for dp, bad in enumerate(self.local) if bad]

    @property
    def clean(self) -> bool:
        """No rank flagged anything: the step may be applied everywhere."""
        return not any(self.local) and not any(self.reduced)

    @property
    def unanimous(self) -> bool:
        """Every rank flagged something, so every rank waited for this table at the same step."""
        return all(lo or re for lo, re in zip(self.local, self.reduced, strict=True))


class FlagExchange:
    """One step's flags: an asynchronous all-reduce (MAX) of three int64, then, only when
    something is set, an all-gather of each rank's ``[local_bad, reduced_bad]``.

    Every rank must create one per step, in the same order as its other collectives.
    :meth:`summary` waits for the reduction (not a collective of its own; any rank may call it
    at any time). :meth:`table` is collective when the summary is not clean: every rank must
    call it at the same point.
    """

    def __init__(
        self, step: int, flags: torch.Tensor, group: dist.ProcessGroup | None, world: int
    ) -> None:
        """Launch the reduction of this rank's two int64 flags ``[local_bad, reduced_bad]``."""
        self.step = step
        self._flags = flags
        self._group = group
        self._world = world
        clean = (flags.sum() == 0).to(flags.dtype).reshape(1)
        self._reduced = torch.cat([flags.reshape(2), clean])
        self._work = dist.all_reduce(
            self._reduced, op=dist.ReduceOp.MAX, group=group, async_op=True
        )
        self._summary: FlagSummary | None = None
        self._table: FlagTable | None = None

    def summary(self) -> FlagSummary:
        """Wait for the reduction (once) and say whether any rank flagged anything."""
        if self._summary is None:
            self._work.wait()
            any_local, any_reduced, any_clean = (bool(v) for v in self._reduced.cpu().tolist())
            self._summary = FlagSummary(
                step=self.step,
                any_local=any_local,
                any_reduced=any_reduced,
                unanimous=not any_clean,
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
                gathered = [torch.empty_like(self._flags) for _ in range(self._world)]
                dist.all_gather(gathered, self._flags, group=self._group)
                rows = torch.stack(gathered).cpu().tolist()
                self._table = FlagTable(
                    step=self.step,
                    local=tuple(bool(lo) for lo, _ in rows),
                    reduced=tuple(bool(re) for _, re in rows),
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
        self, step: int, *, max_grad_norm: float | None, device: torch.device
    ) -> tuple[FlagExchange, bool]:
        """Launch ``step``'s flag exchange (collective); returns it and whether this rank's own
        flags are bad (one host read, as the sync GradScaler makes).

        Clips the reduced gradient to ``max_grad_norm`` when set. Raises when the hook did not
        run this step (see :meth:`require_reduction`).
        """
        self.require_reduction()
        state = self.hook_state
        reduced = torch.stack(state.reduced_sums)
        if max_grad_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(self.params, max_grad_norm).detach()
            reduced = torch.cat([reduced, norm.reshape(1).to(reduced)])
        flags = torch.stack(
            [torch.cat(state.local_flags).any(), ~torch.isfinite(reduced).all()]
        ).to(device=device, dtype=torch.int64)
        exchange = FlagExchange(step, flags, self.dp_group, self.world)
        return exchange, bool(flags.any())

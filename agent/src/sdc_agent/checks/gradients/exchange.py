"""Check 1, non-finite gradients: the per-step flags and their settling, over every rank.

What each rank's taps saw (the DDP comm hook, :mod:`.comm_hook`; FSDP2's gradient taps,
:mod:`.taps`; both into a :class:`~.stats.GradStatsState`) is judged here.

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

Only when something is set does a second collective, an all-gather of each rank's three flags, say
WHICH ranks' local gradient was non-finite (:meth:`FlagExchange.table`). Every rank learns from
the reduction that something is set, and every rank asks for the table at the same agreement
point, so every rank issues that gather: no rank is left waiting in it.

When every rank flagged something (a NaN anywhere reaches every rank's reduced gradient through
the sum, so this is the usual case) every rank is waiting at the same step and decides at once.
When only some ranks did (a corruption after the all-reduce on one rank), those ranks drop their
gradients and carry on; every rank settles the exchange at the next agreement point and returns
the same alarm, naming the step at which it happened. No rank ever applies a non-finite gradient.

With an optimizer that skips a step on the device (a fused Adam/AdamW: its ``found_inf``), a
common step reads nothing at all: this rank's flags are judged on the device
(:meth:`GradientCheck.device_flags`) and handed to the optimizer, and the exchange's values are
copied to host memory without blocking (:class:`HostFlags`), read at the next agreement point.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.experimental import implicit_replication

from ..protocol import Check, StepStart
from .stats import GradStatsState, ReducedTap


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


@dataclass(frozen=True)
class StepFlags:
    """This rank's flags of one step as read to the host (:meth:`GradientCheck.read_flags`)."""

    step: int
    local_bad: bool
    """This rank's local gradient held a NaN/Inf (that started here, on a pipeline stage)."""
    reduced_bad: bool
    """This rank's reduced (clipped) gradient was NaN/Inf."""
    sensor_bad: bool
    """An online sensor flagged this step on this rank."""

    @property
    def bad(self) -> bool:
        """Something is flagged: this rank must not apply the step on its own say."""
        return self.local_bad or self.reduced_bad or self.sensor_bad


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
        integers are then one device-to-device copy of a row made once per device, on
        ``device``, the collective's device, and this rank's flags a tensor only if the
        per-rank table is gathered)."""
        self.step = step
        self._group = group
        self._world = world
        self._device = device
        self._own: tuple[int, int, int] | None = None
        self._flags: torch.Tensor | None = None
        if isinstance(flags, torch.Tensor):
            if flags.numel() == 2:  # the third flag is the other checks' (0: none flagged)
                flags = torch.cat([flags.reshape(2), flags.new_zeros(1)])
            self._flags = flags
            clean = (flags.sum() == 0).to(flags.dtype).reshape(1)
            self._reduced = torch.cat([flags.reshape(3), clean])
        else:
            local, reduced, sensor = (*map(int, map(bool, flags)), 0)[:3]
            self._own = (local, reduced, sensor)
            # A device-to-device copy of one precomputed row: no host-to-device copy, which
            # from pageable memory would block the host until the stream drains.
            row = _reduction_rows(torch.device("cpu") if device is None else device)
            self._reduced = row[local * 4 + reduced * 2 + sensor].clone()
        self._work = dist.all_reduce(
            self._reduced, op=dist.ReduceOp.MAX, group=group, async_op=True
        )
        self._waited = False
        self._summary: FlagSummary | None = None
        self._table: FlagTable | None = None
        self._host: HostFlags | None = None
        self._slot = 0
        self._filled = False
        self._event: Any = None
        self.skipped_on_device = False
        """The optimizer was told to skip this step on the device when this rank's flags are
        bad (``found_inf``); the host learns the verdict when the exchange is settled."""

    def stage(self, host: HostFlags) -> None:
        """Have this exchange's values (this rank's three flags, then the reduction's four)
        copied into ``host``'s memory without blocking, for :meth:`summary` to read at the next
        agreement point (:class:`HostFlags` says when the copy is made on each device)."""
        self._host = host
        self._slot = host.take_slot()
        if host.stream_ordered:
            self._fill()

    def _fill(self) -> None:
        """Wait for the reduction, then copy the values into the host buffer (on CUDA: after the
        stream's wait, a non-blocking copy into pinned memory and an event behind it)."""
        host = self._host
        assert host is not None
        buffer = host.buffer(self._slot)
        if self._flags is not None:
            values = torch.cat([self._flags.reshape(3), self.reduced_for_reading()])
            buffer.copy_(values, non_blocking=host.stream_ordered)
        else:  # this rank's flags were read on the host already: only the reduction travels
            buffer[3:].copy_(self.reduced_for_reading(), non_blocking=host.stream_ordered)
        if host.stream_ordered:
            self._event = torch.cuda.Event()
            self._event.record()
        self._filled = True

    def read_host(self) -> list[int]:
        """The staged values (:meth:`stage`): this rank's ``[local, reduced, sensor]`` flags (as
        the host read them, when it did) and the reduction's four, from host memory. On CUDA it
        waits on the copy's event, recorded a step ago (no stream drain); on the CPU the copy
        is made here, after the reduction's wait."""
        host = self._host
        if host is None:
            raise RuntimeError("read_host: this exchange was not staged (FlagExchange.stage)")
        if not self._filled:
            self._fill()
        if self._event is not None:
            self._event.synchronize()
        values = [int(v) for v in host.view(self._slot).tolist()]  # host memory: no device read
        if self._own is not None:
            values[:3] = self._own
        return values

    @property
    def settled(self) -> bool:
        """Whether the reduction's values have been read (:meth:`summary` answers at once)."""
        return self._summary is not None

    def reduced_for_reading(self) -> torch.Tensor:
        """Wait for the reduction (once; on NCCL the current stream waits, the host does not)
        and return its four int64, for a host read made together with other values (the
        guard's one read per step); pass what was read to :meth:`settle_from`."""
        if not self._waited:
            self._work.wait()
            self._waited = True
        return self._reduced

    def settle_from(self, values: Sequence[float]) -> FlagSummary:
        """The summary from the reduction's four values as read to the host by the caller,
        after :meth:`reduced_for_reading`."""
        if len(values) != 4:
            raise ValueError(f"settle_from: the reduction has 4 values, got {len(values)}")
        any_local, any_reduced, any_sensor, any_clean = values
        self._summary = FlagSummary(
            step=self.step,
            any_local=bool(any_local),
            any_reduced=bool(any_reduced),
            unanimous=not any_clean,
            any_sensor=bool(any_sensor),
        )
        return self._summary

    def summary(self) -> FlagSummary:
        """Wait for the reduction (once) and say whether any rank flagged anything."""
        if self._summary is None:
            if self._host is not None:
                self.settle_from(self.read_host()[3:])
            else:
                self.settle_from(self.reduced_for_reading().tolist())
        assert self._summary is not None
        return self._summary

    @property
    def staged(self) -> bool:
        """Whether the values are read from host memory (:meth:`stage`)."""
        return self._host is not None

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


class HostFlags:
    """Host memory that a step's flags and their reduction are copied into without blocking,
    read at the next agreement point (issue 31, item 4): two buffers of seven int64 (this
    rank's three flags, the reduction's four), used in turn, made once per guard with their
    numpy views, so that reading one is a read of host memory, never of the device.

    On CUDA (:attr:`stream_ordered`) the buffers are pinned and :meth:`FlagExchange.stage`
    fills one at once: NCCL's ``work.wait()`` makes the current stream wait for the reduction
    (the host does not), a ``non_blocking`` copy follows on the stream, then a CUDA event; the
    next step's read waits on that event, a step old by then, instead of draining the stream.
    On the CPU (gloo) ``work.wait()`` would block the host at once, so the same fill runs at
    the read instead, where the host path waits today: same buffers, same copy, same read.
    Untested without a GPU: the pinned buffers, the non-blocking copy and the event (the CPU
    runs every other line of it)."""

    def __init__(self, device: torch.device) -> None:
        """Buffers for exchanges whose reduction lives on ``device``."""
        self.stream_ordered = device.type == "cuda"
        self._buffers = [
            torch.zeros(7, dtype=torch.int64, pin_memory=self.stream_ordered) for _ in range(2)
        ]
        self._views = [b.numpy() for b in self._buffers]
        self._next = 0

    def take_slot(self) -> int:
        """The buffer for the next exchange (the other one may still be waiting to be read)."""
        slot, self._next = self._next, 1 - self._next
        return slot

    def buffer(self, slot: int) -> torch.Tensor:
        """Buffer ``slot`` as a tensor (the copy's destination)."""
        return self._buffers[slot]

    def view(self, slot: int) -> Any:
        """Buffer ``slot`` as the numpy array over the same host memory (what is read)."""
        return self._views[slot]


def clip_gradients(
    params: list[torch.nn.Parameter],
    max_norm: float,
    stage_of: dist.ProcessGroup | bool | None = False,
) -> torch.Tensor:
    """``clip_grad_norm_`` of ``params`` to ``max_norm``; returns the total norm, the same on
    every rank (collective under FSDP2 and pipelines: every rank reaches it at the same point).

    FSDP2: the norm of the sharded gradients is a DTensor, reduced over its mesh here. Under
    tensor parallelism the parameters of modules left out of the TP plan live on a sub-mesh
    without the tp dimension, and ``clip_grad_norm_`` cannot stack norms of several meshes: each
    mesh's gradients' norm is reduced over its own mesh (a module replicated across a TP group
    counts once), the norms combined, and the gradients scaled by that total.

    ``stage_of``: the group holding the other stages of this rank's pipeline (None: WORLD), when
    ``params`` are one stage of the model (:attr:`~.stats.GradStatsState.stage_of`); the model's
    norm then sums the stages' squares (as torchtitan's ``clip_grad_norm_`` does over its
    pipeline mesh) and every stage clips by it. False: ``params`` are the whole model."""
    grads = [p.grad for p in params if p.grad is not None]
    meshes: list[Any] = []
    for g in grads:
        if isinstance(g, DTensor) and not any(g.device_mesh == m for m in meshes):
            meshes.append(g.device_mesh)
    if stage_of is False and len(meshes) <= 1:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm).detach()
        return norm.full_tensor() if isinstance(norm, DTensor) else norm
    total = _total_norm(grads, meshes)
    if stage_of is not False:
        squared = total.double().square()
        dist.all_reduce(squared, group=stage_of)
        total = squared.sqrt().to(total.dtype)
        scale = max_norm / (float(total) + 1e-6)
        if scale < 1.0:  # a non-finite total leaves the gradient as it is: check 1 flags it
            for g in grads:
                g.mul_(scale)
        return total
    # Scaled mesh by mesh (one foreach call cannot mix meshes), each by the same coefficient.
    with implicit_replication():  # the plain total scales each mesh's DTensor gradients
        for mesh in meshes:
            torch.nn.utils.clip_grads_with_norm_(
                [p for p in params if isinstance(p.grad, DTensor) and p.grad.device_mesh == mesh],
                max_norm,
                total,
            )
    return total


def _total_norm(grads: list[torch.Tensor], meshes: list[Any]) -> torch.Tensor:
    """The L2 norm of ``grads`` (a plain tensor, the same on every rank): each mesh's part
    reduced over its own mesh, then combined (plain tensors outside any mesh count as one)."""
    parts: list[list[torch.Tensor]] = [
        [g for g in grads if isinstance(g, DTensor) and g.device_mesh == m] for m in meshes
    ]
    plain = [g for g in grads if not isinstance(g, DTensor)]
    norms = []
    for part in [*parts, plain]:
        if not part:
            continue
        norm = torch.nn.utils.get_total_norm(part)
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    if not norms:
        return torch.zeros(())
    return torch.linalg.vector_norm(torch.stack(norms))


class GradientCheck(Check):
    """Check 1 for one guarded model: the taps' state, this step's flags, and the exchange
    in flight until it is settled.

    The parallelism adapter installs its gradient taps writing into :attr:`hook_state`
    (``ParallelAdapter.install_gradient_taps``); the guard arms the check before each forward
    pass (:meth:`begin_step`) and calls :meth:`exchange` after backward on every rank. Its
    flags are the step's reduction itself, so it contributes no other (:class:`.Check`).
    """

    coverage_key = "nonfinite_gradients"

    def __init__(
        self,
        params: list[torch.nn.Parameter],
        dp_group: dist.ProcessGroup | None,
        world: int,
        *,
        grad_accum: int = 1,
        taps_see_each_micro_batch: bool = False,
        device: torch.device | None = None,
    ) -> None:
        """``params``: the trainable parameters in the order of the fingerprint tables;
        ``grad_accum``: micro-batches per step; ``taps_see_each_micro_batch``: the taps see
        each micro-batch's own gradient even with accumulation (a pipeline step's starts from
        none); ``device``: the parameters' device."""
        self.params = params
        self.dp_group = dp_group
        self.world = world
        self.grad_accum = grad_accum
        self.taps_see_each_micro_batch = taps_see_each_micro_batch
        self.device = device if device is not None else torch.device("cpu")
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

    def begin_step(self, start: StepStart) -> None:
        """Arm the taps; on a deterministic step they fingerprint the local gradients for
        check 2, unless accumulation hides each micro-batch's own gradient from them (the
        audited micro-batch's is fingerprinted by the audit's isolation instead)."""
        capture = start.deterministic and (self.grad_accum == 1 or self.taps_see_each_micro_batch)
        self.arm(capture_fingerprints=capture, device=self.device)

    def end_step(self) -> None:
        """The step's backward is over: stop capturing."""
        self.disarm()

    @property
    def local_fingerprints(self) -> torch.Tensor | None:
        """[num_params, 2] int64 fingerprints of this step's local gradients (audit steps)."""
        return self.hook_state.local_fingerprints

    def local_table(self) -> torch.Tensor | None:
        """What check 2 compares of this step's local computation: the local gradients'
        fingerprints, or the local events in order where the taps record them (tensor
        parallel; :meth:`~.stats.GradStatsState.local_table`)."""
        return self.hook_state.local_table()

    def add_reduced_tap(self, tap: ReducedTap) -> None:
        """Let ``tap(bucket, reduced)`` see each reduced bucket (fault drills use it)."""
        self.hook_state.reduced_taps.append(tap)

    def require_reduction(self) -> None:
        """Raise when the hook did not run this step (no all-reduce: nothing to judge)."""
        state = self.hook_state
        # One reduced sum per local flag, or more: a pipeline schedule reduces its stage's
        # gradient at the end of each of a step's pipeline steps (gradient accumulation).
        if not state.local_flags or len(state.reduced_sums) < len(state.local_flags):
            raise RuntimeError(
                "check_gradients: DDP's all-reduce did not run this step; call it after "
                "loss.backward() on the DDP model, outside no_sync()"
            )

    def clip(self, max_grad_norm: float) -> torch.Tensor:
        """Clip the reduced gradient to ``max_grad_norm`` by the model's total L2 norm; returns
        that norm (collective under FSDP2 and pipelines; every rank reaches it at one point):
        :func:`clip_gradients`, over every stage of a pipeline."""
        return clip_gradients(self.params, max_grad_norm, self.hook_state.stage_of)

    def read_flags(
        self,
        step: int,
        *,
        max_grad_norm: float | None,
        sensor_flag: torch.Tensor | None = None,
    ) -> StepFlags:
        """This rank's flags of ``step``, from the common step's ONE host read (on a GPU, the
        sync the GradScaler makes too): every value this rank judges, and the previous step's
        flag reduction (:attr:`pending`, in flight since that step; waited for first, then
        settled from the same read, so the guard's settle() reads nothing again).

        Clips the reduced gradient to ``max_grad_norm`` when set (collective under FSDP2 and
        pipelines; every rank reaches it here). ``sensor_flag``: a one-element tensor, nonzero
        when another check flagged this step (:meth:`.Check.take_flag`; only the online
        sensors contribute one); it travels in the same reduction. Raises when
        the hook did not run this step (see :meth:`require_reduction`).
        """
        local_flags, reduced = self._local_and_reduced(max_grad_norm)
        state = self.hook_state
        parts = [*local_flags, reduced]
        if sensor_flag is not None:  # the other checks' flag: one more value, same reduction
            parts.append(sensor_flag.reshape(1).to(reduced))
        origin = state.local_origin
        if origin is not None:  # a pipeline stage: where a non-finite value started
            parts.append(origin.flags().reshape(-1).to(reduced))
        pending = self.pending if self.pending is not None and not self.pending.settled else None
        if pending is not None and pending.staged:
            pending.summary()  # from host memory (HostFlags): nothing to read with this step's
            pending = None
        if pending is not None and pending.reduced_for_reading().device != reduced.device:
            pending = None  # a CPU collective: its summary reads it without a device sync
        if pending is not None:
            parts.append(pending.reduced_for_reading())  # int64 0/1, exact in the cat's float32
        values = torch.cat(parts).tolist()
        if pending is not None:
            pending.settle_from(values[-4:])
            values = values[:-4]
        count = len(local_flags)
        local_bad = any(values[:count])  # each local flag is nonzero when its bucket was bad
        end = count + reduced.numel()
        reduced_bad = not all(map(math.isfinite, values[count:end]))
        sensor_bad = sensor_flag is not None and bool(values[end])
        if origin is not None:
            # Flag this rank's local gradient only when the non-finite value started here,
            # not when it arrived from another stage (that stage is flagged instead).
            local_bad = origin.started_here(local_bad, values[end + (sensor_flag is not None) :])
        return StepFlags(step, local_bad, reduced_bad, sensor_bad)

    def _local_and_reduced(
        self, max_grad_norm: float | None
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """This step's local flags and its reduced values (each bucket's reduced sum, then the
        clipped norm when ``max_grad_norm`` is set: the clip runs here, a collective under
        FSDP2), on the device."""
        self.require_reduction()
        state = self.hook_state
        reduced = torch.stack(state.reduced_sums)
        if max_grad_norm is not None:
            norm = self.clip(max_grad_norm)
            reduced = torch.cat([reduced, norm.reshape(1).to(reduced)])
        return state.local_flags, reduced

    def device_flags(
        self, *, max_grad_norm: float | None, sensor_flag: torch.Tensor | None = None
    ) -> torch.Tensor:
        """This rank's ``[local_bad, reduced_bad, sensor_bad]`` of this step as an int64 tensor
        on the device, without reading anything to the host: what :meth:`read_flags` reads,
        judged on the device (the same values, element by element), for an optimizer that
        skips a bad step on the device. Not on a pipeline stage (where a non-finite value
        started is judged on the host)."""
        if self.hook_state.local_origin is not None:
            raise RuntimeError("device_flags: a pipeline stage's flags are judged on the host")
        local_flags, reduced = self._local_and_reduced(max_grad_norm)
        local_bad = torch.cat([flag.reshape(-1) for flag in local_flags]).ne(0).any()
        reduced_bad = reduced.isfinite().all().logical_not()
        sensor_bad = (
            sensor_flag.reshape(-1).ne(0).any()
            if sensor_flag is not None
            else torch.zeros((), dtype=torch.bool, device=reduced.device)
        )
        return torch.stack([local_bad, reduced_bad, sensor_bad]).to(torch.int64)

    def launch(self, flags: StepFlags, *, device: torch.device) -> FlagExchange:
        """Launch ``flags``' exchange on ``device``, the collective's device (collective; no
        host-to-device copy: :class:`FlagExchange`)."""
        own = (flags.local_bad, flags.reduced_bad, flags.sensor_bad)
        return FlagExchange(flags.step, own, self.dp_group, self.world, device=device)

    def launch_device(self, step: int, own: torch.Tensor) -> FlagExchange:
        """Launch the exchange of :meth:`device_flags`' ``own`` flags, on their device
        (collective; nothing is read to the host)."""
        return FlagExchange(step, own, self.dp_group, self.world, device=own.device)

    def exchange(
        self,
        step: int,
        *,
        max_grad_norm: float | None,
        device: torch.device,
        sensor_flag: torch.Tensor | None = None,
    ) -> tuple[FlagExchange, bool]:
        """:meth:`read_flags` then :meth:`launch` (collective): ``step``'s exchange and whether
        this rank's own flags are bad. The guard settles the previous step's exchange between
        the two (its collectives come first); this is for a caller with nothing to settle."""
        flags = self.read_flags(step, max_grad_norm=max_grad_norm, sensor_flag=sensor_flag)
        return self.launch(flags, device=device), flags.bad


@functools.lru_cache(maxsize=16)
def _reduction_rows(device: torch.device) -> torch.Tensor:
    """Every flag reduction a rank can start from, on ``device``, made once (only read): row
    ``local * 4 + reduced * 2 + sensor`` is ``[local, reduced, sensor, clean]``."""
    rows = [
        [local, reduced, sensor, int(not (local or reduced or sensor))]
        for local in (0, 1)
        for reduced in (0, 1)
        for sensor in (0, 1)
    ]
    return torch.tensor(rows, dtype=torch.int64, device=device)

"""A dispatch-level recorder of one training step: what each aten operator reads, writes and
computes, the kernels it launches, the host syncs and collectives of the step, and the live
memory its tensors hold.

``StepRecorder`` is a ``TorchDispatchMode`` (operators below autograd, as the kernels see them)
plus three patches that the dispatcher does not see, active only while it records:

* host reads that never dispatch on the CPU: ``Tensor.tolist``, ``Tensor.numpy`` and
  ``Tensor.cpu`` (on a GPU each copies device memory to the host and blocks until the stream
  has drained); ``Tensor.item``, ``bool(t)``, ``int(t)`` dispatch ``aten._local_scalar_dense``
  and are seen there, as are the data-dependent shapes (``nonzero``, ``masked_select``,
  ``unique``) that make a GPU wait for a count. Reads made on one source line are one sync (a
  ``t.cpu().tolist()`` blocks once);
* ``torch.distributed``'s collectives (their operation, payload and caller) and the waits on
  their ``Work`` objects (``Work.wait()`` blocks the host on gloo; on NCCL it makes the current
  stream wait, and the host blocks at the next read);
* future callbacks (``torch.futures.Future.then``, and ``then`` on a collective's
  ``Work.get_future()``, a ``torch._C.Future`` that patch does not reach): DDP's comm hook's
  ``after_reduction`` runs inline when the all-reduce has already completed and on the process
  group's thread otherwise, where a thread-local dispatch mode sees nothing; either way it is
  recorded once by the same recorder (a gloo all-reduce of a small bucket races the ``then``, so
  a recorder that saw only the inline case counted the reduced bucket's sum in about half the
  runs).

Per operator: ``bytes_read`` is the sum of its tensor inputs' sizes (``numel * element_size``),
``bytes_written`` of its tensor outputs' (an in-place operator writes the tensor it mutates);
views and metadata operators (``func.is_view``, ``empty``, ``detach``, ...) move no bytes and
launch nothing; every other operator is one kernel launch (a host-to-device copy of a Python
value, ``aten.lift_fresh``, is one copy and counted as a launch). FLOPs come from
``torch.utils.flop_counter``'s formulas (mm, addmm, bmm, baddbmm, convolutions, the SDPA
kernels; the CPU's flash-attention operators take the CUDA kernels' formulas).

Shape scaling (:class:`Scaling`): every tensor dimension equal to the slice's token count is a
token dimension, every one equal to the slice's vocabulary a vocabulary dimension; each
operator's bytes and FLOPs are also given at the full model's sizes (tokens per micro-batch,
vocabulary), so one CPU run at a short sequence projects onto the real one. Choose the slice's
token count and vocabulary so that no other dimension has either size.

Live memory: every tensor an operator creates (one whose storage no input shares) is counted
live from its creation until its last reference dies (a ``weakref.finalize`` on the output);
``peak`` is the largest total during the recording, raw and at the full model's sizes. Memory
held before the recording started (parameters, optimizer state) is not in it; a view that
outlives the tensor it views is counted freed with that tensor (an undercount). This is not the
CPU allocator's peak (torch keeps no CPU allocator statistics): it is the tensors' own bytes,
without the allocator's rounding and caching.

Triton kernels never run on the CPU: the agent's Triton paths fall back to torch operators
there, and those operators are what is counted (on a GPU one Triton launch replaces several).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import weakref
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.utils import flop_counter
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

aten = torch.ops.aten

NO_KERNEL = {
    aten.empty.memory_format,
    aten.empty_strided.default,
    aten.empty_like.default,
    aten.new_empty.default,
    aten.new_empty_strided.default,
    aten.detach.default,
    aten.alias.default,
    aten.set_.source_Storage_storage_offset,
    aten.resize_.default,
    aten.sym_size.int,
    aten.sym_stride.int,
    aten.sym_numel.default,
    aten.sym_storage_offset.default,
    aten.is_same_size.default,
    aten._has_compatible_shallow_copy_type.default,
}
"""Operators that allocate or relabel memory without a kernel (views are found by
``func.is_view``)."""

DEVICE_TO_HOST = {aten._local_scalar_dense.default}
"""Operators that copy a device value to the host (``item``, ``bool``, ``int``, ``float``)."""

DATA_DEPENDENT = {
    aten.nonzero.default,
    aten.masked_select.default,
    aten._unique2.default,
    aten.unique_consecutive.default,
    aten.unique_dim.default,
}
"""Operators whose output size depends on the values: a GPU copies a count to the host."""

HOST_TO_DEVICE = {aten.lift_fresh.default}
"""``torch.tensor(python_values, device=...)``: a pageable host-to-device copy on a GPU."""

SDPA_FORWARD = {
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
}
SDPA_BACKWARD = {name + "_backward" for name in SDPA_FORWARD}

COMMUNICATION = {"c10d", "_c10d_functional", "_dtensor"}
"""Namespaces of the dispatcher's collective operators: one launch each, no roofline bytes."""

COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "broadcast",
    "reduce",
    "gather",
    "scatter",
    "barrier",
    "all_gather_object",
    "broadcast_object_list",
    "send",
    "recv",
    "isend",
    "irecv",
)
"""The ``torch.distributed`` functions recorded (looked up on the module, as callers do)."""

AGENT = "sdc_agent"

REPLACES = {("checks/gradients/comm_hook.py", "all_reduce")}
"""Collectives the guard issues instead of the framework's own (DDP's comm hook reduces each
bucket as DDP's default hook would): not added by the guard."""


@dataclass(frozen=True, kw_only=True)
class Scaling:
    """How the slice's tensor sizes map onto the full model's (0: that dimension is not scaled).

    A token dimension of size ``tokens`` stands for ``full_batch * full_sequence`` tokens of a
    micro-batch in bytes; a tensor with k >= 1 token dimensions (attention's [T, T]) scales by
    ``full_batch * (full_sequence / tokens) ** k``. A vocabulary dimension scales by
    ``full_vocab / vocab``."""

    tokens: int = 0
    full_sequence: int = 0
    full_batch: int = 1
    vocab: int = 0
    full_vocab: int = 0

    def __post_init__(self) -> None:
        if self.tokens and (self.full_sequence < 1 or self.full_batch < 1):
            raise ValueError("Scaling: tokens set, so full_sequence and full_batch must be >= 1")
        if self.vocab and self.full_vocab < 1:
            raise ValueError("Scaling: vocab set, so full_vocab must be >= 1")
        if self.tokens and self.tokens == self.vocab:
            raise ValueError("Scaling: tokens and vocab must differ to tell the dimensions apart")

    def _is_token(self, size: int) -> bool:
        # Hugging Face's causal-LM loss shifts the labels by one.
        return bool(self.tokens) and size in (self.tokens, self.tokens - 1)

    def factor(self, shape: Sequence[int]) -> float:
        """How many times larger a tensor of ``shape`` is in the full model."""
        k = sum(self._is_token(int(s)) for s in shape)
        out = float(self.full_batch) * (self.full_sequence / self.tokens) ** k if k else 1.0
        if self.vocab:
            out *= (self.full_vocab / self.vocab) ** sum(int(s) == self.vocab for s in shape)
        return out

    def full_shape(self, shape: Sequence[int], *, attention: bool = False) -> torch.Size:
        """``shape`` at the full model's sizes (FLOP formulas): a token dimension becomes the
        micro-batch's tokens, or under attention one sequence with the batch on dimension 0."""
        tokens = self.full_sequence if attention else self.full_batch * self.full_sequence
        dims = []
        for i, s in enumerate(int(s) for s in shape):
            if self._is_token(s):
                dims.append(tokens - (self.tokens - s))
            elif self.vocab and s == self.vocab:
                dims.append(self.full_vocab)
            elif attention and i == 0:
                dims.append(s * self.full_batch)
            else:
                dims.append(s)
        return torch.Size(dims)


@dataclass
class OpTotals:
    """One operator's totals over a recording (raw, and ``full_``: at the full model's sizes)."""

    calls: int = 0
    launches: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    flops: int = 0
    full_bytes: float = 0.0
    full_flops: float = 0.0
    gemm: bool = False
    fp32_gemm: bool = False
    guard: int = 0
    """Calls made with ``sdc_agent`` code on the Python stack."""
    modelled_s: dict[str, float] = field(default_factory=dict)
    """Per GPU (``project.GPUS``): the roofline time of these calls at full size."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "calls": self.calls,
            "launches": self.launches,
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
            "flops": self.flops,
            "full_bytes": self.full_bytes,
            "full_flops": self.full_flops,
            "gemm": self.gemm,
            "fp32_gemm": self.fp32_gemm,
            "guard_calls": self.guard,
            "modelled_s": dict(self.modelled_s),
        }


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _storage(t: torch.Tensor) -> int | None:
    """The address of ``t``'s storage (None: no valid storage, e.g. FSDP2's freed buffers)."""
    try:
        return t.untyped_storage().data_ptr()
    except RuntimeError:
        return None


def _caller(skip_torch: bool = True) -> tuple[str, bool]:
    """(file:line of the innermost frame outside torch and this module, whether sdc_agent
    code is on the stack)."""
    where, agent, _ = _call_site(sys._getframe(2), skip_torch)
    return where, agent


def _call_site(frame: Any, skip_torch: bool = True) -> tuple[str, bool, tuple[int, int]]:
    """From ``frame`` outwards: (file:line of the innermost frame outside torch and this
    module, whether sdc_agent code is on the stack, that frame's (id, instruction offset))."""
    where = ""
    site = (0, -1)
    agent = False
    while frame is not None:
        name = frame.f_code.co_filename
        if AGENT in name:
            agent = True
            if not where:
                where = f"{name.split(AGENT + '/', 1)[-1]}:{frame.f_lineno}"
                site = (id(frame), frame.f_lasti)
        elif not where and not (skip_torch and ("/torch/" in name or __file__ == name)):
            where = f"{name.rsplit('/', 1)[-1]}:{frame.f_lineno}"
            site = (id(frame), frame.f_lasti)
        if agent and where:
            break
        frame = frame.f_back
    return where, agent, site


class _ThreadMode(TorchDispatchMode):
    """The recorder's view on another thread (a future's callback): forwards every operator."""

    def __init__(self, owner: StepRecorder) -> None:
        super().__init__()
        self.owner = owner

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        return self.owner._dispatch(func, args, kwargs or {})


_CURRENT: StepRecorder | None = None
"""The recorder recording now (collectives, waits and callbacks report to it)."""
_INSTALLED = False
_ORIGINALS: list[tuple[Any, str, Any]] = []


class _TrackedWork:
    """A collective's ``Work`` whose ``wait`` is counted by the recorder recording at the time
    of the wait (the guard waits for a step's flags in the next step)."""

    def __init__(self, work: Any, op: str) -> None:
        self._work, self._op = work, op
        self._issued_by = _CURRENT

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        """Wait for the collective (counted as a blocking wait; ``same_step``: issued in the
        step that waits for it, so the wait is for the slowest rank)."""
        if _CURRENT is not None:
            where, agent = _caller()
            _CURRENT._event("wait", f"wait({self._op})", where, agent)
            _CURRENT.events[-1]["same_step"] = self._issued_by is _CURRENT
        return self._work.wait(*args, **kwargs)

    def get_future(self) -> _TrackedFuture:
        """The collective's future, its callbacks recorded (:class:`_TrackedFuture`)."""
        return _TrackedFuture(self._work.get_future())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


def _collective(op: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def issued(*args: Any, **kwargs: Any) -> Any:
        recorder = _CURRENT
        if recorder is not None and recorder._alive:
            where, agent = _caller()
            tensors = [a for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
            reduce_op = kwargs.get("op")
            entry = {
                "op": op,
                "reduce": str(reduce_op).rsplit(".", 1)[-1] if reduce_op is not None else None,
                # The payload this rank sends: its input tensor.
                "bytes": _payload(op, tensors),
                "full_bytes": _payload(op, tensors, recorder.scaling.factor),
                "async": bool(kwargs.get("async_op", False)),
                "where": where,
                "guard": agent,
                "replaces": (where.split(":")[0], op) in REPLACES,
                "phase": recorder.phase,
            }
            with recorder._lock:
                recorder.collectives.append(entry)
        result = original(*args, **kwargs)
        if kwargs.get("async_op") and result is not None and not isinstance(result, list):
            return _TrackedWork(result, op)
        return result

    return issued


def _in_view(callback: Callable[..., Any]) -> Callable[..., Any]:
    """``callback`` as recorded by the recorder recording when it runs: on the process group's
    thread (the future completed after ``then``) under a :class:`_ThreadMode`, or inline on the
    recording thread (it had completed), where the recorder already sees it and a second view
    would count each operator twice."""

    def recorded(fut: Any) -> Any:
        recorder = _CURRENT
        if recorder is None or not recorder._alive or recorder._thread == threading.get_ident():
            return callback(fut)
        with _ThreadMode(recorder):
            return callback(fut)

    return recorded


class _TrackedFuture:
    """A collective's future whose ``then`` callbacks are recorded wherever they run (a
    ``Work.get_future()`` is a ``torch._C.Future``, which the ``torch.futures.Future.then``
    patch does not reach). ``then`` returns the real future, which DDP requires of a hook."""

    def __init__(self, future: Any) -> None:
        self._future = future

    def then(self, callback: Callable[..., Any]) -> Any:
        """The real future's ``then`` with ``callback`` recorded (:func:`_in_view`), called on
        ``torch._C.Future`` itself: a ``torch.futures.Future``'s patched ``then`` would wrap the
        callback a second time."""
        return torch._C.Future.then(self._future, _in_view(callback))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._future, name)


def _then(original: Callable[..., Any]) -> Callable[..., Any]:
    def then(future: Any, callback: Callable[..., Any]) -> Any:
        return original(future, _in_view(callback))

    return then


def install() -> None:
    """Wrap ``torch.distributed``'s collectives and ``Future.then`` for the rest of the process
    (idempotent): they report to the recorder recording at the time, and cost nothing else."""
    global _INSTALLED
    if _INSTALLED:
        return
    for op in COLLECTIVES:
        if hasattr(dist, op):
            _ORIGINALS.append((dist, op, getattr(dist, op)))
            setattr(dist, op, _collective(op, getattr(dist, op)))
    _ORIGINALS.append((torch.futures.Future, "then", torch.futures.Future.then))
    torch.futures.Future.then = _then(torch.futures.Future.then)  # type: ignore[method-assign]
    _INSTALLED = True


def uninstall() -> None:
    """Undo :func:`install` (a test's process goes on without the wrappers)."""
    global _INSTALLED
    while _ORIGINALS:
        owner, name, original = _ORIGINALS.pop()
        setattr(owner, name, original)
    _INSTALLED = False


class Emulator(TorchDispatchMode):
    """Runs what :class:`StepRecorder` runs with ``emulate_16bit_gemms`` (warm-up steps: the
    same numerics, nothing counted)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        return _emulated(func, args, kwargs or {}, emulate=True)


def _emulated(func: Any, args: Any, kwargs: dict[str, Any], *, emulate: bool) -> Any:
    """``func(*args, **kwargs)``, a 16-bit GEMM as an fp32 product rounded once (``emulate``),
    and CUDA's ``mm(out_dtype=float32)`` (no CPU kernel) as the same fp32 product."""
    if emulate and func in (aten.mm.default, aten.addmm.default, aten.bmm.default):
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        dtype = tensors[0].dtype
        if dtype in (torch.bfloat16, torch.float16):
            up = tree_map(lambda a: a.float() if isinstance(a, torch.Tensor) else a, args)
            return func(*up, **kwargs).to(dtype)
    if func is aten.mm.dtype:
        return torch.mm(args[0].float(), args[1].float())
    return func(*args, **kwargs)


class StepRecorder(TorchDispatchMode):
    """Records what ran between ``__enter__`` and ``__exit__`` (see the module docstring).

    ``scaling``: the slice-to-full-model sizes (default: none). ``emulate_16bit_gemms``: compute
    bf16/fp16 GEMMs (``mm``, ``addmm``, ``bmm``, and ``mm`` with ``out_dtype``) as fp32 products
    rounded once, 4x faster on a CPU without bf16 units; the operator is recorded as the 16-bit
    GEMM it stands for. ``timer(op, full_bytes, full_flops, gemm, fp32_gemm)`` returns a dict of
    modelled seconds per GPU (``project.roofline``), summed per operator.
    """

    def __init__(
        self,
        *,
        scaling: Scaling | None = None,
        emulate_16bit_gemms: bool = False,
        timer: Callable[[float, float, bool, bool], dict[str, float]] | None = None,
    ) -> None:
        super().__init__()
        self.scaling = scaling or Scaling()
        self.emulate = emulate_16bit_gemms
        self.timer = timer
        self.phase = "step"
        """Where the operators being recorded belong: ``micro`` (a micro-batch's forward and
        backward, repeated per micro-batch) or ``step`` (once per optimizer step)."""
        self.ops: dict[tuple[str, str], OpTotals] = defaultdict(OpTotals)
        self.events: list[dict[str, Any]] = []
        """Host reads, host-to-device copies and waits, in order."""
        self.collectives: list[dict[str, Any]] = []
        self.live = 0
        self.live_full = 0.0
        self.peak = 0
        self.peak_full = 0.0
        self._lock = threading.RLock()
        self._patches: contextlib.ExitStack | None = None
        self._alive = True
        self._thread: int | None = None
        """The recording thread (set on entry): callbacks that run on it are seen directly."""

    # ------------------------------------------------------------------ dispatch
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        return self._dispatch(func, args, kwargs or {})

    def _dispatch(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        out = self._run(func, args, kwargs)
        if self._alive:
            with self._lock:
                self._account(func, args, kwargs, out)
        return out

    def _run(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        return _emulated(func, args, kwargs, emulate=self.emulate)

    def _account(self, func: Any, args: Any, kwargs: dict[str, Any], out: Any) -> None:
        name = str(func.overloadpacket.__name__)
        totals = self.ops[(self.phase, name)]
        totals.calls += 1
        where, agent, site = _call_site(sys._getframe(1))
        totals.guard += agent
        if func in DEVICE_TO_HOST:
            self._event("host_read", name, where, agent, site)
            return
        if func in DATA_DEPENDENT:
            self._event("host_read", name, where, agent, site)
        if func in HOST_TO_DEVICE:
            self._event("host_to_device", name, where, agent, site)
            totals.launches += 1
            return
        if func.is_view or func in NO_KERNEL:
            return
        totals.launches += 1
        if func.namespace in COMMUNICATION:
            return  # a collective's kernel: its time is the collective's (project.py)
        inputs = [a for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        outputs = [o for o in tree_leaves(out) if isinstance(o, torch.Tensor)]
        scale = self.scaling.factor
        read = sum(_nbytes(t) for t in inputs)
        written = sum(_nbytes(t) for t in outputs)
        totals.bytes_read += read
        totals.bytes_written += written
        full_bytes = sum(_nbytes(t) * scale(t.shape) for t in (*inputs, *outputs))
        totals.full_bytes += full_bytes
        flops, full_flops = self._flops(func, name, args, kwargs, out)
        gemm = flops > 0
        fp32 = gemm and func is not aten.mm.dtype and inputs[0].dtype == torch.float32
        totals.gemm |= gemm
        totals.fp32_gemm |= fp32
        totals.flops += flops
        totals.full_flops += full_flops
        if self.timer is not None:
            for gpu, seconds in self.timer(full_bytes, full_flops, gemm, fp32).items():
                totals.modelled_s[gpu] = totals.modelled_s.get(gpu, 0.0) + seconds
        # Live memory: outputs with storage of their own.
        held = {_storage(t) for t in inputs}
        for t in outputs:
            if _storage(t) in held:
                continue
            size, size_full = _nbytes(t), _nbytes(t) * scale(t.shape)
            self.live += size
            self.live_full += size_full
            self.peak = max(self.peak, self.live)
            self.peak_full = max(self.peak_full, self.live_full)
            weakref.finalize(t, self._free, size, size_full)

    def _free(self, size: int, size_full: float) -> None:
        with self._lock:
            self.live -= size
            self.live_full -= size_full

    def _flops(
        self, func: Any, name: str, args: Any, kwargs: dict[str, Any], out: Any
    ) -> tuple[int, float]:
        """(FLOPs, FLOPs at full size) by torch.utils.flop_counter's formulas; 0 for others."""
        s = self.scaling
        if name in SDPA_FORWARD or name in SDPA_BACKWARD:
            if name in SDPA_FORWARD:
                q, k, v = args[:3]
                shapes = (q.shape, k.shape, v.shape)
                formula = flop_counter.sdpa_flop_count
            else:
                grad, q, k, v = args[:4]
                shapes = (grad.shape, q.shape, k.shape, v.shape)
                formula = flop_counter.sdpa_backward_flop_count
            raw = formula(*shapes)
            full = formula(*(s.full_shape(x, attention=True) for x in shapes))
            return int(raw), float(full)
        packet = func.overloadpacket
        if packet not in flop_counter.flop_registry:
            return 0, 0.0
        formula = flop_counter.flop_registry[packet]
        if func is aten.mm.dtype:
            args = args[:2]
        raw = formula(*args, **kwargs, out_val=out)

        def full_size(x: Any) -> Any:
            return s.full_shape(x.shape) if isinstance(x, torch.Tensor) else x

        full_args = tree_map(full_size, args)
        full_kwargs = tree_map(full_size, kwargs)
        full = formula(*full_args, **full_kwargs, out_val=tree_map(full_size, out))
        return int(raw), float(full)

    # ------------------------------------------------------------------ events
    def _event(
        self, kind: str, what: str, where: str, agent: bool, site: tuple[int, int] = (0, -1)
    ) -> None:
        if not self._alive:
            return
        with self._lock:
            self.events.append(
                {
                    "kind": kind,
                    "what": what,
                    "where": where,
                    "guard": agent,
                    "phase": self.phase,
                    "site": site,
                }
            )

    def _host_read(self, method: str) -> Callable[..., Any]:
        original = getattr(torch.Tensor, method)
        recorder = self

        def read(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            where, agent, site = _call_site(sys._getframe(1))
            recorder._event("host_read", f"Tensor.{method}", where, agent, site)
            return original(tensor, *args, **kwargs)

        return read

    @contextlib.contextmanager
    def _patched(self) -> Iterator[None]:
        saved: list[tuple[Any, str, Any]] = []

        def patch(owner: Any, name: str, value: Any) -> None:
            saved.append((owner, name, getattr(owner, name)))
            setattr(owner, name, value)

        try:
            for method in ("tolist", "numpy", "cpu"):
                patch(torch.Tensor, method, self._host_read(method))
            yield
        finally:
            for owner, name, value in reversed(saved):
                setattr(owner, name, value)

    def __enter__(self) -> StepRecorder:
        global _CURRENT
        if not _INSTALLED:
            raise RuntimeError(
                "StepRecorder: call costmodel.recorder.install() once before recording (it "
                "wraps torch.distributed's collectives, whose waits may come a step later)"
            )
        self._patches = contextlib.ExitStack()
        self._patches.enter_context(self._patched())
        _CURRENT = self
        self._thread = threading.get_ident()
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        global _CURRENT
        try:
            super().__exit__(*exc)
        finally:
            _CURRENT = None
            if self._patches is not None:
                self._patches.close()
            self._patches = None

    def stop(self) -> None:
        """Stop counting what finalizers and late callbacks report (after the recording)."""
        self._alive = False

    # ------------------------------------------------------------------ summary
    def syncs(self) -> list[dict[str, Any]]:
        """The host syncs: device-to-host reads and host-to-device copies, one per execution of
        a source line (``t.cpu().tolist()`` blocks once: the second read comes from a later
        call on the same line of the same frame). The same line run again (a loop, or each
        call of a function or hook) is a sync each time: it blocks again."""
        out: list[dict[str, Any]] = []
        for event in self.events:
            if event["kind"] == "wait":
                continue
            previous = out[-1] if out else None
            if (
                previous is not None
                and previous["where"] == event["where"]
                and previous["kind"] == event["kind"]
                and previous["site"][0] == event["site"][0]
                and event["site"][1] > previous["site"][1]
            ):
                previous["what"] += f" + {event['what']}"
                previous["site"] = event["site"]
                continue
            out.append(dict(event))
        return [{k: v for k, v in s.items() if k != "site"} for s in out]

    def summary(self) -> dict[str, Any]:
        """What was recorded, JSON-ready: per phase (``micro``, ``step``) the totals, the
        per-operator totals, syncs, waits and collectives; and the peak live memory."""
        syncs = self.syncs()
        phases: dict[str, Any] = {}
        for phase in ("micro", "step"):
            mine = {name: t for (p, name), t in self.ops.items() if p == phase}
            modelled: Counter[str] = Counter()
            for t in mine.values():
                modelled.update(t.modelled_s)
            phases[phase] = {
                "launches": sum(t.launches for t in mine.values()),
                "aten_calls": sum(t.calls for t in mine.values()),
                "bytes": sum(t.bytes_read + t.bytes_written for t in mine.values()),
                "flops": sum(t.flops for t in mine.values()),
                "full_bytes": sum(t.full_bytes for t in mine.values()),
                "full_flops": sum(t.full_flops for t in mine.values()),
                "modelled_s": dict(modelled),
                "syncs": sum(s["phase"] == phase for s in syncs),
                "sync_list": [s for s in syncs if s["phase"] == phase],
                "waits": [
                    {k: v for k, v in e.items() if k != "site"}
                    for e in self.events
                    if e["kind"] == "wait" and e["phase"] == phase
                ],
                "collectives": [c for c in self.collectives if c["phase"] == phase],
                "ops": {name: t.as_dict() for name, t in sorted(mine.items())},
            }
        return {"phases": phases, "peak_bytes": self.peak, "peak_full_bytes": self.peak_full}


def _payload(
    op: str, tensors: list[torch.Tensor], scale: Callable[[Sequence[int]], float] | None = None
) -> float:
    """Bytes this rank contributes to a collective (its input), raw or scaled."""
    if not tensors:
        return 0
    if op.startswith("all_gather"):
        sent = [tensors[-1]]  # (output list or buffer, input)
    elif op.startswith("reduce_scatter") or op == "all_to_all_single":
        sent = [tensors[1]] if len(tensors) > 1 else tensors  # (output, input)
    else:
        sent = tensors
    if scale is None:
        return sum(_nbytes(t) for t in sent)
    return sum(_nbytes(t) * scale(t.shape) for t in sent)


SCALARS = ("launches", "aten_calls", "bytes", "flops", "full_bytes", "full_flops", "syncs")


def phase_difference(guarded: dict[str, Any], plain: dict[str, Any]) -> dict[str, Any]:
    """What one phase of ``guarded`` adds to the same phase of ``plain``."""
    out: dict[str, Any] = {k: guarded[k] - plain[k] for k in SCALARS}
    out["modelled_s"] = {
        gpu: guarded["modelled_s"].get(gpu, 0.0) - plain["modelled_s"].get(gpu, 0.0)
        for gpu in set(guarded["modelled_s"]) | set(plain["modelled_s"])
    }
    out["waits"] = len(guarded["waits"]) - len(plain["waits"])
    out["collectives"] = len(guarded["collectives"]) - len(plain["collectives"])
    for key in ("bytes", "full_bytes"):
        out[f"collective_{key}"] = sum(c[key] for c in guarded["collectives"]) - sum(
            c[key] for c in plain["collectives"]
        )
    ops: dict[str, dict[str, float]] = {}
    for name in sorted(set(guarded["ops"]) | set(plain["ops"])):
        g, p = guarded["ops"].get(name, {}), plain["ops"].get(name, {})
        delta = {
            k: g.get(k, 0) - p.get(k, 0) for k in ("calls", "launches", "full_bytes", "full_flops")
        }
        if any(delta.values()):
            ops[name] = delta
    out["ops"] = ops
    return out


def difference(guarded: dict[str, Any], plain: dict[str, Any]) -> dict[str, Any]:
    """What ``guarded`` adds to ``plain`` (two :meth:`StepRecorder.summary` results), per phase,
    and the extra peak live memory."""
    return {
        "phases": {
            phase: phase_difference(guarded["phases"][phase], plain["phases"][phase])
            for phase in ("micro", "step")
        },
        "peak_bytes": guarded["peak_bytes"] - plain["peak_bytes"],
        "peak_full_bytes": guarded["peak_full_bytes"] - plain["peak_full_bytes"],
    }

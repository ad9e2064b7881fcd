"""The job's workload, recorded once for the alarm report (``workload``: ``sdc.workload/v1``).

A node screen (``python -m sdc_agent.screen --workload REPORT``, docs/usage/screen.md) runs the
job's own op shapes besides its fixed suite. :class:`WorkloadRecorder` records them from the
training model's first forward pass: forward hooks on every ``nn.Linear`` (a ``gemm`` [m, n, k]:
the input's rows by its last dimension k, times the output's last dimension n), ``nn.LayerNorm``
(``norm`` [rows, features]) and ``nn.RMSNorm`` (``rmsnorm`` [rows, features]), subclasses
included (the guard's protected layers are), and every call of
``F.scaled_dot_product_attention`` during that forward (``sdpa`` [batch, heads, sequence,
head_dim], ``causal`` from ``is_causal``; seen by a ``TorchFunctionMode`` entered for that one
forward, and named after the innermost module that called it). Shapes are the local ones this
rank computes: they
are read from the activations (a DTensor's local tensor), never from a weight, which FSDP2 may
hold sharded. The dtype is the output's (under autocast that is what the kernel computed in);
fp32 GEMMs with TF32 matmul math on a GPU are ``tf32``; other dtypes (fp8, integers, fp64) are
left out.

Attention is recorded as self-attention of the query's heads: a call whose keys' sequence or
values' head size differs from the query's (cross-attention) is left out; grouped-query
attention (fewer key/value heads) is recorded with the query's heads for all three, which the
screen then runs as full multi-head attention (the same kernels on more data); an ``attn_mask``
is not recorded (the screen runs none). Attention computed otherwise (``nn.MultiheadAttention``'s
own path, a hand-written softmax of ``q @ k.T``, FlashAttention's own package) is not seen.

Not recorded either: softmax, reductions, embeddings, convolutions, the backward GEMMs (dgrad and
wgrad), collectives. The recording is bounded: distinct (kind, shape, dtype) ops, the most
frequent (then the largest) first, at most :data:`sdc_contract.screen.MAX_WORKLOAD_OPS`; an op
that would move more than :data:`sdc_contract.screen.MAX_OP_ELEMENTS` elements is scaled down
to fit (a GEMM's m first, a norm's rows first), and its name says so. Each op is named after
the module it came from (``layers.0.mlp.up x32``: 32 modules had that op), cut to
:data:`sdc_contract.screen.MAX_NAME_CHARS`.

After the first forward (or the first step's end, whichever comes first) the hooks are removed,
so steady-state training pays nothing. Nothing here raises into training: a failure is logged
once and the report then simply has no ``workload``. The guard records nothing under a
pipeline (its stages hold different layers, and its Alarm must be the same on every rank).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.hooks import RemovableHandle

from sdc_contract.screen import (
    MAX_NAME_CHARS,
    MAX_OP_ELEMENTS,
    MAX_WORKLOAD_OPS,
    TF32_KINDS,
    OpDtype,
    OpKind,
    OpSpec,
    parse_workload,
    workload_document,
)

from ._function_mode import RoutingMode

logger = logging.getLogger("sdc_agent")

_DTYPES: dict[torch.dtype, OpDtype] = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
}
_RMS_NORM: type[nn.Module] | None = getattr(nn, "RMSNorm", None)

OpKey = tuple[OpKind, tuple[int, ...], OpDtype, bool]
"""What makes two recorded ops the same: kind, shape, dtype, and (attention) a causal mask."""


def _key(op: OpSpec) -> OpKey:
    return (op.kind, op.shape, op.dtype, op.causal)


def _spec(key: OpKey, name: str = "") -> OpSpec:
    kind, shape, dtype, causal = key
    return OpSpec(kind=kind, shape=shape, dtype=dtype, name=name, causal=causal)


@dataclass
class _Seen:
    """One distinct op: the first module it came from and how many calls computed it."""

    name: str
    count: int = 0


def _local(value: Any) -> torch.Tensor | None:
    """The tensor this rank computes on (a DTensor's local tensor), or None."""
    local = getattr(value, "_local_tensor", value)
    return local if isinstance(local, torch.Tensor) else None


def _op_dtype(tensor: torch.Tensor, kind: OpKind) -> OpDtype | None:
    dtype = _DTYPES.get(tensor.dtype)
    if dtype == "fp32" and kind in TF32_KINDS and tensor.device.type == "cuda":
        try:
            if torch.get_float32_matmul_precision() != "highest":
                return "tf32"
        except Exception:  # pragma: no cover - an API that moved: plain fp32 is not wrong
            return dtype
    return dtype


def _first_tensor(args: tuple[Any, ...]) -> torch.Tensor | None:
    return _local(args[0]) if args else None


def op_of(module: nn.Module, args: tuple[Any, ...], output: Any) -> OpSpec | None:
    """The op one call of ``module`` computed (unscaled, unnamed), or None when it is not one
    the recorder knows or its tensors are not ones it can describe."""
    x = _first_tensor(args)
    y = _local(output)
    if x is None or y is None or x.dim() < 1 or y.dim() < 1 or x.numel() == 0:
        return None
    if isinstance(module, nn.Linear):
        kind: OpKind = "gemm"
        k = int(x.shape[-1])
        n = int(y.shape[-1])
        shape: tuple[int, ...] = (x.numel() // k, n, k)
    elif isinstance(module, nn.LayerNorm) or (
        _RMS_NORM is not None and isinstance(module, _RMS_NORM)
    ):
        kind = "norm" if isinstance(module, nn.LayerNorm) else "rmsnorm"
        features = int(x.shape[-1])
        shape = (x.numel() // features, features)
    else:
        return None
    dtype = _op_dtype(y, kind)
    if dtype is None or min(shape) < 1:
        return None
    return OpSpec(kind=kind, shape=shape, dtype=dtype)


def _argument(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str) -> Any:
    """Argument ``name`` of a call, given at position ``index`` or by keyword."""
    return args[index] if len(args) > index else kwargs.get(name)


def attention_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> OpSpec | None:
    """The ``sdpa`` op one call ``F.scaled_dot_product_attention(*args, **kwargs)`` computed
    (unscaled, unnamed), or None when it is not self-attention the screen can run (module
    docstring)."""
    q = _local(_argument(args, kwargs, 0, "query"))
    k = _local(_argument(args, kwargs, 1, "key"))
    v = _local(_argument(args, kwargs, 2, "value"))
    if q is None or k is None or v is None or min(q.dim(), k.dim(), v.dim()) < 2:
        return None
    length, head_dim = int(q.shape[-2]), int(q.shape[-1])
    if int(k.shape[-2]) != length or int(v.shape[-1]) != head_dim or q.numel() == 0:
        return None  # cross-attention, or values of another head size
    heads = int(q.shape[-3]) if q.dim() >= 3 else 1
    batch = math.prod(int(d) for d in q.shape[:-3]) if q.dim() > 3 else 1
    dtype = _op_dtype(q, "sdpa")
    if dtype is None:
        return None
    causal = bool(_argument(args, kwargs, 5, "is_causal"))
    return OpSpec(kind="sdpa", shape=(batch, heads, length, head_dim), dtype=dtype, causal=causal)


def fit(op: OpSpec, limit: int = MAX_OP_ELEMENTS) -> OpSpec:
    """``op`` scaled down to move at most ``limit`` elements (:meth:`OpSpec.elements`): a
    GEMM's m first (then n, then k), attention's batch first (then its heads, its sequence, its
    head size), a norm's rows first (then its features)."""
    if op.elements() <= limit:
        return op
    if op.kind == "sdpa":
        batch, heads, length, head_dim = op.shape
        room = max(1, limit // 8)  # q, k, v, out and their gradients
        head_dim = min(head_dim, room)
        length = min(length, max(1, room // head_dim))
        heads = min(heads, max(1, room // (length * head_dim)))
        batch = min(batch, max(1, room // (heads * length * head_dim)))
        return OpSpec(
            kind="sdpa", shape=(batch, heads, length, head_dim), dtype=op.dtype, causal=op.causal
        )
    if op.kind == "gemm":
        m, n, k = op.shape
        if k * n + k + n <= limit:  # m alone can make it fit
            shape: tuple[int, ...] = (min(m, (limit - k * n) // (k + n)), n, k)
        else:
            k = min(k, (limit - 1) // 2)
            shape = (1, max(1, min(n, (limit - k) // (k + 1))), k)
    else:
        rows, features = math.prod(op.shape[:-1]), op.shape[-1]
        features = min(features, limit // 2)
        shape = (max(1, min(rows, limit // (2 * features))), features)
    return OpSpec(kind=op.kind, shape=shape, dtype=op.dtype)


def _name(path: str, suffix: str) -> str:
    """``path`` plus ``suffix`` in at most MAX_NAME_CHARS printable characters (a long path
    keeps its end, the most telling part)."""
    path = "".join(c if c.isprintable() else "?" for c in (path or "<model>"))
    room = MAX_NAME_CHARS - len(suffix)
    if len(path) > room:
        path = "..." + path[-(room - 3) :]
    return path + suffix


def summarize(
    seen: dict[OpKey, _Seen], *, max_ops: int = MAX_WORKLOAD_OPS, limit: int = MAX_OP_ELEMENTS
) -> tuple[OpSpec, ...]:
    """The bounded workload of what was seen: scaled to fit, merged again, the most frequent
    (then the largest) first, at most ``max_ops``, each named after its first module."""
    merged: dict[OpKey, tuple[_Seen, tuple[int, ...] | None]] = {}
    for original, entry in seen.items():
        op = fit(_spec(original), limit)
        key = _key(op)
        shape = original[1]
        scaled_from = shape if op.shape != shape else None
        if key in merged:
            merged[key][0].count += entry.count
        else:
            merged[key] = (_Seen(entry.name, entry.count), scaled_from)
    ranked = sorted(
        merged.items(),
        key=lambda item: (-item[1][0].count, -_spec(item[0]).elements()),
    )
    ops = []
    for key, (entry, scaled_from) in ranked[:max_ops]:
        suffix = f" x{entry.count}" if entry.count > 1 else ""
        if scaled_from is not None:
            suffix += " scaled from " + "x".join(str(d) for d in scaled_from)
        if len(suffix) > MAX_NAME_CHARS - 8:
            suffix = " scaled" if scaled_from is not None else ""
        ops.append(_spec(key, _name(entry.name, suffix)))
    return tuple(ops)


class WorkloadRecorder:
    """Records ``module``'s op shapes on its first forward pass, then removes its hooks.

    ``on_recorded`` receives the ``sdc.workload/v1`` document (or None when nothing could be
    recorded), once. Never raises into training (a failure is logged once)."""

    def __init__(
        self,
        module: nn.Module,
        on_recorded: Callable[[dict[str, Any] | None], None] | None = None,
    ) -> None:
        self.document: dict[str, Any] | None = None
        """The recorded workload (``sdc.workload/v1``), or None (not yet, or nothing)."""
        self.done = False
        """Whether the recording is over (the hooks are gone)."""
        self._seen: dict[OpKey, _Seen] = {}
        self._handles: list[RemovableHandle] = []
        self._modules: list[str] = []
        """The modules whose forward runs now, innermost last (names an attention call)."""
        self._attention: RoutingMode | None = None
        self._on_recorded = on_recorded
        self._failed = False
        try:
            self._attach(module)
        except Exception:
            self._fail("attaching its hooks")

    @property
    def hooks(self) -> int:
        """How many hooks are still attached (0 once the recording is over)."""
        return len(self._handles)

    def _attach(self, module: nn.Module) -> None:
        kinds: tuple[type[nn.Module], ...] = (nn.Linear, nn.LayerNorm)
        if _RMS_NORM is not None:
            kinds += (_RMS_NORM,)
        for path, sub in module.named_modules():
            if isinstance(sub, kinds):
                self._handles.append(sub.register_forward_hook(self._hook(path)))
            # Where each attention call comes from: the innermost module running.
            self._handles.append(sub.register_forward_pre_hook(self._entering(path)))
            self._handles.append(sub.register_forward_hook(self._leaving, always_call=True))
        # The model's own forward sees attention calls (a mode entered for that one forward)
        # and ends the recording (always_call: even one that raised). The mode is entered
        # after, and left before, any the model's other hooks enter around the same forward
        # (the online sensors'): modes are a stack, and this one must be its top, the first
        # to see a call (the sensors' checked attention computes it without calling SDPA).
        self._handles.append(module.register_forward_pre_hook(self._root_starts))
        self._handles.append(
            module.register_forward_hook(self._root_done, always_call=True, prepend=True)
        )

    def _entering(self, path: str) -> Callable[[nn.Module, tuple[Any, ...]], None]:
        def hook(sub: nn.Module, args: tuple[Any, ...]) -> None:
            self._modules.append(path)

        return hook

    def _leaving(self, sub: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if self._modules:
            self._modules.pop()

    def _root_starts(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        if self.done or self._attention is not None:
            return
        try:
            self._attention = RoutingMode({F.scaled_dot_product_attention: self._attention_call})
            self._attention.__enter__()
        except Exception:
            self._attention = None
            self._fail("watching its attention calls")

    def _attention_call(
        self, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Count one attention call (unless the recording is over), then compute it."""
        if not self.done:
            path = self._modules[-1] if self._modules else ""
            try:
                op = attention_of(args, kwargs)
                if op is not None:
                    self._count(op, path)
            except Exception:
                self._fail(f"reading the attention of {path or 'the model'}")
        return func(*args, **kwargs)

    def _count(self, op: OpSpec, path: str) -> None:
        """One more call of ``op``, first seen in ``path``."""
        key = _key(op)
        entry = self._seen.get(key)
        if entry is None:
            entry = self._seen[key] = _Seen(path)
        entry.count += 1

    def _leave_attention_mode(self) -> None:
        """Leave the attention mode, if entered (never raises)."""
        mode, self._attention = self._attention, None
        if mode is not None:
            try:
                mode.__exit__(None, None, None)
            except Exception:
                self._fail("leaving its attention mode")

    def _hook(self, path: str) -> Callable[[nn.Module, tuple[Any, ...], Any], None]:
        def hook(sub: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            if self.done:
                return
            try:
                op = op_of(sub, args, output)
                if op is not None:
                    self._count(op, path)
            except Exception:
                self._fail(f"reading {path or 'the model'}")

        return hook

    def _root_done(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        self.finish()

    def finish(self) -> None:
        """End the recording now (idempotent): remove the hooks, summarize what was seen,
        hand the document on. Never raises."""
        if self.done:
            return
        self.done = True
        self._leave_attention_mode()
        for handle in self._handles:
            try:
                handle.remove()
            except Exception:
                self._fail("removing its hooks")
        self._handles = []
        self._modules = []
        seen, self._seen = self._seen, {}
        document = None
        if seen and not self._failed:
            try:
                ops = summarize(seen)
                document = workload_document(ops)
                parse_workload(document)  # what the screen will read: refused here, not there
            except Exception:
                self._fail("summarizing it")
                document = None
        self.document = document
        if self._on_recorded is not None:
            try:
                self._on_recorded(document)
            except Exception:
                self._fail("handing it on")

    def _fail(self, what: str) -> None:
        """Log the first failure (the report will have no workload) and stop recording."""
        if not self._failed:
            self._failed = True
            logger.warning(
                "sdc_agent: recording the job's workload failed (%s); alarm reports will have "
                "no workload; training goes on",
                what,
                exc_info=True,
            )
        self.done = True
        mode, self._attention = self._attention, None
        if mode is not None:
            with contextlib.suppress(Exception):
                mode.__exit__(None, None, None)
        for handle in self._handles:
            with contextlib.suppress(Exception):
                handle.remove()
        self._handles = []
        self._modules = []
        self._seen = {}


__all__ = ["WorkloadRecorder", "attention_of", "fit", "op_of", "summarize"]

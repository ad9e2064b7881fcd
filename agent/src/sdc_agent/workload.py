"""The job's workload, recorded once for the alarm report (``workload``: ``sdc.workload/v1``).

A node screen (``python -m sdc_agent.screen --workload REPORT``, docs/usage/screen.md) runs the
job's own op shapes besides its fixed suite. :class:`WorkloadRecorder` records them from the
training model's first forward pass: forward hooks on every ``nn.Linear`` (a ``gemm`` [m, n, k]:
the input's rows by its last dimension k, times the output's last dimension n), ``nn.LayerNorm``
(``norm`` [rows, features]) and ``nn.RMSNorm`` (``rmsnorm`` [rows, features]), subclasses
included (the guard's protected layers are). Shapes are the local ones this rank computes: they
are read from the activations (a DTensor's local tensor), never from a weight, which FSDP2 may
hold sharded. The dtype is the output's (under autocast that is what the kernel computed in);
fp32 GEMMs with TF32 matmul math on a GPU are ``tf32``; other dtypes (fp8, integers, fp64) are
left out.

Not recorded: attention (``scaled_dot_product_attention`` is a function, not a module, and is
not intercepted), softmax, reductions, embeddings, convolutions, the backward GEMMs (dgrad and
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
from torch import nn
from torch.utils.hooks import RemovableHandle

from sdc_contract.screen import (
    MAX_NAME_CHARS,
    MAX_OP_ELEMENTS,
    MAX_WORKLOAD_OPS,
    OpDtype,
    OpKind,
    OpSpec,
    parse_workload,
    workload_document,
)

logger = logging.getLogger("sdc_agent")

_DTYPES: dict[torch.dtype, OpDtype] = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
}
_RMS_NORM: type[nn.Module] | None = getattr(nn, "RMSNorm", None)

OpKey = tuple[OpKind, tuple[int, ...], OpDtype]
"""What makes two recorded ops the same: kind, shape, dtype."""


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
    if dtype == "fp32" and kind == "gemm" and tensor.device.type == "cuda":
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


def fit(op: OpSpec, limit: int = MAX_OP_ELEMENTS) -> OpSpec:
    """``op`` scaled down to move at most ``limit`` elements (:meth:`OpSpec.elements`): a
    GEMM's m first (then n, then k), a norm's rows first (then its features)."""
    if op.elements() <= limit:
        return op
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
    for (kind, shape, dtype), entry in seen.items():
        op = fit(OpSpec(kind=kind, shape=shape, dtype=dtype), limit)
        key: OpKey = (op.kind, op.shape, op.dtype)
        scaled_from = shape if op.shape != shape else None
        if key in merged:
            merged[key][0].count += entry.count
        else:
            merged[key] = (_Seen(entry.name, entry.count), scaled_from)
    ranked = sorted(
        merged.items(),
        key=lambda item: (
            -item[1][0].count,
            -OpSpec(kind=item[0][0], shape=item[0][1], dtype=item[0][2]).elements(),
        ),
    )
    ops = []
    for (kind, shape, dtype), (entry, scaled_from) in ranked[:max_ops]:
        suffix = f" x{entry.count}" if entry.count > 1 else ""
        if scaled_from is not None:
            suffix += " scaled from " + "x".join(str(d) for d in scaled_from)
        if len(suffix) > MAX_NAME_CHARS - 8:
            suffix = " scaled" if scaled_from is not None else ""
        ops.append(OpSpec(kind=kind, shape=shape, dtype=dtype, name=_name(entry.name, suffix)))
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
        if not self._handles:
            self.finish()
            return
        # The model's own forward ends the recording (always_call: even one that raised).
        self._handles.append(module.register_forward_hook(self._root_done, always_call=True))

    def _hook(self, path: str) -> Callable[[nn.Module, tuple[Any, ...], Any], None]:
        def hook(sub: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            if self.done:
                return
            try:
                op = op_of(sub, args, output)
                if op is None:
                    return
                key: OpKey = (op.kind, op.shape, op.dtype)
                entry = self._seen.get(key)
                if entry is None:
                    entry = self._seen[key] = _Seen(path)
                entry.count += 1
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
        for handle in self._handles:
            try:
                handle.remove()
            except Exception:
                self._fail("removing its hooks")
        self._handles = []
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
        for handle in self._handles:
            with contextlib.suppress(Exception):
                handle.remove()
        self._handles = []
        self._seen = {}


__all__ = ["WorkloadRecorder", "fit", "op_of", "summarize"]

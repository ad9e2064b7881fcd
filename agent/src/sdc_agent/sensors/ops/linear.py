"""Protected linear layers: ``nn.Linear`` whose three GEMMs are checked on their fp32 result.

:func:`protect` turns a model's ``nn.Linear`` modules into :class:`ProtectedLinear` in place (the
same module objects, parameters and ``state_dict`` keys). Its autograd function computes the
forward GEMM and both backward GEMMs itself, so that each result can be checked (:mod:`~sdc_agent.sensors.maths.abft`)
on its fp32 value before it is rounded and used:

* fp32 (and fp64): the very calls autograd makes for ``F.linear`` (``F.linear`` forward,
  ``dY @ W`` and ``dYᵀ @ X`` backward, ``dY.sum(0)`` for the bias), so the values are bit for
  bit those of ``nn.Linear`` (proved by tests/unit/test_sensors.py).
* bf16/fp16 (under autocast, or 16-bit inputs), a GEMM on the checked path at this step: the
  operands are rounded to the 16-bit dtype as autocast rounds them, multiplied into an fp32
  result (the accumulator the check must see: on CUDA the 16-bit GEMM's own,
  ``torch.mm(..., out_dtype=torch.float32)``, where torch supports it; elsewhere an fp32 product
  of the 16-bit values stands in) and the result rounded once to the 16-bit dtype. The CUDA
  branch is exercised by ``benchmarks/sensor_gpu.py`` on a GPU; the test suite runs on the CPU.
  This equals a 16-bit GEMM with an fp32 accumulator up to the order of accumulation, which
  torch does not promise to match, so it is not guaranteed bit-identical to ``nn.Linear``.
* A GEMM off the checked path runs the plain kernel: a layer none of whose GEMMs is on it
  calls ``F.linear`` itself (``nn.Linear``'s kernels and autograd: no fp32 result, no copy, no
  Python autograd function), and a layer with some GEMMs on it runs the others as plain 16-bit
  GEMMs inside its function.

Which GEMMs are on the checked path is the board's (:meth:`~sdc_agent.sensors.runtime.board.SensorBoard.runs_checked`):
the sensors armed at this step, read at the forward (its backward follows the forward). The
audit's replays of a step run while the board still holds that step's set, unchecked
(:meth:`~sdc_agent.sensors.runtime.board.SensorBoard.stop_checking`), so a replay computes with the very kernels the
step trained with and its bits compare with the step's.

Fault drills (:class:`sdc_agent.faults.GemmFault`) corrupt a GEMM's fp32 result through
:attr:`ProtectedLinear.gemm_taps`, between the accumulator and the check, as a faulty GPU would
(a GEMM off the checked path: its plain 16-bit result, widened to fp32 for the tap and rounded
back, the same bits when the tap does not fire).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from ..maths.abft import dgrad_ratio, forward_ratio, wgrad_ratio
from ..runtime.board import Gemm, LayerShape, SensorBoard, SensorConfig
from ..runtime.tap import GemmTap
from .tensor_parallel import local_linear

_SIXTEEN_BIT = (torch.bfloat16, torch.float16)


@functools.lru_cache(maxsize=8)
def _fp32_out_supported(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``torch.mm(a, b, out_dtype=torch.float32)`` multiplies 16-bit ``dtype`` operands
    into an fp32 result on ``device``: the GEMM's own fp32 accumulator, at 16-bit GEMM speed
    (CUDA). Elsewhere an fp32 product of the 16-bit values stands in for it."""
    if device.type != "cuda":
        return False
    try:
        probe = torch.ones(2, 2, dtype=dtype, device=device)
        return torch.mm(probe, probe, out_dtype=torch.float32).dtype == torch.float32
    except (TypeError, RuntimeError):
        return False


def _mm32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` of two 16-bit matrices as the fp32 accumulator (see :func:`_fp32_out_supported`)."""
    if _fp32_out_supported(a.device, a.dtype):
        return torch.mm(a, b, out_dtype=torch.float32)
    return a.float().mm(b.float())


def _compute_dtype(x: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype ``nn.Linear`` would multiply in: autocast's when it is on, else the input's."""
    device = x.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return x.dtype


_PLAIN = (False, False, False)
"""No GEMM of a layer on the checked path: the layer runs ``F.linear`` (``nn.Linear``'s call)."""


def _through_taps(layer: ProtectedLinear, gemm: Gemm, result: torch.Tensor) -> torch.Tensor:
    """``result`` (a GEMM's 16-bit result, computed by the plain kernel) after the fault drills'
    taps saw it as fp32 (a copy: the taps change it in place); the same bits when no tap fires
    (the round trip 16 -> 32 -> 16 bits is exact). Only a layer with taps pays for it."""
    widened = result.to(torch.float32, copy=True)
    layer.tap(gemm, widened)
    return widened.to(result.dtype)


class _GradientTap(torch.autograd.Function):
    """Identity forward; its backward shows the gradient flowing into a plain ``F.linear``'s
    input (``dgrad``) or weight (``wgrad``) to the fault drills' taps. Wrapped around the operands
    of an unarmed 16-bit layer that has taps, so that a drill corrupts the plain kernel's result
    and the layer otherwise computes ``nn.Linear``'s bits (a replayer without taps runs
    ``F.linear`` itself)."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, layer: ProtectedLinear, gemm: Gemm) -> torch.Tensor:
        ctx.layer, ctx.gemm = layer, gemm
        return t.view_as(t)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return _through_taps(ctx.layer, ctx.gemm, grad), None, None


class _OutputTap(torch.autograd.Function):
    """The forward counterpart of :class:`_GradientTap`: the plain ``F.linear``'s output, as the
    taps leave it; the gradient passes through unchanged."""

    @staticmethod
    def forward(ctx: Any, y: torch.Tensor, layer: ProtectedLinear) -> torch.Tensor:
        return _through_taps(layer, "forward", y)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return grad, None


def _tapped_linear(
    layer: ProtectedLinear, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``F.linear`` with the fault drills' taps on its three results, computing nothing else:
    the same kernels, and when no tap fires the same bits, as ``F.linear`` alone."""
    y = F.linear(
        _GradientTap.apply(x, layer, "dgrad"), _GradientTap.apply(weight, layer, "wgrad"), bias
    )
    return _OutputTap.apply(y, layer)


class _ProtectedLinearFunction(torch.autograd.Function):
    """``F.linear`` with its forward and backward GEMMs computed, tapped and checked here.

    ``kernels``: per GEMM (forward, dgrad, wgrad), whether it runs on the checked path (the
    board's :meth:`~sdc_agent.sensors.runtime.board.SensorBoard.runs_checked`, read at the forward). A 16-bit GEMM off
    that path is the plain 16-bit GEMM (no fp32 result, no copy): a forward checked at a step
    whose backward GEMMs are not pays nothing for them. Which GEMMs are checked (recorded on
    the board) is read at the forward too: the backward of this forward follows it."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        layer: ProtectedLinear,
        dtype: torch.dtype,
        kernels: tuple[bool, bool, bool],
    ) -> torch.Tensor:
        board, base = layer.sensor_board, layer.sensor_base
        sixteen = dtype in _SIXTEEN_BIT
        ctx.layer, ctx.dtype, ctx.sixteen = layer, dtype, sixteen
        ctx.input_dtypes = (x.dtype, weight.dtype, bias.dtype if bias is not None else None)
        ctx.kernels = kernels[1:]  # dgrad, wgrad
        ctx.checks = (board.is_active(base + 1), board.is_active(base + 2))
        with torch.autocast(x.device.type, enabled=False):
            if sixteen:
                xc, wc = x.to(dtype), weight.to(dtype)
                bc = bias.to(dtype) if bias is not None else None
                ctx.save_for_backward(xc, wc)
                if not kernels[0]:
                    # Unchecked at this step: the plain 16-bit GEMM, as autocast runs it.
                    y = F.linear(xc, wc, bc)
                    return _through_taps(layer, "forward", y) if layer.gemm_taps else y
                # Round as autocast does, multiply in fp32 (the accumulator), round once.
                b32 = bc.float() if bc is not None else None
                if _fp32_out_supported(x.device, dtype):
                    # CUDA: the 16-bit GEMM's own fp32 output, then the bias in fp32.
                    x32, w32 = xc, wc  # the check reads them as fp32
                    y32 = _mm32(xc.reshape(-1, xc.shape[-1]), wc.t())
                    y32 = (y32 + b32 if b32 is not None else y32).reshape(
                        *xc.shape[:-1], wc.shape[0]
                    )
                else:
                    x32, w32 = xc.float(), wc.float()
                    y32 = F.linear(x32, w32, b32)
            else:
                x32, w32, b32 = x, weight, bias
                y32 = F.linear(x, weight, bias)  # the exact call nn.Linear makes
                ctx.save_for_backward(x, weight)
            layer.tap("forward", y32)
            if board.is_active(base):
                flat = y32.reshape(-1, y32.shape[-1])
                board.record(base, forward_ratio(flat, x32.reshape(-1, x32.shape[-1]), w32, b32))
            return y32.to(dtype) if sixteen else y32

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        layer: ProtectedLinear = ctx.layer
        board, base = layer.sensor_board, layer.sensor_base
        x, weight = ctx.saved_tensors
        x_dtype, w_dtype, b_dtype = ctx.input_dtypes
        check_dgrad, check_wgrad = ctx.checks
        kernel_dgrad, kernel_wgrad = ctx.kernels
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        grad_x = grad_w = grad_b = None
        with torch.autocast(grad.device.type, enabled=False):
            dy = grad.reshape(-1, grad.shape[-1])
            x2 = x.reshape(-1, x.shape[-1])
            if not ctx.sixteen:
                # fp32/fp64: the calls autograd makes for F.linear, checked or not.
                if need_x:
                    dx = dy.mm(weight)
                    layer.tap("dgrad", dx)
                    if check_dgrad:
                        board.record(base + 1, dgrad_ratio(dx, dy, weight))
                    grad_x = dx.reshape(*grad.shape[:-1], x.shape[-1])
                if need_w:
                    grad_w = dy.t().mm(x2)
                    layer.tap("wgrad", grad_w)
                    if check_wgrad:
                        board.record(base + 2, wgrad_ratio(grad_w, dy, x2))
                if need_b:
                    grad_b = dy.sum(0).to(b_dtype)
                return grad_x, grad_w, grad_b, None, None, None
            dtype = ctx.dtype
            dy = dy.to(dtype)
            fast = _fp32_out_supported(grad.device, dtype)
            checked = (need_x and kernel_dgrad) or (need_w and kernel_wgrad)
            # The fp32 operands only for a GEMM on the checked path (CUDA needs none: its
            # 16-bit GEMMs output fp32 themselves).
            dy32 = dy if fast or not checked else dy.float()
            if need_x:
                if kernel_dgrad:
                    w32 = weight if fast else weight.float()
                    dx32 = _mm32(dy32, w32) if fast else dy32.mm(w32)
                    layer.tap("dgrad", dx32)
                    if check_dgrad:
                        board.record(base + 1, dgrad_ratio(dx32, dy32, w32))
                    dx = dx32.to(dtype)
                else:
                    dx = dy.mm(weight)  # the plain 16-bit GEMM
                    if layer.gemm_taps:
                        dx = _through_taps(layer, "dgrad", dx)
                grad_x = dx.to(x_dtype).reshape(*grad.shape[:-1], x.shape[-1])
            if need_w:
                if kernel_wgrad:
                    x32 = x2 if fast else x2.float()
                    dw32 = _mm32(dy32.t(), x32) if fast else dy32.t().mm(x32)
                    layer.tap("wgrad", dw32)
                    if check_wgrad:
                        board.record(base + 2, wgrad_ratio(dw32, dy32, x32))
                    dw = dw32.to(dtype)
                else:
                    dw = dy.t().mm(x2)  # the plain 16-bit GEMM
                    if layer.gemm_taps:
                        dw = _through_taps(layer, "wgrad", dw)
                grad_w = dw.to(w_dtype)
            if need_b:
                # dy is the 16-bit tensor autocast's bias gradient sums.
                grad_b = dy.sum(0).to(b_dtype)
        return grad_x, grad_w, grad_b, None, None, None


class ProtectedLinear(nn.Linear):
    """An ``nn.Linear`` whose GEMMs are checked by row checksums (see the module docstring).

    Made by :func:`protect` (in place, from an ``nn.Linear``) or directly; the same parameters
    and ``state_dict`` keys as ``nn.Linear``. Without a board it checks nothing.
    """

    sensor_board: SensorBoard
    sensor_base: int
    layer_name: str
    gemm_taps: list[GemmTap]
    sensor_ops: tuple[Gemm, ...] = ("forward", "dgrad", "wgrad")
    """What fault drills may corrupt: the three GEMMs."""

    def __init__(
        self, *args: Any, board: SensorBoard | None = None, name: str = "", **kw: Any
    ) -> None:
        """As ``nn.Linear``; ``board``/``name``: where its sensors are registered."""
        super().__init__(*args, **kw)
        self._attach(board if board is not None else SensorBoard(), name)

    def _attach(self, board: SensorBoard, name: str) -> None:
        self.sensor_board = board
        self.layer_name = name
        self.sensor_base = board.register(name, LayerShape(self.in_features, self.out_features))
        self.gemm_taps = []

    def tap(self, gemm: Gemm, result32: torch.Tensor) -> None:
        """Let every tap see a GEMM's fp32 result (fault drills; empty in production)."""
        for tap in self.gemm_taps:
            tap(gemm, result32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``F.linear(x, weight, bias)``, its GEMMs checked when the board says so.

        A layer none of whose GEMMs is on the checked path at this step (the board's
        :meth:`~sdc_agent.sensors.runtime.board.SensorBoard.runs_checked`) runs ``F.linear`` itself: ``nn.Linear``'s
        kernels and autograd, no fp32 result, no copy, no Python autograd function (with a fault
        drill's taps, two identity functions around the same call). Under tensor parallelism (a
        DTensor weight) the GEMMs are this rank's slices (:mod:`.tensor_parallel`)."""
        if isinstance(self.weight, DTensor):
            return local_linear(self, x)
        board = self.sensor_board
        if board.rows is None:
            # The plan's cost model needs the batch's rows (host ints: no sync); once.
            board.observe(x.numel() // max(1, self.in_features), x.device.type)
        device = x.device.type
        if torch.is_autocast_enabled(device):
            dtype = torch.get_autocast_dtype(device)
        elif x.dtype != self.weight.dtype:
            return F.linear(x, self.weight, self.bias)  # raises as nn.Linear does
        else:
            dtype = x.dtype
        return self._linear(x, self.weight, self.bias, dtype)

    def local_forward(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        """``F.linear`` on one rank's local slices (tensor parallel, :mod:`.tensor_parallel`),
        its GEMMs checked when the board says so (as :meth:`forward`)."""
        board = self.sensor_board
        if board.rows is None:
            board.observe(x.numel() // max(1, weight.shape[-1]), x.device.type)
        dtype = _compute_dtype(x, weight)
        if dtype not in _SIXTEEN_BIT and x.dtype != weight.dtype:
            return F.linear(x, weight, bias)  # raises as nn.Linear does
        return self._linear(x, weight, bias, dtype)

    def _linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype
    ) -> torch.Tensor:
        """The layer's GEMMs in ``dtype``: the plain kernels where nothing is on the checked
        path, else the protected function (which runs the plain 16-bit GEMM for each of its
        GEMMs off that path)."""
        kernels = self.kernels()
        if not any(kernels):
            taps = bool(self.gemm_taps)
            plain = torch.is_autocast_enabled(x.device.type) or (
                x.dtype == weight.dtype and (bias is None or bias.dtype == x.dtype)
            )
            if plain and not taps:
                return F.linear(x, weight, bias)  # nn.Linear's own call
            if plain and dtype in _SIXTEEN_BIT:
                return _tapped_linear(self, x, weight, bias)
            # fp32 with taps: the function's fp32 path makes F.linear's very calls; operands
            # of mixed dtypes (tensor parallel): it rounds them as autocast would.
        return _ProtectedLinearFunction.apply(x, weight, bias, self, dtype, kernels)

    def kernels(self) -> tuple[bool, bool, bool]:
        """Per GEMM (forward, dgrad, wgrad): whether it runs on the checked path now (host-side:
        a set look-up for an unarmed layer)."""
        board, base = self.sensor_board, self.sensor_base
        if base not in board.checked_layers:
            return _PLAIN
        return (
            board.runs_checked(base),
            board.runs_checked(base + 1),
            board.runs_checked(base + 2),
        )


def protect(
    model: nn.Module,
    *,
    config: SensorConfig | None = None,
    include: Callable[[str, nn.Module], bool] | None = None,
    norms: bool = True,
) -> SensorBoard:
    """Protect ``model``'s ``nn.Linear`` (and, with ``norms``, ``nn.LayerNorm``) layers in place;
    returns their sensor board.

    Call it before building :class:`sdc_agent.Guard`, which finds the board; before or after
    wrapping the model in DDP or building the optimizer does not matter (the parameters stay the
    same objects). Only modules whose type is exactly ``nn.Linear`` are protected (subclasses
    such as attention's output projection are called through other functions); likewise
    exactly ``nn.LayerNorm`` (:class:`~sdc_agent.sensors.ops.norm.ProtectedLayerNorm`, its output
    checked). ``config``: the sensors' thresholds (:class:`SensorConfig`);
    ``include(name, module)`` selects layers (default: all). Protecting twice raises ValueError.
    """
    from .norm import ProtectedLayerNorm  # norm.py builds on this module

    if not isinstance(model, nn.Module):
        raise TypeError(f"protect needs an nn.Module, got {type(model).__name__}")
    if find_board(model) is not None:
        raise ValueError("protect: this model already has protected layers")
    board = SensorBoard(config)
    swaps: dict[type, type] = {nn.Linear: ProtectedLinear}
    if norms:
        swaps[nn.LayerNorm] = ProtectedLayerNorm
    for name, module in model.named_modules():
        protected = swaps.get(type(module))
        if protected is None or (include is not None and not include(name, module)):
            continue
        # Swapping the class keeps the module object, its parameters, hooks and state_dict keys.
        module.__class__ = protected
        module._attach(board, name)
    if not board.sensors:
        raise ValueError("protect: the model has no nn.Linear layer to protect")
    return board


def find_board(model: nn.Module) -> SensorBoard | None:
    """The sensor board of ``model``'s protected layers, or None when none is protected."""
    for module in model.modules():
        board = getattr(module, "sensor_board", None)
        if isinstance(board, SensorBoard):
            return board
    return None


def protected_layers(model: nn.Module) -> dict[str, nn.Module]:
    """``model``'s protected layers (linear and norm) by their name on the board."""
    return {
        m.layer_name: m  # type: ignore[misc]  # nn.Module's __getattr__ types it Tensor | Module
        for m in model.modules()
        if isinstance(getattr(m, "sensor_board", None), SensorBoard)
    }

"""Protected linear layers: ``nn.Linear`` whose three GEMMs are checked on their fp32 result.

:func:`protect` turns a model's ``nn.Linear`` modules into :class:`ProtectedLinear` in place (the
same module objects, parameters and ``state_dict`` keys). Its autograd function computes the
forward GEMM and both backward GEMMs itself, so that each result can be checked (:mod:`.abft`)
on its fp32 value before it is rounded and used:

* fp32 (and fp64): the very calls autograd makes for ``F.linear`` (``F.linear`` forward,
  ``dY @ W`` and ``dYᵀ @ X`` backward, ``dY.sum(0)`` for the bias), so the values are bit for
  bit those of ``nn.Linear`` (proved by tests/unit/test_sensors.py).
* bf16/fp16 (under autocast, or 16-bit inputs): the operands are rounded to the 16-bit dtype as
  autocast rounds them, multiplied into an fp32 result (the accumulator the check must see: on
  CUDA the 16-bit GEMM's own, ``torch.mm(..., out_dtype=torch.float32)``, where torch supports
  it; elsewhere an fp32 product of the 16-bit values stands in) and the result rounded once to
  the 16-bit dtype. The CUDA branch is exercised by ``benchmarks/sensor_gpu.py`` on a GPU; the
  test suite runs on the CPU. This equals a 16-bit GEMM with an fp32
  accumulator up to the order of accumulation, which torch does not promise to match, so it is
  not guaranteed bit-identical to ``nn.Linear`` under autocast; the protected layer runs this
  same path in training and in every replay, whether or not a sensor checks, so replays stay bit
  for bit reproducible.

Fault drills (:class:`sdc_agent.faults.GemmFault`) corrupt a GEMM's fp32 result through
:attr:`ProtectedLinear.gemm_taps`, between the accumulator and the check, as a faulty GPU would.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from .abft import dgrad_ratio, forward_ratio, wgrad_ratio
from .board import Gemm, LayerShape, SensorBoard, SensorConfig
from .tap import GemmTap
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


class _ProtectedLinearFunction(torch.autograd.Function):
    """``F.linear`` with its forward and backward GEMMs computed, tapped and checked here."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        layer: ProtectedLinear,
        dtype: torch.dtype,
    ) -> torch.Tensor:
        board, base = layer.sensor_board, layer.sensor_base
        sixteen = dtype in _SIXTEEN_BIT
        ctx.layer, ctx.dtype, ctx.sixteen = layer, dtype, sixteen
        ctx.input_dtypes = (x.dtype, weight.dtype, bias.dtype if bias is not None else None)
        ctx.checks = (board.is_active(base + 1), board.is_active(base + 2))  # dgrad, wgrad
        with torch.autocast(x.device.type, enabled=False):
            if sixteen:
                # Round as autocast does, multiply in fp32 (the accumulator), round once.
                xc, wc = x.to(dtype), weight.to(dtype)
                bc = bias.to(dtype) if bias is not None else None
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
                ctx.save_for_backward(xc, wc)
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
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        layer: ProtectedLinear = ctx.layer
        board, base = layer.sensor_board, layer.sensor_base
        x, weight = ctx.saved_tensors
        x_dtype, w_dtype, b_dtype = ctx.input_dtypes
        check_dgrad, check_wgrad = ctx.checks
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        grad_x = grad_w = grad_b = None
        with torch.autocast(grad.device.type, enabled=False):
            dy = grad.reshape(-1, grad.shape[-1])
            x2 = x.reshape(-1, x.shape[-1])
            fast = ctx.sixteen and _fp32_out_supported(grad.device, ctx.dtype)
            if ctx.sixteen:
                dy = dy.to(ctx.dtype)
                # CUDA keeps the 16-bit operands (the GEMMs output fp32 themselves).
                dy32, x32, w32 = (
                    (dy, x2, weight) if fast else (dy.float(), x2.float(), weight.float())
                )
            else:
                dy32, x32, w32 = dy, x2, weight
            if need_x:
                dx32 = _mm32(dy32, w32) if fast else dy32.mm(w32)
                layer.tap("dgrad", dx32)
                if check_dgrad:
                    board.record(base + 1, dgrad_ratio(dx32, dy32, w32))
                dx = dx32.to(ctx.dtype).to(x_dtype) if ctx.sixteen else dx32
                grad_x = dx.reshape(*grad.shape[:-1], x.shape[-1])
            if need_w:
                dw32 = _mm32(dy32.t(), x32) if fast else dy32.t().mm(x32)
                layer.tap("wgrad", dw32)
                if check_wgrad:
                    board.record(base + 2, wgrad_ratio(dw32, dy32, x32))
                grad_w = dw32.to(ctx.dtype).to(w_dtype) if ctx.sixteen else dw32
            if need_b:
                # In the 16-bit path dy is already the 16-bit tensor autocast's bias gradient sums.
                grad_b = dy.sum(0).to(b_dtype)
        return grad_x, grad_w, grad_b, None, None


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

        A layer the plan does not sample at this step costs a few attribute reads and set
        look-ups over ``nn.Linear`` (fp32: the very ``F.linear`` call). Under tensor
        parallelism (a DTensor weight) the GEMMs are this rank's slices
        (:mod:`.tensor_parallel`)."""
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
        if dtype not in _SIXTEEN_BIT and not self.gemm_taps and not self._checks_now():
            # Nothing to check: nn.Linear's own call (the function's fp32 path makes the same
            # calls, so the values do not depend on whether a sensor checks).
            return F.linear(x, self.weight, self.bias)
        return _ProtectedLinearFunction.apply(x, self.weight, self.bias, self, dtype)

    def local_forward(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        """``F.linear`` on one rank's local slices (tensor parallel, :mod:`.tensor_parallel`),
        its GEMMs checked when the board says so. Always through the protected function, so
        the values do not depend on whether a sensor checks at this step."""
        board = self.sensor_board
        if board.rows is None:
            board.observe(x.numel() // max(1, weight.shape[-1]), x.device.type)
        dtype = _compute_dtype(x, weight)
        if dtype not in _SIXTEEN_BIT and x.dtype != weight.dtype:
            return F.linear(x, weight, bias)  # raises as nn.Linear does
        return _ProtectedLinearFunction.apply(x, weight, bias, self, dtype)

    def _checks_now(self) -> bool:
        return self.sensor_base in self.sensor_board.active_layers


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
    exactly ``nn.LayerNorm`` (:class:`~sdc_agent.sensors.norm.ProtectedLayerNorm`, its output
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
        module._attach(board, name)  # type: ignore[attr-defined]
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
        m.layer_name: m
        for m in model.modules()
        if isinstance(getattr(m, "sensor_board", None), SensorBoard)
    }

"""Protected (log-)softmax: ``nn.Softmax``/``nn.LogSoftmax`` whose rows are checked by their sums.

A softmax row is a probability distribution and its gradient is orthogonal to the ones vector, so
both passes have an O(D)-per-row invariant (D: the length of the ``dim`` being normalised):

* softmax forward ``y = exp(z) / Σexp(z)`` with ``z = x - max(x)``: ``Σ y = 1``
  (:func:`softmax_ratio`);
* log-softmax forward ``y = z - log Σexp(z)``: ``Σ exp(y) = 1``, the same statement as
  ``logsumexp(y) = 0`` with no logarithm to take (:func:`log_softmax_ratio`);
* softmax backward ``dx = y ⊙ (dy - s)`` with ``s = dy @ y``: ``Σ dx = s (1 - Σy)``, which is 0
  up to the forward's rounding and is evaluated with that rounding (:func:`softmax_dgrad_ratio`);
* log-softmax backward ``dx = dy - exp(y) Σdy``: ``Σ dx = Σdy (1 - Σexp(y))``
  (:func:`log_softmax_dgrad_ratio`).

Bounds: every element's rounding error in the fp32 computation, as a random walk over the row,
times ``u (1 + sqrt(D))`` (``u = 2^-24``), plus the rounding of the checked values to their own
dtype when it is coarser (:func:`.rows.output_rounding`): in the forward, ``exp`` of a
rounded argument errs by ``u |z_i|`` relative, so element i errs by about ``u y_i (2 + |z_i|)``
(log-softmax: ``u p_i (2 + 2 |z_i| + log D + |max x|)`` with ``p = exp(y)``); in the backward by
``u (|y_i dy_i| + |y_i s|)`` (log-softmax ``u (|dy_i| + p_i |Σdy| (1 + |y_i|))``), and the
rounding of dx itself, of the same size. A sum of D probabilities does not cancel, so the
rounding of the kernel's normaliser and of the check's own ``Σy`` adds ``u (1 + sqrt(D))``
times the row's total (1, or ``|s|``, ``|Σdy|`` backward), and a 16-bit log-softmax output's
rounding, which ``exp`` turns into relative errors that equal inputs share, is bounded by its
sum over the row rather than a random walk. Every term comes from the op's inputs (the forward's
x, the backward's dy and saved y; probabilities clamped to [0, 1]), never from the values
checked: a corrupted element must not widen its own bound. A fault in an element moves its row's sum by its whole error, so it
stands out when the element is not tiny against its row: a x1.1 change of a probability of
``1e-9`` is below any rounding bound, and matters as little to the training (measured in
``benchmarks/campaign.py``).

The layers run the very kernels autograd runs for ``F.softmax``/``F.log_softmax``
(``torch._softmax``/``_log_softmax`` and their ``_backward_data``), so their values are
``nn.Softmax``'s and ``nn.LogSoftmax``'s bit for bit (proved by the tests). Under CUDA autocast
the input is cast to fp32 as autocast does (its fp32 list); the CPU's autocast leaves them alone.
A module built with ``dim=None`` (torch's deprecated implicit dim) is not protected.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..runtime.board import Gemm, SensorBoard
from .rows import (
    FP32_UNIT_ROUNDOFF,
    OpSensor,
    autocast_fp32,
    autocast_mirrored,
    output_rounding,
    row_block_max,
    row_view,
    sqrt_length,
    worst_row_ratio,
)


def _bound(
    error: torch.Tensor, dtype: torch.dtype, total: torch.Tensor | float = 1.0
) -> torch.Tensor:
    """fp32 rounding of the per-element ``error`` terms grown over the row, plus the rounding
    of the checked values (whose size those terms bound) to their own ``dtype``, plus the
    rounding of a sum of D probabilities, which do not cancel: the kernel's normaliser and the
    check's own ``Σy`` err by about ``u sqrt(D)`` of the row's total (1 in the forward; the
    backward's ``|s|`` or ``|Σdy|``), the same for every element, so it does not shrink as a
    random walk of per-element errors does (measured: uniform-ish rows of 8192 read up to 12
    without this term)."""
    norm = torch.linalg.vector_norm(error, dim=1)
    growth = FP32_UNIT_ROUNDOFF * sqrt_length(error.shape[1])
    if isinstance(total, torch.Tensor):
        total = total.abs().reshape(-1)
    return growth * (norm + total) + output_rounding(dtype, norm)


def softmax_ratio(
    y: torch.Tensor, x: torch.Tensor, dim: int, *, chunk: int | None = None
) -> torch.Tensor:
    """Softmax forward: each row's ``|Σy - 1| / bound`` (0-dim fp32; module docstring), in
    blocks of rows of at most ``chunk`` elements (:func:`.rows.row_block_max`)."""

    def block(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        y32, x32 = y.float(), x.float()
        z = x32 - x32.amax(dim=1, keepdim=True)
        # A healthy probability is in [0, 1]: clamped, a corrupted y cannot widen its own bound.
        error = y32.clamp(0.0, 1.0) * (2.0 + z.abs())
        bound = _bound(error, y.dtype)
        return worst_row_ratio(y32.sum(dim=1), torch.ones_like(bound), bound)

    return row_block_max(block, y.shape[dim], row_view(y, dim), row_view(x, dim), chunk=chunk)


def log_softmax_ratio(
    y: torch.Tensor, x: torch.Tensor, dim: int, *, chunk: int | None = None
) -> torch.Tensor:
    """Log-softmax forward: each row's ``|Σexp(y) - 1| / bound`` (0-dim fp32), in blocks of
    rows (:func:`softmax_ratio`)."""

    def block(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        y32, x32 = y.float(), x.float()
        top = x32.amax(dim=1, keepdim=True)
        z = (x32 - top).abs()
        p = y32.exp()
        # From the inputs: |y_i| <= |z_i| + log D for a healthy row, p_i in [0, 1] (clamped), so
        # a corrupted y cannot widen its own bound.
        error = p.clamp(0.0, 1.0) * (2.0 + 2.0 * z + math.log(y32.shape[1]) + top.abs())
        # A 16-bit y errs by up to u |y_i|, which exp turns into a relative error of p_i: equal
        # inputs (ReLU zeros, padding) round alike, so these add up over the row instead of
        # cancelling as a random walk (measured: uniform-ish bf16 rows of 8192 read up to 10
        # with the random-walk term alone). Bounded by their sum, from the inputs.
        bound = _bound(error, y.dtype) + output_rounding(y.dtype, error.sum(dim=1))
        return worst_row_ratio(p.sum(dim=1), torch.ones_like(bound), bound)

    return row_block_max(block, y.shape[dim], row_view(y, dim), row_view(x, dim), chunk=chunk)


def softmax_dgrad_ratio(
    dx: torch.Tensor, dy: torch.Tensor, y: torch.Tensor, dim: int, *, chunk: int | None = None
) -> torch.Tensor:
    """Softmax backward: each row's ``|Σdx - s (1 - Σy)| / bound`` (0-dim fp32), in blocks of
    rows (:func:`softmax_ratio`)."""

    def block(dx: torch.Tensor, dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        dx32, dy32, y32 = dx.float(), dy.float(), y.float()
        s = (dy32 * y32).sum(dim=1, keepdim=True)
        expected = (s * (1.0 - y32.sum(dim=1, keepdim=True))).reshape(-1)
        # |dx_i| <= y_i (|dy_i| + |s|): from the backward's inputs, not from the dx it checks.
        error = 2.0 * y32.abs() * (dy32.abs() + s.abs())
        bound = _bound(error, dx.dtype, s)
        return worst_row_ratio(dx32.sum(dim=1), expected, bound)

    views = (row_view(dx, dim), row_view(dy, dim), row_view(y, dim))
    return row_block_max(block, dx.shape[dim], *views, chunk=chunk)


def log_softmax_dgrad_ratio(
    dx: torch.Tensor, dy: torch.Tensor, y: torch.Tensor, dim: int, *, chunk: int | None = None
) -> torch.Tensor:
    """Log-softmax backward: each row's ``|Σdx - Σdy (1 - Σexp(y))| / bound`` (0-dim fp32), in
    blocks of rows (:func:`softmax_ratio`)."""

    def block(dx: torch.Tensor, dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        dx32, dy32, y32 = dx.float(), dy.float(), y.float()
        p = y32.exp()
        total = dy32.sum(dim=1, keepdim=True)
        expected = (total * (1.0 - p.sum(dim=1, keepdim=True))).reshape(-1)
        # |dx_i| <= |dy_i| + p_i |Σdy|: from the backward's inputs, not from the dx it checks.
        error = 2.0 * dy32.abs() + p.clamp(0.0, 1.0) * total.abs() * (2.0 + y32.abs())
        bound = _bound(error, dx.dtype, total)
        return worst_row_ratio(dx32.sum(dim=1), expected, bound)

    views = (row_view(dx, dim), row_view(dy, dim), row_view(y, dim))
    return row_block_max(block, dx.shape[dim], *views, chunk=chunk)


class _RowNormaliserFunction(torch.autograd.Function):
    """``torch._softmax``/``_log_softmax`` and their backward kernels, checked and tapped."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, layer: _ProtectedRowNormaliser) -> torch.Tensor:
        dim = layer.dim
        assert dim is not None  # _attach refused dim=None
        y = layer.kernel(x, dim, False)
        layer.tap("forward", y)
        if layer.checks("forward"):
            layer.record("forward", layer.forward_ratio(y, x, dim))
        ctx.layer, ctx.input_dtype = layer, x.dtype
        ctx.check_dgrad = layer.checks("dgrad")
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None]:
        layer: _ProtectedRowNormaliser = ctx.layer
        (y,) = ctx.saved_tensors
        dim = layer.dim
        assert dim is not None  # _attach refused dim=None
        # The call autograd's SoftmaxBackward0 / LogSoftmaxBackward0 makes.
        dx = layer.backward_kernel(grad, y, dim, ctx.input_dtype)
        with torch.no_grad():
            layer.tap("dgrad", dx)
            if ctx.check_dgrad:
                layer.record("dgrad", layer.dgrad_ratio(dx, grad, y, dim))
        return dx, None


class _ProtectedRowNormaliser(OpSensor):
    """What softmax and log-softmax share: the autocast policy and the checked path."""

    dim: int | None
    sensor_ops: tuple[Gemm, ...] = ("forward", "dgrad")
    """What it checks and fault drills may corrupt: the output (``forward``) and the input
    gradient (``dgrad``)."""
    kind: str
    # Each subclass's kernels and checks (static methods): ``kernel(x, dim, half_to_float)``,
    # ``backward_kernel(grad, y, dim, input_dtype)``, ``forward_ratio(y, x, dim)``,
    # ``dgrad_ratio(dx, dy, y, dim)``.
    kernel: Callable[[torch.Tensor, int, bool], torch.Tensor]
    backward_kernel: Callable[[torch.Tensor, torch.Tensor, int, torch.dtype], torch.Tensor]
    forward_ratio: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]
    dgrad_ratio: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]

    def _attach(self, board: SensorBoard, name: str) -> None:
        if self.dim is None:
            raise ValueError(f"{type(self).__name__} {name!r}: dim=None cannot be protected")
        # Per element of the row: the forward check reads x and y (~4) against the op's ~5,
        # the backward's ~5 against its ~4. The row's width is not known before it runs: the
        # first forward scales these to per row (_size), before the plan prices them.
        self._attach_sensor(board, name, self.kind, list(self._PER_ELEMENT))
        self._sized = False

    _PER_ELEMENT = ((4, 5), (5, 4))

    def _size(self, x: torch.Tensor) -> None:
        width = x.shape[self.dim] if x.dim() and self.dim is not None else 1
        per_row = [(c * width, o * width) for c, o in self._PER_ELEMENT]
        self.sensor_board.resize(self.sensor_base, per_row)
        self._sized = True

    def _checked(self, x: torch.Tensor, plain: Any) -> torch.Tensor:
        if not self._sized:
            self._size(x)
        device = x.device.type
        if not self.sensing() or not autocast_mirrored(device):
            return plain(x)
        if autocast_fp32(device):
            x = x.float()  # what CUDA autocast does for softmax and log_softmax
        with torch.autocast(device, enabled=False):
            return _RowNormaliserFunction.apply(x, self)


class ProtectedSoftmax(_ProtectedRowNormaliser, nn.Softmax):
    """An ``nn.Softmax`` whose rows and input gradient are checked (module docstring); made by
    :func:`sdc_agent.sensors.protect`."""

    kind = "softmax"
    kernel = staticmethod(torch._softmax)
    backward_kernel = staticmethod(torch._softmax_backward_data)
    forward_ratio = staticmethod(softmax_ratio)
    dgrad_ratio = staticmethod(softmax_dgrad_ratio)

    def __init__(self, dim: int, *, board: SensorBoard | None = None, name: str = "") -> None:
        """As ``nn.Softmax(dim)``; ``board``/``name``: where its sensors are registered."""
        super().__init__(dim)
        self._attach(board if board is not None else SensorBoard(), name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``F.softmax(x, dim)``, checked when the board says so."""
        return self._checked(x, lambda t: nn.functional.softmax(t, self.dim))


class ProtectedLogSoftmax(_ProtectedRowNormaliser, nn.LogSoftmax):
    """An ``nn.LogSoftmax`` whose rows and input gradient are checked (module docstring); made
    by :func:`sdc_agent.sensors.protect`."""

    kind = "log_softmax"
    kernel = staticmethod(torch._log_softmax)
    backward_kernel = staticmethod(torch._log_softmax_backward_data)
    forward_ratio = staticmethod(log_softmax_ratio)
    dgrad_ratio = staticmethod(log_softmax_dgrad_ratio)

    def __init__(self, dim: int, *, board: SensorBoard | None = None, name: str = "") -> None:
        """As ``nn.LogSoftmax(dim)``; ``board``/``name``: where its sensors are registered."""
        super().__init__(dim)
        self._attach(board if board is not None else SensorBoard(), name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``F.log_softmax(x, dim)``, checked when the board says so."""
        return self._checked(x, lambda t: nn.functional.log_softmax(t, self.dim))

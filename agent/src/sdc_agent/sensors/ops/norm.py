"""Protected layer norms: ``nn.LayerNorm`` whose output rows and input gradient are checked.

A norm layer is not a GEMM, but its rows obey invariants just as cheap to check, forward and
backward (the maths below and in :func:`~sdc_agent.sensors.maths.abft.layer_norm_ratio`). The layer runs the very kernels
autograd runs for ``F.layer_norm`` (``torch.native_layer_norm`` forward, which also returns the
kernel's own row mean μ and ``r = 1/sqrt(var + eps)``, and ``native_layer_norm_backward``), so
its values are ``nn.LayerNorm``'s bit for bit (proved by the tests), checked or not.

Forward (:func:`layer_norm_output_ratio`): ``y = gamma ⊙ (x - μ) r + beta`` over a row of D features, so
``y @ 1 = r ((x - μ) @ gamma) + Σbeta``.

Backward (:func:`layer_norm_dgrad_ratio`): with ``x̂ = (x - μ) r`` and ``g = dy ⊙ gamma`` the input
gradient is ``dx = r (g - m1 - x̂ m2)`` where ``m1 = mean(g)`` and ``m2 = mean(g ⊙ x̂)``. Summing
its row, and its row dotted with ``x̂``::

    Σ dx       = r (Σg - D m1) - r m2 Σx̂                = -r m2 Σx̂
    Σ (dx ⊙ x̂) = r (Σ g x̂ - m1 Σx̂ - m2 Σx̂²)            = r (D m2 - m1 Σx̂ - m2 Σx̂²)

In exact arithmetic Σx̂ = 0 and Σx̂² = D (1 - eps r²), so the first is 0 and the second
``r³ eps D m2``; the check evaluates both right sides with the kernel's own μ and r, so the
rounding of μ (which makes Σx̂ slightly non-zero) is in the expected value, not in the error.
The first identity catches a wrong element of dx and a wrong ``m1``; the second a wrong ``m2``
(whose error ``-r δ x̂`` sums to zero and would pass the first). O(D) per row, like the
backward itself.

Bounds: each element of dx errs by about ``u r (|g_i| + |m1| + |x̂_i m2|) + u |dx_i|`` in fp32
(``|dx_i|`` itself bounded by the first term, so that the bound comes from the backward's
inputs only and a corrupted dx cannot widen it),
plus the rounding of ``x - μ`` carried through ``r m2`` (``u r |r m2| (|x_i| + |μ|)``); as a
random walk over the row with the fp32 sums, ``u (1 + sqrt(D))`` times the row norm of those
per-element errors (weighted by ``1 + |x̂_i|`` for the second identity, which also carries the
rounding of its own ``x̂``, ``u r (|x_i| + |μ|)`` times ``|dx_i|``), plus the rounding of dx to
its own dtype when coarser (:func:`.rows.output_rounding`). Measured on the CPU
(16 rows, D from 32 to 1024, inputs of mean 0 to 100): healthy input-gradient ratios stay below
0.5 and x1.1 on one random element of dx is caught in 59-60 of 60 trials (the tests assert
>= 99% of 200 at D = 256).

Under autocast the inputs are cast as autocast casts ``layer_norm``: to fp32 on CUDA (its fp32
list), not at all on the CPU (where it is in no list), so the values are those of
``nn.LayerNorm`` either way; under another device's autocast the layer is not checked. With a
16-bit output (bf16 inputs on the CPU) the bounds carry the output dtype's rounding, so the
sensors see only faults above bf16 rounding summed over a row (``docs/performance.md``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from ..maths.abft import layer_norm_row_sums
from ..runtime.board import Gemm, SensorBoard
from .rows import (
    FP32_UNIT_ROUNDOFF,
    OpSensor,
    autocast_fp32,
    autocast_mirrored,
    output_rounding,
    row_block_max,
    sqrt_length,
    worst_row_ratio,
)


def _layer_norm_output_rows(
    y: torch.Tensor,
    x: torch.Tensor,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """:func:`layer_norm_output_ratio` on one block of rows."""
    expected, magnitude = layer_norm_row_sums(x, mean, rstd, weight, bias)
    features = x.shape[1]
    y32 = y.float()
    observed = y32.sum(dim=1)
    bound = FP32_UNIT_ROUNDOFF * sqrt_length(features) * magnitude
    bound = bound + output_rounding(y.dtype, magnitude)  # |y_r| <= magnitude, from the inputs
    return worst_row_ratio(observed, expected, bound)


def _layer_norm_dgrad_rows(
    dx: torch.Tensor,
    dy: torch.Tensor,
    x: torch.Tensor,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    weight: torch.Tensor | None,
) -> torch.Tensor:
    """:func:`layer_norm_dgrad_ratio` on one block of rows."""
    x32, dx32 = x.float(), dx.float()
    features = x32.shape[1]
    mean32, r = mean.float().reshape(-1, 1), rstd.float().reshape(-1, 1)
    xhat = (x32 - mean32) * r
    g = dy.float() * weight.float().reshape(1, -1) if weight is not None else dy.float()
    m1 = g.mean(dim=1, keepdim=True)
    m2 = (g * xhat).mean(dim=1, keepdim=True)
    sum_xhat = xhat.sum(dim=1, keepdim=True)
    sum_xhat2 = xhat.square().sum(dim=1, keepdim=True)
    expected1 = -r * m2 * sum_xhat
    expected2 = r * (features * m2 - m1 * sum_xhat - m2 * sum_xhat2)
    # |dx_i| <= r (|g_i| + |m1| + |x̂_i m2|): every term from the backward's inputs, never from
    # the dx it checks (a corrupted element must not widen its own bound).
    dx_size = r * (g.abs() + m1.abs() + (xhat * m2).abs())
    shift = r * (x32.abs() + mean32.abs())  # the rounding of x - μ, in units of x̂ (times u)
    error = 2.0 * dx_size + (r * m2).abs() * shift
    growth = FP32_UNIT_ROUNDOFF * sqrt_length(features)
    # The second identity also reads our own x̂, which errs by u r (|x_i| + |μ|) per element.
    weighted = error * (xhat.abs() + 1.0) + dx_size * shift
    norm1 = torch.linalg.vector_norm(error, dim=1)
    norm2 = torch.linalg.vector_norm(weighted, dim=1)
    bound1 = growth * norm1 + output_rounding(dx.dtype, norm1)
    bound2 = growth * norm2 + output_rounding(dx.dtype, norm2)
    first = worst_row_ratio(dx32.sum(dim=1), expected1.reshape(-1), bound1)
    second = worst_row_ratio((dx32 * xhat).sum(dim=1), expected2.reshape(-1), bound2)
    return torch.maximum(first, second)


def _per_row(stat: torch.Tensor, rows: int) -> torch.Tensor:
    """A per-row statistic (``mean``/``rstd``, R values in any shape) as R x 1."""
    return stat.reshape(rows, -1)


def layer_norm_output_ratio(
    y: torch.Tensor,
    x: torch.Tensor,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    *,
    chunk: int | None = None,
) -> torch.Tensor:
    """Forward check: each output row's sum against the affine parameters (0-dim fp32).

    :func:`~sdc_agent.sensors.maths.abft.layer_norm_ratio`'s identity and bound, plus the rounding of the output to its
    own dtype when it is coarser than fp32 (:func:`.rows.output_rounding`). ``y`` and ``x`` are
    R x D, ``mean``/``rstd`` R values. In blocks of rows of at most ``chunk`` elements
    (:func:`.rows.row_block_max`)."""
    rows = x.shape[0]

    def block(y: torch.Tensor, x: torch.Tensor, m: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return _layer_norm_output_rows(y, x, m, r, weight, bias)

    stats = (_per_row(mean, rows), _per_row(rstd, rows))
    return row_block_max(block, x.shape[1], y, x, *stats, chunk=chunk)


def layer_norm_dgrad_ratio(
    dx: torch.Tensor,
    dy: torch.Tensor,
    x: torch.Tensor,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    weight: torch.Tensor | None,
    *,
    chunk: int | None = None,
) -> torch.Tensor:
    """Backward check: the input gradient's row sum and its row dotted with ``x̂`` against the
    module docstring's identities (0-dim fp32, the larger of the two ratios).

    ``dx``, ``dy``, ``x`` are R x D; ``mean``/``rstd`` the forward kernel's R values. In blocks
    of rows of at most ``chunk`` elements (:func:`.rows.row_block_max`)."""
    rows = x.shape[0]

    def block(
        dx: torch.Tensor, dy: torch.Tensor, x: torch.Tensor, m: torch.Tensor, r: torch.Tensor
    ) -> torch.Tensor:
        return _layer_norm_dgrad_rows(dx, dy, x, m, r, weight)

    stats = (_per_row(mean, rows), _per_row(rstd, rows))
    return row_block_max(block, x.shape[1], dx, dy, x, *stats, chunk=chunk)


class _LayerNormFunction(torch.autograd.Function):
    """``F.layer_norm`` through the kernels autograd runs for it, checked and tapped here."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        layer: ProtectedLayerNorm,
    ) -> torch.Tensor:
        shape = list(layer.normalized_shape)
        y, mean, rstd = torch.native_layer_norm(x, shape, weight, bias, layer.eps)
        layer.tap("forward", y)
        if layer.checks("forward"):
            features = layer.features
            layer.record(
                "forward",
                layer_norm_output_ratio(
                    y.reshape(-1, features),
                    x.reshape(-1, features),
                    mean.reshape(-1),
                    rstd.reshape(-1),
                    weight,
                    bias,
                ),
            )
        ctx.layer = layer
        ctx.check_dgrad = layer.checks("dgrad")
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        layer: ProtectedLayerNorm = ctx.layer
        x, weight, bias, mean, rstd = ctx.saved_tensors
        mask = [ctx.needs_input_grad[0], weight is not None, bias is not None]
        mask[1] = mask[1] and ctx.needs_input_grad[1]
        mask[2] = mask[2] and ctx.needs_input_grad[2]
        # What autograd's NativeLayerNormBackward0 calls (a contiguous gradient).
        dx, dw, db = torch.ops.aten.native_layer_norm_backward(
            grad.contiguous(), x, list(layer.normalized_shape), mean, rstd, weight, bias, mask
        )
        if dx is not None:
            with torch.no_grad():
                layer.tap("dgrad", dx)
                if ctx.check_dgrad:
                    features = layer.features
                    layer.record(
                        "dgrad",
                        layer_norm_dgrad_ratio(
                            dx.reshape(-1, features),
                            grad.reshape(-1, features),
                            x.reshape(-1, features),
                            mean.reshape(-1),
                            rstd.reshape(-1),
                            weight,
                        ),
                    )
        return dx, dw, db, None


class ProtectedLayerNorm(OpSensor, nn.LayerNorm):
    """An ``nn.LayerNorm`` whose output rows and input gradient are checked (see the module
    docstring); made by :func:`sdc_agent.sensors.protect`. The same parameters and
    ``state_dict`` keys."""

    sensor_ops: tuple[Gemm, ...] = ("forward", "dgrad")
    """What it checks and fault drills may corrupt: the norm's output (``forward``) and its
    input gradient (``dgrad``)."""

    def __init__(
        self, *args: Any, board: SensorBoard | None = None, name: str = "", **kw: Any
    ) -> None:
        """As ``nn.LayerNorm``; ``board``/``name``: where its sensors are registered."""
        super().__init__(*args, **kw)
        self._attach(board if board is not None else SensorBoard(), name)

    @property
    def features(self) -> int:
        """D: the number of normalised elements per row."""
        return math.prod(self.normalized_shape)

    def _attach(self, board: SensorBoard, name: str) -> None:
        d = self.features
        # Per row: the forward check reads x and y and takes two dot products (~5 D) against
        # the norm's ~8 D; the backward check ~12 D against the backward's ~10 D.
        self._attach_sensor(board, name, "layer_norm", [(5 * d, 8 * d), (12 * d, 10 * d)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``F.layer_norm(x, ...)``, checked when the board says so."""
        device = x.device.type
        # A DTensor weight (SequenceParallel): not checked; the norm runs as nn.LayerNorm's.
        if not self.sensing() or not autocast_mirrored(device) or isinstance(self.weight, DTensor):
            return nn.functional.layer_norm(
                x, self.normalized_shape, self.weight, self.bias, self.eps
            )
        weight: torch.Tensor | None = self.weight
        bias: torch.Tensor | None = self.bias
        if autocast_fp32(device):
            # What CUDA autocast does for layer_norm: run it in fp32.
            x = x.float()
            weight = weight.float() if weight is not None else None
            bias = bias.float() if bias is not None else None
        with torch.autocast(device, enabled=False):
            return _LayerNormFunction.apply(x, weight, bias, self)

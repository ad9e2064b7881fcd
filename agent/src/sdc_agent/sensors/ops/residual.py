"""Protected residual adds: ``a + b`` whose rows are checked by their sums.

A residual add has no module in most models (``x + f(x)`` in a forward), so there is nothing for
:func:`sdc_agent.sensors.protect` to find: write it as a :class:`ResidualAdd` module instead::

    class Block(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.norm, self.mlp = nn.LayerNorm(d), nn.Linear(d, d)
            self.add = sensors.ResidualAdd()          # plain ``a + b`` until protected

        def forward(self, x):
            return self.add(x, self.mlp(self.norm(x)))

``ResidualAdd`` is ``a + b`` (no parameters, no ``state_dict`` entries); ``protect()`` turns it
into :class:`ProtectedResidualAdd`, which computes the same ``a + b`` and, when its sensor
checks, compares each row's sum (along the last dimension) with the sums of its operands::

    y @ 1 = a @ 1 + b @ 1

The three fp32 sums err as random walks (``u (1 + sqrt(D))`` times the norms of their terms,
``u = 2^-24``) and each ``y_i = a_i + b_i`` is rounded to y's dtype (error ``<= u_y |y_i|``,
summed over the row about ``u_y |y_r|``), so a row may differ by about
``u (1 + sqrt(D)) (|a_r| + |b_r| + |y_r|) + 2 u_y |y_r|`` (the last term only when y is coarser
than fp32; :func:`residual_ratio`), with ``|y_r| <= |a_r| + |b_r|`` in place of ``|y_r|`` so
that a corrupted y cannot widen its own bound. A wrong element ``y_i`` moves its row's sum by
its whole error: x1.1 on an fp32 element of a row of D ~ N(0, 1) values is ~0.1/(3 u D) bounds
(thousands for D <= 4096) unless the element is itself near zero. In bf16 the bound is bf16's
rounding summed over the row: only larger faults stand out (``docs/performance.md``).

Its backward passes the gradient through unchanged (no computation), so there is nothing to
check there: ``sensor_ops`` is ``("forward",)``.
"""

from __future__ import annotations

import torch
from torch import nn

from ..runtime.board import Gemm, SensorBoard
from .rows import (
    FP32_UNIT_ROUNDOFF,
    OpSensor,
    output_rounding,
    row_block_max,
    sqrt_length,
    worst_row_ratio,
)


def residual_ratio(
    y: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, chunk: int | None = None
) -> torch.Tensor:
    """The largest per-row ``|Σy - (Σa + Σb)| / bound`` (0-dim fp32; see the module docstring),
    in blocks of rows of at most ``chunk`` elements (:func:`.rows.row_block_max`).

    ``a`` and ``b`` are broadcast to ``y``'s shape; rows run along the last dimension."""
    features = y.shape[-1] if y.dim() else 1

    def block(y: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        y32, a32, b32 = y.float(), a.float(), b.float()
        # From the inputs only (|y| <= |a| + |b|): a corrupted y must not widen its own bound.
        norms = torch.linalg.vector_norm(a32, dim=1) + torch.linalg.vector_norm(b32, dim=1)
        bound = 2.0 * FP32_UNIT_ROUNDOFF * sqrt_length(features) * norms
        bound = bound + output_rounding(y.dtype, norms)
        return worst_row_ratio(y32.sum(dim=1), a32.sum(dim=1) + b32.sum(dim=1), bound)

    views = [t.expand(y.shape).reshape(-1, features) for t in (y, a, b)]
    return row_block_max(block, features, *views, chunk=chunk)


class ResidualAdd(nn.Module):
    """``a + b``, as a module so that :func:`sdc_agent.sensors.protect` can check it (see the
    module docstring for how a model uses it). Unprotected, it is exactly ``a + b``."""

    def __init__(self, features: int = 1) -> None:
        """``features``: the width of the rows it adds (the last dimension), for the sensor
        budget's cost model only (``sensors/runtime/plan.py``; left at 1, a protected add
        prices the rows of its first forward instead); any width works."""
        super().__init__()
        if isinstance(features, bool) or not isinstance(features, int) or features < 1:
            raise ValueError(f"ResidualAdd features must be an integer >= 1, got {features!r}")
        self.features = features

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """``a + b``."""
        return a + b


class ProtectedResidualAdd(OpSensor, ResidualAdd):
    """A :class:`ResidualAdd` whose output rows are checked by their sums; made by
    :func:`sdc_agent.sensors.protect` (or directly, with a board)."""

    sensor_ops: tuple[Gemm, ...] = ("forward",)
    """What it checks and fault drills may corrupt: the sum ``a + b``."""

    def __init__(
        self, features: int = 1, *, board: SensorBoard | None = None, name: str = ""
    ) -> None:
        """As :class:`ResidualAdd`; ``board``/``name``: where its sensor is registered (a board
        of its own if None)."""
        super().__init__(features)
        self._attach(board if board is not None else SensorBoard(), name)

    def _attach(self, board: SensorBoard, name: str) -> None:
        # Per row of D: the check reads a, b and y and sums them with their norms (~6 D) against
        # the add's D.
        d = self.features
        self._attach_sensor(board, name, "residual_add", [(6 * d, d)])
        # Given no features (1), the first forward prices the rows it sees instead.
        self._sized = d > 1

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """``a + b``, checked when the board says so."""
        y = a + b
        if not self._sized:
            d = y.shape[-1] if y.dim() else 1
            self.sensor_board.resize(self.sensor_base, [(6 * d, d)])
            self._sized = True
        if not self.sensing():
            return y
        with torch.no_grad():
            self.tap("forward", y)
            if self.checks("forward"):
                self.record("forward", residual_ratio(y.detach(), a.detach(), b.detach()))
        return y

"""Protected layer norms: ``nn.LayerNorm`` whose output rows are checked against its inputs.

A norm layer's output is not a GEMM, but its rows obey an invariant just as cheap to check
(:func:`.abft.layer_norm_ratio`): each row's sum equals ``r ((x - μ) @ gamma) + sum(beta)``. The layer
computes ``torch.native_layer_norm`` (the op ``F.layer_norm`` runs, which also returns the
kernel's own μ and r, so the check does not recompute them) and checks its output when the
board says so. Only the forward is checked; the norm's backward stays blind between audits.
Under autocast the inputs are cast as autocast casts ``layer_norm``: to fp32 on CUDA (its fp32
list), not at all on the CPU (where it is in no list; checked by the tests), so the values are
those of ``nn.LayerNorm`` either way; under another device's autocast the layer is not checked.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .abft import layer_norm_ratio
from .board import Gemm, SensorBoard
from .linear import GemmTap


class ProtectedLayerNorm(nn.LayerNorm):
    """An ``nn.LayerNorm`` whose output rows are checked (see the module docstring); made by
    :func:`sdc_agent.sensors.protect`. The same parameters and ``state_dict`` keys."""

    sensor_board: SensorBoard
    sensor_base: int
    layer_name: str
    gemm_taps: list[GemmTap]
    sensor_ops: tuple[Gemm, ...] = ("forward",)
    """What fault drills may corrupt: the norm's output (named ``forward``)."""

    def __init__(
        self, *args: Any, board: SensorBoard | None = None, name: str = "", **kw: Any
    ) -> None:
        """As ``nn.LayerNorm``; ``board``/``name``: where its sensor is registered."""
        super().__init__(*args, **kw)
        self._attach(board or SensorBoard(), name)

    def _attach(self, board: SensorBoard, name: str) -> None:
        features = 1
        for size in self.normalized_shape:
            features *= size
        self._features = features
        self.sensor_board = board
        self.layer_name = name
        self.sensor_base = board.register_layer_norm(name, features)
        self.gemm_taps = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``F.layer_norm(x, ...)``, its output checked when the board says so."""
        board, base = self.sensor_board, self.sensor_base
        if not board.is_active(base) and not self.gemm_taps:
            return nn.functional.layer_norm(
                x, self.normalized_shape, self.weight, self.bias, self.eps
            )
        weight, bias = self.weight, self.bias
        device = x.device.type
        if torch.is_autocast_enabled(device):
            if device not in ("cuda", "cpu"):
                # An autocast policy not mirrored here: nn.LayerNorm's call, unchecked.
                return nn.functional.layer_norm(
                    x, self.normalized_shape, self.weight, self.bias, self.eps
                )
            if device == "cuda":
                # What CUDA autocast does for layer_norm: run it in fp32.
                x = x.float()
                weight = weight.float() if weight is not None else None
                bias = bias.float() if bias is not None else None
        with torch.autocast(device, enabled=False):
            y, mean, rstd = torch.native_layer_norm(
                x, list(self.normalized_shape), weight, bias, self.eps
            )
            with torch.no_grad():
                for tap in self.gemm_taps:
                    tap("forward", y)
                if board.is_active(base):
                    features = self._features
                    board.record(
                        base,
                        layer_norm_ratio(
                            y.detach().reshape(-1, features),
                            x.detach().reshape(-1, features),
                            mean.reshape(-1),
                            rstd.reshape(-1),
                            weight,
                            bias,
                        ),
                    )
        return y

"""Online checksum sensors: catch a wrong GEMM on the step it happens, between audits.

:func:`protect` makes a model's linear layers check their three GEMMs (:mod:`.abft` has the
maths, :mod:`.board` the thresholds and flags, :mod:`.plan` which sensors check on each step);
the guard reads the flags once per step and confirms a flag by replays before it names a GPU
(docs/architecture.md, "Sensors").
"""

from .abft import (
    check_cost,
    dgrad_ratio,
    forward_ratio,
    layer_norm_ratio,
    row_checksum_ratio,
    wgrad_ratio,
)
from .board import GEMMS, Gemm, SensorBoard, SensorConfig, SensorId
from .linear import ProtectedLinear, find_board, protect, protected_layers
from .norm import ProtectedLayerNorm

__all__ = [
    "GEMMS",
    "Gemm",
    "ProtectedLayerNorm",
    "ProtectedLinear",
    "SensorBoard",
    "SensorConfig",
    "SensorId",
    "check_cost",
    "dgrad_ratio",
    "find_board",
    "forward_ratio",
    "layer_norm_ratio",
    "protect",
    "protected_layers",
    "row_checksum_ratio",
    "wgrad_ratio",
]

"""Online checksum sensors: catch a wrong GEMM on the step it happens, between audits.

:func:`protect` makes a model's linear layers check their three GEMMs (:mod:`.abft` has the
maths, :mod:`.board` the thresholds and flags, :mod:`.plan` which sensors check on each step),
and beyond GEMMs its layer norms (:mod:`.norm`), softmax and log-softmax (:mod:`.softmax`) and
the residual adds it writes as :class:`ResidualAdd` (:mod:`.residual`) check their row
invariants (:mod:`.rows`); the guard reads the flags once per step and confirms a flag by replays before it names a GPU
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
from .linear import ProtectedLinear, find_board, protected_layers
from .norm import ProtectedLayerNorm, layer_norm_dgrad_ratio, layer_norm_output_ratio
from .protection import protect
from .residual import ProtectedResidualAdd, ResidualAdd, residual_ratio
from .softmax import (
    ProtectedLogSoftmax,
    ProtectedSoftmax,
    log_softmax_dgrad_ratio,
    log_softmax_ratio,
    softmax_dgrad_ratio,
    softmax_ratio,
)

__all__ = [
    "GEMMS",
    "Gemm",
    "ProtectedLayerNorm",
    "ProtectedLinear",
    "ProtectedLogSoftmax",
    "ProtectedResidualAdd",
    "ProtectedSoftmax",
    "ResidualAdd",
    "SensorBoard",
    "SensorConfig",
    "SensorId",
    "check_cost",
    "dgrad_ratio",
    "find_board",
    "forward_ratio",
    "layer_norm_dgrad_ratio",
    "layer_norm_output_ratio",
    "layer_norm_ratio",
    "log_softmax_dgrad_ratio",
    "log_softmax_ratio",
    "protect",
    "protected_layers",
    "residual_ratio",
    "row_checksum_ratio",
    "softmax_dgrad_ratio",
    "softmax_ratio",
    "wgrad_ratio",
]

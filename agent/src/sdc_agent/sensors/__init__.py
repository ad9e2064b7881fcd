"""Online checksum sensors: catch a wrong result on the step it happens, between audits.

:func:`protect` makes a model's linear layers check their three GEMMs (:mod:`.abft` has the
maths, :mod:`.board` the thresholds and flags, :mod:`.plan` which sensors check on each step);
beyond GEMMs its layer norms (:mod:`.norm`), softmax and log-softmax (:mod:`.softmax`) and the
residual adds it writes as :class:`ResidualAdd` (:mod:`.residual`) check their row invariants
(:mod:`.rows`); its RMSNorms of any class are found and checked by hooks (:mod:`.rmsnorm`); the
functions its forward calls (activations, products and adds, attention, the loss, the
embedding) are routed to checked versions (:mod:`.sites`, :mod:`.elementwise`,
:mod:`.attention`, :mod:`.loss`), and activation checkpointing's recomputations compared with
the first forward (:mod:`.recompute`). :mod:`.families` says per op family what is checked. The
guard reads the flags once per step and confirms a flag by replays before it names a GPU
(docs/architecture.md, "Online checksum sensors").
"""

from .abft import (
    check_cost,
    dgrad_ratio,
    forward_ratio,
    layer_norm_ratio,
    row_checksum_ratio,
    wgrad_ratio,
)
from .attention import batched_checksum_ratio
from .board import GEMMS, Gemm, SensorBoard, SensorConfig, SensorId
from .elementwise import (
    activation_dgrad_ratio,
    activation_ratio,
    add_ratio,
    embedding_wgrad_ratio,
    mul_ratio,
)
from .families import describe_families
from .linear import ProtectedLinear, find_board, protected_layers
from .norm import ProtectedLayerNorm, layer_norm_dgrad_ratio, layer_norm_output_ratio
from .protection import protect
from .recompute import RecomputeComparisons
from .residual import ProtectedResidualAdd, ResidualAdd, residual_ratio
from .rmsnorm import RMSNormSensor, rms_norm_dgrad_ratio, rms_norm_ratio, rms_norm_wgrad_ratio
from .sites import FunctionSensors, Site, find_sites
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
    "FunctionSensors",
    "Gemm",
    "ProtectedLayerNorm",
    "ProtectedLinear",
    "ProtectedLogSoftmax",
    "ProtectedResidualAdd",
    "ProtectedSoftmax",
    "RMSNormSensor",
    "RecomputeComparisons",
    "ResidualAdd",
    "SensorBoard",
    "SensorConfig",
    "SensorId",
    "Site",
    "activation_dgrad_ratio",
    "activation_ratio",
    "add_ratio",
    "batched_checksum_ratio",
    "check_cost",
    "describe_families",
    "dgrad_ratio",
    "embedding_wgrad_ratio",
    "find_board",
    "find_sites",
    "forward_ratio",
    "layer_norm_dgrad_ratio",
    "layer_norm_output_ratio",
    "layer_norm_ratio",
    "log_softmax_dgrad_ratio",
    "log_softmax_ratio",
    "mul_ratio",
    "protect",
    "protected_layers",
    "residual_ratio",
    "rms_norm_dgrad_ratio",
    "rms_norm_ratio",
    "rms_norm_wgrad_ratio",
    "row_checksum_ratio",
    "softmax_dgrad_ratio",
    "softmax_ratio",
    "wgrad_ratio",
]

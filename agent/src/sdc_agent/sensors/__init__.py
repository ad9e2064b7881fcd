"""Online checksum sensors: catch a wrong result on the step it happens, between audits.

A user needs one call, :func:`protect` (also ``sdc_agent.protect``), and, for residual adds
written as ``x + f(x)``, the :class:`ResidualAdd` module; thresholds come in a
:class:`SensorConfig`. The package has three layers, each importing only those before it:

* :mod:`.maths`: the checksum identities and their rounding bounds (:mod:`.maths.abft`), and
  the fused Triton kernel that computes a GEMM's check on a GPU;
* :mod:`.runtime`: what every sensor shares at run time: the board of thresholds and device
  flags (:mod:`.runtime.board`), which sensors check on which step within the budget
  (:mod:`.runtime.plan`), the taps and the per-family coverage text;
* :mod:`.ops`: one module per op family: the protected linear layers and layer norms, RMSNorm
  hooks, softmax and log-softmax, residual adds, element-wise ops and the embedding, attention,
  the loss; the function sites that route a forward's calls to the checked versions
  (:mod:`.ops.sites`) and activation checkpointing's recompute comparisons
  (:mod:`.ops.recompute`); :mod:`.ops.rows` has what the row-invariant checks share.

:mod:`.protection` puts them on a model. The guard's side, reading the flags once per step and
confirming a flag by replays before it names a GPU, is the fourth check,
:mod:`sdc_agent.checks.sensors` (docs/architecture.md, "Online checksum sensors").

The names this package exported before it was split into layers (``ProtectedLinear``,
``SensorBoard``, the ratio functions, ...) still resolve here, from their modules, for code
written against the flat layout; new code imports them from their module.
"""

from __future__ import annotations

import importlib
from typing import Any

from .ops.linear import find_board, protected_layers
from .ops.residual import ResidualAdd
from .protection import protect
from .runtime.board import SensorConfig
from .runtime.families import describe_families

__all__ = [
    "ResidualAdd",
    "SensorConfig",
    "describe_families",
    "find_board",
    "protect",
    "protected_layers",
]

_MOVED: dict[str, str] = {
    "FunctionSensors": "ops.sites",
    "GEMMS": "runtime.board",
    "Gemm": "runtime.board",
    "ProtectedLayerNorm": "ops.norm",
    "ProtectedLinear": "ops.linear",
    "ProtectedLogSoftmax": "ops.softmax",
    "ProtectedResidualAdd": "ops.residual",
    "ProtectedSoftmax": "ops.softmax",
    "RMSNormSensor": "ops.rmsnorm",
    "RecomputeComparisons": "ops.recompute",
    "SensorBoard": "runtime.board",
    "SensorId": "runtime.board",
    "Site": "ops.sites",
    "activation_dgrad_ratio": "ops.elementwise",
    "activation_ratio": "ops.elementwise",
    "add_ratio": "ops.elementwise",
    "batched_checksum_ratio": "ops.attention",
    "check_cost": "maths.abft",
    "dgrad_ratio": "maths.abft",
    "embedding_wgrad_ratio": "ops.elementwise",
    "find_sites": "ops.sites",
    "forward_ratio": "maths.abft",
    "layer_norm_dgrad_ratio": "ops.norm",
    "layer_norm_output_ratio": "ops.norm",
    "layer_norm_ratio": "maths.abft",
    "log_softmax_dgrad_ratio": "ops.softmax",
    "log_softmax_ratio": "ops.softmax",
    "mul_ratio": "ops.elementwise",
    "residual_ratio": "ops.residual",
    "rms_norm_dgrad_ratio": "ops.rmsnorm",
    "rms_norm_ratio": "ops.rmsnorm",
    "rms_norm_wgrad_ratio": "ops.rmsnorm",
    "row_checksum_ratio": "maths.abft",
    "softmax_dgrad_ratio": "ops.softmax",
    "softmax_ratio": "ops.softmax",
    "wgrad_ratio": "maths.abft",
}
"""Every other name of the flat layout, by the module (under this package) that defines it."""


def __getattr__(name: str) -> Any:
    """Resolve a name of the flat layout from the module that now defines it."""
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)


def __dir__() -> list[str]:
    """The public names, the subpackages and the names of the flat layout."""
    return sorted(set(globals()) | set(_MOVED))

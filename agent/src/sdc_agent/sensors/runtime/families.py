"""The sensors by op family, for ``Guard.coverage()``: what each family's sensors check, how often
at the job's budget, and every step at full coverage (``Schedule(sensor_budget=math.inf)``).

At the default budget (``Schedule.sensor_budget=0.01``) the guard plans in bursts: every sensor
checks on one step in ``period`` and none in between (:mod:`.plan`), so a one-step fault in any
family is seen with the chance ``1 / period`` times what the family's sensors see at full
coverage, and a persistent one within ``period`` steps.
"""

from __future__ import annotations

from typing import Any

from .board import SensorBoard
from .plan import SensorPlan

FAMILIES: dict[str, tuple[str, str]] = {
    # kind: (op family, what its sensors check)
    "linear": (
        "GEMM",
        "row checksums of the forward, input- and weight-gradient GEMMs' fp32 result",
    ),
    "layer_norm": ("norm", "LayerNorm: output and input-gradient row invariants"),
    "rms_norm": (
        "norm",
        "RMSNorm: output, input gradient and weight gradient recomputed element-wise",
    ),
    "activation": ("activation", "SiLU/GELU output and input gradient recomputed element-wise"),
    "mul": (
        "element-wise product",
        "gating product (SwiGLU), rotary products: result and input gradients recomputed",
    ),
    "add": ("add", "adds of two tensors of one shape (residual, rotary): recomputed in fp32"),
    "residual_add": ("add", "ResidualAdd modules: row sums"),
    "attention": (
        "attention",
        "checked SDPA (protect(attention='checked')): QKᵀ, PV and the four backward GEMMs by row "
        "checksums, softmax rows sum to one, its backward's row identity",
    ),
    "softmax": ("softmax", "nn.Softmax: rows sum to one; input-gradient row identity"),
    "log_softmax": ("softmax", "nn.LogSoftmax: rows logsumexp to 0; input-gradient row identity"),
    "cross_entropy": (
        "loss",
        "F.cross_entropy in the model's forward: log-softmax rows, the NLL gradient's row sums, "
        "the loss gradient's rows sum to zero",
    ),
    "embedding": ("embedding", "lookup gathered again; weight gradient's column sums"),
    "recompute": (
        "recompute",
        "an activation-checkpointed block's recompute against its first forward (fingerprints "
        "of every module input)",
    ),
}
"""Per sensor kind: its op family and what is checked."""


def describe_families(board: SensorBoard, plan: SensorPlan | None) -> dict[str, dict[str, Any]]:
    """Per op family with a sensor in this model: its sensor kinds, how many sensors, what they
    check, and the fraction of steps on which they check at this job's budget (None before the
    plan is made) and at full coverage (1.0)."""
    found: dict[str, dict[str, Any]] = {}
    for index, sensor in enumerate(board.sensors):
        family, checks = FAMILIES.get(sensor.kind, (sensor.kind, "see the sensor's module"))
        entry = found.setdefault(
            family,
            {"kinds": [], "sensors": 0, "checks": [], "rate": None, "rate_at_full_coverage": 1.0},
        )
        if sensor.kind not in entry["kinds"]:
            entry["kinds"].append(sensor.kind)
            entry["checks"].append(checks)
        entry["sensors"] += 1
        if plan is not None:
            rate = plan.rate(index)
            entry["rate"] = rate if entry["rate"] is None else min(entry["rate"], rate)
    return found

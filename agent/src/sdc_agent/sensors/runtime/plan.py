"""Which sensors check on which step: a deterministic rotation that stays under a budget.

Every rank computes the same plan from the same layer shapes and step, so the decision costs no
communication and the set of sensors checked at a step is known before its forward pass.

The cost model (per row of the batch; the batch size cancels because every layer of a step sees
the same rows): a layer with K inputs and N outputs runs three GEMMs of ``2 M N K`` flops each.
Checking the forward GEMM reads y and computes ``x @ (Wᵀ 1)`` and the row norms of x: about
``M (N + 2K)``; dgrad ``M (K + 2N)``; wgrad ``2M (N + K)`` (the ``N K`` reductions of the
weight are amortised over the M rows and left out). A sensor's cost is that over the step's
protected GEMM flops ``6 M Σ N K``: an O(1/N + 1/K) fraction of its own GEMM. A protected layer
norm of D features counts its check as ``5 M D`` against its own ``8 M D``. Other operations of
the step (attention, activations, the optimizer) are not counted, so the real fraction of the
step is lower than the budget says.

Counting flops alone understates a check by one to two orders of magnitude: a check is a few
passes over memory (the result, the left operand, and once per check the ``N x K`` weight or
weight gradient, which does not shrink with the batch), while its GEMM runs at the machine's
peak arithmetic rate. So when the batch's rows ``M`` are known (:func:`plan_sensors`'s
``rows``, the guard's plan takes them from the first step) a check's cost is counted as
``read_cost x (M x per-row reads + fixed reads)`` over its GEMMs' ``6 M Σ N K`` flops, where
:data:`READ_COST` is what one fp32 element read costs in GEMM flops on the device: measured on
this project's 2-core CPU (a 1024 x 1024 layer, 128 rows: the forward and input-gradient checks
cost 8-9% of their GEMM, this model says 9.3%), and for GPUs the ratio of an H100/H200's dense
bf16 rate to its memory bandwidth (~990 TFLOP/s over ~4.8 TB/s per 4-byte element, rounded
down; not measured here: ``benchmarks/sensor_gpu.py`` measures the real overhead on a GPU).

The elements a check reads per row are written by hand where each sensor registers (its op's
module: ``board.costs`` and ``board.fixed_costs``), and for most op families they undercount
what the check moves: a non-GEMM check runs 20-90 eager operators with fp32 temporaries, each a
pass over memory. So the memory model multiplies each sensor's registered elements by its
family's :data:`CALIBRATION` coefficient: what the dispatch-level recorder counts the check
moving (bytes read and written, ``benchmarks/costmodel/calibration.py``, fp32) over what it
registers (:func:`check_bytes`). The coefficients are 0.84-1.3 for the linear checks, the layer
norm's output, the residual add and the embedding's weight gradient, 2.5-6 for the other checks
(docs/performance/sensors.md,
"What a check moves"); ``tests/unit/test_sensor_calibration.py`` holds each within 25% of the
recorder at another width, so the table cannot go stale. The kernel launches a check adds
(22-89 on the CPU's eager path) are counted in that table but not priced here.

The rotation: the sensors, in a fixed order, are packed greedily into groups whose cost stays
within ``budget``; a sensor costing more than the budget alone gets a group followed by empty
groups, so that its cost averaged over the steps stays within the budget. Step ``s`` checks
group ``s % len(groups)``: every GEMM is checked once every ``period`` steps.

The guard plans in bursts instead (``burst=True``): every sensor in one group, followed by
``ceil(total cost / budget) - 1`` empty ones. Each GEMM is checked exactly as often (once per
period, the same average cost), so a one-step fault is sampled with the same probability and a
persistent one is seen within the same period; but only one step in a period is a sensor step,
and a sensor step is what costs beyond the checks: every rank holds it at check 1's reduction
until the flags are known (no overlap with the next step) and it is seeded for replays.
Measured on this project's CPU (benchmarks/overhead.py, 3 ranks, the same checks): with every
step a sensor step the sensors cost 4.2 points of CPU time over check 1 alone, in bursts 2.0
(docs/performance.md, "Online sensors").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .board import SensorBoard

READ_COST = {"cpu": 10.0, "cuda": 800.0}
"""GEMM flops one fp32 element read of a check costs, by device type (see the module docstring);
other devices count as GPUs."""


def read_cost(device_type: str | None) -> float:
    """:data:`READ_COST` of ``device_type`` (a GPU's when unknown)."""
    return READ_COST.get(device_type or "cuda", READ_COST["cuda"])


CALIBRATION: dict[tuple[str, str], float] = {
    # (sensor kind, op): moved / registered, fp32, 1024 features, 256 rows (module docstring)
    ("linear", "forward"): 1.00,
    ("linear", "dgrad"): 1.00,
    ("linear", "wgrad"): 1.27,
    ("layer_norm", "forward"): 1.01,
    ("layer_norm", "dgrad"): 5.09,
    ("rms_norm", "forward"): 4.79,
    ("rms_norm", "dgrad"): 5.91,
    ("rms_norm", "wgrad"): 3.84,
    ("activation", "forward"): 5.95,
    ("activation", "dgrad"): 4.82,
    ("mul", "forward"): 5.90,
    ("mul", "dgrad"): 5.90,
    ("add", "forward"): 5.90,
    ("residual_add", "forward"): 0.84,
    ("softmax", "forward"): 3.51,
    ("softmax", "dgrad"): 3.61,
    ("log_softmax", "forward"): 5.76,
    ("log_softmax", "dgrad"): 4.81,
    ("cross_entropy", "forward"): 3.84,
    ("cross_entropy", "dgrad"): 2.51,
    ("embedding", "forward"): 3.83,
    ("embedding", "wgrad"): 1.26,
}
"""Per sensor kind and op: the elements its check moves, as the dispatch-level recorder counts
them, over the elements the board registers for it (module docstring). A kind not here (the
checked attention, recompute comparisons) counts as registered (1.0)."""


def calibration(kind: str, op: str) -> float:
    """:data:`CALIBRATION` of a sensor ``kind``'s ``op`` (1.0 when not calibrated)."""
    return CALIBRATION.get((kind, op), 1.0)


def check_bytes(board: SensorBoard, index: int, rows: int, *, element_size: int = 4) -> float:
    """Bytes sensor ``index``'s check moves over a batch of ``rows`` rows: what it registers
    (``rows`` x per-row + fixed elements) times its :func:`calibration`, in elements of
    ``element_size`` bytes (fp32: what the checks compute in)."""
    check, _ = board.costs[index]
    sensor = board.sensors[index]
    elements = rows * check + board.fixed_costs[index]
    return element_size * calibration(sensor.kind, sensor.gemm) * elements


def sensor_costs(
    board: SensorBoard, *, rows: int | None = None, device_type: str | None = None
) -> list[float]:
    """Each sensor's estimated cost as a fraction of the step's protected operations' flops
    (for linear layers only: of their GEMMs'; a layer norm adds its own few flops per row).

    Without ``rows``: the per-row flops model (elements a check reads per row over its GEMM's
    flops per row). With ``rows`` (the batch's rows): the memory model of the module docstring
    on ``device_type``: each check's calibrated bytes (:func:`check_bytes`, its batch-independent
    passes amortised over ``rows``) as fp32 element reads."""
    total = sum(op for _, op in board.costs)
    if rows is None:
        return [check / total for check, _ in board.costs]
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows!r}")
    weight = read_cost(device_type)
    return [
        weight * check_bytes(board, index, rows) / 4 / (rows * total)
        for index in range(len(board.costs))
    ]


@dataclass(frozen=True)
class SensorPlan:
    """The groups of sensors checked in rotation (built by :func:`plan_sensors`)."""

    groups: tuple[frozenset[int], ...]
    """Group ``s % period`` is checked at step ``s``; some may be empty."""
    costs: tuple[float, ...]
    """Each sensor's estimated cost (fraction of the step's protected GEMM flops)."""

    @property
    def period(self) -> int:
        """Steps within which every sensor is checked once."""
        return len(self.groups)

    def active(self, step: int) -> frozenset[int]:
        """The sensors checked at ``step`` (the same on every rank)."""
        return self.groups[step % len(self.groups)] if self.groups else frozenset()

    def rate(self, index: int) -> float:
        """The fraction of steps on which sensor ``index`` checks."""
        return sum(index in g for g in self.groups) / max(1, len(self.groups))

    @property
    def mean_cost(self) -> float:
        """The estimated sensor cost per step, averaged over a period."""
        return sum(self.costs) / max(1, len(self.groups))


def plan_sensors(
    board: SensorBoard,
    budget: float,
    *,
    rows: int | None = None,
    device_type: str | None = None,
    burst: bool = False,
) -> SensorPlan:
    """Pack ``board``'s sensors into rotation groups that each cost at most ``budget``
    (costs by :func:`sensor_costs`, with ``rows`` and ``device_type`` when given); with
    ``burst``, one group of every sensor and enough empty groups after it that the average
    stays within ``budget`` (module docstring)."""
    if not budget > 0:
        raise ValueError(f"sensor budget must be > 0, got {budget!r}")
    costs = sensor_costs(board, rows=rows, device_type=device_type)
    everything = frozenset(range(len(costs)))
    total = sum(costs)
    if math.isinf(budget) or total <= budget:
        return SensorPlan(groups=(everything,), costs=tuple(costs))
    if burst:
        idle = math.ceil(total / budget) - 1
        return SensorPlan(groups=(everything,) + (frozenset(),) * idle, costs=tuple(costs))
    groups: list[frozenset[int]] = []
    current: list[int] = []
    spent = 0.0
    for index, cost in enumerate(costs):
        if cost > budget:
            if current:
                groups.append(frozenset(current))
                current, spent = [], 0.0
            groups.append(frozenset([index]))
            groups.extend(frozenset() for _ in range(math.ceil(cost / budget) - 1))
            continue
        if spent + cost > budget:
            groups.append(frozenset(current))
            current, spent = [], 0.0
        current.append(index)
        spent += cost
    if current:
        groups.append(frozenset(current))
    return SensorPlan(groups=tuple(groups), costs=tuple(costs))

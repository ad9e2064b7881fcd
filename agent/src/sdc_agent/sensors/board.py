"""The sensor board: every protected GEMM's threshold, warm-up and flag, kept on the device.

One board serves every protected layer of a model (:func:`sdc_agent.sensors.protect` makes it).
A check (:meth:`SensorBoard.record`) never synchronises the host: the flag, the largest ratio
and the learned healthy ratio are device tensors updated in place, and the guard reads the flags
once per step (:meth:`SensorBoard.take_flags`), at the point where check 1 already reads its own.

Thresholds: each sensor first observes ``warmup_checks`` checks and never flags, learning the
largest healthy ratio (:mod:`.abft` divides each row's checksum difference by its rounding
bound); afterwards it flags a ratio above ``max(min_threshold, margin * learned)``, and any NaN or
Inf in a checksum. Measured on the CPU (random operands, 30-100 trials per shape from 4x8x8 to
32x1024x4096, all three GEMMs) healthy ratios stay below 2 (under 0.6 for wide layers, up to
1.8 for a weight gradient summed over 512 rows), while a 10% change of one element or a flip
of bit 20+ lands above 3 in ~97% (1024 -> 4096) to 100% (every smaller shape) of trials. Hence
a margin of 4 over the warm-up's largest ratio and a floor of 3: a short warm-up that saw
only the bulk of the healthy distribution cannot set a threshold inside its tail.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

Gemm = Literal["forward", "dgrad", "wgrad"]
GEMMS: tuple[Gemm, ...] = ("forward", "dgrad", "wgrad")
"""A protected linear layer's three GEMMs, in sensor-index order."""


@dataclass(kw_only=True, frozen=True)
class SensorConfig:
    """How the sensors of protected layers set their thresholds; validated on construction."""

    warmup_checks: int = 20
    """Checks each sensor observes (never flagging) before it may flag."""
    margin: float = 4.0
    """The threshold is ``margin`` times the largest ratio seen in the warm-up (or the floor)."""
    min_threshold: float = 3.0
    """Floor of the threshold, in units of the rounding bound of :mod:`sdc_agent.sensors.abft`."""

    def __post_init__(self) -> None:
        if (
            not isinstance(self.warmup_checks, int)
            or isinstance(self.warmup_checks, bool)
            or self.warmup_checks < 1
        ):
            raise ValueError(
                f"SensorConfig.warmup_checks must be an integer >= 1, got {self.warmup_checks!r}"
            )
        for name in ("margin", "min_threshold"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value <= 0
            ):
                raise ValueError(f"SensorConfig.{name} must be a finite number > 0, got {value!r}")


@dataclass(frozen=True)
class SensorId:
    """One checked operation: the layer's qualified name, which of its GEMMs (for the other
    layers ``forward`` is the op's output and ``dgrad`` its input gradient), and the kind of
    layer (``linear``, ``layer_norm``, ``residual_add``, ``softmax`` or ``log_softmax``)."""

    layer: str
    gemm: Gemm
    kind: str = "linear"

    def to_dict(self) -> dict[str, str]:
        """JSON form."""
        return {"layer": self.layer, "gemm": self.gemm, "kind": self.kind}


@dataclass(frozen=True)
class LayerShape:
    """A protected layer's dimensions (the plan's cost model needs them)."""

    in_features: int
    out_features: int


class SensorBoard:
    """Per-sensor state on the device, and which sensors check now."""

    def __init__(self, config: SensorConfig | None = None) -> None:
        """An empty board; :func:`~sdc_agent.sensors.protect` registers the layers."""
        self.config = config or SensorConfig()
        self.sensors: list[SensorId] = []
        """Every sensor, by index (layer-major, GEMMs in :data:`GEMMS` order)."""
        self.layers: dict[str, str] = {}
        """Protected layers' kinds (``linear``, ``layer_norm``, ...) by qualified name, in order."""
        self.costs: list[tuple[float, float]] = []
        """Per sensor, per row of the batch: (flops of its check, flops of the op it checks);
        the plan's cost model (:mod:`.plan`)."""
        self.checks: list[int] = []
        """Per sensor: checks run so far (host counter; warm-up ends at ``warmup_checks``)."""
        self.fixed_costs: list[float] = []
        """Per sensor: elements its check reads once whatever the batch (the ``N x K`` passes
        over a weight or a weight gradient); the plan amortises them over the batch's rows."""
        self.rows: int | None = None
        """Rows (tokens) of the largest batch a protected layer has seen, and where it ran
        (``device_type``): the plan's cost model needs them (host values, no sync)."""
        self.device_type: str | None = None
        self._active: frozenset[int] = frozenset()
        self.active_layers: frozenset[int] = frozenset()
        """The first sensor index of every layer with a sensor armed now (a layer's cheap
        "does anything check me" test)."""
        self._bases: list[int] = []  # per sensor: its layer's first sensor index
        self._confirming = False
        self._device: torch.device | None = None
        self._flags: torch.Tensor | None = None  # int64 [n]: fired since the last take
        self._ratios: torch.Tensor | None = None  # fp32 [n]: largest ratio since the last take
        self._learned: torch.Tensor | None = None  # fp32 [n]: largest healthy ratio in warm-up
        self._thresholds: torch.Tensor | None = None  # fp32 [n]

    # ------------------------------------------------------------------ registration
    def register(self, layer: str, shape: LayerShape) -> int:
        """Add a linear layer's three sensors; returns the index of its forward sensor."""
        k, n = shape.in_features, shape.out_features
        # Per row: reading the result, the reference mat-vec and the row norms (see .abft).
        costs = [(n + 2 * k, 2 * n * k), (k + 2 * n, 2 * n * k), (2 * (n + k), 2 * n * k)]
        # Once per check: forward and dgrad sum the weight and take its norm (2 N K reads),
        # wgrad sums its N x K result.
        return self._add(layer, "linear", GEMMS, costs, fixed=[2 * n * k, 2 * n * k, n * k])

    def register_layer_norm(self, layer: str, features: int) -> int:
        """Add a layer norm's output sensor; returns its index."""
        # Per row: the check reads x and y and takes two dot products (~5 D); the norm ~8 D.
        return self._add(layer, "layer_norm", ("forward",), [(5 * features, 8 * features)])

    def register_op(
        self, layer: str, kind: str, ops: tuple[Gemm, ...], costs: list[tuple[int, int]]
    ) -> int:
        """Add the sensors of a layer that is not a linear one (a norm's backward, a residual
        add, a softmax): ``ops`` in sensor-index order, ``costs`` per op and per row as
        (flops of the check, flops of the op). Returns the index of its first sensor."""
        if not ops or len(ops) != len(costs):
            raise ValueError(f"register_op: {len(ops)} ops and {len(costs)} costs for {layer!r}")
        unknown = [op for op in ops if op not in GEMMS]
        if unknown:
            raise ValueError(f"register_op: ops must be among {GEMMS}, got {unknown}")
        return self._add(layer, kind, ops, costs)

    def _add(
        self,
        layer: str,
        kind: str,
        ops: tuple[Gemm, ...],
        costs: list[tuple[int, int]],
        fixed: list[int] | None = None,
    ) -> int:
        if layer in self.layers:
            raise ValueError(f"layer {layer!r} is already protected on this board")
        base = len(self.sensors)
        self.layers[layer] = kind
        self.sensors.extend(SensorId(layer, op, kind) for op in ops)
        self.costs.extend((float(c), float(o)) for c, o in costs)
        self.checks.extend([0] * len(ops))
        self._bases.extend([base] * len(ops))
        self.fixed_costs.extend(float(f) for f in fixed or [0] * len(ops))
        self._device = None  # re-allocated for the new size on the next check
        return base

    def __len__(self) -> int:
        return len(self.sensors)

    def observe(self, rows: int, device_type: str) -> None:
        """Note a protected layer's batch rows and device (before the plan is made)."""
        if self.rows is None or rows > self.rows:
            self.rows = rows
        self.device_type = device_type

    # ------------------------------------------------------------------ what checks now
    def arm(self, active: frozenset[int]) -> None:
        """Check exactly the sensors in ``active`` from now on, with fresh flags."""
        self._set_active(frozenset(active))
        self._confirming = False
        if self._flags is not None:
            self._flags.zero_()
            self._ratios.zero_()

    def disarm(self) -> None:
        """Check nothing (replays of the audit run disarmed)."""
        self._set_active(frozenset())
        self._confirming = False

    def confirm_all(self) -> None:
        """Check every sensor that finished its warm-up, with fresh flags and without learning:
        a confirmation replay's reading."""
        self._set_active(
            frozenset(i for i, n in enumerate(self.checks) if n >= self.config.warmup_checks)
        )
        self._confirming = True
        if self._flags is not None:
            self._flags.zero_()
            self._ratios.zero_()

    def _set_active(self, active: frozenset[int]) -> None:
        self._active = active
        self.active_layers = frozenset(self._bases[i] for i in active)

    def is_active(self, index: int) -> bool:
        """Whether sensor ``index`` checks its GEMM now (host-side, no sync)."""
        return index in self._active

    # ------------------------------------------------------------------ the check
    def record(self, index: int, ratio: torch.Tensor) -> None:
        """Account one check's ratio (0-dim, on the GEMM's device): learn it during the warm-up,
        else flag it when above the threshold or not finite. No host synchronisation."""
        self._ensure(ratio.device)
        value = ratio.detach().float().reshape(1)
        slot = slice(index, index + 1)
        self._ratios[slot] = torch.maximum(
            self._ratios[slot], torch.nan_to_num(value, nan=math.inf)
        )
        warm = self.checks[index] >= self.config.warmup_checks
        if not self._confirming:
            self.checks[index] += 1
        if not warm:
            # Observe only: a non-finite ratio here teaches nothing (and flags nothing).
            healthy = torch.where(torch.isfinite(value), value, torch.zeros_like(value))
            self._learned[slot] = torch.maximum(self._learned[slot], healthy)
            if self.checks[index] == self.config.warmup_checks:
                learned = self._learned[slot] * self.config.margin
                self._thresholds[slot] = learned.clamp_min(self.config.min_threshold)
            return
        # `not (ratio <= threshold)` is true for NaN as well as for a ratio above the threshold.
        fired = ~(value <= self._thresholds[slot])
        self._flags[slot] = torch.maximum(self._flags[slot], fired.to(torch.int64))

    def take_flags(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The flags (int64) and largest ratios (fp32) since :meth:`arm`, one per sensor, on the
        device (copies), and disarm: what the guard reads once per step."""
        self._ensure(self._device or torch.device("cpu"))
        flags, ratios = self._flags.clone(), self._ratios.clone()
        self.disarm()
        return flags, ratios

    def threshold_tensor(self) -> torch.Tensor:
        """Each sensor's threshold on the device (fp32; +Inf while it warms up): a copy."""
        self._ensure(self._device or torch.device("cpu"))
        return self._thresholds.clone()

    def thresholds(self) -> list[float | None]:
        """Each sensor's threshold, None while it warms up (reads the device: for reports)."""
        if self._thresholds is None:
            return [None] * len(self.sensors)
        values = self._thresholds.cpu().tolist()
        return [
            v if n >= self.config.warmup_checks else None
            for v, n in zip(values, self.checks, strict=True)
        ]

    def _ensure(self, device: torch.device) -> None:
        if self._device == device and self._flags is not None:
            return
        n = len(self.sensors)
        old = (self._flags, self._ratios, self._learned, self._thresholds)
        self._flags = torch.zeros(n, dtype=torch.int64, device=device)
        self._ratios = torch.zeros(n, dtype=torch.float32, device=device)
        self._learned = torch.zeros(n, dtype=torch.float32, device=device)
        self._thresholds = torch.full((n,), math.inf, dtype=torch.float32, device=device)
        if old[0] is not None:
            # Moved (model.to(device)) or grown: keep what the sensors learned.
            for new, previous in zip(
                (self._flags, self._ratios, self._learned, self._thresholds), old, strict=True
            ):
                count = min(n, previous.numel())
                new[:count] = previous[:count].to(device)
        self._device = device

"""The sensor board: every sensor's threshold and flag, kept on the device, and how the ranks
agree on the thresholds.

One board serves every protected layer of a model (:func:`sdc_agent.sensors.protect` makes it).
A check (:meth:`SensorBoard.record`) never synchronises the host: the flag, the largest ratio
and what the sensor learns are device tensors updated in place, and the guard reads the flags
once per step (:meth:`SensorBoard.take_flags`), at the point where check 1 already reads its own.

A sensor flags from its first check: a ratio above the threshold in force, or a NaN/Inf in a
checksum. Every check divides its identity's residual by the rounding bound of its op
(:mod:`~sdc_agent.sensors.maths.abft`, :mod:`~sdc_agent.sensors.ops.rows`), which carries the op's shape and dtype, so one threshold in units
of that bound serves every op:

* From the first check, ``SensorConfig.initial_threshold`` (``INITIAL_THRESHOLD``, 12). Measured
  on the CPU (``benchmarks/sensor_ratios.py``: every op family, 13 linear shapes from 4 x 32 on
  8 rows to 4096 x 1024 and 512 x 512 on 4096 rows, norms and adds of 32 to 4096 features,
  (log-)softmax rows of 4 to 8192, fp32 and bf16, zero-mean, Llama-initialised, all-positive,
  offset and heavy-tailed data, 30 trials a cell; docs/performance.md, "Sensor thresholds")
  the largest healthy ratio is 4.09 (a bf16 log-softmax's input gradient over rows of 8192;
  GEMMs 2.17); fault-free 6-rank soaks of the drill model (2,000 steps) and of a Hugging Face
  Llama (1,500), every sensor every step, read at most 4.17 (the Llama's ``lm_head`` weight
  gradient). 12 keeps a factor of 2.9 over the largest seen and still flags what matters: a
  x1000 element reads 1e5 and more, and a 10% change of one element of a GEMM is above 12 in
  97-99% of the same grid's trials.
* Tightened together: for the first ``warmup_checks`` sensor steps every rank records, per
  sensor, its largest ratio that did not flag (a flagged ratio is a candidate, never a lesson);
  then, on the same step everywhere, the ranks pool them (:meth:`observations` gathered,
  :meth:`agree`): the threshold becomes ``margin`` times the ranks' lower median, within
  ``[min_threshold, threshold in force]``. A median cannot be moved by any minority of ranks:
  a GPU faulty from step 0 reads outlying ratios, which set nothing (no rank teaches itself a
  fault), and its reading on that very step is judged against the agreed threshold, so a fault
  that persists is a candidate there and then. Learning only tightens.
* Relaxed by what a healthy GPU reproduces: when the replays find a candidate's ratio reproduced
  on a third GPU (``reproducible``: the data's own rounding), that sensor's threshold rises to
  ``SEPARATION`` times the reproduced ratio (:meth:`relax`), above the first-check threshold
  too if the data's tail is there. The evidence is another GPU's number, so no rank teaches
  itself a fault either; without it the same healthy tail would be replayed again at every
  check (a replay of a whole step on two GPUs while the others wait).

Every input of a threshold (the config, the gathered observations, the replays' readings) is
the same on every rank, and so is every threshold: a ratio is judged alike everywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

Gemm = Literal["forward", "dgrad", "wgrad"]
GEMMS: tuple[Gemm, ...] = ("forward", "dgrad", "wgrad")
"""A protected linear layer's three GEMMs, in sensor-index order."""


INITIAL_THRESHOLD = 12.0
"""The default first-check threshold, in units of the rounding bound (module docstring)."""

SEPARATION = 2.0
"""How far apart two readings must be for one to stand apart from the other: a candidate is
confirmed only when the healthy GPU's recomputation reads less than ``1 / SEPARATION`` of the
flagged ratio (:func:`sdc_agent.checks.sensors.check.sensor_verdict`), and a ratio a healthy GPU
reproduced raises its sensor's threshold to ``SEPARATION`` times it (:meth:`SensorBoard.relax`).
A factor of 2 is far beyond the spread of one datum's rounding between two computations and
well inside what a fault worth naming adds."""


@dataclass(kw_only=True, frozen=True)
class SensorConfig:
    """How the sensors of protected layers set their thresholds; validated on construction."""

    warmup_checks: int = 20
    """Sensor steps whose healthy ratios the ranks observe before they agree on a tighter
    threshold (the sensors flag against ``initial_threshold`` meanwhile); 0: never tighten."""
    margin: float = 4.0
    """The agreed threshold is ``margin`` times the ranks' median of their largest healthy
    ratio in the observation window (within ``[min_threshold, initial_threshold]``)."""
    min_threshold: float = 3.0
    """Floor of every threshold, in units of the rounding bound of :mod:`sdc_agent.sensors.maths.abft`."""
    initial_threshold: float = INITIAL_THRESHOLD
    """The threshold every sensor holds from its first check until the ranks agree on a tighter
    one, and the ceiling of what they agree on (module docstring: measured healthy ratios reach
    4.2); only a ratio a healthy GPU reproduced raises a threshold above it."""

    def __post_init__(self) -> None:
        if (
            not isinstance(self.warmup_checks, int)
            or isinstance(self.warmup_checks, bool)
            or self.warmup_checks < 0
        ):
            raise ValueError(
                f"SensorConfig.warmup_checks must be an integer >= 0 (0: keep the first-check "
                f"threshold), got {self.warmup_checks!r}"
            )
        for name in ("margin", "min_threshold", "initial_threshold"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value <= 0
            ):
                raise ValueError(f"SensorConfig.{name} must be a finite number > 0, got {value!r}")
        if self.initial_threshold < self.min_threshold:
            raise ValueError(
                f"SensorConfig.initial_threshold ({self.initial_threshold!r}) must be >= "
                f"min_threshold ({self.min_threshold!r}): it is the agreed thresholds' ceiling"
            )


@dataclass(frozen=True)
class Outlier:
    """A rank whose largest healthy ratio in the observation window is above the threshold the
    ranks agreed on: not a teacher, and judged against that threshold from then on."""

    dp_rank: int
    sensor: int
    """The sensor's index on the board."""
    ratio: float
    threshold: float


def agreed_thresholds(
    learned: torch.Tensor, observed: torch.Tensor, current: torch.Tensor, config: SensorConfig
) -> torch.Tensor:
    """The thresholds the ranks agree on after the observation window (pure; fp32 [n]).

    ``learned`` and ``observed`` are [ranks, n]: each rank's largest unflagged ratio per sensor
    and how many unflagged checks it ran. Per sensor, over the ranks that checked it: ``margin`` times the
    lower median, clamped to ``[min_threshold, current]`` (``current``: the thresholds in force;
    learning only tightens). A sensor no rank checked keeps ``current``. The lower median of m
    ranks is the ``(m - 1) // 2``-th smallest: with 2 ranks the smaller, so that no single rank
    of any group can raise it."""
    current = current.float()
    seen = observed > 0
    counts = seen.sum(dim=0)
    values = learned.float().masked_fill(~seen, math.inf).sort(dim=0).values
    index = ((counts - 1).clamp_min(0) // 2).reshape(1, -1)
    median = values.gather(0, index).reshape(-1)
    tightened = (config.margin * median).clamp_min(config.min_threshold)
    tightened = torch.minimum(tightened, current)
    return torch.where(counts > 0, tightened, current)


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
        """Per sensor: checks run in training so far (host counter; replays do not count)."""
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
        self._kernels: frozenset[int] = frozenset()
        self.checked_layers: frozenset[int] = frozenset()
        """The first sensor index of every layer with an op on the checked path now
        (:meth:`runs_checked`): a protected layer not in it runs its plain kernels."""
        self.learning = self.config.warmup_checks > 0
        """Whether the sensors still record what they observe for the ranks' agreement (until
        :meth:`agree`; never with ``warmup_checks=0``)."""
        self.outliers: list[Outlier] = []
        """The ranks :meth:`agree` found outlying (they taught nothing)."""
        self.relaxed = 0
        """Thresholds raised by :meth:`relax` (ratios a healthy GPU reproduced)."""
        self._bases: list[int] = []  # per sensor: its layer's first sensor index
        self._confirming = False
        self._device: torch.device | None = None
        self._slots: _Slots | None = None  # allocated on the first check (_ensure)

    def configure(self, config: SensorConfig) -> None:
        """Hold ``config``'s thresholds instead (``GuardConfig.sensors.thresholds``): only before
        the first check, and only when ``protect`` was given none or the same."""
        if not isinstance(config, SensorConfig):
            raise TypeError(f"the sensors' thresholds must be a SensorConfig, got {config!r}")
        if self.config not in (config, SensorConfig()):
            raise ValueError(
                "the sensors' thresholds were given twice, differently: to sdc_agent.protect "
                f"({self.config}) and in GuardConfig.sensors.thresholds ({config}); give them once"
            )
        if any(self.checks) or self._slots is not None:
            raise RuntimeError("the sensors' thresholds can only be set before their first check")
        self.config = config
        self.learning = config.warmup_checks > 0

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
        self,
        layer: str,
        kind: str,
        ops: tuple[Gemm, ...],
        costs: list[tuple[int, int]],
        fixed: list[int] | None = None,
    ) -> int:
        """Add the sensors of a layer that is not a linear one (a norm's backward, a residual
        add, a softmax): ``ops`` in sensor-index order, ``costs`` per op and per row as
        (flops of the check, flops of the op), ``fixed`` per op the elements its check reads
        once whatever the batch (an embedding's vocabulary x width weight gradient). Returns
        the index of its first sensor."""
        if not ops or len(ops) != len(costs) or (fixed is not None and len(fixed) != len(ops)):
            raise ValueError(f"register_op: {len(ops)} ops and {len(costs)} costs for {layer!r}")
        unknown = [op for op in ops if op not in GEMMS]
        if unknown:
            raise ValueError(f"register_op: ops must be among {GEMMS}, got {unknown}")
        return self._add(layer, kind, ops, costs, fixed)

    def resize(self, base: int, costs: list[tuple[int, int]]) -> None:
        """Set the per-row ``costs`` of the layer whose first sensor is ``base``, once its first
        forward shows its width (a softmax's rows, a ``ResidualAdd`` given no ``features``):
        the plan, made at the guard's second step, prices them."""
        count = self._bases.count(base)
        if self._bases[base] != base or len(costs) != count:
            raise ValueError(f"resize: {len(costs)} costs for the {count} sensors at {base}")
        self.costs[base : base + count] = [(float(c), float(o)) for c, o in costs]

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
        """Check exactly the sensors in ``active`` from now on, with fresh flags: the step's
        set, whose ops also run on the checked path (:meth:`runs_checked`) until :meth:`disarm`."""
        active = frozenset(active)
        self._set_active(active, kernels=active)
        self._confirming = False
        if self._slots is not None:
            self._slots.flags.zero_()
            self._slots.ratios.zero_()

    def stop_checking(self) -> None:
        """Check nothing from now on, but keep the step's kernels (:meth:`runs_checked`): the
        audit's replays of this step run here, unchecked and uncounted, with the very kernels
        the step's training ran, so their bits compare with the step's."""
        self._set_active(frozenset(), kernels=self._kernels)
        self._confirming = False

    def disarm(self) -> None:
        """Check nothing and run every layer's plain kernels (the step is over)."""
        self._set_active(frozenset(), kernels=frozenset())
        self._confirming = False

    def confirm_step(self) -> None:
        """Check again the sensors the step armed (every sensor that can have flagged), with the
        step's kernels and fresh flags, without counting or learning: a confirmation replay's
        reading, computed as the step computed."""
        self._set_active(self._kernels, kernels=self._kernels)
        self._confirming = True
        if self._slots is not None:
            self._slots.flags.zero_()
            self._slots.ratios.zero_()

    def _set_active(self, active: frozenset[int], *, kernels: frozenset[int]) -> None:
        self._active = active
        self.active_layers = frozenset(self._bases[i] for i in active)
        if kernels is not self._kernels:
            self._kernels = kernels
            self.checked_layers = frozenset(self._bases[i] for i in kernels)

    def runs_checked(self, index: int) -> bool:
        """Whether sensor ``index``'s op runs on its checked path now (a protected linear
        layer's GEMM: its fp32 result): the step's armed set, in training and in the step's
        replays alike (host-side, no sync). A superset of what :meth:`is_active` checks."""
        return index in self._kernels

    def is_active(self, index: int) -> bool:
        """Whether sensor ``index`` checks its GEMM now (host-side, no sync)."""
        return index in self._active

    # ------------------------------------------------------------------ the check
    def record(self, index: int, ratio: torch.Tensor) -> None:
        """Account one check's ratio (0-dim, on the op's device): flag it when above the
        threshold in force or not finite; while :attr:`learning`, keep the largest ratio that
        did not flag. No host synchronisation."""
        slots = self._ensure(ratio.device)
        value = ratio.detach().float().reshape(1)
        slot = slice(index, index + 1)
        slots.ratios[slot] = torch.maximum(
            slots.ratios[slot], torch.nan_to_num(value, nan=math.inf)
        )
        # `not (ratio <= threshold)` is true for NaN as well as for a ratio above the threshold.
        fired = ~(value <= slots.thresholds[slot])
        slots.flags[slot] = torch.maximum(slots.flags[slot], fired.to(torch.int64))
        if self._confirming:
            return  # a replay's reading teaches nothing and is no training check
        self.checks[index] += 1
        if self.learning:
            # A flagged ratio is a candidate, never a lesson (a NaN flags, so it is left out).
            healthy = torch.where(fired, torch.zeros_like(value), value)
            slots.learned[slot] = torch.maximum(slots.learned[slot], healthy)
            slots.healthy[slot] += (~fired).float()

    def take_flags(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The flags (int64) and largest ratios (fp32) since :meth:`arm`, one per sensor, on the
        device (copies), and stop checking (:meth:`stop_checking`: the step's kernels stay for
        its replays): what the guard reads once per step."""
        slots = self._ensure(self._device or torch.device("cpu"))
        flags, ratios = slots.flags.clone(), slots.ratios.clone()
        self.stop_checking()
        return flags, ratios

    def threshold_tensor(self) -> torch.Tensor:
        """Each sensor's threshold in force on the device (fp32): a copy."""
        return self._ensure(self._device or torch.device("cpu")).thresholds.clone()

    def thresholds(self) -> list[float | None]:
        """Each sensor's threshold in force (reads the device: for reports). Every sensor has
        one from its first check, so no entry is None (the type stays for callers of the
        observe-only warm-up this board had)."""
        slots = self._ensure(self._device or torch.device("cpu"))
        return [float(v) for v in slots.thresholds.cpu().tolist()]

    # ------------------------------------------------------------------ agreeing (no collectives here)
    def observations(self) -> torch.Tensor:
        """What this rank observed for the agreement: fp32 [2, n] on the board's device, the
        largest unflagged ratio of each sensor and how many unflagged checks it ran (the caller
        gathers every rank's and hands them to :meth:`agree`). A sensor that only flagged has
        observed nothing: it keeps its threshold."""
        slots = self._ensure(self._device or torch.device("cpu"))
        return torch.stack([slots.learned, slots.healthy])

    def agree(self, gathered: torch.Tensor) -> list[Outlier]:
        """Adopt the thresholds every rank's :meth:`observations` agree on and stop learning.

        ``gathered``: [ranks, 2, n], every rank's observations in DP-rank order (the same tensor
        on every rank, so every rank adopts the same thresholds). The step's readings so far are judged again against the agreed thresholds (so an
        outlier whose fault persists flags on this step). Returns the outliers: (rank, sensor)
        whose observed ratio is above the agreed threshold (:func:`agreed_thresholds`). Syncs
        the host once."""
        slots = self._ensure(self._device or torch.device("cpu"))
        gathered = gathered.to(slots.thresholds.device).float()
        if gathered.dim() != 3 or gathered.shape[1:] != (2, len(self.sensors)):
            raise ValueError(
                f"agree: expected [ranks, 2, {len(self.sensors)}] observations, "
                f"got {tuple(gathered.shape)}"
            )
        learned, observed = gathered[:, 0], gathered[:, 1]
        agreed = agreed_thresholds(learned, observed, slots.thresholds, self.config)
        slots.thresholds.copy_(agreed)
        self.learning = False
        fired = ~(slots.ratios <= slots.thresholds)
        slots.flags.copy_(torch.maximum(slots.flags, fired.to(torch.int64)))
        above = ((learned > agreed) & (observed > 0)).nonzero().tolist()
        table, limits = learned.cpu().tolist(), agreed.cpu().tolist()
        self.outliers = [
            Outlier(dp_rank=r, sensor=i, ratio=table[r][i], threshold=limits[i]) for r, i in above
        ]
        return self.outliers

    def agree_alone(self) -> list[Outlier]:
        """:meth:`agree` with no other rank (one process: benchmarks, tests, a single-GPU job);
        in a data-parallel job the guard agrees across the ranks instead."""
        return self.agree(self.observations().unsqueeze(0))

    def relax(self, index: int, reproduced: float) -> float:
        """Raise sensor ``index``'s threshold to ``SEPARATION x reproduced`` (a ratio a healthy
        GPU reproduced; above ``initial_threshold`` too when the data's tail is there), never
        below what is in force; returns the threshold now in force. Call it with the same value
        on every rank."""
        slots = self._ensure(self._device or torch.device("cpu"))
        current = float(slots.thresholds[index])
        if not math.isfinite(reproduced):
            return current
        raised = max(current, SEPARATION * reproduced)
        if raised > current:
            slots.thresholds[index] = raised
            self.relaxed += 1
        return raised

    def _ensure(self, device: torch.device) -> _Slots:
        if self._device == device and self._slots is not None:
            return self._slots
        n = len(self.sensors)
        old = self._slots
        slots = _Slots(
            flags=torch.zeros(n, dtype=torch.int64, device=device),
            ratios=torch.zeros(n, dtype=torch.float32, device=device),
            learned=torch.zeros(n, dtype=torch.float32, device=device),
            healthy=torch.zeros(n, dtype=torch.float32, device=device),
            thresholds=torch.full(
                (n,), float(self.config.initial_threshold), dtype=torch.float32, device=device
            ),
        )
        if old is not None:
            # Moved (model.to(device)) or grown: keep what the sensors learned and agreed.
            for new, previous in zip(slots.tensors(), old.tensors(), strict=True):
                count = min(n, previous.numel())
                new[:count] = previous[:count].to(device)
        self._slots = slots
        self._device = device
        return slots


@dataclass(slots=True)
class _Slots:
    """The board's per-sensor device tensors, allocated together (one entry per sensor)."""

    flags: torch.Tensor  # int64 [n]: fired since the last take
    ratios: torch.Tensor  # fp32 [n]: largest ratio since the last take
    learned: torch.Tensor  # fp32 [n]: largest unflagged ratio observed
    healthy: torch.Tensor  # fp32 [n]: unflagged checks observed
    thresholds: torch.Tensor  # fp32 [n]: in force, the same everywhere

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.flags, self.ratios, self.learned, self.healthy, self.thresholds)

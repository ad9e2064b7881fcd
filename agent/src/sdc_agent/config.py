"""One configuration tree for the guard, one dataclass per component (torchtitan's manner):
``GuardConfig(audit=, weights=, sensors=, training=, report=)``.

    import sdc_agent as sdc
    config = sdc.GuardConfig(
        audit=sdc.AuditConfig(every=50, peer_offset=8),
        weights=sdc.WeightsConfig(every=200),
        sensors=sdc.SensorsConfig(budget=0.02),
        training=sdc.TrainingConfig(grad_accum=4, max_grad_norm=1.0),
        report=sdc.ReportConfig(workload=True),
    )
    guard = sdc.Guard(model, optimizer, ..., config=config)

The flat :class:`~sdc_agent.schedule.Schedule` (and the sensors' thresholds,
:class:`~sdc_agent.sensors.SensorConfig`) are still accepted, by their names and keywords:
``Guard(schedule=...)`` is mapped onto this tree (:meth:`GuardConfig.from_schedule`), and the
checks read the flat view (:meth:`GuardConfig.schedule`). :data:`FIELDS` is the one table of
which tree field is which ``Schedule`` field; each component is validated by ``Schedule``'s own
rules, with its errors naming the tree's field (``GuardConfig.audit.every must be ...``).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from .schedule import Schedule
from .sensors.runtime.board import SensorConfig

FIELDS: dict[str, dict[str, str]] = {
    "audit": {
        "every": "audit_every",
        "deterministic": "deterministic_audits",
        "peer_offset": "peer_offset",
        "on_setup_error": "on_setup_error",
        "max_skipped": "max_skipped_audits",
    },
    "weights": {
        "every": "check_every",
        "on_checkpoint": "check_on_checkpoint",
        "on_start": "check_on_start",
    },
    "sensors": {
        "enabled": "sensors",
        "budget": "sensor_budget",
        "burn_in": "sensor_burn_in",
    },
    "training": {
        "grad_accum": "grad_accum",
        "max_grad_norm": "max_grad_norm",
        "ckpt_every": "ckpt_every",
        "skip_on_device": "skip_on_device",
    },
}
"""Per component, each of its fields and the ``Schedule`` field it is."""


def _validate(component: str, values: dict[str, Any]) -> None:
    """Validate one component's ``values`` by ``Schedule``'s rules; an error names the tree's
    field (``GuardConfig.<component>.<field>``) instead of the flat one."""
    names = FIELDS[component]
    try:
        Schedule(**{names[name]: value for name, value in values.items()})
    except ValueError as exc:
        message = str(exc)
        for name, flat in names.items():
            message = re.sub(rf"\bSchedule\.{flat}\b", f"GuardConfig.{component}.{name}", message)
        raise ValueError(message) from None


def _values(component: Any) -> dict[str, Any]:
    """A component's fields (not the sensors' thresholds) by name."""
    return {
        f.name: getattr(component, f.name)
        for f in dataclasses.fields(component)
        if f.name in FIELDS[component.component]
    }


@dataclass(kw_only=True, frozen=True)
class AuditConfig:
    """Check 2, the ring replay audit (``Schedule``'s audit fields, :data:`FIELDS`)."""

    component = "audit"
    every: int = 100
    """Audit the steps where ``step % every == 0``; 0 disables audits."""
    deterministic: bool = True
    """Run audit steps with deterministic kernels, so gradient fingerprints compare bit for bit."""
    peer_offset: int = 8
    """DP rank r replays rank ``(r + peer_offset) % world``: one node's worth of GPUs puts the
    replayer on another node."""
    on_setup_error: Literal["disable_audits", "stop"] = "disable_audits"
    """What a set-up finding (the job's set-up wrong, not a GPU) does: turn the audits off and
    train on, or raise ``sdc_agent.AuditSetupError`` on every rank."""
    max_skipped: int = 1
    """Audits in a row whose replays may raise (each skipped and counted) before the next one is
    a set-up finding."""

    def __post_init__(self) -> None:
        _validate(self.component, _values(self))


@dataclass(kw_only=True, frozen=True)
class WeightsConfig:
    """Check 3, weight fingerprints across replicas."""

    component = "weights"
    every: int = 100
    """Compare the replicas' weights after every ``every``-th update; 0: never."""
    on_checkpoint: bool = True
    """Compare before every checkpoint, and refuse the save when they differ."""
    on_start: bool = True
    """Compare once before the first step (catches a bad checkpoint load)."""

    def __post_init__(self) -> None:
        _validate(self.component, _values(self))


@dataclass(kw_only=True, frozen=True)
class SensorsConfig:
    """The online sensors of protected layers (``sdc_agent.protect``)."""

    component = "sensors"
    enabled: bool = True
    """Check the protected layers' GEMMs online; no effect on a model without protected layers."""
    budget: float = 0.01
    """Sensor checks per step as a fraction of the protected GEMMs' compute (estimated);
    ``math.inf``: every GEMM on every step."""
    burn_in: int = 20
    """Steps at the start on which every sensor checks whatever the budget says; 0: none."""
    thresholds: SensorConfig | None = None
    """The sensors' thresholds (:class:`~sdc_agent.sensors.SensorConfig`); None: those given to
    ``sdc_agent.protect`` (its defaults unless it was given some)."""

    def __post_init__(self) -> None:
        _validate(self.component, _values(self))
        if self.thresholds is not None and not isinstance(self.thresholds, SensorConfig):
            raise TypeError(
                "GuardConfig.sensors.thresholds must be a sdc_agent.sensors.SensorConfig or "
                f"None, got {type(self.thresholds).__name__}"
            )


@dataclass(kw_only=True, frozen=True)
class TrainingConfig:
    """How the loop trains, as the checks must know it."""

    component = "training"
    grad_accum: int = 1
    """Micro-batches per step; ``rebuild_batch(step, rank)`` then returns the step's sequence."""
    max_grad_norm: float | None = None
    """Clip the reduced gradient to this total L2 norm; None: measure it without clipping."""
    ckpt_every: int = 0
    """A checkpoint is due after step s's update when ``(s + 1) % ckpt_every == 0``; 0: never."""
    skip_on_device: bool = True
    """Let an optimizer that can skip a step on the device (a fused ``torch.optim.Adam``/
    ``AdamW``, no GradScaler) skip a common step whose gradient is bad, the verdict read at the
    next agreement point (no host sync on a healthy step); False: read every step's flags on
    the host before the update."""

    def __post_init__(self) -> None:
        _validate(self.component, _values(self))


@dataclass(kw_only=True, frozen=True)
class ReportConfig:
    """What the alarm report carries besides the verdict (no ``Schedule`` field: it changes no
    check)."""

    component = "report"
    workload: bool = True
    """Record the job's op shapes (GEMMs, attention, norms) on the first forward pass for the
    alarm report's ``workload``, which a node screen then runs (``sdc_agent.workload``,
    docs/usage/screen.md); its hooks are removed after that forward. False: record nothing (the
    report then has no ``workload``, and a screen runs its fixed suite only)."""

    def __post_init__(self) -> None:
        if not isinstance(self.workload, bool):
            raise TypeError(
                f"GuardConfig.report.workload must be True or False, got {self.workload!r}"
            )


_COMPONENTS: dict[str, type] = {
    "audit": AuditConfig,
    "weights": WeightsConfig,
    "sensors": SensorsConfig,
    "training": TrainingConfig,
    "report": ReportConfig,
}


@dataclass(kw_only=True, frozen=True)
class GuardConfig:
    """Everything the guard is configured by, one component per check (see the module
    docstring); validated on construction, with errors naming the field."""

    audit: AuditConfig = field(default_factory=AuditConfig)
    weights: WeightsConfig = field(default_factory=WeightsConfig)
    sensors: SensorsConfig = field(default_factory=SensorsConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    report: ReportConfig = field(default_factory=ReportConfig)

    def __post_init__(self) -> None:
        for name, kind in _COMPONENTS.items():
            value = getattr(self, name)
            if not isinstance(value, kind):
                raise TypeError(
                    f"GuardConfig.{name} must be a sdc_agent.{kind.__name__}, got "
                    f"{type(value).__name__}"
                )

    def schedule(self) -> Schedule:
        """The flat view the checks read (``Schedule``'s fields, :data:`FIELDS`)."""
        flat: dict[str, Any] = {}
        for name, names in FIELDS.items():
            component = getattr(self, name)
            flat.update({names[key]: value for key, value in _values(component).items()})
        return Schedule(**flat)

    @classmethod
    def from_schedule(
        cls, schedule: Schedule, *, thresholds: SensorConfig | None = None
    ) -> GuardConfig:
        """The tree for a flat ``schedule`` (and the sensors' ``thresholds``, if any)."""
        if not isinstance(schedule, Schedule):
            raise TypeError(f"schedule must be a sdc_agent.Schedule, got {type(schedule).__name__}")
        parts: dict[str, Any] = {}
        for name, names in FIELDS.items():
            values = {key: getattr(schedule, flat) for key, flat in names.items()}
            if name == "sensors":
                values["thresholds"] = thresholds
            parts[name] = _COMPONENTS[name](**values)
        return cls(**parts)

"""When each check runs: the schedule of audits, weight checks and checkpoints."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

SETUP_ERROR_POLICIES = ("disable_audits", "stop")


@dataclass(kw_only=True, frozen=True)
class Schedule:
    """How often the guard runs each check; validated on construction."""

    audit_every: int = 100
    """Run a ring replay audit on steps where ``step % audit_every == 0``; 0 disables audits."""
    deterministic_audits: bool = True
    """Run audit steps with deterministic kernels so gradient fingerprints compare bit for bit."""
    check_every: int = 100
    """Compare weight fingerprints across replicas after every ``check_every``-th update; 0: never."""
    ckpt_every: int = 0
    """A checkpoint is due after the update of step s when ``(s + 1) % ckpt_every == 0``; 0: never."""
    peer_offset: int = 8
    """DP rank r replays the micro-batch of rank ``(r + peer_offset) % world``; one node's worth of
    GPUs puts the replayer on another node."""
    check_on_checkpoint: bool = True
    """Force a weight check before every checkpoint, and refuse the save when it fails."""
    check_on_start: bool = True
    """Compare weight fingerprints once before the first step (catches a bad checkpoint load)."""
    max_grad_norm: float | None = None
    """Clip the reduced gradient to this total L2 norm; None: measure the norm without clipping."""
    grad_accum: int = 1
    """Micro-batches per step (gradient accumulation): each step's batch is a sequence of this
    many micro-batches, and ``rebuild_batch(step, rank)`` returns that same sequence."""
    skip_on_device: bool = True
    """Where the optimizer can skip a step on the device (a fused ``torch.optim.Adam``/``AdamW``,
    without a GradScaler), let it skip a common step whose gradient is bad, with the verdict
    read at the next agreement point: no host sync on a healthy step (docs/usage/checks.md).
    False: the host reads every step's flags before the update, as with any other optimizer."""
    # Sensors (issue 17): only models with protected layers (sdc_agent.sensors.protect) have any,
    # so the default changes nothing for a model that was not protected.
    sensors: bool = True
    """Check the GEMMs of protected linear layers (``sdc_agent.sensors.protect``) online; no
    effect on a model without them. False: protected layers compute but never check."""
    sensor_budget: float = 0.01
    """Sensor checks per step, as a fraction of the protected GEMMs' compute (estimated; see
    :mod:`sdc_agent.sensors.runtime.plan`); the GEMMs checked rotate so every one is checked within a
    bounded number of steps. ``math.inf``: every GEMM on every step."""
    sensor_burn_in: int = 20
    """Steps at the start of the guard's run (from its first step) on which every sensor checks
    on every step whatever ``sensor_budget`` says, so that hardware bad from the start is named
    within them; then the budget's rotation. 0: none."""

    on_setup_error: Literal["disable_audits", "stop"] = "disable_audits"
    """What the guard does when the replay audit finds the job's set-up wrong rather than a GPU
    (a ``rebuild_batch`` that returns another batch or keeps raising, a ``compute_loss`` that
    ignores its model, kernels that give two results for one batch): ``disable_audits`` reports
    it (naming nobody), turns the audits and their confirmations off and trains on, with
    ``coverage()`` saying why; ``stop`` reports it and raises ``sdc_agent.AuditSetupError`` on
    every rank. Either way no GPU is named and nothing is cordoned."""
    max_skipped_audits: int = 1
    """Audits in a row that may be skipped because a replay raised (each logged, counted as
    ``sdc_audit_skipped`` and applied unaudited) before the next one is a set-up finding
    (``on_setup_error``); 0: the first replay that raises is one."""

    def __post_init__(self) -> None:
        for name in ("audit_every", "check_every", "ckpt_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(
                    f"Schedule.{name} must be an integer >= 0 (0 disables), got {value!r}"
                )
        if not isinstance(self.peer_offset, int) or self.peer_offset < 1:
            raise ValueError(
                f"Schedule.peer_offset must be an integer >= 1, got {self.peer_offset!r}"
            )
        if (
            not isinstance(self.grad_accum, int)
            or isinstance(self.grad_accum, bool)
            or self.grad_accum < 1
        ):
            raise ValueError(
                f"Schedule.grad_accum must be an integer >= 1 (1: no accumulation), "
                f"got {self.grad_accum!r}"
            )
        if not isinstance(self.sensors, bool):
            raise ValueError(f"Schedule.sensors must be True or False, got {self.sensors!r}")
        budget = self.sensor_budget
        if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget > 0:
            raise ValueError(
                f"Schedule.sensor_budget must be a number > 0 (math.inf: check every GEMM on "
                f"every step), got {budget!r}"
            )
        if math.isnan(budget):
            raise ValueError(f"Schedule.sensor_budget must be a number > 0, got {budget!r}")
        burn_in = self.sensor_burn_in
        if not isinstance(burn_in, int) or isinstance(burn_in, bool) or burn_in < 0:
            raise ValueError(
                f"Schedule.sensor_burn_in must be an integer >= 0 (steps on which every sensor "
                f"checks at the start; 0: none), got {burn_in!r}"
            )
        if self.on_setup_error not in SETUP_ERROR_POLICIES:
            raise ValueError(
                f"Schedule.on_setup_error must be one of {', '.join(SETUP_ERROR_POLICIES)}, "
                f"got {self.on_setup_error!r}"
            )
        skips = self.max_skipped_audits
        if not isinstance(skips, int) or isinstance(skips, bool) or skips < 0:
            raise ValueError(f"Schedule.max_skipped_audits must be an integer >= 0, got {skips!r}")
        if not isinstance(self.skip_on_device, bool):
            raise ValueError(
                f"Schedule.skip_on_device must be True or False, got {self.skip_on_device!r}"
            )
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(
                f"Schedule.max_grad_norm must be a positive number or None, got {self.max_grad_norm!r}"
            )

    def is_audit_step(self, step: int) -> bool:
        """True when ``step`` runs the ring replay audit (decided before its forward pass)."""
        return self.audit_every > 0 and step % self.audit_every == 0

    def audited_micro_batch(self, step: int) -> int:
        """Which micro-batch position (0..grad_accum-1) the audit of ``step`` replays.

        Rotates with the audit's index (``step // audit_every``), so every position is audited
        within ``grad_accum`` consecutive audits; a pure function of the step, the same on
        every rank."""
        if self.audit_every == 0:
            return 0
        return (step // self.audit_every) % self.grad_accum

    def is_checkpoint_step(self, step: int) -> bool:
        """True when a checkpoint is due after the update of ``step``."""
        return self.ckpt_every > 0 and (step + 1) % self.ckpt_every == 0

    def is_weight_check_step(self, step: int) -> bool:
        """True when the weight fingerprints are compared after the update of ``step``."""
        periodic = self.check_every > 0 and (step + 1) % self.check_every == 0
        return periodic or (self.check_on_checkpoint and self.is_checkpoint_step(step))

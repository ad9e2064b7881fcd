"""When each check runs: the schedule of audits, weight checks and checkpoints."""

from __future__ import annotations

from dataclasses import dataclass


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

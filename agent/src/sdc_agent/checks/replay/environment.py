"""The RNG and kernel state of an audited step, so that another GPU can recompute it exactly.

An audited (or seeded) step's computation is seeded from (step, rank[, micro-batch]) instead of
the job's RNG stream (:func:`step_seed`: anyone can recreate it), and runs with deterministic
kernels; :class:`StepEnvironment` remembers what it changed and puts it back, so the job's own
RNG stream and kernel flags continue as if nothing had happened.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.utils.deterministic

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """One round of splitmix64: decorrelates nearby (step, rank) pairs."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def step_seed(step: int, rank: int, base: int = 0) -> int:
    """The RNG seed of ``rank``'s computation on an audited ``step``: anyone can recreate it."""
    return _splitmix64(_splitmix64(base ^ step) ^ rank) >> 1  # manual_seed takes < 2**63


@dataclass
class RngState:
    """The CPU generator and the current CUDA device's generator."""

    cpu: torch.Tensor
    cuda: torch.Tensor | None

    @classmethod
    def capture(cls) -> RngState:
        """Save the generators' state."""
        cuda = torch.cuda.get_rng_state() if torch.cuda.is_initialized() else None
        return cls(cpu=torch.get_rng_state(), cuda=cuda)

    def restore(self) -> None:
        """Put the generators back to the captured state."""
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state(self.cuda)


def seed_all(seed: int) -> None:
    """Seed the CPU generator and the current CUDA device's generator."""
    torch.manual_seed(seed)


@dataclass
class DeterminismState:
    """Global kernel-selection flags that decide whether a recomputation is bit-reproducible."""

    deterministic: bool
    warn_only: bool
    cudnn_benchmark: bool
    fill_uninitialized_memory: bool = True

    @classmethod
    def capture(cls) -> DeterminismState:
        """Save the current flags."""
        return cls(
            deterministic=torch.are_deterministic_algorithms_enabled(),
            warn_only=torch.is_deterministic_algorithms_warn_only_enabled(),
            cudnn_benchmark=torch.backends.cudnn.benchmark,
            fill_uninitialized_memory=torch.utils.deterministic.fill_uninitialized_memory,  # type: ignore[attr-defined]  # torch makes it a property of the module's class at runtime
        )

    @staticmethod
    def enforce() -> None:
        """Deterministic kernels, and no per-GPU autotuning (two GPUs could pick two kernels).

        ``warn_only``: an op without a deterministic kernel (``histc``/``bincount`` in an MoE
        router, ``index_add_`` on CUDA) warns instead of raising into the user's training step;
        the audit's replays record the warning (:func:`nondeterministic_alerts`) and the first
        audit's self-replays decide whether the results still compare bit for bit. Uninitialised
        memory is not NaN-filled: the fill costs a pass over every ``torch.empty`` on an audit
        step and decides nothing the comparison needs."""
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]  # torch makes it a property of the module's class at runtime
        torch.backends.cudnn.benchmark = False

    def restore(self) -> None:
        """Put the flags back as they were captured."""
        torch.use_deterministic_algorithms(self.deterministic, warn_only=self.warn_only)
        torch.utils.deterministic.fill_uninitialized_memory = self.fill_uninitialized_memory  # type: ignore[attr-defined]  # torch makes it a property of the module's class at runtime
        torch.backends.cudnn.benchmark = self.cudnn_benchmark


@dataclass
class StepEnvironment:
    """What an audit step changed before its forward pass (RNG, kernel flags), to put back."""

    rng: RngState | None = None
    kernels: DeterminismState | None = None

    @classmethod
    def enter(cls, *, seed: int, deterministic: bool) -> StepEnvironment:
        """Seed the RNG with ``seed`` (and select deterministic kernels); remember what was."""
        env = cls(rng=RngState.capture())
        seed_all(seed)
        if deterministic:
            env.kernels = DeterminismState.capture()
            DeterminismState.enforce()
        return env

    def restore(self) -> None:
        """Put the kernel flags and the RNG back (idempotent)."""
        if self.kernels is not None:
            self.kernels.restore()
            self.kernels = None
        if self.rng is not None:
            self.rng.restore()
            self.rng = None


@contextlib.contextmanager
def deterministic_kernels(enabled: bool) -> Iterator[None]:
    """Run the block with deterministic kernels when ``enabled``; restore the flags after."""
    if not enabled:
        yield
        return
    saved = DeterminismState.capture()
    DeterminismState.enforce()
    try:
        yield
    finally:
        saved.restore()


_NONDETERMINISTIC_ALERT = "does not have a deterministic implementation"
"""What torch's alert says (``torch._C._alert_not_deterministic``) under ``warn_only``."""


@contextlib.contextmanager
def nondeterministic_alerts(enabled: bool) -> Iterator[list[str]]:
    """Collect, inside the block, the ops deterministic mode warned have no deterministic
    kernel (their names, as torch's alert gives them); every other warning is shown as usual
    after the block. Does nothing unless ``enabled``."""
    alerts: list[str] = []
    if not enabled:
        yield alerts
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield alerts
    for w in caught:
        text = str(w.message)
        if _NONDETERMINISTIC_ALERT in text:
            alerts.append(text.split(" does not have", 1)[0].strip())
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)

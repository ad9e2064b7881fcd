"""The questions each check asks about how the model is parallelised, as one typed protocol.

The checks never branch on the wrapper: they ask a :class:`ParallelAdapter` (``sdc_agent.parallel``
has one per wrapper and :func:`sdc_agent.parallel.adapter_for` picks it), and the answers are
what differs between DDP, FSDP2 and HSDP. The package docstring says how tensor and pipeline
parallelism answer the same questions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
import torch.distributed as dist
from torch import nn

from ..checks.gradients.stats import GradStatsState
from ..checks.replay.audit import RebuildBatch, RingAudit, ring_audit_type
from ..checks.replay.layout import ReplayLayout
from ..checks.replay.replayer import ComputeLoss, Replayer
from ..coverage import LayoutFacts
from ..reporting import Reporter


@dataclass(frozen=True)
class WeightReplicas:
    """What check 3 compares on this rank: the weights as it holds them, and which ranks hold
    copies of the same bits (the same on every rank but for the groups, which are this rank's)."""

    named_weights: list[tuple[str, torch.Tensor]]
    """Every parameter by name; when :attr:`sharded`, DTensors whose local shard this rank holds."""
    sharded: bool
    """Whether each rank holds only a shard of each weight (then each shard is compared across
    its replicas, and the shards' verdicts are combined)."""
    replica_group: dist.ProcessGroup | None
    """The ranks holding a copy of what this rank holds (None: WORLD): compared with each other."""
    shard_group: dist.ProcessGroup | None
    """The ranks holding the other shards of this rank's replica (None when not sharded): they
    agree on one verdict."""
    group: dist.ProcessGroup | None
    """Every rank compared (None: WORLD): the tables are gathered over it when copies differ."""
    replicas_of_shard: tuple[tuple[int, ...], ...]
    """Per shard (one when not sharded): the global ranks holding a copy of it, by replica."""
    collective_device: torch.device
    """Where tensors for the comparison's collectives must live."""
    names_of_shard: tuple[tuple[str, ...], ...] | None = None
    """Per shard: the names of the weights its copies hold, when shards hold different weights
    (the stages of a pipeline); None: every shard holds :attr:`named_weights`' names."""

    @property
    def replicas(self) -> int:
        """Copies of each shard (of the whole weights when not sharded)."""
        return len(self.replicas_of_shard[0])

    @property
    def shards(self) -> int:
        """Shards each weight is split into (1 when not sharded)."""
        return len(self.replicas_of_shard)

    @property
    def ranks(self) -> int:
        """Every rank compared: replicas x shards (the size of :attr:`group`)."""
        return self.replicas * self.shards


class StepRunner(Protocol):
    """What an adapter's :meth:`ParallelAdapter.run_step` drives: one guarded step
    (:class:`sdc_agent.GuardedStep` is one)."""

    grad_accum: int
    """Micro-batches in the step."""

    @property
    def scaled(self) -> bool:
        """Whether a GradScaler scales each micro-batch's loss."""
        ...

    def micro_batches(self, micros: Iterable[Any]) -> Iterator[Any]:
        """Yield the step's micro-batches, each inside its micro-batch context."""
        ...

    def backward(self, loss: torch.Tensor) -> None:
        """Back-propagate one micro-batch's loss (its share, scaled)."""
        ...

    def run_pipeline(self, feed: Any) -> list[torch.Tensor]:
        """Run one step of a pipeline schedule with this rank's ``feed``."""
        ...


@runtime_checkable
class ParallelAdapter(ReplayLayout, Protocol):
    """The guard's view of one parallelised model: who trains on which micro-batch, and, per
    check, where its data is and who compares with whom.

    Ranks are counted in the data-parallel dimension (DP ranks: the replicas that each train on
    their own micro-batch and replay each other's), numbered 0..world-1;
    :meth:`global_rank` maps them to global ranks.
    """

    # ------------------------------------------------------------------ the job
    # (the model, the ranks, the group and devices, the rings: ReplayLayout's members)
    params: list[nn.Parameter]
    """The trainable parameters, in the order of every fingerprint table."""
    named_weights: list[tuple[str, nn.Parameter]]
    """Every parameter by name."""

    def coverage_facts(self) -> LayoutFacts:
        """What the layout lets check 3 see, for ``Guard.coverage()``."""
        ...

    def pipeline_facts(self) -> dict[str, Any] | None:
        """The pipeline's shape for ``Guard.coverage()`` (None: no pipeline drives the model)."""
        return None

    # ------------------------------------------------------------------ the step
    schedule_runs_backward: bool = False
    """A schedule of the layout's own runs each micro-batch's forward and backward (a pipeline
    schedule's ``step``): the guard never calls ``compute_loss`` or ``backward``, each step is
    :meth:`StepRunner.run_pipeline`, and the loss is the schedule's."""
    steps_judged_together: bool = False
    """Every rank waits for each step's flags and judges a flagged step with the others,
    whatever the scaler (a pipeline's stages update together or not at all: a NaN sent back to
    one stage reaches neither the later stages nor their replicas)."""
    sensors_unsupported: str | None = None
    """Why online sensors cannot run on this layout (None: they can)."""

    def run_step(
        self, step: StepRunner, batch: Any, compute_loss: ComputeLoss | None
    ) -> torch.Tensor | None:
        """Run one training step's forward and backward on ``batch`` (one item of
        ``Guard.train``'s batches) through ``step``. Returns the step's loss when it was
        back-propagated here directly (no accumulation, no scaler), else None (``step``
        recorded it)."""
        if compute_loss is None:
            raise TypeError("Guard needs a callable compute_loss(model, batch) for this model")
        if step.grad_accum == 1 and not step.scaled:
            loss = compute_loss(self.model, batch)
            loss.backward()
            return loss
        micros = batch if step.grad_accum > 1 else [batch]
        for micro in step.micro_batches(micros):
            step.backward(compute_loss(self.model, micro))
        return None

    # ------------------------------------------------------------------ check 1
    unscale_is_collective: bool
    """Whether ``GradScaler.unscale_`` (and so ``scaler.step``) is a collective, so that every
    rank must decide every step together (an inf on one rank skips the step on all)."""

    taps_see_each_micro_batch: bool = False
    """Whether the local taps see each micro-batch's own gradient (a pipeline step's starts
    from none), so that an audited step captures its fingerprints there even with
    accumulation; else they see the accumulated one, and the audit isolates the audited
    micro-batch's instead."""

    def install_gradient_taps(self, stats: GradStatsState) -> None:
        """Install check 1's taps: they record into ``stats`` each rank's LOCAL gradient before
        any reduction mixes it (non-finite flags; fingerprints on audit steps) and the REDUCED
        gradient after it (its sums). Called once, when the guard is built."""
        ...

    def no_sync(self) -> AbstractContextManager[None]:
        """Accumulate gradients locally: backward passes inside reduce nothing (and check 1's
        taps record no step entry: the synchronising micro-batch's does)."""
        ...

    # ------------------------------------------------------------------ check 2

    def make_replayer(
        self,
        compute_loss: ComputeLoss,
        stats: GradStatsState,
        *,
        grad_accum: int = 1,
        scaler: torch.amp.GradScaler | None = None,
        divide_loss: bool = True,
    ) -> Replayer:
        """The replay unit: recomputes one rank's micro-batch and reduces this rank's LOCAL
        results (loss bits, per-parameter gradient fingerprints in the rows of ``stats``) to an
        outcome comparable bit for bit with the audited training step's; ``grad_accum``,
        ``scaler`` and ``divide_loss`` say how training back-propagated each micro-batch's
        loss."""
        ...

    def run_pipeline_step(self, feed: Any, *, reduce: bool = True) -> list[torch.Tensor]:
        """Run the pipeline schedule's ``step`` with this rank's ``feed`` (``reduce``: reduce
        the stage's gradient at the end, as training does); only a layout whose
        :attr:`schedule_runs_backward` has one."""
        del feed, reduce
        raise RuntimeError("sdc_agent: no pipeline schedule drives this model")

    def make_audit(
        self,
        replayer: Replayer,
        rebuild_batch: RebuildBatch,
        reporter: Reporter,
        **options: Any,
    ) -> RingAudit:
        """Check 2 for this layout's replay unit, over ``replayer``: each rank replaying alone,
        or every rank in lockstep (:func:`~sdc_agent.checks.replay.audit.ring_audit_type`);
        ``options`` are :class:`~sdc_agent.checks.replay.audit.RingAudit`'s keywords."""
        return ring_audit_type(self)(self, replayer, rebuild_batch, reporter, **options)

    # ------------------------------------------------------------------ check 3
    @property
    def weight_redundancy(self) -> bool:
        """Whether some weight has a second copy to compare (check 3 can run at all)."""
        ...

    def weight_replicas(self) -> WeightReplicas:
        """What check 3 compares: this rank's copy of the weights and who holds the same bits."""
        ...

    # ------------------------------------------------------------------ fault drills
    def with_autograd_parameter(self, name: str, use: Callable[[nn.Parameter], None]) -> None:
        """Call ``use`` with the tensor autograd computes ``name``'s local gradient for (now, or
        once it exists)."""
        ...

    def local_weight(self, name: str) -> torch.Tensor:
        """This rank's copy (or shard) of parameter ``name``; writing to it changes the weights."""
        ...

"""The guard's view of a pipeline-parallel job (``torch.distributed.pipelining``) whose stages are
sharded with FSDP2 (full sharding or HSDP) over the data-parallel dimension.

Each rank holds one stage (a ``PipelineStage`` driven by a single-stage schedule:
``ScheduleGPipe``, ``Schedule1F1B``); the ranks holding stages 0..P-1 of one pipeline form a
REPLICA, which trains on its own batch; the stage's FSDP2 mesh joins the ranks of the same stage
across replicas. The guard learns both from the job: the pipeline from the schedule (its stage,
its process group), the data-parallel layout from the stage's parameters (as
:class:`~.fsdp.FSDP2Adapter` does, over the ranks of one stage), and the grid of replicas x
pipeline coordinates from one all-gather at construction.

What each check asks (:class:`~.adapter.ParallelAdapter`), answered for a pipeline:

* The step is the schedule's ``step`` (:meth:`PipelineAdapter.run_pipeline_step`), fed by each
  rank with what its stage needs: the first stage's inputs, the last stage's targets; the loss
  is the schedule's ``loss_fn``, on the last stage. ``rebuild_batch(step, rank)`` returns what
  global ``rank`` fed. The schedule's micro-batches are the pipeline's own; the guard's
  ``grad_accum`` counts pipeline steps per optimizer step (each reduces its gradient, as the
  schedule does: build it with ``scale_grads=False`` and scale the loss yourself).
* Check 1: each rank's local gradient is its stage's, on FSDP2's unsharded parameters before
  the data-parallel reduction (the taps of :mod:`sdc_agent.checks.gradients.taps`, every
  micro-batch of the pipeline step checked), the reduced one its shard after it; the flags are
  reduced over the whole world, one tiny all-reduce per step. A non-finite value is pinned to
  the stage where it started (:class:`~sdc_agent.checks.replay.pipeline.PipelineOrigin`): a
  stage that received finite values and produced a non-finite one, not the stages it flowed to.
* Check 2: a replay is a whole pipeline step: every replica replays another replica's step at
  once, its stages exchanging activations and gradients as in training, with the data-parallel
  reduction off (:class:`~sdc_agent.checks.replay.pipeline.PipelineReplayer`). Each rank's
  LOCAL work (what its stage received, sent, sent back, and its local gradients) is compared
  with the same pipeline coordinate of the replica it replayed, and the earliest local
  divergence names one GPU (:mod:`sdc_agent.checks.replay.pipeline_audit`).
* Check 3: each stage's shards compared across the replicas holding copies of them, at the same
  (pipeline, shard) coordinate (HSDP's ``replicate`` dimension); full sharding keeps one copy.

Tensor parallelism inside a stage (TP x PP x FSDP2 / HSDP, torchtitan's 3-D layout with the TP
group inside a node): the stage's parameters then live on a mesh with a ``tp`` dimension, and
the stage's view is :class:`~.tp.TensorParallelAdapter`'s. Each TP rank's pipeline is one of the
rings' pipelines (``peer_offset`` counts pipelines: a multiple of the TP degree, so each TP group
replays another group's stage, slice by slice, on another node, which the placement check
requires of every stage's ring), a TP group draws one RNG stream, and check 3 compares each
(stage, shard, tp) slice across its replicas. Check 2 compares the per-stage records above and,
inside each stage, the TP adapter's ordered local results (its probes run in the audited pipeline
step and in its replay alike): a forward fault in one rank's TP slice, which the TP all-reduce
carries to its partners before the stage sends it, makes every rank of the stage's TP group
diverge locally, and the pairs whose ordered local results diverged first name the one GPU
(:func:`~sdc_agent.checks.replay.pipeline.earliest_in_stages`). ``compute_groups`` holds every
stage's TP groups, gathered at construction, so every rank reaches the same verdict.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining.schedules import PipelineScheduleMulti, PipelineScheduleSingle

from ..checks.gradients.stats import GradStatsState
from ..checks.gradients.taps import ShardedGradientTaps
from ..checks.replay.audit import RebuildBatch, RingAudit
from ..checks.replay.pipeline import (
    PipelineOrigin,
    PipelineRecorder,
    PipelineReplayer,
    tensors_in,
)
from ..checks.replay.pipeline_audit import PipelineRingAudit
from ..checks.replay.replayer import ComputeLoss, Replayer
from ..coverage import LayoutFacts
from ..reporting import Reporter
from ..topology import all_gather_text, collective_device
from .adapter import ParallelAdapter, StepRunner, WeightReplicas
from .fsdp import FSDP2Adapter, ShardingLayoutError, is_fsdp2
from .mesh import ShardedLayout, learn_layout
from .tp import TensorParallelAdapter

logger = logging.getLogger("sdc_agent")

SUPPORTED_SCHEDULES = "single-stage schedules (ScheduleGPipe, Schedule1F1B)"


def check_pipeline_options(
    pipeline: Any, compute_loss: ComputeLoss | None, scaler: Any, grad_accum: int
) -> None:
    """Refuse what a pipeline-driven guard cannot honour (before any collective: every rank
    refuses alike)."""
    if compute_loss is not None:
        raise TypeError(
            "sdc_agent.Guard: with a pipeline the loss is the schedule's loss_fn (on the last "
            "stage); leave compute_loss out"
        )
    if scaler is not None:
        raise ValueError(
            "sdc_agent.Guard: a GradScaler with a pipeline schedule is not supported (the loss "
            "is scaled inside the schedule, out of the guard's reach); train in bf16 or fp32"
        )
    if grad_accum > 1 and getattr(pipeline, "scale_grads", False):
        raise ValueError(
            f"sdc_agent.Guard: Schedule.grad_accum={grad_accum} runs that many pipeline "
            "steps per optimizer step, and a schedule built with scale_grads=True divides the "
            "accumulated gradient by its micro-batches at every one of them; build it with "
            "scale_grads=False and scale the loss in loss_fn"
        )


def _schedule_stage(schedule: Any) -> Any:
    """The one stage a single-stage schedule drives on this rank; raises for anything else."""
    if isinstance(schedule, PipelineScheduleMulti):
        raise ShardingLayoutError(
            f"sdc_agent.Guard: {type(schedule).__name__} drives several stages per rank; the "
            f"guard supports {SUPPORTED_SCHEDULES}, one stage per rank"
        )
    if not isinstance(schedule, PipelineScheduleSingle):
        raise TypeError(
            "sdc_agent.Guard: pipeline must be a torch.distributed.pipelining schedule "
            f"({SUPPORTED_SCHEDULES}), got {type(schedule).__name__}"
        )
    # torch keeps a single-stage schedule's stage in ``_stage``; it has no public accessor.
    return schedule._stage


def pipeline_coverage_facts(
    layout: ShardedLayout, stages: int, replicas_of_shard: Sequence[Sequence[int]]
) -> LayoutFacts:
    """What a pipeline of ``stages`` stages, each sharded as ``layout``, lets check 3 see:
    each (stage, shard) coordinate's copies (``replicas_of_shard``). A function of the layout
    alone, as :func:`~sdc_agent.parallel.fsdp.sharded_coverage_facts`."""
    copies = layout.replicas
    if not layout.weight_redundancy:
        why = (
            "full sharding of each stage: each (stage, shard) has one copy, nothing to "
            "compare it with"
        )
    elif not layout.majority_possible:
        why = "2 copies per (stage, shard): a divergence is reported, nobody is named"
    else:
        why = f"each stage's shards compared across their {copies} replicas, stage by stage"
    facts: LayoutFacts = {
        "parallel": f"pp+{layout.kind}",
        "replicas": copies,
        "shards": layout.shards,
        "stages": stages,
        "weights_compared": layout.weight_redundancy,
        "weights_named_by_majority": layout.majority_possible,
        "weights_why": why,
        "replicas_of_shard": [list(r) for r in replicas_of_shard],
    }
    if layout.tensor_parallel:
        # The stage's mesh and the pipeline's dimension: TP x PP x FSDP2 / HSDP.
        facts["mesh"] = {"pp": stages, **layout.dims()}
    return facts


class PipelineAdapter(ParallelAdapter):
    """The guard's view of one pipeline stage per rank, sharded with FSDP2 over the replicas
    (see the module docstring)."""

    unscale_is_collective = False
    """No GradScaler under a pipeline (the guard refuses one): nothing decides collectively."""
    replays_in_lockstep = True
    """A replay is a whole pipeline step: every rank replays at once."""
    schedule_runs_backward = True
    """The schedule's ``step`` is the training step: its ``loss_fn`` is the loss."""
    steps_judged_together = True
    """The stages update together or not at all: a NaN sent back to one stage reaches neither
    the later stages nor their replicas, which would otherwise apply the step. A pipeline's
    ranks wait for each other at every step anyway (its sends and receives), so the wait costs
    little."""
    taps_see_each_micro_batch = True
    """A stage's local gradient starts from none at every pipeline step (the schedule's
    reduction frees it): each audited pipeline step captures its own."""
    sensors_unsupported = (
        "pipeline parallelism: a candidate would be confirmed by replaying one stage, which the "
        "pipeline cannot do without its other stages"
    )

    def __init__(self, model: nn.Module, schedule: Any, dp_group: dist.ProcessGroup | None) -> None:
        """Learn the pipeline from ``schedule`` and the data-parallel layout from ``model``
        (the stage module the schedule runs), then the grid of replicas x pipeline coordinates
        (collective: one all-gather over the job)."""
        stage = _schedule_stage(schedule)
        if dp_group is not None:
            raise ValueError(
                "sdc_agent.Guard: dp_group must be None with a pipeline; the guard learns the "
                "data-parallel mesh from the stage's parameters and the pipeline from the schedule"
            )
        if stage.submod is not model:
            raise ValueError(
                "sdc_agent.Guard: model must be the stage module the pipeline schedule runs "
                "(the module passed to PipelineStage on this rank)"
            )
        if getattr(schedule, "_loss_fn", None) is None:
            raise ValueError(
                "sdc_agent.Guard: the pipeline schedule has no loss_fn; build it with "
                "loss_fn=... (the guard checks training steps)"
            )
        if not is_fsdp2(model):
            raise ShardingLayoutError(
                "sdc_agent.Guard: shard each pipeline stage with FSDP2 over the data-parallel "
                "dimension (fully_shard(stage_module, mesh=mesh['dp']), or an HSDP mesh "
                "('replicate', 'shard')): its replicas are what the checks compare. For whole "
                "copies of a stage, use HSDP with a shard dimension of 1"
            )
        self.schedule = schedule
        """The pipeline schedule whose ``step`` is the training step."""
        self.stage = stage
        """This rank's ``PipelineStage``."""
        self.pipeline_group: dist.ProcessGroup | None = stage.group
        """The ranks of this rank's pipeline (None: WORLD)."""
        self.stages = int(stage.num_stages)
        """Stages in the pipeline."""
        self.pipeline_ranks = dist.get_world_size(self.pipeline_group)
        """Ranks in one pipeline (one stage each)."""
        self.coordinate = dist.get_rank(self.pipeline_group)
        """This rank's position in its pipeline (its stage's index)."""
        job = dist.get_world_size()
        if job % self.pipeline_ranks:
            raise ShardingLayoutError(
                f"sdc_agent.Guard: {job} ranks do not divide into pipelines of "
                f"{self.pipeline_ranks}"
            )
        # The stage's data-parallel part (and its tensor-parallel one, when the stage's mesh has
        # a tp dimension), over the ranks holding this stage.
        trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        _, stage_layout = learn_layout(trainable)
        data_type = TensorParallelAdapter if stage_layout.tensor_parallel else FSDP2Adapter
        self.data: FSDP2Adapter = data_type(model, None, mesh_size=job // self.pipeline_ranks)
        """The FSDP2 view of the stage module (:class:`~.tp.TensorParallelAdapter`'s with
        tensor parallelism inside the stage): its layout, taps and gradient sync."""
        self.compute_groups: tuple[tuple[int, ...], ...] = ()
        """Every stage's TP groups (global ranks, the whole job's: gathered by
        :meth:`_job_compute_groups`), each computing one micro-batch's part of its stage
        together; empty without tensor parallelism. The placement rule maps each onto another
        along its stage's ring, and check 2 keeps the pairs of each that diverged first: every
        rank must see the same groups to reach the same verdict."""
        self.model: nn.Module = model
        """The stage module training runs (the schedule calls it)."""
        self.module: nn.Module = model
        """The module replays run through (the same stage, in a replayed pipeline step)."""
        self.dp_group: dist.ProcessGroup | None = None
        """The guard's collectives run over the whole job (WORLD)."""
        self.rank = dist.get_rank()
        """This process's global rank."""
        self.dp_rank = self.rank
        """Each rank is named by its global rank (check 1's table has one entry per rank)."""
        self.global_ranks = list(range(job))
        """Every rank of the job."""
        self.world = job
        """Ranks in the job."""
        self.collective_device = collective_device(None)
        """Where tensors for the guard's collectives must live."""
        self.params = self.data.params
        """The stage's trainable (sharded) parameters, in the order of every fingerprint table."""
        self.param_names = self.data.param_names
        self.named_weights: list[tuple[str, nn.Parameter]] = self.data.named_weights
        """Every parameter of the stage by name."""
        self.param_device = self.data.param_device
        """Where the stage's parameter shards (and so the gradients) live."""
        self.recorder = PipelineRecorder([stage], self.param_device)
        """What the stage receives, computes and sends (check 2; check 1's origin of a NaN)."""
        self.rows_of_stage = {int(stage.stage_index): list(range(len(self.params)))}
        """Each stage's rows in the fingerprint tables."""
        self._grid()
        self._job_compute_groups()
        self._weight_groups()

    # ------------------------------------------------------------------ the job's grid
    def _grid(self) -> None:
        """Every rank's (replica, pipeline coordinate, weight replica, shard), gathered once."""
        layout = self.data.layout
        replica = self.data.mesh.mesh.flatten().tolist().index(self.rank)
        mine = torch.tensor(
            [replica, self.coordinate, layout.replica_index, layout.shard_index],
            dtype=torch.int64,
            device=self.collective_device,
        )
        gathered = [torch.empty_like(mine) for _ in range(self.world)]
        dist.all_gather(gathered, mine)
        rows = [g.cpu().tolist() for g in gathered]
        self.replicas = self.world // self.pipeline_ranks
        """Pipeline replicas: each trains on its own batch (the audit's ring runs over them)."""
        self.replica_index = replica
        """This rank's replica (its index in its stage's data-parallel mesh)."""
        grid = [[-1] * self.pipeline_ranks for _ in range(self.replicas)]
        for rank, (r, c, _, _) in enumerate(rows):
            if not (0 <= r < self.replicas and 0 <= c < self.pipeline_ranks):
                raise ShardingLayoutError(
                    f"sdc_agent.Guard: rank {rank} is replica {r} at pipeline coordinate {c}, "
                    f"outside {self.replicas} replicas x {self.pipeline_ranks} stages"
                )
            if grid[r][c] != -1:
                raise ShardingLayoutError(
                    f"sdc_agent.Guard: ranks {grid[r][c]} and {rank} both hold pipeline "
                    f"coordinate {c} of replica {r}; each replica's pipeline must hold every "
                    "stage once"
                )
            grid[r][c] = rank
        # Each rank sees only its own pipeline group: agree, so that every rank refuses alike.
        pipeline = set(dist.get_process_group_ranks(self.pipeline_group or dist.group.WORLD))
        wrong = torch.tensor(
            [int(pipeline != set(grid[replica]))], dtype=torch.int64, device=self.collective_device
        )
        dist.all_reduce(wrong, op=dist.ReduceOp.MAX)
        if int(wrong.item()):
            raise ShardingLayoutError(
                "sdc_agent.Guard: a pipeline's ranks are not the ranks holding the other "
                "stages of their replica; build the pipeline group and the stages' FSDP2 mesh "
                "from one device mesh (e.g. ('dp', 'pp'))"
            )
        self.grid: list[list[int]] = grid
        """``grid[replica][coordinate]``: the global rank holding that stage of that replica."""
        self._layout_rows = rows

    def _job_compute_groups(self) -> None:
        """Every stage's TP groups: the stage's mesh knows only its own stage's, so they are
        gathered over this rank's pipeline (one text per stage; collective, every rank alike)."""
        texts = all_gather_text(
            json.dumps([list(g) for g in self.data.compute_groups]), self.pipeline_group
        )
        groups = {tuple(int(r) for r in g) for text in texts for g in json.loads(text)}
        self.compute_groups = tuple(sorted(groups))

    def replica_columns(self) -> tuple[tuple[int, ...], ...]:
        """Per pipeline coordinate: the global ranks holding that stage, by replica (the ring
        of check 2 runs along each)."""
        return tuple(
            tuple(self.grid[r][c] for r in range(self.replicas)) for c in range(self.pipeline_ranks)
        )

    def global_rank(self, dp_rank: int) -> int:
        """The global rank of rank ``dp_rank`` (every rank is named by its global rank)."""
        return self.global_ranks[dp_rank]

    def seed_rank(self, rank: int) -> int:
        """Each stage's computation runs with its own rank's seed, or its TP group's first
        rank's with tensor parallelism inside the stage (the group draws one RNG stream); a
        replay of it draws the numbers of the rank it replays."""
        return self.data.seed_rank(rank)

    def rank_at(self, replica: int, coordinate: int | None = None) -> int:
        """The global rank holding ``coordinate`` (default: this rank's) of ``replica``."""
        return self.grid[replica][self.coordinate if coordinate is None else coordinate]

    def coordinates_of(self, rank: int) -> tuple[int, int]:
        """(replica, pipeline coordinate) of global ``rank``."""
        replica, coordinate, _, _ = self._layout_rows[rank]
        return replica, coordinate

    # ------------------------------------------------------------------ the step
    def split_feed(self, feed: Any) -> tuple[tuple[Any, ...], Any]:
        """(positional inputs, target) from what this rank feeds its stage: the inputs (a
        tensor or a tuple of positional arguments) on the first stage, the target on the last,
        nothing elsewhere (``feed`` is ignored); a stage that is both takes ``(inputs, target)``."""
        stage = self.stage
        inputs: Any = ()
        target = None
        if stage.is_first and stage.is_last:
            if not (isinstance(feed, tuple) and len(feed) == 2):
                raise ValueError(
                    "sdc_agent: a one-stage pipeline is fed (inputs, target) at each step"
                )
            inputs, target = feed
        elif stage.is_first:
            inputs = feed
        elif stage.is_last:
            target = feed
        if stage.is_first:
            inputs = inputs if isinstance(inputs, tuple) else (inputs,)
        if stage.is_last and target is None:
            raise ValueError(
                f"sdc_agent: the last pipeline stage (rank {self.rank}) needs its targets at "
                "each step (rebuild_batch and the batches feed each rank what its stage needs)"
            )
        return inputs, target

    def run_pipeline_step(self, feed: Any, *, reduce: bool = True) -> list[torch.Tensor]:
        """Run the schedule's ``step`` on this rank with ``feed`` (:meth:`split_feed`); returns
        the last stage's per-micro-batch losses (empty elsewhere). ``reduce``: the schedule
        reduces the stage's gradient over the data-parallel dimension at the end, as in
        training; False (replays) keeps each rank's local gradient, unreduced, for check 2."""
        inputs, target = self.split_feed(feed)
        self.recorder.note_feed(tensors_in(inputs) + tensors_in(target))
        losses: list[torch.Tensor] = []
        with contextlib.nullcontext() if reduce else self._reduction_off():
            if self.stage.is_last:
                self.schedule.step(*inputs, target=target, losses=losses, return_outputs=False)
            else:
                self.schedule.step(*inputs, return_outputs=False)
        self.recorder.note_losses(losses)
        return losses

    @contextlib.contextmanager
    def _reduction_off(self) -> Iterator[None]:
        """Run a pipeline step without the data-parallel reduction: the schedule's final
        ``perform_reduce_grad`` is replaced by the same FSDP2 bookkeeping with gradient sync
        off; afterwards the local gradients it left are dropped and sync turned back on."""
        stage = self.stage
        stage.perform_reduce_grad = self._finish_backward_without_reduce  # instance shadows
        try:
            yield
        finally:
            del stage.perform_reduce_grad
            self.data.set_gradient_sync(True)
            self.data.discard_unsynced_gradients()

    def _finish_backward_without_reduce(self, grad_scale_factor: int) -> None:
        """What ``PipelineStage.perform_reduce_grad`` does for FSDP2 (post-backward of every
        parameter group, then the root's final callback), with gradient sync off: nothing is
        reduced and the gradients are not scaled (the replay's are dropped). torch 2.13 has no
        public call for FSDP2's post-backward; the schedule's own reduction reaches it the same
        way (``fully_shard.state(module)``)."""
        del grad_scale_factor
        from torch.distributed.fsdp import fully_shard

        module = self.model
        module.set_is_last_backward(True)  # type: ignore[operator]  # FSDPModule's methods on a stage typed nn.Module
        module.set_reshard_after_backward(True)  # type: ignore[operator]  # FSDPModule's methods on a stage typed nn.Module
        module.set_requires_gradient_sync(False)  # type: ignore[operator]  # FSDPModule's methods on a stage typed nn.Module
        state = fully_shard.state(module)  # type: ignore[attr-defined]  # fully_shard's contract decorator adds .state, which its stub lacks
        for each in state._state_ctx.all_states:
            for group in each._fsdp_param_groups:
                group.post_backward()
        state._root_post_backward_final_callback()

    # ------------------------------------------------------------------ the adapter's answers
    @property
    def weight_redundancy(self) -> bool:
        """Whether a stage's shards have a second copy (HSDP with >= 2 replicas)."""
        return self.data.weight_redundancy

    def coverage_facts(self) -> LayoutFacts:
        """What the layout lets check 3 see, JSON-ready: each (pipeline, shard) coordinate and
        the ranks holding copies of it (:func:`pipeline_coverage_facts`)."""
        return pipeline_coverage_facts(
            self.data.layout, self.pipeline_ranks, self._replicas_of_shard
        )

    def pipeline_facts(self) -> dict[str, Any]:
        """The pipeline's shape for ``Guard.coverage()``: stages, schedule, micro-batches, the
        ranks holding each stage by replica (by pipeline: one per TP rank of a stage), and the
        stages' TP groups (``tp_groups``) when the stages are tensor parallel."""
        facts: dict[str, Any] = {
            "stages": self.stages,
            "schedule": type(self.schedule).__name__,
            "micro_batches": int(self.schedule._n_microbatches),
            "replicas": self.replicas,
            "stage_ranks": [list(column) for column in self.replica_columns()],
        }
        if self.compute_groups:
            # Tensor parallelism inside each stage: the ranks computing one stage's part of a
            # micro-batch together.
            facts["tp_groups"] = [list(g) for g in self.compute_groups]
        return facts

    def install_gradient_taps(self, stats: GradStatsState) -> None:
        """Check 1's taps on the stage's unsharded (local) and sharded (reduced) parameters
        (with tensor parallelism inside the stage, the TP adapter's, which also record the
        ordered local results check 2 compares), and the pipeline's boundary flags that say
        where a non-finite value started."""
        # With tensor parallelism inside the stage, the TP adapter's taps and probes: they record
        # the stage's ordered local results, which name the GPU inside its TP group.
        self.data.install_gradient_taps(stats)
        stats.local_origin = PipelineOrigin(self.recorder)
        stats.stage_of = self.pipeline_group  # clipping: the norm is over every stage

    def gradient_taps(self) -> ShardedGradientTaps:
        """Check 1's taps (installed when the guard is built)."""
        return self.data.gradient_taps()

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Nothing to turn off: a pipeline schedule reduces its stage's gradient at the end of
        each of its steps, so each pipeline step of an accumulating step is reduced (and
        checked) on its own."""
        yield

    def run_step(
        self, step: StepRunner, batch: Any, compute_loss: ComputeLoss | None
    ) -> torch.Tensor | None:
        """One training step: the schedule's ``step`` on what this rank feeds it, ``grad_accum``
        times with accumulation (``batch`` is then their sequence); the loss is in the last
        stage's rows, so None is returned."""
        del compute_loss  # the schedule's loss_fn
        for feed in batch if step.grad_accum > 1 else [batch]:
            step.run_pipeline(feed)
        return None

    def make_audit(
        self,
        replayer: Replayer,
        rebuild_batch: RebuildBatch,
        reporter: Reporter,
        **options: Any,
    ) -> RingAudit:
        """Check 2 on the pipeline: whole pipeline steps replayed in lockstep and compared
        stage by stage (:class:`~sdc_agent.checks.replay.pipeline_audit.PipelineRingAudit`)."""
        if not isinstance(replayer, PipelineReplayer):
            raise TypeError(f"a pipeline's audit replays pipeline steps, got {replayer!r}")
        return PipelineRingAudit(self, replayer, rebuild_batch, reporter, **options)

    def make_replayer(
        self,
        compute_loss: ComputeLoss | None,
        stats: GradStatsState,
        *,
        grad_accum: int = 1,
        scaler: torch.amp.GradScaler | None = None,
        divide_loss: bool = True,
    ) -> Replayer:
        """Check 2's replays: a whole pipeline step, every rank at once, sync off; the loss is
        the schedule's (``compute_loss``, ``scaler`` and ``divide_loss`` are not used: the
        guard refuses the first two with a pipeline, and the schedule's ``loss_fn`` is what
        training back-propagates, unchanged, in training and replays alike)."""
        del compute_loss, scaler, divide_loss
        replayer = PipelineReplayer(self, stats)
        replayer.grad_accum = grad_accum
        return replayer

    def weight_replicas(self) -> WeightReplicas:
        """Check 3 compares each local shard with its copies at the same (pipeline, shard)
        coordinate; every rank of a weight replica (all stages, all shards) agrees on one
        verdict, and the tables are gathered over the job when copies differ."""
        return WeightReplicas(
            named_weights=list(self.named_weights),  # a copy: a list of Tensors, not Parameters
            sharded=True,
            replica_group=self.data.replicate_group,
            shard_group=self._shard_group,
            group=None,
            replicas_of_shard=self._replicas_of_shard,
            collective_device=self.collective_device,
            names_of_shard=self._names_of_shard,
        )

    def _weight_groups(self) -> None:
        """Check 3's groups: for each weight replica, the ranks of every (stage, shard)
        coordinate of it (collective: every rank creates every group, in the same order, and
        gathers the stages' parameter names once)."""
        rows = self._layout_rows
        copies = self.data.layout.replicas
        coordinates = sorted({(c, s) for _, c, _, s in rows})
        self._replicas_of_shard = tuple(
            tuple(
                next(rank for rank, row in enumerate(rows) if (row[1], row[2], row[3]) == (c, w, s))
                for w in range(copies)
            )
            for c, s in coordinates
        )
        self._shard_group: dist.ProcessGroup | None = None
        self._names_of_shard: tuple[tuple[str, ...], ...] | None = None
        if copies < 2:
            return  # one copy of each shard: check 3 is off, nothing to agree on
        groups = [
            dist.new_group([rank for rank, row in enumerate(rows) if row[2] == w])
            for w in range(copies)
        ]
        self._shard_group = groups[self.data.layout.replica_index]
        # A stage's names are the same on every replica: gathered over this rank's pipeline
        # (P texts), not over the job (N).
        texts = all_gather_text(json.dumps([n for n, _ in self.named_weights]), self.pipeline_group)
        by_coordinate = [tuple(json.loads(text)) for text in texts]
        self._names_of_shard = tuple(by_coordinate[c] for c, _ in coordinates)

    # ------------------------------------------------------------------ fault drills
    def with_autograd_parameter(self, name: str, use: Callable[[nn.Parameter], None]) -> None:
        """Call ``use`` with the unsharded parameter autograd computes ``name``'s local gradient
        for (this rank's stage)."""
        self.data.with_autograd_parameter(name, use)

    def local_weight(self, name: str) -> torch.Tensor:
        """This rank's shard of the stage's parameter ``name``."""
        return self.data.local_weight(name)

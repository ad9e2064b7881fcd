"""The drill job on a pipeline: 2 stages per replica, each sharded with FSDP2 over the replicas.

``python -m sdc_agent.drill --parallel pp`` and the pipeline tests build their job here
(:func:`build_pipeline`). The model is the sharded drill model (:mod:`.sharded`) cut in two the
way torchtitan cuts a transformer: every rank builds the whole model from the same seed and keeps
its stage's layers (stage 0: ``embed``, ``blocks.0``; stage 1: ``blocks.1``, ``head``), so
parameter names stay the whole model's. The mesh is (replicas, stages): a replica's stages are on
one node, a stage's copies on the other nodes. Each stage is sharded with ``fully_shard`` over
the replicas: full sharding (``fsdp``: one shard each, no copy to compare) or HSDP
(``hsdp``: ``shards`` ranks per shard group, copies across the rest; the default of one
shard keeps a whole copy of the stage on every replica). The loss (cross-entropy) is the
schedule's ``loss_fn``, on the last stage.

With ``tp`` > 1 (``python -m sdc_agent.drill --parallel 3d``) each stage is also tensor parallel
inside its node: the blocks are :class:`~.tp.TPBlock`'s (``up`` column-parallel, ``down``
row-parallel on ``mesh["tp"]``) and the mesh is ``("replicate", "shard", "pp", "tp")``: a
replica's stages and their TP groups on one node, a stage's copies across the nodes, so each
stage's FSDP2 mesh is ``mesh["replicate", "shard", "tp"]`` (TP x PP x HSDP).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils.checkpoint import checkpoint

from .batches import make_batch
from .sharded import ShardedDrillModel
from .tp import TPDrillModel

STAGES = 2
"""Pipeline stages of the drill model."""

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
"""The pipeline schedules the drill can run, by name."""

DATA_LAYOUTS = ("fsdp", "hsdp")
"""How each stage is sharded over the replicas."""


class PipelineDrillStage(nn.Module):
    """One stage of :class:`~.sharded.ShardedDrillModel`: the layers of stage ``stage`` of
    :data:`STAGES`, under their whole-model names."""

    def __init__(
        self,
        stage: int,
        *,
        autocast_bf16: bool = False,
        activation_checkpointing: bool = False,
        tensor_parallel: bool = False,
    ) -> None:
        """Build the whole model (call it after seeding the RNG alike on every rank) and keep
        stage ``stage``'s layers; ``autocast_bf16``: the forward runs under CPU bf16 autocast;
        ``tensor_parallel``: the model is :class:`~.tp.TPDrillModel` (its blocks' ``up`` and
        ``down`` for a TP plan; the last stage keeps its final ``norm`` too)."""
        super().__init__()
        full = (TPDrillModel if tensor_parallel else ShardedDrillModel)(blocks=STAGES)
        self.stage = stage
        self.embed: nn.Module | None = full.embed if stage == 0 else None
        self.blocks = nn.ModuleDict({str(stage): full.blocks[stage]})
        last = stage == STAGES - 1
        # isinstance, not tensor_parallel: the same test, and it tells mypy that ``full`` has one.
        self.norm: nn.Module | None = full.norm if isinstance(full, TPDrillModel) and last else None
        self.head: nn.Module | None = full.head if last else None
        self.autocast_bf16 = autocast_bf16
        self.activation_checkpointing = activation_checkpointing

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The stage's part of the model: activations in, activations (or logits) out."""
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast_bf16):
            if self.embed is not None:
                x = self.embed(x)
            for block in self.blocks.values():
                if self.activation_checkpointing:
                    x = checkpoint(block, x, use_reentrant=False)
                else:
                    x = block(x)
            if self.norm is not None:
                x = self.norm(x)
            if self.head is not None:
                x = self.head(x)
        return x.float() if self.head is not None else x


def drill_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The schedule's ``loss_fn``: cross-entropy of the last stage's logits."""
    return F.cross_entropy(output.float(), target)


def place(rank: int, tp: int = 1) -> tuple[int, int]:
    """(replica, stage) of global ``rank`` in the drill's mesh (stages innermost, or just
    outside the ``tp`` ranks of each stage's TP group)."""
    return rank // (STAGES * tp), (rank // tp) % STAGES


def make_feed(step: int, rank: int, *, seed: int = 0, grad_accum: int = 1, tp: int = 1) -> Any:
    """What ``rank`` feeds the pipeline at ``step``: its replica's inputs on stage 0, its
    targets on the last stage (a list of ``grad_accum`` of them with accumulation; the ranks
    of a TP group feed the same); a pure function of (step, rank), so any rank rebuilds any
    other's (``rebuild_batch``)."""
    replica, stage = place(rank, tp)

    def one(s: int) -> torch.Tensor:
        x, y = make_batch(s, replica, seed=seed)
        return x if stage == 0 else y

    if grad_accum == 1:
        return one(step)
    return [one(step * grad_accum + i) for i in range(grad_accum)]


def build_pipeline(
    schedule: dict[str, Any],
    *,
    data: str = "hsdp",
    shards: int = 1,
    pipeline: str = "gpipe",
    micro_batches: int = 2,
    seed: int = 0,
    autocast_bf16: bool = False,
    activation_checkpointing: bool = False,
    publisher: Any = None,
    tp: int = 1,
) -> tuple[nn.Module, Any, torch.optim.Optimizer, Any]:
    """(stage module, pipeline schedule, optimizer, guard) of this rank, identical initial
    weights on every replica.

    ``schedule``: ``sdc_agent.Schedule``'s keywords (``peer_offset`` counts replicas);
    ``data``: ``fsdp`` or ``hsdp`` (``shards`` ranks per shard group); ``pipeline``: a name of
    :data:`SCHEDULES`, with ``micro_batches`` micro-batches per pipeline step; ``tp``: ranks
    per TP group inside each stage (1: no tensor parallelism; ``peer_offset`` then counts
    pipelines, ``tp`` per replica)."""
    import sdc_agent as sdc

    world = dist.get_world_size()
    if tp < 1 or world % (STAGES * tp):
        raise ValueError(
            f"a pipeline of {STAGES} stages with TP groups of {tp} needs a world size divisible "
            f"by {STAGES * tp}, got {world}"
        )
    if data not in DATA_LAYOUTS:
        raise ValueError(f"data must be one of {DATA_LAYOUTS}, got {data!r}")
    if pipeline not in SCHEDULES:
        raise ValueError(f"pipeline must be one of {sorted(SCHEDULES)}, got {pipeline!r}")
    replicas = world // (STAGES * tp)
    inner = ("tp",) if tp > 1 else ()
    inner_sizes = (tp,) if tp > 1 else ()
    if data == "fsdp":
        mesh = init_device_mesh(
            "cpu", (replicas, STAGES, *inner_sizes), mesh_dim_names=("dp", "pp", *inner)
        )
        dp_mesh = mesh["dp"]
    else:
        if shards < 1 or replicas % shards:
            raise ValueError(f"hsdp needs replicas divisible by shards={shards}, got {replicas}")
        mesh = init_device_mesh(
            "cpu",
            (replicas // shards, shards, STAGES, *inner_sizes),
            mesh_dim_names=("replicate", "shard", "pp", *inner),
        )
        dp_mesh = mesh["replicate", "shard"]
    stage_index = mesh.get_local_rank("pp")
    torch.manual_seed(seed)
    module = PipelineDrillStage(
        stage_index,
        autocast_bf16=autocast_bf16,
        activation_checkpointing=activation_checkpointing,
        tensor_parallel=tp > 1,
    )
    if tp > 1:
        # torchtitan's order: the TP plan on the tp dimension, then FSDP2 on the data-parallel
        # ones (the stage's parameters then live on ("replicate", "shard", "tp")).
        parallelize_module(
            module,
            mesh["tp"],
            {
                f"blocks.{stage_index}.up": ColwiseParallel(),
                f"blocks.{stage_index}.down": RowwiseParallel(),
            },
        )
    for block in module.blocks.values():
        fully_shard(block, mesh=dp_mesh)
    fully_shard(module, mesh=dp_mesh)
    grad_accum = int(schedule.get("grad_accum", 1))
    stage = PipelineStage(
        module, stage_index, STAGES, torch.device("cpu"), group=mesh["pp"].get_group()
    )
    schedule_type: Callable[..., Any] = SCHEDULES[pipeline]
    runner = schedule_type(
        stage,
        n_microbatches=micro_batches,
        loss_fn=drill_loss,
        # With accumulation the schedule must not divide the accumulated gradient at each of
        # the step's pipeline steps (sdc_agent.parallel.pp): the drill's gradient is then the
        # sum over the micro-batches, which SGD does not mind.
        scale_grads=grad_accum == 1,
    )
    optimizer = torch.optim.SGD(module.parameters(), lr=0.05, momentum=0.9)
    guard = sdc.Guard(
        module,
        optimizer,
        pipeline=runner,
        rebuild_batch=lambda step, rank: make_feed(
            step, rank, seed=seed, grad_accum=grad_accum, tp=tp
        ),
        # Unprotected, as the other drill models (a pipeline runs no sensors at all): sensors off
        # unless asked, so the guard does not warn that nothing is protected.
        schedule=sdc.Schedule(**{"sensors": False, **schedule}),
        publisher=publisher,
    )
    return module, runner, optimizer, guard

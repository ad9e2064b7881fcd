"""The drill job on a tensor-parallel model composed with FSDP2 or HSDP, on the CPU with gloo.

torchtitan's recipe at drill size: a residual MLP whose blocks' ``up`` layers are
``ColwiseParallel`` and ``down`` layers ``RowwiseParallel`` on ``mesh["tp"]`` (with
``sequence_parallel``: the norms ``SequenceParallel``, the embedding and head parallel too, the
activations sharded along the sequence between blocks), then ``fully_shard`` on each block and
the root over the data-parallel dimensions. The mesh is (nodes, ranks per node) with TP inside a
node: ``("dp", "tp")`` (``fsdp+tp``: FSDP2 shards across nodes) or ``("replicate", "shard",
"tp")`` with one shard (``tp``: replicas across nodes, so check 3 compares them).
``python -m sdc_agent.drill --parallel tp`` and the tensor-parallel tests build it here
(:func:`sdc_agent.drills.job.build_tp`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from .sharded import ShardedDrillModel

TP_KINDS = ("tp", "fsdp+tp")
"""The tensor-parallel layouts the drill builds: HSDP x TP and FSDP2 x TP."""

SEQUENCE = 4
"""Tokens per sequence of a drill micro-batch (the dimension sequence parallelism shards)."""


class TPBlock(nn.Module):
    """A residual block: ``norm`` LayerNorm, ``up`` Linear (column-parallel), GELU, ``down``
    Linear (row-parallel), Dropout after the all-reduce (every rank of a TP group draws the same
    mask, from the group's one RNG stream)."""

    def __init__(self, hidden: int) -> None:
        """Layers ``norm``, ``up`` (hidden -> 2 hidden), ``act``, ``down``, ``drop``."""
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, 2 * hidden)
        self.act = nn.GELU()
        self.down = nn.Linear(2 * hidden, hidden)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x + drop(down(act(up(norm(x)))))."""
        return x + self.drop(self.down(self.act(self.up(self.norm(x)))))


class TPDrillModel(ShardedDrillModel):
    """The sharded drill model with :class:`TPBlock` blocks and a ``norm`` before the ``head``
    (``embed``, ``blocks.0`` .. ``blocks.{n-1}``, ``head``, ``norm``); inputs [batch, sequence,
    d_in] (or [batch, d_in]), logits [batch, sequence, classes]."""

    block_type = TPBlock

    def __init__(self, d_in: int = 16, hidden: int = 32, **options: Any) -> None:
        """As :class:`~.sharded.ShardedDrillModel`, plus the final ``norm``."""
        super().__init__(d_in, hidden, **options)
        self.norm = nn.LayerNorm(hidden)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The head on the normalised last block's output."""
        return self.head(self.norm(x))


def make_tp_batch(step: int, rank: int, *, seed: int = 0, batch: int = 2, d_in: int = 16) -> tuple:
    """The micro-batch of ``rank``'s TP group at ``step`` (``rank``: the group's first rank, so
    every rank of a group trains on the same one): a pure function, any rank can rebuild it."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
    x = torch.randn(batch, SEQUENCE, d_in, generator=g)
    return x, torch.randint(0, 4, (batch, SEQUENCE), generator=g)


def tp_plan(model: TPDrillModel, sequence_parallel: bool) -> dict[str, ParallelStyle]:
    """The tensor-parallel plan: column-parallel ``up``, row-parallel ``down`` in every block;
    with ``sequence_parallel`` torchtitan's: activations sharded along the sequence between
    blocks, the norms ``SequenceParallel``, the embedding row-parallel and the head
    column-parallel with a replicated output."""
    plan: dict[str, ParallelStyle] = {}
    for i in range(len(model.blocks)):
        if sequence_parallel:
            plan[f"blocks.{i}.norm"] = SequenceParallel()
            plan[f"blocks.{i}.up"] = ColwiseParallel(input_layouts=Shard(1))
            plan[f"blocks.{i}.down"] = RowwiseParallel(output_layouts=Shard(1))
        else:
            plan[f"blocks.{i}.up"] = ColwiseParallel()
            plan[f"blocks.{i}.down"] = RowwiseParallel()
    if sequence_parallel:
        plan["embed"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
        plan["norm"] = SequenceParallel()
        plan["head"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())
    return plan


def tp_mesh(parallel: str, tp: int) -> tuple[DeviceMesh, DeviceMesh]:
    """(the whole mesh, its data-parallel part) for ``parallel`` (:data:`TP_KINDS`) with TP
    groups of ``tp`` consecutive ranks."""
    world = dist.get_world_size()
    if tp < 1 or world % tp:
        raise ValueError(f"tensor parallel needs a world size divisible by tp={tp}, got {world}")
    if parallel == "fsdp+tp":
        mesh = init_device_mesh("cpu", (world // tp, tp), mesh_dim_names=("dp", "tp"))
        return mesh, mesh["dp"]
    if parallel == "tp":
        mesh = init_device_mesh(
            "cpu", (world // tp, 1, tp), mesh_dim_names=("replicate", "shard", "tp")
        )
        return mesh, mesh["replicate", "shard"]
    raise ValueError(f"parallel must be one of {TP_KINDS}, got {parallel!r}")


def parallelize(
    model: TPDrillModel,
    parallel: str,
    *,
    tp: int,
    sequence_parallel: bool = False,
    mixed_precision: bool = False,
) -> nn.Module:
    """Apply the tensor-parallel plan on the tp dimension, then ``fully_shard`` each block and
    the root on the data-parallel ones; ``mixed_precision``: FSDP2's bf16-parameter / float32
    reduction policy."""
    mesh, dp_mesh = tp_mesh(parallel, tp)
    parallelize_module(model, mesh["tp"], tp_plan(model, sequence_parallel))
    policy = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if mixed_precision
        else MixedPrecisionPolicy()
    )
    for block in model.blocks:
        fully_shard(block, mesh=dp_mesh, mp_policy=policy)
    fully_shard(model, mesh=dp_mesh, mp_policy=policy)
    return model


def group_first_rank(rank: int, tp: int) -> int:
    """The first rank of ``rank``'s TP group (groups of ``tp`` consecutive ranks)."""
    return rank - rank % tp


def tp_batches(step: int, rank: int, *, tp: int, seed: int = 0, grad_accum: int = 1) -> Any:
    """What ``rank`` trains on at ``step``: its TP group's micro-batch, or with ``grad_accum``
    > 1 a list of that many (what ``rebuild_batch`` returns too)."""
    first = group_first_rank(rank, tp)
    if grad_accum == 1:
        return make_tp_batch(step, first, seed=seed)
    return [make_tp_batch(step * grad_accum + i, first, seed=seed) for i in range(grad_accum)]

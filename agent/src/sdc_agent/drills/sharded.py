"""The drill job on a sharded model: FSDP2 full sharding or HSDP, on the CPU with gloo.

``python -m sdc_agent.drill --parallel fsdp|hsdp`` and the FSDP2 tests shard their model here
(:func:`sdc_agent.drills.job.build_sharded` builds the whole job). The model is a small residual
MLP whose blocks are each ``fully_shard``-ed, then the root, as FSDP2 users shard a transformer;
HSDP lays the mesh out as (nodes, ranks per node): replicas across nodes, shards within a node.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.checkpoint import checkpoint

PARALLEL_KINDS = ("fsdp", "hsdp")
"""The sharded layouts the drill builds (``ddp`` is :func:`sdc_agent.drills.job.build`)."""


class Block(nn.Module):
    """A residual block: LayerNorm, Linear, GELU, Dropout (dropout makes replays need the seed)."""

    def __init__(self, hidden: int) -> None:
        """Layers ``norm``, ``fc``, ``act``, ``drop``."""
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.fc = nn.Linear(hidden, hidden)
        self.act = nn.GELU()
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x + drop(act(fc(norm(x))))."""
        return x + self.drop(self.act(self.fc(self.norm(x))))


class ShardedDrillModel(nn.Module):
    """``embed`` Linear, ``blocks.0`` .. ``blocks.{n-1}`` (:class:`Block`), ``head`` Linear."""

    block_type: type[nn.Module] = Block
    """The residual block (``block_type(hidden)``)."""

    def __init__(
        self,
        d_in: int = 16,
        hidden: int = 32,
        classes: int = 4,
        blocks: int = 2,
        activation_checkpointing: bool = False,
    ) -> None:
        """``activation_checkpointing``: recompute each block in backward
        (``torch.utils.checkpoint``, non-reentrant)."""
        super().__init__()
        self.embed = nn.Linear(d_in, hidden)
        self.blocks = nn.ModuleList(self.block_type(hidden) for _ in range(blocks))
        self.head = nn.Linear(hidden, classes)
        self.activation_checkpointing = activation_checkpointing

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits."""
        x = self.embed(x)
        for block in self.blocks:
            if self.activation_checkpointing:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.logits(x)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The head on the last block's output."""
        return self.head(x)


def shard(
    module: nn.Module,
    parallel: str,
    *,
    shards: int,
    mixed_precision: bool = False,
    blocks: Iterable[nn.Module] | None = None,
) -> nn.Module:
    """``fully_shard`` each block (``blocks``, default ``module.blocks``), then the root, on a
    1-D mesh (``fsdp``) or an HSDP mesh of (world / shards) replicas x ``shards`` shards
    (``hsdp``); ``mixed_precision``: FSDP2's policy of bf16 parameters in compute and float32
    gradient reduction."""
    world = dist.get_world_size()
    if parallel == "fsdp":
        mesh = init_device_mesh("cpu", (world,))
    elif parallel == "hsdp":
        if shards < 1 or world % shards:
            raise ValueError(f"hsdp needs a world size divisible by shards={shards}, got {world}")
        mesh = init_device_mesh(
            "cpu", (world // shards, shards), mesh_dim_names=("replicate", "shard")
        )
    else:
        raise ValueError(f"parallel must be one of {PARALLEL_KINDS}, got {parallel!r}")
    policy = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if mixed_precision
        else MixedPrecisionPolicy()
    )
    for block in module.blocks if blocks is None else blocks:  # type: ignore[union-attr]  # nn.Module types .blocks Tensor | Module
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(module, mesh=mesh, mp_policy=policy)
    return module

"""The expert-parallel drill (``python -m sdc_agent.drill --parallel ep``): a small MoE model with
expert parallel x HSDP, laid out as torchtitan lays it out, trained under the guard.

The model (:class:`MoEDrillModel`) is self-contained, so the drill needs nothing but torch (no
torchtitan and none of the CPU workarounds its MoE needs, docs/usage/ep.md): ``embed`` Linear,
one MoE layer (``moe``: a router ``moe.gate`` choosing each token's top-2 of ``2 x ep`` experts,
the standard all-to-all dispatch to the EP rank holding each expert, the local experts' MLPs,
the all-to-all combine back, as torchtitan's ``TokenChoiceTopKRouter`` and all-to-all token
dispatcher do) in a residual, and ``head`` Linear. The mesh is torchtitan's
``ParallelDims(dp_replicate=nodes, dp_shard=ranks_per_node, ep=ranks_per_node)``:

* every dense parameter (``embed``, ``moe.gate``, ``head``) on the HSDP mesh
  ``("dp_replicate", "fsdp")`` = (nodes, ranks per node): replicas across nodes, shards within;
* the routed experts' weights (``moe.experts.w1``, ``moe.experts.w2``: experts x out x in) are
  ``Shard(0)`` on ``ep`` (each rank of a node holds 2 experts; every expert has one copy per
  node), then ``fully_shard`` on ``("dp_replicate", "efsdp")`` of the expert mesh
  ``("dp_replicate", "efsdp", "ep")`` = (nodes, 1, ranks per node), as torchtitan does
  (its placements ``(Replicate, _StridedShard(0), Shard(0))``).

The guard learns the layout ``hsdp+ep`` from the parameters and checks it with
:class:`~sdc_agent.parallel.ep.ExpertParallelAdapter`: checks 1 and 3 run; the replay audit
(check 2) and the online sensors are off, with the reason in ``coverage()``.

Like :mod:`sdc_agent.drill`, this module is a drill: the guard never imports it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from .batches import make_batch
from .job import guarded_sgd, make_fault

__all__ = [
    "DENSE_MESH_NAMES",
    "EXPERTS_PER_RANK",
    "EXPERT_MESH_NAMES",
    "EXPERT_W1",
    "EXPERT_W2",
    "TOP_K",
    "MoEDrillModel",
    "build_ep",
    "parallelize",
    "train_ep",
]

EXPERTS_PER_RANK = 2
"""Routed experts each EP rank holds: a MoE layer has ``EXPERTS_PER_RANK x ep`` of them."""
TOP_K = 2
"""Experts each token is routed to (token-choice top-k, as torchtitan's router)."""
EXPERT_W1 = "moe.experts.w1"
"""The routed experts' up projection (experts x hidden x dim; this rank's experts' slice)."""
EXPERT_W2 = "moe.experts.w2"
"""The routed experts' down projection (experts x dim x hidden)."""
DENSE_MESH_NAMES = ("dp_replicate", "fsdp")
"""torchtitan's HSDP mesh names (what :mod:`sdc_agent.parallel.mesh` reads next to experts)."""
EXPERT_MESH_NAMES = ("dp_replicate", "efsdp", "ep")
"""torchtitan's expert mesh names (:data:`sdc_agent.parallel.mesh.EXPERT_MESH_NAMES`)."""


class Experts(nn.Module):
    """The routed experts' weights (``w1``, ``w2``, each experts x out x in), one GELU MLP per
    expert; under EP each is a DTensor ``Shard(0)`` on the ``ep`` mesh, and this rank computes
    with its local experts only."""

    def __init__(self, experts: int, dim: int, hidden: int) -> None:
        """Weights initialised as ``nn.Linear``'s are (uniform in +-1/sqrt(fan_in))."""
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(experts, hidden, dim).uniform_(-(dim**-0.5), dim**-0.5))
        self.w2 = nn.Parameter(
            torch.empty(experts, dim, hidden).uniform_(-(hidden**-0.5), hidden**-0.5)
        )

    def forward(self, tokens: torch.Tensor, per_expert: Sequence[int]) -> torch.Tensor:
        """Each local expert's MLP on its contiguous chunk of ``tokens`` (``per_expert`` rows
        each, in local expert order)."""
        # FSDP2 unshards to the EP DTensor; the local experts are its local tensor (autograd
        # carries the gradient back through to_local, as in torchtitan's GroupedExperts).
        w1 = self.w1.to_local() if isinstance(self.w1, DTensor) else self.w1
        w2 = self.w2.to_local() if isinstance(self.w2, DTensor) else self.w2
        chunks = tokens.split(list(per_expert))
        # A loop over the (two) local experts rather than a grouped GEMM (torch._grouped_mm):
        # the drill trains in float32 and checks the guard, not the kernel.
        out = [F.gelu(c @ w1[e].T) @ w2[e].T for e, c in enumerate(chunks)]
        return torch.cat(out)


class MoE(nn.Module):
    """A token-choice top-k MoE layer over an EP group: route, dispatch by all-to-all, compute
    the local experts, combine by all-to-all, weight by the router's scores."""

    def __init__(self, dim: int, hidden: int, ep: int, group: dist.ProcessGroup) -> None:
        """``ep`` ranks in the EP ``group`` (they exchange tokens by all-to-all)."""
        super().__init__()
        self.ep, self.group = ep, group
        self.num_experts = EXPERTS_PER_RANK * ep
        self.gate = nn.Linear(dim, self.num_experts, bias=False)
        self.experts = Experts(self.num_experts, dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The combined expert outputs of each token (rows of ``x``: this rank's tokens)."""
        tokens, dim = x.shape
        scores = self.gate(x).softmax(dim=-1)
        weights, chosen = scores.topk(TOP_K, dim=-1)  # (tokens, k)
        flat = chosen.reshape(-1)
        # Sorted by expert, the rows are grouped by destination rank too: expert e lives on EP
        # rank e // EXPERTS_PER_RANK (Shard(0) over ep).
        order = flat.argsort(stable=True)
        sent = x.repeat_interleave(TOP_K, dim=0)[order]
        counts = torch.bincount(flat, minlength=self.num_experts)
        sent_splits = counts.view(self.ep, -1).sum(1).tolist()
        # Each rank learns how many rows it receives for each of its experts from each source
        # (equal splits: EXPERTS_PER_RANK counts per rank), then the rows themselves.
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts, group=self.group)
        recv_splits = recv_counts.view(self.ep, -1).sum(1).tolist()
        received = funcol.wait_tensor(
            funcol.all_to_all_single_autograd(sent, recv_splits, sent_splits, self.group)
        )
        # The received rows come by source rank, then by local expert: regroup by local expert.
        expert_of_row = (
            torch.arange(EXPERTS_PER_RANK).repeat(self.ep).repeat_interleave(recv_counts)
        )
        by_expert = expert_of_row.argsort(stable=True)
        per_expert = torch.bincount(expert_of_row, minlength=EXPERTS_PER_RANK).tolist()
        computed = self.experts(received[by_expert], per_expert)
        out = torch.empty_like(received).index_copy(0, by_expert, computed)
        out = funcol.wait_tensor(
            funcol.all_to_all_single_autograd(out, sent_splits, recv_splits, self.group)
        )
        back = torch.empty_like(out).index_copy(0, order, out)  # undo the sort by expert
        return (back.view(tokens, TOP_K, dim) * weights.unsqueeze(-1)).sum(dim=1)


class MoEDrillModel(nn.Module):
    """``embed`` Linear, ``moe`` (:class:`MoE`) in a residual after a LayerNorm ``norm``,
    ``head`` Linear: the drill batches' rows are the tokens."""

    def __init__(
        self,
        *,
        ep: int,
        group: dist.ProcessGroup,
        d_in: int = 16,
        dim: int = 32,
        hidden: int = 32,
        classes: int = 4,
    ) -> None:
        """``ep`` ranks per EP ``group``."""
        super().__init__()
        self.embed = nn.Linear(d_in, dim)
        self.norm = nn.LayerNorm(dim)
        self.moe = MoE(dim, hidden, ep, group)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits per token."""
        h = self.embed(x)
        h = h + self.moe(self.norm(h))
        return self.head(h)


def parallelize(
    model: MoEDrillModel, *, ep_mesh: DeviceMesh, edp_mesh: DeviceMesh, dense_mesh: DeviceMesh
) -> MoEDrillModel:
    """Expert parallel, then FSDP2, in torchtitan's order: the experts' weights ``Shard(0)``
    on ``ep_mesh``, ``fully_shard`` of the experts on ``edp_mesh`` and of the root (every
    dense parameter) on ``dense_mesh``."""
    experts = model.moe.experts
    for name in ("w1", "w2"):
        full = getattr(experts, name)
        # Every rank built the same full tensor (one seed): distribute_tensor keeps its slice.
        experts.register_parameter(
            name, nn.Parameter(distribute_tensor(full.detach(), ep_mesh, [Shard(0)]))
        )
    # FSDP2's default gradient division (by each mesh's size) is kept: an expert's gradient
    # then sums its EP group's tokens over the replicas' mean, a larger step than the dense
    # weights' (torchtitan divides by the global token count instead, which makes FSDP2 ask
    # gloo for PREMUL_SUM). Same on every copy, so it changes no check's outcome.
    fully_shard(experts, mesh=edp_mesh)
    fully_shard(model, mesh=dense_mesh)
    return model


def build_ep(
    schedule: dict[str, Any], *, ranks_per_node: int, seed: int = 0
) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    """(model, optimizer, guard): :class:`MoEDrillModel` with EP over each node's ranks x HSDP
    (replicas across nodes), identical initial weights on every rank; the optimizer and guard
    are the other drills' (:func:`sdc_agent.drills.job.guarded_sgd`)."""
    world = dist.get_world_size()
    if ranks_per_node < 2 or world % ranks_per_node:
        raise ValueError(
            f"ranks_per_node: expert parallel needs >= 2 ranks per node dividing the world "
            f"({world}), got {ranks_per_node}"
        )
    nodes = world // ranks_per_node
    dense_mesh = init_device_mesh("cpu", (nodes, ranks_per_node), mesh_dim_names=DENSE_MESH_NAMES)
    expert_mesh = init_device_mesh(
        "cpu", (nodes, 1, ranks_per_node), mesh_dim_names=EXPERT_MESH_NAMES
    )
    ep_mesh = expert_mesh["ep"]
    torch.manual_seed(seed)
    model = MoEDrillModel(ep=ranks_per_node, group=ep_mesh.get_group())
    parallelize(
        model,
        ep_mesh=ep_mesh,
        edp_mesh=expert_mesh["dp_replicate", "efsdp"],
        dense_mesh=dense_mesh,
    )
    optimizer, guard = guarded_sgd(model, schedule, seed=seed, autocast_bf16=False, publisher=None)
    return model, optimizer, guard


def train_ep(
    *,
    steps: int,
    schedule: dict[str, Any],
    ranks_per_node: int,
    faults: Sequence[dict[str, Any]] = (),
    seed: int = 0,
) -> dict[str, Any]:
    """Train :func:`build_ep`'s job for ``steps`` steps under the guard (checkpoint callbacks
    at the schedule's ``ckpt_every``), ``faults`` as the drills' (:mod:`sdc_agent.drills.faults`);
    what happened on this rank, as :func:`sdc_agent.drills.job.train_drill` reports it, with
    the guard's ``coverage()``."""
    _, optimizer, guard = build_ep(schedule, ranks_per_node=ranks_per_node, seed=seed)
    injected = [make_fault(f).attach(guard) for f in faults]
    updates: list[int | None] = []
    optimizer.register_step_post_hook(lambda *_: updates.append(guard.current_step))
    saves: list[list[Any]] = []
    rank = dist.get_rank()
    alarm = guard.train(
        (make_batch(s, rank, seed=seed) for s in range(steps)),
        save_checkpoint=lambda step, tags: saves.append([step, tags]),
    )
    return {
        "rank": rank,
        "alarm": alarm.to_dict() if alarm else None,
        "updates": updates,
        "saves": saves,
        "fired": sum(f.fired for f in injected),
        "last_audit_pass": guard.last_audit_pass,
        "last_weight_check_pass": guard.last_weight_check_pass,
        "coverage": guard.coverage(),
    }

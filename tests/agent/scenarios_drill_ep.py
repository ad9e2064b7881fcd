"""Jobs for tests/agent/test_drill_ep.py that run on every rank: the EP drill model's MoE layer
against a one-process reference."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

from sdc_agent.drills.batches import make_batch
from sdc_agent.drills.ep import (
    DENSE_MESH_NAMES,
    EXPERT_MESH_NAMES,
    TOP_K,
    MoEDrillModel,
    parallelize,
)


def reference_logits(model: MoEDrillModel, x: torch.Tensor) -> torch.Tensor:
    """What ``model`` (unparallelised, every expert local) computes: each token's top-k
    experts' MLPs weighted by the router's scores, with no all-to-all."""
    h = model.embed(x)
    z = model.norm(h)
    moe = model.moe
    weights, chosen = moe.gate(z).softmax(dim=-1).topk(TOP_K, dim=-1)
    w1, w2 = moe.experts.w1, moe.experts.w2
    out = torch.zeros_like(z)
    for token in range(z.shape[0]):
        for k in range(TOP_K):
            e = int(chosen[token, k])
            out[token] += weights[token, k] * (F.gelu(z[token] @ w1[e].T) @ w2[e].T)
    return model.head(h + out)


def moe_matches_reference(*, ranks_per_node: int) -> dict[str, Any]:
    """On this rank: the EP x HSDP drill model's logits and the reference's, for this rank's
    batch, and how many of its token copies went to another EP rank's experts."""
    world, rank = dist.get_world_size(), dist.get_rank()
    nodes = world // ranks_per_node
    dense = init_device_mesh("cpu", (nodes, ranks_per_node), mesh_dim_names=DENSE_MESH_NAMES)
    expert = init_device_mesh("cpu", (nodes, 1, ranks_per_node), mesh_dim_names=EXPERT_MESH_NAMES)
    group = expert["ep"].get_group()
    # The same seed, so the same weights (a process group cannot be deep-copied).
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(MoEDrillModel(ep=ranks_per_node, group=group))
    model, reference = models
    parallelize(
        model, ep_mesh=expert["ep"], edp_mesh=expert["dp_replicate", "efsdp"], dense_mesh=dense
    )
    x, _ = make_batch(3, rank)
    logits = model(x)
    logits.sum().backward()  # the combine and dispatch all-to-alls' backward runs
    with torch.no_grad():
        expected = reference_logits(reference, x)
        chosen = reference.moe.gate(reference.norm(reference.embed(x))).topk(TOP_K, dim=-1)[1]
    ep_rank = expert["ep"].get_local_rank()
    elsewhere = int((chosen // (reference.moe.num_experts // ranks_per_node) != ep_rank).sum())
    grads = {
        n: p.grad is not None and bool(p.grad.to_local().abs().sum() > 0)
        for n, p in model.named_parameters()
    }
    return {
        "max_abs_diff": float((logits.detach() - expected).abs().max()),
        "sent_elsewhere": elsewhere,
        "nonzero_grads": grads,
    }

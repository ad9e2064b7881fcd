"""Where each rank runs (the rank map) and the placement rule the replay audit relies on."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Sequence

import torch
import torch.distributed as dist

from .alarm import RankInfo
from .errors import SdcAgentError

INSTANCE_PREFIX = "hyperpod-"


class TopologyError(SdcAgentError, ValueError):
    """The replay pairs cannot be placed on distinct nodes: the audit could not attribute a fault."""


def group_ranks(dp_group: dist.ProcessGroup | None) -> list[int]:
    """Global ranks of the data-parallel group, indexed by DP rank."""
    return list(dist.get_process_group_ranks(dp_group or dist.group.WORLD))


def collective_device(dp_group: dist.ProcessGroup | None) -> torch.device:
    """The device tensors must live on for this group's collectives (CUDA for NCCL)."""
    backend = dist.get_backend(dp_group or dist.group.WORLD)
    if "nccl" in str(backend).lower() and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_gather_text(text: str, dp_group: dist.ProcessGroup | None) -> list[str]:
    """Gather one string per DP rank, with plain tensor collectives (no pickling, no numpy)."""
    device = collective_device(dp_group)
    world = dist.get_world_size(dp_group)
    payload = torch.tensor(list(text.encode()), dtype=torch.uint8, device=device)
    size = torch.tensor([payload.numel()], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size, group=dp_group)
    longest = int(max(s.item() for s in sizes))
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[: payload.numel()] = payload
    gathered = [torch.zeros_like(padded) for _ in range(world)]
    dist.all_gather(gathered, padded, group=dp_group)
    return [
        bytes(g[: int(s.item())].tolist()).decode() for g, s in zip(gathered, sizes, strict=True)
    ]


def local_rank_info() -> RankInfo:
    """This process's placement, from the environment a HyperPod EKS pod has.

    NODE_NAME comes from the Kubernetes downward API (spec.nodeName); HyperPod names nodes
    ``hyperpod-<instance id>``. The pod name is POD_NAME, else HOSTNAME (a pod's hostname).
    """
    node_name = os.environ.get("NODE_NAME") or socket.gethostname()
    instance_id = node_name.removeprefix(INSTANCE_PREFIX)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    gpu_uuid = "cpu"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        uuid = getattr(props, "uuid", None)
        gpu_uuid = f"GPU-{uuid}" if uuid is not None else f"cuda:{torch.cuda.current_device()}"
    pod_name = os.environ.get("POD_NAME") or os.environ.get("HOSTNAME")
    return RankInfo(
        rank=dist.get_rank(),
        node_name=node_name,
        instance_id=instance_id,
        gpu_uuid=gpu_uuid,
        local_rank=local_rank,
        pod_name=pod_name,
    )


def rank_map(dp_group: dist.ProcessGroup | None = None) -> dict[int, RankInfo]:
    """Every DP rank's placement, keyed by global rank. Collective: call it on every rank."""
    mine = local_rank_info()
    texts = all_gather_text(json.dumps({"rank": mine.rank, **mine.to_dict()}), dp_group)
    infos = [json.loads(t) for t in texts]
    return {
        info["rank"]: RankInfo(
            rank=info["rank"],
            node_name=info["node_name"],
            instance_id=info["instance_id"],
            gpu_uuid=info["gpu_uuid"],
            local_rank=info["local_rank"],
            pod_name=info.get("pod_name"),
        )
        for info in infos
    }


def replay_partners(dp_rank: int, world: int, peer_offset: int) -> tuple[int, int, int]:
    """(target, replayer, third) DP ranks for ``dp_rank`` as a target.

    The target's micro-batch is replayed by ``target - peer_offset``; a disputed result is settled
    by ``target + peer_offset`` (a third GPU), so each rank sits in exactly two comparisons.
    """
    return dp_rank, (dp_rank - peer_offset) % world, (dp_rank + peer_offset) % world


def groups_on(ring: Sequence[int], groups: Sequence[Sequence[int]]) -> list[list[int]]:
    """The ``groups`` of ranks that compute together (global ranks) whose ranks all lie on
    ``ring`` (a ring of replicas, global ranks in ring order), as positions on it: what
    :func:`validate_placement` checks along that ring."""
    position = {rank: i for i, rank in enumerate(ring)}
    return [[position[r] for r in group] for group in groups if all(r in position for r in group)]


def validate_placement(
    nodes: list[str], peer_offset: int, groups: Sequence[Sequence[int]] = ()
) -> None:
    """Raise TopologyError unless every target, its replayer and its third GPU are on three nodes.

    ``nodes[i]`` is the node of DP rank i. ``groups``: DP ranks that compute one micro-batch
    together (tensor-parallel groups, each in its tp order): each group's ranks must replay the
    ranks at the same positions of ONE other group, so that a group replays another group's
    micro-batch together and each rank is compared with the rank that computed its slice.
    """
    world = len(nodes)
    _validate_group_targets(world, peer_offset, groups)
    if world < 3:
        raise TopologyError(
            f"the replay audit needs at least 3 data-parallel ranks on 3 nodes, got {world}; "
            "disable audits with Schedule(audit_every=0)"
        )
    distinct = sorted(set(nodes))
    if len(distinct) < 3:
        # No peer_offset can help: say what the ranks report, which is usually NODE_NAME set
        # to something else than the node's name (the cluster's, a constant in the manifest).
        raise TopologyError(
            f"the {world} data-parallel ranks report only {len(distinct)} node name(s) "
            f"({', '.join(repr(n) for n in distinct[:2])}); the replay audit needs them on at "
            "least 3 nodes. If the job does run on 3 or more nodes, NODE_NAME is not the node's "
            "name: set it from the pod's spec.nodeName (downward API, docs/agent-install.md); "
            "else disable audits with Schedule(audit_every=0)"
        )
    problems = []
    for dp_rank in range(world):
        target, replayer, third = replay_partners(dp_rank, world, peer_offset)
        placed = {nodes[target], nodes[replayer], nodes[third]}
        if len(placed) < 3:
            problems.append(
                f"rank {target} ({nodes[target]}) is replayed by rank {replayer} "
                f"({nodes[replayer]}) and confirmed by rank {third} ({nodes[third]})"
            )
    if problems:
        shown = "; ".join(problems[:3]) + (
            f"; and {len(problems) - 3} more" if len(problems) > 3 else ""
        )
        raise TopologyError(
            f"peer_offset={peer_offset} does not put each replay pair and its third GPU on three "
            f"different nodes (world={world}): {shown}. Set peer_offset to the number of GPUs per "
            "node, and run on at least 3 nodes"
        )


def _validate_group_targets(world: int, peer_offset: int, groups: Sequence[Sequence[int]]) -> None:
    """Raise TopologyError unless ``peer_offset`` maps each group onto another group, position by
    position (see :func:`validate_placement`)."""
    position = {rank: (g, i) for g, group in enumerate(groups) for i, rank in enumerate(group)}
    for g, group in enumerate(groups):
        targets = [position.get((rank + peer_offset) % world) for rank in group]
        found = [t for t in targets if t is not None]
        if (
            len(found) < len(targets)
            or {t[0] for t in found} == {g}
            or any(t != (found[0][0], i) for i, t in enumerate(found))
        ):
            raise TopologyError(
                f"peer_offset={peer_offset} sends the tensor-parallel group {list(group)} to "
                f"replay ranks {[(rank + peer_offset) % world for rank in group]}, which are not "
                "the same positions of one other group: with tensor parallelism peer_offset must "
                f"be a multiple of the TP degree ({len(group)}) that moves to another group "
                "(the GPUs per node, when a TP group fills a node)"
            )


def check_topology(
    dp_group: dist.ProcessGroup | None = None, peer_offset: int = 8
) -> dict[int, RankInfo]:
    """Check the audit's placement rule on the live job (collective); return the rank map.

    Raises TopologyError on every rank, with the offending ranks and nodes, when a replay pair
    or its confirming third GPU share a node (node names from NODE_NAME).
    """
    ranks = rank_map(dp_group)
    validate_placement([ranks[g].node_name for g in group_ranks(dp_group)], peer_offset)
    return ranks

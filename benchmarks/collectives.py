"""Every collective the guard issues: payload, NCCL's modelled latency at scale, gloo measured here.

Two modes:

    python benchmarks/collectives.py --model     # NCCL's cost model at 8, 1,024 and 16,384 ranks,
                                                 # the tensor-parallel and pipeline dimensions'
                                                 # rows included
    python benchmarks/collectives.py             # gloo on this CPU at 3, 6, 9 and 12 processes
    python benchmarks/collectives.py --sizes 3,6,12 --reps 300 --json out.json

The model (``--model``) is NCCL's own tuning model, the one it uses to pick an algorithm and a
protocol per call: ``src/graph/tuning.cc`` of NCCL 2.20.3 (github.com/NVIDIA/nccl, commit
b6475625), ``ncclTopoTuneModel`` for the latency and bandwidth of each (algorithm, protocol) and
``ncclTopoGetAlgoTime`` for ``time = latency + bytes / bandwidth``. Only the Ring and Tree
algorithms are modelled (NVLS needs NVLink SHARP, CollNet in-network reduction, and PAT, added in
NCCL 2.23, was used at one rank per node only when introduced); for each call the fastest of ring/tree x
LL/LL128/Simple is reported, as NCCL would pick it. Bandwidths are the hardware's peak bus
bandwidth (``--busbw-intra``, ``--busbw-inter``; "busbw" as nccl-tests defines it), so the
bandwidth terms are lower bounds; the latency terms are NCCL's constants and do not depend on
them. Nodes hold 8 GPUs each (``--gpus-per-node``).

The measurement launches N gloo processes on this machine (one intra-op thread each, as the
drills do) and times each collective shape the guard issues, after a barrier so that every
repetition starts together; a repetition's time is the slowest rank's (a collective is over when
the last rank has its result). Median and p90 over ``--reps`` repetitions after ``--warmup``.
Nothing is asserted: on a shared or oversubscribed machine (more processes than CPUs) these
figures include waiting for a core, and the output says so.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from results import Recorder, model_cell
from results import short_size as _size
from results import short_time as _time

from sdc_agent.alarm import RankInfo
from sdc_agent.checks.replay.attribution import ROW_WIDTH
from sdc_agent.checks.replay.pipeline import row_width as pipeline_row_width
from sdc_agent.drills.launch import launch
from sdc_agent.topology import all_gather_text

INT64 = 8
FLAGS = 3
"""Check 1's flags per rank: [local gradient non-finite, reduced gradient non-finite, an online
sensor flagged] (sdc_agent's FlagExchange); the per-step reduction adds one: [..., any rank
clean]."""
FLAG_REDUCTION = FLAGS + 1
FINGERPRINT_WIDTH = 2
"""int64 values per tensor in a fingerprint table (``fingerprints`` returns [T, 2])."""
DDP_BUCKET_BYTES = 25 * 2**20
"""DDP's default gradient bucket (bucket_cap_mb=25): its all-reduce, for scale."""
MODEL_RANKS = (8, 1024, 16384)


def rank_map_text(rank: int) -> str:
    """A realistic rank-map entry (the JSON each rank sends at start), for its length."""
    info = RankInfo(
        rank=rank,
        node_name="hyperpod-i-0123456789abcdef0",
        instance_id="i-0123456789abcdef0",
        gpu_uuid="GPU-12345678-1234-1234-1234-123456789abc",
        local_rank=rank % 8,
        pod_name=f"llm-pretrain-worker-{rank}",
    )
    return json.dumps({"rank": info.rank, **info.to_dict()})


@dataclass(frozen=True)
class Collective:
    """One collective the guard issues, as the NCCL model and the gloo measurement see it."""

    name: str
    when: str
    op: str
    """'all_reduce' or 'all_gather' (NCCL's nBytes for an all-gather is the whole output)."""
    payload: str
    """The payload as a formula of N (ranks), T (tensors), D (disputed targets), L (text)."""
    nbytes: Callable[[int, int], int]
    """Bytes NCCL moves, as a function of (N, T): the buffer for an all-reduce, N x the
    per-rank part for an all-gather (the group's size in place of N for a group's)."""
    group: Callable[[int, int], tuple[int, int]] | None = None
    """(ranks in the collective, ranks of it per node) as a function of (N, GPUs per node), for
    a collective over a group smaller than the job (None: all N ranks, a node's GPUs each)."""
    measured: bool = True
    """Whether the gloo measurement times it too (the tensor-parallel rows are modelled only)."""


def collectives(disputed: int = 1) -> list[Collective]:
    """Every collective the guard issues (and DDP's own bucket all-reduce, for scale)."""
    text = len(rank_map_text(16383).encode())
    return [
        Collective(
            "ddp_bucket", "per step (DDP's, not ours)", "all_reduce", "25 MiB per bucket",
            lambda n, t: DDP_BUCKET_BYTES,
        ),
        Collective(
            "flags_max", "per step", "all_reduce", f"{FLAG_REDUCTION * INT64} B",
            lambda n, t: FLAG_REDUCTION * INT64,
        ),
        Collective(
            "flags_detail", "only when a flag is set", "all_gather", f"N x {FLAGS * INT64} B",
            lambda n, t: n * FLAGS * INT64,
        ),
        Collective(
            "audit_gather", "per audit", "all_gather", f"N x {2 * ROW_WIDTH * INT64} B",
            lambda n, t: n * 2 * ROW_WIDTH * INT64,
        ),
        Collective(
            "confirm_sum", "per audit, only on a mismatch", "all_reduce",
            f"D x {2 * ROW_WIDTH * INT64} B (D={disputed})",
            lambda n, t: disputed * 2 * ROW_WIDTH * INT64,
        ),
        Collective(
            "weights_max", "per weight check", "all_reduce",
            f"T x {2 * FINGERPRINT_WIDTH * INT64} B",
            lambda n, t: t * 2 * FINGERPRINT_WIDTH * INT64,
        ),
        Collective(
            "weights_gather", "per weight check, only on disagreement", "all_gather",
            f"N x T x {FINGERPRINT_WIDTH * INT64} B",
            lambda n, t: n * t * FINGERPRINT_WIDTH * INT64,
        ),
        Collective(
            "rank_map_sizes", "at start", "all_gather", f"N x {INT64} B",
            lambda n, t: n * INT64,
        ),
        Collective(
            "rank_map_text", "at start", "all_gather", f"N x L B (L={text})",
            lambda n, t: n * text,
        ),
    ]  # fmt: skip


TP_ACTIVATION_BYTES = 1024 * 8192 * 2
"""A row-parallel layer's partial output for scale: 1,024 tokens x 8,192 hidden, bf16."""
EVENTS_PER_TENSOR = 2
"""Ordered local results per parameter tensor under TP (its module's output, its gradient)."""


def tp_collectives() -> list[Collective]:
    """The tensor-parallel dimension's collectives, TP groups filling a node (TP = GPUs per
    node) and HSDP replicas one per node: the model's own (for scale), check 2's exchange of
    ordered local results (only when some pair mismatched) and check 3's groups (modelled only)."""
    events = EVENTS_PER_TENSOR * FINGERPRINT_WIDTH * INT64
    return [
        Collective(
            "tp_partial_sum", "per row-parallel layer, every step and replay (the model's)",
            "all_reduce", f"{TP_ACTIVATION_BYTES // 2**20} MiB in the TP group (one node)",
            lambda n, t: TP_ACTIVATION_BYTES,
            group=lambda n, g: (min(n, g), min(n, g)), measured=False,
        ),
        Collective(
            "tp_local_shift", "per audit, only on a mismatch (TP)", "send_recv",
            f"E x {FINGERPRINT_WIDTH * INT64} B to one rank on another node (E = "
            f"{EVENTS_PER_TENSOR}T)",
            lambda n, t: t * events,
            group=lambda n, g: (2, 1), measured=False,
        ),
        Collective(
            "tp_first_gather", "per audit, only on a mismatch (TP)", "all_gather",
            f"N x {INT64} B", lambda n, t: n * INT64, measured=False,
        ),
        Collective(
            "tp_weights_max", "per weight check (HSDP x TP: a slice's replicas)", "all_reduce",
            f"T x {2 * FINGERPRINT_WIDTH * INT64} B over N / TP ranks, one per node",
            lambda n, t: t * 2 * FINGERPRINT_WIDTH * INT64,
            group=lambda n, g: (n // g, 1), measured=False,
        ),
        Collective(
            "tp_weights_agree", "per weight check (HSDP x TP: a replica's slices)", "all_gather",
            f"TP x {5 * INT64} B in one node",
            lambda n, t: n * 5 * INT64,
            group=lambda n, g: (min(n, g), min(n, g)), measured=False,
        ),
    ]  # fmt: skip


PP_STAGES = 8
"""Pipeline stages in the modelled pipeline job: one per node, each node's 8 GPUs holding 8
replicas of that stage (pipeline across nodes, data parallel within and across them)."""
PP_ACTIVATION_BYTES = 1024 * 8192 * 2
"""One micro-batch's activations sent to the next stage, for scale: 1,024 tokens x 8,192
hidden, bf16 (the gradient sent back is the same size)."""
PP_ROW_BYTES = 2 * pipeline_row_width(1) * INT64
"""A rank's two rows in the pipeline audit's gather (its own outcome and its replay's)."""
PP_NAME_BYTES = 48
"""One parameter name in a stage's name list (JSON), for scale."""


def pp_collectives(stages: int = PP_STAGES, disputed: int = 1) -> list[Collective]:
    """The pipeline dimension's collectives (modelled only), ``stages`` stages one per node:
    the model's own sends (for scale), check 1's per-step agreement and clipping norm, check 2's
    replays, gather and confirmation rounds, check 3's groups, and the set-up."""
    row = PP_ROW_BYTES // 2
    return [
        Collective(
            "pp_stage_send", "per micro-batch and direction, every step (the model's)",
            "send_recv", f"{PP_ACTIVATION_BYTES // 2**20} MiB to the next stage's node",
            lambda n, t: PP_ACTIVATION_BYTES,
            group=lambda n, g: (2, 1), measured=False,
        ),
        Collective(
            "pp_flags_max", "per step, AWAITED by every rank (the stages decide together)",
            "all_reduce", f"{FLAG_REDUCTION * INT64} B",
            lambda n, t: FLAG_REDUCTION * INT64, measured=False,
        ),
        Collective(
            "pp_clip_norm", "per step with max_grad_norm: the stages' norms", "all_reduce",
            f"{INT64} B over a pipeline's {stages} ranks, one per node",
            lambda n, t: INT64,
            group=lambda n, g: (min(n, stages), 1), measured=False,
        ),
        Collective(
            "pp_replay_send", "per audit: one more pipeline step (the replay)", "send_recv",
            "as pp_stage_send, x micro-batches x 2 directions",
            lambda n, t: PP_ACTIVATION_BYTES,
            group=lambda n, g: (2, 1), measured=False,
        ),
        Collective(
            "pp_rebuild_agree", "per audit and confirmation round: every feed rebuilt",
            "all_reduce", f"{INT64} B", lambda n, t: INT64, measured=False,
        ),
        Collective(
            "pp_audit_gather", "per audit", "all_gather", f"N x {2 * row} B (a stage's rows)",
            lambda n, t: n * 2 * row, measured=False,
        ),
        Collective(
            "pp_confirm_sum", "per audit, per disputed replica", "all_reduce",
            f"D x 2 x P x {row} B (D={disputed}, P={stages})",
            lambda n, t: disputed * 2 * stages * row, measured=False,
        ),
        Collective(
            "pp_weights_max", "per weight check (PP x HSDP: a stage's copies)", "all_reduce",
            f"T/P x {2 * FINGERPRINT_WIDTH * INT64} B over N/P ranks, 8 per node",
            lambda n, t: max(1, t // stages) * 2 * FINGERPRINT_WIDTH * INT64,
            group=lambda n, g: (n // stages, min(n // stages, g)), measured=False,
        ),
        Collective(
            "pp_weights_agree", "per weight check (a weight replica's stages)", "all_gather",
            f"P x {5 * INT64} B, one rank per node",
            lambda n, t: n * 5 * INT64,
            group=lambda n, g: (min(n, stages), 1), measured=False,
        ),
        Collective(
            "pp_grid", "at start: every rank's (replica, stage, copy, shard)", "all_gather",
            f"N x {4 * INT64} B", lambda n, t: n * 4 * INT64, measured=False,
        ),
        Collective(
            "pp_stage_names", "at start: the stages' parameter names (check 3's report)",
            "all_gather", f"P x T/P x {PP_NAME_BYTES} B over a pipeline",
            lambda n, t: n * max(1, t // stages) * PP_NAME_BYTES,
            group=lambda n, g: (min(n, stages), 1), measured=False,
        ),
    ]  # fmt: skip


# ------------------------------------------------------------------ NCCL's cost model (2.20.3)
PROTOCOLS = ("LL", "LL128", "Simple")
BASE_LAT_US = {"tree": (6.8, 14.0, 0.0), "ring": (6.6, 14.0, 8.4)}
"""tuning.cc baseLat[algorithm][protocol], microseconds: the fixed cost of one call."""
HW_LAT_US = {
    "nvlink": {"tree": (0.6, 1.25, 28.0), "ring": (0.6, 1.9, 3.4)},
    "net": {"tree": (5.0, 8.5, 28.0), "ring": (2.7, 4.0, 14.0)},
}
"""tuning.cc hwLat[NVLINK or NET][algorithm][protocol], microseconds per hop."""
LL_MAX_BUSBW = {"one_node": 87.7, "two_nodes": 39.0, "more_nodes": 20.4}
"""tuning.cc llMaxBws (GB/s): Hopper on one node; Intel CPUs across nodes (AMD: 22.5 / 19.0)."""
TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0,
           1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9,
              .9, .9, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7,
               .8, .9, .9),
}  # fmt: skip
"""tuning.cc treeCorrectionFactor: tree bandwidth scale per log2(bytes / 64)."""
CHANNELS = 16
"""NCCL channels assumed for the per-channel bandwidth caps below (Hopper, 4+ nodes)."""
RING_LL128_PER_CHANNEL = 36.7
"""GB/s, tuning.cc perChMaxRingLL128Bws."""
TREE_PER_CHANNEL = 36.0
"""GB/s, tuning.cc perChMaxTreeBws."""
TREE_LL128_PER_CHANNEL = 29.0
"""GB/s, tuning.cc perChMaxTreeLL128Bws."""


@dataclass(frozen=True)
class Fabric:
    """What the model assumes about the machines (the defaults: p5en-like H200 nodes)."""

    gpus_per_node: int = 8
    busbw_intra: float = 450.0
    """GB/s: one GPU's NVLink 4 bandwidth per direction (H200: 900 GB/s bidirectional)."""
    busbw_inter: float = 400.0
    """GB/s: one node's network bandwidth (3,200 Gbps EFA on p5en), the ring's bus bottleneck."""
    net_overhead_us: float = 1.0
    """tuning.cc getNetOverhead: 1 us per network post on Intel CPUs (2 on AMD), x3 for Simple."""


@dataclass(frozen=True)
class Estimate:
    """NCCL's modelled time of one call with one algorithm and protocol."""

    algorithm: str
    protocol: str
    hops: int
    latency_us: float
    bandwidth_us: float

    @property
    def total_us(self) -> float:
        """Latency plus the bandwidth term, as ncclTopoGetAlgoTime adds them."""
        return self.latency_us + self.bandwidth_us


def _log2i(n: int) -> int:
    """tuning.cc log2i: floor(log2(n)), 0 for n <= 1."""
    return max(n, 1).bit_length() - 1


def nccl_estimate(
    op: str, algorithm: str, protocol: str, nbytes: int, ranks: int, fabric: Fabric
) -> Estimate | None:
    """One (algorithm, protocol)'s modelled time for ``op`` on ``ranks`` GPUs, or None where
    NCCL does not offer it (tree all-gather).

    Mirrors ncclTopoTuneModel and ncclTopoGetAlgoTime of NCCL 2.20.3 for ring and tree, with
    the graph's extra inter-node latency (latencyInter) at 0 and CHANNELS channels for the
    per-channel caps (none of which binds at the default bandwidths).
    """
    if op == "all_gather" and algorithm == "tree":
        return None
    p = PROTOCOLS.index(protocol)
    nodes = max(1, ranks // fabric.gpus_per_node)
    ppn = ranks // nodes
    channels = CHANNELS
    steps = 2 * (ranks - 1) if op == "all_reduce" else ranks - 1
    # Bandwidth (GB/s): bus bandwidth with the protocol's refinements, then algorithm bandwidth.
    busbw = fabric.busbw_intra if nodes <= 2 else fabric.busbw_inter
    ll_max = LL_MAX_BUSBW[("one_node", "two_nodes", "more_nodes")[min(nodes, 3) - 1]]
    if algorithm == "ring":
        if protocol == "LL":  # a third only for a one-node all-gather (or broadcast)
            busbw = min(ll_max, busbw / (3 if nodes == 1 and op == "all_gather" else 4))
        elif protocol == "LL128":
            busbw = min(busbw * (0.7 if ppn < 2 else 0.92), channels * RING_LL128_PER_CHANNEL)
        algbw = busbw * ranks / steps
    else:
        busbw = min(busbw * 0.92, channels * TREE_PER_CHANNEL)
        if protocol == "LL":
            busbw = min(busbw / 3.8, ll_max)
        elif protocol == "LL128":
            scale = 7 / 9 if nodes == 1 else 120 / 128
            busbw = min(busbw * scale, channels * TREE_LL128_PER_CHANNEL)
        algbw = busbw * 0.5
        size_class = _log2i(nbytes >> 6)
        if size_class < len(TREE_CORRECTION[protocol]):
            algbw *= TREE_CORRECTION[protocol][size_class]
    # Latency (us): a base cost plus one hardware latency per hop, intra- or inter-node.
    latency = BASE_LAT_US[algorithm][p]
    intra = HW_LAT_US["nvlink"][algorithm][p]
    inter = HW_LAT_US["net"][algorithm][p]
    if algorithm == "ring":
        # Ring steps that cross a node boundary (tuning.cc nInterSteps).
        all_reduce_inter = 2 * nodes if nodes > 1 else 0
        inter_steps = all_reduce_inter if op == "all_reduce" else nodes - 1
        if nodes > 1:  # every ring step still posts a network send
            overhead = fabric.net_overhead_us * (3 if protocol == "Simple" else 1)
            intra = max(intra, overhead)
        latency += (steps - inter_steps) * intra + inter_steps * inter
        hops = steps
        plateau = nbytes / (channels * ranks) >= 64
        if op == "all_reduce" and protocol == "Simple" and nodes > 1 and plateau:
            latency *= 1.4  # "plateau effect of ring" (Hopper; 1.9 before Ampere)
    else:
        hops = 2 * ((ppn - 1) + _log2i(nodes))
        latency += 2 * ((ppn - 1) * intra + _log2i(nodes) * inter)
    return Estimate(algorithm, protocol, hops, latency, nbytes / (1000 * algbw))


def nccl_best(
    op: str, nbytes: int, ranks: int, fabric: Fabric, algorithms: tuple[str, ...] = ("ring", "tree")
) -> Estimate:
    """The fastest modelled (algorithm, protocol) for the call, as NCCL's tuner picks it."""
    options = [
        nccl_estimate(op, a, p, nbytes, ranks, fabric) for a in algorithms for p in PROTOCOLS
    ]
    return min((e for e in options if e is not None), key=lambda e: e.total_us)


def p2p_estimate(nbytes: int, fabric: Fabric) -> Estimate:
    """One send/receive pair between two nodes. NCCL's tuner does not model point-to-point
    calls (tuning.cc covers collectives); approximated as one Simple-protocol network hop: the
    ring's base latency and per-hop network latency, plus the bytes at one node's network
    bandwidth."""
    p = PROTOCOLS.index("Simple")
    latency = BASE_LAT_US["ring"][p] + HW_LAT_US["net"]["ring"][p]
    return Estimate("p2p", "Simple", 1, latency, nbytes / (1000 * fabric.busbw_inter))


def model_table(fabric: Fabric, tensors: int) -> list[dict[str, Any]]:
    """Per collective and rank count: payload, NCCL's pick, its hops and modelled times."""
    rows = []
    for c in [*collectives(), *tp_collectives(), *pp_collectives()]:
        row: dict[str, Any] = {"name": c.name, "when": c.when, "op": c.op, "payload": c.payload}
        for n in MODEL_RANKS:
            ranks, per_node = c.group(n, fabric.gpus_per_node) if c.group else (n, None)
            if ranks < 2:
                row[str(n)] = None  # a group of one rank: nothing to send
                continue
            group_fabric = replace(fabric, gpus_per_node=per_node) if per_node else fabric
            nbytes = c.nbytes(ranks, tensors)
            if c.op == "send_recv":
                best = ring = p2p_estimate(nbytes, fabric)
            else:
                best = nccl_best(c.op, nbytes, ranks, group_fabric)
                ring = nccl_best(c.op, nbytes, ranks, group_fabric, ("ring",))
            row[str(n)] = {
                "bytes": nbytes,
                "best": f"{best.algorithm}/{best.protocol}",
                "hops": best.hops,
                "latency_us": round(best.latency_us, 1),
                "bandwidth_us": round(best.bandwidth_us, 1),
                "total_us": round(best.total_us, 1),
                "ring_total_us": round(ring.total_us, 1),
            }
        rows.append(row)
    return rows


def print_model(rows: list[dict[str, Any]], fabric: Fabric, tensors: int) -> None:
    """The model table, as markdown (each cell: time, NCCL's pick, hops; ring-only if slower)."""
    print(
        f"NCCL 2.20.3 tuning model, {fabric.gpus_per_node} GPUs per node, busbw "
        f"{fabric.busbw_intra:.0f} GB/s in a node / {fabric.busbw_inter:.0f} GB/s across nodes, "
        f"T = {tensors} tensors; cell: modelled time (algorithm/protocol, hops) "
        "[ring's best where tree wins]"
    )
    heads = [f"{n:,} ranks" for n in MODEL_RANKS]
    print("| collective | when | payload | " + " | ".join(heads) + " |")
    print("|---|---|---|" + "---|" * len(heads))
    for row in rows:
        cells = [model_cell(row[str(n)]) for n in MODEL_RANKS]
        payload = f"{row['op']} {row['payload']}"
        print(f"| {row['name']} | {row['when']} | {payload} | " + " | ".join(cells) + " |")


WEIGHT_TABLE_TENSORS = (200, 2_000, 20_000, 200_000)


def weight_table_scaling(fabric: Fabric, ranks: int = MODEL_RANKS[-1]) -> list[dict[str, Any]]:
    """The weight check's all-reduce against T at ``ranks``: where its bandwidth term starts
    to count (its payload grows with T only, never with N)."""
    out = []
    for tensors in WEIGHT_TABLE_TENSORS:
        nbytes = tensors * 2 * FINGERPRINT_WIDTH * INT64
        best = nccl_best("all_reduce", nbytes, ranks, fabric)
        out.append(
            {
                "tensors": tensors,
                "bytes": nbytes,
                "best": f"{best.algorithm}/{best.protocol}",
                "latency_us": round(best.latency_us, 1),
                "bandwidth_us": round(best.bandwidth_us, 1),
            }
        )
    return out


def print_weight_scaling(rows: list[dict[str, Any]], ranks: int = MODEL_RANKS[-1]) -> None:
    """The weight table's all-reduce against T, as markdown."""
    print(f"\nweights_max against T at {ranks:,} ranks (latency + bandwidth term)")
    print("| T tensors | payload | NCCL's pick | latency | bandwidth term |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['tensors']:,} | {_size(r['bytes'])} | {r['best']} | "
            f"{_time(r['latency_us'])} | {_time(r['bandwidth_us'])} |"
        )


# ------------------------------------------------------------------ gloo, measured here
def _job_path() -> str:
    """'module:function' of :func:`run_collectives` as the spawned workers can import it."""
    module = __spec__.name if __spec__ and __name__ != "__main__" else Path(__file__).stem
    return f"{module}:run_collectives"


def _calls(world: int, tensors: int, disputed: int) -> dict[str, Callable[[], None]]:
    """One closure per collective shape, on tensors made once (as the guard's would be)."""
    rank = dist.get_rank()
    flags = torch.zeros(FLAG_REDUCTION, dtype=torch.int64)
    detail = torch.zeros(FLAGS, dtype=torch.int64)
    gathered_flags = [torch.empty_like(detail) for _ in range(world)]
    rows = torch.zeros((2, ROW_WIDTH), dtype=torch.int64)
    gathered_rows = [torch.empty_like(rows) for _ in range(world)]
    confirm = torch.zeros((disputed, 2, ROW_WIDTH), dtype=torch.int64)
    table = torch.randint(-(2**62), 2**62, (tensors, FINGERPRINT_WIDTH), dtype=torch.int64)
    extremes = torch.cat([table, torch.bitwise_not(table)])
    gathered_tables = [torch.empty_like(table) for _ in range(world)]
    size = torch.zeros(1, dtype=torch.int64)
    sizes = [torch.empty_like(size) for _ in range(world)]
    bucket = torch.zeros(DDP_BUCKET_BYTES // 4, dtype=torch.float32)  # sums stay finite
    text = rank_map_text(rank)

    def wait(work: Any) -> None:
        work.wait()

    return {
        "ddp_bucket": lambda: wait(dist.all_reduce(bucket, async_op=True)),
        "flags_max": lambda: wait(dist.all_reduce(flags, op=dist.ReduceOp.MAX, async_op=True)),
        "flags_detail": lambda: dist.all_gather(gathered_flags, detail),
        "audit_gather": lambda: dist.all_gather(gathered_rows, rows),
        "confirm_sum": lambda: dist.all_reduce(confirm, op=dist.ReduceOp.SUM),
        "weights_max": lambda: wait(dist.all_reduce(extremes, op=dist.ReduceOp.MAX, async_op=True)),
        "weights_gather": lambda: dist.all_gather(gathered_tables, table),
        "rank_map_sizes": lambda: dist.all_gather(sizes, size),
        "rank_map_text": lambda: all_gather_text(text, None),
    }


def run_collectives(
    reps: int, warmup: int, tensors: int, disputed: int, bucket_reps: int
) -> dict[str, Any]:
    """Time every collective shape on this rank (collective: every rank runs the same calls).

    Each repetition starts after a barrier; returns this rank's seconds per repetition.
    """
    world = dist.get_world_size()
    times: dict[str, list[float]] = {}
    for name, call in _calls(world, tensors, disputed).items():
        # The 25 MiB bucket is ~100x the others' time here: fewer repetitions, one warm-up.
        count, skip = (bucket_reps, min(warmup, 1)) if name == "ddp_bucket" else (reps, warmup)
        samples = []
        for i in range(skip + count):
            dist.barrier()
            start = time.perf_counter()
            call()
            elapsed = time.perf_counter() - start
            if i >= skip:
                samples.append(elapsed)
        times[name] = samples
    return {"rank": dist.get_rank(), "times": times}


def _percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def summarise(per_rank: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per collective: median and p90 (ms) of the slowest rank's time per repetition."""
    names = per_rank[0]["times"]
    out = {}
    for name in names:
        slowest = [max(ts) for ts in zip(*(r["times"][name] for r in per_rank), strict=True)]
        out[name] = {
            "median_ms": statistics.median(slowest) * 1e3,
            "p90_ms": _percentile(slowest, 0.9) * 1e3,
            "reps": len(slowest),
        }
    return out


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Launch each size in turn; print and return the summary with the machine's load."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cpus = cpus or 1
    kwargs = {
        "reps": args.reps,
        "warmup": args.warmup,
        "tensors": args.tensors,
        "disputed": 1,
        "bucket_reps": max(3, args.reps // 20),
    }
    by_size: dict[str, Any] = {}
    for world in args.sizes:
        load_before = os.getloadavg()
        start = time.monotonic()
        [per_rank] = launch(
            [(_job_path(), kwargs)], world=world, ranks_per_node=1, timeout_s=args.timeout
        )
        errors = [r for r in per_rank if "error" in r]
        if errors:
            raise RuntimeError(errors[0]["trace"])
        by_size[str(world)] = {
            "collectives": summarise(per_rank),
            "seconds": round(time.monotonic() - start, 1),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
            "oversubscribed": world > cpus,
        }
        load = by_size[str(world)]["loadavg_after"][0]
        print(
            f"  {world:>2} processes: {by_size[str(world)]['seconds']:.0f} s, load average "
            f"{load_before[0]:.1f} -> {load:.1f}"
            + (f" (oversubscribed: {world} processes on {cpus} CPUs)" if world > cpus else ""),
            flush=True,
        )
    return {"cpus": cpus, "config": kwargs, "sizes": by_size}


def print_measured(result: dict[str, Any]) -> None:
    """The measured table, as markdown: median (p90) ms per collective and process count."""
    sizes = list(result["sizes"])
    when = {c.name: (c.when, f"{c.op} {c.payload}") for c in collectives() if c.measured}
    print(
        f"gloo on this machine ({result['cpus']} CPUs), T = {result['config']['tensors']}, "
        f"{result['config']['reps']} repetitions ({result['config']['bucket_reps']} for "
        "ddp_bucket); cell: median (p90) ms of the slowest rank"
    )
    print("| collective | when | payload | " + " | ".join(f"{s} proc." for s in sizes) + " |")
    print("|---|---|---|" + "---|" * len(sizes))
    for name, (moment, payload) in when.items():
        cells = [
            "{median_ms:.2f} ({p90_ms:.2f})".format(**result["sizes"][s]["collectives"][name])
            for s in sizes
        ]
        print(f"| {name} | {moment} | {payload} | " + " | ".join(cells) + " |")
    loads = [f"{s}: {v['loadavg_before'][0]:.1f}" for s, v in result["sizes"].items()]
    print(f"load average (1 min) before each size: {', '.join(loads)}")
    over = [s for s, v in result["sizes"].items() if v["oversubscribed"]]
    if over:
        print(
            f"note: {', '.join(over)} processes exceed this machine's {result['cpus']} CPUs: "
            "those figures include waiting for a core (a process descheduled mid-collective "
            "holds every other rank up), not only gloo's work"
        )


def _sizes(text: str) -> list[int]:
    """Parse --sizes: comma-separated process counts, each >= 2."""
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from err
    if not sizes or min(sizes) < 2:
        raise argparse.ArgumentTypeError("give process counts of at least 2")
    return sizes


def main(argv: list[str] | None = None) -> int:
    """Print the model table (--model) or measure gloo at each size."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--model", action="store_true", help="print NCCL's modelled latency table and exit"
    )
    parser.add_argument(
        "--sizes", type=_sizes, default=[3, 6, 9, 12], help="gloo process counts (3,6,9,12)"
    )
    parser.add_argument("--reps", type=int, default=60, help="timed repetitions per shape")
    parser.add_argument("--warmup", type=int, default=5, help="untimed repetitions first")
    parser.add_argument(
        "--tensors", type=int, default=200, help="T: parameter tensors in the weight table"
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per size")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="model: ranks per node (8)")
    parser.add_argument(
        "--busbw-intra", type=float, default=450.0, help="model: NVLink bus bandwidth, GB/s"
    )
    parser.add_argument(
        "--busbw-inter", type=float, default=400.0, help="model: network bus bandwidth, GB/s"
    )
    parser.add_argument(
        "--net-overhead", type=float, default=1.0, help="model: us per network post (AMD: 2)"
    )
    parser.add_argument("--json", type=Path, help="also write the table(s) here as JSON")
    args = parser.parse_args(argv)
    recorder = Recorder(__file__, argv)
    for field in ("reps", "tensors", "gpus_per_node"):
        if getattr(args, field) < 1:
            parser.error(f"--{field.replace('_', '-')} must be at least 1")
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    fabric = Fabric(
        gpus_per_node=args.gpus_per_node,
        busbw_intra=args.busbw_intra,
        busbw_inter=args.busbw_inter,
        net_overhead_us=args.net_overhead,
    )
    document: dict[str, Any] = {
        "machine": {
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "torch": torch.__version__,
        }
    }
    rows = model_table(fabric, args.tensors)
    scaling = weight_table_scaling(fabric)
    document["model"] = {
        "fabric": fabric.__dict__,
        "tensors": args.tensors,
        "rows": rows,
        "weights_max_by_tensors": scaling,
    }
    if args.model:
        print_model(rows, fabric, args.tensors)
        print_weight_scaling(scaling)
    else:
        print(f"measuring gloo at {args.sizes} processes (load average {os.getloadavg()[0]:.1f})")
        document["gloo"] = measure(args)
        print_measured(document["gloo"])
    if args.json:
        recorder.write(args.json, document)
        print(f"written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

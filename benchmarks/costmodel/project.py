"""The projection: a slice's recorded counts onto a full model's step on an H100 and an H200.

Every constant is here, with where it comes from; the output repeats them. This is a MODEL,
not a measurement: no GPU ran.

Per operator (at the full model's sizes, :class:`~.recorder.Scaling`), GPU time is
``max(bytes / (HBM bandwidth x MEMORY_EFFICIENCY), FLOPs / (GEMM rate x GEMM_EFFICIENCY),
LAUNCH_S)``: memory-bound operators at 80% of peak bandwidth, GEMMs at 70% of the dense rate
(bf16/fp16 operands at the tensor cores' rate, fp32 operands at the fp32 rate: PyTorch's default
leaves TF32 off for matmuls), and no kernel shorter than one launch. The guard's added time is
the difference of those sums (guarded minus plain), plus per host sync ``SYNC_S``, plus each
collective the guard adds at NCCL's own tuning model (``benchmarks/collectives.py``) over the
job's ranks, plus ``STRAGGLER_S`` for a blocking wait on a collective issued in the same step
(every rank then waits for the slowest). The step it is compared with is the full model's at
``MFU`` of the dense bf16 rate (6 x parameters x tokens plus the attention's FLOPs).

From the slice to the model: the slice runs 1 and 2 decoder layers; per phase (a micro-batch's
forward and backward; the rest of the step) the per-layer part is the difference and the rest
the 1-layer run minus it, so ``full = one_layer + (layers - 1) x (two_layers - one_layer)``;
the micro-batch phase counts ``micro_batches`` times. Tokens and vocabulary scale by shape.
The extra peak memory is the 2-layer run's plus, per further layer, its growth from 1 to 2
layers when it grows (a maximum does not add up over layers; it never shrinks with them).
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from collectives import Fabric, nccl_best


@dataclass(frozen=True, kw_only=True)
class Gpu:
    """A GPU's peaks (dense, no sparsity), from NVIDIA's data sheets (SXM parts)."""

    name: str
    hbm_tb_s: float
    bf16_tflops: float
    fp32_tflops: float
    nvlink_gb_s: float
    """Per direction (NVLink 4: 900 GB/s bidirectional)."""
    efa_gb_s_per_node: float
    """EFA per node: 3,200 Gbps on p5 (H100) and p5en (H200)."""


GPUS = (
    Gpu(
        name="H100",
        hbm_tb_s=3.35,
        bf16_tflops=989.0,
        fp32_tflops=67.0,
        nvlink_gb_s=450.0,
        efa_gb_s_per_node=400.0,
    ),
    Gpu(
        name="H200",
        hbm_tb_s=4.8,
        bf16_tflops=989.0,
        fp32_tflops=67.0,
        nvlink_gb_s=450.0,
        efa_gb_s_per_node=400.0,
    ),
)
MEMORY_EFFICIENCY = 0.8
GEMM_EFFICIENCY = 0.7
MFU = 0.4
"""The plain step's model-FLOPs utilisation (what the percentages are of)."""
LAUNCH_S = 4.5e-6
"""The shortest a kernel takes on the GPU's timeline, launch included (4-5 us)."""
SYNC_S = 15e-6
"""A host sync: the device-to-host copy's round trip and the stream restart after it (10-20 us),
beyond what the GPU still had queued."""
STRAGGLER_S = 100e-6
"""A blocking wait on a collective issued in the same step waits for the slowest rank: host
jitter at the max over ranks (assumed, not measured; 1,024 GPUs)."""
GPUS_PER_NODE = 8


def constants() -> dict[str, Any]:
    """Every constant of the projection, JSON-ready."""
    return {
        "gpus": [asdict(g) for g in GPUS],
        "memory_efficiency": MEMORY_EFFICIENCY,
        "gemm_efficiency": GEMM_EFFICIENCY,
        "mfu_of_the_plain_step": MFU,
        "launch_s": LAUNCH_S,
        "sync_s": SYNC_S,
        "straggler_s": STRAGGLER_S,
        "gpus_per_node": GPUS_PER_NODE,
        "collectives": "NCCL 2.20.3's tuning model (benchmarks/collectives.py), ring/tree",
    }


def roofline(full_bytes: float, full_flops: float, gemm: bool, fp32: bool) -> dict[str, float]:
    """One operator's modelled seconds on each GPU (see the module docstring)."""
    out = {}
    for g in GPUS:
        memory = full_bytes / (g.hbm_tb_s * 1e12 * MEMORY_EFFICIENCY)
        rate = (g.fp32_tflops if fp32 else g.bf16_tflops) * 1e12 * GEMM_EFFICIENCY
        compute = full_flops / rate if gemm else 0.0
        out[g.name] = max(memory, compute, LAUNCH_S)
    return out


@dataclass(frozen=True, kw_only=True)
class Job:
    """A full training job: the model, its layout, its step."""

    name: str
    title: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    tp: int
    gpus: int
    sequence: int
    micro_batch: int
    """Sequences per micro-batch per data-parallel rank (per TP group under TP)."""
    micro_batches: int
    """Gradient accumulation steps."""
    parallel: str
    bf16: str
    note: str = ""

    @property
    def parameters(self) -> float:
        """Parameters of the whole model (untied embedding and head; norms left out)."""
        attention = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        mlp = 3 * self.hidden * self.ffn
        return self.layers * (attention + mlp) + 2 * self.vocab * self.hidden

    @property
    def tokens_per_gpu(self) -> int:
        """Tokens a GPU computes per step (a TP group shares its tokens)."""
        return self.sequence * self.micro_batch * self.micro_batches

    def step_s(self) -> float:
        """The plain step on one GPU at :data:`MFU` (H100 and H200 alike: the same bf16 rate)."""
        dense = 6 * self.parameters * self.tokens_per_gpu
        # Causal attention: QK^T and PV, forward 2 x 2 x S x d per token per layer, halved by
        # the mask, x3 with the backward.
        attention = 6 * self.layers * self.sequence * self.heads * self.head_dim
        attention *= self.tokens_per_gpu
        return (dense + attention) / self.tp / (GPUS[0].bf16_tflops * 1e12 * MFU)

    def slice_shape(self) -> dict[str, int]:
        """What one rank holds of a layer (TP splits heads, key/value heads and the FFN)."""
        return {
            "hidden": self.hidden,
            "heads": self.heads // self.tp,
            "kv_heads": max(1, self.kv_heads // self.tp),
            "head_dim": self.head_dim,
            "ffn": self.ffn // self.tp,
        }

    @property
    def local_vocab(self) -> int:
        """The vocabulary one rank's head computes (TP shards the head's output)."""
        return self.vocab // self.tp


JOBS = (
    Job(
        name="llama3-8b-fsdp",
        title="(a) Llama-3-8B, FSDP2, 64 GPUs",
        layers=32,
        hidden=4096,
        heads=32,
        kv_heads=8,
        head_dim=128,
        ffn=14336,
        vocab=128256,
        tp=1,
        gpus=64,
        sequence=8192,
        micro_batch=2,
        micro_batches=4,
        parallel="fsdp",
        bf16="params",
        note="full sharding, bf16 parameters, fp32 gradient reduction; 2x8K per micro-batch, "
        "accumulation 4 (4.2M tokens per step)",
    ),
    Job(
        name="llama3-70b-tp8-fsdp",
        title="(b) Llama-3-70B, TP8 x FSDP2, 1,024 GPUs",
        layers=80,
        hidden=8192,
        heads=64,
        kv_heads=8,
        head_dim=128,
        ffn=28672,
        vocab=128256,
        tp=8,
        gpus=1024,
        sequence=8192,
        micro_batch=1,
        micro_batches=4,
        parallel="fsdp",
        bf16="params",
        note="TP=8 in a node x FSDP=128; one rank's slice: 8 of 64 heads, 1 of 8 key/value "
        "heads, 3,584 of 28,672 FFN columns, 16,032 of 128,256 vocabulary rows; 1x8K per "
        "micro-batch, accumulation 4 (4.2M tokens per step)",
    ),
    Job(
        name="blog-953m-ddp",
        title="AWS blog's 953M, DDP, 32 H100",
        layers=16,
        hidden=2048,
        heads=16,
        kv_heads=16,
        head_dim=128,
        ffn=5632,
        vocab=32000,
        tp=1,
        gpus=32,
        sequence=2048,
        micro_batch=8,
        micro_batches=1,
        parallel="ddp",
        bf16="autocast",
        note="ASSUMED shape (the blog gives only the size): a Llama of 16 layers, width 2,048, "
        "16 heads, FFN 5,632, vocabulary 32,000 (953M parameters); 8x2K per GPU, no "
        "accumulation, fp32 parameters under bf16 autocast",
    ),
)
SMOKE = Job(
    name="smoke-tiny",
    title="a tiny Llama (a smoke test of the pipeline, not a job)",
    layers=4,
    hidden=64,
    heads=4,
    kv_heads=2,
    head_dim=16,
    ffn=128,
    vocab=4096,
    tp=1,
    gpus=16,
    sequence=512,
    micro_batch=2,
    micro_batches=2,
    parallel="fsdp",
    bf16="params",
    note="not a real job: `--jobs smoke-tiny` checks the recorder and the projection in a minute",
)
JOBS_BY_NAME = {j.name: j for j in (*JOBS, SMOKE)}

TARGETS = {
    "checks": 1.0,
    "weights": 0.5,
    "audit": 1.0,
    "sensors": 1.0,
    "sensors_all": 3.0,
}
"""Issue 31's targets, % of the H100 step time: always-on check 1 + flags <= 1%, weight checks
every 10 steps <= 0.5% (their own share), deterministic audits every 100 <= 1% (their own
share), sensors at the default budget <= 1% (their own share, over check 1), every sensor every
step <= 3% (over check 1)."""

AMORTISED = {"weights": 10, "audit": 100}
"""Steps per weight check and per audit in the projected schedule."""

PERIODIC_ROLES = (
    "common",
    "first_launched",
    "first_judged",
    "first_audit",
    "launched",
    "judged",
    "audit",
)
"""The three-process run's recorded steps, in order (``slices.PERIODIC``): a common step, the
first weight check (launched, judged) and the first audit, then a later weight check and audit.
The time rows amortise the later ones (the steady state); the first ones also pay what a process
does once (the audit's preflight: two self-replays; each fingerprint plan's index constants,
built once and cached), and count in the peak memory only (an out-of-memory at the first audit
stops the job)."""


# ---------------------------------------------------------------------------- combining
def _phase_quantities(phase: dict[str, Any], job: Job) -> dict[str, Any]:
    """One recorded phase's scalars, the collectives timed at the job's size."""
    fabric = Fabric(gpus_per_node=GPUS_PER_NODE)
    collective_s = 0.0
    collective_bytes = 0.0
    collectives = 0
    for c in phase["collectives"]:
        if not c["guard"] or c["replaces"]:
            continue
        collectives += 1
        collective_bytes += c["full_bytes"]
        op = "all_reduce" if c["op"] in ("all_reduce", "reduce", "barrier") else "all_gather"
        ranks = job.gpus
        nbytes = int(c["full_bytes"]) * (ranks if op == "all_gather" else 1)
        collective_s += nccl_best(op, max(nbytes, 1), ranks, fabric).total_us * 1e-6
    straggler = sum(1 for w in phase["waits"] if w.get("same_step"))
    out = {
        "launches": phase["launches"],
        "full_bytes": phase["full_bytes"],
        "full_flops": phase["full_flops"],
        "syncs": phase["syncs"],
        "waits": len(phase["waits"]),
        "same_step_waits": straggler,
        "guard_collectives": collectives,
        "guard_collective_bytes": collective_bytes,
        "collective_s": collective_s,
    }
    for gpu, seconds in phase["modelled_s"].items():
        out[f"ops_s_{gpu}"] = seconds
    return out


def _linear(*terms: tuple[float, dict[str, float]]) -> dict[str, float]:
    keys = set().union(*(t for _, t in terms))
    return {k: sum(w * t.get(k, 0.0) for w, t in terms) for k in keys}


def step_quantities(recording: dict[str, Any], job: Job) -> dict[str, dict[str, float]]:
    """Per phase, the scalars of one recorded step."""
    return {p: _phase_quantities(v, job) for p, v in recording["phases"].items()}


def added(
    recordings: dict[str, list[dict[str, Any]]], configuration: str, job: Job, period: int
) -> tuple[dict[str, dict[str, float]], float]:
    """What a configuration adds per step over the plain step at one slice depth, per phase,
    amortised over its schedule; and its extra peak live memory (full-size bytes).

    ``recordings``: one process's ``plain``, ``checks``, ``sensors_idle`` and ``sensors_all``
    steps, and three processes' ``periodic`` steps (a common step, the weight-check launch, the
    weight-check judgement, an audit step: their own baseline, as the world differs)."""
    q = {name: [step_quantities(r, job) for r in recs] for name, recs in recordings.items()}
    plain, checks = q["plain"][0], q["checks"][0]
    if len(q["periodic"]) != len(PERIODIC_ROLES):
        raise ValueError(
            f"periodic: {len(q['periodic'])} recorded steps, expected {len(PERIODIC_ROLES)} "
            f"({', '.join(PERIODIC_ROLES)})"
        )
    role = dict(zip(PERIODIC_ROLES, q["periodic"], strict=True))
    common, launched, judged, audited = (role[r] for r in ("common", "launched", "judged", "audit"))
    out: dict[str, dict[str, float]] = {}
    for phase in ("micro", "step"):
        p, c = plain[phase], checks[phase]
        if configuration == "checks":
            out[phase] = _linear((1, c), (-1, p))
        elif configuration == "weights":
            every = AMORTISED["weights"]
            out[phase] = _linear(
                (1, c),
                (-1, p),
                (1 / every, launched[phase]),
                (1 / every, judged[phase]),
                (-2 / every, common[phase]),
            )
        elif configuration == "audit":
            every = AMORTISED["audit"]
            out[phase] = _linear(
                (1, c), (-1, p), (1 / every, audited[phase]), (-1 / every, common[phase])
            )
        elif configuration == "sensors":
            idle, full = q["sensors_idle"][0][phase], q["sensors_all"][0][phase]
            out[phase] = _linear((1, idle), (-1, p), (1 / period, full), (-1 / period, idle))
        elif configuration == "sensors_all":
            out[phase] = _linear((1, q["sensors_all"][0][phase]), (-1, p))
        else:
            raise ValueError(f"unknown configuration {configuration!r}")
    peak = {name: [r["peak_full_bytes"] for r in recs] for name, recs in recordings.items()}
    checks_peak = peak["checks"][0] - peak["plain"][0]
    if configuration == "checks":
        extra = checks_peak
    elif configuration in ("weights", "audit"):
        periodic = dict(zip(PERIODIC_ROLES, peak["periodic"], strict=True))
        roles = (
            ("first_launched", "first_judged", "launched", "judged")
            if configuration == "weights"
            else ("first_audit", "audit")
        )
        steps = [periodic[r] for r in roles]
        extra = checks_peak + max(0.0, max(steps) - periodic["common"])
    elif configuration == "sensors":
        extra = max(peak["sensors_idle"][0], peak["sensors_all"][0]) - peak["plain"][0]
    else:
        extra = peak["sensors_all"][0] - peak["plain"][0]
    return out, extra


def project(
    by_layers: dict[int, dict[str, list[dict[str, Any]]]], job: Job, period: int
) -> dict[str, Any]:
    """Every configuration's projection onto ``job`` from its 1- and 2-layer recordings."""
    rows = {}
    step_s = job.step_s()
    for configuration in TARGETS:
        one, peak_one = added(by_layers[1], configuration, job, period)
        two, peak_two = added(by_layers[2], configuration, job, period)
        phases = {}
        for phase in ("micro", "step"):
            per_layer = _linear((1, two[phase]), (-1, one[phase]))
            phases[phase] = _linear((1, one[phase]), (job.layers - 1, per_layer))
        total = _linear((job.micro_batches, phases["micro"]), (1, phases["step"]))
        # A peak is a maximum, not a sum: it may grow with the layers (what the guard holds for
        # each layer at once), never shrink (a replay that holds one layer's gradient at a
        # time peaks alike at 1 and 2 layers, and the 1-layer run's lower-order terms must not
        # extrapolate to a negative peak at 80 layers).
        peak = peak_two + (job.layers - 2) * max(0.0, peak_two - peak_one)
        percent = {}
        for g in GPUS:
            seconds = (
                total.get(f"ops_s_{g.name}", 0.0)
                + total["syncs"] * SYNC_S
                + total["collective_s"]
                + total["same_step_waits"] * STRAGGLER_S
            )
            percent[g.name] = 100 * seconds / step_s
        share_of = {"weights": "checks", "audit": "checks", "sensors": "checks"}.get(configuration)
        rows[configuration] = {
            "added": {k: total[k] for k in sorted(total)},
            "extra_peak_bytes": peak,
            "percent": percent,
            "target_percent": TARGETS[configuration],
            "target_is_share_over": share_of if configuration != "sensors_all" else "checks",
        }
    # Targets beyond check 1 are the configuration's own share: its % minus check 1's.
    for row in rows.values():
        base = row["target_is_share_over"]
        row["own_percent"] = {
            g: row["percent"][g] - (rows[base]["percent"][g] if base else 0.0)
            for g in row["percent"]
        }
        row["meets_target_h100"] = bool(row["own_percent"]["H100"] <= row["target_percent"])
    return {
        "job": asdict(job),
        "parameters": job.parameters,
        "tokens_per_gpu": job.tokens_per_gpu,
        "plain_step_s": step_s,
        "sensor_period_gpu": period,
        "configurations": rows,
    }

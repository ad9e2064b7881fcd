"""What a node screen costs on GPUs, by a MODEL: no GPU ran (docs/cost.md, "The node screen").

The ops are the screen's own (:func:`sdc_agent.screen.ops.fixed_suite` at the ``training`` size,
the GPU default, plus :func:`~sdc_agent.screen.ops.collective_spec`), never retyped here. Per op:

* FLOPs: a GEMM [m, n, k] 2mnk; attention [b, h, s, d] forward 4bhs^2d (half of it under a
  causal mask) plus a backward of 2.5x the forward (five matmuls to the forward's two); norms,
  softmax, reductions and the collective's adds are counted as memory-bound (no FLOP term).
* bytes: the elements the op moves (:meth:`sdc_contract.screen.OpSpec.elements`, inputs and
  outputs) at the dtype's size (tf32 is stored as fp32), plus one read of the outputs by the
  fingerprint.
* GPU seconds: ``max(FLOPs / (peak x GEMM_EFFICIENCY), bytes / (HBM x MEMORY_EFFICIENCY))`` plus
  ``LAUNCH_S`` per kernel, with the peaks and coefficients of ``benchmarks/costmodel/project.py``
  (imported). TF32 is not in that table: its dense rate is taken as half the bf16 rate (NVIDIA's
  H100/H200 SXM data sheets: 494.7 against 989.4 TFLOP/s).

The screen's runner (``agent/src/sdc_agent/screen/runner.py``) generates every op's inputs on the
node's CPU, copies them to each GPU in turn, computes there and digests (the digest waits for
the GPU): the 8 GPUs run ONE AFTER ANOTHER, not in parallel, and the host work repeats per
repetition. So a repetition's node time is the CPU's input generation plus, per GPU, the copy and
the GPU time; the table also gives the GPU time alone, per GPU and as if the 8 ran in parallel.
The host rates and the fixed overheads (pod scheduling, image pull, process start) are
ASSUMPTIONS, stated in :data:`ASSUMED`; the prices are list prices as known, not fetched.

    python benchmarks/screen_cost.py
    python benchmarks/screen_cost.py --json benchmarks/results/screen-cost.json
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from results import Recorder

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cloudcost.prices import DAYS_PER_MONTH, PRICES, PRICES_DATE, PRICES_REGION
from costmodel import project

from sdc_agent.screen.ops import collective_spec, fixed_suite
from sdc_agent.screen.runner import DEFAULT_REPETITIONS
from sdc_contract.screen import OpSpec

LABEL = "MODEL, not a measurement: no GPU ran"
GPUS_PER_NODE = project.GPUS_PER_NODE
TF32_OF_BF16 = 0.5
"""TF32 dense rate / bf16 dense rate on H100 and H200 SXM (data sheets: 494.7 / 989.4)."""
BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2}
FLEETS = (64, 512, 2048)
RESCREEN_DAYS = 30.0
ASSUMED: dict[str, float] = {
    "host_generate_elements_s": 0.25e9,
    # make_inputs: torch.rand on one seeded CPU generator, x2-1, cast; ~4 ns an element on a
    # node's CPU (ASSUMED, not measured on a p5; the screen's own docs name it the first thing
    # to measure).
    "h2d_bytes_s": 25e9,
    # pageable host-to-device copies over PCIe Gen5 x16 (64 GB/s peak; ASSUMED 25 GB/s).
    "pod_scheduling_s": 10.0,
    # the Job's pod bound and started on the pinned node (ASSUMED).
    "image_pull_s": 300.0,
    # a ~20 GB training image pulled from ECR onto a node without it (ASSUMED; 0 when cached).
    "process_start_s": 30.0,
    # Python, torch import, CUDA context on 8 GPUs (ASSUMED).
}
KERNELS = {"gemm": 1, "sdpa": 2, "norm": 1, "rmsnorm": 1, "softmax": 1, "reduction": 1}
"""Kernels per op (attention: forward and backward), before the fingerprint's."""
FINGERPRINT_KERNELS = 2
"""Kernels per output the fingerprint launches (a reduction and its combine; assumed)."""
OUTPUTS = {"sdpa": 4}


def screen_ops() -> tuple[OpSpec, ...]:
    """What a screen runs on a node of GPUs: the ``training`` suite and the collective."""
    return (*fixed_suite("training"), collective_spec("training"))


def llama_8b_workload() -> tuple[OpSpec, ...]:
    """The workload the guard would record for ``costmodel.project``'s Llama-3-8B job (2 x 8K
    tokens per micro-batch): :class:`sdc_agent.workload.WorkloadRecorder` on the first forward of
    a Hugging Face Llama at that shape, built on the meta device (no memory, no arithmetic).
    Two decoder layers stand for 32 (every layer has the same shapes; only the names' counts
    differ). Hugging Face's packed-sequence test reads a value (``.item()``), which the meta
    device cannot: it is switched off for this forward (the batch is not packed)."""
    import transformers.masking_utils as masking
    from transformers import LlamaConfig, LlamaForCausalLM

    from sdc_agent.workload import WorkloadRecorder
    from sdc_contract.screen import parse_workload

    job = project.JOBS_BY_NAME["llama3-8b-fsdp"]
    config = LlamaConfig(
        vocab_size=job.vocab,
        hidden_size=job.hidden,
        intermediate_size=job.ffn,
        num_hidden_layers=2,
        num_attention_heads=job.heads,
        num_key_value_heads=job.kv_heads,
        head_dim=job.head_dim,
        tie_word_embeddings=False,
        use_cache=False,
        attn_implementation="sdpa",
    )
    with (
        mock.patch.object(masking, "find_packed_sequence_indices", lambda *a, **k: None),
        torch.device("meta"),
    ):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
        recorder = WorkloadRecorder(model)
        model(input_ids=torch.zeros((job.micro_batch, job.sequence), dtype=torch.long))
    if recorder.document is None:
        raise RuntimeError("the workload recorder recorded nothing")
    return parse_workload(recorder.document)


def with_workload(workload: Sequence[OpSpec]) -> tuple[OpSpec, ...]:
    """What the screen runs with ``--workload``: the suite, the workload's new labels, the
    collective (the runner's order; a label already run is not run twice)."""
    ops, seen = [], set()
    for op in (*fixed_suite("training"), *workload):
        if op.label() not in seen:
            seen.add(op.label())
            ops.append(op)
    return (*ops, collective_spec("training"))


def op_flops(spec: OpSpec) -> float:
    """The op's FLOPs on the tensor cores (0 for the memory-bound kinds)."""
    if spec.kind == "gemm":
        m, n, k = spec.shape
        return 2.0 * m * n * k
    if spec.kind == "sdpa":
        b, h, s, d = spec.shape
        forward = 4.0 * b * h * s * s * d * (0.5 if spec.causal else 1.0)
        return forward * 3.5  # forward + backward at 2.5x
    return 0.0


def output_elements(spec: OpSpec) -> int:
    """The elements the op writes (what the fingerprint reads back)."""
    s = spec.shape
    if spec.kind == "gemm":
        return s[0] * s[1]
    total = 1
    for d in s:
        total *= d
    if spec.kind == "sdpa":
        return 4 * total
    if spec.kind == "reduction":
        return total // s[-1]
    return total


def input_elements(spec: OpSpec) -> int:
    """The elements generated on the host and copied to each GPU."""
    return spec.elements() - output_elements(spec)


def op_bytes(spec: OpSpec) -> float:
    """Bytes through HBM: inputs and outputs, plus the fingerprint's read of the outputs."""
    return float((spec.elements() + output_elements(spec)) * BYTES[spec.dtype])


def gpu_seconds(spec: OpSpec, gpu: project.Gpu) -> float:
    """The op's modelled time on one GPU (module docstring)."""
    rate = gpu.bf16_tflops
    if spec.dtype == "fp32":
        rate = gpu.fp32_tflops
    elif spec.dtype == "tf32":
        rate = gpu.bf16_tflops * TF32_OF_BF16
    compute = op_flops(spec) / (rate * 1e12 * project.GEMM_EFFICIENCY)
    memory = op_bytes(spec) / (gpu.hbm_tb_s * 1e12 * project.MEMORY_EFFICIENCY)
    kernels = KERNELS.get(spec.kind, 1) + FINGERPRINT_KERNELS * OUTPUTS.get(spec.kind, 1)
    return max(compute, memory) + kernels * project.LAUNCH_S


def collective_seconds(spec: OpSpec, gpu: project.Gpu, gpus: int) -> float:
    """The runner's all-sum: each GPU receives every part by a device-to-device copy (NVLink)
    and adds it, then fingerprints its sum; the GPUs take their turns."""
    part = spec.elements() // 2 * BYTES[spec.dtype]
    per_receiver = gpus * (
        part / (gpu.nvlink_gb_s * 1e9)
        + 3 * part / (gpu.hbm_tb_s * 1e12 * project.MEMORY_EFFICIENCY)
    )
    return gpus * (per_receiver + (gpus + FINGERPRINT_KERNELS) * project.LAUNCH_S)


def repetition(ops: Sequence[OpSpec], gpu: project.Gpu, gpus: int = GPUS_PER_NODE) -> dict:
    """One repetition of ``ops`` on a node of ``gpus`` GPUs: per op and in total."""
    rows = []
    for spec in ops:
        if spec.kind == "collective":
            rows.append(
                {
                    "op": spec.name,
                    "label": spec.label(),
                    "flops": 0.0,
                    "bytes": float(2 * spec.elements() * BYTES[spec.dtype]),
                    "gpu_s": collective_seconds(spec, gpu, gpus) / gpus,
                    "host_s": gpus * input_elements(spec) / ASSUMED["host_generate_elements_s"],
                    "copy_s": 0.0,
                }
            )
            continue
        inputs = input_elements(spec)
        rows.append(
            {
                "op": spec.name,
                "label": spec.label(),
                "flops": op_flops(spec),
                "bytes": op_bytes(spec),
                "gpu_s": gpu_seconds(spec, gpu),
                "host_s": inputs / ASSUMED["host_generate_elements_s"],
                "copy_s": inputs * BYTES[spec.dtype] / ASSUMED["h2d_bytes_s"],
            }
        )
    gpu_s = sum(r["gpu_s"] for r in rows)
    host_s = sum(r["host_s"] for r in rows)
    copy_s = sum(r["copy_s"] for r in rows)
    return {
        "ops": rows,
        "flops_per_gpu": sum(r["flops"] for r in rows),
        "bytes_per_gpu": sum(r["bytes"] for r in rows),
        "gpu_s_per_gpu": gpu_s,
        "host_s": host_s,
        "copy_s_per_gpu": copy_s,
        # As built: host generation once, then each GPU in turn (copy + compute).
        "node_s_as_built": host_s + gpus * (copy_s + gpu_s),
        # If the GPUs ran in parallel, inputs generated once: the GPU-bound floor.
        "node_s_parallel": host_s + copy_s + gpu_s,
    }


def screen_cost(ops: Sequence[OpSpec], repetitions: int = DEFAULT_REPETITIONS) -> dict[str, Any]:
    """Per GPU model: a repetition, a whole screen (the repeatability pass counts as one more
    repetition run twice on every GPU), its node-hours and dollars, the fleets' months."""
    price = PRICES["p5_48xlarge_hour"]
    fixed_s = sum(
        v
        for k, v in ASSUMED.items()
        if k.endswith("_s") and "bytes" not in k and "elements" not in k
    )
    out = {}
    for gpu in project.GPUS:
        rep = repetition(ops, gpu)
        # The repeatability check: one generation, each op run twice on every GPU.
        per_op = [r for r in rep["ops"] if not r["label"].startswith("collective")]
        check_s = sum(r["host_s"] for r in per_op) + GPUS_PER_NODE * sum(
            r["copy_s"] + 2 * r["gpu_s"] for r in per_op
        )
        run_s = check_s + repetitions * rep["node_s_as_built"]
        node_s = run_s + fixed_s
        node_h = node_s / 3600.0
        dollars = node_h * price
        cached_s = node_s - ASSUMED["image_pull_s"]
        cached = cached_s / 3600.0 * price
        out[gpu.name] = {
            "repetition": rep,
            "repeatability_check_s": check_s,
            "screen_run_s": run_s,
            "fixed_overheads_s": fixed_s,
            "node_s": node_s,
            "gpu_hours": node_h * GPUS_PER_NODE,
            "node_dollars": dollars,
            "node_s_image_cached": cached_s,
            "node_dollars_image_cached": cached,
            "fleet_month": {str(n): n * (DAYS_PER_MONTH / RESCREEN_DAYS) * dollars for n in FLEETS},
            "fleet_month_image_cached": {
                str(n): n * (DAYS_PER_MONTH / RESCREEN_DAYS) * cached for n in FLEETS
            },
        }
    return out


CASES = ("fixed suite", "suite + Llama-3-8B workload")


def render(results: dict[str, dict[str, Any]], repetitions: int) -> str:
    """The figures as the markdown docs/cost.md copies: per case, per GPU; the per-op table of
    the first case on an H100."""
    price = PRICES["p5_48xlarge_hour"]
    lines = [
        f"Node screen cost: {LABEL}. Prices: {PRICES_REGION}, list prices as known "
        f"{PRICES_DATE}, not fetched; the H200 columns at the same p5.48xlarge price.",
        "",
    ]
    columns = [(case, gpu.name) for case in results for gpu in project.GPUS]
    lines += [
        "| | " + " | ".join(f"{case}, {gpu}" for case, gpu in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]

    def row(name: str, cell: Any) -> None:
        cells = [cell(results[case][gpu]) for case, gpu in columns]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")

    row("ops per repetition", lambda g: f"{len(g['repetition']['ops'])}")
    row(
        "FLOPs per GPU, one repetition",
        lambda g: f"{g['repetition']['flops_per_gpu'] / 1e12:.2f} T",
    )
    row(
        "HBM bytes per GPU, one repetition",
        lambda g: f"{g['repetition']['bytes_per_gpu'] / 1e9:.1f} GB",
    )
    row(
        "GPU time per GPU, one repetition",
        lambda g: f"{g['repetition']['gpu_s_per_gpu'] * 1e3:.0f} ms",
    )
    row(
        "host input generation, one repetition (assumed rate)",
        lambda g: f"{g['repetition']['host_s']:.1f} s",
    )
    row(
        "host-to-device copies per GPU, one repetition (assumed rate)",
        lambda g: f"{g['repetition']['copy_s_per_gpu']:.2f} s",
    )
    row(
        "node time, one repetition, as built (GPUs in turn)",
        lambda g: f"{g['repetition']['node_s_as_built']:.1f} s",
    )
    row(
        "node time, one repetition, if the 8 GPUs ran in parallel",
        lambda g: f"{g['repetition']['node_s_parallel']:.1f} s",
    )
    row("repeatability pass (once, on CUDA)", lambda g: f"{g['repeatability_check_s']:.1f} s")
    row(f"screen run, {repetitions} repetitions", lambda g: f"{g['screen_run_s']:.0f} s")
    row("fixed overheads (assumed)", lambda g: f"{g['fixed_overheads_s']:.0f} s")
    row(
        "node time per screen (image already on the node)",
        lambda g: f"{g['node_s'] / 60:.1f} min ({g['node_s_image_cached'] / 60:.1f} min)",
    )
    row(
        "GPU-hours per screen, 8 GPUs (image cached)",
        lambda g: (
            f"{g['gpu_hours']:.2f} ({g['gpu_hours'] * g['node_s_image_cached'] / g['node_s']:.2f})"
        ),
    )
    row(
        f"$ per screen at ${price:.2f}/node-hour (image cached)",
        lambda g: f"${g['node_dollars']:.2f} (${g['node_dollars_image_cached']:.2f})",
    )
    for n in FLEETS:
        row(
            f"$ per month, {n:,} nodes, each screened every {RESCREEN_DAYS:g} d (image cached)",
            lambda g, n=n: (
                f"${g['fleet_month'][str(n)]:,.0f} (${g['fleet_month_image_cached'][str(n)]:,.0f})"
            ),
        )
    first = next(iter(results))
    for case in results:
        lines += [
            "",
            f"Per op, {case}, H100, one repetition ({LABEL}):",
            "",
            "| op | label | TFLOP | GB | GPU ms | host s | copy s per GPU |",
            "|---|---|---|---|---|---|---|",
        ]
        ops = results[case]["H100"]["repetition"]["ops"]
        if case != first:  # the suite's rows are above
            suite = {r["label"] for r in results[first]["H100"]["repetition"]["ops"]}
            ops = [r for r in ops if r["label"] not in suite]
        for r in ops:
            lines.append(
                f"| {r['op']} | `{r['label']}` | {r['flops'] / 1e12:.3f} | {r['bytes'] / 1e9:.2f} "
                f"| {r['gpu_s'] * 1e3:.2f} | {r['host_s']:.2f} | {r['copy_s']:.3f} |"
            )
    lines += ["", f"Assumptions: {ASSUMED}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the model's figures (and write them with --json)."""
    recorder = Recorder(__file__, sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--repetitions",
        type=int,
        default=DEFAULT_REPETITIONS,
        help="repetitions per screen (default: the screen's own)",
    )
    parser.add_argument(
        "--no-workload", action="store_true", help="the fixed suite only (no Llama-3-8B row)"
    )
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    args = parser.parse_args(argv)
    cases = {CASES[0]: screen_ops()}
    if not args.no_workload:
        cases[CASES[1]] = with_workload(llama_8b_workload())
    result = {case: screen_cost(ops, args.repetitions) for case, ops in cases.items()}
    print(render(result, args.repetitions))
    if args.json:
        recorder.write(
            args.json,
            {
                "label": LABEL,
                "repetitions": args.repetitions,
                "assumed": ASSUMED,
                "constants": project.constants(),
                "tf32_of_bf16": TF32_OF_BF16,
                "price_p5_48xlarge_hour": PRICES["p5_48xlarge_hour"],
                "prices_date": PRICES_DATE,
                "rescreen_days": RESCREEN_DAYS,
                "cases": result,
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The Python of benchmarks/gpu.sh's steps, one subcommand each, each result written with
:class:`results.Recorder` (``--json PATH``).

    python benchmarks/gpu_checks.py versions   # torch, CUDA, NCCL, Triton, mm(out_dtype)
    python benchmarks/gpu_checks.py llama --layout ddp|fsdp  # a guarded Llama slice, 1 rank
    python benchmarks/gpu_checks.py replay     # 2 processes, 1 micro-batch, bit for bit
    python benchmarks/gpu_checks.py drills     # 3 gloo processes name a GEMM fault, NaN, flip
    python benchmarks/gpu_checks.py explain    # graph breaks of a protected block (dynamo)

On a CUDA machine each step runs on the GPU (NCCL process groups, CUDA events, the CUDA
allocator's peak, ``torch.cuda.set_sync_debug_mode("warn")``). ``--dry-run`` runs each step's CPU
fallback instead (gloo, the CPU, wall-clock time, no peak and no sync list) and says so in its
output and results, so that every step is exercised where no GPU is: the figures of a dry run
measure nothing about a GPU. Without ``--dry-run`` and without CUDA a step refuses to start.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]  # tests.support, results

import torch  # noqa: E402
from results import Recorder  # noqa: E402
from torch import nn  # noqa: E402


# ---------------------------------------------------------------------------- shared
def device_for(dry_run: bool) -> torch.device:
    """CUDA for a real run (refused without it), the CPU for a dry run."""
    if dry_run:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device visible to torch: run with --dry-run for the CPU fallback")
    return torch.device("cuda", 0)


def fallback_note(dry_run: bool) -> str | None:
    """What a dry run's figures are (None for a real run); printed and recorded."""
    if not dry_run:
        return None
    return "dry run: CPU fallback (gloo, CPU tensors, wall-clock timing); no GPU figure"


def say(dry_run: bool, text: str) -> None:
    prefix = "[dry run, CPU fallback] " if dry_run else ""
    print(prefix + text, flush=True)


def llama_config(dry_run: bool) -> Any:
    """A Llama slice: two decoder layers at a Llama-3.2-1B-like width on the GPU (hidden 2048,
    FFN 8192, 32 heads over 8 key/value heads), the test suite's tiny one on a dry run."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import LlamaConfig

    if dry_run:
        return LlamaConfig(
            vocab_size=128,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    return LlamaConfig(
        vocab_size=32000,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=2,
        num_attention_heads=32,
        num_key_value_heads=8,
    )


def build_llama(dry_run: bool, device: torch.device, seed: int = 0) -> nn.Module:
    """The slice, seeded, on ``device``."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(llama_config(dry_run)).to(device)


def micro_batch(dry_run: bool, device: torch.device, step: int, rank: int = 0) -> torch.Tensor:
    """Token ids of ``rank``'s micro-batch at ``step`` (the same on every call)."""
    vocab = llama_config(dry_run).vocab_size
    seq = 16 if dry_run else 2048
    gen = torch.Generator().manual_seed(step * 1009 + rank)
    return torch.randint(0, vocab, (1, seq), generator=gen).to(device)


def llama_loss(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The next-token loss, under bf16 autocast on CUDA (fp32 on the CPU)."""
    cuda = ids.device.type == "cuda"
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=cuda):
        return model(input_ids=ids, labels=ids).loss


@contextlib.contextmanager
def one_rank_group(backend: str) -> Any:
    """A 1-rank process group (``backend``: nccl on CUDA, gloo for the CPU fallback)."""
    import torch.distributed as dist

    with tempfile.TemporaryDirectory(prefix="sdc-gpu-") as tmp:
        store = dist.FileStore(os.path.join(tmp, "store"), 1)
        dist.init_process_group(backend, store=store, rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


def write(args: argparse.Namespace, recorder: Recorder, figures: dict[str, Any]) -> None:
    """Print the figures and write them (with provenance) to ``--json``."""
    figures = {"dry_run": args.dry_run, "fallback": fallback_note(args.dry_run), **figures}
    print(json.dumps(figures, indent=2, default=str))
    if args.json is not None:
        recorder.write(args.json, figures)


# ---------------------------------------------------------------------------- versions
def versions(args: argparse.Namespace, recorder: Recorder) -> int:
    """torch, CUDA, NCCL, Triton and whether ``torch.mm(..., out_dtype=float32)`` works."""
    import importlib.util

    from sdc_agent import _versions

    cuda = torch.cuda.is_available() and not args.dry_run
    figures: dict[str, Any] = {
        "torch": torch.__version__,
        "torch_floor": ".".join(map(str, _versions.TORCH_FLOOR)),
        "cuda_build": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "nccl": ".".join(map(str, torch.cuda.nccl.version()))
        if torch.cuda.is_available()
        else None,
        "triton": None,
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
    }
    if importlib.util.find_spec("triton") is not None:
        import triton

        figures["triton"] = triton.__version__
    if cuda:
        props = torch.cuda.get_device_properties(0)
        figures["compute_capability"] = f"{props.major}.{props.minor}"
        figures["memory_gib"] = round(props.total_memory / 2**30, 1)
        figures["sm_count"] = props.multi_processor_count
    device = device_for(args.dry_run)
    probe = torch.ones(2, 2, dtype=torch.bfloat16, device=device)
    try:
        out = torch.mm(probe, probe, out_dtype=torch.float32)
        figures["mm_out_dtype"] = {"supported": out.dtype == torch.float32, "device": str(device)}
    except (TypeError, RuntimeError) as err:  # the CPU has no fp32-output 16-bit GEMM
        figures["mm_out_dtype"] = {
            "supported": False,
            "device": str(device),
            "error": str(err).splitlines()[0][:200],
        }
    from sdc_agent.sensors.ops.linear import _fp32_out_supported

    figures["protected_linear_path"] = (
        "mm(out_dtype=float32)"
        if _fp32_out_supported(device, torch.bfloat16)
        else "fp32 fallback (a.float() @ b.float())"
    )
    write(args, recorder, figures)
    return 0


# ---------------------------------------------------------------------------- llama
def llama(args: argparse.Namespace, recorder: Recorder) -> int:
    """A plain and a guarded Llama slice on one rank (DDP on a 1-rank group, or a 1-rank FSDP2
    mesh): per-step time (CUDA events), the allocator's peak, the guard's host syncs."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    import sdc_agent as sdc

    device = device_for(args.dry_run)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
    backend = "nccl" if cuda else "gloo"
    say(args.dry_run, f"{args.layout} on a 1-rank {backend} group, {device}")

    def wrap(model: nn.Module) -> nn.Module:
        if args.layout == "ddp":
            return DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
        mesh = init_device_mesh(device.type, (1,))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        return fully_shard(model, mesh=mesh)

    def timed_steps(run_step: Any) -> tuple[list[float], int | None, Counter]:
        times, syncs = [], Counter()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        for step in range(args.steps):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                if cuda and step > 0:  # step 0 compiles and self-checks: not the common step
                    torch.cuda.set_sync_debug_mode("warn")
                if cuda:
                    start, end = (
                        torch.cuda.Event(enable_timing=True),
                        torch.cuda.Event(enable_timing=True),
                    )
                    start.record()
                t0 = time.perf_counter()
                try:
                    run_step(step)
                finally:
                    if cuda:
                        torch.cuda.set_sync_debug_mode(0)
                if cuda:
                    end.record()
                    end.synchronize()
                    times.append(start.elapsed_time(end))
                else:
                    times.append((time.perf_counter() - t0) * 1e3)
            for w in caught:
                if "synchroniz" in str(w.message):
                    syncs[f"{Path(w.filename).name}:{w.lineno}"] += 1
        peak = torch.cuda.max_memory_allocated() if cuda else None
        return times, peak, syncs

    with one_rank_group(backend):

        def run_plain() -> tuple[list[float], int | None]:
            # A function, so the plain model and its optimizer state are freed on return.
            plain = wrap(build_llama(args.dry_run, device))
            opt = torch.optim.AdamW(plain.parameters(), lr=1e-4)

            def plain_step(step: int) -> None:
                llama_loss(plain, micro_batch(args.dry_run, device, step)).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

            times, peak, _ = timed_steps(plain_step)
            return times, peak

        plain_times, plain_peak = run_plain()
        if cuda:
            torch.cuda.empty_cache()

        module = build_llama(args.dry_run, device)
        sdc.protect(module)
        model = wrap(module)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        guard = sdc.Guard(
            model,
            optimizer,
            compute_loss=llama_loss,
            rebuild_batch=lambda step, rank: micro_batch(args.dry_run, device, step, rank),
            schedule=sdc.Schedule(audit_every=0, check_every=5, check_on_start=False),
        )
        alarms: list[dict[str, Any]] = []

        def guarded_step(step: int) -> None:
            with guard.step(step) as guarded:
                loss = llama_loss(model, micro_batch(args.dry_run, device, step))
                loss.backward()
                if alarm := guarded.check_gradients(loss):
                    alarms.append(alarm.to_dict())
                    return
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                if alarm := guarded.after_update():
                    alarms.append(alarm.to_dict())

        guarded_times, guarded_peak, syncs = timed_steps(guarded_step)
        if alarm := guard.finish():
            alarms.append(alarm.to_dict())
        world = dist.get_world_size()

    def median(xs: list[float]) -> float:
        rest = sorted(xs[1:] or xs)  # step 0 (compiles, self-checks) left out
        return round(rest[len(rest) // 2], 3)

    figures = {
        "layout": args.layout,
        "backend": backend,
        "world": world,
        "device": str(device),
        "steps": args.steps,
        "timing": "CUDA events" if cuda else "wall clock (CPU fallback)",
        "plain_step_ms": [round(t, 3) for t in plain_times],
        "guarded_step_ms": [round(t, 3) for t in guarded_times],
        "plain_median_ms": median(plain_times),
        "guarded_median_ms": median(guarded_times),
        "plain_peak_bytes": plain_peak,
        "guarded_peak_bytes": guarded_peak,
        "host_syncs_per_site": dict(syncs) if cuda else None,
        "host_syncs_note": None
        if cuda
        else "torch.cuda.set_sync_debug_mode is CUDA-only: not measured on the CPU",
        "alarms": alarms,
    }
    write(args, recorder, figures)
    return 1 if alarms else 0  # a fault-free run must raise no alarm


# ---------------------------------------------------------------------------- replay
def replay_one(args: argparse.Namespace) -> int:
    """One process of :func:`replay`: the protected slice's loss and gradients of one
    micro-batch, printed as a digest (deterministic kernels when ``--deterministic``)."""
    import sdc_agent as sdc

    device = device_for(args.dry_run)
    if args.deterministic:
        torch.use_deterministic_algorithms(True)
    model = build_llama(args.dry_run, device)
    sdc.protect(model)
    loss = llama_loss(model, micro_batch(args.dry_run, device, 3))
    loss.backward()
    h = hashlib.sha256(loss.detach().float().cpu().numpy().tobytes())
    for _, p in sorted(model.named_parameters()):
        h.update(p.grad.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
    print(json.dumps({"digest": h.hexdigest(), "loss": float(loss.detach())}))
    return 0


def replay(args: argparse.Namespace, recorder: Recorder) -> int:
    """Two processes compute the same micro-batch: with ``CUBLAS_WORKSPACE_CONFIG`` and
    deterministic kernels their bits must agree; the negative control (neither) is reported."""
    device = device_for(args.dry_run)
    say(args.dry_run, f"two processes, one micro-batch, {device}")

    def run_pair(deterministic: bool) -> list[dict[str, Any]]:
        env = dict(os.environ)
        env.pop("CUBLAS_WORKSPACE_CONFIG", None)
        if deterministic:
            env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
        cmd = [sys.executable, __file__, "replay-one"]
        cmd += ["--dry-run"] * args.dry_run + ["--deterministic"] * deterministic
        procs = [
            subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True) for _ in range(2)
        ]
        outs = []
        for p in procs:
            out, _ = p.communicate(timeout=args.timeout)
            if p.returncode != 0:
                raise SystemExit(f"replay-one failed with exit code {p.returncode}")
            outs.append(json.loads(out.strip().splitlines()[-1]))
        return outs

    pinned, control = run_pair(True), run_pair(False)
    figures = {
        "device": str(device),
        "with_cublas_workspace_config": {
            "digests": [o["digest"] for o in pinned],
            "bit_identical": pinned[0]["digest"] == pinned[1]["digest"],
        },
        "negative_control": {
            "digests": [o["digest"] for o in control],
            "bit_identical": control[0]["digest"] == control[1]["digest"],
            "note": "without CUBLAS_WORKSPACE_CONFIG or deterministic kernels: reported, not "
            "required (one GPU may still agree; across GPUs it need not)",
        },
    }
    if args.dry_run:
        figures["negative_control"]["note"] += "; on the CPU cuBLAS is not involved"
    write(args, recorder, figures)
    return 0 if figures["with_cublas_workspace_config"]["bit_identical"] else 1


# ---------------------------------------------------------------------------- drills
DRILLS = {
    "gemm": ["--fault", "scale"],  # x1000 on one element of a linear layer's GEMM output
    "nan": ["--fault", "nan"],
    "weight": ["--fault", "weight"],
}


def drills(args: argparse.Namespace, recorder: Recorder) -> int:
    """The fire drills on 3 gloo processes (3 nodes x 1 rank): a GEMM output fault, a NaN and
    a weight flip, each of which must be named (``python -m sdc_agent.drill``). The drill's
    model and gloo tensors are on the CPU (its jobs place nothing on a GPU)."""
    say(args.dry_run, "3 gloo processes; the drill job runs on the CPU")
    outcomes: dict[str, Any] = {}
    env = {**os.environ, "PYTHONPATH": str(REPO / "agent" / "src")}
    for name, flags in DRILLS.items():
        cmd = [sys.executable, "-m", "sdc_agent.drill", *flags, "--nodes", "3"]
        # From step 2: the NaN is named at once, the GEMM fault at the audit of step 5, the
        # flip at the weight check after step 4 (the drill audits and compares every 5 steps).
        cmd += ["--ranks-per-node", "1", "--rank", "1", "--step", "2", "--steps", str(args.steps)]
        t0 = time.perf_counter()
        done = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=args.timeout, check=False
        )
        text = done.stdout + done.stderr
        suspects = re.findall(r"suspects: (\[[0-9, ]*\]|None)", text)
        outcomes[name] = {
            "exit_code": done.returncode,
            "seconds": round(time.perf_counter() - t0, 1),
            "suspects": suspects,
            # the drill exits 0 when the outcome is what it expects: the faulty rank named
            "named_rank_1": done.returncode == 0 and "[1]" in suspects,
            "tail": text.strip().splitlines()[-3:],
        }
        print(f"  {name}: exit {done.returncode}, {outcomes[name]['tail'][-1:]}", flush=True)
    figures = {"drills": outcomes, "placement": "CPU (the drill jobs place nothing on a GPU)"}
    write(args, recorder, figures)
    return 0 if all(o["named_rank_1"] for o in outcomes.values()) else 1


# ---------------------------------------------------------------------------- explain
def explain(args: argparse.Namespace, recorder: Recorder) -> int:
    """Graph breaks of one protected decoder layer under ``torch._dynamo.explain``."""
    import torch._dynamo

    import sdc_agent as sdc

    device = device_for(args.dry_run)
    say(args.dry_run, f"torch._dynamo.explain of a protected Llama decoder layer, {device}")
    model = build_llama(args.dry_run, device)
    sdc.protect(model)
    block = model.model.layers[0]
    config = llama_config(args.dry_run)
    x = torch.randn(1, 16, config.hidden_size, device=device, requires_grad=True)
    rotary = model.model.rotary_emb(x, torch.arange(16, device=device)[None])
    explained = torch._dynamo.explain(block)(x, position_embeddings=rotary)
    reasons = Counter(str(b.reason).splitlines()[0][:160] for b in explained.break_reasons)
    figures = {
        "device": str(device),
        "graphs": explained.graph_count,
        "graph_breaks": explained.graph_break_count,
        "ops": explained.op_count,
        "break_reasons": dict(reasons.most_common(10)),
    }
    write(args, recorder, figures)
    return 0  # measured, not judged: the guard refuses torch.compile today


# ---------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    recorder = Recorder(__file__, argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    commands = {}
    for name, fn, helptext in (
        ("versions", versions, "torch, CUDA, NCCL, Triton, mm(out_dtype)"),
        ("llama", llama, "a guarded Llama slice on 1 rank (DDP or FSDP2)"),
        ("replay", replay, "two processes replay one micro-batch, compared bit for bit"),
        ("drills", drills, "3 gloo processes name a GEMM fault, a NaN and a weight flip"),
        ("explain", explain, "graph breaks of a protected block under dynamo's explain"),
        ("replay-one", None, "one process of the replay (internal)"),
    ):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("--dry-run", action="store_true", help="the CPU fallback (module doc)")
        p.add_argument("--json", type=Path, help="write the result here")
        p.add_argument("--timeout", type=float, default=240.0, help="seconds per subprocess")
        commands[name] = fn
        if name == "llama":
            p.add_argument("--layout", choices=["ddp", "fsdp"], default="ddp")
            p.add_argument("--steps", type=int, default=8, help="timed steps (>= 2)")
        if name == "drills":
            p.add_argument("--steps", type=int, default=7, help="drill steps (>= 6)")
        if name == "replay-one":
            p.add_argument("--deterministic", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "replay-one":
        return replay_one(args)
    if getattr(args, "steps", 2) < 2:
        parser.error("--steps must be at least 2 (step 0 is left out of the medians)")
    return commands[args.command](args, recorder)


if __name__ == "__main__":
    sys.exit(main())

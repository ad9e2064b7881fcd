"""A fault-free soak of the online sensors: does a healthy job ever raise a sensor alarm?

Trains a protected model (``sdc.protect(model)`` before DDP) on 3 simulated nodes x 2 ranks
(gloo, CPU) with every sensor checking on every step (``Schedule(sensor_budget=math.inf)``),
ring replay audits and weight checks every 5 steps, and no fault. Every sensor candidate is
confirmed or dismissed by the replays; the run goes on after an alarm (its step is not applied)
so that a soak counts every false alarm, not only the first. Prints what a reviewer needs to
trust the thresholds: steps, candidates (the unconfirmed ones plus the alarms sensors raised),
unconfirmed (``reproducible``) candidates, alarms, the
largest healthy ratio per op family (kind and op) and the thresholds in force at the end, and
whether every rank judged with the same thresholds.

    python benchmarks/sensor_soak.py --model drill --dtype fp32 --steps 2000
    python benchmarks/sensor_soak.py --model llama --dtype bf16 --steps 300 --json soak.json

``--model llama`` builds a small Hugging Face Llama from a config (no download; needs
``transformers``): RMSNorm, SwiGLU MLP, SDPA attention with rotary embeddings and GQA, whose
``nn.Linear`` layers ``protect()`` finds (and whatever else the installed agent protects).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from results import Recorder
from torch import nn

LLAMA = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
"""The Llama of the soak: a real architecture, small enough for 6 CPU processes."""
SEQ, BATCH = 16, 4


def _job_path() -> str:
    """'module:function' of :func:`soak` as the spawned workers can import it."""
    module = __spec__.name if __spec__ and __name__ != "__main__" else Path(__file__).stem
    return f"{module}:soak"


def llama_available() -> bool:
    """Whether ``transformers`` (and its Llama) can be imported here."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM  # noqa: F401
    except ImportError:
        return False
    return True


def _llama_batch(step: int, rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1_000_003 * 7 + step * 1009 + rank)
    return torch.randint(0, LLAMA["vocab_size"], (BATCH, SEQ), generator=g)


def _llama_loss(bf16: bool) -> Any:
    def compute_loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            return model(input_ids=tokens, labels=tokens).loss.float()

    return compute_loss


class _Collect(logging.Handler):
    """Keeps the agent's warnings (unconfirmed candidates, alarms) for the report."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage()[:600])


def soak(
    *, model: str, dtype: str, steps: int, every: int, attention: str = "fused"
) -> dict[str, Any]:
    """Run on every rank: train ``steps`` fault-free steps; report this rank's figures."""
    import sdc_agent as sdc
    from sdc_agent.drills.job import DrillModel, make_batch, make_loss

    bf16 = dtype == "bf16"
    torch.manual_seed(0)
    if model == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        module: nn.Module = LlamaForCausalLM(LlamaConfig(**LLAMA))
        batch_of, compute_loss = _llama_batch, _llama_loss(bf16)
    else:
        module = DrillModel()
        batch_of, compute_loss = make_batch, make_loss(bf16)
    board = sdc.protect(module, attention=attention)
    ddp = nn.parallel.DistributedDataParallel(module)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    collect = _Collect()
    logging.getLogger("sdc_agent").addHandler(collect)
    guard = sdc.Guard(
        ddp,
        optimizer,
        compute_loss=compute_loss,
        rebuild_batch=batch_of,
        schedule=sdc.Schedule(
            audit_every=every, check_every=every, peer_offset=2, sensor_budget=math.inf
        ),
    )
    # The board discovers its sensors during the model's first forward and backward, so its
    # length is known only once a step has run: the peaks grow with it.
    peak = torch.zeros(0, dtype=torch.float64)
    alarms: list[dict[str, Any]] = []
    sensed = 0
    rank = dist.get_rank()
    started = time.perf_counter()
    for step in range(steps):
        with guard.step(step) as guarded:
            loss = compute_loss(ddp, batch_of(step, rank))
            loss.backward()
            alarm = guarded.check_gradients(loss)
            ratios = _last_ratios(guard)
            if ratios is not None:
                sensed += 1
                now = ratios.double().cpu().nan_to_num(math.inf)
                if len(now) > len(peak):
                    peak = torch.cat([peak, torch.zeros(len(now) - len(peak), dtype=peak.dtype)])
                peak[: len(now)] = torch.maximum(peak[: len(now)], now)
            if alarm is not None:
                alarms.append(alarm.to_dict())
                continue  # the step is not applied; a soak counts every alarm
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if alarm := guarded.after_update():
                alarms.append(alarm.to_dict())
    if alarm := guard.finish():
        alarms.append(alarm.to_dict())
    wall = time.perf_counter() - started
    logging.getLogger("sdc_agent").removeHandler(collect)
    thresholds = board.thresholds()
    return {
        "rank": rank,
        "steps": steps,
        "sensed_steps": sensed,
        "wall_s": wall,
        "alarms": alarms,
        "unconfirmed": guard._run.sensors.unconfirmed,
        "sensors": [s.to_dict() for s in board.sensors],
        "peak": peak.tolist(),
        "thresholds": thresholds,
        "warnings": [m for m in collect.messages if "sensor" in m],
    }


def _last_ratios(guard: Any) -> torch.Tensor | None:
    """The largest ratio per sensor of the step just judged (None when nothing checked)."""
    return guard._run.sensors.last_ratios


def summarise(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of a soak: per op family, the largest healthy ratio and the thresholds."""
    sensors = per_rank[0]["sensors"]
    families: dict[str, dict[str, Any]] = {}
    for index, sensor in enumerate(sensors):
        family = families.setdefault(
            f"{sensor['kind']} {sensor['gemm']}",
            {"sensors": 0, "max_healthy_ratio": 0.0, "where": None, "thresholds": set()},
        )
        family["sensors"] += 1
        for r in per_rank:
            if r["peak"][index] > family["max_healthy_ratio"]:
                family["max_healthy_ratio"] = r["peak"][index]
                family["where"] = f"{sensor['layer']} on rank {r['rank']}"
            if r["thresholds"][index] is not None:
                family["thresholds"].add(round(r["thresholds"][index], 4))
    for family in families.values():
        values = sorted(family.pop("thresholds"))
        family["thresholds"] = [values[0], values[-1]] if values else None
    same = all(r["thresholds"] == per_rank[0]["thresholds"] for r in per_rank)
    rank0 = per_rank[0]
    alarms = rank0["alarms"]
    return {
        "steps": rank0["steps"],
        "sensed_steps": rank0["sensed_steps"],
        "candidates": rank0["unconfirmed"] + sum(1 for a in alarms if a.get("sensor_candidates")),
        "unconfirmed": rank0["unconfirmed"],
        "alarms": len(alarms),
        "alarm_details": [
            {
                "step": a["step"],
                "check": a["check"],
                "suspects": a.get("suspects"),
                "verdicts": [v["kind"] for v in a.get("verdicts") or []],
                "sensor_candidates": a.get("sensor_candidates"),
            }
            for a in alarms
        ],
        "same_thresholds_on_every_rank": same,
        "families": families,
        "wall_s": max(r["wall_s"] for r in per_rank),
        "candidate_log": rank0["warnings"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("drill", "llama"), default="drill", help="model")
    parser.add_argument(
        "--dtype", choices=("fp32", "bf16"), default="fp32", help="fp32 or bf16 autocast"
    )
    parser.add_argument("--steps", type=int, default=300, help="training steps")
    parser.add_argument("--every", type=int, default=5, help="audit and weight check period")
    parser.add_argument(
        "--attention",
        choices=("fused", "checked"),
        default="fused",
        help="protect(attention=...): 'checked' adds the attention sensors (the Llama's SDPA)",
    )
    parser.add_argument("--json", type=Path, help="also write the summary here")
    parser.add_argument("--timeout", type=float, default=7200.0, help="seconds before giving up")
    args = parser.parse_args(argv)
    recorder = Recorder(__file__, argv)
    if args.steps < 1 or args.every < 1:
        parser.error("--steps and --every must be >= 1")
    if args.model == "llama" and not llama_available():
        print(
            "sensor_soak: --model llama needs Hugging Face transformers "
            "(pip install transformers); it is not installed",
            file=sys.stderr,
        )
        return 1
    from sdc_agent.drills.launch import launch

    started = time.perf_counter()
    kwargs = {
        "model": args.model,
        "dtype": args.dtype,
        "steps": args.steps,
        "every": args.every,
        "attention": args.attention,
    }
    [per_rank] = launch([(_job_path(), kwargs)], world=6, ranks_per_node=2, timeout_s=args.timeout)
    errors = [r["trace"] for r in per_rank if "error" in r]
    if errors:
        print(errors[0], file=sys.stderr)
        return 1
    summary = {
        "model": args.model,
        "dtype": args.dtype,
        "attention": args.attention,
        **summarise(per_rank),
    }
    summary["launch_s"] = time.perf_counter() - started
    print(json.dumps(summary, indent=2, default=str))
    if args.json:
        recorder.write(args.json, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())

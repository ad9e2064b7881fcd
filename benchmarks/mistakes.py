"""The held-out user mistakes: ordinary set-up errors the test suite does not contain, and what
the guard made of each. None of them is a GPU fault, so the guard must name nobody.

Issue 30's rule is that a false alarm (a healthy GPU named, its node cordoned) is the one failure
an SDC guard cannot afford. The tests (tests/agent/test_false_alarms_*.py) pin the mistakes the
guard was built against; this campaign keeps a second set, written apart from them, so that a
rule fitted to the pinned rows alone shows here as a wrong name. A mistake whose row fails is a
bug of the guard: fix the guard, never the row.

Not part of the test suite: ``make bench`` runs it as the job ``mistakes-held-out`` (the table in
docs/recovery.md, "False alarms", is rendered from its results), or by hand,

    python benchmarks/mistakes.py
    python benchmarks/mistakes.py --mistakes labels_of_next_step,stateful_loss --json out.json

The job is the tests' DDP job (3 simulated nodes x 2 ranks, gloo, CPU, the drill's MLP with
BatchNorm and dropout; audits at steps 0, 5 and 10, ``peer_offset=2``; 12 steps). A row passes
when no rank was named (no suspect, no culprit), no per-node series and no SDC metric was
published (nothing would be cordoned), and the job was not crashed: every rank applied every
step, or building the guard refused the set-up with an error that says what is wrong. The row
also shows what the guard said (its set-up finding, the audit's state), so that a mistake the
guard never noticed reads as such rather than as a pass it did not earn.

Prints one line per mistake and exits 1 when any row names somebody or crashes the job.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.agent: the tests' publisher

import torch
import torch.distributed as dist
from results import Recorder
from torch import nn

import sdc_agent as sdc
from sdc_agent.drills.job import DrillModel, make_loss, make_step_batch
from sdc_agent.drills.launch import launch
from tests.agent.mistake_scenarios import RecordingPublisher

NODES, RANKS_PER_NODE, STEPS = 3, 2, 12
SCHEDULE = {"audit_every": 5, "check_every": 5, "ckpt_every": 0, "peer_offset": 2}
SDC_METRICS = {"sdc_replay_mismatch", "sdc_nonfinite_grad", "sdc_divergent_tensors"}

MISTAKES: dict[str, str] = {
    "rebuild_ignores_target": "rebuild_batch(step, rank) returns the caller's own batch, not rank's",
    "rebuild_uses_local_rank": "rebuild_batch indexes the data by the local rank (LOCAL_RANK)",
    "labels_of_next_step": "rebuild_batch returns the right inputs with the next step's labels",
    "one_rank_labels_wrong": "on rank 1 only, rebuild_batch returns another rank's labels",
    "python_random_augment": "both loaders add noise drawn from Python's unseeded `random`",
    "torch_rng_augment": "both loaders add noise from torch's global generator (torch.randn_like)",
    "stateful_loss": "compute_loss scales the loss by how many times it was called",
    "forward_counts_calls": "the model's forward ramps its input by a count of its own calls",
    "loss_weighted_by_rank": "compute_loss weights the loss by dist.get_rank()",
    "buffers_not_broadcast": "DDP(broadcast_buffers=False): each rank keeps its own BatchNorm stats",
    "rebuild_float64": "rebuild_batch returns float64 inputs (a numpy round trip)",
    "micro_batches_reversed": "grad_accum=2; rebuild_batch returns the micro-batches reversed",
    "own_generator_noise": "the model draws noise from a torch.Generator of its own",
    "cached_batch_normalised_in_place": (
        "rebuild_batch returns the cached trained tensors, which compute_loss rescaled in place"
    ),
    "one_node_name_everywhere": "every rank gets the same NODE_NAME (the cluster's name)",
    "optimizer_misses_the_head": "the optimizer was built on every layer but the last",
    "left_in_eval_mode": "model.eval() after a validation pass, never model.train() again",
}
"""Each mistake and what it is; the functions below build it into the tests' DDP job."""

SHARDED: dict[str, tuple[str, str, str]] = {
    "fsdp_one_rank_labels_wrong": (
        "fsdp",
        "one_rank_labels_wrong",
        "FSDP2: on rank 1 only, rebuild_batch returns another rank's labels",
    ),
    "hsdp_rebuild_ignores_target": (
        "hsdp",
        "rebuild_ignores_target",
        "HSDP: rebuild_batch(step, rank) returns the caller's own batch",
    ),
    "tp_labels_of_next_step": (
        "tp",
        "labels_of_next_step",
        "TP x HSDP: the right inputs with the next step's labels",
    ),
    "tp_one_rank_labels_wrong": (
        "tp",
        "one_rank_labels_wrong",
        "TP x HSDP: on rank 1 only, another TP group's labels",
    ),
}
"""The sharded drill's rows (replays in lockstep): name -> (layout, mistake, what it is)."""

_noise = random.Random(os.getpid())
"""Python's generator, seeded per process (the guard seeds torch's for replays, not this)."""


class CountingModel(DrillModel):
    """The drill model whose forward ramps its input by the number of its calls (a curriculum
    kept as Python state: a replay advances it)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.net(x * min(1.0, self.calls / 100))


class OwnGeneratorModel(DrillModel):
    """The drill model with noise from a generator it owns (seeded once, never by the guard)."""

    def __init__(self) -> None:
        super().__init__()
        self.generator = torch.Generator().manual_seed(1234)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.net[:5](x)
        h = h + 1e-3 * torch.randn(h.shape, generator=self.generator)
        return self.net[5:](h)


def _module(mistake: str) -> nn.Module:
    if mistake == "forward_counts_calls":
        return CountingModel()
    if mistake == "own_generator_noise":
        return OwnGeneratorModel()
    return DrillModel()


def _augment(batch: Any, mistake: str) -> Any:
    """What both the loader and rebuild_batch do to a batch under an augmentation mistake."""
    x, y = batch
    if mistake == "python_random_augment":
        return x + _noise.gauss(0.0, 0.01), y
    if mistake == "torch_rng_augment":
        return x + 0.01 * torch.randn_like(x), y
    return x, y


def _rebuild(mistake: str, rank: int, grad_accum: int) -> Callable[[int, int], Any]:
    """The mistaken rebuild_batch(step, rank)."""
    cache: dict[tuple[int, int], Any] = {}

    def rebuild(step: int, target: int) -> Any:
        right = make_step_batch(step, target, grad_accum=grad_accum)
        if mistake == "rebuild_ignores_target":
            return make_step_batch(step, rank, grad_accum=grad_accum)
        if mistake == "rebuild_uses_local_rank":
            return make_step_batch(step, target % RANKS_PER_NODE, grad_accum=grad_accum)
        if mistake == "labels_of_next_step":
            return right[0], make_step_batch(step + 1, target)[1]
        if mistake == "one_rank_labels_wrong" and rank == 1:
            return right[0], make_step_batch(step, (target + 1) % dist.get_world_size())[1]
        if mistake in ("python_random_augment", "torch_rng_augment"):
            return _augment(right, mistake)
        if mistake == "rebuild_float64":
            return right[0].double(), right[1]
        if mistake == "micro_batches_reversed":
            return list(reversed(right))
        if mistake == "cached_batch_normalised_in_place":
            return cache.get((step, target), right)
        return right

    rebuild.cache = cache  # type: ignore[attr-defined]
    return rebuild


def held_out(*, mistake: str, steps: int = STEPS) -> dict[str, Any]:
    """Train the tests' DDP job with one held-out mistake; report what the guard did (runs on
    every rank of a :func:`sdc_agent.drills.launch.launch`)."""
    node = os.environ.get("NODE_NAME")
    try:
        return _held_out(mistake, steps)
    finally:  # the launcher runs the next mistake in this process
        if node is not None:
            os.environ["NODE_NAME"] = node


def _held_out(mistake: str, steps: int) -> dict[str, Any]:
    rank = dist.get_rank()
    grad_accum = 2 if mistake == "micro_batches_reversed" else 1
    schedule = {**SCHEDULE, "sensors": False, "grad_accum": grad_accum}
    if mistake == "one_node_name_everywhere":
        os.environ["NODE_NAME"] = "trn-cluster"
    torch.manual_seed(0)
    module = _module(mistake)
    with warnings.catch_warnings():  # torch 2.13 deprecates the flag, which still does this
        warnings.simplefilter("ignore", FutureWarning)
        ddp = nn.parallel.DistributedDataParallel(
            module, broadcast_buffers=mistake != "buffers_not_broadcast"
        )
    params = list(ddp.parameters())
    if mistake == "optimizer_misses_the_head":
        params = [p for n, p in ddp.named_parameters() if not n.startswith("module.net.6.")]
    optimizer = torch.optim.SGD(params, lr=0.05, momentum=0.9)
    loss_of = make_loss()
    calls = 0

    def compute_loss(model: nn.Module, batch: Any) -> torch.Tensor:
        nonlocal calls
        calls += 1
        if mistake == "cached_batch_normalised_in_place":
            x, _ = batch
            x.mul_(2.0)  # rescales the caller's tensor in place, which rebuild_batch cached
        loss = loss_of(model, batch)
        if mistake == "stateful_loss":
            return loss * (1.0 + 1e-3 * calls)
        if mistake == "loss_weighted_by_rank":
            return loss * (1.0 + 0.01 * dist.get_rank())
        return loss

    rebuild = _rebuild(mistake, rank, grad_accum)

    def trained_batch(step: int) -> Any:
        batch = make_step_batch(step, rank, grad_accum=grad_accum)
        if grad_accum == 1:
            batch = _augment(batch, mistake)
        if mistake == "cached_batch_normalised_in_place":
            rebuild.cache[(step, rank)] = batch  # type: ignore[attr-defined]
        return batch

    publisher = RecordingPublisher()
    result: dict[str, Any] = {"mistake": mistake, "error_type": None, "message": ""}
    try:
        guard = sdc.Guard(
            ddp,
            optimizer,
            compute_loss=compute_loss,
            rebuild_batch=rebuild,
            schedule=sdc.Schedule(**schedule),
            publisher=publisher,
        )
    except (ValueError, sdc.TopologyError) as err:
        return {**result, "error_type": type(err).__name__, "message": str(err), "built": False}
    if mistake == "left_in_eval_mode":
        module.eval()
    updates: list[int] = []
    optimizer.register_step_post_hook(lambda *_: updates.append(guard.current_step))
    alarm = None
    try:
        alarm = guard.train(trained_batch(s) for s in range(steps))
    except sdc.AuditSetupError as err:
        result.update(error_type=type(err).__name__, message=str(err))
    return {**result, **what_the_guard_did(guard, publisher, alarm, updates)}


def what_the_guard_did(
    guard: sdc.Guard, publisher: RecordingPublisher, alarm: Any, updates: list[int]
) -> dict[str, Any]:
    """One rank's account of a run: whom its reports named, their set-up findings, the series
    and metrics it wrote, the steps applied, the audit's state."""
    audit = guard.coverage()["checks"]["replay_audit"]
    reports = publisher.reports
    return {
        "built": True,
        "alarm": alarm.to_dict() if alarm else None,
        "named": sorted(
            {s for r in reports for s in (r.get("suspects") or []) + (r.get("culprits") or [])}
        ),
        "findings": [(r.get("setup") or {}).get("cause") for r in reports],
        "node_series": publisher.node_series,
        "sdc_metrics": sorted(set(publisher.metrics) & SDC_METRICS),
        "updates": len(updates),
        "audit_on": bool(audit["on"]),
        "audit_why": audit.get("why", ""),
        "audit_passes": publisher.audit_passes,
        "world": dist.get_world_size(),
    }


def held_out_sharded(*, parallel: str, mistake: str, steps: int = 8) -> dict[str, Any]:
    """The sharded drill (FSDP2, HSDP, or TP with HSDP; replays in lockstep) with one held-out
    mistake in its rebuild_batch; report what the guard did (runs on every rank)."""
    from sdc_agent.drills.job import build_sharded, build_tp, make_batch
    from sdc_agent.drills.tp import TP_KINDS, tp_batches

    publisher = RecordingPublisher()
    build = build_tp if parallel in TP_KINDS else build_sharded
    schedule = {**SCHEDULE, "sensors": False}
    _, optimizer, guard = build(schedule, parallel=parallel, publisher=publisher)
    right = guard.rebuild_batch
    rank, world = dist.get_rank(), dist.get_world_size()
    other = 2 if parallel in TP_KINDS else 1  # another TP group's batch under TP

    def rebuild(step: int, target: int) -> Any:
        x, y = right(step, target)
        if mistake == "rebuild_ignores_target":
            return right(step, rank)
        if mistake == "labels_of_next_step":
            return x, right(step + 1, target)[1]
        if mistake == "one_rank_labels_wrong" and rank == 1:
            return x, right(step, (target + other) % world)[1]
        return x, y

    guard.rebuild_batch = rebuild
    updates: list[int] = []
    optimizer.register_step_post_hook(lambda *_: updates.append(guard.current_step))

    def batch(step: int) -> Any:
        return tp_batches(step, rank, tp=2) if parallel in TP_KINDS else make_batch(step, rank)

    alarm = guard.train(batch(s) for s in range(steps))
    done = what_the_guard_did(guard, publisher, alarm, updates)
    return {"mistake": mistake, "error_type": None, "message": "", **done}


def judge(per_rank: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """One row: whether the mistake named nobody and left the job running, and what was said."""
    errors = [r for r in per_rank if "error" in r]
    if errors:
        return {"ok": False, "outcome": f"crashed: {errors[0]['error']}", "named": []}
    named = sorted({s for r in per_rank for s in r.get("named", [])})
    alarms = [r["alarm"] for r in per_rank if r.get("alarm")]
    named += sorted({s for a in alarms for s in (a.get("suspects") or []) if s not in named})
    series = sorted({s for r in per_rank for s in r.get("node_series", [])})
    metrics = sorted({m for r in per_rank for m in r.get("sdc_metrics", [])})
    first = per_rank[0]
    if not first["built"]:
        refused = all(not r["built"] and r["error_type"] for r in per_rank)
        return {
            "ok": refused,
            "outcome": f"refused at construction: {first['error_type']}: {first['message']}",
            "named": [],
            "refused": f"{first['error_type']}: {first['message']}",
        }
    trained_on = all(r["updates"] == steps for r in per_rank)
    stopped = all(r["error_type"] == "AuditSetupError" for r in per_rank)
    ok = not named and not series and not metrics and (trained_on or stopped)
    findings = sorted({f for r in per_rank for f in r.get("findings", []) if f})
    audit = "on" if first["audit_on"] else f"off ({first['audit_why']})"
    outcome = (
        f"findings {findings or 'none'}; audit {audit}; {first['updates']}/{steps} steps applied"
    )
    if named or series or metrics:
        outcome = f"NAMED {named}, node series {series}, metrics {metrics}; " + outcome
    return {
        "ok": ok,
        "outcome": outcome,
        "named": named,
        "findings": findings,
        "audit_on": first["audit_on"],
        "updates": min(r["updates"] for r in per_rank),
        "stopped": stopped,
        "alarms": alarms,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the held-out mistakes; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--mistakes", default=",".join([*MISTAKES, *SHARDED]), help="comma-separated"
    )
    parser.add_argument("--steps", type=int, default=STEPS, help="training steps per mistake")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds for the launch")
    recorder = Recorder(__file__, argv)
    args = parser.parse_args(argv)
    names = [m for m in args.mistakes.split(",") if m]
    unknown = sorted(set(names) - set(MISTAKES) - set(SHARDED))
    if unknown:
        parser.error(f"unknown mistakes {unknown}; known: {', '.join([*MISTAKES, *SHARDED])}")
    print(
        f"Held-out user mistakes: DDP, {NODES} nodes x {RANKS_PER_NODE} ranks (gloo, CPU), "
        f"{args.steps} steps each, audits every {SCHEDULE['audit_every']}"
    )
    started = time.monotonic()
    jobs = [
        (
            ("mistakes:held_out_sharded", {"parallel": SHARDED[m][0], "mistake": SHARDED[m][1]})
            if m in SHARDED
            else ("mistakes:held_out", {"mistake": m, "steps": args.steps})
        )
        for m in names
    ]
    per_job = launch(
        jobs,
        world=NODES * RANKS_PER_NODE,
        ranks_per_node=RANKS_PER_NODE,
        timeout_s=args.timeout,
    )
    wall = time.monotonic() - started
    rows = []
    for name, per_rank in zip(names, per_job, strict=True):
        sharded = SHARDED.get(name)
        what = sharded[2] if sharded else MISTAKES[name]
        steps = 8 if sharded else args.steps
        row = {"mistake": name, "what": what, **judge(per_rank, steps)}
        rows.append(row)
        print(f"{'ok  ' if row['ok'] else 'FAIL'} {name}: {row['outcome']}")
    wrong = [r["mistake"] for r in rows if not r["ok"]]
    print(
        f"\n{len(rows) - len(wrong)} of {len(rows)} named nobody and left the job running "
        f"({wall:.0f} s)" + (f"; FAILED: {', '.join(wrong)}" if wrong else "")
    )
    if args.json:
        recorder.write(args.json, {"steps": args.steps, "schedule": SCHEDULE, "rows": rows})
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())

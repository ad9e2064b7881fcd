"""``python -m sdc_agent.drill``: one fire drill on the CPU, and what the guard caught.

It starts 3 simulated nodes x 2 ranks on this machine (:mod:`sdc_agent.drills.launch`), injects a
persistent fault into one rank's forward pass (:mod:`sdc_agent.drills.faults`), trains the drill
job (:mod:`sdc_agent.drills.job`) and prints the alarm; ``--parallel fsdp|hsdp`` runs the same
drill on a model sharded with FSDP2 (full sharding, or HSDP with replicas across nodes and
shards within a node), ``--parallel tp|fsdp+tp`` on a tensor-parallel model (TP groups
inside a node, composed with HSDP replicas or FSDP2 shards across nodes), and ``--parallel pp``
on a 2-stage pipeline per node whose stages are sharded over the replicas
(``torch.distributed.pipelining`` with FSDP2), and ``--parallel ep`` on a small MoE model with
expert parallel inside each node x HSDP replicas across nodes (:mod:`sdc_agent.drills.ep`), where
checks 1 and 3 run and the replay audit does not yet: its drill takes ``--fault nan``,
``weight`` or ``none``, and refuses ``scale`` (only the replay audit would catch it).

The last line is ``PASS: ...`` (exit code 0) when the guard did what the drill expects (the
faulty rank named, or no alarm where no check can see the fault), else ``FAIL: ...`` (exit code
1), also when the ranks failed or did not finish within ``--timeout`` seconds. Flags that cannot
make a drill (``--rank`` outside the world, fewer than 3 nodes, ...) stop it before anything
starts, with a usage error (exit code 2) naming the flag.

The drills live in :mod:`sdc_agent.drills`, which the guard never imports; the names this module
had before they moved there (the drill job, the launcher) stay importable from here, for code
and job paths (``"sdc_agent.drill:train_drill"``) written against it.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from typing import Any

from .drills.ep import EXPERT_W1, EXPERT_W2
from .drills.job import (
    DrillModel,
    build,
    build_sharded,
    guarded_sgd,
    make_batch,
    make_fault,
    make_loss,
    make_step_batch,
    train_drill,
)
from .drills.launch import Job, launch, node_name
from .drills.pipeline import STAGES

__all__ = [
    "DrillModel",
    "Job",
    "build",
    "build_sharded",
    "guarded_sgd",
    "launch",
    "main",
    "make_batch",
    "make_fault",
    "make_loss",
    "make_step_batch",
    "node_name",
    "parse_args",
    "train_drill",
]

DESCRIPTION = (
    'Fire drills on the CPU: a real multi-process DDP job (gloo) with a fault on one "GPU".'
)
DEFAULT_TIMEOUT_S = 900.0
"""The whole drill's limit. On a 2-core machine the default drill took 20 s and the 3d one (12
ranks) 50 s; the old fixed 240 s ran out on a loaded one, where every rank's process start
(importing torch) and its one-thread replays wait for a core."""
MIN_NODES = 3
"""The ring replay audit puts each replay pair on two nodes and confirms on a third."""
EP_FAULTS = ("nan", "weight", "none")
"""The faults the expert-parallel drill takes: ``scale`` needs the replay audit (check 2), which
does not run under EP yet (:data:`sdc_agent.parallel.ep.NO_REPLAY`)."""
EP_NO_SCALE = (
    "--fault scale --parallel ep: a scaled output is caught only by the ring replay audit "
    "(check 2), which is not available under expert parallel yet (routing and the all-to-all "
    "dispatch and combine are not replayed; docs/usage/ep.md), and checks 1 and 3 do not see a "
    "finite wrong value (the gradients stay finite and the reduction gives every replica the "
    "same update, so the copies' weights stay equal): choose "
    f"--fault {' | '.join(EP_FAULTS)}"
)
"""The usage error for the one fault the expert-parallel drill cannot catch."""


def parser() -> argparse.ArgumentParser:
    """The drill's flags."""
    p = argparse.ArgumentParser(prog="python -m sdc_agent.drill", description=DESCRIPTION)
    p.add_argument(
        "--fault",
        choices=["scale", "nan", "weight", "none"],
        default="scale",
        help="what goes wrong on the faulty rank (none: a clean run, expect no alarm)",
    )
    p.add_argument("--rank", type=int, default=3, help="the faulty global rank (< nodes x ranks)")
    p.add_argument("--step", type=int, default=7, help="the step the fault starts at (< --steps)")
    p.add_argument("--steps", type=int, default=20, help="training steps")
    p.add_argument("--nodes", type=int, default=MIN_NODES, help=f"simulated nodes (>= {MIN_NODES})")
    p.add_argument("--ranks-per-node", type=int, default=2, help="processes per node (>= 1)")
    p.add_argument(
        "--parallel",
        choices=["ddp", "fsdp", "hsdp", "tp", "fsdp+tp", "pp", "3d", "ep"],
        default="ddp",
        help="how the model is parallel: DDP, FSDP2 full sharding, HSDP (replicas across "
        "nodes, shards within a node), tp (tensor parallel inside a node, HSDP replicas across "
        "nodes: a ('replicate', 'shard', 'tp') mesh), fsdp+tp (tensor parallel inside a node, "
        "FSDP2 across nodes: ('dp', 'tp')), pp: a 2-stage pipeline per node, each stage a "
        "whole copy per replica (HSDP), replicas across nodes, or 3d: the same pipeline with "
        "each stage tensor parallel inside the node (TP x PP x HSDP; --ranks-per-node 4 or "
        "another multiple of 2 stages x TP >= 2), or ep: a small MoE model, expert parallel "
        "over each node's ranks x HSDP replicas across nodes (torchtitan's layout; --fault "
        "nan, weight or none: the replay audit, which scale needs, does not run under EP)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"give up (FAIL) when the ranks have not finished after this long (default "
        f"{DEFAULT_TIMEOUT_S:.0f}; raise it on a loaded machine)",
    )
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The drill's flags, checked against each other; a usage error (exit code 2) names the
    flag that cannot make a drill."""
    p = parser()
    args = p.parse_args(argv)
    if args.nodes < MIN_NODES:
        p.error(
            f"--nodes {args.nodes}: at least {MIN_NODES} (each replay pair runs on two nodes "
            "and a third confirms)"
        )
    if args.ranks_per_node < 1:
        p.error(f"--ranks-per-node {args.ranks_per_node}: at least 1")
    world = args.nodes * args.ranks_per_node
    if not 0 <= args.rank < world:
        p.error(
            f"--rank {args.rank}: the faulty rank must be one of the {world} ranks "
            f"({args.nodes} nodes x {args.ranks_per_node}): 0 .. {world - 1}"
        )
    if args.steps < 1:
        p.error(f"--steps {args.steps}: at least 1")
    if args.fault != "none" and not 0 <= args.step < args.steps:
        p.error(
            f"--step {args.step}: the fault must start within the run's steps 0 .. "
            f"{args.steps - 1} (--steps {args.steps})"
        )
    if not args.timeout > 0:
        p.error(f"--timeout {args.timeout:g}: a positive number of seconds")
    if args.parallel == "pp" and args.ranks_per_node != STAGES:
        p.error(
            f"--parallel pp puts one {STAGES}-stage pipeline on each node: "
            f"--ranks-per-node {STAGES}"
        )
    if args.parallel == "3d" and (args.ranks_per_node % STAGES or args.ranks_per_node < 2 * STAGES):
        p.error(
            f"--parallel 3d puts one {STAGES}-stage pipeline on each node with TP groups of "
            f">= 2 ranks per stage: --ranks-per-node {2 * STAGES} (or another multiple of "
            f"{STAGES} from {2 * STAGES})"
        )
    if args.parallel == "ep":
        if args.ranks_per_node < 2:
            p.error(
                f"--parallel ep puts one expert-parallel group on each node's ranks: "
                f"--ranks-per-node {args.ranks_per_node} must be at least 2"
            )
        if args.fault not in EP_FAULTS:
            p.error(EP_NO_SCALE)
    return args


def _faults(args: argparse.Namespace, tp: int) -> list[dict[str, Any]]:
    """The drill's fault on ``args.rank``, in a layer that rank computes."""
    # Each drill model names its layers its own way (sdc_agent.drills.sharded, .tp): the
    # tensor-parallel fault is in one rank's column-parallel GEMM output.
    layer, weight = {
        "ddp": ("net.4", "net.0.weight"),
        "tp": ("blocks.1.up", "blocks.0.up.weight"),
        "fsdp+tp": ("blocks.1.up", "blocks.0.up.weight"),
    }.get(args.parallel, ("blocks.1.norm", "blocks.0.fc.weight"))
    if args.parallel == "pp":  # a pipeline rank holds one stage's layers (drills.pipeline)
        stage = args.rank % STAGES
        layer, weight = f"blocks.{stage}.norm", f"blocks.{stage}.fc.weight"
    if args.parallel == "3d":  # one rank's column-parallel GEMM output, in its own stage
        stage = (args.rank // tp) % STAGES
        layer, weight = f"blocks.{stage}.up", f"blocks.{stage}.up.weight"
    at = {"rank": args.rank, "step": args.step}
    if args.parallel == "ep":
        return _ep_faults(args.fault, at)
    return {
        "scale": [{"kind": "ScaleOutputElement", "layer": layer, "factor": 1000.0, **at}],
        "nan": [{"kind": "NaNOutputElement", "layer": layer, "persistent": False, **at}],
        "weight": [{"kind": "FlipWeightBit", "param": weight, "bit": 27, **at}],
        "none": [],
    }[args.fault]


def _ep_faults(fault: str, at: dict[str, int]) -> list[dict[str, Any]]:
    """The expert-parallel drill's fault (:data:`EP_FAULTS`), in the routed experts."""
    return {
        # A non-finite gradient on one rank: NaN in one element of the faulty rank's local
        # gradient of its experts' w1, one step. A NaN in a forward output would be seen too,
        # but the combine all-to-all may carry it to an EP partner's expert gradients within
        # the step (where depends on the routing), naming that rank as well (docs/usage/ep.md).
        "nan": [
            {
                "kind": "ScaleWeightGradElement",
                "param": EXPERT_W1,
                "index": 5,
                "factor": float("nan"),
                "persistent": False,
                **at,
            }
        ],
        # One stored expert weight of one copy, after the step's update: check 3 compares the
        # expert's copies across the nodes (the dp_replicate replicas).
        "weight": [{"kind": "FlipWeightBit", "param": EXPERT_W2, "bit": 27, **at}],
        "none": [],
    }[fault]


EP_FAULT_NOTE = {
    "nan": "a NaN in one element of rank {rank}'s local gradient of its experts' {w1} at step "
    "{step}",
    "weight": "bit 27 of one element of rank {rank}'s stored {w2} flipped after step {step}'s "
    "update",
}
"""What the expert-parallel drill's fault is, printed under the first line."""


def _checks(coverage: dict[str, Any], layout_prefix: str = "expert parallel:") -> Iterator[str]:
    """Which checks ran and which were off, and why (the guard's ``coverage()``), then what
    it says the layout leaves uncovered (its ``not_covered`` lines starting ``layout_prefix``;
    the others are the sharding's, as under HSDP)."""
    yield f"checks ({coverage['parallelism']}, from guard.coverage()):"
    for name, check in coverage["checks"].items():
        yield f"  {'on ' if check['on'] else 'OFF'} {name}: {check['why']}"
    for line in coverage["not_covered"]:
        if line.startswith(layout_prefix):
            yield f"  not covered: {line}"


def _describe(result: dict[str, Any]) -> Iterator[str]:
    alarm = result["alarm"]
    if alarm is None:
        yield f"no alarm: {len(result['updates'])} updates applied, checks passed"
        return
    yield f"ALARM at step {alarm['step']}: check '{alarm['check']}' ({alarm['metric']['name']})"
    yield f"  suspects: {alarm['suspects']}   window: {alarm['suspect_window']}"
    if alarm["mismatched_pairs"]:
        yield f"  mismatched (target, replayer) pairs: {alarm['mismatched_pairs']}"
    if alarm["culprits"]:
        yield f"  culprits (wrong as target and as replayer): {alarm['culprits']}"
    if alarm.get("diagnosis"):
        yield f"  diagnosis: {alarm['diagnosis']}"
    for v in alarm["verdicts"]:
        yield f"  confirmation of {v['pair']} by rank {v['third']}: {v['kind']} -> {v['suspect']}"
    for rank, info in alarm["ranks"].items():
        yield f"  rank {rank}: node {info['node_name']} instance {info['instance_id']} gpu {info['gpu_uuid']}"
    applied = (
        "was applied: its weights were checked after it"
        if alarm["check"] == "weights"
        else "was not applied"
    )
    yield f"  updates applied: {len(result['updates'])} (the failing step {applied})"


def judge(args: argparse.Namespace, alarm: dict[str, Any] | None) -> tuple[bool, str]:
    """Whether the drill's outcome is the expected one, and what was expected."""
    named = (alarm or {}).get("suspects") or []
    # Full sharding keeps one copy of each weight shard and every rank computes with it, so a
    # flipped stored weight is seen by no check (the guard logged so at start).
    if args.fault == "none" or (args.fault == "weight" and args.parallel in ("fsdp", "fsdp+tp")):
        return alarm is None, "no alarm"
    tp = args.ranks_per_node // STAGES
    if args.fault == "nan" and args.parallel in ("tp", "fsdp+tp"):
        # A NaN crosses the TP all-reduce within the step: check 1 names every rank of the
        # faulty rank's TP group (its node) whose local gradient it reached.
        first, size = args.rank - args.rank % args.ranks_per_node, args.ranks_per_node
    elif args.fault == "nan" and args.parallel == "3d":
        # Likewise inside a stage: check 1 names the stage's TP group it reached, never another
        # node. (A scaled output is named alone: the replay's ordered local results show which
        # rank of the group diverged first.)
        first, size = args.rank - args.rank % tp, tp
    else:
        return named == [args.rank], f"rank {args.rank} named, alone"
    members = set(range(first, first + size))
    ok = args.rank in named and set(named) <= members
    return ok, f"rank {args.rank} named, with at most its TP group {sorted(members)}"


def main(argv: list[str] | None = None) -> int:
    """Run one drill, print what the guard caught and a last PASS or FAIL line; 0 on PASS."""
    args = parse_args(argv)
    tp = args.ranks_per_node // STAGES
    schedule = {
        "audit_every": 5,
        "check_every": 5,
        "ckpt_every": 10,
        # Under a pipeline the ring runs over pipelines: one per node, or one per TP rank of a
        # stage (3d), so the offset moves each to the next node.
        "peer_offset": {"pp": 1, "3d": tp}.get(args.parallel, args.ranks_per_node),
    }
    print(
        f"sdc drill: {args.parallel}, {args.nodes} nodes x {args.ranks_per_node} ranks "
        f"(gloo, CPU), fault: {args.fault} on rank {args.rank} from step {args.step}"
    )
    if args.parallel == "ep" and args.fault in EP_FAULT_NOTE:
        note = EP_FAULT_NOTE[args.fault].format(
            rank=args.rank, step=args.step, w1=EXPERT_W1, w2=EXPERT_W2
        )
        print(f"  the fault: {note}")
    started = time.monotonic()
    job = {
        "steps": args.steps,
        "schedule": schedule,
        "faults": _faults(args, tp),
        "parallel": args.parallel,
        "shards": {"pp": 1, "3d": tp}.get(args.parallel, args.ranks_per_node),
    }
    # The expert-parallel drill has its own job (sdc_agent.drills.ep): its model, its meshes.
    drill_job = ("sdc_agent.drills.job:train_drill", job)
    if args.parallel == "ep":
        ep_job = {k: job[k] for k in ("steps", "schedule", "faults")}
        drill_job = (
            "sdc_agent.drills.ep:train_ep",
            {**ep_job, "ranks_per_node": args.ranks_per_node},
        )
    try:
        results = launch(
            [drill_job],
            world=args.nodes * args.ranks_per_node,
            ranks_per_node=args.ranks_per_node,
            timeout_s=args.timeout,
        )[0]
    except TimeoutError:
        print(
            f"FAIL: the ranks did not finish within --timeout {args.timeout:g} s (a loaded "
            "machine: rerun with a larger --timeout)"
        )
        return 1
    except RuntimeError as err:  # a rank died without a result
        print(f"FAIL: {err}")
        return 1
    errors = [r for r in results if "error" in r]
    if errors:
        print(errors[0]["trace"], file=sys.stderr)
        print(f"FAIL: a rank raised {errors[0]['error']}")
        return 1
    alarm = results[0]["alarm"]
    if "coverage" in results[0]:  # the EP drill's job reports it (train_drill does not)
        for line in _checks(results[0]["coverage"]):
            print(line)
    for line in _describe(results[0]):
        print(line)
    if args.fault == "weight" and args.parallel in ("fsdp", "fsdp+tp"):
        print("  (FSDP2 full sharding: no weight redundancy, so check 3 is off; expected no alarm)")
    print(f"({time.monotonic() - started:.1f} s)")
    ok, expected = judge(args, alarm)
    got = "no alarm" if alarm is None else f"{alarm['check']} alarm naming {alarm['suspects']}"
    print(f"PASS: {expected}" if ok else f"FAIL: expected {expected}, got {got}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

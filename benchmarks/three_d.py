"""TP x PP x HSDP on 12 CPU processes: a fault-free run and injected faults, and what the guard found.

Not part of the test suite (12 processes take minutes on a small machine): ``make bench`` runs
it as the jobs ``three-d-clean`` and ``three-d-faults`` (docs/performance.md renders their
results), or by hand,

    python benchmarks/three_d.py                          # clean, then a column-parallel fault
    python benchmarks/three_d.py --scenarios clean --steps 50 --bf16
    python benchmarks/three_d.py --scenarios output,wgrad,weight --json three_d.json

The job is the drill's (``sdc_agent.drills.pipeline`` with ``tp``, as ``python -m sdc_agent.drill
--parallel 3d`` builds it): 3 simulated nodes x 4 ranks, one replica per node; each replica is a
2-stage pipeline (``ScheduleGPipe``, 2 micro-batches) whose stages are tensor parallel over 2
ranks (``up`` column-parallel, ``down`` row-parallel) and sharded with HSDP over the replicas
(a whole copy of each stage's TP slice per replica): the mesh ``("replicate", "shard", "pp",
"tp")`` of 3 x 1 x 2 x 2. ``peer_offset`` is 2 pipelines (the TP ranks of one node's stage),
so each TP group replays the next node's, and the third GPU of a dispute sits on the third node.

Scenarios (``--scenarios``, comma-separated):

* ``clean``: no fault; every step audited and weight-checked (``--every``): expect no alarm and
  every update applied.
* ``output``: a persistent fault in one rank's column-parallel GEMM output (``blocks.1.up`` on
  rank 3: stage 1, tp 1 of node 0): the TP all-reduce carries it to the rank's TP partner
  (rank 2) before the stage sends it, so both diverge at that stage; the pairs whose ordered
  local results diverged first are rank 3's, so rank 3 alone is expected.
* ``wgrad``: one element of rank 3's local ``blocks.1.up.weight`` gradient slice scaled
  (backward only): rank 3 alone is expected.
* ``weight``: a bit flipped in rank 3's stored ``blocks.1.up.weight`` slice: check 3 names
  rank 3 alone.

Prints each scenario's alarm, what was expected, and the wall time; exits 1 when a scenario's
outcome is not the expected one.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from results import Recorder

from sdc_agent.drills.launch import launch

NODES = 3
RANKS_PER_NODE = 4
TP = 2
FAULTY = 3
"""The faulty rank: node 0, stage 1, tp coordinate 1 (its stage's TP partner is rank 2)."""


def faults_of(scenario: str, step: int) -> list[dict[str, Any]]:
    """The fault injectors of ``scenario`` (``sdc_agent.drills.faults`` specifications)."""
    return {
        "clean": [],
        "output": [
            {
                "kind": "ScaleOutputElement",
                "layer": "blocks.1.up",
                "factor": 1000.0,
                "rank": FAULTY,
                "step": step,
            }
        ],
        "wgrad": [
            {
                "kind": "ScaleWeightGradElement",
                "param": "blocks.1.up.weight",
                "factor": 1000.0,
                "rank": FAULTY,
                "step": step,
            }
        ],
        "weight": [
            {
                "kind": "FlipWeightBit",
                "param": "blocks.1.up.weight",
                "bit": 27,
                "rank": FAULTY,
                "step": step,
            }
        ],
    }[scenario]


def judge(scenario: str, result: dict[str, Any], steps: int) -> tuple[bool, str]:
    """(whether ``result``, rank 0's report, is what ``scenario`` expects; the expectation)."""
    alarm = result["alarm"]
    named = set((alarm or {}).get("suspects") or [])
    if scenario == "clean":
        return alarm is None and len(result["updates"]) == steps, "no alarm, every update applied"
    return alarm is not None and named == {FAULTY}, f"rank {FAULTY} alone"


def main(argv: list[str] | None = None) -> int:
    """Run the scenarios; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default="clean,output", help="comma-separated")
    parser.add_argument("--steps", type=int, default=20, help="training steps per scenario")
    parser.add_argument("--fault-step", type=int, default=6, help="the step a fault starts at")
    parser.add_argument(
        "--every", type=int, default=1, help="audit and weight-check every N steps (clean run)"
    )
    parser.add_argument("--bf16", action="store_true", help="the stages' forward in bf16 autocast")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per scenario")
    recorder = Recorder(__file__, argv)
    args = parser.parse_args(argv)
    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = set(scenarios) - {"clean", "output", "wgrad", "weight"}
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}")
    print(
        f"TP x PP x HSDP: {NODES} nodes x {RANKS_PER_NODE} ranks (gloo, CPU), 2 stages x TP {TP} "
        f"per replica, {NODES} replicas; {args.steps} steps per scenario"
    )
    summary = []
    ok_all = True
    for scenario in scenarios:
        every = args.every if scenario == "clean" else 5
        schedule = {
            "audit_every": every,
            "check_every": every,
            "ckpt_every": 0,
            "peer_offset": TP,
            "sensors": False,  # the guard runs no online sensors under a pipeline
        }
        started = time.monotonic()
        results = launch(
            [
                (
                    "sdc_agent.drills.job:train_drill",
                    {
                        "steps": args.steps,
                        "schedule": schedule,
                        "faults": faults_of(scenario, args.fault_step),
                        "parallel": "3d",
                        "shards": TP,
                        "autocast_bf16": args.bf16,
                    },
                )
            ],
            world=NODES * RANKS_PER_NODE,
            ranks_per_node=RANKS_PER_NODE,
            timeout_s=args.timeout,
        )[0]
        wall = time.monotonic() - started
        errors = [r for r in results if "error" in r]
        if errors:
            print(errors[0]["trace"], file=sys.stderr)
            return 1
        result = results[0]
        ok, expected = judge(scenario, result, args.steps)
        ok_all &= ok
        alarm = result["alarm"]
        print(f"\n{scenario}: {'as expected' if ok else 'NOT AS EXPECTED'} ({wall:.1f} s)")
        print(f"  expected: {expected}")
        if alarm is None:
            print(
                f"  no alarm; updates applied: {len(result['updates'])}; last audit pass "
                f"{result['last_audit_pass']}, last weight check pass "
                f"{result['last_weight_check_pass']}"
            )
        else:
            print(
                f"  alarm at step {alarm['step']}: check {alarm['check']!r}, suspects "
                f"{alarm['suspects']}, verdicts {[v['kind'] for v in alarm['verdicts']]}, "
                f"pairs {alarm['mismatched_pairs']}"
            )
            nodes = {r: info["node_name"] for r, info in alarm["ranks"].items()}
            print(f"  nodes of the suspects: {nodes}")
            if alarm.get("diagnosis"):
                print(f"  diagnosis: {alarm['diagnosis']}")
        summary.append(
            {
                "scenario": scenario,
                "faults": faults_of(scenario, args.fault_step),
                "ok": ok,
                "expected": expected,
                "steps": args.steps,
                "every": every,
                "fault_step": args.fault_step,
                "bf16": args.bf16,
                "updates_applied": len(result["updates"]),
                "last_audit_pass": result["last_audit_pass"],
                "last_weight_check_pass": result["last_weight_check_pass"],
                "wall_s": round(wall, 1),
                "alarm": alarm,
            }
        )
    if args.json:
        layout = {"nodes": NODES, "ranks_per_node": RANKS_PER_NODE, "tp": TP, "faulty": FAULTY}
        recorder.write(args.json, {"layout": layout, "scenarios": summary})
    return 0 if ok_all else 1


if __name__ == "__main__":
    raise SystemExit(main())

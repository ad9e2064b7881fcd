"""Real training loops on a real multi-process DDP job (3 simulated nodes x 2 ranks, gloo, CPU):
gradient accumulation, fp16 with a GradScaler, bf16 autocast, activation checkpointing.

All scenarios run in one launch of 6 processes; each test asserts its own. Rank R=3 (node 1)
is replayed by rank 1 (node 0) and confirmed by rank 5 (node 2); peer_offset=2.
"""

from __future__ import annotations

from typing import Any

import pytest

from sdc_agent.drills.launch import launch
from tests.agent.outcomes import ok, the_alarm
from tests.agent.scenarios import R

# How long this file's processes may run before the launcher kills them; the suite's conftest
# marks the file slow and gives pytest-timeout this plus a margin.
LAUNCH_DEADLINE_S = 600


RUN = "tests.agent.loops:run"
N = 4


def job(steps: int, schedule: dict[str, Any], **options: Any) -> tuple[str, dict[str, Any]]:
    return RUN, {
        "steps": steps,
        "schedule": {"check_every": 0, "peer_offset": 2, **schedule},
        **options,
    }


def x1000(**kw: Any) -> dict[str, Any]:
    """x1000 on one element of rank R's net.4 output, every time from step 3."""
    return {"kind": "ScaleOutputElement", "layer": "net.4", "factor": 1000.0, "rank": R, **kw}


JOBS: dict[str, tuple[str, dict[str, Any]]] = {
    # Audits every 2 steps audit positions 0, 1, 2, 3, 0, 1, ... (steps 0, 2, 4, 6, 8, 10)
    "accum_one_position": job(
        12,
        {"audit_every": 2, "grad_accum": N},
        faults=[x1000(step=3, micro_batch=1)],
        own_loop=True,
    ),
    "accum_all_positions": job(8, {"audit_every": 2, "grad_accum": N}, faults=[x1000(step=3)]),
    "accum_clean": job(8, {"audit_every": 1, "check_every": 2, "grad_accum": N}),
    "accum_isolation_exact": (
        "tests.agent.loops:isolation_changes_no_bit",
        {"steps": 4, "grad_accum": N},
    ),
    "fp16_overflows": job(30, {"audit_every": 5}, precision="fp16", init_scale=2.0**40),
    "fp16_transient_nan": job(
        34,
        {"audit_every": 5, "grad_accum": 2, "max_grad_norm": 5.0},
        precision="fp16",
        init_scale=2.0**40,
        own_loop=True,
        faults=[
            {
                "kind": "NaNOutputElement",
                "layer": "net.4",
                "rank": R,
                "step": 31,
                "persistent": False,
            }
        ],
    ),
    "bf16_poisoned_batch": job(
        10, {"audit_every": 5}, precision="bf16", poison={"step": 6, "rank": 2}
    ),
    "coverage": ("tests.agent.loops:coverage", {}),
    "misuse": ("tests.agent.loops:misuse", {}),
    "bf16_checkpointed_clean": job(
        50, {"audit_every": 1, "check_every": 1}, precision="bf16", checkpointing=True
    ),
}


@pytest.fixture(scope="module")
def results() -> dict[str, list[dict[str, Any]]]:
    names = list(JOBS)
    per_job = launch(
        [JOBS[n] for n in names], world=6, ranks_per_node=2, timeout_s=LAUNCH_DEADLINE_S
    )
    return dict(zip(names, per_job, strict=True))


def publisher(results: dict, name: str) -> dict[str, Any]:
    (rank0,) = [r for r in ok(results, name) if r["dp_rank"] == 0]
    return rank0


def test_accumulation_fault_on_one_micro_batch_position_is_named_within_n_audits(results):
    # Given N=4 micro-batches per step, audits every 2 steps rotating the audited position, and
    # from step 3 a persistent x1000 on rank R only while it computes micro-batch position 1
    # (in the owner loop of the README)
    alarm = the_alarm(results, "accum_one_position")
    # Then the first audit of position 1 after the fault starts (step 10, the 4th audit since)
    # finds R wrong as target and as replayer, and names it
    assert (alarm["step"], alarm["check"], alarm["suspects"]) == (10, "compute", [R])
    assert alarm["mismatched_pairs"] == [[R, 1], [5, R]] and alarm["culprits"] == [R]
    # and steps 0-9 were applied, step 10 was not
    assert all(r["updates"] == list(range(10)) for r in results["accum_one_position"])


def test_accumulation_fault_on_every_micro_batch_is_named_at_the_next_audit(results):
    alarm = the_alarm(results, "accum_all_positions")
    assert (alarm["step"], alarm["check"], alarm["suspects"]) == (4, "compute", [R])
    assert alarm["culprits"] == [R]


def test_accumulation_without_faults_raises_no_alarm(results):
    # Given N=4, every step audited (every position in turn, the synchronised last one too)
    per_rank = ok(results, "accum_clean")
    assert all(r["alarm"] is None and r["updates"] == list(range(8)) for r in per_rank)
    # Then every audit and weight check passed
    rank0 = publisher(results, "accum_clean")
    assert rank0["audit_passes"] == 8 and rank0["weight_check_passes"] == 5


def test_isolating_the_audited_micro_batch_changes_no_weight_bit_under_ddp(results):
    # Given the same training with and without isolating the audited micro-batch's gradient
    for r in ok(results, "accum_isolation_exact"):
        # Then the weights are bit-identical: the stash added back gives what DDP all-reduces
        assert r["isolated"] == r["plain"]


def test_fp16_overflows_are_skipped_and_lower_the_scale_without_an_alarm(results):
    # Given fp16 autocast with a GradScaler starting at 2**40: the first steps overflow
    per_rank = ok(results, "fp16_overflows")
    # Then no alarm is returned or published, and no SDC metric is written
    assert all(r["alarm"] is None for r in per_rank)
    rank0 = publisher(results, "fp16_overflows")
    assert rank0["alarms_published"] == 0 and rank0["cluster_series"] == 0
    # And the overflowing steps were skipped, the scale fell, and training went on to the end
    scales = {r["scale"] for r in per_rank}
    assert len(scales) == 1 and scales.pop() < 2.0**40 / 2**10
    updates = per_rank[0]["updates"]
    assert 0 not in updates and updates[-1] == 29 and len(updates) >= 3
    assert all(r["updates"] == updates for r in per_rank)
    assert len({r["weights"] for r in per_rank}) == 1
    # and the audits after the scale settled passed
    assert rank0["audit_passes"] >= 1


def test_fp16_transient_nan_after_the_scale_settled_is_named(results):
    # Given fp16 with a GradScaler (2 micro-batches per step, clipping after unscale_, the owner
    # loop) and a NaN on
    # rank R's forward at step 31 only, after the early overflows lowered the scale
    alarm = the_alarm(results, "fp16_transient_nan")
    # Then the replay on a third GPU at the same scale is finite: SDC, transient, R named
    assert (alarm["step"], alarm["check"], alarm["nonfinite"]) == (31, "compute", [R])
    assert alarm["suspects"] == [R]
    assert alarm["verdicts"] == [{"pair": [R, R], "third": 5, "suspect": R, "kind": "transient"}]
    assert alarm["diagnosis"] is None
    assert publisher(results, "fp16_transient_nan")["per_node_series"] == 1


def test_bf16_nan_from_a_poisoned_batch_is_reproducible_and_names_nobody(results):
    # Given bf16 autocast and a NaN in rank 2's input at step 6, which rebuild_batch returns
    # on every GPU (a poisoned batch)
    alarm = the_alarm(results, "bf16_poisoned_batch")
    # Then the third GPU reproduces it: verdict reproducible, nobody named
    assert (alarm["step"], alarm["check"], alarm["nonfinite"]) == (6, "compute", [2])
    assert alarm["suspects"] is None
    assert alarm["verdicts"] == [
        {"pair": [2, 2], "third": 4, "suspect": None, "kind": "reproducible"}
    ]
    assert "numerics or data, not a GPU" in alarm["diagnosis"]
    # And no per-node series is published (the pipeline looks for no node)
    rank0 = publisher(results, "bf16_poisoned_batch")
    assert rank0["alarms_published"] == 1 and rank0["per_node_series"] == 0
    assert all(r["updates"] == list(range(6)) for r in results["bf16_poisoned_batch"])


def test_bf16_with_activation_checkpointing_runs_50_audited_steps_without_alarm(results):
    # Given bf16 autocast, non-reentrant activation checkpointing, every step audited and
    # weight-checked
    per_rank = ok(results, "bf16_checkpointed_clean")
    assert all(r["alarm"] is None and r["updates"] == list(range(50)) for r in per_rank)
    # Then every replay matched bit for bit and every weight check agreed
    rank0 = publisher(results, "bf16_checkpointed_clean")
    assert rank0["audit_passes"] == 50 and rank0["weight_check_passes"] == 51


def test_coverage_describes_what_the_guard_checks_for_a_6_rank_job(results):
    per_rank = ok(results, "coverage")
    # Given a 6-rank job (3 nodes x 2), peer_offset 2, N=4 micro-batches and a GradScaler
    cov = per_rank[0]["accumulating"]
    # Then every rank describes the same coverage, and it survived JSON (the launcher's)
    assert all(r == per_rank[0] for r in per_rank)
    assert (cov["schema"], cov["world"], cov["ranks"], cov["grad_accum"]) == (
        "sdc.coverage/v1",
        6,
        [0, 1, 2, 3, 4, 5],
        4,
    )
    checks = cov["checks"]
    assert (
        checks["nonfinite_gradients"]["on"] and checks["nonfinite_gradients"]["confirmation"]["on"]
    )
    audit = checks["replay_audit"]
    assert audit["on"] and audit["every"] == 10
    # Rank r replays rank r+2's micro-batch (another node); disputes go to r+4 (a third node)
    assert audit["pairs"][R] == {"replayer": R, "target": 5, "third": 1}
    assert [p["target"] for p in audit["pairs"]] == [2, 3, 4, 5, 0, 1]
    # One micro-batch per audit, every position within 4 audits
    assert audit["micro_batches"]["audited_per_audit"] == 1
    assert audit["micro_batches"]["positions_of_first_audits"] == [0, 1, 2, 3]
    weights = checks["weight_fingerprints"]
    assert weights["on"] and weights["every"] == 5 and weights["replicas"] == list(range(6))
    assert cov["precision"]["scaler"] == "GradScaler"
    assert "overflow" in cov["precision"]["non_finite"]
    assert any("optimizer state" in line for line in cov["not_covered"])
    # And without audits the description says the audit is off, and why
    off = per_rank[0]["no_audits"]["checks"]["replay_audit"]
    assert not off["on"] and "audit_every is 0" in off["why"] and off["pairs"] == []
    assert per_rank[0]["no_audits"]["precision"]["scaler"] is None


def test_accumulation_misuse_raises_clear_errors_before_any_collective(results):
    # Given steps of N=2 run wrongly (the same way on every rank)
    for errors in ok(results, "misuse"):
        # Then each raises an error that says what to do, and no rank hangs
        assert "3 micro-batches; Schedule.grad_accum is 2" in errors["count"]
        assert "guarded.micro_batches" in errors["plain_backward"]
        assert "inside each micro-batch" in errors["outside"]

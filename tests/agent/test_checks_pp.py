"""The three checks on a pipeline-parallel job: 3 replicas x 2 stages, each stage sharded with
FSDP2 over the replicas, 3 simulated nodes x 2 ranks.

One launch of 6 gloo processes on the CPU runs every scenario (process start-up dominates).
Replica r holds stage 0 on rank 2r and stage 1 on rank 2r + 1, both on node r: every stage's
copies in the other replicas are on other nodes. Replica r replays replica r + 1's pipeline step
(peer_offset counts replicas); disputes are settled on replica r + 2. Rank 2 (replica 1, stage 0)
and rank 3 (replica 1, stage 1) are the faulty ranks: a fault on one stage changes what the
other stage of its replica computes, and only the stage where it happened may be named.

A second launch of 12 processes runs TP x PP x HSDP (the drill's ``3d``): 3 nodes x 4 ranks,
each replica a 2-stage pipeline whose stages are tensor parallel over 2 ranks (rank
4 * node + 2 * stage + tp; ``up`` column-parallel, ``down`` row-parallel). Each TP rank's
pipeline is one of the rings' 6 pipelines, and ``peer_offset`` 2 makes each TP group replay the
next node's. Rank 5 (node 1, stage 0, tp 1) is the faulty rank; its TP partner is rank 4.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from sdc_agent.drills.launch import launch
from tests.agent.outcomes import ok, the_alarm

# How long this file's processes may run before the launcher kills them; the suite's conftest
# marks the file slow and gives pytest-timeout this plus a margin.
LAUNCH_DEADLINE_S = 900


DRILL = "sdc_agent.drills.job:train_drill"
SCEN = "tests.agent.scenarios_pp"
SCHEDULE = {"audit_every": 5, "check_every": 0, "ckpt_every": 0, "peer_offset": 1}
CLEAN_STEPS = 50
STAGE0, STAGE1 = 2, 3
"""The faulty ranks: replica 1's stage 0 and stage 1 (node 1)."""


def drill(
    faults: list[dict[str, Any]],
    steps: int = 12,
    *,
    data: str = "hsdp",
    pipeline: str = "gpipe",
    **schedule: Any,
) -> tuple[str, dict[str, Any]]:

    return DRILL, {
        "steps": steps,
        "schedule": {**SCHEDULE, **schedule},
        "faults": faults,
        "parallel": "pp",
        "shards": 1,
        "pipeline_data": data,
        "pipeline_schedule": pipeline,
    }


def forward_scale(**kw: Any) -> dict[str, Any]:
    """x1000 on one output element of stage 0's blocks.0.norm on rank 2, from step 7 on."""
    return {"kind": "ScaleOutputElement", "layer": "blocks.0.norm", "rank": STAGE0, "step": 7, **kw}


def sent_gradient(**kw: Any) -> dict[str, Any]:
    """Backward only, on rank 3 (stage 1): x1000 on one element of the gradient of blocks.1's
    input, which is what stage 1 sends back to stage 0."""
    return {"kind": "ScaleInputGradElement", "layer": "blocks.1", "rank": STAGE1, "step": 7, **kw}


JOBS: dict[str, tuple[str, dict[str, Any]]] = {
    "forward_persistent": drill([forward_scale()]),
    "sent_gradient_1f1b": drill([sent_gradient()], pipeline="1f1b"),
    "one_audit_step": drill([forward_scale(step=10, persistent=False)]),
    "nan_forward_fsdp": drill(
        [
            {
                "kind": "NaNOutputElement",
                "layer": "blocks.0.norm",
                "rank": STAGE0,
                "step": 7,
                "persistent": False,
            }
        ],
        data="fsdp",
    ),
    "nan_sent_gradient": drill([sent_gradient(factor=math.nan, persistent=False)]),
    "weight_flip_ckpt": drill(
        [
            {
                "kind": "FlipWeightBit",
                "param": "blocks.0.fc.weight",
                "index": 3,
                "bit": 12,
                "rank": STAGE0,
                "step": 6,
            }
        ],
        steps=14,
        audit_every=10,
        ckpt_every=5,
    ),
    "accum2_clipped_persistent": drill([forward_scale()], grad_accum=2, max_grad_norm=5.0),
    "bit_identical": (f"{SCEN}:replays_leave_training_unchanged", {"steps": 4, "data": "hsdp"}),
    "clean": (
        f"{SCEN}:long_clean_run",
        {
            "steps": CLEAN_STEPS,
            "schedule": {"audit_every": 1, "check_every": 1, "ckpt_every": 25, "peer_offset": 1},
        },
    ),
}


TP_FAULTY, TP_PARTNER = 5, 4
"""TP x PP x HSDP: the faulty rank (node 1, stage 0, tp 1) and its stage's TP partner."""
TP_CLEAN_STEPS = 20
TP_SCHEDULE = {**SCHEDULE, "peer_offset": 2}
"""Each TP group replays the next node's (peer_offset counts pipelines: 2 per replica)."""

TP_JOBS: dict[str, tuple[str, dict[str, Any]]] = {
    "3d_forward_persistent": (
        DRILL,
        {
            "steps": 12,
            "schedule": TP_SCHEDULE,
            "faults": [
                {"kind": "ScaleOutputElement", "layer": "blocks.0.up", "rank": TP_FAULTY, "step": 7}
            ],
            "parallel": "3d",
            "shards": 2,
        },
    ),
    "3d_clean_bf16": (
        f"{SCEN}:long_clean_run",
        {
            "steps": TP_CLEAN_STEPS,
            "schedule": {"audit_every": 1, "check_every": 1, "ckpt_every": 0, "peer_offset": 2},
            "tp": 2,
        },
    ),
}


@pytest.fixture(scope="module")
def results() -> dict[str, list[dict[str, Any]]]:
    names = list(JOBS)
    per_job = launch(
        [JOBS[n] for n in names], world=6, ranks_per_node=2, timeout_s=LAUNCH_DEADLINE_S
    )
    return dict(zip(names, per_job, strict=True))


@pytest.fixture(scope="module")
def results_3d() -> dict[str, list[dict[str, Any]]]:
    names = list(TP_JOBS)
    per_job = launch(
        [TP_JOBS[n] for n in names], world=12, ranks_per_node=4, timeout_s=LAUNCH_DEADLINE_S
    )
    return dict(zip(names, per_job, strict=True))


def updates(results: dict, name: str) -> list[list[int]]:
    return [r["updates"] for r in ok(results, name)]


def test_a_persistent_forward_fault_on_one_stage_names_that_rank_only(results):
    # Given x1000 on one output element of rank 2's stage-0 block from step 7: rank 3 (stage 1
    # of the same replica) computes on the corrupted activations it receives
    alarm = the_alarm(results, "forward_persistent")
    # Then the audit at step 10 finds rank 2's stage diverging from the same inputs, as target
    # (replayed by rank 0) and as replayer (of rank 4's step): rank 2 is named, rank 3 is not
    assert (alarm["step"], alarm["check"]) == (10, "compute")
    assert alarm["mismatched_pairs"] == [[2, 0], [4, 2]]
    assert alarm["culprits"] == [STAGE0] and alarm["suspects"] == [STAGE0]
    assert alarm["suspect_window"] == [5, 10] and alarm["last_audit_pass"] == 5
    # And no rank of any stage applied step 10 (each rank's record of its optimizer steps)
    assert all(u == list(range(10)) for u in updates(results, "forward_persistent"))


def test_a_fault_only_in_the_gradient_a_stage_sends_back_names_that_stage(results):
    # Given Schedule1F1B and, on rank 3 (the last stage), x1000 on one element of the gradient
    # it sends back to stage 0 from step 7 (its forward, loss and own gradients are exact)
    alarm = the_alarm(results, "sent_gradient_1f1b")
    # Then rank 3's backward diverged from the same inputs: named; rank 2, which received the
    # corrupted gradient and computed exactly with it, is not
    assert (alarm["step"], alarm["check"]) == (10, "compute")
    assert alarm["mismatched_pairs"] == [[3, 1], [5, 3]]
    assert alarm["culprits"] == [STAGE1] and alarm["suspects"] == [STAGE1]
    assert all(u == list(range(10)) for u in updates(results, "sent_gradient_1f1b"))


def test_a_dispute_is_settled_by_a_third_replica_replaying_the_pipeline(results):
    # Given x1000 on rank 2's stage-0 forward at audit step 10 only (its replay of another
    # replica's step is clean)
    alarm = the_alarm(results, "one_audit_step")
    # Then one stage-0 pair diverges; the confirmation round (every replica replays replica 1's
    # step; replica 2's stage 0, rank 4, and rank 2 itself keep theirs) says rank 2 was wrong once
    assert alarm["mismatched_pairs"] == [[2, 0]] and alarm["culprits"] == []
    assert alarm["verdicts"] == [{"pair": [2, 0], "third": 4, "suspect": 2, "kind": "transient"}]
    assert (alarm["step"], alarm["suspects"]) == (10, [STAGE0])
    assert all(u == list(range(10)) for u in updates(results, "one_audit_step"))


def test_a_nan_is_named_on_the_stage_where_it_started_under_full_sharding(results):
    # Given each stage fully sharded over the replicas and a NaN in one element of rank 2's
    # stage-0 forward at step 7 only (not an audit step): rank 3 then receives it, its loss
    # and gradients are NaN, and the NaN flows back to rank 2's gradients too
    alarm = the_alarm(results, "nan_forward_fsdp")
    # Then check 1 names rank 2 alone (finite inputs, non-finite outputs), not rank 3
    assert (alarm["step"], alarm["check"], alarm["nonfinite"]) == (7, "compute", [STAGE0])
    # And the third replica, replaying replica 1's pipeline step, finds it finite: transient
    assert alarm["verdicts"] == [{"pair": [2, 2], "third": 4, "suspect": 2, "kind": "transient"}]
    assert alarm["suspects"] == [STAGE0]
    assert all(u == list(range(7)) for u in updates(results, "nan_forward_fsdp"))


def test_a_nan_in_a_gradient_sent_back_is_named_on_the_stage_that_sent_it(results):
    # Given a NaN in the gradient rank 3 (stage 1) sends back, at step 7 only: rank 3's own
    # gradients stay finite, rank 2's (stage 0) become NaN
    alarm = the_alarm(results, "nan_sent_gradient")
    # Then the rank named is the one whose backward produced the NaN from finite inputs
    assert (alarm["step"], alarm["check"], alarm["nonfinite"]) == (7, "compute", [STAGE1])
    assert alarm["verdicts"] == [{"pair": [3, 3], "third": 5, "suspect": 3, "kind": "transient"}]
    assert all(u == list(range(7)) for u in updates(results, "nan_sent_gradient"))


def test_a_weight_bit_flip_is_named_by_its_stage_copies_and_blocks_the_checkpoint(results):
    # Given one bit flipped in rank 2's copy of blocks.0.fc.weight (stage 0) after step 6's
    # update; its copies are ranks 0 and 4; checkpoints after steps 4, 9, 14, each checked
    per_rank = ok(results, "weight_flip_ckpt")
    alarm = the_alarm(results, "weight_flip_ckpt")
    # Then the check before the step-9 checkpoint names rank 2 by a strict majority of 3 copies
    assert (alarm["step"], alarm["check"], alarm["suspects"]) == (9, "weights", [STAGE0])
    assert alarm["divergent_tensors"] == ["blocks.0.fc.weight"]
    # And only the step-4 checkpoint was saved, tagged with one digest every rank agrees on
    assert all([s for s, _ in r["saves"]] == [4] for r in per_rank)
    tags = [r["saves"][0][1] for r in per_rank]
    assert all(t["weights_verified"] for t in tags)
    assert len({t["weights_digest"] for t in tags}) == 1


def test_accumulated_pipeline_steps_with_clipping_name_a_persistent_fault(results):
    # Given 2 pipeline steps per optimizer step (each reduced), clipping by the norm over both
    # stages, and the persistent stage-0 fault from step 7
    alarm = the_alarm(results, "accum2_clipped_persistent")
    # Then the audits at 0 and 5 passed, and the one at step 10 names rank 2 alone
    assert (alarm["step"], alarm["check"], alarm["suspects"]) == (10, "compute", [STAGE0])
    assert alarm["mismatched_pairs"] == [[2, 0], [4, 2]] and alarm["last_audit_pass"] == 5
    assert all(u == list(range(10)) for u in updates(results, "accum2_clipped_persistent"))


def test_pipeline_replays_pass_and_leave_training_bit_identical(results):
    # Given the same 4 steps trained with an audit every step (every replica replaying another's
    # pipeline step) and without
    for r in ok(results, "bit_identical"):
        # Then every audit passed and every rank's shards end bit-identical in both runs
        assert r["last_audit_pass"] == 3
        assert r["audited"] == r["unaudited"]


def test_a_fault_free_pipeline_run_raises_no_alarm_and_checks_every_step(results):
    # Given 50 steps of PP x HSDP, bf16 autocast, activation checkpointing, every step audited
    # and weight-checked, checkpoints after steps 24 and 49
    per_rank = ok(results, "clean")
    assert all(r["alarm"] is None and r["alarms_published"] == 0 for r in per_rank)
    (rank0,) = [r for r in per_rank if r["rank"] == 0]
    # Then every audit and every weight check passed (the start-up check counts as one)
    assert rank0["audit_passes"] == CLEAN_STEPS
    assert rank0["weight_check_passes"] == CLEAN_STEPS + 1
    # And both checkpoints carry the same verified digest on every rank
    for i in range(2):
        tags = [r["saves"][i] for r in per_rank]
        assert all(t["weights_verified"] for t in tags)
        assert len({t["weights_digest"] for t in tags}) == 1
    # And guard.coverage() says, the same on every rank, what is compared under the pipeline
    cov = rank0["coverage"]
    assert all(r["coverage"] == cov for r in per_rank)
    assert cov["parallelism"] == "pp+hsdp"
    assert cov["pipeline"] == {
        "stages": 2,
        "schedule": "ScheduleGPipe",
        "micro_batches": 2,
        "replicas": 3,
        "stage_ranks": [[0, 2, 4], [1, 3, 5]],
    }
    assert cov["sharding"]["replicas_of_shard"] == [[0, 2, 4], [1, 3, 5]]
    # (each stage's weights are one shard, held by 3 replicas: stages are not shards)
    assert (cov["sharding"]["stages"], cov["sharding"]["shards"]) == (2, 1)
    audit = cov["checks"]["replay_audit"]
    assert audit["pairs"][:3] == [
        {"replayer": 0, "target": 2, "third": 4},
        {"replayer": 2, "target": 4, "third": 0},
        {"replayer": 4, "target": 0, "third": 2},
    ]
    assert "same stage" in audit["why"] and "gradients received and sent back" in audit["compares"]
    assert "where it started" in cov["checks"]["nonfinite_gradients"]["why"]
    assert any("in transit" in line for line in cov["not_covered"])
    assert not cov["checks"]["online_sensors"]["on"]


def test_a_forward_fault_in_one_tp_slice_of_a_stage_names_that_gpu_not_its_tp_group(results_3d):
    # Given TP x PP x HSDP and x1000 on one element of rank 5's column-parallel blocks.0.up
    # output (stage 0) from step 7: the TP all-reduce of blocks.0.down carries it to rank 4
    # before the stage sends it, so both ranks of the stage's TP group diverge locally
    alarm = the_alarm(results_3d, "3d_forward_persistent")
    # Then the audit at step 10 keeps the pairs whose ordered local results diverged first:
    # rank 5's, as target (replayed by rank 1) and as replayer (of rank 9's step)
    assert (alarm["step"], alarm["check"]) == (10, "compute")
    assert alarm["mismatched_pairs"] == [[5, 1], [9, 5]]
    # And rank 5 alone is named, not its TP partner
    assert alarm["culprits"] == [TP_FAULTY] and alarm["suspects"] == [TP_FAULTY]
    assert TP_PARTNER not in alarm["suspects"] and "diverged only later" in alarm["diagnosis"]
    assert alarm["suspect_window"] == [5, 10] and alarm["last_audit_pass"] == 5
    # And no rank of any stage applied step 10
    assert all(u == list(range(10)) for u in updates(results_3d, "3d_forward_persistent"))


def test_a_fault_free_tp_pipeline_run_in_bf16_raises_no_alarm(results_3d):
    # Given 20 steps of TP x PP x HSDP, bf16 autocast, activation checkpointing, every step
    # audited (the ordered local results compared inside each stage) and weight-checked
    per_rank = ok(results_3d, "3d_clean_bf16")
    # Then no rank raised or published an alarm, and every rank applied every step
    assert all(r["alarm"] is None and r["alarms_published"] == 0 for r in per_rank)
    assert all(r["updates"] == list(range(TP_CLEAN_STEPS)) for r in per_rank)
    (rank0,) = [r for r in per_rank if r["rank"] == 0]
    assert rank0["audit_passes"] == TP_CLEAN_STEPS
    assert rank0["weight_check_passes"] == TP_CLEAN_STEPS + 1
    # And every rank reports the same coverage, with every stage's TP groups (the job's)
    cov = rank0["coverage"]
    assert all(r["coverage"] == cov for r in per_rank)
    assert cov["parallelism"] == "pp+hsdp+tp"
    assert cov["pipeline"]["tp_groups"] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11]]
    assert "diverged first name the GPU" in cov["checks"]["replay_audit"]["compares"]

"""The three checks on a model sharded with FSDP2: full sharding and HSDP, 3 nodes x 2 ranks.

One launch of 6 gloo processes on the CPU runs every scenario (process start-up dominates).
Full sharding shards over all 6 ranks; HSDP is (3 replicas, one per node) x (2 shards within a
node). Rank R=3 (node 1) is replayed by rank 1 (node 0); disputes are settled by rank 5 (node 2).
"""

from __future__ import annotations

from typing import Any

import pytest

from sdc_agent.drills.launch import launch
from tests.agent.outcomes import ok, the_alarm
from tests.agent.scenarios import R

# How long this file's processes may run before the launcher kills them; the suite's conftest
# marks the file slow and gives pytest-timeout this plus a margin.
LAUNCH_DEADLINE_S = 900

DRILL = "sdc_agent.drills.job:train_drill"
SCEN = "tests.agent.scenarios_fsdp"
SCHEDULE = {"audit_every": 5, "check_every": 0, "ckpt_every": 0, "peer_offset": 2}
LAYOUTS = ("fsdp", "hsdp")
CLEAN_STEPS = 50


def drill(parallel: str, faults: list[dict[str, Any]], steps: int = 12, **schedule: Any) -> tuple:
    return DRILL, {
        "steps": steps,
        "schedule": {**SCHEDULE, **schedule},
        "faults": faults,
        "parallel": parallel,
    }


def out_scale(**kw: Any) -> dict[str, Any]:
    """x1000 on one output element of blocks.1.norm, from step 7 on (before a dropout, which
    could drop the corrupted element on some seeds)."""
    return {"kind": "ScaleOutputElement", "layer": "blocks.1.norm", "rank": R, "step": 7, **kw}


FAULTS: dict[str, list[dict[str, Any]]] = {
    "persistent": [out_scale()],
    "replayer": [out_scale(rank=1)],
    "weight_grad": [
        {
            "kind": "ScaleWeightGradElement",
            "param": "blocks.1.fc.weight",
            "index": 5,
            "rank": R,
            "step": 7,
        }
    ],
    "nan_one_step": [
        {
            "kind": "NaNOutputElement",
            "layer": "blocks.1.norm",
            "rank": R,
            "step": 7,
            "persistent": False,
        }
    ],
}


def fp16(parallel: str, steps: int, schedule: dict[str, Any], **options: Any) -> tuple:
    """fp16 autocast with a GradScaler starting at 2**30: the first ~13 steps overflow."""
    return f"{SCEN}:fp16_run", {
        "parallel": parallel,
        "steps": steps,
        "schedule": {"check_every": 0, "peer_offset": 2, **schedule},
        "init_scale": 2.0**30,
        **options,
    }


WEIGHT_FLIP = {
    "kind": "FlipWeightBit",
    "param": "blocks.0.fc.weight",
    "index": 3,
    "bit": 12,
    "rank": 0,
    "step": 6,
}
"""An fp32 bit flip in rank 0's shard of blocks.0.fc.weight after step 6's update."""

CLEAN = {"audit_every": 1, "check_every": 1, "ckpt_every": 25, "peer_offset": 2}

JOBS: dict[str, tuple[str, dict]] = {
    **{
        f"{layout}_{name}": drill(layout, faults)
        for layout in LAYOUTS
        for name, faults in FAULTS.items()
    },
    "hsdp_weight_flip_ckpt": drill("hsdp", [WEIGHT_FLIP], steps=14, audit_every=10, ckpt_every=5),
    "hsdp_two_replicas_flip": (
        DRILL,
        {
            "steps": 8,
            "schedule": {**SCHEDULE, "audit_every": 0, "check_every": 5},
            "faults": [{**WEIGHT_FLIP, "step": 2}],
            "parallel": "hsdp",
            "shards": 3,
        },
    ),
    "fsdp_one_audit_step": drill("fsdp", [out_scale(step=10, persistent=False)]),
    **{
        f"{layout}_accum4_persistent": drill(layout, [out_scale()], grad_accum=4)
        for layout in LAYOUTS
    },
    "fsdp_fp16_overflows": fp16("fsdp", 24, {"audit_every": 5}),
    "hsdp_fp16_one_replica_reduced_nan": fp16(
        "hsdp",
        20,
        {"audit_every": 5},
        faults=[
            {"kind": "NaNReducedGradient", "index": 3, "rank": 4, "step": 18, "persistent": False}
        ],
    ),
    "hsdp_fp16_transient_nan": fp16(
        "hsdp",
        26,
        {"audit_every": 5, "grad_accum": 2, "max_grad_norm": 5.0},
        own_loop=True,
        faults=[
            {
                "kind": "NaNOutputElement",
                "layer": "blocks.1.norm",
                "rank": R,
                "step": 23,
                "persistent": False,
            }
        ],
    ),
    **{
        f"{layout}_reduced_nan": drill(
            layout,
            [{"kind": "NaNReducedGradient", "index": 3, "rank": 4, "step": 7, "persistent": False}],
        )
        for layout in LAYOUTS
    },
    "fsdp_clipped": drill("fsdp", [], steps=8, max_grad_norm=0.05),
    **{
        f"{layout}_clean": (
            f"{SCEN}:long_clean_run",
            {"parallel": layout, "steps": CLEAN_STEPS, "schedule": CLEAN},
        )
        for layout in LAYOUTS
    },
    "fsdp_bit_identical": (
        f"{SCEN}:replays_leave_training_unchanged",
        {"parallel": "fsdp", "steps": 4},
    ),
    "hsdp_bit_identical": (
        f"{SCEN}:replays_leave_training_unchanged",
        {"parallel": "hsdp", "steps": 4},
    ),
    "hsdp_mixed_precision_bit_identical": (
        f"{SCEN}:replays_leave_training_unchanged",
        {"parallel": "hsdp", "steps": 4, "mixed_precision": True},
    ),
    "unsupported_mesh": (f"{SCEN}:unsupported_mesh", {}),
}


@pytest.fixture(scope="module")
def results() -> dict[str, list[dict[str, Any]]]:
    names = list(JOBS)
    per_job = launch(
        [JOBS[n] for n in names], world=6, ranks_per_node=2, timeout_s=LAUNCH_DEADLINE_S
    )
    return dict(zip(names, per_job, strict=True))


def updates(results: dict, name: str) -> list[list[int]]:
    return [r["updates"] for r in ok(results, name)]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_persistent_forward_fault_is_named_at_the_next_audit(results, layout):
    # Given x1000 on one output element of R's blocks.1.norm every step from 7; audits at 0, 5, 10
    alarm = the_alarm(results, f"{layout}_persistent")
    # Then the collective replays at step 10 find R wrong as target and as replayer
    assert (alarm["step"], alarm["check"]) == (10, "compute")
    assert alarm["mismatched_pairs"] == [[R, 1], [5, R]]
    assert alarm["culprits"] == [R] and alarm["suspects"] == [R]
    assert alarm["suspect_window"] == [5, 10] and alarm["last_audit_pass"] == 5
    # and step 10 was applied by nobody
    assert all(u == list(range(10)) for u in updates(results, f"{layout}_persistent"))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_fault_on_the_replaying_rank_names_the_replayer(results, layout):
    # Given the persistent fault on rank 1, which replays R's micro-batch
    alarm = the_alarm(results, f"{layout}_replayer")
    # Then rank 1 is the culprit; R, whose result it disputed, is not named
    assert alarm["mismatched_pairs"] == [[1, 5], [R, 1]]
    assert (alarm["step"], alarm["culprits"], alarm["suspects"]) == (10, [1], [1])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_weight_gradient_only_fault_is_named_from_local_gradient_fingerprints(results, layout):
    # Given x1000 on one element of R's local gradient of blocks.1.fc.weight (the forward and
    # the loss are exact)
    alarm = the_alarm(results, f"{layout}_weight_grad")
    # Then the pre-reduction gradient fingerprints differ from R's replayer's: R is named
    assert (alarm["step"], alarm["check"], alarm["suspects"]) == (10, "compute", [R])
    assert alarm["mismatched_pairs"] == [[R, 1], [5, R]]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_nan_on_a_non_audit_step_is_named_transient_and_not_applied(results, layout):
    # Given a NaN in one element of R's forward at step 7 only (not an audit step)
    alarm = the_alarm(results, f"{layout}_nan_one_step")
    # Then check 1 names R from its own pre-reduction gradient, at step 7
    assert (alarm["step"], alarm["check"], alarm["nonfinite"]) == (7, "compute", [R])
    assert alarm["suspects"] == [R] and alarm["suspect_window"] == [6, 7]
    # And the collective confirmation (rank 5 and R replay R's batch) says transient
    assert alarm["verdicts"] == [{"pair": [R, R], "third": 5, "suspect": R, "kind": "transient"}]
    # And no rank applied step 7
    assert all(u == list(range(7)) for u in updates(results, f"{layout}_nan_one_step"))


def test_hsdp_weight_bit_flip_on_one_replica_names_it_and_blocks_the_checkpoint(results):
    # Given one bit flipped in rank 0's shard of blocks.0.fc.weight after step 6's update;
    # its replicas are ranks 2 and 4; checkpoints after steps 4, 9, 14, each weight-checked
    per_rank = results["hsdp_weight_flip_ckpt"]
    alarm = the_alarm(results, "hsdp_weight_flip_ckpt")
    # Then the check before the step-9 checkpoint names rank 0 by strict majority of 3 replicas
    assert (alarm["step"], alarm["check"], alarm["suspects"]) == (9, "weights", [0])
    assert alarm["divergent_tensors"] == ["blocks.0.fc.weight"]
    assert alarm["suspect_window"] == [4, 9]
    # And only the step-4 checkpoint was saved, tagged with one digest every rank agrees on
    assert all([s for s, _ in r["saves"]] == [4] for r in per_rank)
    tags = [r["saves"][0][1] for r in per_rank]
    assert all(t["weights_verified"] and t["last_weight_check_pass"] == 4 for t in tags)
    assert len({t["weights_digest"] for t in tags}) == 1 and len(tags[0]["weights_digest"]) == 64


def test_fault_free_hsdp_run_raises_no_alarm_and_checks_every_step(results):
    # Given 50 HSDP steps, bf16 autocast, activation checkpointing, every step audited and
    # weight-checked, checkpoints after steps 24 and 49
    per_rank = ok(results, "hsdp_clean")
    assert all(r["alarm"] is None and r["alarms_published"] == 0 for r in per_rank)
    (rank0,) = [r for r in per_rank if r["rank"] == 0]
    # Then every audit and every weight check passed (the start-up check counts as one)
    assert rank0["audit_passes"] == CLEAN_STEPS
    assert rank0["weight_check_passes"] == CLEAN_STEPS + 1
    facts = rank0["coverage_facts"]
    assert (facts["parallel"], facts["replicas"], facts["shards"]) == ("hsdp", 3, 2)
    assert facts["replicas_of_shard"] == [[0, 2, 4], [1, 3, 5]]
    assert facts["weights_named_by_majority"] is True
    # And guard.coverage() says so, the same on every rank: each shard compared across its 3
    # replicas, a differing copy named by majority, replays collective
    cov = rank0["coverage"]
    assert all(r["coverage"] == cov for r in per_rank)
    assert cov["parallelism"] == "hsdp"
    assert cov["sharding"] == {
        "replicas": 3,
        "shards": 2,
        "replicas_of_shard": [[0, 2, 4], [1, 3, 5]],
        "weight_redundancy": True,
    }
    weights = cov["checks"]["weight_fingerprints"]
    assert weights["on"] and weights["replicas_of_shard"] == [[0, 2, 4], [1, 3, 5]]
    assert weights["replicas"] == list(range(6)) and "strict majority" in weights["attribution"]
    assert "collectively" in cov["checks"]["replay_audit"]["why"]
    assert not any("full sharding" in line for line in cov["not_covered"])
    # And both checkpoints carry the same verified digest on every rank
    for i in range(2):
        tags = [r["saves"][i] for r in per_rank]
        assert all(t["weights_verified"] for t in tags)
        assert len({t["weights_digest"] for t in tags}) == 1


def test_fault_free_full_sharding_run_raises_no_alarm_and_says_weights_are_unchecked(results):
    # Given the same run fully sharded: each weight shard has one copy
    per_rank = ok(results, "fsdp_clean")
    assert all(r["alarm"] is None and r["alarms_published"] == 0 for r in per_rank)
    (rank0,) = [r for r in per_rank if r["rank"] == 0]
    # Then every audit passed, check 3 compared nothing, and no checkpoint claims verified weights
    assert rank0["audit_passes"] == CLEAN_STEPS
    assert rank0["weight_check_passes"] == 0 and rank0["weight_redundancy"] is False
    facts = rank0["coverage_facts"]
    assert (facts["parallel"], facts["replicas"], facts["shards"]) == ("fsdp", 1, 6)
    assert facts["weights_compared"] is False and "one copy" in facts["weights_why"]
    # And guard.coverage() says the weights are not compared, why, and that this is not covered
    cov = rank0["coverage"]
    assert (cov["parallelism"], cov["sharding"]["replicas"], cov["sharding"]["shards"]) == (
        "fsdp",
        1,
        6,
    )
    assert cov["sharding"]["weight_redundancy"] is False
    weights = cov["checks"]["weight_fingerprints"]
    assert not weights["on"] and "one copy" in weights["why"]
    assert weights["replicas"] == [] and weights["attribution"] is None
    assert any("full sharding" in line for line in cov["not_covered"])
    # while the audits still run every step, replayed by another node
    audit = cov["checks"]["replay_audit"]
    assert audit["on"] and audit["pairs"][R] == {"replayer": R, "target": 5, "third": 1}
    assert len(rank0["saves"]) == 2
    assert all(not t["weights_verified"] and t["weights_digest"] is None for t in rank0["saves"])


@pytest.mark.parametrize(
    "name", ["fsdp_bit_identical", "hsdp_bit_identical", "hsdp_mixed_precision_bit_identical"]
)
def test_replays_pass_and_leave_training_bit_identical(results, name):
    # Given the same 4 steps trained with an audit (collective replays) every step and without
    # (also with FSDP2's bf16 / float32-reduction policy, whose sync-off backward leaves a
    # float32 accumulation buffer behind), every audit passing
    per_rank = ok(results, name)
    # Then every rank's shards end bit-identical in both runs
    assert all(r["audited"] == r["unaudited"] for r in per_rank)


def test_an_unsupported_mesh_is_refused_with_a_clear_error(results):
    # Given a 2-D mesh named ("dp", "tp") instead of ("replicate", "shard")
    for r in ok(results, "unsupported_mesh"):
        # Then every rank refuses it, naming the mesh and what is supported
        assert r["error_type"] == "ShardingLayoutError"
        assert "('dp', 'tp')" in r["message"] and "('replicate', 'shard')" in r["message"]


def test_a_dispute_is_settled_on_a_third_node_by_a_collective_confirmation(results):
    # Given x1000 on R's forward at audit step 10 only (R's replay of another batch is clean)
    alarm = the_alarm(results, "fsdp_one_audit_step")
    # Then one pair mismatches, and the confirmation round (every rank replays R's batch; rank
    # 5 on node 2 and R keep their results) says R was wrong once: transient
    assert alarm["mismatched_pairs"] == [[R, 1]] and alarm["culprits"] == []
    assert alarm["verdicts"] == [{"pair": [R, 1], "third": 5, "suspect": R, "kind": "transient"}]
    assert (alarm["step"], alarm["suspects"]) == (10, [R])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_nan_in_one_ranks_reduced_shard_is_never_applied_there_and_reported(results, layout):
    # Given finite local gradients everywhere and a NaN written into rank 4's shard of the
    # reduced gradient at step 7 (not an audit step)
    alarm = the_alarm(results, f"{layout}_reduced_nan")
    # Then every rank reports the reduced-gradient alarm for step 7, naming nobody
    assert (alarm["step"], alarm["check"], alarm["suspects"]) == (7, "reduced_gradient", None)
    # and rank 4 never applied its NaN shard; nobody applied anything after step 7
    by_rank = {r["rank"]: r["updates"] for r in ok(results, f"{layout}_reduced_nan")}
    assert by_rank.pop(4) == list(range(7))
    assert all(u == list(range(8)) for u in by_rank.values()), by_rank


def test_hsdp_with_two_replicas_reports_a_divergence_without_naming_anyone(results):
    # Given HSDP as 2 replicas x 3 shards and one bit flipped in rank 0's shard (its only
    # replica is rank 3) after step 2's update
    alarm = the_alarm(results, "hsdp_two_replicas_flip")
    # Then the weight check after step 4 reports the tensor, and names nobody: no majority
    assert (alarm["step"], alarm["check"]) == (4, "weights")
    assert alarm["divergent_tensors"] == ["blocks.0.fc.weight"]
    assert alarm["suspects"] is None and alarm["ranks"] == {}


def test_clipping_the_sharded_gradient_trains_without_alarm(results):
    # Given Schedule.max_grad_norm: the reduced, sharded gradient is clipped by its global norm
    per_rank = ok(results, "fsdp_clipped")
    # Then nothing fires and every step is applied, audits at 0 and 5 passing
    assert all(r["alarm"] is None and r["updates"] == list(range(8)) for r in per_rank)
    assert all(r["last_audit_pass"] == 5 for r in per_rank)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_fsdp2_with_gradient_accumulation_names_a_persistent_fault_at_the_next_audit(
    results, layout
):

    # Given FSDP2 (full sharding or HSDP), 4 micro-batches per step (sync only on the last), and
    # x1000 on one output element of R's blocks.1.norm on every micro-batch from step 7
    alarm = the_alarm(results, f"{layout}_accum4_persistent")
    # Then the audits at 0 and 5 passed (positions 0 and 1, isolated on the unsharded
    # parameters), and the one at step 10 (position 2) names R as target and as replayer
    assert (alarm["step"], alarm["check"]) == (10, "compute")
    assert alarm["mismatched_pairs"] == [[R, 1], [5, R]]
    assert alarm["culprits"] == [R] and alarm["suspects"] == [R]
    assert alarm["suspect_window"] == [5, 10] and alarm["last_audit_pass"] == 5
    # and nobody applied step 10
    assert all(u == list(range(10)) for u in updates(results, f"{layout}_accum4_persistent"))


def test_fp16_overflows_under_full_sharding_are_skipped_everywhere_without_an_alarm(results):
    # Given FSDP2 full sharding, fp16 autocast and a GradScaler starting at 2**30: the first
    # steps overflow, each rank holding only its shard of the reduced gradient
    per_rank = ok(results, "fsdp_fp16_overflows")
    # Then no alarm is returned or published, and no SDC metric is written
    assert all(r["alarm"] is None for r in per_rank)
    (rank0,) = [r for r in per_rank if r["dp_rank"] == 0]
    assert rank0["alarms_published"] == 0 and rank0["cluster_series"] == 0
    assert rank0["per_node_series"] == 0
    # And every rank skipped the same overflowing steps and lowered the scale alike
    scales = {r["scale"] for r in per_rank}
    assert len(scales) == 1 and scales.pop() <= 2.0**30 / 2**10
    updates = per_rank[0]["updates"]
    assert 0 not in updates and updates[-1] == 23 and len(updates) >= 3
    assert all(r["updates"] == updates for r in per_rank)
    # and training went on with one model: every rank's gathered weights are the same bits
    assert len({r["weights"] for r in per_rank}) == 1
    # and the audits after the scale settled passed
    assert rank0["audit_passes"] >= 1
    # And coverage() says how the sharded skip is agreed
    assert "found_inf" in rank0["precision"]["sharded_skip"]


def test_fp16_transient_nan_under_hsdp_after_the_scale_settled_is_named(results):
    # Given HSDP, fp16 with a GradScaler (2 micro-batches per step, clipping after unscale_,
    # the owner loop) and a NaN in rank R's forward at step 23 only, after the early overflows
    # lowered the scale
    alarm = the_alarm(results, "hsdp_fp16_transient_nan")
    # Then the collective replay on the third GPU at the same scale is finite: SDC, transient,
    # R named
    assert (alarm["step"], alarm["check"], alarm["nonfinite"]) == (23, "compute", [R])
    assert alarm["suspects"] == [R] and alarm["diagnosis"] is None
    assert alarm["verdicts"] == [{"pair": [R, R], "third": 5, "suspect": R, "kind": "transient"}]
    per_rank = ok(results, "hsdp_fp16_transient_nan")
    (rank0,) = [r for r in per_rank if r["dp_rank"] == 0]
    assert rank0["per_node_series"] == 1
    # And the overflows before it were skipped alike on every rank, step 23 by nobody
    updates = per_rank[0]["updates"]
    assert 0 not in updates and updates[-1] == 22
    assert all(r["updates"] == updates for r in per_rank)
    assert len({r["scale"] for r in per_rank}) == 1


def test_fp16_nan_in_one_hsdp_replicas_reduced_shard_is_dropped_by_every_rank_at_once(results):
    # Given HSDP with a GradScaler, finite local gradients everywhere and, at step 18 (after
    # the scale settled; not an audit step), a NaN written into rank 4's copy of a reduced
    # shard only: the scaler's found_inf would say "skip" on rank 4's replica and "apply" on
    # the other two, which hold a finite copy of that shard
    alarm = the_alarm(results, "hsdp_fp16_one_replica_reduced_nan")
    # Then every rank waited for step 18's flags and reports it at that step, naming nobody
    assert (alarm["step"], alarm["check"], alarm["suspects"]) == (18, "reduced_gradient", None)
    # And no rank applied step 18: the replicas stayed one model
    per_rank = ok(results, "hsdp_fp16_one_replica_reduced_nan")
    updates = per_rank[0]["updates"]
    assert updates[-1] == 17 and all(r["updates"] == updates for r in per_rank)
    assert len({r["weights"] for r in per_rank}) == 1

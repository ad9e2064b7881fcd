"""The checks on a tensor-parallel model composed with HSDP or FSDP2: 3 nodes x 2 ranks.

One launch of 6 gloo processes on the CPU runs every scenario (process start-up dominates). The
TP groups are (0, 1), (2, 3), (4, 5), one per node; ``tp`` is HSDP x TP on a
``("replicate", "shard", "tp")`` mesh of 3 replicas (one per node) x 1 shard x 2, ``fsdp+tp``
FSDP2 x TP on ``("dp", "tp")``. Rank R=3 (node 1, tp coordinate 1) is replayed by rank 1 (node
0) and replays rank 5 (node 2); its TP partner is rank 2. The drill model's blocks have a
column-parallel ``up`` and a row-parallel ``down`` (:mod:`sdc_agent.drills.tp`).
"""

from __future__ import annotations

from typing import Any

import pytest

from sdc_agent.drills.launch import launch
from tests.agent.outcomes import ok, the_alarm
from tests.agent.scenarios import R
from tests.agent.sensor_scenarios import x1_1_once

# How long this file's processes may run before the launcher kills them; the suite's conftest
# marks the file slow and gives pytest-timeout this plus a margin.
LAUNCH_DEADLINE_S = 900

DRILL = "sdc_agent.drills.job:train_drill"
SCEN = "tests.agent.scenarios_fsdp"
SENSED = "tests.agent.sensor_scenarios_fsdp:sensed_sharded_run"
SCHEDULE = {"audit_every": 5, "check_every": 0, "ckpt_every": 0, "peer_offset": 2}
CLEAN = {"audit_every": 1, "check_every": 1, "ckpt_every": 25, "peer_offset": 2}
CLEAN_STEPS = 50
PARTNER = 2
"""R's TP partner: it computes the same micro-batch, with the other slice of the weights."""


def drill(parallel: str, faults: list[dict[str, Any]], steps: int = 12, **options: Any) -> tuple:
    schedule = {**SCHEDULE, **options.pop("schedule", {})}
    return DRILL, {
        "steps": steps,
        "schedule": schedule,
        "faults": faults,
        "parallel": parallel,
        **options,
    }


def out_scale(layer: str, **kw: Any) -> dict[str, Any]:
    """x1000 on one element of ``layer``'s local output on R, from step 7 on."""
    return {"kind": "ScaleOutputElement", "layer": layer, "rank": R, "step": 7, **kw}


WEIGHT_FLIP = {
    "kind": "FlipWeightBit",
    "param": "blocks.0.up.weight",
    "index": 3,
    "bit": 12,
    "rank": R,
    "step": 6,
}
"""An fp32 bit flip in R's slice of blocks.0.up.weight after step 6's update."""

JOBS: dict[str, tuple[str, dict]] = {
    "tp_colwise": drill("tp", [out_scale("blocks.1.up")]),
    "fsdp+tp_colwise": drill("fsdp+tp", [out_scale("blocks.1.up")]),
    "tp_rowwise_partial": drill("tp", [out_scale("blocks.1.down")]),
    "tp_sequence_parallel_rowwise_partial": drill(
        "tp", [out_scale("blocks.1.down")], sequence_parallel=True
    ),
    "tp_weight_grad": drill(
        "tp",
        [
            {
                "kind": "ScaleWeightGradElement",
                "param": "blocks.1.up.weight",
                "index": 5,
                "rank": R,
                "step": 7,
            }
        ],
    ),
    "tp_replayer": drill("tp", [out_scale("blocks.1.up", rank=1)]),
    "tp_accum2_colwise": drill("tp", [out_scale("blocks.1.up")], schedule={"grad_accum": 2}),
    "tp_clipped": drill("tp", [], steps=8, schedule={"max_grad_norm": 0.05, "check_every": 5}),
    "tp_nan_one_step": drill(
        "tp",
        [
            {
                "kind": "NaNOutputElement",
                "layer": "blocks.1.up",
                "rank": R,
                "step": 7,
                "persistent": False,
            }
        ],
    ),
    "tp_weight_flip_ckpt": drill(
        "tp", [WEIGHT_FLIP], steps=14, schedule={"audit_every": 10, "ckpt_every": 5}
    ),
    "tp_clean": (
        f"{SCEN}:long_clean_run",
        {"parallel": "tp", "steps": CLEAN_STEPS, "schedule": CLEAN, "sequence_parallel": True},
    ),
    **{
        f"tp_sensor_{layer}_{gemm}": (
            SENSED,
            {
                "parallel": "tp",
                "steps": 12,
                "faults": [x1_1_once(f"blocks.1.{layer}", gemm, rank=R)],
            },
        )
        for layer, gemm in (("up", "forward"), ("down", "forward"), ("down", "dgrad"))
    },
    "tp_sensor_clean": (SENSED, {"parallel": "tp", "steps": 30}),
    "tp_protected_bit_identical": (
        "tests.agent.sensor_scenarios_fsdp:protected_tp_matches_unprotected",
        {"steps": 3, "sequence_parallel": True},
    ),
    "tp_bit_identical": (
        f"{SCEN}:replays_leave_training_unchanged",
        {"parallel": "tp", "steps": 4, "mixed_precision": True},
    ),
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


@pytest.mark.parametrize(
    "name", ["tp_colwise", "fsdp+tp_colwise", "tp_rowwise_partial", "tp_weight_grad"]
)
def test_a_fault_in_one_ranks_local_tensor_parallel_work_names_that_rank_not_its_group(
    results, name
):
    # Given x1000 on one element of R's column-parallel GEMM output (blocks.1.up), or of its
    # row-parallel partial output before the all-reduce (blocks.1.down), or of its local
    # gradient slice of blocks.1.up.weight, every step from 7; audits at 0, 5, 10
    alarm = the_alarm(results, name)
    # Then the collective replays at step 10 find R wrong as target and as replayer, at its
    # tp coordinate
    assert (alarm["step"], alarm["check"]) == (10, "compute")
    assert alarm["mismatched_pairs"] == [[R, 1], [5, R]]
    assert alarm["culprits"] == [R] and alarm["suspects"] == [R]
    assert alarm["suspect_window"] == [5, 10] and alarm["last_audit_pass"] == 5
    # and nobody applied step 10
    assert all(u == list(range(10)) for u in updates(results, name))


@pytest.mark.parametrize("name", ["tp_colwise", "tp_rowwise_partial"])
def test_the_tp_partner_that_received_the_wrong_result_through_the_all_reduce_is_not_named(
    results, name
):
    # Given the forward faults above: R's partner (rank 2) computes with R's wrong result
    # after the row-parallel all-reduce, so its own and its replay's results differ too
    alarm = the_alarm(results, name)
    # Then the alarm says its pairs diverged only after a collective, and names R alone
    assert PARTNER not in alarm["suspects"]
    assert "[(2, 0), (4, 2)] of the same groups diverged only later" in alarm["diagnosis"]


def test_a_weight_gradient_only_fault_leaves_the_partner_out_of_every_comparison(results):
    # Given x1000 on R's local gradient of blocks.1.up.weight only (forward and loss exact)
    alarm = the_alarm(results, "tp_weight_grad")
    # Then only R's comparisons differ: the partner's slices are right
    assert alarm["mismatched_pairs"] == [[R, 1], [5, R]] and alarm["diagnosis"] is None


def test_sequence_parallel_partial_output_fault_is_named(results):
    # Given torchtitan's sequence-parallel plan (the row-parallel output reduce-scattered along
    # the sequence) and x1000 on R's partial output of blocks.1.down before the reduce-scatter
    alarm = the_alarm(results, "tp_sequence_parallel_rowwise_partial")
    # Then R is named at the next audit, and step 10 applied by nobody
    assert (alarm["step"], alarm["suspects"], alarm["culprits"]) == (10, [R], [R])
    updates_ = updates(results, "tp_sequence_parallel_rowwise_partial")
    assert all(u == list(range(10)) for u in updates_)


def test_a_fault_on_the_replaying_rank_names_the_replayer(results):
    # Given the persistent column-parallel fault on rank 1, which replays R's micro-batch
    alarm = the_alarm(results, "tp_replayer")
    # Then rank 1 is the culprit; R, whose result it disputed, and rank 1's partner are not
    assert alarm["mismatched_pairs"] == [[1, 5], [R, 1]]
    assert (alarm["step"], alarm["culprits"], alarm["suspects"]) == (10, [1], [1])


def test_a_nan_that_crosses_the_tp_all_reduce_is_named_by_check_1_within_the_node(results):
    # Given a NaN in one element of R's column-parallel output at step 7 only (not an audit
    # step): the row-parallel all-reduce carries it to the partner's activations
    alarm = the_alarm(results, "tp_nan_one_step")
    # Then check 1 names the ranks whose local gradient was non-finite, both on R's node (never
    # another node), each confirmed transient by a third node's replay of their group's batch
    assert (alarm["step"], alarm["check"]) == (7, "compute")
    assert alarm["nonfinite"] == [PARTNER, R] and alarm["suspects"] == [PARTNER, R]
    assert {v["kind"] for v in alarm["verdicts"]} == {"transient"}
    nodes = {info["node_name"] for info in alarm["ranks"].values()}
    assert nodes == {"hyperpod-i-00000000000000001"}
    # And no rank applied step 7
    assert all(u == list(range(7)) for u in updates(results, "tp_nan_one_step"))


def test_a_weight_bit_flipped_in_one_ranks_slice_is_named_by_check_3_and_blocks_the_checkpoint(
    results,
):
    # Given one bit flipped in R's slice of blocks.0.up.weight after step 6's update; the
    # replicas of that (shard, tp) slice are ranks 1, 3 and 5; checkpoints after 4, 9, 14
    per_rank = results["tp_weight_flip_ckpt"]
    alarm = the_alarm(results, "tp_weight_flip_ckpt")
    # Then the check before the step-9 checkpoint names R by strict majority of 3 replicas
    assert (alarm["step"], alarm["check"], alarm["suspects"]) == (9, "weights", [R])
    assert alarm["divergent_tensors"] == ["blocks.0.up.weight"]
    assert alarm["suspect_window"] == [4, 9]
    # And only the step-4 checkpoint was saved, tagged with one digest every rank agrees on
    assert all([s for s, _ in r["saves"]] == [4] for r in per_rank)
    tags = [r["saves"][0][1] for r in per_rank]
    assert all(t["weights_verified"] and t["last_weight_check_pass"] == 4 for t in tags)
    assert len({t["weights_digest"] for t in tags}) == 1


def test_fault_free_tp_x_hsdp_run_raises_no_alarm_and_checks_every_step(results):
    # Given 50 steps of HSDP x TP with sequence parallelism, bf16 autocast, activation
    # checkpointing, every step audited and weight-checked, checkpoints after steps 24 and 49
    per_rank = ok(results, "tp_clean")
    assert all(r["alarm"] is None and r["alarms_published"] == 0 for r in per_rank)
    (rank0,) = [r for r in per_rank if r["rank"] == 0]
    # Then every audit and every weight check passed (the start-up check counts as one)
    assert rank0["audit_passes"] == CLEAN_STEPS
    assert rank0["weight_check_passes"] == CLEAN_STEPS + 1
    # And the layout was learned from the parameters: 3 replicas of 2 (shard, tp) slices
    facts = rank0["coverage_facts"]
    assert (facts["parallel"], facts["replicas"], facts["shards"]) == ("hsdp+tp", 3, 2)
    assert facts["mesh"] == {"replicate": 3, "shard": 1, "tp": 2}
    assert facts["compute_groups"] == [[0, 1], [2, 3], [4, 5]]
    assert facts["replicas_of_shard"] == [[0, 2, 4], [1, 3, 5]]
    # And guard.coverage() says what check 2 compares under TP, the same on every rank
    cov = rank0["coverage"]
    assert all(r["coverage"] == cov for r in per_rank)
    assert cov["parallelism"] == "hsdp+tp" and cov["mesh"] == facts["mesh"]
    assert "diverged first" in cov["checks"]["replay_audit"]["compares"]
    assert any("tensor parallel" in line for line in cov["not_covered"])
    # And both checkpoints carry the same verified digest on every rank
    for i in range(2):
        tags = [r["saves"][i] for r in per_rank]
        assert all(t["weights_verified"] for t in tags)
        assert len({t["weights_digest"] for t in tags}) == 1


def test_replays_leave_tp_training_bit_identical(results):
    # Given the same 4 steps (FSDP2's bf16 / float32-reduction policy) trained with an audit
    # every step and without one, every audit passing
    per_rank = ok(results, "tp_bit_identical")
    # Then every rank's slices end bit-identical in both runs
    assert all(r["audited"] == r["unaudited"] for r in per_rank)


@pytest.mark.parametrize(
    ("layer", "gemm"), [("up", "forward"), ("down", "forward"), ("down", "dgrad")]
)
def test_a_one_step_fault_in_one_ranks_local_tp_gemm_is_seen_by_its_sensor(results, layer, gemm):
    # Given protect() before parallelize_module, every GEMM checked every step, and x1.1 on one
    # element of the fp32 result of R's local GEMM at step 8 only: the column-parallel layer's
    # output columns, or the row-parallel layer's partial output (or its input gradient)
    name = f"tp_sensor_{layer}_{gemm}"
    alarm = the_alarm(results, name)
    # Then R's sensor on that local GEMM raises the candidate, and the collective replays
    # (kept by the third node's rank at R's tp coordinate, and by R) confirm it transient
    assert (alarm["step"], alarm["check"], alarm["suspects"]) == (8, "compute", [R])
    candidates = alarm["sensor_candidates"]
    assert [(c["rank"], c["layer"], c["gemm"]) for c in candidates] == [
        (R, f"blocks.1.{layer}", gemm)
    ]
    assert alarm["verdicts"] == [{"pair": [R, R], "third": 5, "suspect": R, "kind": "transient"}]
    # And the protected layer computed on DTensor weights (TP slices), still DTensors at rest
    rank0 = ok(results, name)[0]
    assert rank0["weight_types_in_forward"] == ["DTensor"]
    assert all(r["updates"] == list(range(8)) for r in ok(results, name))


def test_a_fault_free_tp_run_with_every_local_gemm_checked_raises_nothing(results):
    # Given 30 fault-free steps of HSDP x TP with every sensor checking every step, with the
    # default thresholds (agreed by the ranks)
    per_rank = ok(results, "tp_sensor_clean")
    # Then no alarm, every step applied, the sensors did check (a flag a third GPU reproduces
    # would be counted and published, never an alarm)
    assert all(r["alarm"] is None and r["alarms_published"] == 0 for r in per_rank)
    assert all(r["updates"] == list(range(30)) for r in per_rank)
    assert all(r["checks_run"] > 0 for r in per_rank)
    assert per_rank[0]["published_unconfirmed"] == per_rank[0]["unconfirmed"]
    thresholds = per_rank[0]["coverage"]["thresholds"]
    assert thresholds["agreed"] and all(r["coverage"]["thresholds"] == thresholds for r in per_rank)


def test_protected_tp_layers_compute_the_same_bits_as_unprotected_ones(results):
    # Given the sequence-parallel TP model trained 3 fp32 steps unprotected and protected
    # (every column- and row-parallel layer, the embedding and head included, on its local path)
    per_rank = ok(results, "tp_protected_bit_identical")
    # Then losses and final weight slices are the same bits on every rank
    assert all(r["protected"] == r["unprotected"] for r in per_rank)


def test_with_gradient_accumulation_a_tp_fault_is_named_on_its_group_in_its_node(results):
    # Given 2 micro-batches per step (the audited one's own gradient isolated per parameter,
    # its local results not recorded in order) and the persistent column-parallel fault on R
    alarm = the_alarm(results, "tp_accum2_colwise")
    # Then the audit at step 10 names R and its TP partner, whose gradients the all-reduce
    # carried the wrong value to: R's node, never another; nobody applied step 10
    assert (alarm["step"], alarm["check"]) == (10, "compute")
    assert alarm["suspects"] == [PARTNER, R] and alarm["culprits"] == [PARTNER, R]
    assert {info["node_name"] for info in alarm["ranks"].values()} == {
        "hyperpod-i-00000000000000001"
    }
    assert all(u == list(range(10)) for u in updates(results, "tp_accum2_colwise"))


def test_clipping_gradients_that_live_on_two_meshes_trains_without_alarm(results):
    # Given Schedule.max_grad_norm under HSDP x TP: the blocks' gradients live on the
    # ("replicate", "shard", "tp") mesh, the embedding's and head's on its data-parallel part
    per_rank = ok(results, "tp_clipped")
    # Then nothing fires, every step is applied, and the replicas stay bit-identical (the
    # weight check after step 4 passed, audits at 0 and 5 too)
    assert all(r["alarm"] is None and r["updates"] == list(range(8)) for r in per_rank)
    assert all(r["last_audit_pass"] == 5 and r["last_weight_check_pass"] == 4 for r in per_rank)

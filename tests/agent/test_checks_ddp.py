"""The three checks on a real multi-process DDP job: 3 simulated nodes x 2 ranks, gloo, CPU.

All scenarios run in one launch of 6 processes (process start-up dominates on 2 cores); each
test then asserts its own scenario. Rank R=3 (node 1) is replayed by rank 1 (node 0) and its
disputed results are confirmed by rank 5 (node 2); peer_offset=2.
"""

from __future__ import annotations

from typing import Any

import pytest

from sdc_agent.drills.launch import launch
from tests.agent.outcomes import the_alarm
from tests.agent.scenarios import SCHEDULE, R

# How long this file's processes may run before the launcher kills them; the suite's conftest
# marks the file slow and gives pytest-timeout this plus a margin.
LAUNCH_DEADLINE_S = 600


DRILL = "sdc_agent.drills.job:train_drill"
SCEN = "tests.agent.scenarios"


def drill(faults: list[dict[str, Any]], steps: int = 12, **overrides: Any) -> tuple[str, dict]:
    schedule = {**SCHEDULE, **overrides.pop("schedule", {})}
    return DRILL, {"steps": steps, "schedule": schedule, "faults": faults, **overrides}


def out_scale(**kw: Any) -> dict[str, Any]:
    return {"kind": "ScaleOutputElement", "layer": "net.4", "factor": 1000.0, "rank": R, **kw}


def reduced_nan(step: int) -> dict[str, Any]:
    """A NaN written into rank 4's REDUCED gradient at ``step`` (its local one stays finite)."""
    return {"kind": "NaNReducedGradient", "index": 3, "rank": 4, "step": step, "persistent": False}


WEIGHT_FLIP = {
    "kind": "FlipWeightBit",
    "param": "net.0.weight",
    "index": 3,
    "bit": 12,
    "rank": 0,
    "step": 6,
}
"""An fp32 bit flip in rank 0's copy of net.0.weight after step 6's update."""


JOBS: dict[str, tuple[str, dict]] = {
    "nan_one_step": drill(
        [{"kind": "NaNOutputElement", "layer": "net.4", "rank": R, "step": 7, "persistent": False}]
    ),
    "persistent_x1000": drill([out_scale(step=7)]),
    "one_audit_step_x1000": drill([out_scale(step=10, persistent=False)]),
    "replayer_faulty": drill([out_scale(step=7, rank=1)]),
    "x10000": drill([out_scale(step=7, factor=10000.0)]),
    "noise_10pct": drill(
        [{"kind": "OutputNoise", "layer": "net.4", "relative": 0.1, "rank": R, "step": 7}]
    ),
    "bf16_bit_flip": drill(
        [{"kind": "FlipOutputBit", "layer": "net.0", "bit": 0, "rank": R, "step": 7}],
        autocast_bf16=True,
    ),
    "column_x1_1": drill(
        [
            {
                "kind": "ScaleOutputColumn",
                "layer": "net.4",
                "column": 3,
                "factor": 1.1,
                "rank": R,
                "step": 7,
            }
        ]
    ),
    "input_grad_x1000": drill(
        [{"kind": "ScaleInputGradElement", "layer": "net.4", "index": 5, "rank": R, "step": 7}]
    ),
    "weight_grad_x1000": drill(
        [
            {
                "kind": "ScaleWeightGradElement",
                "param": "net.4.weight",
                "index": 5,
                "rank": R,
                "step": 7,
            }
        ]
    ),
    "two_rings": drill([out_scale(step=7, rank=0), out_scale(step=7, rank=1)]),
    "weight_flip_ckpt": drill(
        [WEIGHT_FLIP],
        steps=14,
        schedule={"audit_every": 10, "ckpt_every": 5},
    ),
    "weight_flip_no_ckpt_check": drill(
        [WEIGHT_FLIP],
        steps=14,
        schedule={"audit_every": 10, "ckpt_every": 5, "check_on_checkpoint": False},
    ),
    "swap": drill(
        [{"kind": "SwapWeights", "param": "net.4.weight", "i": 0, "j": 7, "rank": 4, "step": 2}],
        schedule={"audit_every": 0, "check_every": 5},
    ),
    "compensating": drill(
        [
            {
                "kind": "CompensatingWeightChange",
                "param": "net.4.weight",
                "i": 2,
                "j": 9,
                "delta": 4096,
                "rank": 4,
                "step": 2,
            }
        ],
        schedule={"audit_every": 0, "check_every": 5},
    ),
    "flip_after_load": (f"{SCEN}:flip_after_load", {"rank": 2, "param": "net.6.weight", "bit": 7}),
    "reduced_nan": drill([reduced_nan(step=7)]),
    "reduced_nan_last_step": drill([reduced_nan(step=7)], steps=8),
    "reduced_nan_audit_step": drill([reduced_nan(step=10)]),
    "reduced_nan_ckpt_step": drill(
        [reduced_nan(step=9)], schedule={"ckpt_every": 5, "check_on_checkpoint": False}
    ),
    "topology": (f"{SCEN}:topology_error", {"peer_offset": 1}),
    "clean_deterministic": (
        f"{SCEN}:long_clean_run",
        {
            "steps": 300,
            "schedule": {"audit_every": 1, "check_every": 10, "ckpt_every": 50, "peer_offset": 2},
        },
    ),
    "clean_default_kernels": (
        f"{SCEN}:long_clean_run",
        {
            "steps": 60,
            "schedule": {
                "audit_every": 3,
                "deterministic_audits": False,
                "check_every": 7,
                "peer_offset": 2,
            },
        },
    ),
    "own_loop_fault": (f"{SCEN}:own_loop", {"steps": 12, "fault": out_scale(step=3)}),
    "own_loop_clean": (f"{SCEN}:own_loop", {"steps": 12, "fault": None}),
    "own_loop_zeroed_in_place": (
        f"{SCEN}:own_loop",
        {"steps": 12, "fault": None, "set_to_none": False},
    ),
    "own_loop_accumulating": (f"{SCEN}:own_loop", {"steps": 4, "fault": None, "accumulate": 2}),
    "broken_rebuild": (f"{SCEN}:broken_rebuild", {"steps": 12, "fail_rank": 2, "fail_step": 5}),
}


@pytest.fixture(scope="module")
def results() -> dict[str, list[dict[str, Any]]]:
    names = list(JOBS)
    per_job = launch(
        [JOBS[n] for n in names], world=6, ranks_per_node=2, timeout_s=LAUNCH_DEADLINE_S
    )
    return dict(zip(names, per_job, strict=True))


def assert_not_applied(results: dict, name: str, step: int) -> None:
    """No rank applied ``step`` (the alarmed one) or any later step: every rank's optimizer
    stepped for steps 0 .. step-1 exactly, read from each rank's own record."""
    by_rank = {r["rank"]: r["updates"] for r in results[name]}
    assert len(by_rank) == 6
    assert all(u == list(range(step)) for u in by_rank.values()), by_rank


def test_nan_on_a_non_audit_step_is_named_that_step_and_confirmed_transient(results):
    # Given a NaN in one element of rank R's forward output at step 7 only (not an audit step)
    # When the guard checks the local gradient norms after backward
    alarm = the_alarm(results, "nan_one_step")
    # Then check 1 fires at step 7, names R, and the step is not applied
    assert (alarm["step"], alarm["check"], alarm["nonfinite"]) == (7, "compute", [R])
    assert alarm["suspects"] == [R]
    assert alarm["suspect_window"] == [6, 7]
    assert_not_applied(results, "nan_one_step", 7)
    # And the confirmation (third GPU + R replay R's batch) says transient
    assert alarm["verdicts"] == [{"pair": [R, R], "third": 5, "suspect": R, "kind": "transient"}]
    assert alarm["metric"] == {"name": "sdc_nonfinite_grad", "value": 1}
    assert alarm["ranks"][str(R)]["node_name"] == "hyperpod-i-00000000000000001"
    assert alarm["ranks"][str(R)]["instance_id"] == "i-00000000000000001"


def test_persistent_forward_fault_is_named_at_the_next_audit(results):
    # Given x1000 on one output element of R every step from step 7; audits at 0, 5, 10
    alarm = the_alarm(results, "persistent_x1000")
    # Then the audit at step 10 finds R wrong both as target and as replayer
    assert (alarm["step"], alarm["check"]) == (10, "compute")
    assert alarm["mismatched_pairs"] == [[R, 1], [5, R]]
    assert alarm["culprits"] == [R] and alarm["suspects"] == [R]
    assert alarm["suspect_window"] == [5, 10] and alarm["last_audit_pass"] == 5
    assert alarm["metric"] == {"name": "sdc_replay_mismatch", "value": 2}
    assert_not_applied(results, "persistent_x1000", 10)


def test_fault_on_one_audit_step_only_is_confirmed_transient(results):
    # Given x1000 on R's forward at audit step 10 only (R's replay of another batch is clean)
    alarm = the_alarm(results, "one_audit_step_x1000")
    # Then exactly one pair mismatches and the third GPU's replay settles it: transient on R
    assert (alarm["step"], alarm["check"]) == (10, "compute")
    assert alarm["mismatched_pairs"] == [[R, 1]]
    assert alarm["culprits"] == []
    assert alarm["verdicts"] == [{"pair": [R, 1], "third": 5, "suspect": R, "kind": "transient"}]
    assert alarm["suspects"] == [R]
    assert alarm["suspect_window"] == [5, 10]
    # And no rank applied step 10
    assert_not_applied(results, "one_audit_step_x1000", 10)


def test_fault_on_the_replayer_names_the_replayer_not_the_target(results):
    # Given a persistent x1000 on rank 1, which replays R's batch
    alarm = the_alarm(results, "replayer_faulty")
    # Then rank 1 is the culprit and R, whose result rank 1 disputed, is not named
    assert alarm["mismatched_pairs"] == [[1, 5], [R, 1]]
    assert alarm["culprits"] == [1] and alarm["suspects"] == [1]
    assert alarm["step"] == 10
    # And no rank applied step 10
    assert_not_applied(results, "replayer_faulty", 10)


@pytest.mark.parametrize("name", ["x10000", "noise_10pct", "bf16_bit_flip", "column_x1_1"])
def test_other_forward_corruptions_are_named_at_the_audit(results, name):
    # Given a persistent forward corruption on R from step 7
    alarm = the_alarm(results, name)
    # Then the audit at step 10 names R as the culprit
    assert (alarm["step"], alarm["check"], alarm["suspects"]) == (10, "compute", [R])
    assert alarm["culprits"] == [R]
    assert alarm["suspect_window"] == [5, 10]
    # And no rank applied step 10
    assert_not_applied(results, name, 10)


@pytest.mark.parametrize("name", ["input_grad_x1000", "weight_grad_x1000"])
def test_backward_only_corruption_is_named_from_gradient_fingerprints(results, name):
    # Given a fault that only touches R's backward pass (the forward and the loss are exact)
    alarm = the_alarm(results, name)
    # Then deterministic audits still name R, from the per-parameter gradient fingerprints
    assert (alarm["step"], alarm["check"], alarm["suspects"]) == (10, "compute", [R])
    assert alarm["mismatched_pairs"] == [[R, 1], [5, R]]
    # And no rank applied step 10
    assert_not_applied(results, name, 10)


def test_faults_on_two_replay_rings_name_both_ranks(results):
    # Given persistent faults on rank 0 (ring 0-2-4) and rank 1 (ring 1-3-5)
    alarm = the_alarm(results, "two_rings")
    # Then both are culprits
    assert alarm["culprits"] == [0, 1] and alarm["suspects"] == [0, 1]
    assert sorted(alarm["ranks"]) == ["0", "1"]
    # And no rank applied step 10
    assert_not_applied(results, "two_rings", 10)


def test_weight_bit_flip_blocks_the_checkpoint(results):
    # Given one fp32 weight bit flipped on rank 0 after the update of step 6; checkpoints
    # after steps 4, 9 and 14, each preceded by a forced weight check
    alarm = the_alarm(results, "weight_flip_ckpt")
    # Then the check before the step-9 checkpoint names rank 0 and that save never happens
    assert (alarm["step"], alarm["check"], alarm["suspects"]) == (9, "weights", [0])
    assert alarm["divergent_tensors"] == ["net.0.weight"]
    assert alarm["suspect_window"] == [4, 9]
    assert alarm["metric"] == {"name": "sdc_divergent_tensors", "value": 1}
    saves = results["weight_flip_ckpt"][0]["saves"]
    assert [s for s, _ in saves] == [4]
    tags = saves[0][1]
    assert tags["weights_verified"] is True and tags["last_weight_check_pass"] == 4
    assert isinstance(tags["weights_digest"], str) and len(tags["weights_digest"]) == 64
    # And every replica agreed on that digest
    assert len({r["saves"][0][1]["weights_digest"] for r in results["weight_flip_ckpt"]}) == 1


def test_without_checkpoint_checks_the_save_happens_and_the_next_audit_names_the_rank(results):
    # Given the same flip, but check_on_checkpoint=False
    alarm = the_alarm(results, "weight_flip_no_ckpt_check")
    saves = results["weight_flip_no_ckpt_check"][0]["saves"]
    # Then both saves happen, tagged with the last passing checks (the start-up weight check)
    assert [s for s, _ in saves] == [4, 9]
    for _, tags in saves:
        assert tags["weights_verified"] is False and tags["weights_digest"] is None
        assert tags["last_weight_check_pass"] == 0 and tags["last_audit_pass"] == 0
    # And the audit at step 10 names rank 0 (its corrupted weights compute differently)
    assert (alarm["step"], alarm["check"], alarm["suspects"]) == (10, "compute", [0])


@pytest.mark.parametrize("name", ["swap", "compensating"])
def test_sum_preserving_weight_changes_are_caught(results, name):
    # Given a swap of two weights / +4096 and -4096 on two weights' bit patterns on rank 4
    alarm = the_alarm(results, name)
    # Then the weight check after step 4 names rank 4 (the position-weighted sum differs)
    assert (alarm["step"], alarm["check"], alarm["suspects"]) == (4, "weights", [4])
    assert alarm["divergent_tensors"] == ["net.4.weight"]
    # and, judged during step 5 (periodic checks are not awaited at once), step 5 is not applied
    assert all(u == list(range(5)) for u in updates_by_rank(results, name).values())


def test_a_bit_flip_after_loading_a_checkpoint_is_found_before_the_first_step(results):
    per_rank = results["flip_after_load"]
    assert not [r for r in per_rank if "error" in r]
    for r in per_rank:
        # find_divergent_ranks names rank 2 on every rank, for the one tensor changed
        assert (r["ranks"], r["tensors"], r["unattributable"]) == ([2], ["net.6.weight"], False)
        # and Guard.train's start-up check refuses to train from that state
        assert r["alarm"]["check"] == "weights" and r["alarm"]["suspects"] == [2]
        assert r["alarm"]["step"] == 100 and r["alarm"]["suspect_window"] == [100, 100]


def updates_by_rank(results: dict, name: str) -> dict[int, list[int]]:
    return {r["rank"]: r["updates"] for r in results[name]}


@pytest.mark.parametrize("name", ["reduced_nan", "reduced_nan_last_step"])
def test_nan_after_the_all_reduce_on_one_rank_is_never_applied_and_named_at_its_step(results, name):
    # Given finite local gradients everywhere and a NaN written into rank 4's reduced gradient
    # at step 7 (not an audit step); the flags of step 7 are settled during step 8 (or, when
    # step 7 is the last, by Guard.train's final settle)
    alarm = the_alarm(results, name)
    # Then every rank returns the reduced-gradient alarm for step 7, naming nobody
    assert (alarm["step"], alarm["check"]) == (7, "reduced_gradient")
    assert alarm["nonfinite"] == [] and alarm["suspects"] is None and alarm["ranks"] == {}
    assert alarm["suspect_window"] == [6, 7]
    # and rank 4 never applied its NaN gradient; the others applied their (correct) step 7,
    # and nobody applied anything after it
    by_rank = updates_by_rank(results, name)
    assert by_rank.pop(4) == list(range(7))
    assert all(u == list(range(8)) for u in by_rank.values()), by_rank


def test_nan_after_the_all_reduce_on_an_audit_step_is_decided_at_that_step(results):
    # Given the NaN in rank 4's reduced gradient at audit step 10: every rank waits for the
    # flags before auditing
    alarm = the_alarm(results, "reduced_nan_audit_step")
    # Then nobody applies step 10, and the alarm names step 10
    assert (alarm["step"], alarm["check"], alarm["suspects"]) == (10, "reduced_gradient", None)
    assert all(
        u == list(range(10)) for u in updates_by_rank(results, "reduced_nan_audit_step").values()
    )


def test_nan_after_the_all_reduce_on_a_checkpoint_step_blocks_the_checkpoint(results):
    # Given checkpoints after steps 4 and 9 (no weight check on them) and the NaN in rank 4's
    # reduced gradient at step 9
    alarm = the_alarm(results, "reduced_nan_ckpt_step")
    # Then the flags are settled before the checkpoint: the alarm names step 9 and only the
    # checkpoint of step 4 was saved, on every rank
    assert (alarm["step"], alarm["check"]) == (9, "reduced_gradient")
    assert all([s for s, _ in r["saves"]] == [4] for r in results["reduced_nan_ckpt_step"])


def test_replay_pairs_sharing_a_node_are_refused_before_training(results):
    per_rank = results["topology"]
    for r in per_rank:
        assert r["error_type"] == "TopologyError"
        assert "peer_offset=1" in r["message"]
        assert "hyperpod-i-00000000000000000" in r["message"]


def test_fault_free_run_raises_no_alarm(results):
    # Given 300 steps, each a deterministic audit, and a weight check every 10 steps
    per_rank = results["clean_deterministic"]
    assert not [r for r in per_rank if "error" in r]
    assert all(r["alarm"] is None for r in per_rank)
    (publisher,) = [r for r in per_rank if r["dp_rank"] == 0]
    # Then every audit and every weight check passed (the start-up check counts as one)
    assert publisher["audit_passes"] == 300
    assert publisher["weight_check_passes"] == 31
    assert publisher["alarms_published"] == 0 and publisher["rank_maps"] == 1
    assert publisher["saves"] == 6


def test_fault_free_run_with_default_kernels_raises_no_alarm(results):
    per_rank = results["clean_default_kernels"]
    assert not [r for r in per_rank if "error" in r]
    assert all(r["alarm"] is None for r in per_rank)
    (publisher,) = [r for r in per_rank if r["dp_rank"] == 0]
    assert publisher["audit_passes"] == 20


def test_step_api_in_a_loop_the_user_owns(results):
    faulty, clean = results["own_loop_fault"], results["own_loop_clean"]
    assert not [r for r in faulty + clean if "error" in r]
    # The audit at step 5 names R; steps 0-4 were applied, step 5 was not
    alarm = the_alarm(results, "own_loop_fault")
    assert (alarm["step"], alarm["suspects"]) == (5, [R])
    assert all(r["applied"] == 5 for r in faulty)
    # A clean loop applies every step and leaves the kernel flags as they were
    assert all(r["alarm"] is None and r["applied"] == 12 for r in clean)
    assert not any(r["deterministic_after"] for r in faulty + clean)


def test_a_replay_that_raises_skips_that_audit_without_hanging_or_alarming(results):
    # Given rebuild_batch raising on rank 2 during the audit of step 5 (a bug in user code)
    per_rank = results["broken_rebuild"]
    assert not [r for r in per_rank if "error" in r]
    # Then no rank hung or raised, no alarm named a GPU, and every step was applied
    assert all(r["alarm"] is None and r["updates"] == list(range(12)) for r in per_rank)
    # And the skipped audit is not counted as a pass (liveness shows the gap): only 0 and 10
    (rank0,) = [r for r in per_rank if r["dp_rank"] == 0]
    assert rank0["audit_passes"] == 2 and rank0["last_audit_pass"] == 10


def test_gradients_zeroed_in_place_replay_exactly_and_raise_no_false_alarm(results):
    # Given a loop that zeroes gradients in place (zero_grad(set_to_none=False)): the step's
    # gradients are 0 + g, whose bits differ from g where g is -0.0
    per_rank = results["own_loop_zeroed_in_place"]
    # Then the replays start from zeros too, and every audit passes
    assert all(r["refused"] is None and r["alarm"] is None and r["applied"] == 12 for r in per_rank)


def test_gradient_accumulation_is_refused_with_a_clear_error(results):
    # Given gradients accumulated by a no_sync micro-step before the audited step
    per_rank = results["own_loop_accumulating"]
    # Then every rank refuses to audit it, saying why and what to do, before any collective
    for r in per_rank:
        assert "gradient accumulation" in r["refused"] and "audit_every=0" in r["refused"]
        assert r["applied"] == 0 and r["alarm"] is None

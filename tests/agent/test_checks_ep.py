"""Expert parallel (MoE): torchtitan's DeepSeek-V3 debug model, EP=2 x HSDP, 3 nodes x 2 ranks.

One launch of 6 gloo processes on the CPU runs every scenario (tests/agent/scenarios_ep.py
builds the model and says why each CPU workaround is needed). ``ParallelDims(dp_replicate=3,
dp_shard=2, ep=2)``: the dense weights are HSDP's (3 replicas x 2 shards), the 4 routed experts
are split over the 2 EP ranks of each node (ranks 2k and 2k+1), and each expert has 3 copies, one
per node: rank 3's experts are also held by ranks 1 and 5. Check 1 and check 3 run; the replay
audit and the online sensors are off, and ``coverage()`` says why.
"""

from __future__ import annotations

from typing import Any

import pytest

from sdc_agent.drills.launch import launch
from tests.agent.outcomes import ok, the_alarm

# How long this file's processes may run before the launcher kills them; the suite's conftest
# marks the file slow and gives pytest-timeout this plus a margin.
LAUNCH_DEADLINE_S = 1200

SCEN = "tests.agent.scenarios_ep"
EXPERT_W1 = "layers.1.moe.routed_experts.inner_experts.w1_EFD"
EXPERT_W2 = "layers.1.moe.routed_experts.inner_experts.w2_EDF"
ROUTER = "layers.1.moe.router.gate.weight"
SCHEDULE = {"audit_every": 5, "check_every": 0, "ckpt_every": 0, "peer_offset": 2}
CLEAN_STEPS = 30


def nan_grad(param: str, rank: int, step: int) -> dict[str, Any]:
    """NaN in one element of ``param``'s local gradient on ``rank`` at ``step`` (once)."""
    return {
        "kind": "ScaleWeightGradElement",
        "param": param,
        "index": 5,
        "factor": float("nan"),
        "rank": rank,
        "step": step,
        "persistent": False,
    }


JOBS: dict[str, tuple[str, dict[str, Any]]] = {
    "expert_nan": (
        f"{SCEN}:train",
        {"steps": 8, "schedule": SCHEDULE, "faults": [nan_grad(EXPERT_W1, 3, 4)]},
    ),
    "router_nan": (
        f"{SCEN}:train",
        {"steps": 6, "schedule": SCHEDULE, "faults": [nan_grad(ROUTER, 2, 3)]},
    ),
    "expert_flip": (
        f"{SCEN}:train",
        {
            "steps": 10,
            "schedule": {**SCHEDULE, "ckpt_every": 4},
            "faults": [
                {
                    "kind": "FlipWeightBit",
                    "param": EXPERT_W2,
                    "index": 3,
                    "bit": 12,
                    "rank": 3,
                    "step": 5,
                }
            ],
        },
    ),
    "clean_bf16": (
        f"{SCEN}:train",
        {
            "steps": CLEAN_STEPS,
            "schedule": {"audit_every": 1, "check_every": 3, "ckpt_every": 10, "peer_offset": 2},
            "bf16": True,
        },
    ),
    "etp_refused": (f"{SCEN}:refused", {"layout": "etp"}),
}


@pytest.fixture(scope="module")
def results() -> dict[str, list[dict[str, Any]]]:
    names = list(JOBS)
    per_job = launch(
        [JOBS[n] for n in names], world=6, ranks_per_node=2, timeout_s=LAUNCH_DEADLINE_S
    )
    return dict(zip(names, per_job, strict=True))


def test_a_nan_in_one_experts_gradient_names_that_rank_and_nobody_applies_the_step(results):
    # Given a NaN in rank 3's local gradient of its experts' w1 at step 4, which the reduction
    # over that expert's copies carries only to ranks 1 and 5 (not to their EP partners)
    alarm = the_alarm(results, "expert_nan")
    # Then check 1 names rank 3 alone at step 4
    assert (alarm["step"], alarm["check"]) == (4, "compute")
    assert alarm["nonfinite"] == [3] and alarm["suspects"] == [3]
    assert alarm["ranks"]["3"]["node_name"] == "hyperpod-i-00000000000000001"
    # And no rank applied step 4: every rank judged the step with the others
    assert all(r["updates"] == [0, 1, 2, 3] for r in ok(results, "expert_nan"))
    assert all(r["adapter"] == "ExpertParallelAdapter" for r in ok(results, "expert_nan"))


def test_a_nan_in_a_dense_gradient_of_the_moe_layer_names_that_rank(results):
    # Given a NaN in rank 2's local gradient of the router's gate (a dense HSDP weight) at step 3
    alarm = the_alarm(results, "router_nan")
    # Then check 1 names rank 2 alone, and nobody applied step 3
    assert (alarm["step"], alarm["nonfinite"], alarm["suspects"]) == (3, [2], [2])
    assert all(r["updates"] == [0, 1, 2] for r in ok(results, "router_nan"))


def test_a_bit_flip_in_one_stored_expert_weight_is_named_by_check_3_and_blocks_the_checkpoint(
    results,
):
    # Given a flipped bit in rank 3's copy of its experts' w2 after step 5's update, and
    # checkpoints due after steps 3 and 7
    alarm = the_alarm(results, "expert_flip")
    # Then the check before the step-7 checkpoint names rank 3 by a strict majority of its 3
    # expert-data-parallel copies (ranks 1, 3, 5), and only that tensor
    assert (alarm["step"], alarm["check"], alarm["suspects"]) == (7, "weights", [3])
    assert alarm["divergent_tensors"] == [EXPERT_W2]
    assert alarm["suspect_window"] == [3, 7] and alarm["last_weight_check_pass"] == 3
    # And only the step-3 checkpoint was saved, verified, with one digest on every rank
    per_rank = ok(results, "expert_flip")
    assert all([s for s, _ in r["saves"]] == [3] for r in per_rank)
    tags = [r["saves"][0][1] for r in per_rank]
    assert all(t["weights_verified"] for t in tags)
    assert len({t["weights_digest"] for t in tags}) == 1


def test_fault_free_bf16_steps_raise_no_alarm_with_weights_checked_every_few_steps(results):
    # Given 30 fault-free steps in bf16 autocast (the experts' grouped GEMMs in bf16), weights
    # checked every 3 steps and before the checkpoints after steps 9, 19 and 29
    per_rank = ok(results, "clean_bf16")
    # Then no rank raised an alarm, every step was applied and every checkpoint saved verified
    assert all(r["alarm"] is None for r in per_rank)
    assert all(r["updates"] == list(range(CLEAN_STEPS)) for r in per_rank)
    assert all([s for s, _ in r["saves"]] == [9, 19, 29] for r in per_rank)
    assert all(t["weights_verified"] for r in per_rank for _, t in r["saves"])
    # and the weight checks ran (counted on rank 0, which publishes): start-up, every 3 steps
    assert per_rank[0]["weight_check_passes"] >= 10
    assert per_rank[0]["alarms_published"] == 0


def test_coverage_says_what_expert_parallel_leaves_unchecked(results):
    # Given the fault-free run's coverage (the same on every rank)
    coverage = ok(results, "clean_bf16")[0]["coverage"]
    checks = coverage["checks"]
    # Then it names the layout and the EP groups, one per node
    assert coverage["parallelism"] == "hsdp+ep"
    assert coverage["mesh"] == {"replicate": 3, "shard": 2, "ep": 2}
    # and check 1 runs, without a confirmation replay
    assert checks["nonfinite_gradients"]["on"] is True
    assert checks["nonfinite_gradients"]["confirmation"]["on"] is False
    # and the replay audit is off, saying why, with no pairs (it can never false-alarm)
    audit = checks["replay_audit"]
    assert audit["on"] is False and audit["pairs"] == []
    assert "replay audit does not yet run" in audit["why"]
    assert "all-to-all" in audit["why"]
    # and check 3 compares each expert shard across its copies, naming by majority
    weights = checks["weight_fingerprints"]
    assert weights["on"] is True and weights["replicas_of_shard"] == [[0, 2, 4], [1, 3, 5]]
    assert "expert shard" in weights["why"]
    # and the online sensors are off (no protected layer here; with one, the adapter's reason)
    assert checks["online_sensors"]["on"] is False
    # and what is not covered says what EP leaves unchecked, grouped GEMMs included
    not_covered = " ".join(coverage["not_covered"])
    assert "expert parallel: the replay audit does not yet run" in not_covered
    assert "expert parallel: the online sensors do not run" in not_covered
    assert "grouped GEMMs" in not_covered


def test_expert_parallel_with_expert_tensor_parallel_is_refused_by_name_on_every_rank(results):
    # Given the experts on a mesh with torchtitan's expert-tensor-parallel dimension "etp"
    per_rank = ok(results, "etp_refused")
    # Then every rank refuses the Guard alike, naming the dimensions it found and what is
    # supported
    assert all(r["error_type"] == "ShardingLayoutError" for r in per_rank)
    assert all(r["message"] == per_rank[0]["message"] for r in per_rank)
    assert "['ep', 'etp']" in per_rank[0]["message"]
    assert "('dp_replicate', 'efsdp', 'ep')" in per_rank[0]["message"]

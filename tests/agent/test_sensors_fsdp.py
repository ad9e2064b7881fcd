"""Online GEMM sensors on a model sharded with FSDP2 and HSDP: 3 simulated nodes x 2 ranks, gloo.

The sharded drill model's layers are protected, then sharded (``fully_shard`` per block, then
the root): FSDP2 keeps each weight as a sharded DTensor at rest and hands the protected layer's
autograd function the unsharded tensor in forward and backward. Rank R=3 (node 1) is faulty; its
candidates are confirmed by collective replays, kept by rank 5 (node 2, its third GPU with
peer_offset=2) and by R itself. Audits run every 50 steps, so step 8 is not an audit step.
"""

from __future__ import annotations

from typing import Any

import pytest

from sdc_agent.drills.launch import launch
from tests.agent.outcomes import the_alarm
from tests.agent.sensor_scenarios import x1_1_once

# How long this file's processes may run before the launcher kills them; the suite's conftest
# marks the file slow and gives pytest-timeout this plus a margin.
LAUNCH_DEADLINE_S = 900


R = 3
RUN = "tests.agent.sensor_scenarios_fsdp:sensed_sharded_run"
CLEAN_STEPS = 80
LAYOUTS = ("fsdp", "hsdp")

FORWARD_X1_1 = x1_1_once("blocks.1.fc", rank=R)
"""x1.1 on one element of blocks.1.fc's forward GEMM result on rank R, at step 8 only."""

JOBS: dict[str, tuple[str, dict]] = {
    **{
        f"{layout}_forward_x1_1": (RUN, {"parallel": layout, "steps": 12, "faults": [FORWARD_X1_1]})
        for layout in LAYOUTS
    },
    **{
        f"{layout}_clean": (
            RUN,
            {"parallel": layout, "steps": CLEAN_STEPS},
        )
        for layout in LAYOUTS
    },
}


@pytest.fixture(scope="module")
def results() -> dict[str, list[dict[str, Any]]]:
    names = list(JOBS)
    per_job = launch(
        [JOBS[n] for n in names], world=6, ranks_per_node=2, timeout_s=LAUNCH_DEADLINE_S
    )
    out = dict(zip(names, per_job, strict=True))
    for name, per_rank in out.items():
        errors = [r["trace"] for r in per_rank if "error" in r]
        assert not errors, f"{name}: {errors[0]}"
    return out


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_one_step_x1_1_in_a_sharded_models_forward_gemm_is_confirmed_transient(results, layout):
    name = f"{layout}_forward_x1_1"
    # Given x1.1 on one element of blocks.1.fc's forward GEMM on rank R at step 8 only
    alarm = the_alarm(results, name)
    # Then that sensor raises a candidate at step 8 naming R
    assert (alarm["step"], alarm["check"], alarm["suspects"]) == (8, "compute", [R])
    candidates = alarm["sensor_candidates"]
    assert [(c["rank"], c["layer"], c["gemm"]) for c in candidates] == [
        (R, "blocks.1.fc", "forward")
    ]
    # And the collective replays (kept by the third GPU and by R) confirm it transient
    assert alarm["verdicts"] == [{"pair": [R, R], "third": 5, "suspect": R, "kind": "transient"}]
    # And the step was not applied on any rank
    assert all(r["updates"] == list(range(8)) for r in results[name])
    assert results[name][0]["alarms_published"] == 1


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_fault_free_sharded_run_with_every_gemm_checked_raises_nothing(results, layout):
    per_rank = results[f"{layout}_clean"]
    # Given a fault-free sharded run in which every sensor checks on every step
    coverage = per_rank[0]["coverage"]
    assert coverage["on"] and coverage["period"] == 1
    # Then every sensor checked every step, from the first (13 GEMMs and norms a step: embed's
    # input needs no gradient, so it has no dgrad), with the default thresholds: no alarm, every
    # step applied (a flag a healthy GPU reproduces is counted and published, never an alarm:
    # this row once needed a longer observe-only warm-up than the fault rows, because each
    # rank learned its own threshold; the ranks now judge against one agreed threshold and
    # the numbers of a third GPU's recomputation)
    assert all(r["checks_run"] >= 13 * CLEAN_STEPS for r in per_rank)
    assert all(r["alarm"] is None for r in per_rank)
    assert per_rank[0]["alarms_published"] == 0
    assert per_rank[0]["published_unconfirmed"] == per_rank[0]["unconfirmed"]
    assert all(r["updates"] == list(range(CLEAN_STEPS)) for r in per_rank)
    thresholds = per_rank[0]["coverage"]["thresholds"]
    assert thresholds["agreed"] and all(r["coverage"]["thresholds"] == thresholds for r in per_rank)
    # And FSDP2 kept the weights sharded at rest while the protected layers computed on the
    # unsharded tensors
    assert all(r["sharded_at_rest"] == "DTensor" for r in per_rank)
    assert all(r["weight_types_in_forward"] == ["Parameter"] for r in per_rank)

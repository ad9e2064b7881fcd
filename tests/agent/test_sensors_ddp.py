"""Online GEMM sensors on a real multi-process DDP job: 3 simulated nodes x 2 ranks, gloo, CPU.

One launch runs every scenario (process start-up dominates on 2 cores). The drill model's three
linear layers (net.0, net.4, net.6) are protected, with the sensors' default thresholds (armed
from the first check, agreed by the ranks after 20 sensor steps) and the default burn-in (every
sensor on each of the first 20 steps); rank R=3 (node 1) is the faulty one, and its candidates
are confirmed by rank 5 (node 2), its third GPU with peer_offset=2. Audits run every 50 steps
(100 in the rotation scenario, 1000 in the persistent x1000 ones), so every fault below lands
between audits.
"""

from __future__ import annotations

from typing import Any

import pytest

from sdc_agent.drills.launch import launch
from tests.agent.outcomes import the_alarm
from tests.agent.sensor_scenarios import budget_for_period, planned_period, x1_1_once, x1000_from

# How long this file's processes may run before the launcher kills them; the suite's conftest
# marks the file slow and gives pytest-timeout this plus a margin.
LAUNCH_DEADLINE_S = 1100

R = 3
RUN = "tests.agent.sensor_scenarios:sensed_run"
CLEAN_STEPS = 300
DEFAULT_BUDGET = 0.01  # Schedule's default sensor_budget
# The period the guard plans for the drill model at the default budget, by the plan's own cost
# model (sensors/runtime/plan.py, calibrated by the recorder: 935 steps when written, 309
# before the calibration): the x1000 runs after the burn-in last one period past their fault,
# and audit after it, so the fault lands between audits whatever the calibration says.
DEFAULT_PERIOD = planned_period(DEFAULT_BUDGET)
LATE_START = 30
X1000_AUDIT_EVERY = max(1000, LATE_START + DEFAULT_PERIOD + 1)


def gemm_fault(layer: str = "net.4", **kw: Any) -> dict[str, Any]:
    """x1.1 on one element of a protected GEMM's fp32 result on rank R, once at step 8."""
    return x1_1_once(layer, rank=R, **kw)


JOBS: dict[str, tuple[str, dict]] = {
    "forward_x1_1": (RUN, {"steps": 12, "faults": [gemm_fault()]}),
    "wgrad_x1_1": (RUN, {"steps": 12, "faults": [gemm_fault(gemm="wgrad")]}),
    "bf16_forward_x1_1": (RUN, {"steps": 12, "faults": [gemm_fault()], "autocast_bf16": True}),
    "accum2_forward_x1_1": (
        RUN,
        {"steps": 12, "grad_accum": 2, "faults": [gemm_fault(micro_batch=1)]},
    ),
    "layer_norm_x1_1": (
        RUN,
        {"steps": 12, "layer_norm": True, "faults": [gemm_fault("net.1")]},
    ),
    # The drill model's layers are 32 wide and see 8 rows: a check reads as many elements as
    # its GEMM multiplies, so the cost model (sensors/runtime/plan.py) rotates over DEFAULT_PERIOD
    # steps at the default 1%; the budget that the plan turns into an 11-step rotation (about
    # 89% when written; 25% before the calibration) fits the rotation between the 20-step
    # burn-in, the fault at 70 and the audit at 100.
    "persistent_rotating": (
        RUN,
        {
            "steps": 100,
            "audit_every": 100,
            "budget": budget_for_period(11),
            "faults": [gemm_fault("net.0", step=70, persistent=True)],
        },
    ),
    "noisy_sensor": (
        RUN,
        {"steps": 3, "config": {"warmup_checks": 1, "margin": 1e-6, "min_threshold": 1e-6}},
    ),
    "clean_fp32": (RUN, {"steps": CLEAN_STEPS}),
    "clean_bf16": (RUN, {"steps": CLEAN_STEPS, "autocast_bf16": True}),
    # A GPU that turns bad and stays bad (x1000 on one element of net.4's forward GEMM on R),
    # audits every X1000_AUDIT_EVERY (>= 1,000) steps, the default budget: from step 5, from the
    # job's first step, and from step 30 (after the burn-in: the rotation's bursts must find
    # it, so that run lasts one period past the fault; an alarm ends a run).
    **{
        f"x1000_from_{start}": (
            RUN,
            {
                "steps": max(400, start + DEFAULT_PERIOD + 1),
                "audit_every": X1000_AUDIT_EVERY,
                "budget": DEFAULT_BUDGET,
                "faults": [x1000_from("net.4", start, rank=R)],
            },
        )
        for start in (5, 0, LATE_START)
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


@pytest.mark.parametrize(
    "name, gemm",
    [
        ("forward_x1_1", "forward"),
        ("wgrad_x1_1", "wgrad"),
        ("bf16_forward_x1_1", "forward"),
        ("accum2_forward_x1_1", "forward"),  # 2nd of 2 micro-batches; a candidate replays both
    ],
)
def test_a_one_step_x1_1_in_one_gemm_is_a_candidate_that_step_confirmed_transient(
    results, name, gemm
):
    # Given x1.1 on one element of net.4's GEMM result on rank R at step 8 only (no audit)
    alarm = the_alarm(results, name)
    # Then the sensor of that GEMM raises a candidate at step 8, naming R
    assert (alarm["step"], alarm["check"], alarm["suspects"]) == (8, "compute", [R])
    candidates = alarm["sensor_candidates"]
    assert [(c["rank"], c["layer"], c["gemm"]) for c in candidates] == [(R, "net.4", gemm)]
    assert candidates[0]["ratio"] > candidates[0]["threshold"]
    # And the replays on the third GPU and on R confirm it transient
    assert alarm["verdicts"] == [{"pair": [R, R], "third": 5, "suspect": R, "kind": "transient"}]
    # And the step was not applied on any rank
    assert all(r["updates"] == list(range(8)) for r in results[name])
    assert results[name][0]["alarms_published"] == 1


def test_a_one_step_x1_1_in_a_layer_norm_output_is_a_candidate_confirmed_transient(results):
    # Given x1.1 on one element of rank R's protected LayerNorm output (net.1) at step 8 only
    alarm = the_alarm(results, "layer_norm_x1_1")
    # Then the norm's sensor raises the candidate that step; the replays confirm it transient
    assert (alarm["step"], alarm["suspects"]) == (8, [R])
    assert [(c["layer"], c["kind"]) for c in alarm["sensor_candidates"]] == [
        ("net.1", "layer_norm")
    ]
    assert [v["kind"] for v in alarm["verdicts"]] == ["transient"]
    assert all(r["updates"] == list(range(8)) for r in results["layer_norm_x1_1"])


def test_a_persistent_gemm_fault_is_named_by_the_rotation_well_before_the_next_audit(results):
    # Given a budget under which the GEMMs rotate, and x1.1 in net.0's forward GEMM on R
    # every step from step 70; the next audit is at step 100
    run = results["persistent_rotating"][0]
    period = run["coverage"]["period"]
    alarm = the_alarm(results, "persistent_rotating")
    # Then a sensor candidate names R within one rotation period, confirmed persistent
    assert 70 <= alarm["step"] < 70 + period < 100
    assert alarm["suspects"] == [R]
    assert [v["kind"] for v in alarm["verdicts"]] == ["persistent"]
    assert {(c["layer"], c["gemm"]) for c in alarm["sensor_candidates"]} == {("net.0", "forward")}
    # And the budget did rotate: not every GEMM is checked on every step
    rates = [r for layer in run["coverage"]["layers"].values() for r in layer.values()]
    assert period > 1 and max(rates) < 1.0 and min(rates) > 0.0


def test_an_unconfirmed_flag_is_counted_and_published_as_a_count_not_an_alarm(results):
    # Given sensors whose threshold is far below healthy rounding (every check flags)
    per_rank = results["noisy_sensor"]
    # Then the third GPUs' replays reproduce each flag: no alarm, every step applied,
    # and the unconfirmed flags are counted and published as a count
    assert all(r["alarm"] is None for r in per_rank)
    assert all(r["updates"] == [0, 1, 2] for r in per_rank)
    assert per_rank[0]["unconfirmed"] > 0
    assert per_rank[0]["published_unconfirmed"] == per_rank[0]["unconfirmed"]
    assert per_rank[0]["alarms_published"] == 0


@pytest.mark.parametrize("name", ["clean_fp32", "clean_bf16"])
def test_fault_free_runs_with_every_gemm_checked_raise_no_alarm_and_replays_stay_exact(
    results, name
):
    # Given CLEAN_STEPS fault-free steps with every GEMM of every protected layer checked on
    # every step, from the first check, with the default thresholds
    per_rank = results[name]
    assert set(per_rank[0]["coverage"]["layers"]["net.4"].values()) == {1.0}
    # Then no alarm is raised, on any rank, and every step is applied (a candidate a healthy
    # GPU reproduces is no alarm: it is counted, and the count is published, which is all
    # this pins: the count itself is the data's)
    assert all(r["alarm"] is None for r in per_rank)
    assert per_rank[0]["alarms_published"] == 0
    assert per_rank[0]["published_unconfirmed"] == per_rank[0]["unconfirmed"]
    assert all(r["unconfirmed"] == per_rank[0]["unconfirmed"] for r in per_rank)
    assert all(r["updates"] == list(range(CLEAN_STEPS)) for r in per_rank)
    # And the ranks agreed on their thresholds: one set, tighter than the first check's
    thresholds = per_rank[0]["coverage"]["thresholds"]
    assert thresholds["agreed"] and thresholds["in_force"][0] < thresholds["initial"]
    assert all(r["coverage"]["thresholds"] == thresholds for r in per_rank)
    # And every audit (each replaying a micro-batch bit for bit on another node) passed
    assert per_rank[0]["audit_passes"] == CLEAN_STEPS // 50
    assert per_rank[0]["last_audit_pass"] == CLEAN_STEPS - 50


@pytest.mark.parametrize("start", [5, 0])
def test_a_gpu_bad_from_the_start_is_named_in_the_burn_in_and_its_step_not_applied(results, start):
    # Given x1000 on one element of net.4's forward GEMM on rank R on every step from `start`
    # (0: the job's first step), audits every 1,000 steps and the default sensor budget
    name = f"x1000_from_{start}"
    alarm = the_alarm(results, name)
    # Then a sensor names R at that very step (within the burn-in, which checks every sensor
    # on every step), confirmed by the numbers of a third GPU's recomputation
    assert (alarm["step"], alarm["check"], alarm["suspects"]) == (start, "compute", [R])
    assert alarm["verdicts"] == [{"pair": [R, R], "third": 5, "suspect": R, "kind": "persistent"}]
    [candidate] = alarm["sensor_candidates"]
    assert (candidate["rank"], candidate["layer"], candidate["gemm"]) == (R, "net.4", "forward")
    assert candidate["ratio"] > 1e3 * candidate["threshold"]
    # And the step was not applied: on every rank the weights and optimizer state are
    # bit for bit those after the previous step (before the first, for a fault from step 0)
    per_rank = results[name]
    assert all(r["updates"] == list(range(start)) for r in per_rank)
    before = str(start - 1)
    assert all(r["final_digest"] == r["digests"][before] for r in per_rank)
    assert len({r["final_digest"] for r in per_rank}) == 1


def test_a_persistent_fault_after_the_burn_in_is_named_within_one_period_at_the_default_budget(
    results,
):

    # Given the same fault from step 30, after the 20-step burn-in, at the default budget
    run = results["x1000_from_30"][0]
    period = run["coverage"]["period"]
    alarm = the_alarm(results, "x1000_from_30")
    # Then the rotation's next burst names R: within one period, before the next audit (the
    # period the guard planned is the one this file planned its steps and audits by)
    assert period == DEFAULT_PERIOD
    assert 30 <= alarm["step"] < 30 + period < X1000_AUDIT_EVERY
    assert alarm["suspects"] == [R] and [v["kind"] for v in alarm["verdicts"]] == ["persistent"]
    # And the budget did rotate after the burn-in: one sensor step per period
    assert run["coverage"]["burn_in"] == 20 and period > 20
    assert all(r["updates"] == list(range(alarm["step"])) for r in results["x1000_from_30"])

"""The sensors' budget, verdicts, faults, report key and published count: pure logic."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import sdc_agent as sdc
from sdc_agent import faults
from sdc_agent.alarm import Alarm, SensorCandidate
from sdc_agent.checks.replay.attribution import Outcome
from sdc_agent.publish.events import liveness_metric_data
from sdc_agent.publish.liveness import LivenessBatch
from sdc_agent.sensors import ProtectedLinear, protect
from sdc_agent.sensors.check import sensor_verdict
from sdc_agent.sensors.plan import plan_sensors, sensor_costs


def board_of(*shapes: tuple[int, int]):
    return protect(nn.Sequential(*(nn.Linear(k, n) for k, n in shapes)))


def test_the_rotation_stays_under_the_budget_and_checks_every_gemm_within_its_period():
    # Given a model of wide and narrow layers and a 1% budget
    board = board_of((512, 2048), (2048, 512), (64, 64))
    plan = plan_sensors(board, 0.01)
    costs = sensor_costs(board)
    # Then every sensor is in some group, each group stays within the budget (a sensor
    # costing more than the budget alone is followed by empty steps), on average too
    assert set().union(*plan.groups) == set(range(len(board)))
    for group in plan.groups:
        assert len(group) == 1 or sum(costs[i] for i in group) <= 0.01
    assert plan.mean_cost <= 0.01 + 1e-12
    # And the plan is a pure function of the step: step s and s + period check the same GEMMs
    assert all(plan.active(s) == plan.active(s + plan.period) for s in range(plan.period))
    assert all(plan.rate(i) >= 1 / plan.period for i in range(len(board)))


def test_an_infinite_budget_checks_every_gemm_every_step():
    plan = plan_sensors(board_of((16, 32), (32, 4)), math.inf)
    assert plan.period == 1 and plan.active(7) == frozenset(range(6))


def test_a_check_costs_about_one_over_the_layer_width_of_its_gemm():
    # A 1024 -> 4096 layer: each check is O(1/N + 1/K) of its own GEMM
    costs = sensor_costs(board_of((1024, 4096)))
    own_gemm = 1 / 3  # one of the layer's three GEMMs
    assert all(c / own_gemm < 4 * (1 / 1024 + 1 / 4096) for c in costs)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"sensors": 1}, "sensors"),
        ({"sensor_budget": 0}, "sensor_budget"),
        ({"sensor_budget": math.nan}, "sensor_budget"),
        ({"sensor_budget": True}, "sensor_budget"),
    ],
)
def test_schedule_validates_the_sensor_fields(kwargs, field):
    with pytest.raises(ValueError, match=field):
        sdc.Schedule(**kwargs)


def test_schedule_defaults_leave_an_unprotected_model_unchanged_and_budget_one_percent():
    schedule = sdc.Schedule()
    assert schedule.sensors is True and schedule.sensor_budget == 0.01


OK = Outcome(loss_bits=1, grad_digest=(2, 3), finite=True)
OTHER = Outcome(loss_bits=9, grad_digest=(2, 3), finite=True)


@pytest.mark.parametrize(
    "third_fired, again, again_fired, expected",
    [
        (True, OK, True, ("reproducible", "")),  # a healthy GPU reads the same: numerics
        (False, OK, True, ("persistent", "target")),
        (False, OTHER, False, ("persistent", "target")),  # fails again, unseen by the sensor
        (False, OK, False, ("transient", "target")),
    ],
)
def test_sensor_verdicts(third_fired, again, again_fired, expected):
    assert sensor_verdict(OK, third_fired, again, again_fired, compare_grads=True) == expected


def test_gemm_faults_refuse_unknown_gemms_and_corrupt_exactly_one_element():
    with pytest.raises(ValueError, match="gemm"):
        faults.ScaleGemmElement("fc", gemm="backward", rank=0)
    with pytest.raises(ValueError, match="bit"):
        faults.FlipGemmBit("fc", bit=32, rank=0)
    result = torch.ones(4, 4)
    faults.ScaleGemmElement("fc", index=21, factor=1.1, rank=0).corrupt_(result.view(-1), 21 % 16)
    assert (result != 1).nonzero().tolist() == [[1, 1]] and result[1, 1] == pytest.approx(1.1)
    faults.FlipGemmBit("fc", bit=30, rank=0).corrupt_(result.view(-1), 0)
    assert result[0, 0] != 1


def test_a_gemm_fault_on_an_unprotected_layer_says_to_protect_it():
    class FakeGuard:
        module = nn.Sequential(nn.Linear(2, 2))
        current_step = 0

    fault = faults.ScaleGemmElement("0", rank=0)
    with pytest.raises(ValueError, match="protect"):
        fault._install(FakeGuard())
    protect(FakeGuard.module)
    fault._install(FakeGuard())
    assert isinstance(FakeGuard.module[0], ProtectedLinear)
    assert FakeGuard.module[0].gemm_taps == [fault._tap]
    fault.detach()
    assert FakeGuard.module[0].gemm_taps == []


def test_the_report_has_sensor_candidates_only_when_a_sensor_raised_the_alarm():
    plain = Alarm(step=3, check="compute")
    assert "sensor_candidates" not in plain.to_dict()
    sensed = Alarm(
        step=3,
        check="compute",
        sensor_candidates=[
            SensorCandidate(rank=2, layer="fc", gemm="wgrad", ratio=40.0, threshold=3.0)
        ],
    ).to_dict()
    assert sensed["schema"] == "sdc.alarm/v1"
    assert sensed["sensor_candidates"] == [
        {
            "rank": 2,
            "layer": "fc",
            "gemm": "wgrad",
            "ratio": 40.0,
            "threshold": 3.0,
            "kind": "linear",
        }
    ]


def test_unconfirmed_sensor_flags_travel_with_liveness_and_only_when_nonzero():
    batch = LivenessBatch(interval=60.0)
    assert batch.add(5, 0, 0, unconfirmed_sensor_flags=2)  # wakes the sender
    counts = batch.take(0.0)
    assert counts is not None and counts.unconfirmed_sensor_flags == 2
    names = [d["MetricName"] for d in liveness_metric_data("c", "j", 1, 0, 2)]
    assert names == ["sdc_audit_pass", "sdc_weight_check_pass", "sdc_unconfirmed_sensor_flags"]
    assert len(liveness_metric_data("c", "j", 1, 0)) == 2


def test_the_guards_sensor_coverage_says_what_is_checked_and_at_what_rate():
    from sdc_agent.sensors.check import SensorCheck

    # Given an unprotected model, a protected one with sensors off, and one at a 1% budget
    plain = nn.Sequential(nn.Linear(64, 64))
    off = SensorCheck(plain, sdc.Schedule())
    protected = nn.Sequential(nn.Linear(64, 256), nn.LayerNorm(256), nn.Linear(256, 64))
    protect(protected)
    disabled = SensorCheck(protected, sdc.Schedule(sensors=False))
    on = SensorCheck(protected, sdc.Schedule(sensor_budget=0.01))
    # Then before the protected model has run, the plan waits for the batch's rows
    assert on.enabled and not on.checks_at(0)
    waiting = on.describe()
    assert waiting["planned"] is False and waiting["period"] is None
    assert waiting["layers"]["0"] == {"forward": None, "dgrad": None, "wgrad": None}
    # When it has run a batch of 32 rows
    protected(torch.randn(32, 64))
    # Then only the last checks anything, every protected op at a rate of one per period
    assert not off.enabled and off.describe()["on"] is False
    assert not disabled.enabled and not disabled.checks_at(0)
    report = on.describe()
    assert report["planned"] and report["rows"] == 32 and report["device"] == "cpu"
    assert report["on"] and report["kinds"] == {"0": "linear", "1": "layer_norm", "2": "linear"}
    assert set(report["layers"]["0"]) == {"forward", "dgrad", "wgrad"}
    assert set(report["layers"]["1"]) == {"forward", "dgrad"}  # its output and its input gradient
    rates = [r for layer in report["layers"].values() for r in layer.values()]
    assert min(rates) >= 1 / report["period"] and report["estimated_cost"] <= 0.01 + 1e-12
    # And the guard plans in bursts: every sensor on one step of each period, none between
    assert report["period"] > 1
    assert [on.checks_at(s) for s in range(report["period"])] == [True] + [False] * (
        report["period"] - 1
    )


def test_the_memory_model_rotates_a_narrow_layer_slower_than_the_flop_model():
    # Given a 1024-wide layer seeing 128 rows on the CPU
    board = board_of((1024, 1024))
    by_flops = sensor_costs(board)
    by_reads = sensor_costs(board, rows=128, device_type="cpu")
    # Then its weight passes and the CPU's read cost make each check cost ~9% of its GEMM
    # (measured: 8-9%), where flops alone say ~0.1%
    own_gemm = 1 / 3
    assert all(0.05 < c / own_gemm < 0.15 for c in by_reads[:2])
    assert all(c / own_gemm < 0.005 for c in by_flops)
    # And more rows amortise the weight passes; a GPU's reads cost more than the CPU's
    assert sensor_costs(board, rows=8192, device_type="cpu")[0] < by_reads[0]
    assert sensor_costs(board, rows=128, device_type="cuda")[0] > by_reads[0]
    # And the plan at 1% rotates: every check within the period, the average under budget
    plan = plan_sensors(board, 0.01, rows=128, device_type="cpu")
    assert plan.period > 3 and plan.mean_cost <= 0.01 + 1e-12
    with pytest.raises(ValueError, match="rows"):
        sensor_costs(board, rows=0)


def test_a_burst_plan_checks_every_gemm_as_often_as_the_rotation_on_fewer_steps():
    # Given a model whose checks cost more than the budget in one step
    board = board_of((512, 2048), (2048, 512), (64, 64))
    rotation = plan_sensors(board, 0.01, rows=256, device_type="cpu")
    burst = plan_sensors(board, 0.01, rows=256, device_type="cpu", burst=True)
    # Then the burst checks every GEMM on one step per period and nothing between
    assert burst.groups[0] == frozenset(range(len(board)))
    assert all(not g for g in burst.groups[1:]) and burst.period > 1
    # And it stays within the budget on average, each GEMM checked about as often
    assert burst.mean_cost <= 0.01 + 1e-12
    assert all(burst.rate(i) >= 1 / burst.period for i in range(len(board)))
    assert abs(burst.period - rotation.period) <= len(board)
    # And sensor steps are one per period instead of (nearly) every step
    sensor_steps = sum(bool(g) for g in rotation.groups)
    assert sum(bool(g) for g in burst.groups) == 1 < sensor_steps


def test_sensors_refused_by_the_parallelism_stay_off_and_say_why():
    from sdc_agent.sensors.check import SensorCheck

    model = nn.Sequential(nn.Linear(8, 8))
    protect(model)
    check = SensorCheck(model, sdc.Schedule(), unsupported="DDP only")
    assert not check.enabled and check.describe() == {"on": False, "why": "DDP only", "layers": {}}

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
from sdc_agent.checks.sensors.check import SensorReading, sensor_verdict
from sdc_agent.publish.events import liveness_metric_data
from sdc_agent.publish.liveness import LivenessBatch
from sdc_agent.sensors import SensorConfig, protect
from sdc_agent.sensors.ops.linear import ProtectedLinear
from sdc_agent.sensors.runtime.board import agreed_thresholds
from sdc_agent.sensors.runtime.plan import plan_sensors, sensor_costs


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
        ({"sensor_burn_in": -1}, "sensor_burn_in"),
        ({"sensor_burn_in": 2.5}, "sensor_burn_in"),
        ({"sensor_burn_in": True}, "sensor_burn_in"),
    ],
)
def test_schedule_validates_the_sensor_fields(kwargs, field):
    with pytest.raises(ValueError, match=field):
        sdc.Schedule(**kwargs)


def test_schedule_defaults_leave_an_unprotected_model_unchanged_and_budget_one_percent():
    schedule = sdc.Schedule()
    assert schedule.sensors is True and schedule.sensor_budget == 0.01
    assert schedule.sensor_burn_in == 20  # every sensor every step for the first 20 steps


OK = Outcome(loss_bits=1, grad_digest=(2, 3), finite=True)
OTHER = Outcome(loss_bits=9, grad_digest=(2, 3), finite=True)
OTHER_GRADS = Outcome(loss_bits=1, grad_digest=(2, 4), finite=True)


def reading(original: float, third: float, again: float | None = None, threshold: float = 3.27):
    return SensorReading(
        threshold=threshold,
        original=original,
        third=third,
        again=original if again is None else again,
    )


# The verdict is the numbers', not a rank's own flag (these rows replace the ones that read
# "the third GPU's sensor fired" and "the flagged rank's replay fired" against each rank's own
# learned threshold: that rule named a healthy GPU).
@pytest.mark.parametrize(
    "readings, again, compare_grads, expected",
    [
        # a healthy GPU reproduces the ratio to the bit: the data's numerics
        ([reading(3.33, 3.33)], OK, True, ("reproducible", "")),
        # x1000 on one element: the third GPU reads rounding, the rank's own replay too
        ([reading(2.4e6, 0.8, again=0.7)], OK, True, ("transient", "target")),
        # ... and the rank's own replay reads it again: persistent
        ([reading(2.4e6, 0.8, again=2.1e6)], OK, True, ("persistent", "target")),
        # a NaN/Inf checksum the third GPU does not reproduce
        ([reading(math.inf, 0.5, again=0.5)], OK, True, ("transient", "target")),
        # ... and one it reproduces (an overflow of the data): nobody
        ([reading(math.inf, math.inf)], OK, True, ("reproducible", "")),
        # deterministic replays that differ in their bits: the rank computes wrong now
        ([reading(3.5, 3.4, again=3.4)], OTHER_GRADS, True, ("persistent", "target")),
        ([reading(3.5, 3.4, again=3.4)], OTHER, True, ("persistent", "target")),
        # one of two flagged sensors stands apart: confirmed
        ([reading(3.4, 3.4), reading(50.0, 0.9, again=0.9)], OK, True, ("transient", "target")),
    ],
)
def test_sensor_verdicts_by_the_numbers(readings, again, compare_grads, expected):
    assert sensor_verdict(readings, OK, again, compare_grads=compare_grads) == expected


def test_a_healthy_ratio_between_two_ranks_learned_thresholds_names_nobody():
    # Given the false alarm this replaces: rank 2's own warm-up had learned 3.27, the third
    # GPU's a higher one, and rank 2's q_proj forward read a healthy 3.33, which the third GPU
    # recomputed bit for bit (the replays' outcomes identical)
    ratio, own, third_gpus = 3.33, 3.27, 3.6
    old_rule_would_name = ratio > own and not ratio > third_gpus
    assert old_rule_would_name
    # When both ranks judge it against the one threshold they agreed on (whatever it is), and
    # the verdict reads the numbers: the third GPU reproduced the very ratio
    for agreed in (own, third_gpus, 3.0):
        found = sensor_verdict(
            [reading(ratio, ratio, threshold=agreed)], OK, OK, compare_grads=True
        )
        # Then the verdict is reproducible: counted, never an alarm
        assert found == ("reproducible", "")
    # And the thresholds the ranks agree on are the same whichever rank computes them
    learned = torch.tensor([[0.81], [0.95], [0.82], [0.9], [0.78], [0.84]])
    seen = torch.ones_like(learned)
    current = torch.tensor([12.0])
    views = [agreed_thresholds(learned, seen, current, SensorConfig()) for _ in range(6)]
    assert all(torch.equal(v, views[0]) for v in views)


@pytest.mark.parametrize(
    "original, third, compare_grads, expected",
    [
        # non-deterministic replays: a recomputation is a fresh draw of the rounding, so a
        # healthy tail ratio just above the threshold may come back just under it, or anywhere
        # in the healthy range: not enough to name a GPU
        (3.33, 3.25, False, "reproducible"),
        (3.33, 0.8, False, "reproducible"),
        (6.0, 0.8, False, "reproducible"),  # within twice the threshold: still rounding's
        (7.0, 0.8, False, "transient"),  # beyond twice the threshold, and 2x the healthy one
        (2.4e6, 3.0, False, "transient"),
        # deterministic replays: a healthy recomputation reproduces the ratio to the bit, so
        # just above the threshold and clearly apart from the healthy reading is a fault
        (3.33, 3.25, True, "reproducible"),  # just under the threshold: not apart (< 2x)
        (3.33, 1.5, True, "transient"),
        (3.33, 1.7, True, "reproducible"),  # the healthy GPU's reading is more than half
    ],
)
def test_the_verdict_needs_a_decisive_separation_from_the_healthy_recomputation(
    original, third, compare_grads, expected
):
    found = sensor_verdict(
        [reading(original, third, again=third)], OK, OK, compare_grads=compare_grads
    )
    assert found[0] == expected


def test_ranks_agree_on_a_threshold_that_only_tightens_and_no_rank_teaches_itself():
    config = SensorConfig()  # margin 4, floor 3, first-check threshold 12
    current = torch.full((4,), 12.0)
    # Given 6 ranks' largest healthy ratios for 4 sensors: sensor 0 alike everywhere, sensor 1
    # with rank 3 faulty from step 0 (its ratios 9, under the first-check threshold), sensor 2
    # with tiny ratios, sensor 3 never checked on two ranks and on four with large ones
    learned = torch.tensor(
        [
            [0.9, 0.7, 0.1, 0.0],
            [0.8, 0.8, 0.2, 0.0],
            [1.0, 0.6, 0.1, 2.9],
            [0.7, 9.0, 0.1, 3.1],
            [0.9, 0.7, 0.2, 3.0],
            [0.8, 0.8, 0.1, 3.2],
        ]
    )
    seen = torch.ones_like(learned)
    seen[:2, 3] = 0
    agreed = agreed_thresholds(learned, seen, current, config)
    # Then: 4 x the lower median (0.8, 0.7), the floor of 3, and never above what was in force
    assert agreed.tolist() == pytest.approx([3.2, 3.0, 3.0, 12.0])
    # And rank 3's faulty 9 taught nothing: it stays above its sensor's agreed threshold
    assert learned[3, 1] > agreed[1]
    # And with two ranks the lower one decides: a faulty rank cannot raise it
    pair = agreed_thresholds(torch.tensor([[0.9], [2.9]]), torch.ones(2, 1), current[:1], config)
    assert pair.tolist() == pytest.approx([3.6])
    # And a sensor no rank observed healthy keeps the threshold in force
    assert (
        agreed_thresholds(learned, torch.zeros_like(learned), current, config).tolist()
        == [12.0] * 4
    )


def test_a_board_flags_from_its_first_check_and_an_outlier_is_judged_not_learned():
    # Given a protected layer (three sensors) that has never checked before
    layer = ProtectedLinear(32, 64, name="fc")
    board = layer.sensor_board
    x = torch.randn(16, 32)

    def step(corrupt=None):
        layer.gemm_taps[:] = [corrupt] if corrupt else []
        board.arm(frozenset(range(3)))
        xg = x.clone().requires_grad_()
        layer(xg).square().sum().backward()

    # When its very first check reads x1000 on one element of the forward GEMM
    step(lambda name, r: r.view(-1)[3].mul_(1000.0) if name == "forward" else None)
    flags, ratios = board.take_flags()
    # Then it flags (the first-check threshold holds from the first check)
    assert flags.tolist() == [1, 0, 0] and float(ratios[0]) > 1e3
    # Given a rank whose GPU adds a small persistent error (ratio ~ 6, under the first-check
    # threshold) through the observation window, among five healthy ranks
    board = ProtectedLinear(32, 64, name="fc").sensor_board
    healthy = torch.tensor([[0.6, 0.5, 0.9], [1.0, 1.0, 1.0]])
    faulty = torch.tensor([[6.0, 0.5, 0.9], [1.0, 1.0, 1.0]])
    observed = torch.stack([healthy] * 3 + [faulty] + [healthy] * 2)
    board.arm(frozenset(range(3)))
    board.record(0, torch.tensor(6.0))  # this rank's reading at the agreement step
    outliers = board.agree(observed)
    # Then the ranks agree on 4 x 0.6 -> the floor of 3, the faulty rank is an outlier that
    # taught nothing, and its reading on this very step flags against the agreed threshold
    assert board.thresholds() == pytest.approx([3.0, 3.0, 3.6])
    assert [(o.dp_rank, o.sensor) for o in outliers] == [(3, 0)]
    assert board.take_flags()[0].tolist() == [1, 0, 0]
    assert not board.learning


def test_a_ratio_a_healthy_gpu_reproduced_relaxes_its_sensor_alone():
    board = ProtectedLinear(8, 8, name="fc").sensor_board
    board.agree_alone()  # nothing observed: the first-check thresholds stay
    board.agree(torch.tensor([[[0.5, 0.5, 0.5], [1.0, 1.0, 1.0]]]))
    assert board.thresholds() == [3.0, 3.0, 3.0]
    # A reproduced 3.4 raises that sensor to twice it; a smaller one changes nothing
    assert board.relax(1, 3.4) == pytest.approx(6.8)
    assert board.relax(1, 1.0) == pytest.approx(6.8)
    assert board.relax(2, math.inf) == 3.0
    assert board.thresholds() == pytest.approx([3.0, 6.8, 3.0]) and board.relaxed == 1
    # And a healthy tail a third GPU reproduced above the first-check threshold raises it
    # there too: otherwise every check would replay it again
    assert board.relax(0, 10.0) == pytest.approx(20.0)
    assert board.thresholds()[0] > board.config.initial_threshold


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
    from sdc_agent.checks.sensors.check import SensorCheck

    # Given an unprotected model, a protected one with sensors off, and one at a 1% budget
    plain = nn.Sequential(nn.Linear(64, 64))
    off = SensorCheck(plain, sdc.Schedule())
    protected = nn.Sequential(nn.Linear(64, 256), nn.LayerNorm(256), nn.Linear(256, 64))
    protect(protected)
    disabled = SensorCheck(protected, sdc.Schedule(sensors=False))
    on = SensorCheck(protected, sdc.Schedule(sensor_budget=0.01, sensor_burn_in=0))
    burning = SensorCheck(protected, sdc.Schedule(sensor_budget=0.01))  # the default burn-in
    # Then before the protected model has run, the plan waits for the batch's rows, but the
    # burn-in checks every sensor from the first step (it needs no plan)
    assert on.enabled and not on.checks_at(0)
    assert burning.active(5) == frozenset(range(8))
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
    # And with the default burn-in every sensor checks on each of the first 20 steps from
    # the guard's first one (5 here), then the same bursts
    period = report["period"]
    assert all(burning.active(s) == frozenset(range(8)) for s in range(5, 25))
    after = [burning.checks_at(s) for s in range(25, 25 + 2 * period)]
    assert sum(after) == 2 and all(after[i] == ((i + 25) % period == 0) for i in range(len(after)))
    burnt = burning.describe()
    assert burnt["burn_in"] == 20 and "first 20 steps" in burnt["covers"]
    assert f"once every {period} steps" in burnt["covers"]
    # And the thresholds section says how they are set and agreed
    thresholds = burnt["thresholds"]
    assert thresholds["initial"] == 12.0 and thresholds["in_force"] == [12.0, 12.0]
    assert thresholds["agreed"] is False and "median" in thresholds["how"]


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
    from sdc_agent.checks.sensors.check import SensorCheck

    model = nn.Sequential(nn.Linear(8, 8))
    protect(model)
    check = SensorCheck(model, sdc.Schedule(), unsupported="DDP only")
    assert not check.enabled and check.describe() == {"on": False, "why": "DDP only", "layers": {}}


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("data", ["randn", "positive", "offset"])
def test_healthy_first_checks_stay_under_the_first_check_threshold_across_shapes(bf16, data):
    # Given fresh protected layers of narrow to wide shapes (never checked before: no agreed
    # threshold yet), and data that does not cancel (all-positive, or offset by 30)
    gen = torch.Generator().manual_seed(5)
    shapes = [(4, 32, 8), (32, 4, 8), (64, 256, 32), (256, 64, 256), (256, 512, 128)]
    for k, n, rows in shapes:
        torch.manual_seed(k + n)
        model = nn.Sequential(nn.Linear(k, n), nn.LayerNorm(n), nn.Softmax(dim=-1))
        board = protect(model)
        for _ in range(3):
            x = torch.randn(rows, k, generator=gen)
            x = x.clamp_min(0) if data == "positive" else x + 30 if data == "offset" else x
            board.arm(frozenset(range(len(board))))
            x.requires_grad_()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                y = model(x)
            (y.float() * torch.randn(y.shape, generator=gen)).sum().backward()
            flags, ratios = board.take_flags()
            # Then no sensor flags on its first checks, in fp32 or bf16
            assert not flags.any(), (k, n, rows, ratios.tolist())
            assert float(ratios.max()) < board.config.initial_threshold / 2

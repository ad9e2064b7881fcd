"""One configuration tree (issue 33): ``GuardConfig(audit=, weights=, sensors=, training=)``,
validated with errors that name the tree's field, mapped one to one onto the flat ``Schedule``
that earlier code still passes (its names and keywords are kept)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sdc_agent as sdc
from sdc_agent.config import FIELDS
from sdc_agent.sensors import SensorConfig


@pytest.fixture(autouse=True)
def node(monkeypatch):
    """The one rank's node name (the guard's rank map reads it)."""
    monkeypatch.setenv("NODE_NAME", "hyperpod-i-0000000000000000a")


def test_every_schedule_field_is_in_the_tree_once():
    # Given the table of which tree field is which Schedule field
    flat = [name for names in FIELDS.values() for name in names.values()]
    # Then it names each of Schedule's fields exactly once, and every tree field is a field
    assert sorted(flat) == sorted(f.name for f in dataclasses.fields(sdc.Schedule))
    for component, names in FIELDS.items():
        kind = type(getattr(sdc.GuardConfig(), component))
        assert set(names) <= {f.name for f in dataclasses.fields(kind)}


def test_a_schedule_maps_onto_the_tree_and_back():
    # Given a schedule with every field away from its default
    schedule = sdc.Schedule(
        audit_every=7,
        deterministic_audits=False,
        check_every=3,
        ckpt_every=9,
        peer_offset=4,
        check_on_checkpoint=False,
        check_on_start=False,
        max_grad_norm=1.5,
        grad_accum=2,
        sensors=False,
        sensor_budget=math.inf,
        sensor_burn_in=0,
        on_setup_error="stop",
        max_skipped_audits=3,
    )
    # When it is mapped onto the tree
    config = sdc.GuardConfig.from_schedule(schedule)
    # Then each value sits where the tree names it, and the flat view is the same schedule
    assert config.audit.every == 7 and config.audit.peer_offset == 4
    assert config.weights.every == 3 and config.weights.on_start is False
    assert config.sensors.budget == math.inf and config.sensors.enabled is False
    assert config.training.grad_accum == 2 and config.training.ckpt_every == 9
    assert config.schedule() == schedule
    # And the defaults agree
    assert sdc.GuardConfig().schedule() == sdc.Schedule()


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: sdc.AuditConfig(every=-1), "GuardConfig.audit.every must be an integer >= 0"),
        (lambda: sdc.AuditConfig(peer_offset=0), "GuardConfig.audit.peer_offset must be"),
        (lambda: sdc.AuditConfig(on_setup_error="ignore"), "GuardConfig.audit.on_setup_error"),
        (lambda: sdc.AuditConfig(max_skipped=-2), "GuardConfig.audit.max_skipped must be"),
        (lambda: sdc.WeightsConfig(every=1.5), "GuardConfig.weights.every must be an integer"),
        (lambda: sdc.SensorsConfig(budget=0), "GuardConfig.sensors.budget must be a number > 0"),
        (lambda: sdc.SensorsConfig(burn_in=-1), "GuardConfig.sensors.burn_in must be"),
        (lambda: sdc.SensorsConfig(enabled="yes"), "GuardConfig.sensors.enabled must be"),
        (lambda: sdc.TrainingConfig(grad_accum=0), "GuardConfig.training.grad_accum must be"),
        (lambda: sdc.TrainingConfig(max_grad_norm=-1.0), "GuardConfig.training.max_grad_norm"),
    ],
)
def test_a_bad_value_is_refused_naming_the_tree_field(build, message):
    # When a component is built with a bad value, then the error names its field in the tree
    with pytest.raises(ValueError, match=message.replace(".", r"\.")) as raised:
        build()
    assert "Schedule." not in str(raised.value)


def test_a_component_in_the_wrong_place_is_refused():
    with pytest.raises(TypeError, match=r"GuardConfig\.audit must be a sdc_agent\.AuditConfig"):
        sdc.GuardConfig(audit=sdc.WeightsConfig())
    with pytest.raises(TypeError, match=r"thresholds must be a sdc_agent\.sensors\.SensorConfig"):
        sdc.SensorsConfig(thresholds={"margin": 2.0})


def _guard(**kwargs) -> sdc.Guard:
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(8, 3))
    if kwargs.pop("protected", False):
        sdc.protect(module, config=kwargs.pop("protect_config", None))
    ddp = nn.parallel.DistributedDataParallel(module)
    return sdc.Guard(
        ddp,
        torch.optim.SGD(ddp.parameters(), lr=0.1),
        compute_loss=lambda model, b: F.cross_entropy(model(b[0]), b[1]),
        rebuild_batch=lambda step, rank: (torch.randn(4, 8), torch.randint(0, 3, (4,))),
        **kwargs,
    )


def test_a_guard_runs_on_the_tree(calls):
    # Given a guard configured by the tree
    config = sdc.GuardConfig(
        audit=sdc.AuditConfig(every=0),
        weights=sdc.WeightsConfig(every=0, on_start=False),
        training=sdc.TrainingConfig(grad_accum=2),
    )
    guard = _guard(config=config)
    # Then the checks read its flat view, and the guard hands the tree back
    assert guard.config is config
    assert guard.schedule.grad_accum == 2 and guard.schedule.check_every == 0
    # And a guard given a schedule has that schedule's tree
    flat = _guard(schedule=sdc.Schedule(audit_every=0, check_on_start=False, peer_offset=2))
    assert flat.config.audit.peer_offset == 2 and flat.config.schedule() == flat.schedule


def test_schedule_and_config_together_are_refused(calls):
    with pytest.raises(TypeError, match="schedule= or config=, not both"):
        _guard(schedule=sdc.Schedule(), config=sdc.GuardConfig())


def test_the_trees_thresholds_reach_the_sensors(calls):
    # Given a protected model and thresholds in the tree
    thresholds = SensorConfig(warmup_checks=0, margin=6.0)
    config = sdc.GuardConfig(
        audit=sdc.AuditConfig(every=0),
        weights=sdc.WeightsConfig(on_start=False),
        sensors=sdc.SensorsConfig(thresholds=thresholds),
    )
    guard = _guard(protected=True, config=config)
    # Then the sensors hold them (and no longer learn: warmup_checks=0)
    board = guard._run.sensors.board
    assert board.config == thresholds and board.learning is False
    # And thresholds given to protect and, differently, to the tree are refused
    with pytest.raises(ValueError, match="thresholds were given twice"):
        _guard(protected=True, protect_config=SensorConfig(margin=5.0), config=config)


def test_the_report_component_switches_the_workload_record(calls):
    # Given a guard told to record no workload, and one left at the default
    quiet = _guard(
        config=sdc.GuardConfig(
            audit=sdc.AuditConfig(every=0),
            weights=sdc.WeightsConfig(on_start=False),
            report=sdc.ReportConfig(workload=False),
        )
    )
    # Then the first has no recorder (no hooks on the model), the second records
    assert quiet._run.workload is None
    assert quiet.config.report.workload is False
    default = _guard(schedule=sdc.Schedule(audit_every=0, check_on_start=False))
    assert default._run.workload is not None and default.config.report.workload is True
    # And the switch changes no check: the flat view is the same
    assert (
        quiet.config.schedule()
        == sdc.GuardConfig(
            audit=sdc.AuditConfig(every=0), weights=sdc.WeightsConfig(on_start=False)
        ).schedule()
    )


def test_a_report_switch_that_is_not_a_bool_is_refused():
    with pytest.raises(TypeError, match=r"GuardConfig\.report\.workload must be True or False"):
        sdc.ReportConfig(workload="no")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"GuardConfig\.report must be a sdc_agent\.ReportConfig"):
        sdc.GuardConfig(report=sdc.TrainingConfig())  # type: ignore[arg-type]

"""The sensors in a guard on one rank: the start-up warning for an unprotected model, the
burn-in, and what the sensors cost in collectives per step (a one-rank gloo group whose
collectives ``calls`` records, tests/unit/conftest.py)."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sdc_agent as sdc
from sdc_agent.sensors import SensorConfig

PARAMS = 16 * 32 + 32 + 32 * 4 + 4
"""The model's parameters: DDP's one gradient bucket (not a collective of ours)."""


@pytest.fixture(autouse=True)
def node(monkeypatch):
    """The one rank's node name (the guard's rank map reads it)."""
    monkeypatch.setenv("NODE_NAME", "hyperpod-i-0000000000000000a")


def batch(step: int, rank: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)


def loss_of(model: nn.Module, b: tuple) -> torch.Tensor:
    return F.cross_entropy(model(b[0]), b[1])


def guard_of(protected: bool, config: SensorConfig | None = None, **schedule) -> sdc.Guard:
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
    if protected:
        sdc.protect(module, config=config)
    ddp = nn.parallel.DistributedDataParallel(module)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    return sdc.Guard(
        ddp,
        optimizer,
        compute_loss=loss_of,
        rebuild_batch=batch,
        schedule=sdc.Schedule(audit_every=0, check_every=0, check_on_start=False, **schedule),
    )


def test_an_unprotected_model_is_named_at_start_with_the_line_that_protects_it(calls, caplog):
    # Given the default Schedule (sensors=True) and a model nobody passed to sdc.protect
    with caplog.at_level(logging.WARNING, logger="sdc_agent"):
        guard_of(protected=False)
    # Then one warning at start says no sensor checks it, and which line to add
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "no online sensor" in warning and "`sdc.protect(model)`" in warning
    assert "before wrapping it in DDP or fully_shard" in warning
    # And neither a protected model nor sensors=False is warned about
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="sdc_agent"):
        guard_of(protected=True)
        guard_of(protected=False, sensors=False)
    assert not [r for r in caplog.records if "no online sensor" in r.getMessage()]


def run_steps(guard: sdc.Guard, steps: range, calls: list) -> dict[int, list]:
    """Train ``steps`` through the step API; the collectives each one issued."""
    per_step = {}
    for step in steps:
        before = len(calls)
        with guard.step(step) as guarded:
            loss = loss_of(guard.model, batch(step))
            loss.backward()
            assert guarded.check_gradients(loss) is None
            guard.optimizer.step()
            guard.optimizer.zero_grad(set_to_none=True)
        per_step[step] = [c for c in calls[before:] if c != ("all_reduce", PARAMS)]
    return per_step


def test_the_burn_in_checks_every_step_then_the_budget_rotates_and_agreement_costs_one_gather(
    calls,
):
    # Given a protected model, a 4-step burn-in, a 3-sensor-step observation window and a
    # budget whose plan puts one sensor step in several
    guard = guard_of(
        protected=True,
        config=SensorConfig(warmup_checks=3),
        sensor_burn_in=4,
        sensor_budget=0.05,
    )
    board = guard._run.sensors.board
    # When it trains 3 periods' worth of steps from step 10 (a resumed job)
    per_step = run_steps(guard, range(10, 14), calls)
    period = guard._run.sensors.plan.period
    per_step.update(run_steps(guard, range(14, 14 + 3 * period), calls))
    # Then every step of the burn-in checked every sensor (steps 10-13), and afterwards only
    # the plan's burst steps did
    sensed = [s for s in range(10, 14 + 3 * period) if guard._run.sensors.checks_at(s)]
    assert sensed[:4] == [10, 11, 12, 13] and period > 1
    assert sensed[4:] == [s for s in range(14, 14 + 3 * period) if s % period == 0]
    # And the ranks agreed on the thresholds at the third sensor step (one all-gather of
    # 2 x 6 observations), on top of the plan's one all-reduce of the rows at the second step
    assert ("all_gather", 2 * len(board)) in per_step[12]
    assert sum(("all_gather", 2 * len(board)) in c for c in per_step.values()) == 1
    assert not board.learning and board.thresholds() != [board.config.initial_threshold] * 6
    # And a clean step that checks nothing costs check 1's one reduction of four integers,
    # exactly as without sensors
    quiet = [s for s in range(14, 14 + 3 * period) if s not in sensed and s > 14]
    assert quiet and all(per_step[s] == [("all_reduce", 4)] for s in quiet)


def test_the_kernels_backends_are_chosen_at_construction_not_in_the_first_forward(
    calls, monkeypatch
):
    """On a GPU with Triton the fingerprint and checksum kernels compile and self-check (a sync
    each) when their backend is first chosen: the Guard chooses it at construction, so the first
    forward and backward of training pay neither."""
    import importlib

    import sdc_agent._coordinator as guard_module
    from sdc_agent.sensors.maths import abft

    fingerprint = importlib.import_module("sdc_agent.fingerprint")  # the package exports a
    # function of the same name

    chosen: list[tuple[str, torch.device]] = []
    real_fp, real_sensor = guard_module.prepare_backend, guard_module.sensor_backend
    monkeypatch.setattr(
        guard_module,
        "prepare_backend",
        lambda d: chosen.append(("fingerprint", d)) or real_fp(d),
    )
    monkeypatch.setattr(
        guard_module, "sensor_backend", lambda d: chosen.append(("sensor", d)) or real_sensor(d)
    )
    # Given a protected model: the Guard's construction chose both backends for its device
    guard_of(protected=True)
    assert chosen == [("fingerprint", torch.device("cpu")), ("sensor", torch.device("cpu"))]

    # And where the kernel is available (a CUDA device, Triton importable), choosing runs the
    # self-check once, and the later choices (inside forwards) reuse it
    checks: list[torch.device] = []
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(fingerprint._fingerprint_triton, "AVAILABLE", True)
    monkeypatch.setattr(fingerprint, "_self_check", lambda d: checks.append(d) or True)
    monkeypatch.setattr(fingerprint, "_TRITON_TRUSTED", {})
    assert fingerprint.prepare_backend(cuda) == "triton"
    assert fingerprint._backend(cuda) == "triton" and checks == [cuda]
    monkeypatch.setattr(abft._triton_checksum, "AVAILABLE", True)
    monkeypatch.setattr(abft, "_self_check", lambda d: checks.append(d) or True)
    monkeypatch.setattr(abft, "_TRITON_TRUSTED", {})
    assert abft.sensor_backend(cuda) == "triton"
    assert abft.sensor_backend(cuda) == "triton" and checks == [cuda, cuda]

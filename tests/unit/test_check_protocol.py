"""Every check is a check (issue 33): the coordinator holds the four in one tuple and drives
them through one protocol (sdc_agent.checks.protocol), so no check is spliced into the step's
code and a fifth would need no edit of the guard.

On one rank (a one-rank gloo group, tests/unit/conftest.py)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import torch

import sdc_agent as sdc
from sdc_agent.checks.gradients.exchange import GradientCheck
from sdc_agent.checks.protocol import Check, StepStart
from sdc_agent.checks.replay.audit import RingAudit
from sdc_agent.checks.sensors.check import SensorCheck
from tests.unit.test_guard_facade import batch, guard_of

AGENT = Path(sdc.__file__).resolve().parent


@pytest.fixture(autouse=True)
def node(monkeypatch):
    """The one rank's node name (the guard's rank map reads it)."""
    monkeypatch.setenv("NODE_NAME", "hyperpod-i-0000000000000000a")


class Recording(Check):
    """A fifth check that records what the coordinator asks of it."""

    coverage_key = "recording"

    def __init__(self, *, seeds_every_step: bool = False, decides: bool = False) -> None:
        self.calls: list[Any] = []
        self.seeds_every_step = seeds_every_step
        self.decides = decides

    def seeds(self, step: int) -> bool:
        self.calls.append(("seeds", step))
        return self.seeds_every_step

    def begin_step(self, start: StepStart) -> None:
        self.calls.append(start)

    def end_step(self) -> None:
        self.calls.append("end")

    def take_flag(self) -> torch.Tensor | None:
        self.calls.append("flag")
        return torch.zeros((), dtype=torch.int64) if self.decides else None

    @property
    def decides_now(self) -> bool:
        return self.decides

    def describe(self, planned: dict[str, Any]) -> dict[str, Any]:
        return {"on": True, "planned": planned}


def test_the_four_checks_follow_the_one_protocol(calls):
    # Given a guard
    guard = guard_of(check_every=0)
    run = guard._run
    # Then its four checks are Checks, in the order every rank calls them, one key each
    kinds = [type(c) for c in run.checks]
    assert kinds[0] is GradientCheck and issubclass(kinds[1], RingAudit)
    assert kinds[3] is SensorCheck and all(isinstance(c, Check) for c in run.checks)
    keys = [c.coverage_key for c in run.checks]
    assert keys == ["nonfinite_gradients", "replay_audit", "weight_fingerprints", "online_sensors"]
    # And coverage() has exactly their entries, each as the check describes it
    assert list(guard.coverage()["checks"]) == keys
    assert guard.coverage()["checks"]["online_sensors"] == run.sensors.describe()


def test_a_check_added_to_the_tuple_is_driven_through_every_step(calls):
    # Given a guard with a fifth check that seeds every step and decides each one at once
    guard = guard_of(check_every=0)
    fifth = Recording(seeds_every_step=True, decides=True)
    run = guard._run
    run.checks = (*run.checks, fifth)
    judged: list[int] = []
    judge = run.judge_flags

    def judge_flags(exchange, loss, **kwargs):
        judged.append(exchange.step)
        return judge(exchange, loss, **kwargs)

    run.judge_flags = judge_flags  # type: ignore[method-assign]
    # When two steps train, neither an audit step
    assert guard.train([batch(0), batch(1)]) is None
    # Then it was asked whether to seed, begun with the step's facts, ended, and asked its flag
    starts = [c for c in fifth.calls if isinstance(c, StepStart)]
    assert [(s.step, s.audit, s.seeded) for s in starts] == [(0, False, True), (1, False, True)]
    assert fifth.calls.count("end") >= 2 and fifth.calls.count("flag") == 2
    assert ("seeds", 1) in fifth.calls
    # And the step it decides now is judged at once, even off the audit schedule
    assert judged == [0, 1]
    # And its coverage entry is its own description of what was planned (nothing)
    assert guard.coverage()["checks"]["recording"] == {"on": True, "planned": {}}


def test_a_check_that_decides_nothing_leaves_the_common_step_deferred(calls):
    # Given a guard with a fifth check that flags nothing
    guard = guard_of(check_every=0)
    fifth = Recording()
    run = guard._run
    run.checks = (*run.checks, fifth)
    judged: list[int] = []
    judge = run.judge_flags
    run.judge_flags = lambda exchange, loss, **kw: (
        judged.append(exchange.step)
        or judge(  # type: ignore[method-assign]
            exchange, loss, **kw
        )
    )
    # When a step trains
    assert guard.train([batch(0)]) is None
    # Then its flags were not waited for (settled at the next agreement point) and not seeded
    assert judged == []
    assert [c.seeded for c in fifth.calls if isinstance(c, StepStart)] == [False]


def test_a_set_up_finding_turns_the_audit_off_through_the_check(calls):
    # Given a guard whose audit a set-up finding turns off
    guard = guard_of(check_every=0)
    guard._run.audit.turn_off("rebuild_batch: it raised")
    # Then the coordinator and coverage() read it from the audit, and confirmations stop
    assert guard._run.audits_off == "rebuild_batch: it raised"
    assert not guard._run.audit.can_confirm and not guard._run.audits_due(0)
    audit = guard.coverage()["checks"]["replay_audit"]
    assert audit["on"] is False and audit["pairs"] == []
    assert audit["why"] == "turned off by a set-up finding: rebuild_batch: it raised"


STEP_CODE = {
    (AGENT / "_coordinator.py", "Coordinator"): {
        "begin_step",
        "end_step",
        "read_flags",
        "seeds",
        "decides_now",
    },
    (AGENT / "guard.py", "GuardedStep"): None,  # every method
}
"""Where a check used to be spliced in (``# SENSORS:``): the step's code, which now reaches the
checks only through the protocol."""


@pytest.mark.parametrize("where", list(STEP_CODE), ids=lambda w: f"{w[0].name}:{w[1]}")
def test_the_step_code_names_no_particular_check(where):
    # Given the step's code in the coordinator and the guarded step
    path, cls = where
    tree = ast.parse(path.read_text())
    (node,) = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls]
    wanted = STEP_CODE[where]
    methods = [
        f
        for f in node.body
        if isinstance(f, ast.FunctionDef) and (wanted is None or f.name in wanted)
    ]
    assert methods
    # Then none of it reaches the online sensors by name: they are one check among four
    named = [
        (f.name, a.lineno)
        for f in methods
        for a in ast.walk(f)
        if isinstance(a, ast.Attribute) and a.attr in ("sensors", "sensing", "sensors_planned")
    ]
    assert named == []
    assert "# SENSORS" not in path.read_text()

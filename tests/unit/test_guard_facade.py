"""The guard is a small public facade over a private coordinator (issue 33): what a training
loop calls is on :class:`sdc_agent.Guard`, its progress is read-only, a step moves through one
phase enum, and the layout (a pipeline's schedule included) is behind the adapter, so neither
the facade nor the coordinator branches on the wrapper.

On one rank (a one-rank gloo group, tests/unit/conftest.py)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sdc_agent as sdc
from sdc_agent._coordinator import Coordinator
from sdc_agent.guard import StepPhase, WeightsCheck

AGENT = Path(sdc.__file__).resolve().parent

FACADE = {
    "train",
    "step",
    "check_resume",
    "check_weights",
    "finish",
    "checkpoint_tags",
    "coverage",
    "flush",
    "passes",
}
"""What issue 33 names as the facade."""


@pytest.fixture(autouse=True)
def node(monkeypatch):
    """The one rank's node name (the guard's rank map reads it)."""
    monkeypatch.setenv("NODE_NAME", "hyperpod-i-0000000000000000a")


def batch(step: int, rank: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return torch.randn(4, 8, generator=g), torch.randint(0, 3, (4,), generator=g)


def loss_of(model: nn.Module, b: tuple) -> torch.Tensor:
    return F.cross_entropy(model(b[0]), b[1])


def guard_of(**schedule) -> sdc.Guard:
    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(8, 3)))
    return sdc.Guard(
        ddp,
        torch.optim.SGD(ddp.parameters(), lr=0.1),
        compute_loss=loss_of,
        rebuild_batch=batch,
        schedule=sdc.Schedule(audit_every=0, check_on_start=False, sensors=False, **schedule),
    )


def test_the_facade_has_the_loop_methods_and_hides_the_protocol(calls):
    # Given a guard
    guard = guard_of(check_every=0)
    # Then the facade's names are there, and the coordinator behind it is private
    assert set(dir(guard)) >= FACADE
    assert isinstance(guard._run, Coordinator)
    public = {n for n in vars(sdc.Guard) if not n.startswith("_")}
    for internal in ("begin_step", "judge_flags", "settle", "read_flags", "defer", "pipelined"):
        assert internal not in public


def test_progress_is_read_only(calls):
    # Given a guard that trained two steps
    guard = guard_of(check_every=0)
    assert guard.train([batch(0), batch(1)]) is None
    # Then its passes say so, and cannot be written through the facade
    assert guard.passes.start_step == 0 and guard.passes.last_gradient_check_pass == 1
    assert guard.last_gradient_check_pass == guard.passes.last_gradient_check_pass
    with pytest.raises(dataclasses.FrozenInstanceError):
        guard.passes.last_audit_pass = 7  # type: ignore[misc]
    with pytest.raises(AttributeError):
        guard.last_audit_pass = 7  # type: ignore[misc]
    assert guard.last_audit_pass is None


def test_a_moved_attribute_still_works_with_a_warning(calls):
    # Given code written before the facade, reading and setting a moved attribute
    guard = guard_of(check_every=0)
    with pytest.warns(DeprecationWarning, match="Guard.allow_unsafe_resume is internal"):
        assert guard.allow_unsafe_resume is False
    with pytest.warns(DeprecationWarning):
        guard.allow_unsafe_resume = True
    # Then the coordinator got it (the resume check reads it there), not a shadow on the facade
    assert guard._run.allow_unsafe_resume is True
    assert "allow_unsafe_resume" not in vars(guard)
    # And a name that never existed is a plain AttributeError
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        guard.nonsense  # noqa: B018


def test_a_step_moves_through_its_phases(calls):
    # Given a step of a loop the user owns
    guard = guard_of(check_every=1)
    guarded = guard.step(0)
    assert guarded.phase is StepPhase.READY and guarded.update_allowed
    # When it runs
    with guarded:
        assert guarded.phase is StepPhase.COMPUTING
        loss = loss_of(guard.model, batch(0))
        loss.backward()
        assert guarded.check_gradients(loss) is None
        # Then checking the gradients ended its computation (RNG and kernels restored)
        assert guarded.phase is StepPhase.ENDED and guarded.update_allowed
        guard.optimizer.step()
        assert guarded.after_update() is None
        assert guarded.weights is WeightsCheck.LAUNCHED
        # And verifying the weights now judges the launched comparison, once
        assert guarded.verify_weights() is None
        assert guarded.weights is WeightsCheck.COMPARED
        assert guarded.checkpoint_tags()["weights_verified"] is True
    assert guarded.phase is StepPhase.ENDED
    # And a step is begun once
    with pytest.raises(RuntimeError, match="already begun"):
        guarded.begin()


def test_a_dropped_step_allows_no_update(calls):
    # Given a step whose gradients this rank drops (as after a bad gradient)
    guard = guard_of(check_every=0)
    with guard.step(0) as guarded:
        loss_of(guard.model, batch(0)).backward()
        guarded._drop_step()
        # Then the step is DROPPED, nothing may be applied, and the gradients are gone
        assert guarded.phase is StepPhase.DROPPED and not guarded.update_allowed
        assert all(p.grad is None for p in guard.params)
    assert guarded.phase is StepPhase.DROPPED  # leaving the step keeps it so


def _names_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
    }


def test_neither_the_facade_nor_the_coordinator_branches_on_a_pipeline():
    # Given the guard's two modules
    for module in ("guard.py", "_coordinator.py"):
        names = _names_in(AGENT / module)
        # Then nothing asks whether a pipeline drives the model, or which replayer it has:
        # the adapter builds the audit and runs the step (make_audit, run_step)
        assert not names & {"pipelined", "PipelineReplayer", "PipelineRingAudit"}, module
    assert {"make_audit", "run_step"} <= _names_in(AGENT / "_coordinator.py") | _names_in(
        AGENT / "guard.py"
    )

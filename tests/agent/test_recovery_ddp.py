"""Recovery on a real multi-process DDP job (3 simulated nodes x 2 ranks, gloo, CPU): the alarm
is recorded next to the checkpoints, a resume inside its suspect window is refused, and the job
resumes from the checkpoint before the window without an alarm. One launch for every scenario."""

from __future__ import annotations

from typing import Any

import pytest

from sdc_agent.drills.launch import launch
from tests.agent.scenarios import R

# How long this file's processes may run before the launcher kills them; the suite's conftest
# marks the file slow and gives pytest-timeout this plus a margin.
LAUNCH_DEADLINE_S = 600


SCEN = "tests.agent.recovery_scenarios"


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, list[dict[str, Any]]]:
    alarm_dir = tmp_path_factory.mktemp("checkpoints") / "alarms"
    base = tmp_path_factory.mktemp("unwritable")
    names = ["recovery", "unwritable"]
    jobs = [
        (f"{SCEN}:fault_then_resume", {"alarm_dir": str(alarm_dir)}),
        (f"{SCEN}:unwritable_alarm_dir", {"base": str(base)}),
    ]
    per_job = launch(jobs, world=6, ranks_per_node=2, timeout_s=LAUNCH_DEADLINE_S)
    for name, per_rank in zip(names, per_job, strict=True):
        errors = [r["trace"] for r in per_rank if "error" in r]
        assert not errors, f"{name}: {errors[0]}"
    return dict(zip(names, per_job, strict=True))


def same_on_every_rank(per_rank: list[dict[str, Any]], key: str) -> Any:
    values = [r[key] for r in per_rank]
    assert all(v == values[0] for v in values), f"{key} differs across ranks: {values}"
    return values[0]


def test_a_persistent_fault_between_checkpoints_is_recorded_once(results):
    # Given a persistent fault on rank R from step 7, between the checkpoints of steps 5 and 8
    run = results["recovery"]
    # When the audit of step 10 catches it
    alarm = same_on_every_rank(run, "alarm")
    assert (alarm["step"], alarm["check"], alarm["suspects"]) == (10, "compute", [R])
    assert alarm["suspect_window"] == [5, 10]
    # Then the checkpoint of step 8 was saved with a passing weight check (the replicas agree:
    # the all-reduce spread the fault into every one of them)
    assert same_on_every_rank(run, "saved") == [2, 5, 8]
    assert same_on_every_rank(run, "verified_8") is True
    # And the alarm log holds that alarm once, written by one rank
    assert same_on_every_rank(run, "records") == ["alarm-step0000000010-compute-rank0.json"]


def test_the_checkpoint_before_the_window_is_chosen_and_the_one_inside_refused(results):
    run = results["recovery"]
    assert same_on_every_rank(run, "clean") == 5
    assert same_on_every_rank(run, "refused") == [8]


def test_a_resume_from_a_checkpoint_inside_the_window_raises_a_clear_error(results):
    run = results["recovery"]
    # Given a restart that loads the checkpoint of step 8 and starts at step 9
    message = same_on_every_rank(run, "unsafe_error")
    # Then every rank refuses, naming the alarm and the newest clean step
    assert message is not None
    assert "checkpoint of step 8 (start_step=9)" in message
    assert "compute alarm of step 10 (suspect window [5, 10]" in message
    assert "at or before step 5 (train(..., start_step=6))" in message
    # And the forensics override lets the same start through
    assert same_on_every_rank(run, "override_passed") is True


def test_training_resumes_from_the_clean_checkpoint_without_an_alarm(results):
    run = results["recovery"]
    # Given the restart from the checkpoint of step 5 on ranks without the fault
    # Then it trains to the end without an alarm, its audits passing again
    assert same_on_every_rank(run, "resumed_alarm") is None
    assert same_on_every_rank(run, "resumed_saved") == [8, 11, 14]
    assert same_on_every_rank(run, "resumed_last_audit_pass") == 10
    # And its checkpoint of step 8 differs from the first run's: that one held corrupted updates
    assert same_on_every_rank(run, "checkpoint_8_was_corrupted") is True
    # And nothing new was recorded; the newest checkpoint, past the window, is now the clean one
    assert same_on_every_rank(run, "records_after") == ["alarm-step0000000010-compute-rank0.json"]
    assert same_on_every_rank(run, "clean_after") == 14


def test_an_unwritable_alarm_dir_fails_on_every_rank_at_construction(results):
    per_rank = results["unwritable"]
    assert same_on_every_rank(per_rank, "raised") == "OSError"
    message = same_on_every_rank(per_rank, "message")
    assert "a-file/alarms" in message and "not writable" in message


def test_an_alarm_returned_by_the_step_api_is_recorded_too(results):
    # Given a bit flip in rank 0's weights, found by check_weights in a loop the user owns
    run = results["recovery"]
    assert same_on_every_rank(run, "weights_alarm_step") == 14
    # Then the log holds it next to the first alarm, once
    assert same_on_every_rank(run, "records_final") == [
        "alarm-step0000000010-compute-rank0.json",
        "alarm-step0000000014-weights-rank0.json",
    ]

"""The drill's run directory: checkpoints written whole, listed by step, and the restart's choice
among them by the alarm log (what `make demo`'s restarted job does on every rank)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from sdc_agent.drills import checkpoints, job
from sdc_agent.drills.launch import launch
from sdc_agent.recovery import write_alarm_record

# The demo's alarm: the audit of step 10 failed, the one of step 5 had passed.
AUDIT_ALARM = {
    "check": "compute",
    "step": 10,
    "suspect_window": [5, 10],
    "last_audit_pass": 5,
    "last_weight_check_pass": 9,
    "nonfinite": [],
}


def save(run_dir, step: int, value: float, verified: bool = True):
    module = nn.Linear(2, 2)
    with torch.no_grad():
        module.weight.fill_(value)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    tags = {"step": step, "last_weight_check_pass": step, "weights_verified": verified}
    return checkpoints.save_checkpoint(run_dir, step, module, optimizer, tags)


def test_checkpoints_are_listed_by_step_and_half_written_files_are_not(tmp_path):
    # Given two checkpoints, a temporary left by a save that was cut short, and unrelated files
    save(tmp_path, 9, 1.0)
    save(tmp_path, 4, 0.5)
    (tmp_path / ".step00000014.pt.77.tmp").write_bytes(b"half")
    (tmp_path / "stepfinal.pt").write_bytes(b"not a step")
    write_alarm_record(tmp_path, AUDIT_ALARM, writer_rank=0)
    # Then only the whole checkpoints count, oldest first, and no temporary was left behind
    assert checkpoints.checkpoint_steps(tmp_path) == [4, 9]
    assert not list(tmp_path.glob(".step00000009*"))


def test_the_restart_loads_the_checkpoint_before_the_window_and_refuses_the_one_inside(tmp_path):
    # Given checkpoints after steps 4 and 9, both saved with a passing weight check, and the
    # audit alarm of step 10 (window [5, 10]) recorded next to them
    save(tmp_path, 4, 0.5)
    save(tmp_path, 9, 1.0)
    write_alarm_record(tmp_path, AUDIT_ALARM, writer_rank=0)
    # When the restarted job decides where to resume
    decision = checkpoints.choose_resume(tmp_path)
    # Then it loads step 4, and reports 9 refused by that alarm, with the tags it was saved with
    assert decision["checkpoints"] == [4, 9]
    assert decision["step"] == 4
    assert list(decision["refused"]) == ["9"]
    assert "compute alarm of step 10 (suspect window [5, 10]" in decision["refused"]["9"]
    assert decision["refused_tags"]["9"]["weights_verified"] is True
    assert torch.all(decision["state"]["model"]["weight"] == 0.5)
    assert decision["state"]["sdc"]["step"] == 4


def test_without_a_clean_checkpoint_the_restart_starts_from_the_initial_weights(tmp_path):
    # Given only the checkpoint inside the window
    save(tmp_path, 9, 1.0)
    write_alarm_record(tmp_path, AUDIT_ALARM, writer_rank=0)
    # Then nothing is loaded
    decision = checkpoints.choose_resume(tmp_path)
    assert decision["step"] is None and decision["state"] is None
    assert list(decision["refused"]) == ["9"]


def test_a_restart_without_an_alarm_log_is_an_error_not_a_silent_resume(tmp_path):
    from sdc_agent.recovery import AlarmLogError

    with pytest.raises(AlarmLogError, match="does not exist"):
        checkpoints.choose_resume(tmp_path / "nowhere")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"run_dir": "/tmp/x", "parallel": "fsdp"}, "run_dir"),
        ({"resume": True}, "resume"),
        ({"resume": True, "run_dir": "/tmp/x", "start_step": 5}, "resume"),
    ],
)
def test_drill_options_that_cannot_work_are_refused_naming_the_option(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        job.train_drill(steps=1, schedule={}, **kwargs)


def test_the_launcher_refuses_node_names_that_do_not_match_the_ranks_and_unknown_start_methods():
    with pytest.raises(ValueError, match=r"^node_names: 6 ranks of 2 per node need 3 names"):
        launch([], world=6, ranks_per_node=2, node_names=["a", "b"])
    with pytest.raises(ValueError, match=r"^start_method:"):
        launch([], start_method="fork")

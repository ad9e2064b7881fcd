"""The resume rule (sdc_agent.recovery) on tables of checkpoints and alarms, and the alarm log."""

from __future__ import annotations

import errno
import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from sdc_agent import recovery
from sdc_agent.alarm import Alarm
from sdc_agent.recovery import (
    AlarmLogError,
    AlarmRecord,
    clean_resume_step,
    covers,
    decide_resume,
    explain_resume,
    read_alarm_log,
    resume_refusal,
    resume_rule,
    write_alarm_record,
)


def alarm(
    step: int,
    check: str = "compute",
    window: list[int] | None = None,
    *,
    audit: int | None = None,
    weights: int | None = None,
    nonfinite: list[int] | None = None,
) -> dict[str, Any]:
    """An sdc.alarm/v1 report with the fields the rule reads."""
    return {
        "step": step,
        "check": check,
        "suspect_window": window,
        "last_audit_pass": audit,
        "last_weight_check_pass": weights,
        "nonfinite": nonfinite or [],
    }


def records(*alarms: dict[str, Any]) -> list[AlarmRecord]:
    return [AlarmRecord(Path(f"alarm-{i}.json"), a) for i, a in enumerate(alarms)]


AUDIT_300 = alarm(300, "compute", [250, 300], audit=250, weights=299)
"""The issue's case: a persistent fault after step 250's audit, caught by the audit of step 300."""


# ------------------------------------------------------------------------------ one alarm
@pytest.mark.parametrize(
    ("report", "max_step"),
    [
        # the audit verified step 250's gradients on every rank: the state after it is clean
        (AUDIT_300, 250),
        # weight check passed after step 199's update (the pre-checkpoint check): clean there
        (alarm(260, "weights", [199, 260], audit=250, weights=199), 199),
        # a NaN at 301: check 1 passed at 300 (finite only); the last audit pass was 250
        (alarm(301, "compute", [300, 301], audit=250, weights=299, nonfinite=[3]), 250),
        # a non-finite reduced gradient: the older of the last audit and weight check passes
        (alarm(301, "reduced_gradient", [300, 301], audit=250, weights=240), 240),
        # no audit ever passed in the run that started at 200: its first step is unverified
        (alarm(230, "compute", [200, 230], audit=None, weights=200), 199),
        # audits disabled: finiteness is all that was verified, up to the step before first
        (alarm(301, "compute", [300, 301], nonfinite=[3]), 299),
    ],
)
def test_each_check_allows_resuming_at_or_before_its_last_verified_step(report, max_step):
    # Given one alarm report
    # When the rule is asked where to resume
    rule = resume_rule(report)
    # Then the bound is the last step a check verified for that kind of fault
    assert rule.max_step == max_step
    assert rule.sentence == f"resume from the newest checkpoint at or before step {max_step}"
    assert rule.reason


def test_a_checkpoint_exactly_at_the_last_verified_step_is_clean_and_the_next_is_not():
    # Given the audit alarm of step 300 whose window starts at the audit pass of step 250
    # Then the checkpoint saved after step 250's update is clean, the one after 251 is not
    assert not covers(AUDIT_300, 250)
    assert covers(AUDIT_300, 251)
    # And the window's edges: the alarm's own step is covered, a step after it is not (it can
    # only come from a run that resumed from a clean checkpoint)
    assert covers(AUDIT_300, 300)
    assert not covers(AUDIT_300, 301)


def test_a_window_starting_at_step_0_without_a_pass_leaves_no_checkpoint():
    # Given an audit alarm in a run started at step 0 before any audit passed
    rule = resume_rule(alarm(3, "compute", [0, 3]))
    # Then nothing is clean: restart from the initial weights
    assert rule.max_step is None
    assert "initial weights" in rule.sentence


def test_an_alarm_without_a_window_or_a_pass_rules_out_everything_before_it():
    # Given a report with no suspect window and no passing check
    report = alarm(120, "compute", None)
    # Then no checkpoint up to its step is clean, and one after it is not its concern
    assert resume_rule(report).max_step is None
    assert "no suspect window" in resume_rule(report).reason
    assert covers(report, 0) and covers(report, 120)
    assert not covers(report, 121)


# ------------------------------------------------------------------------------ tables
@pytest.mark.parametrize(
    ("checkpoints", "alarms", "expected"),
    [
        # no alarm: the newest checkpoint
        ([99, 199, 299], [], 299),
        # the case: 299 is inside [250, 300] (weights agreed there, still corrupted)
        ([99, 199, 249, 299], [AUDIT_300], 249),
        # a checkpoint exactly at the audit pass
        ([199, 250, 299], [AUDIT_300], 250),
        # several alarms: the second (after a resume from 249) covers 349
        (
            [99, 199, 249, 299, 349],
            [AUDIT_300, alarm(360, "compute", [340, 360], audit=340)],
            249,
        ),
        # a checkpoint after the alarm's step comes from the resumed run: clean
        ([249, 299, 399], [AUDIT_300], 399),
        # an alarm with no window covers everything up to its step
        ([99, 199, 299, 399], [alarm(350, "weights", None)], 399),
        ([99, 199, 299], [alarm(350, "weights", None)], None),
        # every checkpoint inside a window
        ([260, 270], [AUDIT_300], None),
        ([], [AUDIT_300], None),
    ],
)
def test_the_newest_checkpoint_no_alarm_covers_is_chosen(checkpoints, alarms, expected):
    # Given checkpoints and recorded alarms
    # When the resume step is decided
    decision = decide_resume(checkpoints, records(*alarms))
    # Then it is the newest checkpoint no alarm covers, and every newer one is refused
    assert decision.step == expected
    assert sorted(decision.refused) == sorted(
        c for c in checkpoints if expected is None or c > expected
    )
    assert decision.reason


def test_refused_checkpoints_name_the_alarm_and_the_rule():
    decision = decide_resume([99, 249, 299], records(AUDIT_300))
    assert decision.step == 249
    assert "compute alarm of step 300 (suspect window [250, 300]" in decision.refused[299]
    assert "at or before step 250" in decision.refused[299]


def test_checkpoint_steps_must_be_non_negative_integers():
    with pytest.raises(ValueError, match="checkpoint_steps"):
        decide_resume([5, -1], [])
    with pytest.raises(ValueError, match="checkpoint_steps"):
        decide_resume(["5"], [])  # type: ignore[list-item]


# ------------------------------------------------------------------------------ refusing a start
def test_a_start_inside_a_window_is_refused_naming_the_alarm_and_the_clean_step():
    # Given the audit alarm of step 300 and a second one whose window ends inside the first's
    alarms = records(AUDIT_300, alarm(255, "weights", [199, 255], weights=199))
    # When a run would start at 300 (from the checkpoint of step 299)
    message = resume_refusal(300, alarms)
    # Then it is refused, naming the covering alarm, and the newest clean step skips both windows
    assert message is not None
    assert "checkpoint of step 299" in message
    assert "compute alarm of step 300" in message
    assert "at or before step 199 (train(..., start_step=200))" in message
    assert "allow_unsafe_resume=True" in message
    # And a start from a clean checkpoint, or from the initial weights, is not refused
    assert resume_refusal(200, alarms) is None
    assert resume_refusal(0, alarms) is None


def test_a_refusal_whose_clean_step_has_no_checkpoint_says_how_to_find_the_one_that_exists():
    # Given checkpoints every 10 steps (9, 19, 29) and the audit alarm of step 30 whose window
    # starts at step 20's passing audit (docs/agent-install.md, section 7)
    alarms = records(alarm(30, "compute", [20, 30], audit=20, weights=29))
    # When a run would start from checkpoint 29
    message = resume_refusal(30, alarms)
    # Then the bound is stated as a bound, with the way to the checkpoint that exists
    assert message is not None
    assert "at or before step 20 (train(..., start_step=21)) if you saved one at step 20" in message
    assert "else from the newest you saved before step 20" in message
    assert "sdc.clean_resume_step(" in message
    # And that way names checkpoint 19, one the job saved
    assert decide_resume([9, 19, 29], alarms).step == 19


# ------------------------------------------------------------------------------ the log
def real_alarm() -> dict[str, Any]:
    return Alarm(
        step=10, check="compute", suspect_window=(5, 10), last_audit_pass=5, suspects=[3]
    ).to_dict()


def test_a_recorded_alarm_is_read_back_and_decides_the_resume(tmp_path):
    # Given an alarm written to the log twice (a re-write of the same alarm)
    first = write_alarm_record(tmp_path, real_alarm(), writer_rank=0)
    again = write_alarm_record(tmp_path, real_alarm(), writer_rank=0)
    # Then one record holds it, with the rule for a person reading the directory
    assert first == again
    assert [p.name for p in tmp_path.iterdir()] == [first.name]
    stored = json.loads(first.read_text())
    assert stored["schema"] == recovery.RECORD_SCHEMA
    assert stored["resume"]["sentence"] == "resume from the newest checkpoint at or before step 5"
    # And it decides the resume
    assert [r.alarm["step"] for r in read_alarm_log(tmp_path)] == [10]
    assert clean_resume_step([2, 5, 8], tmp_path) == 5
    assert sorted(explain_resume([2, 5, 8], tmp_path).refused) == [8]


def test_where_rename_is_not_supported_the_record_is_written_under_its_final_name(
    tmp_path, monkeypatch
):
    # Given a file system that cannot rename (Mountpoint for S3 on a general-purpose bucket)
    def no_rename(src, dst):
        raise OSError(errno.ENOTSUP, "Operation not supported")

    monkeypatch.setattr(recovery.os, "replace", no_rename)
    # When an alarm is recorded
    path = write_alarm_record(tmp_path, real_alarm(), writer_rank=0)
    # Then the record is there under its final name and reads back; no temporary remains
    assert read_alarm_log(tmp_path)[0].path == path
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_no_clean_checkpoint_is_logged_with_the_reason(tmp_path, caplog):
    write_alarm_record(tmp_path, real_alarm(), writer_rank=0)
    with caplog.at_level(logging.WARNING, logger="sdc_agent"):
        assert clean_resume_step([6, 8], tmp_path) is None
    assert "every checkpoint (8, 6) is covered" in caplog.text


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("{not json", "cannot be read as JSON"),
        (json.dumps({"schema": "other"}), "is not an sdc.alarm-record/v1 record"),
        (json.dumps({"schema": recovery.RECORD_SCHEMA}), "has no 'alarm' object"),
        (
            json.dumps({"schema": recovery.RECORD_SCHEMA, "alarm": {"check": "compute"}}),
            "'step' must be of type int",
        ),
        (
            json.dumps(
                {
                    "schema": recovery.RECORD_SCHEMA,
                    "alarm": {"check": "compute", "step": 4, "suspect_window": [5]},
                }
            ),
            "suspect_window",
        ),
        (
            json.dumps({"schema": recovery.RECORD_SCHEMA, "alarm": {"check": "gpu", "step": 4}}),
            "unknown check",
        ),
    ],
)
def test_a_malformed_record_is_a_clear_error_naming_the_file(tmp_path, content, match):
    # Given a log holding one malformed record
    bad = tmp_path / "alarm-step0000000004-compute-rank0.json"
    bad.write_text(content)
    # When it is read, the error names the file and what is wrong
    with pytest.raises(AlarmLogError, match=match) as err:
        clean_resume_step([1, 2], tmp_path)
    assert str(bad) in str(err.value)


def test_a_missing_log_directory_is_an_error_not_an_empty_log(tmp_path):
    with pytest.raises(AlarmLogError, match="does not exist"):
        clean_resume_step([1], tmp_path / "nowhere")


def test_hidden_files_are_not_records(tmp_path):
    (tmp_path / ".alarm-step0000000004-compute-rank0.json.77.tmp").write_text("{partial")
    (tmp_path / ".sdc-probe-1").write_text("probe")
    assert read_alarm_log(tmp_path) == []


def test_a_failed_write_is_logged_with_the_report_and_does_not_raise(tmp_path, caplog):
    # Given the guard's alarm log whose directory disappeared after construction
    from sdc_agent.recording import AlarmLog

    log = AlarmLog(tmp_path / "gone", None, writes=True, writer_rank=0)
    report = Alarm(step=10, check="compute", suspect_window=(5, 10), last_audit_pass=5)
    # When it records an alarm
    with caplog.at_level(logging.ERROR, logger="sdc_agent"):
        log.write(report)
    # Then it logs loudly, with the report, and returns
    assert "ALARM NOT RECORDED" in caplog.text
    assert '"suspect_window": [5, 10]' in caplog.text
    # And it tells whoever reads it the same rule the pipeline's messages state
    assert (
        "choose the checkpoint by hand: resume from the newest checkpoint at or before step 5"
        in (caplog.text)
    )


def test_the_rule_module_loads_without_torch():
    # Given a Python where torch cannot be imported (the remediation pipeline's Lambdas)
    path = Path(recovery.__file__)
    code = textwrap.dedent(
        f"""
        import importlib.util, sys
        sys.modules["torch"] = None  # any import of torch now fails
        spec = importlib.util.spec_from_file_location("rule", {str(path)!r})
        rule = sys.modules["rule"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(rule)
        print(rule.resume_rule({{"step": 300, "check": "compute", "suspect_window": [250, 300],
                                 "last_audit_pass": 250}}).sentence)
        """
    )
    # When the rule's file is loaded by path and called
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # Then it states the rule
    assert out.stdout.strip() == "resume from the newest checkpoint at or before step 250"

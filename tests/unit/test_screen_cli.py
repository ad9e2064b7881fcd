"""``python -m sdc_agent.screen`` end to end: the JSON it prints, the termination log, its exit
codes, and bad input refused with a message (never a traceback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sdc_agent.screen.__main__ import main
from sdc_contract.screen import SCREEN_EXIT_CODES, TERMINATION_MESSAGE_BYTES, check_screen_result

REPO = Path(__file__).resolve().parents[2]


def run(capsys, *argv: str) -> tuple[int, dict, str]:
    """main(argv) with no termination log: exit code, the parsed document, stderr."""
    code = main([*argv, "--no-termination-log"])
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert len(lines) == 1  # the one document, nothing else on stdout
    return code, dict(check_screen_result(lines[0])), err


def test_a_fault_is_reproduced_in_the_document_the_exit_code_and_the_termination_log(
    tmp_path, capsys
):
    log = tmp_path / "termination-log"
    code = main(
        [
            "--simulate",
            "3",
            "--repetitions",
            "2",
            "--fault",
            "1:gemm-x1000",
            "--termination-log",
            str(log),
        ]
    )
    out = capsys.readouterr().out
    assert code == SCREEN_EXIT_CODES["reproduced"] == 3
    assert log.read_text() == out.strip()
    assert len(out.strip().encode()) <= TERMINATION_MESSAGE_BYTES
    doc = check_screen_result(log.read_text())
    assert doc["verdict"] == "reproduced"
    assert [(d["index"], d["status"]) for d in doc["devices"]] == [
        (0, "agrees"),
        (1, "reproduced"),
        (2, "agrees"),
    ]


def test_clean_and_inconclusive_exit_codes(capsys):
    code, doc, _ = run(capsys, "--simulate", "2", "--repetitions", "1")
    assert (code, doc["verdict"]) == (0, "clean")
    assert doc["exercised"]["repetitions"] == 1 and doc["environment"]["torch"]
    code, doc, _ = run(capsys, "--simulate", "1", "--repetitions", "1")
    assert (code, doc["verdict"]) == (4, "inconclusive")


def test_golden_store_learned_by_one_run_judges_a_single_device_in_the_next(tmp_path, capsys):
    golden = tmp_path / "golden.json"
    code, doc, _ = run(capsys, "--simulate", "2", "--repetitions", "1", "--golden", str(golden))
    assert code == 0 and doc["golden"]["learned"] == 13
    code, doc, _ = run(
        capsys,
        "--simulate",
        "1",
        "--repetitions",
        "1",
        "--golden",
        str(golden),
        "--fault",
        "0:reduction-bitflip",
    )
    # One mismatch (one seed) against the golden: named, not yet reproduced.
    assert (code, doc["verdict"]) == (4, "inconclusive")
    assert doc["devices"][0]["status"] == "suspect"
    assert doc["golden"]["compared"] == 13


def test_a_workload_adds_its_ops(tmp_path, capsys):
    path = tmp_path / "w.json"
    ops = [{"kind": "gemm", "shape": [16, 8, 8], "dtype": "fp32", "name": "job.proj"}]
    path.write_text(json.dumps({"schema": "sdc.workload/v1", "ops": ops}))
    code, doc, _ = run(capsys, "--simulate", "2", "--repetitions", "1", "--workload", str(path))
    assert code == 0
    assert "gemm:fp32:16x8x8" in doc["exercised"]["ops"]
    assert doc["exercised"]["workload_ops"] == 1


def test_a_workload_is_read_from_an_alarm_report(tmp_path, capsys):
    from sdc_agent.alarm import Alarm

    ops = [{"kind": "gemm", "shape": [16, 8, 8], "dtype": "fp32", "name": "layers.0.up x2"}]
    workload = {"schema": "sdc.workload/v1", "ops": ops}
    report = {**Alarm(step=7, check="compute", workload=workload).to_dict(), "job": "j"}
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    code, doc, _ = run(capsys, "--simulate", "2", "--repetitions", "1", "--workload", str(path))
    assert code == 0
    assert "gemm:fp32:16x8x8" in doc["exercised"]["ops"]
    assert doc["exercised"]["workload_ops"] == 1
    # A report without one is a failed result that says so
    path.write_text(json.dumps(Alarm(step=7, check="compute").to_dict()))
    code, doc, err = run(capsys, "--simulate", "2", "--workload", str(path))
    assert (code, doc["verdict"]) == (SCREEN_EXIT_CODES["failed"], "failed")
    assert "has no 'workload'" in doc["error"] and str(path) in doc["error"]
    assert "has no 'workload'" in err
    # A report whose workload is wrong names the field inside it
    report["workload"] = {"schema": "sdc.workload/v1", "ops": [{"kind": "conv"}]}
    path.write_text(json.dumps(report))
    code, doc, _ = run(capsys, "--simulate", "2", "--workload", str(path))
    assert code == 5 and "ops[0].kind" in doc["error"]


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("{not json", "invalid JSON"),
        (
            '{"schema": "sdc.workload/v1", "ops": [{"kind": "conv", "shape": [1], "dtype": "fp32"}]}',
            "ops[0].kind must be one of",
        ),
        (
            '{"schema": "sdc.workload/v1", "ops": [{"kind": "gemm", "shape": [1, 1], "dtype": "fp32"}]}',
            "ops[0].shape",
        ),
    ],
)
def test_a_bad_workload_is_a_failed_result_naming_the_problem(tmp_path, capsys, text, named):
    path = tmp_path / "w.json"
    path.write_text(text)
    code, doc, err = run(capsys, "--simulate", "2", "--workload", str(path))
    assert (code, doc["verdict"]) == (SCREEN_EXIT_CODES["failed"], "failed")
    assert named in doc["error"] and str(path) in doc["error"]
    assert named in err


def test_a_missing_workload_or_a_corrupt_golden_store_fails(tmp_path, capsys):
    code, doc, _ = run(capsys, "--simulate", "2", "--workload", str(tmp_path / "absent.json"))
    assert code == 5 and "cannot read the workload" in doc["error"]
    golden = tmp_path / "golden.json"
    golden.write_text('{"schema": "sdc.screen-golden/v1", "entries": {}}')
    code, doc, _ = run(capsys, "--simulate", "2", "--golden", str(golden))
    assert code == 5 and "entries must be a list" in doc["error"]
    code, doc, _ = run(capsys, "--simulate", "2", "--golden", str(tmp_path))  # a folder
    assert code == 5 and "cannot read it" in doc["error"]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--fault", "0:gemm-x1000"], "--fault needs --simulate"),
        (["--simulate", "2", "--fault", "2:gemm-x1000"], "device(s) [2] do not exist"),
        (["--simulate", "2", "--fault", "0:conv-x1000"], "fault target must be one of"),
        (["--simulate", "2", "--fault", "0:gemm-x1000:1.5"], "probability must be in"),
        (["--simulate", "2", "--fault", "0:gemm-x1000", "--fault", "0:any-bitflip"], "two faults"),
        (["--simulate", "0"], "expected at least 1"),
        (["--repetitions", "x"], "expected a whole number"),
        (["--budget-s", "-1"], "positive number of seconds"),
    ],
)
def test_a_bad_command_line_exits_2_naming_the_problem(capsys, argv, named):
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == 2
    assert named in capsys.readouterr().err


def screen_process(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [
                str(REPO / "agent/src"),
                str(REPO / "agent/contract"),
                os.environ.get("PYTHONPATH", ""),
            ]
        ),
    }
    return subprocess.run(
        [sys.executable, "-m", "sdc_agent.screen", *argv, "--no-termination-log"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=REPO,
    )


@pytest.mark.slow  # a new process imports torch: about 4 s here
def test_the_module_runs_as_a_process():
    done = screen_process("--simulate", "3", "--repetitions", "2", "--fault", "2:any-bitflip")
    assert done.returncode == 3, done.stderr
    doc = check_screen_result(done.stdout.strip())
    assert [d["status"] for d in doc["devices"]] == ["agrees", "agrees", "reproduced"]


@pytest.mark.slow  # a new process imports torch: about 4 s here
def test_bad_input_in_a_process_is_a_message_not_a_traceback(tmp_path):
    path = tmp_path / "w.json"
    path.write_text("[")
    done = screen_process("--simulate", "2", "--workload", str(path))
    assert done.returncode == 5
    assert "invalid JSON" in done.stderr and "Traceback" not in done.stderr
    assert check_screen_result(done.stdout.strip())["verdict"] == "failed"

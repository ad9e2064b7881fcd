"""The drill's command line (`python -m sdc_agent.drill`): flags that cannot make a drill stop it
before any process starts, `--timeout` reaches the launcher, and the last line says PASS or FAIL
with the exit code to match. The launcher is replaced here; one real drill runs (slow)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from sdc_agent import drill


def alarm_naming(suspects: list[int]) -> dict[str, Any]:
    """A drill result's alarm, with the fields the drill prints."""
    return {
        "step": 10,
        "check": "compute",
        "metric": {"name": "sdc_replay_mismatch"},
        "suspects": suspects,
        "suspect_window": [5, 10],
        "mismatched_pairs": [],
        "culprits": [],
        "verdicts": [],
        "ranks": {},
    }


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Replace the launcher: record its arguments and return ``launched["alarm"]`` on every rank
    (or raise ``launched["raise"]``)."""
    seen: dict[str, Any] = {"alarm": None, "raise": None}

    def fake_launch(jobs, *, world, ranks_per_node, timeout_s):
        seen.update(jobs=jobs, world=world, ranks_per_node=ranks_per_node, timeout_s=timeout_s)
        if seen["raise"] is not None:
            raise seen["raise"]
        return [[{"alarm": seen["alarm"], "updates": [0] * 9} for _ in range(world)]]

    monkeypatch.setattr(drill, "launch", fake_launch)
    return seen


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--rank", "9"], "--rank 9: the faulty rank must be one of the 6 ranks"),
        (["--rank", "6"], "0 .. 5"),
        (["--rank", "-1"], "--rank -1"),
        (["--nodes", "4", "--ranks-per-node", "1", "--rank", "4"], "of the 4 ranks"),
        (["--nodes", "2"], "--nodes 2: at least 3"),
        (["--ranks-per-node", "0"], "--ranks-per-node 0: at least 1"),
        (["--steps", "0"], "--steps 0: at least 1"),
        (["--step", "20"], "--step 20: the fault must start within the run's steps 0 .. 19"),
        (["--timeout", "0"], "--timeout 0: a positive number of seconds"),
        (["--timeout", "-5"], "--timeout -5"),
        (["--timeout", "nan"], "--timeout nan"),
        (["--parallel", "pp", "--ranks-per-node", "3"], "--ranks-per-node 2"),
        (["--parallel", "3d"], "--ranks-per-node 4"),
    ],
)
def test_a_flag_that_cannot_make_a_drill_is_a_usage_error_naming_it(
    argv: list[str], says: str, launched: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    # When the drill is started with it
    with pytest.raises(SystemExit) as stopped:
        drill.main(argv)
    # Then it stops with argparse's usage error (2), naming the flag, and starts nothing
    assert stopped.value.code == 2
    assert says in capsys.readouterr().err
    assert "jobs" not in launched


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--rank", "5"],
        ["--rank", "0", "--step", "19"],
        ["--fault", "none", "--step", "99"],  # a clean run has no fault step to check
        ["--parallel", "3d", "--ranks-per-node", "4", "--rank", "11"],
        ["--parallel", "pp", "--rank", "2"],
    ],
)
def test_flags_that_make_a_drill_are_accepted(argv: list[str]) -> None:
    args = drill.parse_args(argv)
    assert 0 <= args.rank < args.nodes * args.ranks_per_node


def test_the_timeout_reaches_the_launcher_and_defaults_to_a_generous_limit(
    launched: dict[str, Any],
) -> None:
    # Given a drill whose fault the guard names
    launched["alarm"] = alarm_naming([3])
    # When it runs without and with --timeout
    drill.main([])
    default = launched["timeout_s"]
    drill.main(["--timeout", "1800"])
    # Then the launcher got the limit: 900 s unless told, far above the old fixed 240 s
    assert default == drill.DEFAULT_TIMEOUT_S == 900
    assert launched["timeout_s"] == 1800


@pytest.mark.parametrize(
    ("argv", "suspects", "code", "last"),
    [
        ([], [3], 0, "PASS: rank 3 named, alone"),
        ([], [2, 3], 1, "FAIL: expected rank 3 named, alone, got compute alarm naming [2, 3]"),
        ([], None, 1, "FAIL: expected rank 3 named, alone, got no alarm"),
        (["--fault", "none"], None, 0, "PASS: no alarm"),
        (["--fault", "none"], [1], 1, "FAIL: expected no alarm, got compute alarm naming [1]"),
        (["--fault", "nan", "--parallel", "tp"], [2, 3], 0, "PASS: rank 3 named"),
    ],
)
def test_the_last_line_is_pass_or_fail_and_the_exit_code_agrees(
    argv: list[str],
    suspects: list[int] | None,
    code: int,
    last: str,
    launched: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Given what the guard caught
    launched["alarm"] = None if suspects is None else alarm_naming(suspects)
    # When the drill reports it
    returned = drill.main(argv)
    # Then its last line and exit code say whether that was the expected outcome
    assert returned == code
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith(last)


@pytest.mark.parametrize(
    ("error", "last"),
    [
        (
            TimeoutError("drill did not finish within 2 s (ranks hung)"),
            "FAIL: the ranks did not finish within --timeout 2 s",
        ),
        (RuntimeError("rank 4 exited with code -9 and no result"), "FAIL: rank 4 exited"),
    ],
)
def test_ranks_that_hang_or_die_end_in_a_fail_line_not_a_traceback(
    error: Exception, last: str, launched: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    # Given ranks that do not finish in time, or die
    launched["raise"] = error
    # When the drill runs
    returned = drill.main(["--timeout", "2"])
    # Then it fails with a last line saying so, and how to give a loaded machine more time
    out = capsys.readouterr().out.strip().splitlines()
    assert returned == 1
    assert out[-1].startswith(last)
    if isinstance(error, TimeoutError):
        assert "rerun with a larger --timeout" in out[-1]


@pytest.mark.slow
def test_a_real_clean_drill_ends_with_a_pass_line() -> None:
    # When a short clean drill runs: 6 gloo processes on this machine
    done = subprocess.run(
        [sys.executable, "-m", "sdc_agent.drill", "--fault", "none", "--steps", "6"],
        capture_output=True,
        text=True,
        timeout=drill.DEFAULT_TIMEOUT_S + 60,
        check=False,
    )
    # Then it exits 0 with PASS as its last line
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "PASS: no alarm"

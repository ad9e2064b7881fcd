"""exit_on_alarm: flush, leave a termination message, and exit 3 (run in child processes)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from sdc_agent.exit import SDC_EXIT_CODE

CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from sdc_agent.alarm import Alarm, RankInfo
    from sdc_agent.exit import exit_on_alarm
    from sdc_agent.publish import lifecycle

    out = Path(sys.argv[1])
    close_seconds = float(sys.argv[2])

    class SlowPublisher:
        def close(self, timeout=None):
            (out / "started").write_text("")
            time.sleep(close_seconds)
            (out / "closed").write_text(str(timeout))
            return True

    publisher = SlowPublisher()
    lifecycle.register(publisher)
    info = RankInfo(3, "hyperpod-i-0abc", "i-0abc", "GPU-3", 1, "job-worker-1")
    alarm = Alarm(step=10, check="compute", mismatched_pairs=[(3, 1), (5, 3)], culprits=[3],
                  suspects=[3], ranks={"3": info})
    print("training output before the alarm", flush=False)
    exit_on_alarm(alarm, flush_timeout=7.5, termination_log=str(out / "termination-log"))
    print("never reached")
    """
)


def run_child(tmp_path: Path, close_seconds: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path), str(close_seconds)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_exit_on_alarm_flushes_writes_the_termination_message_and_exits_3(tmp_path):
    # Given a process with a registered publisher
    child = run_child(tmp_path, 0.0)
    # When it calls exit_on_alarm
    stdout, stderr = child.communicate(timeout=60)
    # Then it exits with the documented code, after closing the publisher within the timeout
    assert child.returncode == SDC_EXIT_CODE == 3, stderr
    assert float((tmp_path / "closed").read_text()) <= 7.5
    # And buffered output was not lost, and nothing after the call ran
    assert "training output before the alarm" in stdout and "never reached" not in stdout
    # And the termination message says what stopped the job
    message = json.loads((tmp_path / "termination-log").read_text())
    assert message == {
        "schema": "sdc.exit/v1",
        "exit_code": 3,
        "check": "compute",
        "step": 10,
        "metric": "sdc_replay_mismatch",
        "suspects": [3],
        "ranks": [3],
        "nodes": ["hyperpod-i-0abc"],
    }
    assert "stopping on alarm" in stderr


def test_sigterm_while_flushing_does_not_lose_the_alarm(tmp_path):
    # Given a publisher that takes a second to deliver
    child = run_child(tmp_path, 1.0)
    deadline = time.monotonic() + 60
    while not (tmp_path / "started").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    # When torchrun's SIGTERM arrives in the middle of the flush (another worker exited first)
    child.send_signal(signal.SIGTERM)
    _, stderr = child.communicate(timeout=60)
    # Then the flush completes and the exit code is still 3, not death by signal
    assert (tmp_path / "closed").exists()
    assert child.returncode == SDC_EXIT_CODE, stderr

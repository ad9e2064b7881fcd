"""The real node screen (``python -m sdc_agent.screen``) on simulated devices, for the tests
that read its termination message as a pod's (the Lambda's step, the e2e workflow)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def simulated_screen_message(tmp_path: Path, faulty_device: int, *, timeout: int = 300) -> str:
    """The termination message of the real screen of 4 simulated devices, with an x1000 GEMM
    fault on ``faulty_device`` (2 repetitions); the screen's exit code for that is 3."""
    log = tmp_path / "termination-log"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sdc_agent.screen",
            "--simulate",
            "4",
            "--fault",
            f"{faulty_device}:gemm-x1000",
            "--repetitions",
            "2",
            "--termination-log",
            str(log),
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 3, done.stderr
    return log.read_text()

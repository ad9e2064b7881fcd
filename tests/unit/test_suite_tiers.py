"""The suite's tiers hold: every agent test file that starts processes is `slow`, and its
launcher's deadline comes before pytest-timeout's (tests/agent/conftest.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
AGENT_TESTS = ROOT / "tests" / "agent"
STARTS_PROCESSES = re.compile(r"\blaunch(_rows)?\(|\bsubprocess\.run\(")
LITERAL_DEADLINE = re.compile(r"\btimeout(_s)?=\d")


def process_files() -> list[Path]:
    """The agent test files that start processes (gloo jobs or scripts)."""
    return sorted(
        p for p in AGENT_TESTS.glob("test_*.py") if STARTS_PROCESSES.search(p.read_text())
    )


def test_every_file_that_starts_processes_declares_its_deadline_and_passes_it():
    files = process_files()
    assert len(files) >= 10, files  # the scan finds the multi-process files at all
    for path in files:
        source = path.read_text()
        assert re.search(r"^LAUNCH_DEADLINE_S = \d+$", source, re.M), (
            f"{path.name} starts processes but declares no LAUNCH_DEADLINE_S"
        )
        assert not LITERAL_DEADLINE.search(source), (
            f"{path.name} passes a literal deadline; pass LAUNCH_DEADLINE_S"
        )


def test_the_slow_marker_selects_every_multi_process_file_and_nothing_else_in_the_agent_tests():
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "slow", str(AGENT_TESTS)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert collected.returncode == 0, collected.stdout + collected.stderr
    slow_files = {line.split("::")[0] for line in collected.stdout.splitlines() if "::" in line}
    assert slow_files == {str(p.relative_to(ROOT)) for p in process_files()}

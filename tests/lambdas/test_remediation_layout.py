"""The Lambda layout the CDK app relies on: one folder per contract step, ``<folder>.handler.handler``,
and a README line for each."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = (ROOT / "docs" / "CONTRACT.md").read_text()
FOLDERS = re.findall(r"^\| `([a-z_]+)`\s+\|", CONTRACT, flags=re.MULTILINE)


def test_the_contract_lists_the_ten_steps_and_the_four_services():
    # (the idle screener, issue 35, is the fourth service beside approve, sweeper, canary)
    assert len(FOLDERS) == 14 and "localize" in FOLDERS and "record" in FOLDERS
    assert "screen" in FOLDERS
    assert {"approve", "sweeper", "canary", "screen_idle"} <= set(FOLDERS)


@pytest.mark.parametrize("folder", FOLDERS)
def test_each_step_has_a_handler_and_a_readme_line(folder):
    # Given the folder the CDK app points a function at
    module = importlib.import_module(f"{folder}.handler")

    # Then: the handler string resolves, and the README documents it
    assert callable(module.handler)
    readme = (ROOT / "lambdas" / "README.md").read_text()
    assert re.search(rf"^\| `{folder}` \|", readme, flags=re.MULTILINE), (
        f"no README line for {folder}"
    )

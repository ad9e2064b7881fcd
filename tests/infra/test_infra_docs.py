"""What the docs and the examples tell a new user about the stack is what the stack does: the
example PyTorchJob runs where localize looks for its pods, `cdk.json`'s app command finds an
interpreter, the rollout's "start in shadow" shadows every check (and the shipped config does
not), and every stack output a doc names is one the stack has."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.app import CDK_JSON, REPO_ROOT, example_context
from infra.config import load_config
from sdc_contract.modes import mode_for
from sdc_contract.report import CHECKS, SUSPECT_VERDICTS

DEPLOY_MD = REPO_ROOT / "docs" / "deploy.md"
DOCS = [
    REPO_ROOT / "README.md",
    REPO_ROOT / "agent" / "README.md",
    REPO_ROOT / "lambdas" / "README.md",
    *sorted((REPO_ROOT / "docs").rglob("*.md")),
]


def test_the_example_pytorchjob_runs_in_the_stacks_default_training_namespace() -> None:
    # Given the example job and the stack as cdk.json configures it
    job = yaml.safe_load((REPO_ROOT / "agent" / "examples" / "pytorchjob.yaml").read_text())
    config = load_config(example_context(), {})
    # Then the job's pods are where localize looks for the reported job's pods: in any other
    # namespace every suspect would be refused as uncorroborated
    assert job["metadata"]["namespace"] == config.training_namespace


@pytest.mark.parametrize("venv", [True, False], ids=["repository-venv", "python3-on-path"])
def test_cdk_json_runs_the_repositorys_venv_else_the_python3_on_the_path(
    tmp_path: Path, venv: bool
) -> None:
    # Given a root whose app.py prints the interpreter that runs it, with or without a .venv,
    # and a PATH whose python3 is another one (an activated virtual environment)
    (tmp_path / "app.py").write_text("import sys\nprint(sys.executable)\n")
    on_path = tmp_path / "activated" / "bin"
    on_path.mkdir(parents=True)
    (on_path / "python3").symlink_to(sys.executable)
    repository_venv = tmp_path / ".venv" / "bin" / "python"
    if venv:
        repository_venv.parent.mkdir(parents=True)
        repository_venv.symlink_to(sys.executable)
    # When cdk.json's app command runs there, in a shell, as the CDK CLI runs it
    done = subprocess.run(
        ["/bin/sh", "-c", json.loads(CDK_JSON.read_text())["app"]],
        cwd=tmp_path,
        env={**os.environ, "PATH": f"{on_path}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # Then the repository's .venv runs the app when there is one, else the python3 on the PATH
    assert done.returncode == 0, done.stderr
    expected = repository_venv if venv else on_path / "python3"
    assert done.stdout.strip() == str(expected)


def _modes_shown(text: str) -> list[dict[str, Any]]:
    """Each `checkModes` table the text shows: `"checkModes": {...}` (cdk.json) or
    `checkModes={...}` (`-c`)."""
    return [
        json.loads(table) for table in re.findall(r'"?checkModes"?\s*[:=]\s*(\{[^{}\n]*\})', text)
    ]


def _all_modes(table: dict[str, Any]) -> set[str]:
    modes = load_config({**example_context(), "checkModes": table}, {}).check_modes
    return {mode_for(modes, check, verdict) for check in CHECKS for verdict in SUSPECT_VERDICTS}


def test_the_rollouts_start_in_shadow_shadows_every_check_which_the_shipped_config_does_not():
    # Given step 1 of docs/deploy.md's rollout
    text = DEPLOY_MD.read_text()
    step = text[text.index("1. **Start in shadow.**") : text.index("2. **Read `stats`.**")]
    first, *_ = _modes_shown(step)
    # When the stack is configured with the table it shows
    # Then every check x verdict is shadowed
    assert _all_modes(first) == {"shadow"}
    # And the config cdk.json ships enforces every one, as the rollout says (shadow is opt-in)
    assert _all_modes(example_context().get("checkModes") or {}) == {"enforce"}
    assert "every check is enforced" in " ".join(text.split())


def test_every_check_modes_table_the_deploy_doc_shows_is_one_the_stack_accepts() -> None:
    tables = _modes_shown(DEPLOY_MD.read_text())
    assert len(tables) >= 3  # the rollout's first and third steps, and section 3's note
    for table in tables:
        _all_modes(table)  # raises ConfigError naming a bad key


# What names a stack output in prose or a command: `<Name output>`, "`Name` output",
# "output `Name`", and a variable set from one (`SDC_LEDGER_TABLE=<LedgerTableName>`).
OUTPUT_MENTIONS = [
    re.compile(r"<([A-Z][A-Za-z]+) output>"),
    re.compile(r"`([A-Z][A-Za-z]+)` output"),
    re.compile(r"\boutputs? `([A-Z][A-Za-z]+)`"),
    re.compile(r"\bSDC_[A-Z_]+=<([A-Z][A-Za-z]+)>"),
]


@pytest.mark.slow
def test_every_stack_output_a_doc_names_is_one_the_stack_has(default_synth: Any) -> None:
    # Given the stack's outputs
    outputs = set(default_synth.template["Outputs"])
    # When every document's mentions of an output are read
    named = {
        (doc.relative_to(REPO_ROOT).as_posix(), number, name)
        for doc in DOCS
        for number, line in enumerate(doc.read_text().splitlines(), start=1)
        for pattern in OUTPUT_MENTIONS
        for name in pattern.findall(line)
    }
    assert any(name == "LedgerTableName" for _, _, name in named)  # the scan sees them at all
    # Then each is an output's id (`LedgerTableName`, not `LedgerTable`)
    wrong = sorted(f"{doc}:{number}: {name}" for doc, number, name in named if name not in outputs)
    assert not wrong, f"not stack outputs ({sorted(outputs)}):\n" + "\n".join(wrong)
    # And deploy.md's list of outputs is the stack's, all of them
    listed = DEPLOY_MD.read_text().split("\nOutputs: ", 1)[1].split("\n\n", 1)[0]
    assert set(re.findall(r"`([A-Z][A-Za-z]+)`", listed)) == outputs

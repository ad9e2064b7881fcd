"""benchmarks/gpu.sh's steps run on the CPU's fallbacks without error (``--dry-run``): every
step of the GPU script is exercised here, where no GPU is, and says that it fell back."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = (
    "gpu-versions",
    "gpu-llama-ddp",
    "gpu-llama-fsdp",
    "gpu-replay",
    "gpu-drills",
    "gpu-explain",
    "sensor-gpu",
    "fingerprint-gpu",
)
"""The results files a run writes (benchmarks/results/ on a GPU; a temporary folder here)."""

# Each step's own limit is 4x its GPU limit on a dry run (gpu.sh): 4 x 480 s at most.
DEADLINE_S = 4 * 480 + 60


@pytest.mark.slow
@pytest.mark.timeout(DEADLINE_S + 60)
def test_gpu_sh_dry_run_runs_every_step_on_the_cpu_fallbacks(tmp_path: Path):
    # Given the Python of this checkout and a results folder
    venv = Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin" / "python"
    env = {**os.environ, "PYTHON": str(venv), "RESULTS": str(tmp_path)}
    # When gpu.sh runs with --dry-run
    done = subprocess.run(
        ["bash", "benchmarks/gpu.sh", "--dry-run"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    # Then every step passed
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "FAILED steps" not in done.stdout
    assert "dry run: each CUDA step runs its CPU fallback" in done.stdout
    # and each wrote its results, with provenance (sensor_gpu.py writes its figures without)
    for name in RESULTS:
        document = json.loads((tmp_path / f"{name}.json").read_text())
        assert name == "sensor-gpu" or "provenance" in document, name
    # and the agent's own steps say they fell back, and what they found
    for name in RESULTS[:6]:
        document = json.loads((tmp_path / f"{name}.json").read_text())
        assert document["dry_run"] is True and "CPU fallback" in document["fallback"], name
    replay = json.loads((tmp_path / "gpu-replay.json").read_text())
    assert replay["with_cublas_workspace_config"]["bit_identical"] is True
    drills = json.loads((tmp_path / "gpu-drills.json").read_text())["drills"]
    assert {name: d["named_rank_1"] for name, d in drills.items()} == {
        "gemm": True,
        "nan": True,
        "weight": True,
    }
    for layout in ("ddp", "fsdp"):
        llama = json.loads((tmp_path / f"gpu-llama-{layout}.json").read_text())
        assert llama["backend"] == "gloo" and llama["alarms"] == []

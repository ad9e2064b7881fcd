"""The restart path of the examples does what docs/agent-install.md (section 7) says: after an
SDC stop, the same train_ddp.py command with --resume auto resumes from the checkpoint before
the alarm's suspect window, refuses the newer one, and the PyTorchJob passes those flags."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "agent" / "examples"

# agent-install.md section 7's drill: audits and weight checks every 10 steps, checkpoints after
# steps 9, 19, 29; rank 3 computes wrong from step 25, so the audit of step 30 fires with
# window [20, 30] and the job must resume from 19, not from 29 (saved with a passing weight check).
DRILL = (
    "--simulate-nodes 3 --peer-offset 2 --steps 40 --audit-every 10 --check-every 10 "
    "--ckpt-every 10 --publish none"
)

# How long this file's processes may run before the launcher kills them; the suite's conftest
# marks the file slow and gives pytest-timeout this plus a margin.
LAUNCH_DEADLINE_S = 600


def torchrun(flags: str, tmp_path: Path) -> subprocess.CompletedProcess:
    runner = Path(sys.executable).with_name("torchrun")
    script = f"{runner} --standalone --nproc-per-node 6 {EXAMPLES / 'train_ddp.py'} {flags}"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "SDC_TERMINATION_LOG": str(tmp_path / "termination-log"),
    }
    return subprocess.run(
        ["bash", "-c", script],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=LAUNCH_DEADLINE_S,
    )


def tags(ckpt: Path, step: int) -> dict:
    return torch.load(ckpt / f"step{step:08d}.pt", weights_only=True)["sdc"]


def weights(ckpt: Path, step: int) -> dict[str, torch.Tensor]:
    """The model's tensors in the checkpoint of ``step``."""
    return torch.load(ckpt / f"step{step:08d}.pt", weights_only=True)["model"]


@pytest.mark.slow
def test_train_ddp_resumes_from_the_checkpoint_before_the_window_after_an_sdc_stop(tmp_path):
    ckpt = tmp_path / "ckpt"
    # Given the job stopped by the audit of step 30 (rank 3 faulty from step 25)
    stopped = torchrun(
        f"{DRILL} --ckpt-dir {ckpt} --fault scale --fault-rank 3 --fault-step 25", tmp_path
    )
    assert stopped.returncode != 0, stopped.stderr[-3000:]
    saved = sorted(p.name for p in ckpt.iterdir())
    assert saved == [
        "alarm-step0000000030-compute-rank0.json",
        "step00000009.pt",
        "step00000019.pt",
        "step00000029.pt",
    ], stopped.stderr[-3000:]
    # (the checkpoint of step 29 holds corrupted updates, yet its weight check passed: the
    # all-reduce put the fault into every replica)
    corrupted = tags(ckpt, 29)
    assert corrupted["weights_verified"] is True
    assert corrupted["last_audit_pass"] == 20
    corrupted_weights = weights(ckpt, 29)

    # When the same job is submitted again, without the fault, with --resume auto
    restarted = torchrun(f"{DRILL} --ckpt-dir {ckpt} --resume auto", tmp_path)

    # Then it chose the checkpoint of step 19 by the alarm log, refusing 29, and trained to the
    # end with no alarm
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    assert (
        "resume: step 19 is the newest checkpoint no recorded alarm covers; refused: {29: "
        "'compute alarm of step 30 (suspect window [20, 30]"
    ) in restarted.stderr
    assert "ALARM" not in restarted.stderr.replace("alarm-step", "")
    # And its checkpoint of step 29 replaced the corrupted one with other weights: a different
    # agreed digest and different tensors, verified by its own weight check
    rewritten = tags(ckpt, 29)
    assert rewritten["weights_verified"] is True
    assert rewritten["weights_digest"] != corrupted["weights_digest"]
    assert any(
        not torch.equal(tensor, corrupted_weights[name])
        for name, tensor in weights(ckpt, 29).items()
    )
    # And the newest checkpoint, past the alarm's step (its audit of step 30 passed), is the one
    # a later restart would load
    assert tags(ckpt, 39)["last_audit_pass"] == 30
    assert (ckpt / "step00000039.pt").exists()
    assert sorted(p.name for p in ckpt.glob("alarm-*")) == [
        "alarm-step0000000030-compute-rank0.json"
    ]


def test_the_pytorchjob_resumes_with_the_checkpoints_and_alarms_on_shared_storage():
    # Given the example PyTorchJob
    job = yaml.safe_load((EXAMPLES / "pytorchjob.yaml").read_text())
    worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]
    (container,) = worker["template"]["spec"]["containers"]
    command = container["args"][0]
    # Then every start passes --resume auto and a checkpoint directory (where the guard records
    # its alarms) on the FSx volume, so a job submitted again after an SDC stop resumes by the rule
    assert "--resume auto" in command and "--ckpt-every" in command
    ckpt_dir = command.split("--ckpt-dir", 1)[1].split()[0]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert ckpt_dir.startswith(mounts["fsx"] + "/")
    volumes = {v["name"]: v for v in worker["template"]["spec"]["volumes"]}
    assert "persistentVolumeClaim" in volumes["fsx"]

"""The drill's checkpoints on disk, and the restart that resumes from them.

A run directory holds what a real job keeps on shared storage (FSx, an S3 mount): one file per
checkpoint, ``step<step>.pt`` with the model, the optimizer and the guard's checkpoint tags
(the layout of ``agent/examples/train_ddp.py``), and the guard's alarm log
(``Guard(alarm_dir=run_dir)``, :mod:`sdc_agent.recovery`). :func:`choose_resume` is what a
restarted job does first: it asks ``sdc.clean_resume_step`` which checkpoint to load.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

CHECKPOINT_PREFIX = "step"
CHECKPOINT_SUFFIX = ".pt"


def checkpoint_path(run_dir: str | os.PathLike, step: int) -> Path:
    """The checkpoint saved after ``step``'s update."""
    return Path(run_dir, f"{CHECKPOINT_PREFIX}{step:08d}{CHECKPOINT_SUFFIX}")


def checkpoint_steps(run_dir: str | os.PathLike) -> list[int]:
    """The steps of every checkpoint in ``run_dir``, oldest first (hidden temporaries skipped)."""
    steps = []
    for path in Path(run_dir).glob(f"{CHECKPOINT_PREFIX}*{CHECKPOINT_SUFFIX}"):
        digits = path.name[len(CHECKPOINT_PREFIX) : -len(CHECKPOINT_SUFFIX)]
        if digits.isdigit():
            steps.append(int(digits))
    return sorted(steps)


def save_checkpoint(
    run_dir: str | os.PathLike,
    step: int,
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    tags: Mapping[str, Any],
) -> Path:
    """Write the checkpoint of ``step`` (call it on one rank): written to a hidden temporary
    name and renamed into place, so a restart never loads half a file."""
    final = checkpoint_path(run_dir, step)
    final.parent.mkdir(parents=True, exist_ok=True)
    temporary = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    state = {"model": module.state_dict(), "optimizer": optimizer.state_dict(), "sdc": dict(tags)}
    try:
        torch.save(state, temporary)
        os.replace(temporary, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
    return final


def load_checkpoint(run_dir: str | os.PathLike, step: int) -> dict[str, Any]:
    """The checkpoint of ``step``: ``{"model", "optimizer", "sdc"}`` (the guard's tags)."""
    return torch.load(checkpoint_path(run_dir, step), map_location="cpu", weights_only=True)


def choose_resume(run_dir: str | os.PathLike) -> dict[str, Any]:
    """What a restarted job decides before building its guard, on every rank.

    ``sdc.clean_resume_step`` picks the newest checkpoint in ``run_dir`` that no alarm recorded
    there covers; ``sdc.explain_resume`` gives the reason and each refused checkpoint, reported
    with the tags it was saved with (a refused checkpoint may well show a passing weight check:
    the replicas agreed on the corrupted weights). Returns ``{"checkpoints", "step", "reason",
    "refused": {step: why}, "refused_tags": {step: tags}, "state"}``, ``state`` being the
    chosen checkpoint (None: restart from the initial weights).
    """
    import sdc_agent as sdc

    steps = checkpoint_steps(run_dir)
    chosen = sdc.clean_resume_step(steps, run_dir)
    decision = sdc.explain_resume(steps, run_dir)
    return {
        "checkpoints": steps,
        "step": chosen,
        "reason": decision.reason,
        "refused": {str(s): why for s, why in sorted(decision.refused.items())},
        "refused_tags": {
            str(s): load_checkpoint(run_dir, s)["sdc"] for s in sorted(decision.refused)
        },
        "state": None if chosen is None else load_checkpoint(run_dir, chosen),
    }

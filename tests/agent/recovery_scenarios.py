"""The recovery path on every rank of a real DDP job: record the alarm, refuse a corrupted
resume, resume from the checkpoint before the suspect window (importable: the launcher spawns)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import sdc_agent as sdc
from sdc_agent.drills.job import DrillModel, make_batch, make_fault, make_loss
from tests.agent.scenarios import SCHEDULE, R

RECOVERY_SCHEDULE = {**SCHEDULE, "ckpt_every": 3}
"""Audits at steps 0, 5, 10, 15; checkpoints (weight-checked) after steps 2, 5, 8, 11, 14."""

FAULT = {"kind": "ScaleOutputElement", "layer": "net.4", "factor": 1000.0, "rank": R, "step": 7}
"""Persistent from step 7, between the checkpoints of steps 5 and 8; the audit of step 10 sees it."""


def guarded(alarm_dir: str, checkpoint: dict[str, Any] | None = None, **guard_kwargs: Any):
    """(ddp model, optimizer, guard) for the drill model, optionally loaded from ``checkpoint``."""
    torch.manual_seed(0)  # identical initial weights on every rank
    ddp = nn.parallel.DistributedDataParallel(DrillModel())
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    if checkpoint is not None:
        ddp.module.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
    guard = sdc.Guard(
        ddp,
        optimizer,
        compute_loss=make_loss(),
        rebuild_batch=make_batch,
        schedule=sdc.Schedule(**RECOVERY_SCHEDULE),
        alarm_dir=alarm_dir,
        **guard_kwargs,
    )
    return ddp, optimizer, guard


def train(guard: Any, ddp: Any, optimizer: Any, start: int, stop: int, saves: dict) -> Any:
    """Train steps [start, stop); checkpoints go to ``saves`` (in memory on every rank)."""

    def save(step: int, tags: dict[str, Any]) -> None:
        state = {"model": ddp.module.state_dict(), "optimizer": optimizer.state_dict()}
        saves[step] = {**copy.deepcopy(state), "tags": tags}

    batches = (make_batch(s, dist.get_rank()) for s in range(start, stop))
    return guard.train(batches, save_checkpoint=save, start_step=start)


def records(alarm_dir: str) -> list[str]:
    return sorted(p.name for p in Path(alarm_dir).iterdir() if not p.name.startswith("."))


def fault_then_resume(*, alarm_dir: str) -> dict[str, Any]:
    """A persistent fault between two checkpoints, caught by a later audit; then the restart."""
    out: dict[str, Any] = {}
    # The run that meets the fault.
    ddp, optimizer, guard = guarded(alarm_dir)
    make_fault(FAULT).attach(guard)
    first_run: dict[int, Any] = {}
    alarm = train(guard, ddp, optimizer, 0, 15, first_run)
    out["alarm"] = alarm.to_dict() if alarm else None
    out["saved"] = sorted(first_run)
    out["verified_8"] = first_run[8]["tags"]["weights_verified"] if 8 in first_run else None
    dist.barrier()  # DP rank 0 wrote the record before returning; every rank reads it after this
    out["records"] = records(alarm_dir)
    decision = sdc.explain_resume(sorted(first_run), alarm_dir)
    out["clean"] = sdc.clean_resume_step(sorted(first_run), alarm_dir)
    out["refused"] = sorted(decision.refused)

    # A restart that would load the checkpoint inside the window: refused on every rank.
    ddp, optimizer, guard = guarded(alarm_dir, first_run[8])
    try:
        train(guard, ddp, optimizer, 9, 15, {})
        out["unsafe_error"] = None
    except sdc.UnsafeResumeError as err:
        out["unsafe_error"] = str(err)
    guard._run.allow_unsafe_resume = True  # the forensics override: the same check lets it through
    guard.check_resume(9)
    out["override_passed"] = True

    # The restart the rule chooses, on a healthy rank set (no fault).
    resumed: dict[int, Any] = {}
    ddp, optimizer, guard = guarded(alarm_dir, first_run[out["clean"]])
    alarm = train(guard, ddp, optimizer, out["clean"] + 1, 15, resumed)
    out["resumed_alarm"] = alarm.to_dict() if alarm else None
    out["resumed_saved"] = sorted(resumed)
    out["resumed_last_audit_pass"] = guard.last_audit_pass
    out["checkpoint_8_was_corrupted"] = not all(
        torch.equal(first_run[8]["model"][k], resumed[8]["model"][k]) for k in resumed[8]["model"]
    )
    dist.barrier()
    out["records_after"] = records(alarm_dir)
    out["clean_after"] = sdc.clean_resume_step(sorted({*first_run, *resumed}), alarm_dir)

    # The step API records its alarms too: a weight check in a loop the user owns.
    sdc.faults.FlipWeightBit("net.0.weight", bit=12, rank=0).apply_now(guard)
    weights_alarm = guard.check_weights(14)
    out["weights_alarm_step"] = weights_alarm.step if weights_alarm else None
    dist.barrier()
    out["records_final"] = records(alarm_dir)
    return out


def unwritable_alarm_dir(*, base: str) -> dict[str, Any]:
    """A guard whose alarm_dir cannot be created (below a regular file) fails on every rank."""
    blocker = Path(base, "a-file")
    if dist.get_rank() == 0:
        blocker.write_text("not a directory")
    try:
        guarded(str(blocker / "alarms"))
    except OSError as err:
        return {"raised": type(err).__name__, "message": str(err)}
    return {"raised": None, "message": None}

"""Jobs the multi-process tests run on every rank (importable: the launcher spawns processes)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

import sdc_agent as sdc
from sdc_agent.drills.job import build, make_batch, make_loss

R = 3
"""The faulty rank in most scenarios: node 1, replayed by rank 1 (node 0), confirmed by rank 5."""

SCHEDULE = {"audit_every": 5, "check_every": 0, "ckpt_every": 0, "peer_offset": 2}


class CountingPublisher:
    """Counts what the guard publishes (the guard calls it from DP rank 0 only)."""

    def __init__(self) -> None:
        self.audit_passes = 0
        self.weight_check_passes = 0
        self.alarms: list[dict[str, Any]] = []
        self.rank_maps = 0

    def publish_rank_map(self, ranks: dict) -> None:
        self.rank_maps += 1

    def publish_alarm(self, alarm: sdc.Alarm) -> None:
        self.alarms.append(alarm.to_dict())

    def publish_liveness(self, step: int, audit_passes: int, weight_check_passes: int) -> None:
        self.audit_passes += audit_passes
        self.weight_check_passes += weight_check_passes

    def flush(self, timeout: float | None = None) -> bool:
        return True


def long_clean_run(*, steps: int, schedule: dict[str, Any]) -> dict[str, Any]:
    """Train without faults and count the checks that ran and passed."""
    publisher = CountingPublisher()
    _, _, guard = build(schedule, publisher=publisher)
    batches = (make_batch(s, dist.get_rank()) for s in range(steps))
    saves: list[int] = []
    alarm = guard.train(batches, save_checkpoint=lambda s, tags: saves.append(s))
    return {
        "alarm": alarm.to_dict() if alarm else None,
        "audit_passes": publisher.audit_passes,
        "weight_check_passes": publisher.weight_check_passes,
        "alarms_published": len(publisher.alarms),
        "rank_maps": publisher.rank_maps,
        "saves": len(saves),
        "dp_rank": guard.dp_rank,
    }


def flip_after_load(*, rank: int, param: str, bit: int) -> dict[str, Any]:
    """Load a checkpoint, flip one bit on ``rank``, then look before the first step."""
    ddp, _, guard = build(SCHEDULE)
    checkpoint = {k: v.clone() for k, v in ddp.module.state_dict().items()}
    ddp.module.load_state_dict(checkpoint)
    sdc.faults.FlipWeightBit(param, bit=bit, rank=rank).apply_now(guard)
    report = sdc.find_divergent_ranks(ddp.module, None)
    alarm = guard.train([make_batch(0, dist.get_rank())], start_step=100)
    return {
        "ranks": report.ranks,
        "tensors": report.tensors,
        "unattributable": report.unattributable,
        "alarm": alarm.to_dict() if alarm else None,
    }


def topology_error(*, peer_offset: int) -> dict[str, Any]:
    """Build a guard whose replay pairs share nodes; report the error every rank got."""
    try:
        build({**SCHEDULE, "peer_offset": peer_offset})
    except sdc.TopologyError as err:
        return {"error_type": type(err).__name__, "message": str(err)}
    return {"error_type": None, "message": ""}


def own_loop(
    *, steps: int, fault: dict[str, Any] | None, set_to_none: bool = True, accumulate: int = 1
) -> dict[str, Any]:
    """The lower-level step API, in a loop the user owns (as in docs/usage/ddp.md).

    ``set_to_none=False`` zeroes gradients in place; ``accumulate`` > 1 runs that many backward
    passes per step (gradient accumulation, which audits refuse).
    """
    from sdc_agent.drills.job import make_fault

    ddp, optimizer, guard = build({**SCHEDULE, "check_every": 4})
    if fault:
        make_fault(fault).attach(guard)
    compute_loss = make_loss()
    alarm, applied, refused = None, 0, None
    for step in range(steps):
        if accumulate > 1:
            with ddp.no_sync():
                compute_loss(ddp, make_batch(step + 1000, dist.get_rank())).backward()
        try:
            with guard.step(step) as guarded:
                loss = compute_loss(ddp, make_batch(step, dist.get_rank()))
                loss.backward()
                if alarm := guarded.check_gradients(loss):
                    break
                optimizer.step()
                optimizer.zero_grad(set_to_none=set_to_none)
                applied += 1
                if alarm := guarded.after_update():
                    break
        except RuntimeError as err:  # raised on every rank alike, before any collective
            refused = str(err)
            break
    else:
        alarm = guard.finish()  # settles the last step's gradient check, as the README says
    return {
        "alarm": alarm.to_dict() if alarm else None,
        "applied": applied,
        "refused": refused,
        "deterministic_after": torch.are_deterministic_algorithms_enabled(),
    }


def broken_rebuild(*, steps: int, fail_rank: int, fail_step: int) -> dict[str, Any]:
    """rebuild_batch raises on one rank during one audit (a bug in the user's code)."""
    publisher = CountingPublisher()
    _, optimizer, guard = build(SCHEDULE, publisher=publisher)
    rebuild = guard.rebuild_batch

    def flaky(step: int, rank: int) -> Any:
        if dist.get_rank() == fail_rank and step == fail_step:
            raise KeyError(f"no batch cached for step {step}")
        return rebuild(step, rank)

    guard.rebuild_batch = flaky
    updates: list[int] = []
    optimizer.register_step_post_hook(lambda *_: updates.append(guard.current_step))
    alarm = guard.train(make_batch(s, dist.get_rank()) for s in range(steps))
    return {
        "alarm": alarm.to_dict() if alarm else None,
        "updates": updates,
        "audit_passes": publisher.audit_passes,
        "last_audit_pass": guard.last_audit_pass,
        "dp_rank": guard.dp_rank,
    }

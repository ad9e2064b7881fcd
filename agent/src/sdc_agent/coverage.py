"""What a guard checks for one job, as a JSON-ready description (``Guard.coverage()``).

Built from the schedule, the data-parallel group and the placement, the same on every rank. It
says, per check, whether it runs and why, which ranks replay whom, which replicas are compared,
which micro-batch positions are audited, how fp16/bf16 non-finite gradients are handled, and
what no check covers, so that an operator reads what protection a job really has.
"""

from __future__ import annotations

from typing import Any

from .attribution import replay_target, third_gpu
from .schedule import Schedule

SCHEMA = "sdc.coverage/v1"

NOT_COVERED = [
    "a corruption that changes neither the loss bits nor, with deterministic audits, any "
    "gradient bit of an audited micro-batch",
    "steps between audits: a transient compute error there is caught only if it makes a "
    "gradient non-finite or leaves the replicas' weights different",
    "micro-batches not audited at a step (one position per audit, rotating)",
    "optimizer state (momentum, Adam moments): not fingerprinted; a corruption there shows only "
    "once it changes the weights, which every replica updates alike from the same gradient",
    "the data pipeline: rebuild_batch is trusted to return what the rank trained on",
    "a wrong value after the all-reduce that stays finite: the reduced gradient is checked for "
    "NaN/Inf only, and the weights then differ on that rank until the next weight check",
]


def describe(
    schedule: Schedule,
    *,
    global_ranks: list[int],
    can_confirm: bool,
    scaler: Any | None,
    param_dtypes: list[str],
) -> dict[str, Any]:
    """The coverage description (see the module docstring); every value is JSON-ready."""
    world = len(global_ranks)
    n = schedule.grad_accum
    offset = schedule.peer_offset
    audits_on = schedule.audit_every > 0
    pairs = [
        {
            "replayer": global_ranks[r],
            "target": global_ranks[replay_target(r, world, offset)],
            "third": global_ranks[third_gpu(replay_target(r, world, offset), world, offset)],
        }
        for r in range(world)
    ]
    weights_on = (
        schedule.check_every > 0
        or schedule.check_on_start
        or (schedule.ckpt_every > 0 and schedule.check_on_checkpoint)
    )
    confirm_why = (
        "a rank whose local gradient is non-finite has its micro-batches replayed on a third "
        "GPU on a third node and on itself"
        if can_confirm
        else "the placement puts no third GPU on a third node (peer_offset); non-finite "
        "gradients are named without confirmation"
    )
    if scaler is not None:
        precision = {
            "scaler": type(scaler).__name__,
            "loss_scaling": "every micro-batch's loss is scaled by the scaler's scale in "
            "training and in replays",
            "non_finite": "reproduced on a third GPU at the same scale: an overflow; the step "
            "is skipped by scaler.step and the scale lowered by scaler.update, no alarm; not "
            "reproduced: SDC, alarm naming the rank",
        }
    else:
        precision = {
            "scaler": None,
            "loss_scaling": None,
            "non_finite": "reproduced on a third GPU: verdict 'reproducible', an alarm naming "
            "nobody (numerics or data); not reproduced: SDC, alarm naming the rank",
        }
    precision["parameter_dtypes"] = sorted(set(param_dtypes))
    return {
        "schema": SCHEMA,
        "parallelism": "ddp",
        "world": world,
        "ranks": list(global_ranks),
        "grad_accum": n,
        "checks": {
            "nonfinite_gradients": {
                "on": True,
                "why": "every step: each rank's local gradient before the all-reduce (of the "
                "accumulated micro-batches) and its reduced, clipped gradient after it",
                "confirmation": {"on": can_confirm, "why": confirm_why},
            },
            "replay_audit": {
                "on": audits_on,
                "why": f"every {schedule.audit_every} steps, each rank replays another rank's "
                "micro-batch on another node"
                if audits_on
                else "Schedule.audit_every is 0",
                "every": schedule.audit_every,
                "compares": "loss bits and per-parameter gradient fingerprints"
                if schedule.deterministic_audits
                else "loss bits only (deterministic_audits=False)",
                "pairs": pairs if audits_on else [],
                "micro_batches": {
                    "per_step": n,
                    "audited_per_audit": 1 if audits_on else 0,
                    "rotation": "position (step // audit_every) % grad_accum"
                    if audits_on
                    else None,
                    "every_position_within_audits": n if audits_on else None,
                    # the positions audited at steps 0, audit_every, ..., (N-1) * audit_every
                    "positions_of_first_audits": [
                        schedule.audited_micro_batch(k * schedule.audit_every) for k in range(n)
                    ]
                    if audits_on
                    else [],
                },
            },
            "weight_fingerprints": {
                "on": weights_on,
                "why": "replicas' weights compared bit for bit"
                if weights_on
                else "check_every is 0 and no start-up or checkpoint check is asked for",
                "every": schedule.check_every,
                "on_start": schedule.check_on_start,
                "before_checkpoints": schedule.ckpt_every > 0 and schedule.check_on_checkpoint,
                "replicas": list(global_ranks),
                "attribution": "a rank is named when its copy differs from a strict majority"
                if world >= 3
                else "two replicas: a difference is reported, nobody is named",
            },
        },
        "precision": precision,
        "not_covered": list(NOT_COVERED),
    }

"""What a guard checks for one job, as a JSON-ready description (``Guard.coverage()``).

Built from the schedule, the data-parallel group, the placement and the parallelism adapter's
layout facts (``coverage_facts()``: DDP, FSDP2 full sharding or HSDP), the same on every rank. It
says, per check, whether it runs and why, which ranks replay whom, which replicas are compared,
which micro-batch positions are audited, how fp16/bf16 non-finite gradients are handled, and
what no check covers, so that an operator reads what protection a job really has.
"""

from __future__ import annotations

from typing import Any, TypedDict

from .checks.replay.attribution import replay_target, third_gpu
from .schedule import Schedule

SCHEMA = "sdc.coverage/v1"

BETWEEN_AUDITS = (
    "steps between audits: a transient compute error there is caught only if it makes a "
    "gradient non-finite or leaves the replicas' weights different"
)

BETWEEN_AUDITS_WITH_SENSORS = (
    "steps between audits, outside what the online sensors sample: a transient compute error "
    "in a GEMM or LayerNorm the sensors do not check at that step (see online_sensors' rates "
    "and blind list), or in any other op, is caught only if it makes a gradient non-finite or "
    "leaves the replicas' weights different"
)

NOT_COVERED = [
    "a corruption that changes neither the loss bits nor, with deterministic audits, any "
    "gradient bit of an audited micro-batch",
    BETWEEN_AUDITS,
    "micro-batches not audited at a step (one position per audit, rotating)",
    "optimizer state (momentum, Adam moments): not fingerprinted; a corruption there shows only "
    "once it changes the weights, which every replica updates alike from the same gradient",
    "the data pipeline: rebuild_batch is trusted to return what the rank trained on",
    "a wrong value after the all-reduce that stays finite: the reduced gradient is checked for "
    "NaN/Inf only, and the weights then differ on that rank until the next weight check",
]


NOT_COVERED_FULL_SHARDING = (
    "stored weights under FSDP2 full sharding: each shard has one copy, so check 3 has nothing "
    "to compare; a changed weight is all-gathered by every rank alike, so audits agree with it "
    "too (use HSDP with >= 3 replicas)"
)

NOT_COVERED_SHARDED = (
    "a fault inside FSDP2's all-gather or reduce-scatter that corrupts every rank alike: every "
    "replay then agrees with it"
)


class LayoutFacts(TypedDict):
    """What a parallel layout lets check 3 see (``ParallelAdapter.coverage_facts()``)."""

    parallel: str
    """``ddp``, ``fsdp`` (full sharding) or ``hsdp``."""
    replicas: int
    """Copies of each shard (of the whole weights under DDP)."""
    shards: int
    """Shards each weight is split into (1 under DDP)."""
    weights_compared: bool
    """Whether some weight has a second copy, so check 3 compares anything."""
    weights_named_by_majority: bool
    """Whether a strict majority can name a minority copy (>= 3 replicas)."""
    weights_why: str
    """Why check 3 compares what it does, in a sentence."""
    replicas_of_shard: list[list[int]]
    """Per shard: the global ranks holding a copy of it."""


def ddp_facts(global_ranks: list[int]) -> LayoutFacts:
    """The layout facts of a DDP job (``DDPAdapter.coverage_facts()``): every replica holds all
    the weights."""
    world = len(global_ranks)
    return {
        "parallel": "ddp",
        "replicas": world,
        "shards": 1,
        "weights_compared": world >= 2,
        "weights_named_by_majority": world >= 3,
        "weights_why": f"every replica's full weights compared ({world} replicas)"
        if world >= 2
        else "one replica: no second copy of the weights to compare",
        "replicas_of_shard": [list(global_ranks)],
    }


def describe(
    schedule: Schedule,
    *,
    global_ranks: list[int],
    can_confirm: bool,
    scaler: Any | None,
    param_dtypes: list[str],
    layout: LayoutFacts | None = None,
    sensors_on: bool = False,
) -> dict[str, Any]:
    """The coverage description (see the module docstring); every value is JSON-ready.

    ``layout``: the parallelism adapter's ``coverage_facts()`` (which ranks hold copies of the
    same weights); None: DDP over ``global_ranks``. ``sensors_on``: online sensors check
    sampled GEMMs and LayerNorms between audits, so those steps are not wholly blind."""
    facts = layout if layout is not None else ddp_facts(global_ranks)
    sharded = facts["parallel"] != "ddp"
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
    weights_asked = (
        schedule.check_every > 0
        or schedule.check_on_start
        or (schedule.ckpt_every > 0 and schedule.check_on_checkpoint)
    )
    weights_on = weights_asked and bool(facts["weights_compared"])
    if not facts["weights_compared"]:
        weights_why = facts["weights_why"]
    elif weights_asked:
        weights_why = (
            f"replicas' weights compared bit for bit ({facts['weights_why']})"
            if sharded
            else "replicas' weights compared bit for bit"
        )
    else:
        weights_why = "check_every is 0 and no start-up or checkpoint check is asked for"
    compared_ranks = sorted(r for group in facts["replicas_of_shard"] for r in group)
    between_audits = BETWEEN_AUDITS_WITH_SENSORS if sensors_on else BETWEEN_AUDITS
    not_covered = [between_audits if line is BETWEEN_AUDITS else line for line in NOT_COVERED]
    if sharded:
        not_covered.append(NOT_COVERED_SHARDED)
    if not facts["weights_compared"] and facts["parallel"] == "fsdp":
        not_covered.append(NOT_COVERED_FULL_SHARDING)
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
        if sharded:
            precision["sharded_skip"] = (
                "each rank holds only its shard of the reduced gradient: scaler.unscale_ "
                "max-reduces found_inf over the mesh's shard dimension (HSDP replicas hold the "
                "same shard), so every rank skips an overflowing step and lowers the scale "
                "alike; the guard waits for every step's flags so that no rank applies a step "
                "another drops (one blocking flag reduction per step)"
            )
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
        "parallelism": facts["parallel"],
        "sharding": {
            "replicas": facts["replicas"],
            "shards": facts["shards"],
            "replicas_of_shard": facts["replicas_of_shard"],
            "weight_redundancy": facts["weights_compared"],
        },
        "world": world,
        "ranks": list(global_ranks),
        "grad_accum": n,
        "checks": {
            "nonfinite_gradients": {
                "on": True,
                "why": "every step: each rank's local gradient before the all-reduce (of the "
                "accumulated micro-batches) and its reduced, clipped gradient after it"
                if not sharded
                else "every step: each rank's local, unsharded gradient before the "
                "reduce-scatter (of the accumulated micro-batches) and its shard of the reduced, "
                "clipped gradient after it",
                "confirmation": {"on": can_confirm, "why": confirm_why},
            },
            "replay_audit": {
                "on": audits_on,
                "why": f"every {schedule.audit_every} steps, each rank replays another rank's "
                "micro-batch on another node"
                + (
                    " (collectively: every rank at once, through the sharded module, gradient "
                    "sync off)"
                    if sharded
                    else ""
                )
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
                "why": weights_why,
                "every": schedule.check_every,
                "on_start": schedule.check_on_start,
                "before_checkpoints": schedule.ckpt_every > 0 and schedule.check_on_checkpoint,
                # the ranks whose copies are compared, and per shard the ranks holding it
                "replicas": compared_ranks if facts["weights_compared"] else [],
                "replicas_of_shard": facts["replicas_of_shard"]
                if facts["weights_compared"]
                else [],
                "attribution": (
                    "a rank is named when its copy differs from a strict majority"
                    if facts["weights_named_by_majority"]
                    else "two replicas: a difference is reported, nobody is named"
                )
                if facts["weights_compared"]
                else None,
            },
        },
        "precision": precision,
        "not_covered": not_covered,
    }

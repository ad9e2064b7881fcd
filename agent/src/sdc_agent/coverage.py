"""What a guard checks for one job, as a JSON-ready description (``Guard.coverage()``).

Built from the schedule, the data-parallel group, the placement and the parallelism adapter's
layout facts (``coverage_facts()``: DDP, FSDP2 full sharding or HSDP), the same on every rank. It
says, per check, whether it runs and why, which ranks replay whom, which replicas are compared,
which micro-batch positions are audited, how fp16/bf16 non-finite gradients are handled, and
what no check covers, so that an operator reads what protection a job really has.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NotRequired, TypedDict

from .checks.replay.attribution import replay_target, third_gpu
from .schedule import Schedule

SCHEMA = "sdc.coverage/v1"

BETWEEN_AUDITS = (
    "steps between audits: a transient compute error there is caught only if it makes a "
    "gradient non-finite or leaves the replicas' weights different"
)

BETWEEN_AUDITS_WITH_SENSORS = (
    "steps between audits, outside what the online sensors sample: a transient compute error "
    "in an op whose sensor does not check at that step (see online_sensors' families, rates "
    "and blind list), or in an op without a sensor, is caught only if it makes a gradient "
    "non-finite or leaves the replicas' weights different"
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

NOT_COVERED_TP = [
    "tensor parallel: a wrong value inside a TP collective (the all-reduce or reduce-scatter of "
    "row-parallel partial outputs, sequence parallelism's all-gather) or in a backward result "
    "that a collective reduces before any local result uses it (a column-parallel layer's "
    "input gradient): every rank of the TP group diverges at once, and check 2 names the whole "
    "group (the online sensors check that input-gradient GEMM itself)",
    "tensor parallel with loss-only audits (deterministic_audits=False) or grad_accum > 1: "
    "the local results are not compared in order, so a divergence is named on every rank of "
    "the TP group whose results differ",
    "tensor parallel: a NaN that a TP collective carries to the partners within the step is "
    "named by check 1 on every rank of the group whose local gradient it reached",
]
"""What tensor parallelism leaves to the group rather than the GPU, or uncovered."""

NOT_COVERED_PIPELINE = [
    "a corruption between pipeline stages, in transit (what a stage sent is not what the next "
    "one received): an audit sees replicas disagree with no stage diverging from the same "
    "inputs, and reports it naming nobody; check 1 names nobody for a NaN that appears in "
    "transit",
    "online GEMM sensors: not run under a pipeline (a candidate's confirmation would need one "
    "stage replayed without the others)",
]
"""What no check covers under pipeline parallelism, beyond the data-parallel lines."""

NOT_COVERED_PIPELINE_TP = [
    "tensor parallel inside a pipeline stage: check 2 compares each rank's ordered local results "
    "within its stage, so a forward fault in one rank's TP slice, which the TP all-reduce "
    "carries to its partners before the stage sends it, names that GPU (its pairs diverged "
    "first); a wrong value inside a TP collective (the all-reduce of row-parallel partial "
    "outputs) or in a backward result a collective reduces before any local result uses it, and "
    "any divergence under loss-only audits (deterministic_audits=False), names every rank of "
    "the stage's TP group it reached (its node, never another)",
]
"""What tensor parallelism inside pipeline stages leaves to the stage's TP group."""


NOT_COVERED_EP = [
    "expert parallel: the replay audit does not yet run (routing and the all-to-all dispatch "
    "and combine are not replayed): a finite wrong value in an expert's grouped GEMM, the "
    "router's logits or top-k choice, or an all-to-all is caught only if it makes a gradient "
    "non-finite or leaves the replicas' weights different",
    "expert parallel: the online sensors do not run (sdc.protect does not instrument grouped "
    "GEMMs, torch._grouped_mm, or the router, and a candidate would need a replay to confirm)",
    "expert parallel: a NaN that the combine all-to-all carries to the EP partners within the "
    "step is named by check 1 on every rank whose local gradient it reached, without a "
    "confirmation replay",
]
"""What expert parallel (torchtitan's over HSDP) leaves uncovered, beyond HSDP's lines."""


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
    """Per shard (per stage and shard under a pipeline): the global ranks holding a copy of it."""
    stages: NotRequired[int]
    """Pipeline stages (each holds its own weights, split into ``shards`` shards)."""
    mesh: NotRequired[dict[str, int]]
    """Sharded layouts: each mesh dimension's role and size (``replicate``, ``shard``, ``tp``)."""
    compute_groups: NotRequired[list[list[int]]]
    """Tensor parallel: the ranks of each TP group (they compute one micro-batch together)."""
    expert_groups: NotRequired[list[list[int]]]
    """Expert parallel: the ranks of each EP group (they exchange tokens by all-to-all)."""
    replays_off: NotRequired[str]
    """Why the layout runs no replay (check 2 and its confirmations off), when it runs none."""


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
    replica_columns: Sequence[Sequence[int]] | None = None,
    pipeline: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The coverage description (see the module docstring); every value is JSON-ready.

    ``layout``: the parallelism adapter's ``coverage_facts()`` (which ranks hold copies of the
    same weights); None: DDP over ``global_ranks``. ``sensors_on``: online sensors check the
    sampled ops (GEMMs, norms, the functions a forward calls) between audits, so those steps are
    not wholly blind. ``replica_columns``: the adapter's rings of replicas
    (``replica_columns()``; None: one ring over ``global_ranks``); ``pipeline``: the pipeline's
    shape (``PipelineAdapter.pipeline_facts()``) when a pipeline schedule drives the model."""
    facts = layout if layout is not None else ddp_facts(global_ranks)
    sharded = facts["parallel"] != "ddp"
    world = len(global_ranks)
    n = schedule.grad_accum
    offset = schedule.peer_offset
    audits_on = schedule.audit_every > 0
    pairs = [
        {
            "replayer": ring[r],
            "target": ring[replay_target(r, len(ring), offset)],
            "third": ring[third_gpu(replay_target(r, len(ring), offset), len(ring), offset)],
        }
        for ring in (replica_columns or [global_ranks])
        for r in range(len(ring))
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
    if facts.get("expert_groups"):
        not_covered += NOT_COVERED_EP
    if not facts["weights_compared"] and facts["parallel"] in (
        "fsdp",
        "fsdp+tp",
        "pp+fsdp",
        "pp+fsdp+tp",
    ):
        not_covered.append(NOT_COVERED_FULL_SHARDING)
    groups = facts.get("compute_groups")
    if groups:
        not_covered += NOT_COVERED_TP
    if pipeline is not None:
        not_covered += NOT_COVERED_PIPELINE
        if pipeline.get("tp_groups"):
            not_covered += NOT_COVERED_PIPELINE_TP
    confirm_why = (
        "a rank whose local gradient is non-finite has its micro-batches replayed on a third "
        "GPU on a third node and on itself"
        if can_confirm
        else "the placement puts no third GPU on a third node (peer_offset); non-finite "
        "gradients are named without confirmation"
    )
    if "replays_off" in facts:  # no replay runs: a non-finite gradient is named unconfirmed
        can_confirm = False
        confirm_why = f"no confirmation replay: {facts['replays_off']}"
    precision: dict[str, Any]
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
    gradients_why = (
        "every step: each rank's local gradient before the all-reduce (of the accumulated "
        "micro-batches) and its reduced, clipped gradient after it"
        if not sharded
        else "every step: each rank's local, unsharded gradient before the reduce-scatter (of "
        "the accumulated micro-batches) and its shard of the reduced, clipped gradient after it"
    )
    audit_why = (
        f"every {schedule.audit_every} steps, each rank replays another rank's micro-batch on "
        "another node"
        + (
            " (collectively: every rank at once, through the sharded module, gradient sync off)"
            if sharded
            else ""
        )
    )
    compares = (
        "loss bits and per-parameter gradient fingerprints"
        if schedule.deterministic_audits
        else "loss bits only (deterministic_audits=False)"
    )
    if pipeline is not None:
        gradients_why = (
            "every step: each rank's local gradient of its stage before the data-parallel "
            "reduction (every micro-batch of each pipeline step) and its shard of the reduced, "
            "clipped gradient after it (clipped by the norm over every stage); a NaN/Inf is "
            "named on the stage where it started (finite inputs, non-finite outputs or "
            "gradients), not on the stages it flowed to; every rank waits for each step's "
            "flags, so the stages apply a step together or not at all"
        )
        audit_why = (
            f"every {schedule.audit_every} steps, each replica replays another replica's "
            "pipeline step on another node (every stage at once, through the sharded stages, "
            "data-parallel reduction off); each rank is compared with the same stage of the "
            "replica it replayed, and only a stage that diverged from the same inputs is named"
        )
        compares = (
            "per stage: activations received and sent, the last stage's loss bits, gradients "
            "received and sent back, and local parameter gradient fingerprints"
            if schedule.deterministic_audits
            else "per stage: activations received and sent and the last stage's loss bits "
            "(deterministic_audits=False)"
        )
        if schedule.deterministic_audits and pipeline.get("tp_groups"):
            compares += (
                "; inside each stage's TP group, each rank's local results in the order it "
                "computed them (module outputs before tensor parallel's collectives, local "
                "gradient slices): the pairs whose local results diverged first name the GPU, "
                "not its TP group"
            )
    if groups:
        local = (
            "each TP group replays another group's micro-batch collectively, every rank its own "
            "slice of it (the ranks at the same tp coordinate compared)"
        )
        audit_why = (
            f"every {schedule.audit_every} steps, {local}, on another node, gradient sync off"
        )
        compares = (
            "loss bits and each rank's local results in the order it computed them: the output "
            "of every module with parameters before its output hooks (a column-parallel "
            "layer's local columns, a row-parallel layer's partial output before the "
            "all-reduce) and each local gradient slice before the reduce-scatter; the pairs "
            "whose local results diverged first name the GPU, not its TP group"
            if schedule.deterministic_audits and n == 1
            else "loss bits and per-parameter fingerprints of each rank's local gradient slice "
            "(not in order: a divergence is named on every rank of the TP group it reached)"
            if schedule.deterministic_audits
            else "loss bits only (deterministic_audits=False)"
        )
        gradients_why = (
            "every step: each rank's local gradient slice (its TP slice, unsharded by FSDP2) "
            "before the reduce-scatter (of the accumulated micro-batches) and its shard of the "
            "reduced, clipped gradient after it"
        )
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "parallelism": facts["parallel"],
        "sharding": {
            "replicas": facts["replicas"],
            "shards": facts["shards"],
            "replicas_of_shard": facts["replicas_of_shard"],
            "weight_redundancy": facts["weights_compared"],
            **({"stages": facts["stages"]} if "stages" in facts else {}),
        },
        "world": world,
        "ranks": list(global_ranks),
        "grad_accum": n,
        "checks": {
            "nonfinite_gradients": {
                "on": True,
                "why": gradients_why,
                "confirmation": {"on": can_confirm, "why": confirm_why},
            },
            "replay_audit": {
                "on": audits_on,
                "why": audit_why if audits_on else "Schedule.audit_every is 0",
                "every": schedule.audit_every,
                "compares": compares,
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
    if "mesh" in facts:
        report["mesh"] = facts["mesh"]
    if groups:
        report["checks"]["replay_audit"]["compute_groups"] = groups
    if pipeline is not None:
        report["pipeline"] = pipeline
    return report

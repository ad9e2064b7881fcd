"""guard.coverage()'s description, from the schedule and the group alone (no processes)."""

from __future__ import annotations

import json

from sdc_agent import Schedule
from sdc_agent.coverage import describe


def test_a_default_kernel_audit_says_it_compares_losses_only_and_json_round_trips():
    # Given loss-only audits every 3 steps, 2 micro-batches, 3 replicas, no scaler
    cov = describe(
        Schedule(audit_every=3, deterministic_audits=False, peer_offset=1, grad_accum=2),
        global_ranks=[10, 11, 12],
        can_confirm=True,
        scaler=None,
        param_dtypes=["float32", "float32"],
    )
    # Then it is JSON as it is, and says what is compared and which positions are audited
    assert json.loads(json.dumps(cov)) == cov
    audit = cov["checks"]["replay_audit"]
    assert audit["compares"].startswith("loss bits only")
    assert audit["pairs"][0] == {"replayer": 10, "target": 11, "third": 12}
    assert audit["micro_batches"]["positions_of_first_audits"] == [0, 1]
    assert "reproducible" in cov["precision"]["non_finite"]
    assert cov["precision"]["parameter_dtypes"] == ["float32"]


def test_weights_of_two_replicas_are_compared_without_naming_anyone():
    cov = describe(
        Schedule(audit_every=0, check_every=0, check_on_start=False),
        global_ranks=[0, 1],
        can_confirm=False,
        scaler=None,
        param_dtypes=["bfloat16"],
    )
    weights = cov["checks"]["weight_fingerprints"]
    assert not weights["on"] and "check_every is 0" in weights["why"]
    assert "nobody is named" in weights["attribution"]
    confirmation = cov["checks"]["nonfinite_gradients"]["confirmation"]
    assert not confirmation["on"] and "no third GPU" in confirmation["why"]


def test_steps_between_audits_are_blind_only_without_sensors():
    # Given the same job described without and with online sensors
    def between_audits(sensors_on: bool) -> list[str]:
        cov = describe(
            Schedule(audit_every=5),
            global_ranks=[0, 1, 2],
            can_confirm=True,
            scaler=None,
            param_dtypes=["float32"],
            sensors_on=sensors_on,
        )
        return [line for line in cov["not_covered"] if line.startswith("steps between audits")]

    # Then without sensors those steps are blind but for non-finite gradients and weight checks
    (without,) = between_audits(False)
    assert "caught only if it makes a gradient non-finite" in without
    assert "sensors" not in without
    # And with sensors only what they do not sample at that step is left blind
    (with_sensors,) = between_audits(True)
    assert "outside what the online sensors sample" in with_sensors


def tp_facts(replicas: int) -> dict:
    """Layout facts of 3 TP groups of 2 ranks, with HSDP replicas (3) or FSDP2 shards (1)."""
    hsdp = replicas > 1
    return {
        "parallel": "hsdp+tp" if hsdp else "fsdp+tp",
        "replicas": replicas,
        "shards": 6 // replicas,
        "weights_compared": hsdp,
        "weights_named_by_majority": hsdp,
        "weights_why": "each (shard, tp) slice compared across its 3 replicas"
        if hsdp
        else "no replicate dimension: one copy per slice",
        "replicas_of_shard": [[0, 2, 4], [1, 3, 5]] if hsdp else [[r] for r in range(6)],
        "mesh": {"replicate": 3, "shard": 1, "tp": 2} if hsdp else {"dp": 3, "tp": 2},
        "compute_groups": [[0, 1], [2, 3], [4, 5]],
    }


def tp_coverage(replicas: int, grad_accum: int = 1) -> dict:
    """coverage() of 3 TP groups of 2 (:func:`tp_facts`), audits and weight checks every 5."""
    return describe(
        Schedule(audit_every=5, check_every=5, peer_offset=2, grad_accum=grad_accum),
        global_ranks=list(range(6)),
        can_confirm=True,
        scaler=None,
        param_dtypes=["float32"],
        layout=tp_facts(replicas),
    )


def test_tensor_parallel_coverage_says_what_is_compared_and_what_only_names_the_group():
    # Given HSDP x TP with deterministic audits and no accumulation
    cov = tp_coverage(3)
    # Then the report names the mesh, the TP groups and the ordered local results compared
    assert json.loads(json.dumps(cov)) == cov
    assert (cov["parallelism"], cov["mesh"]) == ("hsdp+tp", {"replicate": 3, "shard": 1, "tp": 2})
    audit = cov["checks"]["replay_audit"]
    assert audit["compute_groups"] == [[0, 1], [2, 3], [4, 5]]
    assert "partial output before the all-reduce" in audit["compares"]
    assert "name the GPU, not its TP group" in audit["compares"]
    assert "each TP group replays another group's micro-batch" in audit["why"]
    assert cov["checks"]["weight_fingerprints"]["on"]
    # And it says what TP leaves to the group: collectives, loss-only audits, check 1's NaN
    tp_lines = [line for line in cov["not_covered"] if line.startswith("tensor parallel")]
    assert len(tp_lines) == 3 and "whole group" in tp_lines[0]
    # And with accumulation the per-parameter tables name every rank the divergence reached
    accum = tp_coverage(3, grad_accum=2)
    assert "not in order" in accum["checks"]["replay_audit"]["compares"]


def test_fsdp_x_tp_coverage_says_stored_weights_are_not_compared():
    cov = tp_coverage(1)
    assert not cov["checks"]["weight_fingerprints"]["on"]
    assert any(line.startswith("stored weights under FSDP2") for line in cov["not_covered"])


def test_tp_inside_pipeline_stages_keeps_the_pipelines_texts_and_says_what_names_the_group():
    # Given TP x PP x HSDP on 12 ranks: 2 stages x TP 2 per replica, 3 replicas (the stage's
    # facts as PipelineAdapter gives them: no compute_groups among the layout facts, every
    # stage's TP groups, the job's, under the pipeline's)
    columns = [[0, 1, 4, 5, 8, 9], [2, 3, 6, 7, 10, 11]]
    facts = {
        "parallel": "pp+hsdp+tp",
        "replicas": 3,
        "shards": 4,
        "weights_compared": True,
        "weights_named_by_majority": True,
        "weights_why": "each stage's shards compared across their 3 replicas, stage by stage",
        "replicas_of_shard": [[0, 4, 8], [1, 5, 9], [2, 6, 10], [3, 7, 11]],
        "mesh": {"pp": 2, "replicate": 3, "shard": 1, "tp": 2},
    }
    pipeline = {
        "stages": 2,
        "schedule": "ScheduleGPipe",
        "micro_batches": 2,
        "replicas": 6,
        "stage_ranks": columns,
        "tp_groups": [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11]],
    }
    cov = describe(
        Schedule(audit_every=5, check_every=5, peer_offset=2),
        global_ranks=list(range(12)),
        can_confirm=True,
        scaler=None,
        param_dtypes=["float32"],
        layout=facts,
        replica_columns=columns,
        pipeline=pipeline,
    )
    # Then the report is the pipeline's: its per-stage comparison, its rings of pipelines, the
    # stages' TP groups and the whole mesh
    assert json.loads(json.dumps(cov)) == cov
    assert cov["parallelism"] == "pp+hsdp+tp" and cov["mesh"] == facts["mesh"]
    audit = cov["checks"]["replay_audit"]
    assert audit["compares"].startswith("per stage:")
    assert {"replayer": 0, "target": 4, "third": 8} in audit["pairs"]
    assert cov["pipeline"]["tp_groups"] == pipeline["tp_groups"]
    # And inside each stage it compares the ordered local results, which name the GPU
    assert "the pairs whose local results diverged first name the GPU" in audit["compares"]
    # And it says that a forward fault in one rank's slice names that GPU, and what is still
    # left to the stage's TP group (a wrong value inside a TP collective, loss-only audits)
    (line,) = [x for x in cov["not_covered"] if x.startswith("tensor parallel inside a pipeline")]
    assert "names that GPU" in line
    assert "inside a TP collective" in line and "deterministic_audits=False" in line
    assert "names every rank of the stage's TP group it reached" in line
    # And stored weights are compared (HSDP copies of each slice)
    assert cov["checks"]["weight_fingerprints"]["on"]

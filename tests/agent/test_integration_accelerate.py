"""sdc-guard in an Accelerate loop (AcceleratorGuard): 3 nodes x 2 ranks, gloo, CPU.

One launch runs every scenario (process start-up dominates on 2 cores); each test asserts its
own. Accumulation: 2 micro-batches per step through ``accelerator.accumulate``. Rank R=3 (node
1) is replayed by rank 1 (node 0), disputes go to rank 5 (node 2). The FSDP2 row runs
Accelerate's own FSDP2 preparation (full sharding over the 6 ranks).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.agent.frameworks.cloudwatch import moto_endpoint, published  # noqa: F401
from tests.agent.frameworks.common import R, launch
from tests.agent.outcomes import ok, the_alarm
from tests.agent.test_publish_cloudwatch import aws_env  # noqa: F401  (autouse)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

JOB = "tests.agent.frameworks.accelerate_jobs:train"
EXAMPLE = "tests.agent.frameworks.accelerate_jobs:docs_example"


@pytest.fixture(scope="module")
def results(moto_endpoint, tmp_path_factory) -> dict[str, list[dict[str, Any]]]:  # noqa: F811
    root = tmp_path_factory.mktemp("accelerate")
    run, spool = str(root / "run"), str(root / "spool")
    publish = {"endpoint": moto_endpoint, "spool_root": spool, "job": "accelerate-faulty"}
    jobs = {
        "faulty": (
            JOB,
            {
                "steps": 14,
                "faults": ["forward"],
                "ckpt_every": 5,
                "run_dir": run,
                "publish": publish,
            },
        ),
        "resume": (JOB, {"steps": 9, "ckpt_every": 5, "run_dir": run, "resume_from": 9}),
        "weights": (
            JOB,
            {"steps": 14, "faults": ["weight"], "ckpt_every": 5, "run_dir": str(root / "w")},
        ),
        "fsdp2_faulty": (JOB, {"steps": 14, "faults": ["forward"], "parallel": "fsdp2"}),
        "clean": (JOB, {"steps": 50}),
        "example": (
            EXAMPLE,
            {
                "steps": 12,
                "run_dir": str(root / "example"),
                "publish": {**publish, "job": "accelerate-example"},
            },
        ),
    }
    per_job = launch(list(jobs.values()), world=6, ranks_per_node=2, timeout_s=1100)
    return dict(zip(jobs, per_job, strict=True))


def assert_stopped_before(per_rank: list[dict[str, Any]], step: int) -> None:
    """Every rank applied steps 0..step-1 exactly (its optimizer's own record and AdamW's
    counters), and its weights are still what the update of step - 1 left."""
    assert len(per_rank) == 6
    for r in per_rank:
        assert r["updates"] == list(range(step)), r["updates"]
        assert r["adamw_steps"] == [step]
        assert r["weights_as_last_update_left"]


@pytest.mark.parametrize("name", ["faulty", "fsdp2_faulty"])
def test_a_persistent_fault_is_named_at_the_next_audit_and_the_step_is_not_applied(results, name):
    # Given x1000 on one output element of net.2 on rank R from step 7; audits every 5
    alarm = the_alarm(results, name)
    # Then the audit of step 10 names R, wrong as target and as replayer
    assert (alarm["step"], alarm["check"], alarm["suspects"]) == (10, "compute", [R])
    assert alarm["mismatched_pairs"] == [[R, 1], [5, R]] and alarm["culprits"] == [R]
    assert alarm["suspect_window"] == [5, 10]
    # And no rank applied step 10: optimizer_step returned the alarm instead
    assert_stopped_before(results[name], 10)


def test_the_alarm_is_published_once_to_cloudwatch(results, moto_endpoint):  # noqa: F811
    alarm = the_alarm(results, "faulty")
    assert all(r["delivered"] for r in results["faulty"])
    sent = published(moto_endpoint, "accelerate-faulty")
    (report,) = sent["reports"]
    report.pop("time")
    assert report == {**alarm, "cluster": "integrations", "job": "accelerate-faulty"}
    assert sent["metric"]("sdc_replay_mismatch") == (2.0, 1.0)


def test_checkpoints_before_the_alarm_are_saved_verified_and_tagged(results):
    # Given checkpoints due after steps 4 and 9 (ckpt_every=5), the alarm at step 10
    for r in results["faulty"]:
        # Then both were saved, each after its weights were compared, and nothing after
        assert [s for s, _ in r["saves"]] == [4, 9]
        assert all(tags["weights_verified"] and tags["step"] == s for s, tags in r["saves"])
    digests = {r["saves"][1][1]["weights_digest"] for r in results["faulty"]}
    assert len(digests) == 1  # every replica agreed


def test_a_weight_flip_blocks_the_checkpoint(results):
    # Given one bit of rank 0's net.0.weight flipped after step 6's update
    alarm = the_alarm(results, "weights")
    # Then save_state's check before the checkpoint of step 9 names rank 0 and nothing is saved
    assert (alarm["step"], alarm["check"], alarm["suspects"]) == (9, "weights", [0])
    assert alarm["divergent_tensors"] == ["net.0.weight"]
    assert all([s for s, _ in r["saves"]] == [4] for r in results["weights"])


def test_a_covered_checkpoint_is_refused_and_the_clean_one_resumes(results):
    per_rank = ok(results, "resume")
    for r in per_rank:
        # Given the checkpoint of step 9, saved inside the alarm's window [5, 10]
        # Then load_state refuses it on every rank, naming the alarm and the clean step
        assert "refusing to resume from the checkpoint of step 9" in r["refused"]
        assert "compute alarm of step 10" in r["refused"]
        # And the job resumed from step 4's checkpoint and trained past step 10 without alarm
        assert r["start"] == 5 and r["alarm"] is None
        assert r["updates"] == list(range(5, 14))


def test_fifty_fault_free_steps_raise_no_alarm(results):
    per_rank = ok(results, "clean")
    assert all(r["alarm"] is None and r["updates"] == list(range(50)) for r in per_rank)
    (rank0,) = [r for r in per_rank if r["rank"] == 0]
    # Every audit (steps 0, 5, ..., 45) and weight check (start, after 4, 9, ..., 49) passed
    assert rank0["audit_passes"] == 10
    assert rank0["weight_check_passes"] == 11
    assert rank0["alarms_published"] == 0


def test_the_docs_example_runs_as_written(results):
    per_rank = ok(results, "example")
    assert all(r["alarm"] is None and r["steps_applied"] == 12 for r in per_rank)
    assert all(r["last_audit_pass"] == 0 and r["delivered"] for r in per_rank)

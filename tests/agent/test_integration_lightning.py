"""sdc-guard in PyTorch Lightning (SDCGuardCallback): 3 nodes x 2 ranks, gloo, CPU.

One launch runs every scenario; each test asserts its own. ``accumulate_grad_batches=2``,
``ModelCheckpoint(every_n_train_steps=5)``; the DDP rows run Lightning's DDPStrategy, the HSDP
rows its FSDP2 ModelParallelStrategy with ``fully_shard`` on a (3 replicas x 2 shards) mesh in
``configure_model``. Rank R=3 (node 1) is replayed by rank 1 (node 0).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.agent.frameworks.cloudwatch import moto_endpoint, published  # noqa: F401
from tests.agent.frameworks.common import R, launch
from tests.agent.outcomes import ok, the_alarm
from tests.agent.test_publish_cloudwatch import aws_env  # noqa: F401  (autouse)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

JOB = "tests.agent.frameworks.lightning_jobs:train"
EXAMPLE = "tests.agent.frameworks.lightning_jobs:docs_example"


@pytest.fixture(scope="module")
def results(moto_endpoint, tmp_path_factory) -> dict[str, list[dict[str, Any]]]:  # noqa: F811
    root = tmp_path_factory.mktemp("lightning")
    run, spool = str(root / "run"), str(root / "spool")
    publish = {"endpoint": moto_endpoint, "spool_root": spool, "job": "lightning-faulty"}
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
        "resume": (JOB, {"steps": 14, "ckpt_every": 5, "run_dir": run, "resume": True}),
        "weights": (
            JOB,
            {"steps": 14, "faults": ["weight"], "ckpt_every": 5, "run_dir": str(root / "w")},
        ),
        "hsdp_faulty": (JOB, {"steps": 14, "faults": ["forward"], "parallel": "hsdp"}),
        "hsdp_weights": (JOB, {"steps": 14, "faults": ["weight"], "parallel": "hsdp"}),
        "clean": (JOB, {"steps": 50}),
        "example": (
            EXAMPLE,
            {
                "steps": 12,
                "run_dir": str(root / "example"),
                "publish": {**publish, "job": "lightning-example"},
            },
        ),
    }
    per_job = launch(list(jobs.values()), world=6, ranks_per_node=2, timeout_s=1100)
    return dict(zip(jobs, per_job, strict=True))


def assert_stopped_before(per_rank: list[dict[str, Any]], step: int) -> None:
    """Every rank's optimizer applied steps 0..step-1 exactly, Lightning's own step counter
    says so, and its weights are still what the update of step - 1 left."""
    assert len(per_rank) == 6
    for r in per_rank:
        assert r["updates"] == list(range(step)), r["updates"]
        assert r["global_step"] == step
        assert r["weights_as_last_update_left"]


@pytest.mark.parametrize("name", ["faulty", "hsdp_faulty"])
def test_a_persistent_fault_is_named_at_the_next_audit_and_the_step_is_not_applied(results, name):
    # Given x1000 on one output element of net.2 on rank R from step 7; audits every 5
    alarm = the_alarm(results, name)
    # Then the audit of step 10 names R, wrong as target and as replayer
    assert (alarm["step"], alarm["check"], alarm["suspects"]) == (10, "compute", [R])
    assert alarm["mismatched_pairs"] == [[R, 1], [5, R]] and alarm["culprits"] == [R]
    # And on_alarm ran on every rank, then fit stopped before Lightning applied step 10
    assert all(r["on_alarm_calls"] == [10] for r in results[name])
    assert_stopped_before(results[name], 10)


def test_the_alarm_is_published_once_to_cloudwatch(results, moto_endpoint):  # noqa: F811
    alarm = the_alarm(results, "faulty")
    assert all(r["delivered"] for r in results["faulty"])
    sent = published(moto_endpoint, "lightning-faulty")
    (report,) = sent["reports"]
    report.pop("time")
    assert report == {**alarm, "cluster": "integrations", "job": "lightning-faulty"}
    assert sent["metric"]("sdc_replay_mismatch") == (2.0, 1.0)


def test_model_checkpoints_before_the_alarm_are_tagged_and_none_after(results):
    (rank0,) = [r for r in results["faulty"] if r["rank"] == 0]
    # Given ModelCheckpoint every 5 steps (global steps 5 and 10: guard steps 4 and 9)
    assert rank0["saved"] == ["epoch=0-step=5.ckpt", "epoch=1-step=10.ckpt"]
    tags = rank0["tags"]
    # Then each carries the guard's tags, its weights verified when it was written
    assert tags["epoch=0-step=5.ckpt"]["step"] == 4
    assert tags["epoch=1-step=10.ckpt"]["step"] == 9
    assert all(t["weights_verified"] and len(t["weights_digest"]) == 64 for t in tags.values())


def test_a_weight_flip_blocks_the_model_checkpoint(results):
    # Given one bit of rank 0's net.0.weight flipped after step 6's update
    alarm = the_alarm(results, "weights")
    # Then the check on_save_checkpoint runs names rank 0, and the step-10 file is not written
    assert (alarm["step"], alarm["check"], alarm["suspects"]) == (9, "weights", [0])
    assert alarm["divergent_tensors"] == ["model.net.0.weight"]
    assert all(r["saved"] == ["epoch=0-step=5.ckpt"] for r in results["weights"])


def test_under_hsdp_a_weight_flip_is_named_and_the_next_step_not_applied(results):
    # Given the same flip under HSDP (each shard has 3 replicas): the periodic weight check
    # after step 9 is judged during step 10
    alarm = the_alarm(results, "hsdp_weights")
    assert (alarm["step"], alarm["check"], alarm["suspects"]) == (9, "weights", [0])
    assert_stopped_before(results["hsdp_weights"], 10)


def test_a_covered_checkpoint_is_refused_and_the_clean_one_resumes(results):
    for r in ok(results, "resume"):
        # Given the newest checkpoint (guard step 9), inside the alarm's window [5, 10]
        # Then trainer.fit refuses it on every rank before any step
        assert r["refused"].startswith("epoch=1-step=10.ckpt: ")
        assert "refusing to resume from the checkpoint of step 9" in r["refused"]
        # And clean_checkpoint chose step=5; the job trained past step 10 with no alarm
        assert r["start"] == 5 and r["alarm"] is None
        assert r["updates"] == list(range(5, 14)) and r["global_step"] == 14


def test_fifty_fault_free_steps_raise_no_alarm(results):
    per_rank = ok(results, "clean")
    assert all(r["alarm"] is None and r["updates"] == list(range(50)) for r in per_rank)
    (rank0,) = [r for r in per_rank if r["rank"] == 0]
    assert rank0["audit_passes"] == 10
    assert rank0["weight_check_passes"] == 11
    assert rank0["alarms_published"] == 0


def test_the_docs_example_runs_as_written(results):
    per_rank = ok(results, "example")
    assert all(r["alarm"] is None and r["global_step"] == 12 for r in per_rank)
    assert all(r["last_audit_pass"] == 0 and r["delivered"] for r in per_rank)


def test_by_default_every_rank_exits_3_with_its_termination_message(tmp_path):
    # Given the callback's default on_alarm (sdc.exit_on_alarm) and the persistent fault
    log = tmp_path / "termination"
    job = (JOB, {"steps": 14, "faults": ["forward"], "termination_log": str(log)})
    # When the audit of step 10 fires, then every process exits 3 without returning a result
    with pytest.raises(RuntimeError, match="exited with code 3 and no result"):
        launch([job], world=6, ranks_per_node=2, timeout_s=600)
    # And each rank wrote the termination message Kubernetes shows for the pod
    for rank in range(6):
        message = json.loads((tmp_path / f"termination.rank{rank}").read_text())
        assert message["exit_code"] == 3 and message["check"] == "compute"
        assert (message["step"], message["suspects"]) == (10, [R])

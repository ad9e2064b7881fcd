"""sdc-guard around torchtitan's parts (TitanGuard): 3 nodes x 2 ranks, gloo, CPU.

One launch runs every scenario; each test asserts its own. torchtitan's Llama 3 (built from its
config classes, SDPA attention), sharded by its ``apply_fsdp_to_decoder`` on its HSDP mesh
(``("dp_replicate", "fsdp")``: 3 replicas x 2 shards), its AdamW container, LR scheduler,
cross-entropy over the step's global token count, ``clip_grad_norm_`` and DCP
``CheckpointManager`` (interval 5). Two micro-batches per step. Rank R=3 (node 1) is replayed by
rank 1 (node 0).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.agent.frameworks.cloudwatch import moto_endpoint, published  # noqa: F401
from tests.agent.frameworks.common import R, launch
from tests.agent.outcomes import ok, the_alarm
from tests.agent.test_publish_cloudwatch import aws_env  # noqa: F401  (autouse)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

JOB = "tests.agent.frameworks.torchtitan_jobs:train"
EXAMPLE = "tests.agent.frameworks.torchtitan_jobs:docs_example"


@pytest.fixture(scope="module")
def results(moto_endpoint, tmp_path_factory) -> dict[str, list[dict[str, Any]]]:  # noqa: F811
    root = tmp_path_factory.mktemp("torchtitan")
    run, spool = str(root / "run"), str(root / "spool")
    publish = {"endpoint": moto_endpoint, "spool_root": spool, "job": "torchtitan-faulty"}
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
        "clean": (JOB, {"steps": 50}),
        "example": (
            EXAMPLE,
            {
                "steps": 12,
                "run_dir": str(root / "example"),
                "publish": {**publish, "job": "torchtitan-example"},
            },
        ),
    }
    per_job = launch(list(jobs.values()), world=6, ranks_per_node=2, timeout_s=1400)
    return dict(zip(jobs, per_job, strict=True))


def assert_stopped_before(per_rank: list[dict[str, Any]], step: int) -> None:
    """Every rank's optimizer container applied steps 0..step-1 exactly (its own record and
    AdamW's counters), and every rank's shards are what the update of step - 1 left."""
    assert len(per_rank) == 6
    for r in per_rank:
        assert r["updates"] == list(range(step)), r["updates"]
        assert r["adamw_steps"] == [step]
        assert r["weights_as_last_update_left"]


def test_a_persistent_fault_is_named_at_the_next_audit_and_the_step_is_not_applied(results):
    # Given x1000 on one output element of layer 0's w2 on rank R from step 7; audits every 5
    alarm = the_alarm(results, "faulty")
    # Then the audit of step 10 names R, wrong as target and as replayer
    assert (alarm["step"], alarm["check"], alarm["suspects"]) == (10, "compute", [R])
    assert alarm["mismatched_pairs"] == [[R, 1], [5, R]] and alarm["culprits"] == [R]
    # And no rank applied step 10 (torchtitan's step 11)
    assert_stopped_before(results["faulty"], 10)


def test_the_alarm_is_published_once_to_cloudwatch(results, moto_endpoint):  # noqa: F811
    alarm = the_alarm(results, "faulty")
    assert all(r["delivered"] for r in results["faulty"])
    sent = published(moto_endpoint, "torchtitan-faulty")
    (report,) = sent["reports"]
    report.pop("time")
    assert report == {**alarm, "cluster": "integrations", "job": "torchtitan-faulty"}
    assert sent["metric"]("sdc_replay_mismatch") == (2.0, 1.0)


def test_checkpoints_before_the_alarm_are_written_and_none_after(results):
    # Given the CheckpointManager's interval 5: step-5 and step-10 (guard steps 4 and 9)
    assert all(r["saved"] == ["step-10", "step-5"] for r in results["faulty"])


def test_a_weight_flip_blocks_the_checkpoint(results):
    # Given one bit of rank 0's shard of layer 0's w1 flipped after step 6's update
    alarm = the_alarm(results, "weights")
    # Then the check before the checkpoint of step 9 names rank 0; step-10 is never written
    assert (alarm["step"], alarm["check"], alarm["suspects"]) == (9, "weights", [0])
    assert alarm["divergent_tensors"] == ["layers.0.feed_forward.w1.weight"]
    assert all(r["saved"] == ["step-5"] for r in results["weights"])


def test_a_covered_checkpoint_is_refused_and_the_clean_one_resumes(results):
    for r in ok(results, "resume"):
        # Given step-10 (guard step 9), inside the alarm's window [5, 10]
        # Then training from it is refused on every rank
        assert r["refused"].startswith("step-10: ")
        assert "refusing to resume from the checkpoint of step 9" in r["refused"]
        # And TitanGuard.resume loaded step-5, whose tags came back through DCP
        assert r["start"] == 5
        assert r["loaded_tags"]["step"] == 4 and r["loaded_tags"]["weights_verified"] is True
        # And training passed step 10 with no alarm
        assert r["alarm"] is None and r["updates"] == list(range(5, 14))


def test_fifty_fault_free_steps_raise_no_alarm(results):
    per_rank = ok(results, "clean")
    assert all(r["alarm"] is None and r["updates"] == list(range(50)) for r in per_rank)
    (rank0,) = [r for r in per_rank if r["rank"] == 0]
    assert rank0["audit_passes"] == 10
    assert rank0["weight_check_passes"] == 11
    assert rank0["alarms_published"] == 0


def test_the_docs_example_runs_as_written(results):
    per_rank = ok(results, "example")
    assert all(r["alarm"] is None and r["start"] == 0 for r in per_rank)
    assert all(r["saved"] == ["step-10", "step-5"] for r in per_rank)
    assert all(r["last_audit_pass"] == 0 and r["delivered"] for r in per_rank)

"""sdc-guard in PyTorch Lightning (SDCGuardCallback): 3 nodes x 2 ranks, gloo, CPU.

One launch runs every row (tests/agent/frameworks/expectations.py says what each shows); each
test asserts its own. ``accumulate_grad_batches=2``, ``ModelCheckpoint(every_n_train_steps=5)``;
the standard rows run Lightning's DDPStrategy, the ``hsdp`` rows its FSDP2
ModelParallelStrategy with ``fully_shard`` on a (3 replicas x 2 shards) mesh in
``configure_model``.
"""

from __future__ import annotations

import json

import pytest

from tests.agent.frameworks import expectations as expect
from tests.agent.frameworks.cloudwatch import moto_endpoint  # noqa: F401  (fixture)
from tests.agent.frameworks.common import R, launch
from tests.agent.outcomes import the_alarm
from tests.agent.test_publish_cloudwatch import aws_env  # noqa: F401  (autouse)

# How long this file's processes may run before the launcher kills them; the suite's conftest
# marks the file slow and gives pytest-timeout this plus a margin.
LAUNCH_DEADLINE_S = 1100


JOBS = "tests.agent.frameworks.lightning_jobs"


@pytest.fixture(scope="module")
def results(moto_endpoint, tmp_path_factory) -> expect.Results:  # noqa: F811
    train = f"{JOBS}:train"
    extra = {
        f"hsdp_{fault}": (train, {"steps": 14, "faults": [fault], "parallel": "hsdp"})
        for fault in ("forward", "weight")
    }
    return expect.launch_rows(
        JOBS,
        tmp_path_factory.mktemp("lightning"),
        moto_endpoint,
        extra=extra,
        timeout_s=LAUNCH_DEADLINE_S,
    )


@pytest.mark.parametrize("name", ["faulty", "hsdp_forward"])
def test_a_persistent_fault_is_named_at_the_next_audit_and_the_step_is_not_applied(results, name):
    expect.named_at_the_next_audit(results, name)
    # on_alarm ran on every rank, then AlarmStop left fit before Lightning applied step 10
    assert all(r["on_alarm_calls"] == [10] for r in results[name])


def test_the_alarm_is_published_once_to_cloudwatch(results, moto_endpoint):  # noqa: F811
    expect.published_once(results, moto_endpoint, "lightning-faulty")


def test_model_checkpoints_before_the_alarm_carry_the_guard_tags(results):
    expect.checkpoints_before_the_alarm(results)
    (rank0,) = [r for r in results["faulty"] if r["rank"] == 0]
    assert sorted(rank0["tags"]) == ["4", "9"]  # checkpoint["sdc"] in each file


def test_a_weight_flip_blocks_the_model_checkpoint(results):
    expect.weight_flip_blocks_the_checkpoint(results, "model.net.0.weight")


def test_under_hsdp_a_weight_flip_is_named_and_the_next_step_not_applied(results):
    # Each shard has 3 replicas; the periodic check after step 9 is judged during step 10
    alarm = the_alarm(results, "hsdp_weight")
    assert (alarm["step"], alarm["check"], alarm["suspects"]) == (9, "weights", [0])
    expect.stopped_before(results, "hsdp_weight", 10)


def test_fit_refuses_the_covered_checkpoint_and_the_clean_one_resumes(results):
    expect.covered_checkpoint_refused(results, "epoch=1-step=10.ckpt: ")


def test_fifty_fault_free_steps_raise_no_alarm(results):
    expect.fault_free(results)


def test_the_docs_example_runs_as_written(results):
    expect.example_ran(results)


def test_by_default_every_rank_exits_3_with_its_termination_message(tmp_path):
    # Given the callback's default on_alarm (sdc.exit_on_alarm) and the persistent fault
    log = tmp_path / "termination"
    job = (f"{JOBS}:train", {"steps": 14, "faults": ["forward"], "termination_log": str(log)})
    # When the audit of step 10 fires, then every process exits 3 without returning a result
    with pytest.raises(RuntimeError, match="exited with code 3 and no result"):
        launch([job], world=6, ranks_per_node=2, timeout_s=LAUNCH_DEADLINE_S)
    # And each rank wrote the termination message Kubernetes shows for the pod
    for rank in range(6):
        message = json.loads((tmp_path / f"termination.rank{rank}").read_text())
        assert message["exit_code"] == 3 and message["check"] == "compute"
        assert (message["step"], message["suspects"]) == (10, [R])

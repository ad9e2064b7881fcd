"""sdc-guard around torchtitan's parts (TitanGuard): 3 nodes x 2 ranks, gloo, CPU.

One launch runs every row (tests/agent/frameworks/expectations.py says what each shows); each
test asserts its own. torchtitan's Llama 3 (built from its config classes, SDPA attention),
sharded by its ``apply_fsdp_to_decoder`` on its HSDP mesh (``("dp_replicate", "fsdp")``: 3
replicas x 2 shards), its AdamW container, LR scheduler (whose step count is the framework
counter the rows read), cross-entropy over the step's global token count, ``clip_grad_norm_``
and DCP ``CheckpointManager`` (interval 5). Two micro-batches per step.
"""

from __future__ import annotations

import pytest

from tests.agent.frameworks import expectations as expect
from tests.agent.frameworks.cloudwatch import moto_endpoint  # noqa: F401  (fixture)
from tests.agent.outcomes import ok, the_alarm
from tests.agent.test_publish_cloudwatch import aws_env  # noqa: F401  (autouse)

# How long this file's processes may run before the launcher kills them; the suite's conftest
# marks the file slow and gives pytest-timeout this plus a margin.
LAUNCH_DEADLINE_S = 1400


JOBS = "tests.agent.frameworks.torchtitan_jobs"


@pytest.fixture(scope="module")
def results(moto_endpoint, tmp_path_factory) -> expect.Results:  # noqa: F811
    root = tmp_path_factory.mktemp("torchtitan")
    # One more row: a NaN in one FSDP2 shard (rank 4's reduced gradient) at step 7.
    extra = {"shard_nan": (f"{JOBS}:train", {"steps": 10, "faults": ["shard_nan"]})}
    return expect.launch_rows(JOBS, root, moto_endpoint, extra=extra, timeout_s=LAUNCH_DEADLINE_S)


def test_a_persistent_fault_is_named_at_the_next_audit_and_the_step_is_not_applied(results):
    expect.named_at_the_next_audit(results, "faulty")


def test_the_alarm_is_published_once_to_cloudwatch(results, moto_endpoint):  # noqa: F811
    expect.published_once(results, moto_endpoint, "torchtitan-faulty")


def test_dcp_checkpoints_before_the_alarm_are_written_and_none_after(results):
    expect.checkpoints_before_the_alarm(results)


def test_a_weight_flip_blocks_the_checkpoint(results):
    expect.weight_flip_blocks_the_checkpoint(results, "layers.0.feed_forward.w1.weight")


def test_the_covered_checkpoint_is_refused_and_resume_loads_the_clean_one(results):
    expect.covered_checkpoint_refused(results, "step-10: ")
    # The tags of step-5 came back through DCP with it
    for r in ok(results, "resume"):
        assert r["loaded_tags"]["step"] == 4 and r["loaded_tags"]["weights_verified"] is True


def test_fifty_fault_free_steps_raise_no_alarm(results):
    expect.fault_free(results)


def test_the_docs_example_runs_as_written(results):
    expect.example_ran(results)
    # Its CheckpointManager (interval 5) wrote step-5 and step-10, each verified first
    assert all(r["saved"] == [4, 9] for r in results["example"])


def test_a_nan_in_one_fsdp2_shard_skips_the_step_on_every_rank(results):
    # Given torchtitan's HSDP mesh and a NaN in rank 4's shard of step 7's reduced gradient,
    # which no other rank sees
    alarm = the_alarm(results, "shard_nan")
    # Then every rank reports the reduced-gradient alarm of step 7 at step 7, naming nobody
    assert (alarm["step"], alarm["check"], alarm["suspects"]) == (7, "reduced_gradient", None)
    # and every rank entered the clip's collective at the same steps (0..6), none at step 7:
    # no rank waited in a collective that another skipped (the launch did not hang either)
    per_rank = ok(results, "shard_nan")
    assert all(r["clips"] == list(range(7)) for r in per_rank), [r["clips"] for r in per_rank]
    # and no rank applied step 7: optimizer, AdamW counters and LR scheduler stopped at 7
    expect.stopped_before(results, "shard_nan", 7)

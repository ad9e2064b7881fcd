"""sdc-guard in an Accelerate loop (AcceleratorGuard): 3 nodes x 2 ranks, gloo, CPU.

One launch runs every row (tests/agent/frameworks/expectations.py says what each shows); each
test asserts its own. Two micro-batches per step through ``accelerator.accumulate``,
``save_state`` every 5 steps. The ``fsdp2`` row runs Accelerate's own FSDP2 preparation (full
sharding over the 6 ranks).
"""

from __future__ import annotations

import pytest

from tests.agent.frameworks import expectations as expect
from tests.agent.frameworks.cloudwatch import moto_endpoint  # noqa: F401  (fixture)
from tests.agent.test_publish_cloudwatch import aws_env  # noqa: F401  (autouse)

# How long this file's processes may run before the launcher kills them; the suite's conftest
# marks the file slow and gives pytest-timeout this plus a margin.
LAUNCH_DEADLINE_S = 1100


JOBS = "tests.agent.frameworks.accelerate_jobs"


@pytest.fixture(scope="module")
def results(moto_endpoint, tmp_path_factory) -> expect.Results:  # noqa: F811
    fsdp2 = {"steps": 14, "faults": ["forward"], "parallel": "fsdp2"}
    extra = {"fsdp2_faulty": (f"{JOBS}:train", fsdp2)}
    return expect.launch_rows(
        JOBS,
        tmp_path_factory.mktemp("accelerate"),
        moto_endpoint,
        extra=extra,
        timeout_s=LAUNCH_DEADLINE_S,
    )


@pytest.mark.parametrize("name", ["faulty", "fsdp2_faulty"])
def test_a_persistent_fault_is_named_at_the_next_audit_and_the_step_is_not_applied(results, name):
    # optimizer_step returned the alarm instead of stepping (DDP, and Accelerate's FSDP2)
    expect.named_at_the_next_audit(results, name)


def test_the_alarm_is_published_once_to_cloudwatch(results, moto_endpoint):  # noqa: F811
    expect.published_once(results, moto_endpoint, "accelerate-faulty")


def test_checkpoints_before_the_alarm_are_saved_verified_and_tagged(results):
    expect.checkpoints_before_the_alarm(results)
    # And every replica agreed on the digest of the step-9 weights
    assert len({r["tags"]["9"]["weights_digest"] for r in results["faulty"]}) == 1


def test_a_weight_flip_blocks_save_state(results):
    expect.weight_flip_blocks_the_checkpoint(results, "net.0.weight")


def test_load_state_refuses_the_covered_checkpoint_and_the_clean_one_resumes(results):
    expect.covered_checkpoint_refused(results, "step-9: ")


def test_fifty_fault_free_steps_raise_no_alarm(results):
    expect.fault_free(results)


def test_the_docs_example_runs_as_written(results):
    expect.example_ran(results)

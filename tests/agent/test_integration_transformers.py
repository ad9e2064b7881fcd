"""sdc-guard in the Hugging Face Trainer (GuardedTrainer): 3 nodes x 2 ranks, gloo, CPU.

One launch runs every row (tests/agent/frameworks/expectations.py says what each shows); each
test asserts its own. A Llama built from a config (no download), synthetic tokens,
``gradient_accumulation_steps=2``, ``save_steps=5``, the Trainer's own DDP through Accelerate.
"""

from __future__ import annotations

import pytest

from tests.agent.frameworks import expectations as expect
from tests.agent.frameworks.cloudwatch import moto_endpoint  # noqa: F401  (fixture)
from tests.agent.frameworks.transformers_jobs import WEIGHT
from tests.agent.test_publish_cloudwatch import aws_env  # noqa: F401  (autouse)

# How long this file's processes may run before the launcher kills them; the suite's conftest
# marks the file slow and gives pytest-timeout this plus a margin.
LAUNCH_DEADLINE_S = 1100


JOBS = "tests.agent.frameworks.transformers_jobs"


@pytest.fixture(scope="module")
def results(moto_endpoint, tmp_path_factory) -> expect.Results:  # noqa: F811
    return expect.launch_rows(
        JOBS, tmp_path_factory.mktemp("transformers"), moto_endpoint, timeout_s=LAUNCH_DEADLINE_S
    )


def test_a_persistent_fault_is_named_at_the_next_audit_and_the_step_is_not_applied(results):
    expect.named_at_the_next_audit(results, "faulty")
    # on_alarm ran on every rank, then AlarmStop left train() before optimizer.step()
    assert all(r["on_alarm_calls"] == [10] for r in results["faulty"])


def test_the_alarm_is_published_once_to_cloudwatch(results, moto_endpoint):  # noqa: F811
    expect.published_once(results, moto_endpoint, "transformers-faulty")


def test_checkpoint_folders_before_the_alarm_carry_the_guard_tags(results):
    expect.checkpoints_before_the_alarm(results)
    assert all(sorted(r["tags"]) == ["4", "9"] for r in results["faulty"])


def test_a_weight_flip_blocks_the_checkpoint(results):
    expect.weight_flip_blocks_the_checkpoint(results, WEIGHT)
    assert all(r["on_alarm_calls"] == [9] for r in results["weights"])


def test_train_refuses_the_covered_checkpoint_and_the_clean_one_resumes(results):
    expect.covered_checkpoint_refused(results, "checkpoint-10: ")


def test_fifty_fault_free_steps_raise_no_alarm(results):
    expect.fault_free(results)


def test_the_docs_example_runs_as_written(results):
    expect.example_ran(results)

"""No false alarm under FSDP2, HSDP and tensor parallelism: a mistaken rebuild_batch names nobody
(3 simulated nodes x 2 ranks, gloo, CPU; replays in lockstep; audits at 0 and 5); and a
pipeline whose rebuild_batch keeps raising turns its audits off loudly.

The same rules as test_false_alarms_ddp.py, where replays run collectively: every rank rebuilds
its target's batch and the module's forward records what it was fed, so a replay fed another
batch is the set-up before any result is compared. That real faults still name their rank under
these layouts is pinned by test_checks_fsdp.py and test_checks_tp.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from sdc_agent.drills.launch import launch
from tests.agent.test_false_alarms_ddp import assert_trained_on_with_audits_off, setup_report

LAUNCH_DEADLINE_S = 600

SCEN = "tests.agent.mistake_scenarios:sharded_mistake"

JOBS: dict[str, tuple[str, dict[str, Any]]] = {
    "fsdp_off_by_one": (SCEN, {"parallel": "fsdp", "mistake": "off_by_one"}),
    "hsdp_one_rank": (SCEN, {"parallel": "hsdp", "mistake": "one_rank"}),
    "tp_off_by_one": (SCEN, {"parallel": "tp", "mistake": "off_by_one"}),
    "tp_one_rank": (SCEN, {"parallel": "tp", "mistake": "one_rank"}),
    "pp_rebuild_raises": (
        "tests.agent.mistake_scenarios:pipeline_mistake",
        {"mistake": "rebuild_raises"},
    ),
}
SHARDED = [n for n in JOBS if not n.startswith("pp_")]


@pytest.fixture(scope="module")
def results() -> dict[str, list[dict[str, Any]]]:
    names = list(JOBS)
    per_job = launch(
        [JOBS[n] for n in names], world=6, ranks_per_node=2, timeout_s=LAUNCH_DEADLINE_S
    )
    return dict(zip(names, per_job, strict=True))


@pytest.mark.parametrize("name", SHARDED)
def test_a_mistaken_rebuild_batch_names_nobody_under_sharding(results, name):
    # Given a rebuild_batch off by one step, or wrong on one rank only
    report = setup_report(results, name)
    # Then the first audit is the set-up, naming nobody, and the job trains on
    assert report["step"] == 0 and report["setup"]["cause"] == "rebuild_batch_mismatch"
    assert_trained_on_with_audits_off(results, name, steps=8)


def test_a_pipeline_rebuild_batch_that_keeps_raising_turns_the_audits_off_loudly(results):
    # Given a pipeline (3 replicas x 2 stages) whose rebuild_batch raises at every audit
    # (steps 0, 5, 10); one skip in a row allowed
    report = setup_report(results, "pp_rebuild_raises")
    # Then the first audit is skipped and counted, the second is the finding, naming nobody
    assert report["step"] == 5 and report["setup"]["cause"] == "rebuild_batch_failed"
    rank0 = next(r for r in results["pp_rebuild_raises"] if r["dp_rank"] == 0)
    assert rank0["audits_skipped"] >= 2 and rank0["audit_passes"] == 0
    # And the pipeline trains on, its coverage saying the audit is off
    assert_trained_on_with_audits_off(results, "pp_rebuild_raises", steps=12)

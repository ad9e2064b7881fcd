"""No false alarm: a user's mistakes and nondeterministic kernels name nobody (3 simulated nodes x
2 ranks, gloo, CPU, DDP; audits at steps 0, 5 and 10, peer_offset=2).

Each scenario is one ordinary mistake, or a kernel outside torch's deterministic mode; none is a
GPU fault. For each: no rank is named, no per-node series is published (so nothing would be
cordoned), the job is not crashed (or is stopped with the clear error where
``Schedule(on_setup_error="stop")`` asks for it), and the report's ``setup`` entry names the
cause. That a real fault still names its rank is pinned by test_checks_ddp.py (its rows run the
same guard) and by the last scenario here.
"""

from __future__ import annotations

from typing import Any

import pytest

from sdc_agent.drills.launch import launch
from tests.agent.outcomes import ok
from tests.agent.scenarios import SCHEDULE, R

LAUNCH_DEADLINE_S = 600

MISTAKE = "tests.agent.mistake_scenarios:user_mistake"
DRILL = "sdc_agent.drills.job:train_drill"


def mistake(name: str, **kw: Any) -> tuple[str, dict[str, Any]]:
    return MISTAKE, {"mistake": name, **kw}


JOBS: dict[str, tuple[str, dict[str, Any]]] = {
    "rebuild_off_by_one": mistake("rebuild_off_by_one"),
    "unseeded_loader": mistake("unseeded_loader"),
    "compute_loss_ignores_model": mistake("compute_loss_ignores_model"),
    "one_rank_data_bug": mistake("one_rank_data_bug"),
    "resume_not_shifted": mistake("resume_not_shifted"),
    "rebuild_raises": mistake("rebuild_raises"),
    "wrong_micro_batch_count": mistake("wrong_micro_batch_count", schedule={"grad_accum": 2}),
    "stop_on_setup_error": mistake("rebuild_off_by_one", schedule={"on_setup_error": "stop"}),
    "optimizer_on_other_params": mistake("optimizer_on_other_params"),
    "node_name_unset": mistake("node_name_unset"),
    "noisy_backward": mistake("noisy_backward"),
    "noisy_unless_deterministic": mistake("noisy_unless_deterministic"),
    "noisy_forward": mistake("noisy_forward"),
    "no_deterministic_kernel": mistake("no_deterministic_kernel"),
    "uneven_threads": mistake("uneven_threads"),
    "clean": mistake("none"),
    "real_fault_after_preflight": (
        DRILL,
        {
            "steps": 12,
            "schedule": SCHEDULE,
            "faults": [
                {
                    "kind": "ScaleOutputElement",
                    "layer": "net.4",
                    "factor": 1000.0,
                    "rank": R,
                    "step": 7,
                }
            ],
        },
    ),
}


@pytest.fixture(scope="module")
def results() -> dict[str, list[dict[str, Any]]]:
    names = list(JOBS)
    per_job = launch(
        [JOBS[n] for n in names], world=6, ranks_per_node=2, timeout_s=LAUNCH_DEADLINE_S
    )
    return dict(zip(names, per_job, strict=True))


def setup_report(results: dict, name: str) -> dict[str, Any]:
    """The one report rank 0 published for scenario ``name``, asserted to be a set-up finding
    that names nobody and writes no per-node series; every rank agrees on what followed."""
    per_rank = ok(results, name)
    reports = next(r["reports"] for r in per_rank if r["dp_rank"] == 0)
    assert len(reports) == 1, reports
    report = reports[0]
    assert report["suspects"] is None and report["culprits"] == [] and report["ranks"] == {}
    assert all(v["kind"] == "setup" and v["suspect"] is None for v in report["verdicts"])
    assert report["metric"]["name"] == "sdc_audit_skipped"
    assert all(r["node_series"] == [] for r in per_rank)
    assert all(
        m not in {"sdc_replay_mismatch", "sdc_nonfinite_grad"}
        for r in per_rank
        for m in r["metrics"]
    )
    return report


def assert_trained_on_with_audits_off(results: dict, name: str, steps: int = 12) -> None:
    """The job was not crashed: every rank applied every step, returned no alarm, and says the
    audit is off and why."""
    for r in ok(results, name):
        assert r["alarm"] is None
        assert r["error_type"] is None
        assert len(r["updates"]) == steps
        assert r["audit"]["on"] is False and "set-up finding" in r["audit"]["why"]


@pytest.mark.parametrize(
    "name", ["rebuild_off_by_one", "unseeded_loader", "resume_not_shifted", "one_rank_data_bug"]
)
def test_a_replay_fed_another_batch_is_the_setup_not_a_gpu(results, name):
    # Given a rebuild_batch that does not return what was trained (off by one step, an
    # unseeded loader, a resume that did not shift it, a data bug on one rank only)
    report = setup_report(results, name)
    # Then the first audit (step 0, or 5 after the resume) names nobody: the batches differ
    first = 5 if name == "resume_not_shifted" else 0
    assert report["step"] == first
    assert report["setup"]["cause"] == "rebuild_batch_mismatch"
    assert "rebuild_batch" in report["setup"]["detail"]
    assert report["setup"]["audits"] == "off"
    # And the job trains on with the audits off
    assert_trained_on_with_audits_off(results, name)


def test_a_data_bug_on_one_rank_names_its_rebuild_not_its_gpu(results):
    # Given rank 1's rebuild_batch returns another rank's batch (rank 1 replays rank 3)
    report = setup_report(results, "one_rank_data_bug")
    # Then the finding is the pair rank 1 replayed, and it names rank 1's rebuild_batch
    assert report["mismatched_pairs"] == [[3, 1]]
    assert "rank 1's rebuild_batch(step, 3)" in report["setup"]["detail"]


def test_a_compute_loss_that_ignores_its_model_is_the_setup(results):
    # Given compute_loss uses the DDP model it closed over, not the module it is given
    report = setup_report(results, "compute_loss_ignores_model")
    # Then the first audit says so, naming nobody
    assert report["step"] == 0
    assert report["setup"]["cause"] == "compute_loss_ignores_model"
    assert_trained_on_with_audits_off(results, "compute_loss_ignores_model")


def test_a_rebuild_batch_that_keeps_raising_turns_the_audits_off_loudly(results):
    # Given rebuild_batch raises at every audit (steps 0, 5, 10); one skip in a row allowed
    report = setup_report(results, "rebuild_raises")
    # Then the first audit is skipped and counted, the second is the finding
    assert report["step"] == 5 and report["setup"]["cause"] == "rebuild_batch_failed"
    rank0 = next(r for r in results["rebuild_raises"] if r["dp_rank"] == 0)
    assert rank0["audits_skipped"] >= 2  # the skipped audit and the audits turned off
    assert rank0["audit_passes"] == 0
    # And the job trains on, its coverage saying the audit is off
    assert_trained_on_with_audits_off(results, "rebuild_raises")


def test_a_wrong_number_of_micro_batches_turns_the_audits_off_loudly(results):
    # Given grad_accum=2 and a rebuild_batch that returns 3 micro-batches
    report = setup_report(results, "wrong_micro_batch_count")
    assert report["setup"]["cause"] == "rebuild_batch_failed"
    assert_trained_on_with_audits_off(results, "wrong_micro_batch_count")


def test_the_stop_policy_stops_every_rank_with_the_clear_error(results):
    # Given Schedule(on_setup_error="stop") and an off-by-one rebuild_batch
    report = setup_report(results, "stop_on_setup_error")
    assert report["setup"]["audits"] == "stopped"
    # Then every rank raised AuditSetupError at step 0, naming the cause and the fix, and no
    # rank applied the step
    for r in ok(results, "stop_on_setup_error"):
        assert r["error_type"] == "AuditSetupError"
        assert "rebuild_batch_mismatch" in r["message"] and "Fix:" in r["message"]
        assert r["updates"] == []


def test_an_optimizer_built_on_other_parameters_is_refused_at_construction(results):
    # Given an optimizer built on another model's parameters
    for r in ok(results, "optimizer_on_other_params"):
        # Then building the guard raises on every rank, naming the parameters it misses
        assert r["built"] is False and r["error_type"] == "ValueError"
        assert "does not own 8 trainable parameter(s)" in r["message"]
        assert "net.0.weight" in r["message"]


def test_node_name_unset_says_so_instead_of_blaming_peer_offset(results):
    # Given NODE_NAME unset on every rank (every hostname is this machine's)
    for r in ok(results, "node_name_unset"):
        # Then the topology error names NODE_NAME and the downward API first
        assert r["built"] is False and r["error_type"] == "TopologyError"
        assert r["message"].startswith("NODE_NAME is not set")
        assert "spec.nodeName" in r["message"]


def test_a_backward_kernel_outside_deterministic_mode_compares_the_loss_only(results):
    # Given a backward that adds noise on every call (as flash_attn's does)
    per_rank = ok(results, "noisy_backward")
    for r in per_rank:
        # Then the preflight found gradients not reproducible, and the audits go on comparing
        # the loss bits: no alarm, no report, every audit passes
        assert r["alarm"] is None and r["node_series"] == []
        assert r["audit"]["on"] is True and r["audit"]["compares"].startswith("loss bits only")
        assert any("gradients are not compared" in n for n in r["preflight"]["notes"])
    rank0 = next(r for r in per_rank if r["dp_rank"] == 0)
    assert rank0["reports"] == [] and rank0["audit_passes"] == 3


def test_a_kernel_with_a_deterministic_variant_raises_no_alarm(results):
    # Given a backward that is noisy unless deterministic mode is on
    per_rank = ok(results, "noisy_unless_deterministic")
    rank0 = next(r for r in per_rank if r["dp_rank"] == 0)
    # Then audit steps run it deterministically: every audit passes, comparing gradients
    assert rank0["reports"] == [] and rank0["audit_passes"] == 3
    assert all(r["audit"]["on"] and r["preflight"]["notes"] == [] for r in per_rank)


def test_a_forward_kernel_outside_deterministic_mode_turns_the_audits_off(results):
    # Given a forward whose output carries noise from outside torch's generator
    report = setup_report(results, "noisy_forward")
    # Then the preflight at step 0 names nobody: two replays on one GPU disagree
    assert report["step"] == 0 and report["setup"]["cause"] == "nondeterministic_replay"
    assert_trained_on_with_audits_off(results, "noisy_forward")


def test_an_op_without_a_deterministic_kernel_does_not_crash_the_job(results):
    # Given an op that raises under torch.use_deterministic_algorithms(True) at step 0 (an
    # audit step)
    per_rank = ok(results, "no_deterministic_kernel")
    for r in per_rank:
        # Then training ran every step, the op is listed, and audits passed (its result
        # reproduced bit for bit, as the self-replay showed)
        assert r["alarm"] is None and len(r["updates"]) == 12
        assert r["preflight"]["nondeterministic_ops"] == ["put_"]
    rank0 = next(r for r in per_rank if r["dp_rank"] == 0)
    assert rank0["reports"] == [] and rank0["audit_passes"] == 3


def test_ranks_that_do_not_compute_alike_never_start_the_audits(results):
    # Given rank 3 runs with another intra-op thread count than the others (on GPUs: another
    # GPU model, SM count or CUDA build), so its reductions round differently
    for r in ok(results, "uneven_threads"):
        # Then the audits are off from the start, saying why; nobody is named, nothing reported
        assert r["alarm"] is None and len(r["updates"]) == 12
        assert r["audit"]["on"] is False and "heterogeneous_ranks" in r["audit"]["why"]
        assert "ranks [3]" in r["audit"]["why"]
        assert r["node_series"] == [] and r["audit_passes"] == 0
    rank0 = next(r for r in results["uneven_threads"] if r["dp_rank"] == 0)
    assert rank0["reports"] == []


def test_a_clean_run_passes_its_preflight_and_every_audit(results):
    per_rank = ok(results, "clean")
    rank0 = next(r for r in per_rank if r["dp_rank"] == 0)
    assert rank0["reports"] == [] and rank0["audit_passes"] == 3 and rank0["audits_skipped"] == 0
    for r in per_rank:
        assert r["preflight"]["done"] is True and r["preflight"]["notes"] == []
        assert r["preflight"]["node_names_from"] == "NODE_NAME"


def test_a_real_fault_still_names_its_rank_after_the_preflight(results):
    # Given x1000 on one output element of R from step 7 (the preflight at step 0 passed)
    alarms = [r["alarm"] for r in ok(results, "real_fault_after_preflight")]
    alarm = alarms[0]
    assert all(a == alarm for a in alarms)
    # Then the audit at step 10 names R as the culprit, as before
    assert (alarm["step"], alarm["suspects"], alarm["culprits"]) == (10, [R], [R])
    assert "setup" not in alarm

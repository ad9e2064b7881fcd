"""What every framework's integration must show, read from the jobs' common report
(:func:`tests.agent.frameworks.common.report`), and the one launch of each framework's rows.

The rows, the same for every framework (steps count optimizer steps, audits and weight checks
every 5, checkpoints every 5 by the framework's own means):

- ``faulty``: x1000 on one output element of one layer of rank R from step 7, publishing to
  CloudWatch (moto); the alarm comes at the audit of step 10;
- ``resume``: the same run directory again: the newest checkpoint (weights after step 9, inside
  the alarm's window [5, 10]) first, which must be refused, then the framework's clean choice;
- ``weights``: one bit of rank 0's weights flipped after step 6: the check before the
  checkpoint of step 9 fires and that checkpoint is not written;
- ``clean``: 50 fault-free steps;
- ``example``: docs/integrations.md's example for the framework, as written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.agent.frameworks.cloudwatch import published
from tests.agent.frameworks.common import R, launch
from tests.agent.outcomes import ok, the_alarm

Results = dict[str, list[dict[str, Any]]]


def launch_rows(
    module: str,
    root: Path,
    endpoint: str,
    *,
    extra: dict[str, tuple[str, dict[str, Any]]] | None = None,
    timeout_s: float,
) -> Results:
    """Run the standard rows (module docstring) of ``module``'s ``train`` and
    ``docs_example`` jobs, plus ``extra`` rows, in one launch of 6 processes."""
    train, example = f"{module}:train", f"{module}:docs_example"
    name = module.rsplit(".", 1)[-1].removesuffix("_jobs")
    run = str(root / "run")
    publish = {"endpoint": endpoint, "spool_root": str(root / "spool"), "job": f"{name}-faulty"}
    jobs = {
        "faulty": (
            train,
            {
                "steps": 14,
                "faults": ["forward"],
                "ckpt_every": 5,
                "run_dir": run,
                "publish": publish,
            },
        ),
        "resume": (train, {"steps": 14, "ckpt_every": 5, "run_dir": run, "resume": True}),
        "weights": (
            train,
            {"steps": 14, "faults": ["weight"], "ckpt_every": 5, "run_dir": str(root / "w")},
        ),
        "clean": (train, {"steps": 50, "run_dir": str(root / "clean")}),
        "example": (
            example,
            {
                "steps": 12,
                "run_dir": str(root / "example"),
                "publish": {**publish, "job": f"{name}-example"},
            },
        ),
        **(extra or {}),
    }
    per_job = launch(list(jobs.values()), world=6, ranks_per_node=2, timeout_s=timeout_s)
    return dict(zip(jobs, per_job, strict=True))


def stopped_before(results: Results, name: str, step: int) -> None:
    """No rank of row ``name`` applied ``step`` or later: its optimizer's own record, AdamW's
    per-parameter counters and the framework's step counter all say steps 0..step-1, and its
    weights are bit for bit what the update of ``step - 1`` left."""
    per_rank = ok(results, name)
    assert len(per_rank) == 6
    for r in per_rank:
        assert r["updates"] == list(range(step)), r["updates"]
        assert r["adamw_steps"] == [step] and r["framework_step"] == step
        assert r["weights_as_last_update_left"]


def named_at_the_next_audit(results: Results, name: str) -> dict[str, Any]:
    """Row ``name``'s alarm: the audit of step 10 names R, wrong as target and as replayer,
    and no rank applied step 10."""
    alarm = the_alarm(results, name)
    assert (alarm["step"], alarm["check"], alarm["suspects"]) == (10, "compute", [R])
    assert alarm["mismatched_pairs"] == [[R, 1], [5, R]] and alarm["culprits"] == [R]
    assert alarm["suspect_window"] == [5, 10]
    stopped_before(results, name, 10)
    return alarm


def published_once(results: Results, endpoint: str, job: str) -> None:
    """The faulty row's alarm reached CloudWatch once: its report and the cluster metric."""
    alarm = the_alarm(results, "faulty")
    assert all(r["delivered"] for r in results["faulty"])
    sent = published(endpoint, job)
    (report,) = sent["reports"]
    report.pop("time")
    assert report == {**alarm, "cluster": "integrations", "job": job}
    assert sent["metric"]("sdc_replay_mismatch") == (2.0, 1.0)


def checkpoints_before_the_alarm(results: Results) -> None:
    """The faulty row saved the checkpoints of steps 4 and 9 (each verified before it was
    written, when the framework's files carry readable tags) and none after the alarm."""
    for r in ok(results, "faulty"):
        assert r["saved"] == [4, 9]
        for step, tags in (r.get("tags") or {}).items():
            assert tags["step"] == int(step) and tags["weights_verified"] is True


def weight_flip_blocks_the_checkpoint(results: Results, tensor: str) -> None:
    """The weights row: the check before the checkpoint of step 9 names rank 0 and ``tensor``,
    and only the checkpoint of step 4 exists."""
    alarm = the_alarm(results, "weights")
    assert (alarm["step"], alarm["check"], alarm["suspects"]) == (9, "weights", [0])
    assert alarm["divergent_tensors"] == [tensor]
    assert all(r["saved"] == [4] for r in results["weights"])


def covered_checkpoint_refused(results: Results, newest: str) -> None:
    """The resume row: the newest checkpoint (file or folder ``newest``, weights after step 9)
    refused on every rank before any step; the clean one (step 4) chosen, and training passed
    step 10 without an alarm."""
    for r in ok(results, "resume"):
        assert newest in r["refused"]
        assert "refusing to resume from the checkpoint of step 9" in r["refused"]
        assert "compute alarm of step 10" in r["refused"]
        assert r["start"] == 5 and r["alarm"] is None
        assert r["updates"] == list(range(5, 14)) and r["framework_step"] == 14


def fault_free(results: Results) -> None:
    """50 fault-free steps: no alarm, every audit (steps 0, 5, ..., 45) and weight check
    (start, after 4, 9, ..., 49) passed and counted."""
    per_rank = ok(results, "clean")
    assert all(r["alarm"] is None and r["updates"] == list(range(50)) for r in per_rank)
    (rank0,) = [r for r in per_rank if r["rank"] == 0]
    assert (rank0["audit_passes"], rank0["weight_check_passes"]) == (10, 11)
    assert rank0["alarms_published"] == 0


def example_ran(results: Results) -> None:
    """The docs example trained its 12 steps with no alarm, audited step 0, and published."""
    for r in ok(results, "example"):
        assert r["alarm"] is None and r["steps_applied"] == 12
        assert r["last_audit_pass"] == 0 and r["delivered"]

"""The held-out mistakes campaign (benchmarks/mistakes.py) can fail: a row that names a rank, writes
a per-node series or crashes the job is reported as failed (no processes; ``make bench`` runs it)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import mistakes  # noqa: E402


def rank_result(**changes: Any) -> dict[str, Any]:
    result = {
        "built": True,
        "error_type": None,
        "message": "",
        "alarm": None,
        "named": [],
        "findings": ["rebuild_batch_mismatch"],
        "node_series": [],
        "sdc_metrics": [],
        "updates": 12,
        "audit_on": False,
        "audit_why": "turned off by a set-up finding",
    }
    return {**result, **changes}


def test_a_mistake_that_names_nobody_and_trains_on_passes():
    row = mistakes.judge([rank_result() for _ in range(6)], steps=12)
    assert row["ok"] and row["named"] == [] and row["findings"] == ["rebuild_batch_mismatch"]


def test_a_named_rank_a_node_series_or_an_sdc_metric_fails_the_row():
    named = [rank_result(named=[1] if r == 0 else []) for r in range(6)]
    series = [rank_result(node_series=["hyperpod-i-0"] if r == 1 else []) for r in range(6)]
    metric = [rank_result(sdc_metrics=["sdc_replay_mismatch"]) for _ in range(6)]
    alarm = [rank_result(alarm={"suspects": [3]}) for _ in range(6)]
    for per_rank in (named, series, metric, alarm):
        row = mistakes.judge(per_rank, steps=12)
        assert not row["ok"] and "NAMED" in row["outcome"], row


def test_a_crash_or_a_step_not_applied_fails_the_row():
    crashed = [rank_result(), {"error": "KeyError: 3", "trace": ""}]
    assert not mistakes.judge(crashed, steps=12)["ok"]
    assert not mistakes.judge([rank_result(updates=11), rank_result()], steps=12)["ok"]


def test_a_refusal_at_construction_passes_only_when_every_rank_refused():
    refused = rank_result(built=False, error_type="TopologyError", message="NODE_NAME ...")
    assert mistakes.judge([refused, refused], steps=12)["ok"]
    assert not mistakes.judge([refused, rank_result(built=False)], steps=12)["ok"]


def test_every_held_out_mistake_is_described_and_none_is_a_pinned_test_row():
    from tests.agent.test_false_alarms_ddp import JOBS

    pinned = {kwargs.get("mistake") for _, kwargs in JOBS.values()}
    assert all(mistakes.MISTAKES.values()) and all(w for *_, w in mistakes.SHARDED.values())
    assert not pinned & set(mistakes.MISTAKES), "a held-out mistake is also a test row"

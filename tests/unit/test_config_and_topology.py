"""Schedule validation, the placement rule, weight-table attribution and the alarm's JSON."""

from __future__ import annotations

import json

import pytest
import torch

import sdc_agent as sdc
from sdc_agent.checks.weights.report import name_minority_copies
from sdc_agent.topology import TopologyError, validate_placement


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"audit_every": -1}, "audit_every"),
        ({"check_every": 1.5}, "check_every"),
        ({"ckpt_every": True}, "ckpt_every"),
        ({"peer_offset": 0}, "peer_offset"),
        ({"max_grad_norm": 0.0}, "max_grad_norm"),
    ],
)
def test_bad_schedule_values_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"Schedule.{field}"):
        sdc.Schedule(**kwargs)


def test_schedule_is_frozen_and_keyword_only():
    schedule = sdc.Schedule(audit_every=10)
    with pytest.raises(AttributeError):
        schedule.audit_every = 5  # type: ignore[misc]
    with pytest.raises(TypeError):
        sdc.Schedule(10)  # type: ignore[misc]


def test_schedule_decides_audits_checks_and_checkpoints():
    s = sdc.Schedule(audit_every=10, check_every=4, ckpt_every=6, check_on_checkpoint=True)
    assert [x for x in range(25) if s.is_audit_step(x)] == [0, 10, 20]
    assert [x for x in range(13) if s.is_checkpoint_step(x)] == [5, 11]
    assert [x for x in range(13) if s.is_weight_check_step(x)] == [3, 5, 7, 11]
    off = sdc.Schedule(audit_every=0, check_every=0, ckpt_every=6, check_on_checkpoint=False)
    assert not any(off.is_audit_step(x) or off.is_weight_check_step(x) for x in range(20))


def nodes(n_nodes: int, per_node: int) -> list[str]:
    return [f"node-{r // per_node}" for r in range(n_nodes * per_node)]


def test_placement_accepts_an_offset_of_one_node():
    validate_placement(nodes(3, 2), 2)
    validate_placement(nodes(4, 8), 8)


def test_placement_rejects_pairs_sharing_a_node_and_names_them():
    with pytest.raises(TopologyError, match=r"peer_offset=1 .*rank 0 \(node-0\)"):
        validate_placement(nodes(3, 2), 1)


def test_placement_rejects_two_nodes():
    # With two nodes the third GPU would share a node with the target or the replayer
    with pytest.raises(TopologyError):
        validate_placement(nodes(2, 4), 4)


def test_placement_needs_three_ranks():
    with pytest.raises(TopologyError, match="at least 3"):
        validate_placement(["a", "b"], 1)


def table(world: int, tensors: int) -> torch.Tensor:
    return torch.arange(tensors * 2, dtype=torch.int64).reshape(tensors, 2).repeat(world, 1, 1)


def test_attribution_names_the_minority_copy():
    t = table(5, 3)
    t[2, 1, 0] += 1
    report = name_minority_copies(t, ["a", "b", "c"], [10, 11, 12, 13, 14])
    assert (report.ranks, report.tensors, report.unattributable) == ([12], ["b"], False)


def test_two_copies_that_differ_name_nobody():
    t = table(2, 1)
    t[1, 0, 1] += 1
    report = name_minority_copies(t, ["w"], [0, 1])
    assert (report.ranks, report.tensors, report.unattributable) == ([], ["w"], True)


def test_a_split_without_strict_majority_names_nobody():
    t = table(4, 1)
    t[2:, 0, 0] += 7
    report = name_minority_copies(t, ["w"], [0, 1, 2, 3])
    assert report.ranks == [] and report.unattributable


def test_alarm_report_is_json_with_the_v1_schema():
    alarm = sdc.Alarm(
        step=7,
        check="compute",
        mismatched_pairs=[(3, 1)],
        verdicts=[sdc.Verdict(pair=(3, 1), third=5, suspect=3, kind="transient")],
        suspects=[3],
        suspect_window=(5, 7),
        ranks={"3": sdc.RankInfo(3, "hyperpod-i-abc", "i-abc", "GPU-1", 1, "pod-3")},
    )
    report = json.loads(json.dumps(alarm.to_dict()))
    assert report["schema"] == "sdc.alarm/v1"
    assert report["mismatched_pairs"] == [[3, 1]]
    assert report["verdicts"][0] == {"pair": [3, 1], "third": 5, "suspect": 3, "kind": "transient"}
    assert report["ranks"]["3"] == {
        "node_name": "hyperpod-i-abc",
        "instance_id": "i-abc",
        "gpu_uuid": "GPU-1",
        "local_rank": 1,
        "pod_name": "pod-3",
    }
    assert report["metric"] == {"name": "sdc_replay_mismatch", "value": 1}

"""Two ranks' rebuilds of one target's batch must be the same micro-batch, labels included, before
a dispute between their replays may name a GPU (no processes; the DDP rows are in
benchmarks/mistakes.py, the held-out campaign, and tests/agent/test_false_alarms_ddp.py)."""

from __future__ import annotations

from collections import UserDict

import pytest
import torch

from sdc_agent.checks.replay.attribution import (
    SELF_LOSS_DIFFERS,
    SELF_REBUILD_DIFFERS,
    Outcome,
)
from sdc_agent.checks.replay.batch_record import batch_digest
from sdc_agent.checks.replay.setup import preflight, rebuild_finding
from sdc_agent.topology import TopologyError, validate_placement


def replayed(rebuilt: int, flags: int = 0) -> Outcome:
    return Outcome(loss_bits=7, grad_digest=(1, 2), finite=True, rebuilt=rebuilt, flags=flags)


def batch(step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)


def test_the_digest_of_a_batch_covers_its_labels_dtype_and_structure():
    x, y = batch()
    same = batch_digest((x, y))
    assert same != 0 and same == batch_digest((x.clone(), y.clone()))
    # Labels that never reach the forward still change the digest
    assert batch_digest((x, (y + 1) % 4)) != same
    assert batch_digest((x.double(), y)) != same
    assert batch_digest([x, y]) != same
    assert batch_digest({"x": x, "y": y}) != batch_digest({"x": x, "y": (y + 1) % 4})


def test_a_mapping_pytree_cannot_open_is_fingerprinted_by_its_tensors():
    # A Hugging Face BatchEncoding is a UserDict: its tensors must count, not its type name
    x, y = batch()
    assert batch_digest(UserDict(input_ids=x, labels=y)) != batch_digest(
        UserDict(input_ids=x, labels=(y + 1) % 4)
    )


def test_the_row_carries_the_rebuilt_digest():
    outcome = replayed(rebuilt=12345, flags=SELF_REBUILD_DIFFERS)
    assert Outcome.from_row(outcome.to_row()) == outcome


def test_one_rank_whose_rebuild_differs_is_the_set_up_named_by_its_rebuild_batch():
    # Given rank 1 replays rank 3's batch with other labels; the third GPU (5) and rank 3 agree
    finding = rebuild_finding(3, [(1, replayed(11)), (5, replayed(22)), (3, replayed(22))], int)
    # Then the finding names rank 1's rebuild_batch for rank 3, never a GPU
    assert finding is not None and finding.cause == "rebuild_batch_mismatch"
    assert finding.detail.startswith("rank 1's rebuild_batch(step, 3) returned another")
    assert "[5, 3]" in finding.detail


def test_rebuilds_that_agree_or_were_not_recorded_say_nothing():
    assert (
        rebuild_finding(3, [(1, replayed(22)), (5, replayed(22)), (3, replayed(22))], int) is None
    )
    # A pipeline's or a training computation's outcome has no rebuilt digest (0): unknown
    assert rebuild_finding(3, [(1, replayed(0)), (5, replayed(22)), (3, replayed(22))], int) is None


def test_three_different_rebuilds_name_every_rank_s_rebuild():
    finding = rebuild_finding(3, [(1, replayed(1)), (5, replayed(2)), (3, replayed(3))], int)
    assert finding is not None
    assert "rank 1's, rank 5's, rank 3's" in finding.detail and "from each other" in finding.detail


def test_a_rebuild_that_differs_between_two_calls_fails_the_preflight_as_the_set_up():
    # Given rank 2's two self-replays rebuilt different batches (and so got different losses)
    owns = [replayed(9)] * 2 + [replayed(9, SELF_REBUILD_DIFFERS | SELF_LOSS_DIFFERS)]
    checked = preflight(owns, int, compare_grads=True)
    # Then the finding is the rebuild, not a nondeterministic kernel
    assert checked.finding is not None and checked.finding.cause == "rebuild_batch_mismatch"
    assert "on ranks [2], two calls of rebuild_batch" in checked.finding.detail
    assert "in place" in checked.finding.fix


@pytest.mark.parametrize("names", [["trn-cluster"] * 6, ["a", "a", "a", "b", "b", "b"]])
def test_fewer_than_three_node_names_blame_node_name_not_peer_offset(names):
    with pytest.raises(TopologyError, match="report only") as raised:
        validate_placement(names, 2)
    assert "spec.nodeName" in str(raised.value) and "peer_offset" not in str(raised.value)

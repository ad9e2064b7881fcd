"""Check 1's local tap on an FSDP2 model (one-rank gloo): a NaN/Inf in this rank's own
pre-reduction gradient is flagged under bf16 mixed precision, with and without accumulation."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.distributed as dist

from sdc_agent.drills.job import build_sharded, make_batch, make_loss

VICTIM = "blocks.1.fc.weight"


@pytest.fixture
def sharded(tmp_path):
    """(model, optimizer, guard, poison): the drill model under FSDP2 with bf16 parameters in
    compute and float32 reduction; ``poison["value"]``, when set, replaces the last element of
    ``VICTIM``'s local gradient before autograd stores it (so check 1's tap sees it)."""
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    model, optimizer, guard = build_sharded(
        {"audit_every": 0, "check_every": 0, "peer_offset": 1},
        parallel="fsdp",
        mixed_precision=True,
    )
    poison: dict[str, float | None] = {"value": None}

    def corrupt(grad: torch.Tensor) -> torch.Tensor | None:
        if poison["value"] is None:
            return None
        grad = grad.clone()
        grad.view(-1)[-1] = poison["value"]
        return grad

    guard._run.parallel.with_autograd_parameter(VICTIM, lambda param: param.register_hook(corrupt))
    yield model, optimizer, guard, poison
    dist.destroy_process_group()


def local_flag_after(sharded, micro_batches: list[float | None]) -> bool:
    """Run one step of len(micro_batches) micro-batches (sync on the last only), each with its
    poison value (None: clean); whether check 1 flagged this rank's local gradient."""
    model, optimizer, guard, poison = sharded
    optimizer.zero_grad()
    state = guard._run.gradients.hook_state
    guard._run.gradients.arm(capture_fingerprints=False, device=torch.device("cpu"))
    for index, value in enumerate(micro_batches):
        poison["value"] = value
        last = index == len(micro_batches) - 1
        with contextlib.nullcontext() if last else guard._run.parallel.no_sync():
            make_loss()(model, make_batch(index, 0)).backward()
    poison["value"] = None
    guard._run.gradients.require_reduction()  # the flags are paired with the reduced sums
    return bool(torch.cat(state.local_flags).any())


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_nonfinite_element_of_a_bf16_local_gradient_is_flagged(sharded, bad):
    # Given a clean step, then one whose local bf16 gradient of one weight has one bad element
    clean = local_flag_after(sharded, [None])
    poisoned = local_flag_after(sharded, [bad])
    # Then only the poisoned step is flagged
    assert (clean, poisoned) == (False, True)


def test_a_nan_in_an_earlier_micro_batch_is_flagged_under_mixed_precision(sharded):
    # Given accumulation over 3 micro-batches, where FSDP2 moves each earlier micro-batch's bf16
    # gradient into its float32 buffer before the synchronising one's tap runs
    # When only the first micro-batch's local gradient has a NaN
    flagged = local_flag_after(sharded, [float("nan"), None, None])
    # Then the step's local flag is raised all the same, and the next clean step's is not
    assert flagged
    assert local_flag_after(sharded, [None, None, None]) is False


def test_a_flag_from_a_step_that_never_synchronised_is_not_carried_over(sharded):
    # Given a step abandoned after a poisoned micro-batch without sync (its gradients dropped)
    _, _, guard, poison = sharded
    guard._run.gradients.arm(capture_fingerprints=False, device=torch.device("cpu"))
    poison["value"] = float("inf")
    with guard._run.parallel.no_sync():
        make_loss()(sharded[0], make_batch(0, 0)).backward()
    poison["value"] = None
    guard._run.parallel.discard_unsynced_gradients()
    # When the next step runs clean, then it is not flagged
    assert local_flag_after(sharded, [None, None]) is False

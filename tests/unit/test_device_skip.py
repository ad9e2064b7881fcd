"""A bad common step skipped by the optimizer on the device (issue 31 item 4): with a fused
AdamW and no GradScaler the guard hands this rank's flags to the optimizer as ``found_inf`` and
reads nothing on the host; the verdict is settled at the next agreement point. These tests pin
the state handling around it in a 1-process gloo group: what is set for the step, what is
cleared and restored after it, and which set-ups keep the host path."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

import sdc_agent as sdc
from sdc_agent._coordinator import can_skip_on_device

COMMON = {
    "audit_every": 0,
    "check_every": 0,
    "check_on_start": False,
    "sensors": False,
    "peer_offset": 1,
}


def _batch(bad_step: int | None) -> Any:
    def rebuild(step: int, rank: int) -> torch.Tensor:
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(step))
        if step == bad_step:
            x[0, 0] = math.nan  # every gradient of the first layer becomes NaN
        return x

    return rebuild


def _loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x).square().mean()


def _build(
    optimizer: str = "fused_adamw",
    *,
    bad_step: int | None = None,
    **schedule: Any,
) -> tuple[nn.Module, torch.optim.Optimizer, sdc.Guard]:
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2))
    )
    params = model.parameters()
    opt: torch.optim.Optimizer
    if optimizer == "fused_adamw":
        opt = torch.optim.AdamW(params, lr=0.01, fused=True)
    elif optimizer == "fused_adam":
        opt = torch.optim.Adam(params, lr=0.01, fused=True)
    elif optimizer == "adamw":
        opt = torch.optim.AdamW(params, lr=0.01)
    else:
        opt = torch.optim.SGD(params, lr=0.01)
    guard = sdc.Guard(
        model,
        opt,
        compute_loss=_loss,
        rebuild_batch=_batch(bad_step),
        schedule=sdc.Schedule(**{**COMMON, **schedule}),
    )
    return model, opt, guard


def _forward_backward(model: nn.Module, guard: sdc.Guard, step: int, bad_step: int | None):
    loss = _loss(model, _batch(bad_step)(step, 0))
    loss.backward()
    return loss


def test_only_a_fused_adam_without_a_scaler_can_skip_on_the_device() -> None:
    # Given optimizers of each kind over one parameter
    p = nn.Parameter(torch.ones(2))
    scaler = torch.amp.GradScaler("cpu")
    # Then only the fused Adam and AdamW skip a step on the device, and not under a GradScaler
    # (which owns found_inf; a guard with one needs three nodes, tests/agent run it)
    assert can_skip_on_device(torch.optim.AdamW([p], fused=True), None)
    assert can_skip_on_device(torch.optim.Adam([p], fused=True), None)
    assert not can_skip_on_device(torch.optim.AdamW([p], fused=True), scaler)
    assert not can_skip_on_device(torch.optim.AdamW([p]), None)
    assert not can_skip_on_device(torch.optim.AdamW([p], foreach=True), None)
    assert not can_skip_on_device(torch.optim.SGD([p], lr=0.1, fused=True), None)


def test_a_common_step_hands_its_flags_to_the_optimizer_and_clears_them_after(
    one_process_group: None,
) -> None:
    # Given a guard over a fused AdamW
    model, opt, guard = _build()
    # When a clean common step's gradients are checked
    with guard.step(0) as guarded:
        loss = _forward_backward(model, guard, 0, None)
        assert guarded.check_gradients(loss) is None
        # Then the optimizer's next step is told the flags (clean: 0) and not to unscale
        assert torch.equal(opt.found_inf, torch.zeros(()))  # type: ignore[attr-defined]
        assert opt.grad_scale is None  # type: ignore[attr-defined]
        assert guarded.update_allowed
        opt.step()
        opt.zero_grad(set_to_none=True)
        # And after the update the attributes are gone again (a later step is unaffected)
        assert guarded.after_update() is None
        assert not hasattr(opt, "found_inf") and not hasattr(opt, "grad_scale")
    assert guard.finish() is None
    assert guard.last_gradient_check_pass == 0


def test_the_users_found_inf_and_grad_scale_are_restored_after_the_step(
    one_process_group: None,
) -> None:
    # Given a guard over a fused AdamW whose found_inf and grad_scale the user had set
    model, opt, guard = _build()
    theirs_inf, theirs_scale = torch.zeros(()), torch.ones(())
    opt.found_inf, opt.grad_scale = theirs_inf, theirs_scale  # type: ignore[attr-defined]
    # When a common step is checked and left without after_update (the with block ends it)
    with guard.step(0) as guarded:
        loss = _forward_backward(model, guard, 0, None)
        guarded.check_gradients(loss)
        assert opt.found_inf is not theirs_inf  # type: ignore[attr-defined]
        opt.step()
    # Then both are the user's objects again
    assert opt.found_inf is theirs_inf  # type: ignore[attr-defined]
    assert opt.grad_scale is theirs_scale  # type: ignore[attr-defined]


def test_the_next_step_clears_found_inf_when_the_loop_never_ends_the_step(
    one_process_group: None,
) -> None:
    # Given a guard over a fused AdamW, in a loop that begins and checks steps by hand
    model, opt, guard = _build()
    first = guard.step(0)
    first.begin()
    first.check_gradients(_forward_backward(model, guard, 0, None))
    opt.step()
    opt.zero_grad(set_to_none=True)
    # When the next step begins without after_update or the with block
    second = guard.step(1)
    second.begin()
    # Then the optimizer no longer carries the first step's found_inf
    assert not hasattr(opt, "found_inf")
    second.end()


def test_a_bad_common_step_is_skipped_on_the_device_and_reported_at_the_next_step(
    one_process_group: None,
) -> None:
    # Given a guard over a fused AdamW and a batch with a NaN at step 1
    model, opt, guard = _build(bad_step=1)
    for step in range(1):
        with guard.step(step) as guarded:
            guarded.check_gradients(_forward_backward(model, guard, step, 1))
            opt.step()
            opt.zero_grad(set_to_none=True)
            guarded.after_update()
    before = [p.detach().clone() for p in model.parameters()]
    steps_before = [opt.state[p]["step"].clone() for p in model.parameters()]
    # When step 1 is checked and the optimizer steps
    with guard.step(1) as guarded:
        loss = _forward_backward(model, guard, 1, 1)
        assert guarded.check_gradients(loss) is None  # not known on the host yet
        assert torch.equal(opt.found_inf, torch.ones(()))  # type: ignore[attr-defined]
        opt.step()
        opt.zero_grad(set_to_none=True)
        guarded.after_update()
    # Then nothing was applied: weights and step counts are unchanged
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert all(
        torch.equal(opt.state[p]["step"], s)
        for p, s in zip(model.parameters(), steps_before, strict=True)
    )
    # And the next step's check reports step 1, naming this rank, and refuses step 2
    with guard.step(2) as guarded:
        alarm = guarded.check_gradients(_forward_backward(model, guard, 2, 1))
        assert alarm is not None and not guarded.update_allowed
    assert (alarm.step, alarm.check, alarm.nonfinite, alarm.suspects) == (1, "compute", [0], [0])
    assert guard.last_gradient_check_pass == 0


def test_a_bad_last_step_is_reported_by_finish(one_process_group: None) -> None:
    # Given a guard over a fused AdamW whose last step's batch holds a NaN
    model, opt, guard = _build(bad_step=0)
    with guard.step(0) as guarded:
        assert guarded.check_gradients(_forward_backward(model, guard, 0, 0)) is None
        opt.step()
    # When the loop ends
    alarm = guard.finish()
    # Then finish reports it, and the optimizer never stepped a parameter
    assert alarm is not None and (alarm.step, alarm.nonfinite) == (0, [0])
    assert all(opt.state[p]["step"].item() == 0 for p in model.parameters())


@pytest.mark.parametrize(
    ("optimizer", "options"),
    [
        ("adamw", {}),
        ("sgd", {}),
        ("fused_adamw", {"skip_on_device": False}),
        ("fused_adamw", {"ckpt_every": 1}),
        ("fused_adamw", {"check_every": 1}),
    ],
    ids=["unfused-adamw", "sgd", "switched-off", "checkpoint-step", "weight-check-step"],
)
def test_other_optimizers_and_steps_decided_on_the_host_keep_the_host_path(
    one_process_group: None, optimizer: str, options: dict[str, Any]
) -> None:
    # Given a guard whose optimizer cannot skip on the device, or is told not to, or a step
    # whose update a checkpoint or a weight comparison follows
    model, opt, guard = _build(optimizer, **options)
    with guard.step(0) as guarded:
        # When its gradients are checked
        assert guarded.check_gradients(_forward_backward(model, guard, 0, None)) is None
        # Then the optimizer is told nothing: the host decided the step
        assert not hasattr(opt, "found_inf")
        opt.step()
        opt.zero_grad(set_to_none=True)
        assert guarded.after_update() is None
    assert guard.finish() is None
    assert guard.last_gradient_check_pass == 0


def test_the_switch_is_validated_with_its_name() -> None:
    # Given a switch that is not a bool
    # Then the tree's field and the flat one are named
    with pytest.raises(ValueError, match=r"GuardConfig\.training\.skip_on_device must be True"):
        sdc.TrainingConfig(skip_on_device="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"Schedule\.skip_on_device must be True or False"):
        sdc.Schedule(skip_on_device=1)  # type: ignore[arg-type]
    assert sdc.GuardConfig(training=sdc.TrainingConfig(skip_on_device=False)).schedule() == (
        sdc.Schedule(skip_on_device=False)
    )


def _train_fsdp(skip_on_device: bool) -> tuple[int | None, Any, list[torch.Tensor], list[int]]:
    """Five steps of a small FSDP2 model (NaN batch at step 2) under a fused AdamW."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2))
    fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, fused=True)
    rebuild = _batch(2)
    guard = sdc.Guard(
        model,
        opt,
        compute_loss=_loss,
        rebuild_batch=rebuild,
        schedule=sdc.Schedule(**COMMON, skip_on_device=skip_on_device),
    )
    alarm = guard.train(rebuild(step, 0) for step in range(5))
    # FSDP2's parameters are DTensors: compare the whole tensors.
    weights = [p.full_tensor().detach().clone() for p in model.parameters()]
    steps = sorted({int(opt.state[p]["step"]) for p in opt.state})
    return guard.current_step, alarm, weights, steps


def test_under_fsdp2_a_bad_step_skipped_on_the_device_leaves_the_host_paths_weights(
    one_process_group: None,
) -> None:
    # Given an FSDP2 model under a fused AdamW whose step 2 has a NaN batch, trained on the
    # device path and on the host path
    stopped, alarm, weights, steps = _train_fsdp(True)
    host_stopped, host_alarm, host_weights, host_steps = _train_fsdp(False)
    # Then both name step 2 (the device path one step later), and neither applied it
    assert alarm is not None and host_alarm is not None
    assert (alarm.step, alarm.nonfinite) == (host_alarm.step, host_alarm.nonfinite) == (2, [0])
    assert (stopped, host_stopped) == (3, 2)
    assert steps == host_steps == [2]
    # And the sharded weights are bit for bit the host path's
    assert all(torch.equal(a, b) for a, b in zip(weights, host_weights, strict=True))


def test_coverage_says_where_a_bad_step_is_skipped(one_process_group: None) -> None:
    # Given a guard over a fused AdamW, and one over SGD
    fused = _build()[2].coverage()["checks"]["nonfinite_gradients"]
    plain = _build("sgd")[2].coverage()["checks"]["nonfinite_gradients"]
    # Then each one's coverage says where its bad steps are skipped
    assert fused["bad_step_skipped"].startswith("on the device: the fused optimizer's found_inf")
    assert plain["bad_step_skipped"].startswith("on the host:")

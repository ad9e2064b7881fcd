"""A bad step skipped on the device (issue 31 item 4) on a real multi-process DDP job: 3
simulated nodes x 1 rank, gloo, CPU, the drill model under a fused AdamW.

Each scenario runs twice: with the guard's device path (the optimizer's ``found_inf``, the
flags read at the next agreement point) and with today's host path
(``Schedule(skip_on_device=False)``: the host reads the flags and drops a bad step's
gradients). The host path is the reference: the device path must leave every rank's weights
and optimizer state bit for bit where it leaves them, and raise the same alarm, one agreement
point later at most. Audits every 5 steps, weight comparisons after steps 3, 7, 11 and
checkpoints after 5 and 11, so device-path steps sit next to steps decided on the host.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from sdc_agent.drills.launch import launch
from tests.agent.outcomes import ok

# How long this file's processes may run before the launcher kills them; the suite's conftest
# marks the file slow and gives pytest-timeout this plus a margin.
LAUNCH_DEADLINE_S = 420

SCHEDULE = {
    "audit_every": 5,
    "check_every": 4,
    "ckpt_every": 6,
    "peer_offset": 1,
    "sensors": False,
}
NAN_STEP = 6
"""A common step (no audit, no weight comparison or checkpoint after it); step 7 after it is
a weight-comparison step, decided on the host."""
REDUCED_STEP = 8
"""A common step followed by another (step 9): both on the device path."""
SUSPECT = 1


def fused_adamw_run(
    *, steps: int, skip_on_device: bool, fault: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Train the drill model under a fused AdamW with ``Guard.train``; report the alarm, the
    step the loop stopped at, the digests of this rank's parameters and optimizer state, the
    checkpoints' tags, and whether the guard left the optimizer's ``found_inf`` behind."""
    import sdc_agent as sdc
    from sdc_agent.drills.job import DrillModel, make_batch, make_fault, make_loss, make_step_batch

    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(DrillModel())
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, fused=True)
    guard = sdc.Guard(
        model,
        optimizer,
        compute_loss=make_loss(),
        rebuild_batch=lambda step, rank: make_step_batch(step, rank),
        schedule=sdc.Schedule(**SCHEDULE, skip_on_device=skip_on_device),
    )
    if fault is not None:
        make_fault(fault).attach(guard)
    saves: list[tuple[int, dict[str, Any]]] = []
    batches = (make_batch(s, dist.get_rank()) for s in range(steps))
    alarm = guard.train(batches, save_checkpoint=lambda s, tags: saves.append((s, tags)))
    params = [p.detach() for p in model.parameters()]
    state = [
        optimizer.state[p][key].detach()
        for p in model.parameters()
        if p in optimizer.state
        for key in ("step", "exp_avg", "exp_avg_sq")
    ]
    return {
        "alarm": alarm.to_dict() if alarm else None,
        "stopped_at": guard.current_step,
        "weights": _digest(params),
        "optimizer": _digest(state),
        "steps_applied": sorted({int(optimizer.state[p]["step"]) for p in optimizer.state}),
        "saves": saves,
        "found_inf_left": hasattr(optimizer, "found_inf") or hasattr(optimizer, "grad_scale"),
    }


def _digest(tensors: list[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


SELF = "tests.agent.test_device_skip_ddp:fused_adamw_run"
NAN = {"kind": "NaNOutputElement", "layer": "net.4", "rank": SUSPECT, "step": NAN_STEP}
REDUCED = {"kind": "NaNReducedGradient", "index": 3, "rank": 2, "step": REDUCED_STEP}
SCENARIOS: dict[str, dict[str, Any]] = {
    "clean": {"steps": 14},
    "nan": {"steps": 12, "fault": {**NAN, "persistent": False}},
    "reduced_nan": {"steps": 12, "fault": {**REDUCED, "persistent": False}},
    "nan_last_step": {"steps": NAN_STEP + 1, "fault": {**NAN, "persistent": False}},
}
JOBS = {
    f"{name}/{path}": (SELF, {**kwargs, "skip_on_device": path == "device"})
    for name, kwargs in SCENARIOS.items()
    for path in ("device", "host")
}


@pytest.fixture(scope="module")
def results() -> dict[str, list[dict[str, Any]]]:
    names = list(JOBS)
    per_job = launch(
        [JOBS[n] for n in names], world=3, ranks_per_node=1, timeout_s=LAUNCH_DEADLINE_S
    )
    return {name: ok({name: runs}, name) for name, runs in zip(names, per_job, strict=True)}


def _same_training(results: dict, scenario: str) -> tuple[list[dict], list[dict]]:
    """Both paths' per-rank results, asserting every rank's weights and optimizer state are bit
    for bit the same on both, and the guard left no found_inf on any optimizer."""
    device, host = results[f"{scenario}/device"], results[f"{scenario}/host"]
    for d, h in zip(device, host, strict=True):
        assert (d["weights"], d["optimizer"]) == (h["weights"], h["optimizer"])
        assert d["steps_applied"] == h["steps_applied"]
        assert not d["found_inf_left"] and not h["found_inf_left"]
    return device, host


def test_a_fault_free_run_trains_bit_for_bit_as_the_host_path_without_alarm(results):
    # Given 14 fault-free steps under a fused AdamW, on the device path and on the host path
    device, host = _same_training(results, "clean")
    # Then neither raises an alarm, and both saved the same checkpoints with the same tags
    assert all(r["alarm"] is None for r in device + host)
    assert [r["saves"] for r in device] == [r["saves"] for r in host]
    assert [s for s, _ in device[0]["saves"]] == [5, 11]
    assert all(tags["weights_verified"] for _, tags in device[0]["saves"])
    # And every step was applied on every rank
    assert all(r["steps_applied"] == [14] and r["stopped_at"] == 13 for r in device)


def test_a_nan_on_one_rank_is_skipped_everywhere_and_named_as_the_host_path_names_it(results):
    # Given a NaN in rank 1's forward output at step 6 (its local gradient, and through the
    # all-reduce every rank's reduced gradient, non-finite)
    device, host = _same_training(results, "nan")
    # Then on the device path no rank applied step 6 (nor anything after): the weights are the
    # host path's, which dropped it, bit for bit
    assert all(r["steps_applied"] == [NAN_STEP] for r in device)
    # And the alarm is the host path's (step 6, rank 1 named, confirmed transient by the
    # replays, which every rank could still run: nobody had applied the step), raised at step
    # 7's agreement point instead of step 6's
    alarm, reference = device[0]["alarm"], host[0]["alarm"]
    assert all(r["alarm"] == alarm for r in device)
    assert (alarm["step"], alarm["check"], alarm["nonfinite"]) == (NAN_STEP, "compute", [SUSPECT])
    assert alarm["suspects"] == reference["suspects"] == [SUSPECT]
    assert alarm["verdicts"] == reference["verdicts"]
    assert alarm == reference
    assert [r["stopped_at"] for r in device + host] == [NAN_STEP + 1] * 3 + [NAN_STEP] * 3


def test_a_nan_in_one_ranks_reduced_gradient_is_skipped_there_only_as_the_host_path_does(results):
    # Given a NaN written into rank 2's reduced gradient at step 8 (every local one finite):
    # only rank 2's flags are bad, the other ranks apply the step
    device, host = _same_training(results, "reduced_nan")
    # Then rank 2 did not apply step 8, the others did, on both paths alike (bit for bit)
    assert [r["steps_applied"] for r in device] == [[9], [9], [8]]
    # And the alarm is the host path's, at the next agreement point (step 9), naming nobody (a
    # NaN after the all-reduce is no GPU's computation)
    alarm = device[0]["alarm"]
    assert all(r["alarm"] == alarm for r in device + host)
    assert all(r["stopped_at"] == REDUCED_STEP + 1 for r in device + host)
    assert (alarm["step"], alarm["check"], alarm["suspects"]) == (
        REDUCED_STEP,
        "reduced_gradient",
        None,
    )


def test_a_nan_at_the_last_step_is_reported_by_finish(results):
    # Given the NaN at the run's last step
    device, host = _same_training(results, "nan_last_step")
    # Then no rank applied it, and the device path's alarm (from Guard.finish) names the suspect
    assert all(r["steps_applied"] == [NAN_STEP] for r in device)
    alarm = device[0]["alarm"]
    assert all(r["alarm"] == alarm for r in device)
    assert (alarm["step"], alarm["suspects"]) == (NAN_STEP, host[0]["alarm"]["suspects"])
    assert alarm == host[0]["alarm"]
    assert all(r["stopped_at"] == NAN_STEP for r in device)

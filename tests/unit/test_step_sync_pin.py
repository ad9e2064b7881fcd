"""The guard's common step (check 1 only: no audit, no sensor, no weight check) is pinned: its
host syncs, blocking waits, collectives and kernel launches over the plain step, as
``benchmarks/costmodel``'s dispatch-level recorder counts them on a tiny Llama in a 1-process
gloo group (the recorder of the GPU cost model, ``benchmarks/step_cost.py``).

On a GPU every host sync drains the stream and stalls the next launch; at 1,024 GPUs each one
waits for the slowest rank. So a change that adds a sync (or a wait, a collective, a launch) to
the common step must fail here, not in a benchmark run nobody reads.

LOWERING a number is welcome: update the pin in the same commit and say which sync went where
(issue 31's target is at most one host sync per common step). RAISING one needs a reason
written in the commit message and in the comment beside the pin.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from costmodel import slices  # noqa: E402
from costmodel.recorder import difference, uninstall  # noqa: E402

TINY = {"hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 16, "ffn": 128}
PARAMETERS = 12
"""Trainable tensors of the tiny Llama (1 layer): embedding, 4 attention and 3 MLP weights, 2
norms in the layer, the final norm, the head."""

# The guard's common step makes ONE host sync (issue 31's target), in check_gradients:
#   exchange.py GradientCheck.read_flags: `torch.cat([this step's flags and reduced sums, the
#       previous step's reduced flags]).tolist()`: the previous step's reduction (waited for
#       first) is read with this step's values, and settle() then judges it without reading
#       again. Lowered from three (main @ 11d463f): the previous step's flags had a read of
#       their own (FlagExchange.summary), and the reduction's four integers were a pageable
#       host-to-device copy of the values read (now a device-to-device copy of one row of a
#       table made once per device, exchange.py _reduction_rows).
COMMON_SYNCS = Counter({("checks/gradients/exchange.py", "host_read"): 1})
# The one blocking wait: FlagExchange.summary's `self._work.wait()` on the previous step's
# flag reduction (exchange.py).
COMMON_WAITS = Counter({"checks/gradients/exchange.py": 1})
# The one collective the guard adds: the flags' all-reduce MAX of four int64 (exchange.py,
# FlagExchange.__init__). DDP's bucket all-reduce from the comm hook replaces DDP's own.
COMMON_COLLECTIVES = [("all_reduce", "MAX", 32)]
# Launches over the plain step. micro (forward + backward): DDP, one bucket: the comm hook's
# zeros(1) flag, the fused non-finite check that also divides by the world (DDP's own division,
# a mul, becomes a copy into the bucket: no net launch), the reduced bucket's fp32 sum (K1-K3);
# FSDP2: per parameter the fused check on the unsharded gradient and the fp32 sum of the
# reduced shard, plus one zeros(1). step: stack(reduced sums), cat(the values read, the previous
# step's reduction among them), the copy of the flags' row (exchange.py _reduction_rows), the
# flags' all-reduce.
COMMON_LAUNCHES = {
    "ddp": {"micro": 3, "step": 4},
    "fsdp": {"micro": 2 * PARAMETERS + 1, "step": 4},
}

# With a fused AdamW (no GradScaler) the common step makes NO host sync (issue 31 item 4): the
# read above is gone from it. This rank's flags are judged on the device and handed to the
# optimizer as `found_inf` (the fused kernel skips a bad step on the device); the previous
# step's flags and reduction are read from host memory that a non-blocking copy filled
# (exchange.py HostFlags: pinned memory and a CUDA event on a GPU; on the CPU the copy is made
# at the read, after the reduction's wait). The one wait is the same: the previous step's
# reduction (exchange.py FlagExchange.reduced_for_reading). Launches over the plain fused
# step: micro as above; step: the stack of reduced sums, the local flags' cat/ne/any, the
# reduced values' isfinite (a composite: eq, abs, ne, mul) with all/logical_not, the sensor
# flag's zeros, the stack and int64 cast of the three flags, the reduction's sum/eq/cast/cat,
# the flags' all-reduce, found_inf's amax and cast, the fused step's `_foreach_sub_` of
# found_inf from the step counts, and the host copy's cat and copy_.
FUSED_ADAMW_LAUNCHES = {
    "ddp": {"micro": 3, "step": 23},
    "fsdp": {"micro": 2 * PARAMETERS + 1, "step": 23},
}


@pytest.fixture
def one_process_group(one_process_group: None) -> Iterator[None]:
    """The shared 1-process gloo group (tests/unit/conftest.py), on one thread, with the
    recorder's wrappers of torch.distributed removed before the group goes."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        uninstall()  # the recorder's wrappers of torch.distributed go with the group
        torch.set_num_threads(threads)


def _common_step(parallel: str, plain: str = "plain", checks: str = "checks") -> tuple[dict, dict]:
    """(the guarded common step's recording, its difference from the plain step's)."""
    shape = slices.SliceShape(
        **TINY, parallel=parallel, bf16="params" if parallel == "fsdp" else "autocast"
    )
    recorded = {}
    for configuration in (slices.BY_NAME[plain], slices.BY_NAME[checks]):
        built = slices.build(shape, configuration, layers=1, tokens=24, vocab=50)
        [recorded[configuration.name]] = slices.record_steps(built, configuration)
    return recorded[checks], difference(recorded[checks], recorded[plain])


def _assert_waits_collectives_launches(
    guarded: dict, added: dict, launches: dict[str, int], shown: str
) -> None:
    """The common step's blocking waits and added collectives are today's (COMMON_WAITS,
    COMMON_COLLECTIVES), and its added launches per phase are ``launches`` (on a mismatch the
    ``shown`` phase's operators are printed)."""
    phases = guarded["phases"]
    waits = Counter(w["where"].split(":")[0] for p in phases.values() for w in p["waits"])
    assert waits == COMMON_WAITS
    issued = [
        (c["op"], c["reduce"], c["bytes"])
        for p in phases.values()
        for c in p["collectives"]
        if c["guard"] and not c["replaces"]
    ]
    assert issued == COMMON_COLLECTIVES
    found = {p: added["phases"][p]["launches"] for p in phases}
    assert found == launches, added["phases"][shown]["ops"]


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_the_common_step_adds_one_host_sync_one_wait_one_collective(
    one_process_group: None, parallel: str
) -> None:
    # Given a tiny Llama under DDP or FSDP2 in a 1-process gloo group, plain and guarded with
    # check 1 only, after a warm-up step
    # When one steady-state step of each is recorded at the dispatch level
    guarded, added = _common_step(parallel)
    phases = guarded["phases"]
    # Then the guard's host syncs are exactly today's (module docstring: lower is welcome)
    syncs = [s for p in phases.values() for s in p["sync_list"] if s["guard"]]
    found = Counter((s["where"].split(":")[0], s["kind"]) for s in syncs)
    assert found == COMMON_SYNCS, [s["where"] for s in syncs]
    assert sum(added["phases"][p]["syncs"] for p in phases) == sum(COMMON_SYNCS.values())
    # And so are its blocking waits, the collectives it adds and its launches per phase
    _assert_waits_collectives_launches(guarded, added, COMMON_LAUNCHES[parallel], "micro")


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_with_a_fused_adamw_the_common_step_adds_no_host_sync(
    one_process_group: None, parallel: str
) -> None:
    # Given the same tiny Llama, plain and guarded with check 1 only, both with a fused AdamW
    # (which skips a bad step on the device), after a warm-up step
    # When one steady-state step of each is recorded at the dispatch level
    guarded, added = _common_step(parallel, "plain_fused_adamw", "checks_fused_adamw")
    phases = guarded["phases"]
    # Then the guard makes no host sync at all (the previous step's flags come from host memory)
    syncs = [s["where"] for p in phases.values() for s in p["sync_list"] if s["guard"]]
    assert syncs == []
    assert sum(added["phases"][p]["syncs"] for p in phases) == 0
    # And it waits for the previous step's reduction and adds its one collective, as without;
    # and its launches per phase
    _assert_waits_collectives_launches(guarded, added, FUSED_ADAMW_LAUNCHES[parallel], "step")


def test_the_recorder_counts_a_sync_and_a_wait_added_to_the_step(one_process_group: None) -> None:
    # Given the recorder on a step that reads a device value and waits for a collective
    from costmodel.recorder import StepRecorder, install

    install()
    x = torch.ones(8)
    recorder = StepRecorder()
    # When it records a .item(), a .tolist(), a data-dependent nonzero and an awaited all_reduce
    with recorder:
        recorder.phase = "step"
        y = x * 2
        y.sum().item()
        y.tolist()
        torch.nonzero(y)
        dist.all_reduce(y, async_op=True).wait()
    recorder.stop()
    summary = recorder.summary()["phases"]["step"]
    # Then each host read is one sync, the wait and the collective are listed
    assert [s["what"] for s in summary["sync_list"]] == [
        "_local_scalar_dense",
        "Tensor.tolist",
        "nonzero",
    ]
    assert [w["what"] for w in summary["waits"]] == ["wait(all_reduce)"]
    assert [(c["op"], c["bytes"]) for c in summary["collectives"]] == [("all_reduce", 32)]
    # And the multiply, the sum and the nonzero are kernels reading and writing their bytes
    assert summary["ops"]["mul"]["launches"] == 1
    assert (
        summary["ops"]["mul"]["bytes_read"] == 32 and summary["ops"]["mul"]["bytes_written"] == 32
    )


def _read_twice_on_one_line(t: torch.Tensor) -> list[float]:
    return t.cpu().tolist()


def test_a_line_run_again_is_a_sync_again_and_one_chained_read_is_one() -> None:
    # Given the recorder (no collective: nothing to install for the reads themselves)
    from costmodel.recorder import StepRecorder, install

    install()
    try:
        x, two = torch.ones(4), torch.full((2,), 2.0)
        recorder = StepRecorder()
        # When a host read on one line runs three times in a loop, a function reading twice in
        # one expression is called twice, and a Python list indexes a tensor (a host-to-device
        # copy of the index) twice in a row
        with recorder:
            for _ in range(3):
                x.sum().item()
            _read_twice_on_one_line(x)
            _read_twice_on_one_line(x)
            for _ in range(2):
                x[[0, 1]] = two
        recorder.stop()
        syncs = recorder.summary()["phases"]["step"]["sync_list"]
    finally:
        uninstall()
    # Then each execution of a line blocks once: 3 + 2 (each `t.cpu().tolist()` once) + 2
    assert [s["what"] for s in syncs] == [
        "_local_scalar_dense",
        "_local_scalar_dense",
        "_local_scalar_dense",
        "Tensor.cpu + Tensor.tolist",
        "Tensor.cpu + Tensor.tolist",
        "lift_fresh",
        "lift_fresh",
    ]


def test_a_collective_callback_is_recorded_once_whichever_thread_runs_it(
    one_process_group: None,
) -> None:
    # Given the recorder and a collective's future (DDP's comm hook chains its reduced bucket's
    # sum on one: gloo runs the callback inline when the all-reduce has completed, else on its
    # own thread, and which one happens is a race)
    import threading

    from costmodel.recorder import StepRecorder, _TrackedFuture, install

    install()
    x = torch.ones(8)
    recorder = StepRecorder()
    threads = []

    def after(fut: torch.futures.Future) -> torch.Tensor:
        threads.append(threading.current_thread().name)
        return fut.value().sum()

    # When one callback is chained on a future that has completed (it runs inline) and one on a
    # future completed later by another thread (it runs there)
    with recorder:
        done = torch.futures.Future()
        done.set_result(x)
        _TrackedFuture(done).then(after).wait()
        later = torch.futures.Future()
        chained = _TrackedFuture(later).then(after)
        completer = threading.Thread(target=later.set_result, args=(x,), name="completer")
        completer.start()
        completer.join(timeout=60)
        chained.wait()
    recorder.stop()
    ops = recorder.summary()["phases"]["step"]["ops"]
    # Then both sums are recorded, each once
    assert threads == [threading.current_thread().name, "completer"]
    assert ops["sum"]["launches"] == 2, ops

"""The node screen's runner (sdc_agent.screen.runner) on simulated CPU devices with injected
faults: who is named, when, and what golden digests are used for."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from sdc_agent.screen import GoldenStore, ScreenConfig, run_screen, simulated_devices
from sdc_agent.screen.faults import Fault, hooks
from sdc_agent.screen.ops import OutputHook
from sdc_contract.screen import OpSpec

FIRST_GEMM = "gemm:bf16:64x96x96"
FIRST_SUM = "reduction:fp32:64x96:sum"


def screen(n: int, *faults: str, reps: int = 2, **kwargs):
    """A screen of ``n`` simulated devices with ``faults`` (``--fault`` specs), ``reps`` seeds."""
    golden = kwargs.pop("golden", None)
    config = ScreenConfig(repetitions=reps, **kwargs)
    return run_screen(simulated_devices(n), config, golden=golden, hooks=hooks(list(faults)))


def statuses(result) -> dict[int, str]:
    return {d.device.index: d.status for d in result.devices}


def test_gemm_x1000_on_one_device_is_reproduced_naming_that_device_only():
    result = screen(4, "2:gemm-x1000")
    assert result.verdict == "reproduced"
    assert statuses(result) == {0: "agrees", 1: "agrees", 2: "reproduced", 3: "agrees"}
    bad = result.device(2)
    assert bad.mismatches == 2  # the one GEMM shape, at each of the two seeds
    assert bad.ops == (FIRST_GEMM,)
    assert "device 2 (cpu-2) reproduced" in result.summary
    assert len({result.device(i).digest for i in (0, 1, 3)}) == 1
    assert bad.digest != result.device(0).digest


def test_reduction_bit_flip_on_device_zero_is_reproduced():
    result = screen(3, "0:reduction-bitflip")
    assert result.verdict == "reproduced"
    assert statuses(result) == {0: "reproduced", 1: "agrees", 2: "agrees"}
    assert result.device(0).ops == (FIRST_SUM,)
    assert result.device(0).mismatches == 2


def test_fault_on_ten_percent_of_calls_is_reproduced_and_every_firing_is_a_mismatch():
    found = hooks(["1:any-x1000:0.1"])
    fault = found[1]
    assert isinstance(fault, Fault)
    result = run_screen(simulated_devices(3), ScreenConfig(repetitions=4), hooks=found)
    assert 2 <= fault.fired < fault.calls  # intermittent, yet fired enough to reproduce
    assert fault.calls == 4 * len(result.ops)  # every op of every repetition was a chance
    assert result.verdict == "reproduced"
    assert statuses(result) == {0: "agrees", 1: "reproduced", 2: "agrees"}
    assert result.device(1).mismatches == fault.fired


def test_a_single_mismatch_is_suspect_and_inconclusive():
    result = screen(3, "1:gemm-x1000", reps=1)
    assert result.verdict == "inconclusive"
    assert statuses(result) == {0: "agrees", 1: "suspect", 2: "agrees"}
    assert "device 1 (cpu-1) suspect" in result.summary


def test_a_corrupted_collective_names_its_device():
    result = screen(3, "2:collective-x1000")
    assert result.verdict == "reproduced"
    assert result.device(2).ops == ("collective:fp32:4096",)


def test_no_fault_is_clean_with_the_same_digests_on_every_device_and_every_run():
    first = screen(4)
    second = screen(4)
    assert first.verdict == second.verdict == "clean"
    assert set(statuses(first).values()) == {"agrees"}
    assert len({d.digest for d in (*first.devices, *second.devices)}) == 1
    for a, b in zip(first.observations, second.observations, strict=True):
        assert a.op == b.op and a.seed == b.seed
        assert len(set(a.digests.values())) == 1
        assert a.digests == b.digests
    assert len(first.observations) == 2 * 14  # 13 suite ops and the collective, two seeds
    assert "nccl" in first.not_exercised[0]
    assert "not an exoneration" in first.summary


def test_new_seeds_give_new_inputs():
    result = screen(2, reps=2)
    by_seed = {o.seed: o.digests[0] for o in result.observations if o.op.label() == FIRST_GEMM}
    assert by_seed[0] != by_seed[1]


def test_two_devices_that_disagree_name_nobody_without_golden():
    result = screen(2, "1:gemm-x1000")
    assert result.verdict == "inconclusive"
    assert set(statuses(result).values()) == {"agrees"}
    assert result.inconclusive_ops == (FIRST_GEMM,)


def test_a_single_device_without_golden_is_unjudged():
    result = screen(1)
    assert result.verdict == "inconclusive"
    assert statuses(result) == {0: "unjudged"}
    assert "collective: a single device" in result.not_exercised


def learned_store(tmp_path: Path) -> GoldenStore:
    """A golden store learned from a clean three-device screen, saved and read back."""
    store = GoldenStore.load(tmp_path / "golden.json")
    result = screen(3, golden=store)
    assert result.verdict == "clean"
    assert result.golden["learned"] == 2 * 13  # every observation but the collective's
    return GoldenStore.load(tmp_path / "golden.json")


def test_golden_learned_on_several_devices_judges_a_single_device(tmp_path):
    store = learned_store(tmp_path)
    clean = screen(1, golden=store)
    assert clean.verdict == "clean"
    assert clean.golden["compared"] == 2 * 13
    bad = screen(1, "0:reduction-bitflip", golden=store)
    assert bad.verdict == "reproduced"
    assert bad.device(0).ops == (FIRST_SUM,)
    tie = screen(2, "1:gemm-x1000", golden=store)  # no majority of two: the golden decides
    assert tie.verdict == "reproduced"
    assert statuses(tie) == {0: "agrees", 1: "reproduced"}


def test_golden_under_another_torch_version_is_not_used(tmp_path):
    store = learned_store(tmp_path)
    (key,) = store.entries
    foreign = dataclasses.replace(key, torch="2.0.0")
    # Wrong digests under the foreign key: were they used, the screen could not be clean.
    wrong = {obs: "0" * 16 for obs in store.entries[key]}
    store = GoldenStore(entries={foreign: wrong})
    several = screen(3, golden=store)
    assert several.verdict == "clean"
    assert several.golden["compared"] == 0
    assert several.golden["foreign_keys"] == 1
    assert any("entries under other keys, not used" in s for s in several.not_exercised)
    single = screen(1, golden=GoldenStore(entries={foreign: wrong}), learn_golden=False)
    assert single.verdict == "inconclusive"
    assert single.golden["compared"] == 0
    assert statuses(single) == {0: "unjudged"}


def test_golden_that_disagrees_with_the_majority_is_inconclusive_naming_nobody(tmp_path):
    store = learned_store(tmp_path)
    (key,) = store.entries
    for obs in list(store.entries[key]):
        if obs.startswith(FIRST_GEMM + "@"):
            store.entries[key][obs] = "0" * 16
    before = store.document()
    result = screen(3, golden=store)
    assert result.verdict == "inconclusive"
    assert result.inconclusive_ops == (FIRST_GEMM,)
    assert not [d for d in result.devices if d.status in ("reproduced", "suspect")]
    assert result.golden["learned"] == 0 and store.document() == before


class Alternating:
    """A hook that corrupts every other call of the first GEMM: not repeatable."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, spec: OpSpec, outputs: list[torch.Tensor]) -> list[torch.Tensor]:
        if spec.label() != FIRST_GEMM:
            return outputs
        self.calls += 1
        if self.calls % 2:
            return outputs
        return [outputs[0] * 1000, *outputs[1:]]


def test_repeatability_check_does_not_let_a_faulty_device_exclude_an_op():
    found: dict[int, OutputHook] = {0: Alternating()}
    config = ScreenConfig(repetitions=4, check_repeatable=True)
    result = run_screen(simulated_devices(3), config, hooks=found)
    assert FIRST_GEMM in result.exercised["ops"]
    assert result.verdict == "reproduced"
    assert statuses(result) == {0: "reproduced", 1: "agrees", 2: "agrees"}


def test_repeatability_check_excludes_an_op_nondeterministic_everywhere():
    found: dict[int, OutputHook] = {i: Alternating() for i in range(3)}
    config = ScreenConfig(repetitions=1, check_repeatable=True)
    result = run_screen(simulated_devices(3), config, hooks=found)
    assert FIRST_GEMM not in result.exercised["ops"]
    assert any(s.startswith(FIRST_GEMM + ": not repeatable") for s in result.not_exercised)


def test_the_budget_stops_new_repetitions():
    ticks = iter(range(0, 10_000, 10))
    config = ScreenConfig(repetitions=5, budget_s=1.0)
    result = run_screen(simulated_devices(2), config, clock=lambda: float(next(ticks)))
    assert result.exercised["repetitions"] == 1
    assert "repetitions: 1 of 5 within 1 s" in result.not_exercised


def test_workload_ops_run_after_the_suite_and_duplicates_once():
    extra = OpSpec("gemm", (8, 8, 8), "fp32", name="job.proj")
    dup = OpSpec("gemm", (64, 96, 96), "bf16", name="job.same-as-suite")
    result = screen(2, reps=1, workload=(extra, dup))
    labels = result.exercised["ops"]
    assert labels.count(FIRST_GEMM) == 1
    assert labels[-2:] == ["gemm:fp32:8x8x8", "collective:fp32:4096"]
    assert result.exercised["workload_ops"] == 2


@pytest.mark.parametrize(
    ("devices", "found", "why"),
    [(0, {}, "no device"), (2, {5: Fault("gemm", "x1000")}, "not screened")],
)
def test_a_screen_that_cannot_run_fails(devices, found, why):
    result = run_screen(simulated_devices(devices) if devices else [], hooks=found)
    assert result.verdict == "failed"
    assert result.error is not None and why in result.error

"""The node screen's GPU cost model (benchmarks/screen_cost.py): its arithmetic on a tiny op list,
computed by hand; its ops are the screen's own; its output says it is a model."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import screen_cost  # noqa: E402
from costmodel import project  # noqa: E402

from sdc_agent.screen.ops import collective_spec, fixed_suite  # noqa: E402
from sdc_contract.screen import OpSpec  # noqa: E402

H100 = next(g for g in project.GPUS if g.name == "H100")
GEMM = OpSpec("gemm", (4096, 4096, 4096), "bf16", name="t.gemm")
NORM = OpSpec("norm", (4, 8), "fp32", name="t.norm")


def test_a_large_gemm_is_compute_bound_and_a_small_norm_memory_bound() -> None:
    # Given a bf16 GEMM 4096^3 and an fp32 layer norm [4, 8] on an H100
    # Then the GEMM takes 2 x 4096^3 FLOPs at 70% of 989 TFLOP/s, plus 3 launches (its
    # kernel and the fingerprint's two)
    assert screen_cost.op_flops(GEMM) == 2 * 4096**3
    expected = 2 * 4096**3 / (989e12 * 0.7) + 3 * 4.5e-6
    assert screen_cost.gpu_seconds(GEMM, H100) == pytest.approx(expected)
    # And the norm moves x, weight, bias in and y out (32 + 16 + 32 = 80 elements; the
    # contract counts 2 x 32 = 64), plus y read back by the fingerprint: (64 + 32) x 4 bytes
    assert screen_cost.op_flops(NORM) == 0
    assert screen_cost.op_bytes(NORM) == (64 + 32) * 4
    assert screen_cost.gpu_seconds(NORM, H100) == pytest.approx(384 / (3.35e12 * 0.8) + 3 * 4.5e-6)


def test_a_repetition_generates_inputs_once_and_runs_the_gpus_in_turn() -> None:
    # Given the two ops on a node of 8 GPUs
    rep = screen_cost.repetition([GEMM, NORM], H100, gpus=8)
    # Then the host generates each op's inputs once (the GEMM's 2 x 4096^2, the norm's 32)
    inputs = 2 * 4096**2 + 32
    assert rep["host_s"] == pytest.approx(inputs / 0.25e9)
    # And copies them to each GPU (bf16: 2 bytes, fp32: 4) at 25 GB/s
    copy = (2 * 4096**2 * 2 + 32 * 4) / 25e9
    assert rep["copy_s_per_gpu"] == pytest.approx(copy)
    # And the node's time is that generation plus 8 GPUs' turns of copy and compute
    gpu = screen_cost.gpu_seconds(GEMM, H100) + screen_cost.gpu_seconds(NORM, H100)
    assert rep["node_s_as_built"] == pytest.approx(inputs / 0.25e9 + 8 * (copy + gpu))
    assert rep["node_s_parallel"] == pytest.approx(inputs / 0.25e9 + copy + gpu)


def test_a_screen_costs_its_node_time_at_the_p5_price() -> None:
    # Given one repetition of the tiny list
    cost = screen_cost.screen_cost([GEMM, NORM], repetitions=1)["H100"]
    # Then the node time is the repeatability pass, one repetition and the assumed overheads
    assumed = screen_cost.ASSUMED
    fixed = assumed["pod_scheduling_s"] + assumed["image_pull_s"] + assumed["process_start_s"]
    assert cost["fixed_overheads_s"] == fixed
    rep = cost["repetition"]
    check = rep["host_s"] + 8 * (rep["copy_s_per_gpu"] + 2 * rep["gpu_s_per_gpu"])
    assert cost["node_s"] == pytest.approx(check + rep["node_s_as_built"] + fixed)
    # And 8 GPU-hours per node-hour, dollars at the p5.48xlarge list price
    hours = cost["node_s"] / 3600
    assert cost["gpu_hours"] == pytest.approx(8 * hours)
    assert cost["node_dollars"] == pytest.approx(hours * 55.04)
    # And a fleet of 64 nodes screened every 30 days pays 64 x (730 / 24 / 30) screens a month
    assert cost["fleet_month"]["64"] == pytest.approx(64 * 730 / 24 / 30 * hours * 55.04)


def test_the_ops_are_the_screens_own(monkeypatch: pytest.MonkeyPatch) -> None:
    # Then the model prices exactly the training suite and the collective the screen runs
    assert screen_cost.screen_ops() == (*fixed_suite("training"), collective_spec("training"))
    # And a changed suite changes the model (it imports the list; it does not retype it)
    monkeypatch.setattr(screen_cost, "fixed_suite", lambda size: (NORM,))
    labels = [op.label() for op in screen_cost.screen_ops()]
    assert labels == [NORM.label(), collective_spec("training").label()]


def test_the_output_says_it_is_a_model_and_names_its_assumptions(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # When the benchmark prints its figures
    assert screen_cost.main([]) == 0
    out = capsys.readouterr().out
    # Then it is labelled a model, its prices not fetched, its host rates and overheads assumed
    assert "MODEL, not a measurement: no GPU ran" in out
    assert "not fetched" in out
    assert "(assumed)" in out and "image_pull_s" in out
    # And every op of the suite has its row
    for op in screen_cost.screen_ops():
        assert f"`{op.label()}`" in out


def test_the_8b_workload_is_the_recorders_and_joins_the_suite_as_the_runner_plans_it() -> None:
    # Given the workload the guard's recorder derives for the Llama-3-8B job
    workload = screen_cost.llama_8b_workload()
    # Then it holds that job's GEMMs (hidden 4,096, FFN 14,336) and its causal attention
    kinds = {op.kind for op in workload}
    assert {"gemm", "sdpa"} <= kinds
    assert any(op.kind == "gemm" and 14336 in op.shape for op in workload)
    assert any(
        op.kind == "sdpa" and op.causal and op.shape[1:] == (32, 8192, 128) for op in workload
    )
    # And the screen's plan is the suite, the workload's new labels once, the all-sum last
    ops = screen_cost.with_workload((*workload, *workload))
    labels = [op.label() for op in ops]
    assert len(labels) == len(set(labels))
    assert labels[: len(fixed_suite("training"))] == [o.label() for o in fixed_suite("training")]
    assert ops[-1] == collective_spec("training")

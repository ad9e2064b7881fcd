"""Sensors on a Hugging Face Llama built from a config, on a real multi-process DDP job: 3
simulated nodes x 2 ranks, gloo, CPU, ``sdc.protect(model)`` before DDP, every sensor on every
step (``Schedule(sensor_budget=math.inf)``).

Rank R=3 (node 1) is the faulty one; its candidates are confirmed by rank 5 (node 2), its third
GPU with peer_offset=2. Audits run every 50 steps, so every fault below (step 8) lands between
audits and only a sensor can see it: an RMSNorm's output, the SiLU of the MLP, the SDPA
attention's output (``attention="checked"``), the loss gradient, and, with activation
checkpointing and the fused attention kernel, a fault in the fused kernel that only the
recompute comparison sees. Then 300 fault-free steps in fp32 and in bf16 autocast: no alarm.
"""

from __future__ import annotations

from typing import Any

import pytest

from sdc_agent.drills.launch import launch
from tests.agent.outcomes import assert_one_sensor_named_it, ok, the_alarm
from tests.agent.sensor_scenarios import x1_1_once

# How long this file's processes may run before the launcher kills them; the suite's conftest
# marks the file slow and gives pytest-timeout this plus a margin.
LAUNCH_DEADLINE_S = 1440


# One launch for every scenario (about 3-4 minutes on 2 idle cores; more under load).

R = 3
RUN = "tests.agent.llama_scenarios:llama_run"
CLEAN_STEPS = 300
WARM = {"warmup_checks": 5}
FAULTS = {  # scenario: (sensor layer, op, kind)
    "rms_norm": ("model.layers.1.post_attention_layernorm", "forward", "rms_norm"),
    "silu": ("model.layers.0.mlp.act_fn/silu", "forward", "activation"),
    "attention": ("model.layers.1.self_attn/scaled_dot_product_attention", "forward", "attention"),
    "loss_gradient": ("/cross_entropy", "dgrad", "cross_entropy"),
}
FUSED_ATTENTION_FAULT = {
    "kind": "ScaleCallElement",
    "layer": "model.layers.0.self_attn",
    "function": "scaled_dot_product_attention",
    "factor": 1.1,
    "index": 5,
    "rank": R,
    "step": 8,
    "persistent": False,
}

JOBS: dict[str, tuple[str, dict[str, Any]]] = {
    **{
        name: (
            RUN,
            {
                "steps": 12,
                "config": WARM,
                "faults": [x1_1_once(layer, op, rank=R, kind="ScaleOpElement")],
            },
        )
        for name, (layer, op, _) in FAULTS.items()
    },
    "recompute": (
        RUN,
        {
            "steps": 12,
            "config": WARM,
            "attention": "fused",
            "checkpointing": True,
            "faults": [FUSED_ATTENTION_FAULT],
        },
    ),
    "clean_fp32": (RUN, {"steps": CLEAN_STEPS}),
    "clean_bf16": (RUN, {"steps": CLEAN_STEPS, "bf16": True}),
}


@pytest.fixture(scope="module")
def results() -> dict[str, list[dict[str, Any]]]:
    names = list(JOBS)
    per_job = launch(
        [JOBS[n] for n in names], world=6, ranks_per_node=2, timeout_s=LAUNCH_DEADLINE_S
    )
    return dict(zip(names, per_job, strict=True))


@pytest.mark.parametrize("name", list(FAULTS))
def test_a_one_step_fault_in_an_llm_op_is_named_at_its_step_by_its_sensor(results, name):
    # Given x1.1 on one element of an RMSNorm's output, the MLP's SiLU, the attention's output
    # or the loss gradient, on rank R at step 8 only (no audit until step 50)
    # Then that op's sensor, and only it, raises a candidate at step 8 naming R, which the
    # replays on the third GPU and on R confirm transient; the step is not applied
    assert_one_sensor_named_it(results, name, sensor=FAULTS[name], rank=R, third=5, step=8)


def test_a_fault_in_the_fused_attention_kernel_is_named_by_the_recompute_comparison(results):
    # Given activation checkpointing, the fused SDPA kernel (not checked by itself), and x1.1 on
    # one element of its output in rank R's forward at step 8 (the recompute is clean)
    alarm = the_alarm(results, "recompute")
    # Then the block's recompute comparison names R at step 8, confirmed transient
    assert (alarm["step"], alarm["check"], alarm["suspects"]) == (8, "compute", [R])
    kinds = {(c["rank"], c["layer"], c["kind"]) for c in alarm["sensor_candidates"]}
    assert (R, "model.layers.0/recompute", "recompute") in kinds
    # (the next norm's gradient check also disagrees: its backward reads the clean recompute)
    assert {rank for rank, _, _ in kinds} == {R}
    assert [v["kind"] for v in alarm["verdicts"]] == ["transient"]
    assert all(r["updates"] == list(range(8)) for r in results["recompute"])


@pytest.mark.parametrize("name", ["clean_fp32", "clean_bf16"])
def test_a_fault_free_llama_with_every_sensor_every_step_raises_no_alarm(results, name):
    # Given CLEAN_STEPS fault-free steps of the Llama, every sensor on every step (fp32, or the
    # CPU's bf16 autocast), audits every 50 steps
    per_rank = ok(results, name)
    coverage = per_rank[0]["coverage"]
    kinds = set(coverage["kinds"].values())
    assert {"linear", "rms_norm", "activation", "mul", "add", "attention", "cross_entropy"} <= kinds
    rates = {r for layer in coverage["layers"].values() for r in layer.values()}
    assert rates == {1.0}
    # Then no alarm and every step applied on every rank (unconfirmed candidates would be
    # counted, not alarms)
    assert all(r["alarm"] is None for r in per_rank)
    assert all(r["updates"] == list(range(CLEAN_STEPS)) for r in per_rank)
    assert per_rank[0]["alarms_published"] == 0
    # And every audit, replaying a micro-batch bit for bit with the sensors on, passed
    assert per_rank[0]["audit_passes"] == CLEAN_STEPS // 50

"""The screen's result document (sdc_agent.screen.report): valid, and within the Kubernetes
termination message's 4096 bytes, cut honestly."""

from __future__ import annotations

import json

import torch

from sdc_agent.screen import DeviceResult, ScreenDevice, ScreenResult, document
from sdc_agent.screen.report import dumps, full_document, size
from sdc_contract.screen import SCREEN_KEYS, TERMINATION_MESSAGE_BYTES, check_screen_result


def big_result(devices: int = 64, ops: int = 64, named: int = 41) -> ScreenResult:
    """A made-up result (by default far over the bound): ``devices`` devices, the one indexed
    ``named`` reproduced on ``ops`` ops."""
    labels = tuple(f"gemm:bf16:{i}x4096x4096" for i in range(ops))
    results = tuple(
        DeviceResult(
            device=ScreenDevice(
                i, f"GPU-{i:08d}-0000-0000-0000-000000000000", torch.device("cpu"), "m"
            ),
            status="reproduced" if i == named else "agrees",
            mismatches=ops if i == named else 0,
            ops=labels if i == named else (),
            digest=f"{i:016x}",
        )
        for i in range(devices)
    )
    return ScreenResult(
        verdict="reproduced",
        summary="reproduced: device 41 (GPU-00000041-...) reproduced: 64 of 64 observations",
        devices=results,
        exercised={"ops": list(labels), "observations": ops},
        not_exercised=tuple(f"note {i} " + "y" * 60 for i in range(40)),
        inconclusive_ops=labels,
        golden={"store": False},
        durations_s={"total": 1.0},
    )


def test_a_small_result_is_whole_and_valid():
    result = big_result(devices=3, ops=2, named=1)
    doc = document(result)
    assert doc == full_document(result)
    assert list(doc) == list(SCREEN_KEYS)
    check_screen_result(dumps(doc))


def test_a_result_over_the_bound_is_cut_to_fit_keeping_the_named_device():
    result = big_result()
    assert size(full_document(result)) > 3 * TERMINATION_MESSAGE_BYTES
    doc = document(result)
    text = dumps(doc)
    assert len(text.encode()) <= TERMINATION_MESSAGE_BYTES
    check_screen_result(text)
    assert json.loads(text) == doc
    # The cut lists say how much they lost.
    assert doc["exercised"]["ops_omitted"] == 64 - len(doc["exercised"]["ops"])
    assert doc["inconclusive_ops_omitted"] == 64 - len(doc["inconclusive_ops"])
    kept = [d["index"] for d in doc["devices"]]
    assert 41 in kept and kept == sorted(kept)
    assert doc["devices_omitted"] == 64 - len(kept)
    named = next(d for d in doc["devices"] if d["index"] == 41)
    assert named["mismatches"] == 64
    assert named.get("ops_omitted", 0) == 64 - len(named["ops"])
    assert doc["verdict"] == "reproduced" and doc["summary"] == result.summary


def test_long_text_is_cut_and_marked():
    result = ScreenResult(verdict="failed", summary="failed: " + "z" * 5000, error="z" * 5000)
    doc = document(result)
    assert doc["error"].endswith("...(cut)") and len(doc["error"]) == 1024
    assert size(doc) <= TERMINATION_MESSAGE_BYTES
    check_screen_result(dumps(doc))

"""The screen's contract (sdc_contract.screen): workloads are refused with the field named,
results are checked as the pipeline reads them."""

from __future__ import annotations

import json

import pytest

from sdc_contract.screen import (
    DEVICE_KEYS,
    MAX_WORKLOAD_OPS,
    SCREEN_EXIT_CODES,
    SCREEN_KEYS,
    SCREEN_SCHEMA,
    SCREEN_VERDICTS,
    TERMINATION_MESSAGE_BYTES,
    WORKLOAD_SCHEMA,
    OpSpec,
    check_screen_result,
    parse_workload,
    shape_list_digest,
    workload_document,
)

GEMM = {"kind": "gemm", "shape": [8, 8, 8], "dtype": "bf16"}


def workload(*ops: object) -> dict[str, object]:
    return {"schema": WORKLOAD_SCHEMA, "ops": list(ops)}


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("", "empty"),
        ("{not json", "invalid JSON"),
        ("[1, 2]", "expected an object"),
        ({"schema": "sdc.workload/v2", "ops": []}, "schema must be"),
        ({"schema": WORKLOAD_SCHEMA, "ops": {}}, "ops must be a list"),
        ({"schema": WORKLOAD_SCHEMA, "ops": [], "extra": 1}, "unknown field(s) ['extra']"),
        (workload("gemm"), "ops[0] must be an object"),
        (workload(GEMM, {**GEMM, "kind": "conv"}), "ops[1].kind must be one of"),
        (workload({**GEMM, "kind": "collective"}), "ops[0].kind must be one of"),
        (workload({**GEMM, "dtype": "fp8"}), "ops[0].dtype must be one of"),
        (workload({"kind": "norm", "shape": [4, 4], "dtype": "tf32"}), "ops[0].dtype tf32"),
        (workload({**GEMM, "shape": [8, 8]}), "ops[0].shape must be a list of 3"),
        (workload({**GEMM, "shape": [8, 0, 8]}), "ops[0].shape"),
        (workload({**GEMM, "shape": [8, True, 8]}), "ops[0].shape"),
        (workload({**GEMM, "shape": "8x8x8"}), "ops[0].shape"),
        (workload({**GEMM, "shape": [2**15, 2**15, 2**15]}), "MAX_OP_ELEMENTS"),
        (workload({"kind": "softmax", "shape": [1, 2, 3, 4, 5], "dtype": "fp32"}), "ops[0].shape"),
        (workload({**GEMM, "name": "x" * 65}), "ops[0].name"),
        (workload({**GEMM, "causal": True}), "ops[0].causal applies to sdpa only"),
        (
            workload({"kind": "sdpa", "shape": [1, 2, 8, 4], "dtype": "bf16", "causal": "yes"}),
            "ops[0].causal must be true or false",
        ),
        (
            workload({"kind": "reduction", "shape": [8], "dtype": "fp32", "reduce": "max"}),
            "ops[0].reduce must be one of",
        ),
        (workload({**GEMM, "stride": 2}), "ops[0]: unknown field(s) ['stride']"),
        (workload(*[GEMM] * (MAX_WORKLOAD_OPS + 1)), f"ops lists {MAX_WORKLOAD_OPS + 1} ops"),
    ],
)
def test_parse_workload_refuses_malformed_workloads_naming_the_field(value, named):
    with pytest.raises(ValueError) as caught:
        parse_workload(value)
    assert named in str(caught.value)


def test_parse_workload_reads_every_kind_and_round_trips():
    doc = workload(
        {**GEMM, "name": "mlp.up"},
        {"kind": "sdpa", "shape": [1, 2, 8, 4], "dtype": "bf16", "causal": True},
        {"kind": "gemm", "shape": [4, 4, 4], "dtype": "tf32"},
        {"kind": "rmsnorm", "shape": [4, 8], "dtype": "bf16"},
        {"kind": "norm", "shape": [8], "dtype": "fp16"},
        {"kind": "softmax", "shape": [2, 2, 2, 8], "dtype": "fp32"},
        {"kind": "reduction", "shape": [4, 8], "dtype": "fp32", "reduce": "norm"},
    )
    ops = parse_workload(json.dumps(doc))
    assert [op.kind for op in ops] == [
        "gemm",
        "sdpa",
        "gemm",
        "rmsnorm",
        "norm",
        "softmax",
        "reduction",
    ]
    assert ops[0] == OpSpec("gemm", (8, 8, 8), "bf16", name="mlp.up")
    assert ops[1].causal and ops[6].reduce == "norm"
    assert parse_workload(workload_document(ops)) == ops


def test_the_shape_list_digest_ignores_names_but_not_shapes():
    a = OpSpec("gemm", (8, 8, 8), "bf16", name="a")
    assert shape_list_digest([a]) == shape_list_digest([OpSpec("gemm", (8, 8, 8), "bf16")])
    assert shape_list_digest([a]) != shape_list_digest([OpSpec("gemm", (8, 8, 4), "bf16")])


def result(**changes: object) -> dict[str, object]:
    doc: dict[str, object] = {k: None for k in SCREEN_KEYS}
    doc.update({"schema": SCREEN_SCHEMA, "verdict": "clean", "devices": []})
    doc.update(changes)
    return doc


DEVICE = {
    "index": 0,
    "uuid": "cpu-0",
    "status": "reproduced",
    "mismatches": 2,
    "ops": [],
    "digest": "0" * 16,
}


def test_check_screen_result_accepts_a_valid_document_and_its_text():
    doc = result(verdict="reproduced", devices=[DEVICE])
    assert check_screen_result(doc) == doc
    assert check_screen_result(json.dumps(doc)) == doc


@pytest.mark.parametrize(
    ("doc", "named"),
    [
        (result(schema="sdc.screen/v0"), "schema must be"),
        (
            {k: v for k, v in result().items() if k != "not_exercised"},
            "missing key(s) ['not_exercised']",
        ),
        (result(verdict="ok"), "verdict must be one of"),
        (result(verdict="reproduced"), "must name a reproduced device"),
        (
            result(devices=[{k: v for k, v in DEVICE.items() if k != "digest"}]),
            "devices[0] lacks ['digest']",
        ),
        (result(devices=[{**DEVICE, "status": "bad"}]), "devices[0].status"),
        (result(devices=[{**DEVICE, "index": -1}]), "devices[0].index"),
        (result(environment={"torch": "2.13"}), "environment must have exactly the keys"),
    ],
)
def test_check_screen_result_refuses_a_malformed_document(doc, named):
    with pytest.raises(ValueError) as caught:
        check_screen_result(doc)
    assert named in str(caught.value)


def test_check_screen_result_refuses_text_over_the_termination_message_bound():
    doc = result(summary="x" * TERMINATION_MESSAGE_BYTES)
    with pytest.raises(ValueError, match="over 4096 bytes"):
        check_screen_result(json.dumps(doc))


def test_every_verdict_has_its_own_exit_code_and_none_is_argparse_or_a_crash():
    assert set(SCREEN_EXIT_CODES) == set(SCREEN_VERDICTS)
    codes = list(SCREEN_EXIT_CODES.values())
    assert len(set(codes)) == len(codes) and SCREEN_EXIT_CODES["clean"] == 0
    assert not {1, 2} & set(codes)
    assert DEVICE_KEYS[-1] == "digest"

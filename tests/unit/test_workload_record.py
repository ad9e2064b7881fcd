"""The guard's workload recorder (sdc_agent.workload): the op shapes and dtypes of a model's
first forward pass, bounded for the alarm report's ``workload`` and the node screen."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from sdc_agent.alarm import Alarm
from sdc_agent.reporting import Reporter
from sdc_agent.workload import WorkloadRecorder, fit, summarize
from sdc_contract.screen import (
    MAX_NAME_CHARS,
    MAX_OP_ELEMENTS,
    MAX_WORKLOAD_OPS,
    OpSpec,
    parse_workload,
)

HAS_RMS_NORM = hasattr(nn, "RMSNorm")


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(16, 32)
        self.down = nn.Linear(32, 16, bias=False)
        self.norm = nn.LayerNorm(16)
        self.rms = nn.RMSNorm(16) if HAS_RMS_NORM else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rms(self.norm(self.down(torch.relu(self.up(x)))))


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def recorders_hooks(module: nn.Module) -> list[str]:
    """The workload recorder's forward hooks and pre-hooks on ``module``."""
    hooks = [*module._forward_hooks.values(), *module._forward_pre_hooks.values()]
    names = [getattr(h, "__qualname__", "") for h in hooks]
    return [n for n in names if n.startswith("WorkloadRecorder.")]


def record(model: nn.Module, x: torch.Tensor) -> WorkloadRecorder:
    recorder = WorkloadRecorder(model)
    model(x)
    return recorder


@pytest.mark.parametrize(("dtype", "name"), [(torch.float32, "fp32"), (torch.bfloat16, "bf16")])
def test_a_small_models_ops_shapes_and_dtypes(dtype, name):
    model = Model().to(dtype)
    recorder = record(model, torch.randn(2, 3, 16, dtype=dtype))
    assert recorder.done and recorder.document is not None
    ops = [(op["kind"], op["shape"], op["dtype"], op["name"]) for op in recorder.document["ops"]]
    # Rows are the input's leading dimensions (2 * 3); each block's ops are counted twice
    expected = [
        ("gemm", [6, 32, 16], name, "layers.0.up x2"),
        ("gemm", [6, 16, 32], name, "layers.0.down x2"),
        ("norm", [6, 16], name, "layers.0.norm x2"),
    ]
    if HAS_RMS_NORM:
        expected.append(("rmsnorm", [6, 16], name, "layers.0.rms x2"))
    expected.append(("gemm", [6, 8, 16], name, "head"))
    assert ops == expected
    assert recorder.document["schema"] == "sdc.workload/v1"
    assert [op.as_dict() for op in parse_workload(recorder.document)] == recorder.document["ops"]


def test_the_hooks_are_removed_after_the_first_forward():
    model = Model()
    recorder = WorkloadRecorder(model)
    assert recorder.hooks > 0
    model(torch.randn(4, 16))
    assert recorder.hooks == 0
    first = recorder.document
    for module in model.modules():
        assert not module._forward_hooks
    model(torch.randn(5, 16))  # another shape: nothing more is recorded
    assert recorder.document is first
    assert first is not None and first["ops"][0]["shape"] == [4, 32, 16]


def test_finish_without_a_forward_and_a_model_with_nothing_to_record():
    recorder = WorkloadRecorder(Model())
    recorder.finish()
    assert recorder.done and recorder.hooks == 0 and recorder.document is None
    # A model with no layer the recorder knows may still call attention: it waits for the
    # forward, and then records nothing
    relu = nn.ReLU()
    nothing = WorkloadRecorder(relu)
    relu(torch.randn(2, 3))
    assert nothing.done and nothing.hooks == 0 and nothing.document is None


def test_more_distinct_ops_than_the_bound_keep_the_most_frequent_first():
    layers = [nn.Linear(8, 8 + i) for i in range(MAX_WORKLOAD_OPS + 6)]
    layers.extend([nn.Linear(8, 8), nn.Linear(8, 8)])  # 3 calls of one shape in all

    class Fan(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fan = nn.ModuleList(layers)

        def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
            return [layer(x) for layer in self.fan]

    recorder = record(Fan(), torch.randn(2, 8))
    assert recorder.document is not None
    ops = parse_workload(recorder.document)
    assert len(ops) == MAX_WORKLOAD_OPS
    assert ops[0].shape == (2, 8, 8) and ops[0].name == "fan.0 x3"
    # Then the largest: the widest layers are kept, the narrowest left out
    assert ops[1].shape == (2, 8 + MAX_WORKLOAD_OPS + 5, 8)
    assert (2, 9, 8) not in {op.shape for op in ops}


def test_an_oversized_op_is_scaled_to_fit_and_says_so():
    k, n = 4096, 8192
    big = OpSpec(kind="gemm", shape=(1 << 20, n, k), dtype="bf16")
    fitted = fit(big)
    assert fitted.elements() <= MAX_OP_ELEMENTS and fitted.shape[1:] == (n, k)
    assert fit(OpSpec(kind="gemm", shape=(8, n, k), dtype="bf16")).shape == (8, n, k)
    vocab = fit(OpSpec(kind="gemm", shape=(4096, 128256, 4096), dtype="bf16"))
    assert vocab.elements() <= MAX_OP_ELEMENTS and vocab.shape[0] == 1 and vocab.shape[2] == 4096
    norm = fit(OpSpec(kind="norm", shape=(1 << 20, 4096), dtype="bf16"))
    assert norm.shape == (MAX_OP_ELEMENTS // (2 * 4096), 4096)
    huge_row = fit(OpSpec(kind="rmsnorm", shape=(2, MAX_OP_ELEMENTS), dtype="fp32"))
    assert huge_row.elements() <= MAX_OP_ELEMENTS

    from sdc_agent.workload import _Seen

    (op,) = summarize({("gemm", (1 << 20, n, k), "bf16", False): _Seen("model.layers.0.mlp.up", 3)})
    assert op.shape == fitted.shape
    assert op.name == f"model.layers.0.mlp.up x3 scaled from {1 << 20}x{n}x{k}"
    assert len(op.name) <= MAX_NAME_CHARS
    long_path = "model." + "very_long_module_name." * 8 + "proj"
    (named,) = summarize({("gemm", (4, 4, 4), "fp32", False): _Seen(long_path, 1)})
    assert len(named.name) == MAX_NAME_CHARS and named.name.endswith(".proj")
    parse_workload({"schema": "sdc.workload/v1", "ops": [op.as_dict(), named.as_dict()]})


def test_a_recorder_failure_does_not_raise_and_records_nothing(caplog):
    model = Model()
    recorder = WorkloadRecorder(model)

    def broken(*args: object) -> None:
        raise RuntimeError("boom")

    import sdc_agent.workload as workload

    original = workload.op_of
    workload.op_of = broken
    try:
        with caplog.at_level(logging.WARNING, logger="sdc_agent"):
            out = model(torch.randn(2, 16))
            model(torch.randn(2, 16))
    finally:
        workload.op_of = original
    assert out.shape == (2, 8)
    assert recorder.done and recorder.hooks == 0 and recorder.document is None
    warnings = [r for r in caplog.records if "recording the job's workload failed" in r.message]
    assert len(warnings) == 1  # logged once


def test_a_failing_callback_does_not_raise():
    def refuse(document: object) -> None:
        raise RuntimeError("no")

    model = Model()
    recorder = WorkloadRecorder(model, on_recorded=refuse)
    model(torch.randn(2, 16))
    assert recorder.done and recorder.hooks == 0


def test_the_alarm_report_carries_the_recorded_workload_and_omits_it_otherwise():
    reporter = Reporter({}, publisher=None, publishes=False)
    model = Model()
    WorkloadRecorder(model, on_recorded=reporter.set_workload)
    assert "workload" not in reporter.alarm(3, "compute", last_pass=None, suspects=None).to_dict()
    model(torch.randn(2, 16))
    report = reporter.alarm(4, "compute", last_pass=None, suspects=None).to_dict()
    assert parse_workload(report["workload"])[0].shape == (2, 32, 16)
    assert list(report)[-1] == "workload"  # after every existing key
    assert "workload" not in Alarm(step=1, check="compute").to_dict()


def test_a_guard_on_ddp_records_the_inner_modules_on_its_first_step(calls, monkeypatch):
    import torch.nn.functional as F

    import sdc_agent as sdc

    monkeypatch.setenv("NODE_NAME", "hyperpod-i-0000000000000000a")

    def batch(step: int, rank: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(step)
        return torch.randn(4, 8, generator=g), torch.randint(0, 3, (4,), generator=g)

    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(8, 3)))
    guard = sdc.Guard(
        ddp,
        torch.optim.SGD(ddp.parameters(), lr=0.1),
        compute_loss=lambda model, b: F.cross_entropy(model(b[0]), b[1]),
        rebuild_batch=batch,
        schedule=sdc.Schedule(audit_every=0, check_on_start=False, sensors=False, check_every=0),
    )
    recorder = guard._run.workload
    # On the bare module and its Linear, not on DDP's wrapper
    assert recorder is not None and recorder.hooks > 0
    assert recorders_hooks(ddp.module) and recorders_hooks(ddp.module[0])
    assert not recorders_hooks(ddp)
    assert guard.train([batch(0), batch(1)]) is None
    assert recorder.done and recorder.hooks == 0
    assert not recorders_hooks(ddp.module) and not recorders_hooks(ddp.module[0])
    assert recorder.document == {
        "schema": "sdc.workload/v1",
        "ops": [{"kind": "gemm", "shape": [4, 3, 8], "dtype": "fp32", "name": "0"}],
    }
    alarm = guard._run.reporter.alarm(2, "compute", last_pass=None, suspects=None)
    assert alarm.to_dict()["workload"] == recorder.document


class Attention(nn.Module):
    """Self-attention through F.scaled_dot_product_attention, with grouped-query heads."""

    def __init__(self, heads: int = 4, kv_heads: int = 4, head_dim: int = 8) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q = nn.Linear(heads * head_dim, heads * head_dim)
        self.kv = nn.Linear(heads * head_dim, 2 * kv_heads * head_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).view(b, t, 2, self.kv_heads, self.head_dim).unbind(2)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads
        )
        return out.transpose(1, 2).reshape(b, t, -1)


class Decoder(nn.Module):
    def __init__(self, kv_heads: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Attention(kv_heads=kv_heads) for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return x


def sdpa_ops(document: dict | None) -> list[dict]:
    assert document is not None
    return [op for op in document["ops"] if op["kind"] == "sdpa"]


@pytest.mark.parametrize("kv_heads", [4, 2], ids=["multi-head", "grouped-query"])
def test_attention_calls_are_recorded_with_the_query_heads_and_the_mask(kv_heads):
    # Given a decoder whose blocks call F.scaled_dot_product_attention (causal)
    recorder = record(Decoder(kv_heads=kv_heads), torch.randn(2, 6, 32))
    # Then each call is one sdpa op of [batch, query heads, sequence, head_dim], causal, named
    # after the module that called it, counted over both blocks
    assert sdpa_ops(recorder.document) == [
        {
            "kind": "sdpa",
            "shape": [2, 4, 6, 8],
            "dtype": "fp32",
            "causal": True,
            "name": "blocks.0 x2",
        }
    ]
    # And the recording left no torch function mode behind
    assert torch._C._len_torch_function_stack() == 0


def test_cross_attention_is_not_recorded():
    class Cross(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            memory = torch.randn(x.shape[0], 2, 10, 8)  # another sequence length
            return torch.nn.functional.scaled_dot_product_attention(x, memory, memory)

    recorder = record(Cross(), torch.randn(1, 2, 6, 8))
    assert recorder.done and recorder.document is None


def test_an_oversized_attention_is_scaled_batch_first():
    big = OpSpec("sdpa", (64, 32, 8192, 128), "bf16", causal=True)
    scaled = fit(big)
    assert scaled.elements() <= MAX_OP_ELEMENTS and scaled.causal
    assert scaled.shape[1:] == (32, 8192, 128) and 1 <= scaled.shape[0] < 64
    huge = fit(OpSpec("sdpa", (1, 64, 2**20, 128), "bf16"))
    assert huge.elements() <= MAX_OP_ELEMENTS and huge.shape[3] == 128 and huge.shape[1] == 1


def test_attention_under_the_sensors_checked_attention_is_recorded_too():
    # Given a decoder whose attention the online sensors check by their own unfused path
    from sdc_agent.sensors import protect

    model = Decoder()
    protect(model, attention="checked")
    recorder = WorkloadRecorder(model)
    model(torch.randn(2, 6, 32)).sum().backward()
    # Then the recorder saw the calls before the sensors' mode took them, and both modes left
    assert [op["shape"] for op in sdpa_ops(recorder.document)] == [[2, 4, 6, 8]]
    assert torch._C._len_torch_function_stack() == 0

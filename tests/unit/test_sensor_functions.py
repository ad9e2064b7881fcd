"""Sensors of what real LLM blocks run, one by one: RMSNorm modules (forward and input gradient),
the functions a forward calls (SiLU and GELU, the gating product, adds written as ``+``, the
checked scaled-dot-product attention, cross-entropy) in fp32 and under the CPU's bf16 autocast.

Each must change no value (bit for bit the plain model's, checked or not), read healthy ratios
below the board's floor threshold, and catch one wrong element of what it checks.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sdc_agent.faults import _flip_bit_
from sdc_agent.sensors import SensorConfig, protect
from sdc_agent.sensors.ops.rmsnorm import rms_norm_epsilon
from sdc_agent.sensors.ops.sites import find_sites

THRESHOLD = SensorConfig().min_threshold
TRIALS = 20
HEALTHY = 12
D = 48


class TitanRMSNorm(nn.Module):
    """torchtitan's RMSNorm as it was written before ``nn.RMSNorm``."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norm = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return norm.type_as(x) * self.weight


class GemmaRMSNorm(TitanRMSNorm):
    """Gemma's variant scales by ``1 + w``: not the formula, so not an RMSNorm to the probe."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norm = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return norm * (1.0 + self.weight)


def hf_rms_norm(dim: int) -> nn.Module:
    from tests.support.llama import llama

    return type(llama().model.norm)(dim, eps=1e-6)


class Norm(nn.Module):
    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.inp, self.norm, self.out = nn.Linear(D, D), norm, nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(self.inp(x)))


class Activation(nn.Module):
    def __init__(self, act: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.inp, self.out, self.act = nn.Linear(D, 2 * D), nn.Linear(2 * D, D), act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.act(self.inp(x)))


class SwiGLU(nn.Module):
    """torchtitan's feed-forward: ``w2(silu(w1(x)) * w3(x))``, all functional."""

    def __init__(self) -> None:
        super().__init__()
        self.w1, self.w3, self.w2 = nn.Linear(D, 2 * D), nn.Linear(D, 2 * D), nn.Linear(2 * D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp, self.mix = nn.Linear(D, D), nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        return h + self.mix(h)


class Attention(nn.Module):
    """SDPA as torchtitan calls it: causal, grouped-query (4 query heads over 2 key/value)."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.kv, self.o = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q(x).view(b, t, 4, D // 4).transpose(1, 2)
        k, v = self.kv(x).view(b, t, 2, 2, D // 4).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o(out.transpose(1, 2).reshape(b, t, D))


class Loss(nn.Module):
    """A classifier whose forward returns its cross-entropy loss (as HF's ``labels=`` does)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp, self.head = nn.Linear(D, D), nn.Linear(D, 11)
        self.targets = torch.arange(64) % 11

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.inp(x)).reshape(-1, 11).float()
        return F.cross_entropy(logits, self.targets[: logits.shape[0]])


class Embedding(nn.Module):
    """A token embedding (ids derived from the input) beside a linear path."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.inp = nn.Embedding(50, D), nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids = (x[..., 0].detach().abs() * 1000).long() % 50
        return self.embed(ids) + self.inp(x)


CASES: dict[str, tuple[Callable[[], nn.Module], str, str]] = {
    # name: (model, sensor name, kind)
    "rms_norm_torch": (lambda: Norm(nn.RMSNorm(D, eps=1e-6)), "norm", "rms_norm"),
    "rms_norm_hf": (lambda: Norm(hf_rms_norm(D)), "norm", "rms_norm"),
    "rms_norm_titan": (lambda: Norm(TitanRMSNorm(D)), "norm", "rms_norm"),
    "silu_module": (lambda: Activation(nn.SiLU()), "act/silu", "activation"),
    "gelu": (lambda: Activation(nn.GELU()), "act/gelu", "activation"),
    "gelu_tanh": (lambda: Activation(nn.GELU(approximate="tanh")), "act/gelu", "activation"),
    "silu_functional": (SwiGLU, "/silu", "activation"),
    "gating_product": (SwiGLU, "/mul", "mul"),
    "residual_add": (Residual, "/add", "add"),
    "attention": (Attention, "/scaled_dot_product_attention", "attention"),
    "cross_entropy": (Loss, "/cross_entropy", "cross_entropy"),
    "embedding": (Embedding, "embed/embedding", "embedding"),
}


def protected(case: str) -> tuple[nn.Module, nn.Module]:
    """(plain, protected copy) of a case's model, every sensor found (one discovery pass)."""
    torch.manual_seed(0)
    plain = CASES[case][0]()
    model = copy.deepcopy(plain)
    protect(model, attention="checked")
    run(model, torch.randn(4, 16, D))
    return plain, model


def run(model: nn.Module, x: torch.Tensor, bf16: bool = False) -> list[torch.Tensor]:
    """Forward and backward (a random-weighted sum of the output); output and gradients."""
    model.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = model(x)
    weights = torch.linspace(-1.0, 1.0, out.numel()).reshape(out.shape)
    (out.float() * weights).sum().backward()
    return [out.detach(), x.grad, *(p.grad for p in model.parameters())]


def target(model: nn.Module, name: str) -> tuple[object, int]:
    """The sensor ``name`` (a module or a function site) and its board index."""
    board = model.norm.sensor_board if hasattr(model, "norm") else None
    sites = find_sites(model)
    found = sites.sites.get(name) if name.find("/") >= 0 else model.get_submodule(name)
    board = found.sensor_board
    return found, board.sensors.index(next(s for s in board.sensors if s.layer == name))


def sensed(model: nn.Module, x: torch.Tensor, bf16: bool) -> torch.Tensor:
    """One pass with every sensor checking; the largest ratio of each sensor."""
    board = find_sites(model).board
    board.arm(frozenset(range(len(board))))
    run(model, x, bf16)
    return board.take_flags()[1]


@pytest.mark.parametrize("case", list(CASES))
def test_found_on_the_board_with_the_plain_models_values_bit_for_bit(case):
    # Given a model with one op family, plain and protected (its sensor found by protect())
    plain, model = protected(case)
    _, name, kind = CASES[case]
    board = find_sites(model).board
    assert board.layers[name] == kind
    x = torch.randn(3, 16, D)
    # When both run forward and backward in fp32, the sensors checking or not
    expected = run(plain, x)
    quiet = run(model, x)
    loud_ratios = sensed(model, x, False)
    loud = run(model, x)  # (a second pass: the flags of sensed() are taken)
    # Then every output and gradient is the plain model's bit for bit, checked or not
    if case != "attention":  # the checked attention replaces the fused kernel (close, below)
        assert all(torch.equal(a, b) for a, b in zip(expected, quiet, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(quiet, loud, strict=True))
    assert bool(torch.isfinite(loud_ratios).all())
    # And the state_dict keys are the plain model's
    assert list(model.state_dict()) == list(plain.state_dict())


def test_the_checked_attention_is_as_accurate_as_the_fused_kernel_and_reproduces_itself():
    # Given a grouped-query causal attention, plain (the fused kernel) and protected with the
    # checked path, and the fused kernel's fp32 result as the reference
    plain, model = protected("attention")
    x = torch.randn(3, 16, D)
    reference = run(plain, x)

    def error(results: list[torch.Tensor]) -> list[float]:
        return [
            float(torch.linalg.vector_norm(a.float() - r.float()) / torch.linalg.vector_norm(r))
            for a, r in zip(results, reference, strict=True)
        ]

    # Then in fp32 the checked path agrees with the kernel to rounding (another order of sums)
    assert max(error(run(model, x))) < 1e-5
    # And under bf16 autocast it is as close to the fp32 result as the fused kernel is (it keeps
    # the scores and probabilities in fp32), output and every gradient
    checked, fused = error(run(model, x, True)), error(run(plain, x, True))
    assert all(c <= 1.5 * f + 1e-3 for c, f in zip(checked, fused, strict=True)), (checked, fused)
    # And it reproduces itself bit for bit (what replays need)
    first, again = run(model, x, True), run(model, x, True)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))


def ops_of(case: str) -> tuple[str, ...]:
    """What a case's sensor checks (an add's backward computes nothing)."""
    kind = CASES[case][2]
    return {
        "add": ("forward",),
        "rms_norm": ("forward", "dgrad", "wgrad"),
        "embedding": ("forward", "wgrad"),
    }.get(kind, ("forward", "dgrad"))


OPS = [(case, op) for case in CASES for op in ops_of(case)]


def corrupting(
    sensor: object, op: str, gen: torch.Generator, fault: str
) -> Callable[[str, torch.Tensor], None]:
    """A tap that corrupts one random element of ``op``'s result once per pass: x1.1, or a flip
    of one random bit in 20-30 of an fp32 value (4-14 of a 16-bit one)."""
    done = [False]

    def tap(name: str, value: torch.Tensor) -> None:
        if name != op or done[0]:
            return
        flat = value.view(-1)
        # An element that matters: not one of the exact zeros a causal attention's first query
        # row has in its gradient, nor one a millionth of its tensor's largest (x1.1 of either
        # changes nothing the training would see; benchmarks/campaign.py counts what does).
        candidates = (flat.abs() > 1e-6 * flat.abs().max()).nonzero().flatten()
        index = int(candidates[torch.randint(len(candidates), (1,), generator=gen)])
        if fault == "x1.1":
            flat[index] *= 1.1
        else:
            bit = int(torch.randint(20, 31, (1,), generator=gen))
            _flip_bit_(flat, index, bit - 16 if flat.element_size() == 2 else bit)
        done[0] = True

    tap.reset = lambda: done.__setitem__(0, False)  # type: ignore[attr-defined]
    return tap


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case, op", OPS)
def test_healthy_ratios_stay_below_the_threshold_and_one_wrong_element_is_caught(case, op, bf16):
    # Given a protected op family, every sensor checking
    _, model = protected(case)
    _, name, _ = CASES[case]
    sensor, index = target(model, name)
    index += list(sensor.sensor_ops).index(op)
    gen = torch.Generator().manual_seed(7)

    def batch() -> torch.Tensor:
        return torch.randn(4, 16, D, generator=gen) * 2.0

    # Then HEALTHY healthy passes read ratios below the board's floor threshold
    healthy = max(float(sensed(model, batch(), bf16)[index]) for _ in range(HEALTHY))
    assert healthy < THRESHOLD
    # And x1.1 of one random element of what it checks, or one bit flip, reads above it
    for fault in ("x1.1", "flip"):
        tap = corrupting(sensor, op, gen, fault)
        sensor.gemm_taps.append(tap)
        caught = 0
        for _ in range(TRIALS):
            tap.reset()
            caught += float(sensed(model, batch(), bf16)[index]) > THRESHOLD
        sensor.gemm_taps.remove(tap)
        assert caught >= expected_share(case, op, bf16) * TRIALS, (fault, caught)


def expected_share(case: str, op: str, bf16: bool) -> float:
    """The share of one-element faults a sensor must catch: 95%; but an RMSNorm's gradients
    computed from a 16-bit input carry bf16 roundings (2-3 per input-gradient element, one per
    term of a weight-gradient sum) that a 10% change of an element whose terms cancel stays
    within: 85% for the input gradient, 70% for the weight gradient (measured 75-80%). In the
    Llama under autocast the norms' inputs are fp32 (the residual stream)."""
    if bf16 and case.startswith("rms_norm") and op in ("dgrad", "wgrad"):
        return {"dgrad": 0.85, "wgrad": 0.70}[op]
    return 0.95


def test_the_rms_norm_probe_finds_the_formula_and_nothing_else():
    # Given RMSNorm modules of several classes, and modules that only look like one
    found = {
        "nn.RMSNorm": nn.RMSNorm(D),
        "torchtitan": TitanRMSNorm(D),
        "hugging face": hf_rms_norm(D),
    }
    not_found = {
        "gemma (1 + w)": GemmaRMSNorm(D),
        "layer norm without bias": nn.LayerNorm(D, bias=False),
        "linear": nn.Linear(D, D),
        "multi-dim nn.RMSNorm": nn.RMSNorm([4, D]),
    }
    for module in [*found.values(), *not_found.values()]:
        with torch.no_grad():
            for p in module.parameters():
                p.copy_(torch.randn_like(p))
    before = {n: [p.clone() for p in m.parameters()] for n, m in {**found, **not_found}.items()}
    # Then the probe says which compute x * rsqrt(mean(x²) + eps) * w
    assert {n: rms_norm_epsilon(m)[0] for n, m in found.items()} == dict.fromkeys(found, True)
    assert {n: rms_norm_epsilon(m)[0] for n, m in not_found.items()} == dict.fromkeys(
        not_found, False
    )
    # And every probed weight is back bit for bit
    for name, module in {**found, **not_found}.items():
        assert all(
            torch.equal(a, b) for a, b in zip(before[name], module.parameters(), strict=True)
        )


def test_a_nan_in_a_checked_function_is_a_flag():
    _, model = protected("silu_module")
    sensor, index = target(model, "act/silu")
    sensor.gemm_taps.append(lambda op, v: v.view(-1).__setitem__(2, math.nan))
    assert float(sensed(model, torch.randn(4, 16, D), False)[index]) > THRESHOLD


def test_function_calls_of_excluded_modules_and_of_sensor_modules_are_not_sites():
    # Given a model protected with include() leaving its first block out
    torch.manual_seed(0)
    model = nn.Sequential(SwiGLU(), Residual())
    protect(model, include=lambda name, module: not name.startswith("0"))
    run(model, torch.randn(2, 16, D))
    # Then only the included block's calls are sites (none from inside the linear layers' own
    # checks, which run inside their modules)
    sites = {name for name, kind in find_sites(model).board.layers.items() if "/" in name}
    assert sites == {"1/add"}

"""The ops a screen runs: the fixed suite, seeded inputs, one op on one device, its digest.

Inputs are generated on the CPU with a ``torch.Generator`` seeded from the op's label and the
repetition's seed (never from its position, so adding an op changes no other op's inputs),
uniform in [-1, 1), then cast to the op's dtype and copied to each device: every device gets
the same bits. Kernels run under ``torch.use_deterministic_algorithms(True)`` (set by the
runner) with the fp32 matmul precision explicit per op: ``highest`` for ``fp32`` (no TF32),
``high`` for ``tf32`` (TF32 allowed). Each result is fingerprinted with the agent's
fingerprint (:func:`sdc_agent.fingerprint.fingerprints`, a digest of the raw bits) and the
fingerprint table is hashed (:func:`sdc_agent.fingerprint.table_digest`) to a 16-hex digest:
results are compared bit for bit, never within a tolerance.

What each kind computes (all outputs fingerprinted):

- ``gemm`` [m, n, k]: ``a @ b`` with ``a`` [m, k], ``b`` [k, n].
- ``sdpa`` [b, h, s, d]: ``scaled_dot_product_attention(q, k, v, is_causal=causal)``, then its
  backward for a seeded output gradient: out, dq, dk, dv.
- ``norm``: ``layer_norm`` over the last dimension with seeded weight and bias; ``rmsnorm``:
  ``rms_norm`` with a seeded weight; ``softmax``: over the last dimension.
- ``reduction``: ``sum`` / ``mean`` / ``amax`` / ``norm`` (L2) over the last dimension.
- ``collective`` [n]: see :mod:`sdc_agent.screen.runner` (it needs every device at once).

The fixed suite comes in two sizes: ``training`` (the default on GPUs: the GEMMs, attention and
norms of a Llama-70B-like layer at 4k tokens, each within the contract's bound) and ``small`` (the default on the CPU: the same
kinds and dtypes at shapes that run in milliseconds).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator, Sequence
from typing import Literal

import torch
import torch.nn.functional as F

from sdc_contract.screen import OpDtype, OpSpec

from ..fingerprint import fingerprints, table_digest

Size = Literal["small", "training"]
"""Which fixed suite: ``training`` shapes (GPUs) or ``small`` ones (the CPU)."""
SIZES: tuple[Size, ...] = ("small", "training")

OutputHook = Callable[[OpSpec, list[torch.Tensor]], list[torch.Tensor]]
"""What may see (and change) an op's outputs on one device before they are fingerprinted: the
fault injectors of tests and demos (:mod:`sdc_agent.screen.faults`); never set in production."""

TORCH_DTYPES: dict[OpDtype, torch.dtype] = {
    "fp32": torch.float32,
    "tf32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}


def _suite(t: int, h: int, ffn: int, heads: int, seq: int, hd: int) -> tuple[OpSpec, ...]:
    """The fixed suite at ``t`` tokens, hidden size ``h``, MLP width ``ffn``, attention of
    ``heads`` heads of ``hd`` over ``seq`` tokens."""
    return (
        OpSpec("gemm", (t, h, h), "bf16", name="suite.qkv-like"),
        OpSpec("gemm", (t, ffn, h), "bf16", name="suite.mlp-up"),
        OpSpec("gemm", (t, h, ffn), "bf16", name="suite.mlp-down"),
        OpSpec("gemm", (t, h, h), "fp16", name="suite.fp16"),
        OpSpec("gemm", (t, h, h), "tf32", name="suite.tf32"),
        OpSpec("gemm", (t // 2, h // 2, h // 2), "fp32", name="suite.fp32"),
        OpSpec("sdpa", (1, heads, seq, hd), "bf16", name="suite.attention", causal=True),
        OpSpec("norm", (t, h), "bf16", name="suite.layernorm"),
        OpSpec("rmsnorm", (t, h), "bf16", name="suite.rmsnorm"),
        OpSpec("softmax", (t, seq), "fp32", name="suite.softmax"),
        OpSpec("reduction", (t, h), "fp32", name="suite.sum", reduce="sum"),
        OpSpec("reduction", (t, h), "bf16", name="suite.amax", reduce="amax"),
        OpSpec("reduction", (t * h,), "fp32", name="suite.grad-norm", reduce="norm"),
    )


def fixed_suite(size: Size) -> tuple[OpSpec, ...]:
    """The suite every screen runs besides the job's workload (the collective comes apart)."""
    if size == "training":
        return _suite(t=4096, h=8192, ffn=14336, heads=32, seq=4096, hd=128)
    return _suite(t=64, h=96, ffn=160, heads=4, seq=64, hd=16)


def collective_spec(size: Size) -> OpSpec:
    """The all-sum across the node's devices (:mod:`sdc_agent.screen.runner`)."""
    return OpSpec("collective", (2**24 if size == "training" else 4096,), "fp32", "suite.allsum")


def input_seed(label: str, seed: int, part: int = 0) -> int:
    """The generator seed of ``part`` (a device's contribution to the collective) of the inputs
    of the op labelled ``label`` in the repetition seeded ``seed``."""
    digest = hashlib.sha256(f"{label}|{seed}|{part}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _uniform(shape: Sequence[int], dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    return (torch.rand(tuple(shape), generator=g, dtype=torch.float32) * 2 - 1).to(dtype)


def make_inputs(spec: OpSpec, seed: int, part: int = 0) -> list[torch.Tensor]:
    """The op's inputs on the CPU, from a generator seeded by its label and ``seed``."""
    g = torch.Generator().manual_seed(input_seed(spec.label(), seed, part))
    dtype = TORCH_DTYPES[spec.dtype]
    s = spec.shape
    if spec.kind == "gemm":
        m, n, k = s
        return [_uniform((m, k), dtype, g), _uniform((k, n), dtype, g)]
    if spec.kind == "sdpa":
        return [_uniform(s, dtype, g) for _ in range(4)]  # q, k, v, the output gradient
    if spec.kind == "norm":
        return [_uniform(s, dtype, g), _uniform(s[-1:], dtype, g), _uniform(s[-1:], dtype, g)]
    if spec.kind == "rmsnorm":
        return [_uniform(s, dtype, g), _uniform(s[-1:], dtype, g)]
    return [_uniform(s, dtype, g)]


@contextlib.contextmanager
def matmul_precision(dtype: OpDtype) -> Iterator[None]:
    """fp32 matmul math for the op: TF32 allowed for ``tf32`` only; restored afterwards."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if dtype == "tf32" else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def compute(spec: OpSpec, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The op's outputs from its inputs (on the inputs' device). ``collective`` is the runner's."""
    with matmul_precision(spec.dtype):
        if spec.kind == "sdpa":
            with torch.enable_grad():
                q, k, v = (t.detach().requires_grad_() for t in inputs[:3])
                out = F.scaled_dot_product_attention(q, k, v, is_causal=spec.causal)
                dq, dk, dv = torch.autograd.grad(out, (q, k, v), inputs[3])
            return [out.detach(), dq, dk, dv]
        with torch.no_grad():
            x = inputs[0]
            if spec.kind == "gemm":
                return [x @ inputs[1]]
            if spec.kind == "norm":
                return [F.layer_norm(x, x.shape[-1:], inputs[1], inputs[2], eps=1e-5)]
            if spec.kind == "rmsnorm":
                return [F.rms_norm(x, x.shape[-1:], inputs[1], eps=1e-6)]
            if spec.kind == "softmax":
                return [torch.softmax(x, dim=-1)]
            if spec.kind == "reduction":
                if spec.reduce == "sum":
                    return [x.sum(dim=-1)]
                if spec.reduce == "mean":
                    return [x.mean(dim=-1)]
                if spec.reduce == "amax":
                    return [x.amax(dim=-1)]
                return [torch.linalg.vector_norm(x, dim=-1)]
    raise ValueError(f"no kernel for {spec.kind!r} here")


def digest(outputs: Sequence[torch.Tensor]) -> str:
    """A 16-hex digest of the outputs' bits (their fingerprints, hashed). Synchronises."""
    return table_digest(fingerprints([o.contiguous() for o in outputs]))[:16]


def run_on(
    spec: OpSpec, inputs: Sequence[torch.Tensor], device: torch.device, hook: OutputHook | None
) -> str:
    """Copy the (CPU) inputs to ``device``, compute the op there, let ``hook`` see the outputs,
    and return their digest; an exception becomes the digest ``error:<its class name>``."""
    try:
        on_device = [t.to(device) for t in inputs]
        outputs = compute(spec, on_device)
        if hook is not None:
            outputs = hook(spec, outputs)
        return digest(outputs)
    except Exception as exc:  # a failing kernel is a result to compare, not a crash
        return error_digest(exc)


def error_digest(exc: BaseException) -> str:
    """The digest an op that raised gets: ``error:<class name>`` (compared like any digest)."""
    return f"error:{type(exc).__name__}"


def is_error(value: str) -> bool:
    """Whether a digest is an error's (:func:`error_digest`)."""
    return value.startswith("error:")


__all__ = [
    "SIZES",
    "TORCH_DTYPES",
    "OutputHook",
    "Size",
    "collective_spec",
    "compute",
    "digest",
    "error_digest",
    "fixed_suite",
    "input_seed",
    "is_error",
    "make_inputs",
    "matmul_precision",
    "run_on",
]

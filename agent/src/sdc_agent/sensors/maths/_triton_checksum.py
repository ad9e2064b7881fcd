"""The row-checksum check as one fused Triton kernel over a GEMM's fp32 result (GPUs).

What is fused, and why not the GEMM itself: the check of ``C = A @ B`` (:mod:`.abft`) needs, per
row ``r``, the row sum of the fp32 result ``C_r @ 1``, the reference ``A_r @ (B @ 1)`` and the
row norm ``||A_r||``, then one ratio and a maximum over the rows. The torch path runs that as
about ten kernels, and on the CUDA bf16 path it first copies ``A`` to fp32 (``.float()``) to
take the mat-vec: it reads ``C`` once, ``A`` three times and writes a full fp32 copy of ``A``.
The check is memory-bound (O(1/L + 1/C) of the GEMM's flops), so what it costs on a GPU is
those passes. This kernel reads each element of ``C`` and ``A`` once, widens 16-bit ``A`` to
fp32 in registers, and writes one partial maximum per block of rows; ``B @ 1`` and ``||B||_F``
(one pass over ``B``, a weight or an activation) stay torch reductions.

The GEMM stays cuBLAS's (``torch.mm(..., out_dtype=torch.float32)``): a Triton GEMM with the
check fused in its epilogue would save the one read of ``C``, but it would replace a tuned
library GEMM by an untuned one (slower, on a path every protected layer takes) and change the
training values with the backend (the check must never change a value the model sees: replays
compare bit for bit, and a layer runs the same GEMM whether or not a sensor checks).
Because the kernel only reads, its backend cannot change any training value.

The kernel's rounding differs from the torch path's (another order of summation), so the two
agree on the ratio to rounding, not bit for bit; :mod:`.abft` trusts the kernel on a device only
after :func:`self_check` found it reproduces the torch path on cases whose answer is known
(integer operands, exact in fp32, with faults of known size; NaN and Inf; healthy data).

Checked with Triton's CPU interpreter (``TRITON_INTERPRET=1``, CPU tensors:
tests/unit/test_sensor_triton.py); not run on a GPU by the author (none was available):
``benchmarks/sensor_gpu.py`` checks and times it on one.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os
from typing import Any

import torch

AVAILABLE = importlib.util.find_spec("triton") is not None
"""Whether Triton is importable (imported on the first kernel call only: it takes ~1 s)."""

BLOCK_ROWS = 32
"""Rows per program: its partial maximum covers them."""
BLOCK_COLS = 64
"""Columns of ``C`` (and of ``A``) each program loads per iteration, per row (three
BLOCK_ROWS x BLOCK_COLS fp32 accumulators live in registers)."""

_FLOOR = 1e-30  # abft.BOUND_FLOOR (imported there from here would be circular)

# The kernel's reduction combine functions, set by _kernel() (jitted in the mode it runs in).
_checksum_add: Any = None
_checksum_larger: Any = None


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.cache
def _kernel(interpret: bool) -> Any:  # a triton.JITFunction, launched as kernel[grid](...)
    """The jitted kernel; ``interpret`` keys the cache because ``triton.jit`` reads
    TRITON_INTERPRET when it decorates."""
    del interpret  # only the cache key
    import triton
    import triton.language as tl

    # Reductions through tl.reduce with combine functions decorated here, not tl.sum / tl.max:
    # those are @jit functions of triton.language, decorated when Triton was first imported,
    # and if that import happened outside the interpreter (torch imports Triton for its own
    # kernels) the interpreter cannot call them.
    @triton.jit
    def _add(a, b):
        return a + b

    @triton.jit
    def _larger(a, b):
        return tl.maximum(a, b)

    # The interpreter resolves names through the kernel's module globals, not its closure; a
    # process builds one flavour (interpreted on CPU tensors, compiled on a GPU), not both.
    globals().update(_checksum_add=_add, _checksum_larger=_larger)

    @triton.jit
    def row_checksum_kernel(
        c_ptr,
        a_ptr,
        ref_ptr,
        frob_ptr,
        bias_sum_ptr,
        bias_norm_ptr,
        out_ptr,
        rows,
        width,
        inner,
        stride_cr,
        stride_cc,
        stride_ar,
        stride_al,
        scale,
        HAS_BIAS: tl.constexpr,
        BLOCK_ROWS: tl.constexpr,
        BLOCK_COLS: tl.constexpr,
    ):
        pid = tl.program_id(0)
        row = pid * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        row_ok = row < rows
        row64 = row.to(tl.int64)
        cols = tl.arange(0, BLOCK_COLS)
        # observed = C_r @ 1 (the GEMM's fp32 result, summed in fp32)
        # Element-wise partial sums across the column blocks, reduced once at the end: four
        # reductions per program instead of one per block (the interpreter runs each
        # tl.reduce in Python; on a GPU it saves the per-block shuffles).
        observed2 = tl.full([BLOCK_ROWS, BLOCK_COLS], 0.0, tl.float32)
        for start in range(0, width, BLOCK_COLS):
            col = start + cols
            mask = row_ok[:, None] & (col < width)[None, :]
            tile = tl.load(
                c_ptr + row64[:, None] * stride_cr + col.to(tl.int64)[None, :] * stride_cc,
                mask=mask,
                other=0.0,
            ).to(tl.float32)
            observed2 += tile
        # expected = A_r @ (B @ 1) and ||A_r||², one pass over A (16-bit A widened here)
        expected2 = tl.full([BLOCK_ROWS, BLOCK_COLS], 0.0, tl.float32)
        squares2 = tl.full([BLOCK_ROWS, BLOCK_COLS], 0.0, tl.float32)
        for start in range(0, inner, BLOCK_COLS):
            col = start + cols
            col_ok = col < inner
            mask = row_ok[:, None] & col_ok[None, :]
            tile = tl.load(
                a_ptr + row64[:, None] * stride_ar + col.to(tl.int64)[None, :] * stride_al,
                mask=mask,
                other=0.0,
            ).to(tl.float32)
            ref = tl.load(ref_ptr + col, mask=col_ok, other=0.0)
            expected2 += tile * ref[None, :]
            squares2 += tile * tile
        observed = tl.reduce(observed2, 1, _checksum_add)
        expected = tl.reduce(expected2, 1, _checksum_add)
        squares = tl.reduce(squares2, 1, _checksum_add)
        magnitude = tl.sqrt(squares) * tl.load(frob_ptr)
        if HAS_BIAS:
            expected += tl.load(bias_sum_ptr)
            magnitude += tl.load(bias_norm_ptr)
        ratio = tl.abs(observed - expected) / (scale * magnitude + 1e-30)
        # NaN fails both comparisons: a non-finite ratio reads as +Inf (a flag), as in torch.
        finite = (ratio == ratio) & (ratio < float("inf"))
        ratio = tl.where(finite, ratio, float("inf"))
        ratio = tl.where(row_ok, ratio, 0.0)
        tl.store(out_ptr + pid, tl.reduce(ratio, 0, _checksum_larger))

    return row_checksum_kernel


def right_magnitude(frobenius: torch.Tensor, reference: torch.Tensor, scale: float) -> torch.Tensor:
    """What the bound multiplies each row norm ``||A_r||`` by, over ``scale``: ``||B||_F`` plus
    the reference dot product's own rounding, ``u ||B @ 1||`` (``reference`` is ``B @ 1``),
    expressed in units of ``scale = u (1 + sqrt(C / L))`` (:mod:`.abft` derives both)."""
    unit = 2.0**-24
    return frobenius + torch.linalg.vector_norm(reference) * (unit / scale)


def row_checksum_ratio(
    result: torch.Tensor,
    left: torch.Tensor,
    right: torch.Tensor,
    bias: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """:func:`sdc_agent.sensors.maths.abft.row_checksum_ratio` by the fused kernel (0-dim fp32).

    ``result`` R x C (fp32), ``left`` R x L and ``right`` L x C in any float dtype and any
    strides; ``scale`` is the bound's ``u (1 + sqrt(C / L))``. No host synchronisation.
    """
    if not AVAILABLE:
        raise RuntimeError("Triton is not installed")
    rows, width = result.shape
    inner = left.shape[1]
    if rows == 0:
        return torch.zeros((), dtype=torch.float32, device=result.device)
    # One pass over B: its row sums (the reference vector) and its Frobenius norm, in fp32.
    reference = right.sum(dim=1, dtype=torch.float32).contiguous()
    frob = right_magnitude(torch.linalg.vector_norm(right, dtype=torch.float32), reference, scale)
    if bias is not None:
        bias_sum = bias.sum(dtype=torch.float32)
        bias_norm = torch.linalg.vector_norm(bias, dtype=torch.float32)
    else:
        bias_sum = bias_norm = frob  # not read (HAS_BIAS is False)
    programs = triton_cdiv(rows, BLOCK_ROWS)
    partials = torch.empty(programs, dtype=torch.float32, device=result.device)
    _kernel(interpreting())[(programs,)](
        result,
        left,
        reference,
        frob,
        bias_sum,
        bias_norm,
        partials,
        rows,
        width,
        inner,
        result.stride(0),
        result.stride(1),
        left.stride(0),
        left.stride(1),
        float(scale),
        HAS_BIAS=bias is not None,
        BLOCK_ROWS=BLOCK_ROWS,
        BLOCK_COLS=BLOCK_COLS,
    )
    return partials.max()


def triton_cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive integers."""
    return -(-a // b)


def self_check_cases(
    device: torch.device,
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    """Cases whose ratio is known to both paths: integer operands (every product and sum is
    exact in fp32, so a healthy row's difference is 0) with one element of known size added
    to some rows, a NaN row, an Inf operand, and healthy random data (ratio far below 1).
    Each case is (result, left, right, bias-or-empty)."""
    g = torch.Generator().manual_seed(2026)
    cases: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]] = []
    for rows, inner, width, with_bias in (
        (1, 1, 1, False),
        (37, 70, 130, True),
        (64, 300, 33, False),
    ):
        left = torch.randint(-4, 5, (rows, inner), generator=g).float()
        right = torch.randint(-4, 5, (inner, width), generator=g).float()
        bias = torch.randint(-4, 5, (width,), generator=g).float() if with_bias else None
        result = left @ right + (bias if bias is not None else 0.0)
        for r in range(0, rows, 3):
            result[r, (r * 7) % width] += float(1 + r % 5)  # a fault of known size
        cases.append((result, left, right, bias))
        nan = result.clone()
        nan[rows // 2, 0] = math.nan
        cases.append((nan, left, right, bias))
        inf_left = left.clone()
        inf_left[0, 0] = math.inf
        cases.append((result, inf_left, right, bias))
    left = torch.randn(48, 200, generator=g)
    right = torch.randn(200, 96, generator=g)
    cases.append((left @ right, left, right, None))
    cases.append(
        (
            left.bfloat16().float() @ right.bfloat16().float(),
            left.bfloat16(),
            right.bfloat16(),
            None,
        )
    )
    cases.append((right.t() @ left.t(), right.t(), left.t(), None))  # transposed strides
    return [
        (c.to(device), a.to(device), b.to(device), None if d is None else d.to(device))
        for c, a, b, d in cases
    ]

"""One-pass fingerprint kernel for GPUs, in Triton (used when Triton is importable).

The torch path (``_fingerprint_fast``) needs about six passes over the data; a GPU is bound by
memory bandwidth, so one kernel that reads every element once and keeps all arithmetic in
registers is the way to approach HBM speed. Each program reads BLOCK consecutive elements,
widens them to int64 in registers and writes two partial sums:

    s0 = sum_k b[base + k],   s1 = sum_k (k + 1) * b[base + k] + base * s0

(positions are 1-based; int64 arithmetic wraps modulo 2**64 like the definition). The partials
of all tensors land in one buffer and one ``index_add_`` folds them into the table: integer
addition is associative, so the result is exact whatever order the GPU adds in.

Not run on a GPU by the author (none was available); its arithmetic was checked against the
definition with Triton's CPU interpreter (TRITON_INTERPRET=1, see benchmarks/fingerprint_check.py),
and ``fingerprint.py`` compares it with the torch path once per device before trusting it.
"""

from __future__ import annotations

import functools
import importlib.util
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch

# Triton ships with CUDA builds of torch; the CPU-only agent must not need it, and importing it
# costs about a second, so it is imported on the first GPU fingerprint only.
AVAILABLE = importlib.util.find_spec("triton") is not None

# 8192 elements per program: 32 KiB of fp32 per program, partials add 0.05% to the traffic.
BLOCK = 8192


@functools.cache
def _kernel() -> Any:  # a triton.JITFunction, launched as kernel[grid](...)
    """The jitted kernel (decorated on first use, so TRITON_INTERPRET is honoured then too)."""
    import triton
    import triton.language as tl

    @triton.jit
    def partials_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        base = pid.to(tl.int64) * BLOCK
        local = tl.arange(0, BLOCK)
        offsets = base + local
        values = tl.load(x_ptr + offsets, mask=offsets < n, other=0).to(tl.int64)
        s0 = tl.sum(values, axis=0)
        s1 = tl.sum(values * (local + 1).to(tl.int64), axis=0) + base * s0
        tl.store(out_ptr + pid * 2, s0)
        tl.store(out_ptr + pid * 2 + 1, s1)

    return partials_kernel


class _Layout:
    """Blocks per tensor, their offsets in the partials buffer, and the fold-in index."""

    def __init__(self, numels: Sequence[int], device: torch.device) -> None:
        self.blocks = [(n + BLOCK - 1) // BLOCK for n in numels]
        self.offsets = []
        total = 0
        for blocks in self.blocks:
            self.offsets.append(total)
            total += blocks
        rows = [i for i, blocks in enumerate(self.blocks) for _ in range(blocks)]
        self.rows = torch.tensor(rows, dtype=torch.int64).to(device)
        self.partials = torch.empty((total, 2), dtype=torch.int64, device=device)


_LAYOUTS: OrderedDict[tuple[torch.device, tuple[int, ...]], _Layout] = OrderedDict()
_MAX_LAYOUTS = 64


def run_triton(bits: Sequence[torch.Tensor], out: torch.Tensor) -> None:
    """Adds every tensor's (S0, S1) into ``out`` [len(bits), 2]; ``bits`` are flat int views.

    Callers hold fingerprint.py's lock (the partials buffer is reused between calls).
    """
    if not AVAILABLE:
        raise RuntimeError("Triton is not installed")
    key = (out.device, tuple(b.numel() for b in bits))
    layout = _LAYOUTS.get(key)
    if layout is None:
        layout = _Layout(key[1], out.device)
        _LAYOUTS[key] = layout
        while len(_LAYOUTS) > _MAX_LAYOUTS:
            _LAYOUTS.popitem(last=False)
    _LAYOUTS.move_to_end(key)
    if layout.partials.numel() == 0:
        return
    kernel = _kernel()
    for flat, blocks, offset in zip(bits, layout.blocks, layout.offsets, strict=True):
        if blocks:
            kernel[(blocks,)](flat, layout.partials[offset:], flat.numel(), BLOCK=BLOCK)
    out.index_add_(0, layout.rows, layout.partials)

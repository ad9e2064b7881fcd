"""Host-side layout of a fingerprint pass: which elements go through which kernel, in what order.

A plan depends only on the tensors' dtypes, sizes and device, which do not change between the
steps of a training job, so it is built once and cached together with its index tensors and
scratch buffers (see ``_fingerprint_fast``). Building it makes no device call except allocations.

Two kernels (see ``_fingerprint_fast`` for the arithmetic):

- Row/column ("fast"): 32-bit elements, and 16-bit elements read as 32-bit pairs, viewed as a
  matrix [rows, K] of 32-bit lanes and processed in chunks of up to ``rows_per_chunk`` rows. Every
  row yields two exact row sums and every chunk two exact column-sum vectors; the position-weighted
  sum follows from those, so no element is ever widened to 64 bits or multiplied by its position.
- Generic: everything else (8- and 64-bit elements, tensors too small to be worth a chunk, the
  last partial row of a fast tensor), concatenated into batches, widened to int64 and summed with
  cached positions. Exact for every width; slower per element, used for a small share of bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

# A 16-bit tensor is read as 32-bit pairs only if its storage offset is even (torch refuses the
# view otherwise); that is part of the plan's key.
Signature = tuple[tuple[int, int, bool], ...]  # (element width in bytes, numel, pairable) each


def _wrap64(value: int) -> int:
    """A Python integer reduced to the signed 64-bit range (two's complement wrap)."""
    return (value + 2**63) % 2**64 - 2**63


@dataclass(frozen=True)
class Tuning:
    """Sizes that trade per-op overhead against cache residency; exactness bounds are fixed."""

    lanes_per_row: int
    """K: 32-bit lanes per row. At most 2**15 so that a row's low-half sum stays below 2**31."""
    rows_per_chunk: int
    """Rows per chunk. At most 2**15 so that a column's low-half sum stays below 2**31."""
    min_fast_lanes: int
    """Tensors with fewer 32-bit lanes than this go to the generic kernel (per-op overhead)."""
    generic_batch: int
    """Elements per generic batch: bounds the int64 temporaries."""

    def __post_init__(self) -> None:
        if not 1 <= self.lanes_per_row <= 2**15:
            raise ValueError(f"lanes_per_row must be in [1, 2**15], got {self.lanes_per_row}")
        if not 1 <= self.rows_per_chunk <= 2**15:
            raise ValueError(f"rows_per_chunk must be in [1, 2**15], got {self.rows_per_chunk}")
        if self.min_fast_lanes < self.lanes_per_row:
            raise ValueError("min_fast_lanes must be at least lanes_per_row (one full row)")
        if self.generic_batch < 1:
            raise ValueError(f"generic_batch must be positive, got {self.generic_batch}")


# Measured on a 2-core AMD EPYC (Zen 5, 1 MiB L2 per core, 32 MiB L3), one thread, CPU time
# over a 100M-element list, GB/s fp32/bf16: K=512 x 512 rows 8.4/8.6; 1024 x 256 7.9/8.1;
# 256 x 1024 7.7/8.3; 128 x 2048 5.8/7.7. A 256K-lane chunk (1 MiB) and its scratch stay in L2;
# shorter rows make column sums cheaper but the per-row finishing work (1/K of the elements)
# dearer.
CPU_TUNING = Tuning(
    lanes_per_row=512, rows_per_chunk=512, min_fast_lanes=1 << 15, generic_batch=1 << 20
)
# On a GPU each op costs a launch: bigger chunks (16M lanes, a 64 MiB scratch buffer) and only
# really small tensors in the generic kernel. Not measured: no GPU was available (see
# docs/performance.md).
CUDA_TUNING = Tuning(
    lanes_per_row=2048, rows_per_chunk=1 << 13, min_fast_lanes=1 << 16, generic_batch=1 << 24
)


@dataclass(frozen=True)
class FastTensor:
    """One tensor's main part in the row/column kernel."""

    index: int
    """Row of the output table."""
    pairs: bool
    """True: 16-bit elements read as 32-bit pairs; False: 32-bit elements."""
    rows: int
    """Full rows of K lanes; the elements after them go to the generic kernel."""
    first_row: int
    """Offset of this tensor's rows in the global row-sum arrays."""
    first_chunk: int
    """Offset of this tensor's chunks in the global column-sum tables."""


@dataclass(frozen=True)
class Piece:
    """A contiguous run of one tensor's elements handled by the generic kernel."""

    index: int
    """Row of the output table."""
    start: int
    """First element (0-based) within the tensor; also its position offset."""
    length: int


@dataclass
class Plan:
    """The layout for one signature on one device, with everything that can be reused."""

    tuning: Tuning
    n_tensors: int
    fast: list[FastTensor]
    chunks: list[tuple[int, int, int]]
    """(fast tensor number, first row within the tensor, rows) per chunk, in table order."""
    batches: list[list[Piece]]
    total_rows: int
    device: torch.device
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    """Cached index/constant tensors and scratch buffers on ``device`` (see _fingerprint_fast)."""


def build_plan(signature: Signature, device: torch.device, tuning: Tuning) -> Plan:
    """Lay out the tensors described by ``signature`` (pure host-side arithmetic)."""
    k = tuning.lanes_per_row
    fast: list[FastTensor] = []
    chunks: list[tuple[int, int, int]] = []
    pieces: list[Piece] = []
    total_rows = 0
    for index, (width, numel, pairable) in enumerate(signature):
        lanes_per_element = {4: 1, 2: 2}.get(width) if (width == 4 or pairable) else None
        lanes = numel // lanes_per_element if lanes_per_element else 0
        rows = lanes // k if lanes >= tuning.min_fast_lanes else 0
        done = 0
        if rows:
            fast.append(
                FastTensor(
                    index=index,
                    pairs=width == 2,
                    rows=rows,
                    first_row=total_rows,
                    first_chunk=len(chunks),
                )
            )
            for first in range(0, rows, tuning.rows_per_chunk):
                chunks.append((len(fast) - 1, first, min(tuning.rows_per_chunk, rows - first)))
            total_rows += rows
            done = rows * k * (lanes_per_element or 1)
        for start in range(done, numel, tuning.generic_batch):
            pieces.append(Piece(index, start, min(tuning.generic_batch, numel - start)))
    return Plan(
        tuning=tuning,
        n_tensors=len(signature),
        fast=fast,
        chunks=chunks,
        batches=_batch(pieces, tuning.generic_batch),
        total_rows=total_rows,
        device=device,
    )


def _batch(pieces: list[Piece], limit: int) -> list[list[Piece]]:
    """Greedy batches of consecutive pieces totalling at most ``limit`` elements."""
    batches: list[list[Piece]] = []
    current: list[Piece] = []
    size = 0
    for piece in pieces:
        if current and size + piece.length > limit:
            batches.append(current)
            current, size = [], 0
        current.append(piece)
        size += piece.length
    if current:
        batches.append(current)
    return batches


def combine_coefficients(plan: Plan) -> list[list[list[int]]]:
    """Per fast tensor, the int64 coefficients turning its five partial sums into (S0, S1).

    Partial sums: (sum h, sum l, sum j*h, sum j*l, 1) over lanes j (0-based) where each 32-bit lane
    is split into a signed high half h and a low half l (see ``_fingerprint_fast``).
    32-bit elements: b_j = 65536 h + l at position j + 1.
    16-bit pairs: the lane is XOR-ed with 0x8000, so l = b_2j + 32768 (position 2j + 1) and
    h = b_2j+1 (position 2j + 2); m lanes contribute -32768 m to S0 and -32768 m**2 to S1.
    """
    k = plan.tuning.lanes_per_row
    coefficients = []
    for tensor in plan.fast:
        if tensor.pairs:
            m = tensor.rows * k
            s0 = [1, 1, 0, 0, _wrap64(-32768 * m)]
            s1 = [2, 1, 2, 2, _wrap64(-32768 * m * m)]
        else:
            s0 = [65536, 1, 0, 0, 0]
            s1 = [65536, 1, 65536, 1, 0]
        coefficients.append([s0, s1])
    return coefficients

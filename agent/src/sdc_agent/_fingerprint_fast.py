"""Executes a fingerprint plan with a handful of same-dtype torch ops per chunk.

Why this is fast and exact. Widening int32 to int64 is the slow part of the obvious algorithm
(about 2 GB/s on a CPU against 45 GB/s for a float32 sum), while int32 sums that wrap modulo
2**32 run at cache speed. So each 32-bit lane b is split as b = 65536 * h + l, with h = b >> 16
(arithmetic shift, |h| <= 2**15) and l in [0, 65536). Over a row of K <= 2**15 lanes (or a column
of R <= 2**15 rows) the sum of h fits int32 exactly, and the sum of l lies in [0, 2**31), so it is
exactly the wrapped int32 ``sum(b) - (sum(h) << 16)``. That gives exact row and column sums from
four int32 reductions and one shift, all on data that stays in cache.

The position-weighted sum needs no per-element weights: on a [rows, K] view, lane j = r * K + c,
so sum j * x_j = K * sum_r r * rowsum_r + sum_c c * colsum_c, which only touches the (rows + K)
sums, in int64 (wrapping modulo 2**64 as the definition asks).

16-bit elements are read as 32-bit pairs: XOR with 0x8000 turns the low (first, little-endian)
element into an unsigned offset-binary value, so the same split yields both elements exactly.

Nothing here reads a value back to the host: no .item(), no device synchronisation.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import torch

from ._fingerprint_plan import Plan, combine_coefficients

# Scratch buffers by (device, worker slot), shared by all plans: on a GPU one is tens of MiB,
# and the cached plans of a job (weights, gradients) run one after another under
# fingerprint.py's lock.
_SCRATCH: dict[tuple[torch.device, int], torch.Tensor] = {}


def _scratch(device: torch.device, numel: int, slot: int = 0) -> torch.Tensor:
    """An int32 scratch buffer of at least ``numel`` elements on ``device``, grown on demand."""
    buffer = _SCRATCH.get((device, slot))
    if buffer is None or buffer.numel() < numel:
        buffer = torch.empty(numel, dtype=torch.int32, device=device)
        _SCRATCH[(device, slot)] = buffer
    return buffer[:numel]


class _Workers:
    """CPU worker threads that each run torch ops single-threaded.

    Two threads streaming their own chunks beat one op at a time on two OpenMP threads: the
    per-op fork/join is a large share of an op on a 1 MiB chunk, and on a busy machine one
    descheduled OpenMP thread stalls every op (measured 19.6 vs 14.0 GB/s on 2 cores). The
    pool is sized from ``torch.get_num_threads()``, so it never uses more cores than the job
    allows, and is rebuilt after a fork (a child inherits the pool object but not its threads).
    """

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._size = 0
        self._pid = 0

    def pool(self, size: int) -> ThreadPoolExecutor:
        if self._pool is None or self._size != size or self._pid != os.getpid():
            if self._pool is not None and self._pid == os.getpid():
                self._pool.shutdown(wait=False)
            # torch.set_num_threads in a thread sets that thread's OpenMP team size only.
            self._pool = ThreadPoolExecutor(
                size,
                thread_name_prefix="sdc-fingerprint",
                initializer=torch.set_num_threads,
                initargs=(1,),
            )
            self._size, self._pid = size, os.getpid()
        return self._pool


_WORKERS = _Workers()


def _buffer(plan: Plan, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A scratch or constant tensor cached on the plan (allocated once per plan)."""
    tensor = plan.tensors.get(name)
    if tensor is None:
        tensor = torch.empty(shape, dtype=dtype, device=plan.device)
        plan.tensors[name] = tensor
    return tensor


def _index(
    plan: Plan, name: str, values: list[int] | list[list[int]] | list[list[list[int]]]
) -> torch.Tensor:
    """A small int64 index/constant tensor built from host values once per plan."""
    tensor = plan.tensors.get(name)
    if tensor is None:
        tensor = torch.tensor(values, dtype=torch.int64).to(plan.device)
        plan.tensors[name] = tensor
    return tensor


# One int64 ramp 0, 1, 2, ... per device, shared by all plans and grown on demand: positions and
# row numbers are slices of it, so no call (and no chunk) builds an arange, and 64 cached plans do
# not hold 64 copies of a multi-MiB ramp.
_RAMPS: dict[torch.device, torch.Tensor] = {}


def _ramp(device: torch.device, start: int, n: int) -> torch.Tensor:
    """The int64 values start..start+n-1 as a slice of the device's shared ramp."""
    ramp = _RAMPS.get(device)
    if ramp is None or ramp.numel() < start + n:
        ramp = torch.arange(max(start + n, 1024), dtype=torch.int64, device=device)
        _RAMPS[device] = ramp
    return ramp[start : start + n]


def _segment_sums(values: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """Sums of values[starts[i]:ends[i]] along dim 0, modulo 2**64, via one wrapping cumsum."""
    padded = torch.cat([torch.zeros_like(values[:1]), values.cumsum(0)])
    return padded[ends] - padded[starts]


def run_fast(plan: Plan, lanes: list[torch.Tensor], out: torch.Tensor) -> None:
    """Adds the row/column kernel's (S0, S1) of every fast tensor into ``out`` [n_tensors, 2].

    ``lanes[i]`` is fast tensor i's first ``rows * K`` lanes as a contiguous int32 [rows, K] view.
    """
    if not plan.fast:
        return
    k = plan.tuning.lanes_per_row
    n_chunks = len(plan.chunks)
    row_b = _buffer(plan, "row_b", (plan.total_rows,), torch.int32)
    row_h = _buffer(plan, "row_h", (plan.total_rows,), torch.int32)
    col_b = _buffer(plan, "col_b", (n_chunks, k), torch.int32)
    col_h = _buffer(plan, "col_h", (n_chunks, k), torch.int32)
    max_rows = max(rows for _, _, rows in plan.chunks)

    def work(numbers: range, slot: int) -> None:
        scratch = _scratch(plan.device, max_rows * k, slot).view(max_rows, k)
        for number in numbers:
            fast_number, first, rows = plan.chunks[number]
            tensor = plan.fast[fast_number]
            chunk = lanes[fast_number][first : first + rows]
            h = scratch[:rows]
            g = tensor.first_row + first
            if tensor.pairs:
                # Offset-binary low element, sums of the XOR-ed lanes, then the high element.
                torch.bitwise_xor(chunk, 0x8000, out=h)
                torch.sum(h, 1, dtype=torch.int32, out=row_b[g : g + rows])
                torch.sum(h, 0, dtype=torch.int32, out=col_b[number])
                torch.bitwise_right_shift(h, 16, out=h)
            else:
                # The first op streams the chunk from memory; the rest find it in cache.
                torch.sum(chunk, 1, dtype=torch.int32, out=row_b[g : g + rows])
                torch.bitwise_right_shift(chunk, 16, out=h)
                torch.sum(chunk, 0, dtype=torch.int32, out=col_b[number])
            torch.sum(h, 1, dtype=torch.int32, out=row_h[g : g + rows])
            torch.sum(h, 0, dtype=torch.int32, out=col_h[number])

    threads = min(torch.get_num_threads(), n_chunks) if plan.device.type == "cpu" else 1
    if threads <= 1:
        work(range(n_chunks), 0)
    else:
        # Every chunk writes its own slices of the row/column buffers: no two workers overlap.
        pool = _WORKERS.pool(threads)
        jobs = [pool.submit(work, range(i, n_chunks, threads), i) for i in range(threads)]
        for job in jobs:
            job.result()

    # Exact sums of the high halves and (by the wrapped difference) of the low halves.
    rh = row_h.to(torch.int64)
    rl = (row_b - (row_h << 16)).to(torch.int64)
    ch = col_h.to(torch.int64)
    cl = (col_b - (col_h << 16)).to(torch.int64)

    # Per row: h, l, and their products with the global row number; per tensor by segments.
    rows_global = _ramp(plan.device, 0, plan.total_rows)
    per_row = torch.stack([rh, rl, rh * rows_global, rl * rows_global], dim=1)
    row_starts = _index(plan, "row_starts", [t.first_row for t in plan.fast])
    row_ends = _index(plan, "row_ends", [t.first_row + t.rows for t in plan.fast])
    sums = _segment_sums(per_row, row_starts, row_ends)
    sum_h, sum_l = sums[:, 0], sums[:, 1]
    # sum_r (local row) * x_r = sum_r (global row) * x_r - first_row * sum_r x_r
    row_h_weighted = sums[:, 2] - row_starts * sum_h
    row_l_weighted = sums[:, 3] - row_starts * sum_l

    # Per chunk: sum_c c * colsum_c; per tensor by segments of its chunks.
    columns = _ramp(plan.device, 0, k)
    per_chunk = torch.stack([(ch * columns).sum(1), (cl * columns).sum(1)], dim=1)
    chunk_starts = _index(plan, "chunk_starts", [t.first_chunk for t in plan.fast])
    chunk_ends = _index(
        plan, "chunk_ends", [*(t.first_chunk for t in plan.fast[1:]), len(plan.chunks)]
    )
    col_weighted = _segment_sums(per_chunk, chunk_starts, chunk_ends)

    partial = torch.stack(
        [
            sum_h,
            sum_l,
            k * row_h_weighted + col_weighted[:, 0],
            k * row_l_weighted + col_weighted[:, 1],
            torch.ones_like(sum_h),
        ],
        dim=1,
    )
    coefficients = _index(plan, "coefficients", combine_coefficients(plan))  # [F, 2, 5]
    result = (coefficients * partial.unsqueeze(1)).sum(2)
    out.index_add_(0, _index(plan, "fast_rows", [t.index for t in plan.fast]), result)


def run_generic(plan: Plan, bits: list[torch.Tensor | None], out: torch.Tensor) -> None:
    """Adds the generic kernel's (S0, S1) of every piece into ``out`` [n_tensors, 2].

    ``bits[i]`` is tensor i's flat signed-integer view (any width), None when it has no piece.
    """
    for number, batch in enumerate(plan.batches):
        parts = [bits[p.index][p.start : p.start + p.length] for p in batch]  # type: ignore[index]  # a plan has pieces of present tensors only
        values = torch.cat(parts).to(torch.int64) if len(parts) > 1 else parts[0].to(torch.int64)
        positions = _ramp(plan.device, 1, values.numel())
        if len(batch) == 1:
            # One piece (a small tensor on its own, or a tail): two plain sums, fewer ops.
            piece = batch[0]
            weighted = (values * positions).sum()
            plain = values.sum()
            row = torch.stack([plain, weighted + piece.start * plain])
            out[piece.index] += row
            continue
        offsets = [0]
        for piece in batch:
            offsets.append(offsets[-1] + piece.length)
        starts = _index(plan, f"batch{number}_starts", offsets[:-1])
        ends = _index(plan, f"batch{number}_ends", offsets[1:])
        # Prefix sums after a leading zero, written in place: segment sums are differences of
        # two entries, exact modulo 2**64 because the cumsum wraps the same way.
        prefix = values.new_empty((2, values.numel() + 1))
        prefix[:, 0] = 0
        torch.cumsum(values, 0, out=prefix[0, 1:])
        torch.cumsum(values * positions, 0, out=prefix[1, 1:])
        sums = prefix[:, ends] - prefix[:, starts]  # [2, pieces]
        # Batch position of element e of a piece is (start_in_batch + e); its position in the
        # tensor is (piece.start + e): subtract (start_in_batch - piece.start) * S0.
        shift = _index(
            plan,
            f"batch{number}_shift",
            [o - p.start for o, p in zip(offsets, batch, strict=False)],
        )
        result = torch.stack([sums[0], sums[1] - shift * sums[0]], dim=1)
        out.index_add_(0, _index(plan, f"batch{number}_rows", [p.index for p in batch]), result)

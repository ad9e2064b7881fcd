"""What the sensors of operations other than GEMMs share: a per-row invariant over a bound.

A norm layer, a residual add and a (log-)softmax each make rows that obey an identity as cheap
as reading them once (the maths of each is in its own module: :mod:`.norm`, :mod:`.residual`,
:mod:`.softmax`). Each check computes, per row, the identity's two sides and a bound on how far
apart rounding alone may put them, and hands the board the largest ``|observed - expected| /
bound`` (:func:`worst_row_ratio`); the board's thresholds and flags are the GEMMs'
(:mod:`~sdc_agent.sensors.runtime.board`). A bound is built from the op's inputs only, never from the values it checks:
a corrupted element (a flipped exponent bit makes it ~2^100) would otherwise widen its own
bound, or overflow it to Inf, and hide.

The kernels compute in fp32 (also for 16-bit inputs), so a bound is fp32's unit roundoff times
the row's terms, grown as a random walk over the row, plus the rounding of the checked values to
their own dtype when it is coarser (:func:`output_rounding`): an op whose output is bf16 (bf16
inputs under the CPU's autocast, which leaves norms, softmax and adds in their input's dtype)
carries bf16 rounding in every element, and its sensor then sees only faults larger than that
rounding summed over the row: a bit flip in the exponent, not a 10% change of one element
(measured in ``benchmarks/campaign.py``).

Memory: every check works on blocks of whole rows, at most :data:`CHUNK_ELEMENTS` elements each
(:func:`row_block_max`), widening only the block to fp32, so its temporaries stay a few blocks'
whatever the tensor (a 16K-token batch's log-softmax over a 128K vocabulary is 2G elements:
8 GB per full-size fp32 temporary). A row's sums are the same computation in a block as in the
whole tensor, and the worst row of all is the worst of the blocks' worst.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from ..runtime.board import Gemm, SensorBoard
from ..runtime.tap import GemmTap

FP32_UNIT_ROUNDOFF = 2.0**-24
"""``u`` of fp32: every check sums in fp32 and the kernels compute in it."""

BOUND_FLOOR = 1e-30
"""Added to each row's bound, so an all-zero row (ratio 0/0) reads as agreement, not NaN."""


def unit_roundoff(*dtypes: torch.dtype) -> float:
    """The unit roundoff of the coarsest of ``dtypes`` and fp32 (the checks' own precision)."""
    unit = FP32_UNIT_ROUNDOFF
    for dtype in dtypes:
        if dtype.is_floating_point:
            unit = max(unit, torch.finfo(dtype).eps / 2)
    return unit


def output_rounding(dtype: torch.dtype, row_norm: torch.Tensor) -> torch.Tensor:
    """The bound's term for the rounding of a row's values to ``dtype`` (0 for fp32/fp64): each
    value errs by at most ``u_dtype |v_i|`` and the row's sum by a random walk of those, about
    ``u_dtype |v_r|``; twice that, so a batch's tail rows stay inside it."""
    if dtype in (torch.float32, torch.float64) or not dtype.is_floating_point:
        return torch.zeros_like(row_norm)
    return 2.0 * unit_roundoff(dtype) * row_norm


def worst_row_ratio(
    observed: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor
) -> torch.Tensor:
    """The largest ``|observed - expected| / bound`` over rows (0-dim fp32); a NaN/Inf in any
    row gives +Inf, which the board flags. No host synchronisation."""
    ratio = (observed.float() - expected.float()).abs() / (bound.float() + BOUND_FLOOR)
    if ratio.numel() == 0:
        return ratio.new_zeros(())
    # max() drops NaN on some backends; keep a NaN row visible as +Inf.
    return torch.where(torch.isfinite(ratio), ratio, torch.full_like(ratio, math.inf)).max()


CHUNK_ELEMENTS = 1 << 20
"""The most elements a check widens to fp32 at once (4 MB per fp32 temporary): small beside the
op's own tensors, large enough that a GPU runs few launches per check."""


def row_view(t: torch.Tensor, dim: int) -> torch.Tensor:
    """``t`` as a 2-D matrix in its own dtype whose rows run along ``dim`` (a view where
    possible)."""
    moved = t.movedim(dim, -1) if dim not in (-1, t.dim() - 1) else t
    return moved.reshape(-1, moved.shape[-1])


def row_blocks(rows: int, features: int, chunk: int | None = None) -> Iterator[slice]:
    """Runs of whole rows of ``features`` elements, at most ``chunk`` elements each (default
    :data:`CHUNK_ELEMENTS`; one row at least), covering ``rows`` rows."""
    limit = chunk if chunk is not None else CHUNK_ELEMENTS
    if limit < 1:
        raise ValueError(f"chunk must be >= 1 element, got {limit}")
    step = max(1, limit // max(1, features))
    for start in range(0, max(rows, 1), step):
        yield slice(start, start + step)


def row_block_max(
    ratio_of: Callable[..., torch.Tensor],
    features: int,
    *per_row: torch.Tensor,
    chunk: int | None = None,
) -> torch.Tensor:
    """The largest of ``ratio_of(*blocks)`` over blocks of whole rows (:func:`row_blocks`):
    each of ``per_row`` has one entry per row along its first dimension (a row of features, or a
    per-row statistic) and is sliced to the block's rows. ``ratio_of`` judges each row on its
    own up to its final max, so the result is its ratio on the whole tensors."""
    rows = per_row[0].shape[0]
    limit = chunk if chunk is not None else CHUNK_ELEMENTS
    if rows * max(1, features) <= limit:
        return ratio_of(*per_row)
    parts = [ratio_of(*(t[block] for t in per_row)) for block in row_blocks(rows, features, chunk)]
    return torch.stack([p.float() for p in parts]).max()


def sqrt_length(features: int) -> float:
    """``1 + sqrt(D)``: the growth of a D-term sum's rounding error as a random walk (Higham &
    Mary, SIAM J. Sci. Comput. 2019), as in :mod:`~sdc_agent.sensors.maths.abft`."""
    return 1.0 + math.sqrt(max(features, 1))


class OpSensor:
    """The sensor side of a protected non-GEMM layer: its board, its first sensor's index, its
    name and the fault drills' taps (:class:`sdc_agent.faults.ScaleGemmElement` and
    :class:`~sdc_agent.faults.FlipGemmBit` corrupt the op's output or input gradient through
    them, before the check, as a faulty GPU would)."""

    sensor_board: SensorBoard
    sensor_base: int
    layer_name: str
    gemm_taps: list[GemmTap]
    sensor_ops: tuple[Gemm, ...]

    def _attach_sensor(
        self, board: SensorBoard, name: str, kind: str, costs: list[tuple[int, int]]
    ) -> None:
        """Register this layer's sensors (``sensor_ops``, with their per-row ``costs``)."""
        self.sensor_board = board
        self.layer_name = name
        self.sensor_base = board.register_op(name, kind, self.sensor_ops, costs)
        self.gemm_taps = []

    def sensor_index(self, op: Gemm) -> int:
        """The board index of this layer's sensor of ``op``."""
        return self.sensor_base + self.sensor_ops.index(op)

    def checks(self, op: Gemm) -> bool:
        """Whether the sensor of ``op`` checks now (host-side, no sync)."""
        return self.sensor_board.is_active(self.sensor_index(op))

    def sensing(self) -> bool:
        """Whether any of this layer's sensors checks now, or a drill taps it."""
        return bool(self.gemm_taps) or any(self.checks(op) for op in self.sensor_ops)

    def tap(self, op: str, value: torch.Tensor) -> None:
        """Let every tap see (and change in place) the op's result before its check (``op``: a
        :data:`Gemm`, or an intermediate result's name: :data:`~sdc_agent.sensors.runtime.tap.GemmTap`)."""
        for tap in self.gemm_taps:
            tap(op, value)

    def record(self, op: Gemm, ratio: torch.Tensor) -> None:
        """Hand the board the check's ratio for ``op``."""
        self.sensor_board.record(self.sensor_index(op), ratio)


def autocast_fp32(device: str) -> bool:
    """Whether autocast on ``device`` runs layer_norm, softmax and log_softmax in fp32: CUDA's
    autocast lists them as fp32 ops; the CPU's lists none of them (they run in their input's
    dtype; checked by the tests)."""
    return device == "cuda" and torch.is_autocast_enabled(device)


def autocast_mirrored(device: str) -> bool:
    """Whether the protected ops mirror autocast's policy on ``device`` (CUDA and the CPU);
    under another device's autocast they run the plain op, unchecked."""
    return not torch.is_autocast_enabled(device) or device in ("cuda", "cpu")


@contextmanager
def outside_function_modes() -> Iterator[None]:
    """Run a sensor's own arithmetic outside every ``TorchFunctionMode`` on this thread (the
    sensors' own, which routes a model's function calls to their sites, and any of the user's or
    a fault drill's): a check computed in a module hook is not the model's computation and must
    not be routed, counted or corrupted as if it were. The modes are put back as they were."""
    modes = []
    while torch._C._len_torch_function_stack() > 0:
        modes.append(torch._C._pop_torch_function_stack())
    try:
        yield
    finally:
        for mode in reversed(modes):
            torch._C._push_on_torch_function_stack(mode)

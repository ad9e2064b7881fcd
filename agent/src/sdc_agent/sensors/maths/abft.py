"""The checksum maths: one row-checksum identity that checks every GEMM of a linear layer.

Algorithm-based fault tolerance (Huang & Abraham, IEEE Trans. Computers 1984; on GEMM
accumulators in training, AEGIS, OSDI 2026): for a product ``C = A @ B`` (``A`` is R x L,
``B`` is L x C) summing each row of ``C`` gives

    C @ 1 = A @ (B @ 1)

The right side is a matrix-vector product: O(R * L) work against the GEMM's O(R * L * C), so a
check costs O(1/C) of its GEMM plus one read of ``C``. A linear layer ``y = x Wᵀ + b`` runs three
GEMMs and each is an instance (``1`` a vector of ones):

* forward  ``y = x Wᵀ + b``:  ``y @ 1  = x @ (Wᵀ @ 1) + Σb``  (A = x,  B = Wᵀ)
* dgrad    ``dX = dY W``:      ``dX @ 1 = dY @ (W @ 1)``        (A = dY, B = W)
* wgrad    ``dW = dYᵀ X``:     ``dW @ 1 = dYᵀ @ (X @ 1)``       (A = dYᵀ, B = X)

The check compares both sides per row, in fp32, on the GEMM's fp32 result before it is rounded
to a 16-bit dtype: rounding to bf16 discards more than a 10% change of one element in a long
row, so a bf16 output cannot be checked, but its fp32 accumulator can.

How far apart may healthy rows be? Both sides are rounded sums. With unit roundoff ``u`` (2^-24
in fp32) the rounding error of a dot product of length L behaves like a random walk, about
``u * sqrt(L)`` times the norm of its terms (Higham & Mary, "A new approach to probabilistic
rounding error analysis", SIAM J. Sci. Comput. 2019), far below the worst case ``u * L``. Row
``r`` sums C dot products of length L, each erring by about ``u * |a_r| |b_c|`` (L terms of
size ``|a_r| |b_c| / sqrt(L)``, a random walk of L roundings), C of which add up to
``u |a_r| ||B||_F``; summing the row (C terms of size ``|y_r| / sqrt(C)``, with
``|y_r| ~ |a_r| ||B||_F / sqrt(L)``) adds ``u sqrt(C / L) |a_r| ||B||_F``. The reference
(``a_r`` dotted with ``v = B @ 1``, the row sums of ``B``) errs by about ``u |a_r| |v|``: as
much as the above when ``B``'s rows cancel (zero-mean weights: ``|v| ~ ||B||_F``), but up to
``sqrt(C)`` times more when they do not, ``|v| <= sqrt(C) ||B||_F`` (a weight gradient's ``X``
after an activation, every term positive: measured healthy ratios of 15-32 at 512-1024 wide
layers without this term). So both sides differ by about

    bound_r = u * ((1 + sqrt(C / L)) * (||a_r|| * ||B||_F + ||bias||) + ||a_r|| * ||B @ 1||)

which is what :func:`row_checksum_ratio` divides the difference by (``bound_floor`` keeps an
all-zero row from dividing by zero). The ratio is a property of the data's rounding, not of
the layer's size: healthy ratios stay below about 2 over every shape, dtype and kind of data
measured (``benchmarks/sensor_ratios.py``), and the thresholds (:mod:`~sdc_agent.sensors.runtime.board`) are in units of
this bound. A wrong element ``c`` adds ``|delta c|`` to one row's difference; at a 10% change
that is thousands of ``bound_r`` for small layers and still ~15-80 for 512-4096-wide ones.
A NaN/Inf in either side makes the ratio NaN/Inf, which the board treats as a flag.

Two implementations compute the same ratio: torch ops (every device) and a fused Triton kernel
(:mod:`._triton_checksum`: one pass over the result and the left operand) used on GPUs when
Triton is importable and the kernel passed a self-check there; ``SDC_SENSOR_BACKEND`` chooses.
"""

from __future__ import annotations

import logging
import math
import os

import torch

from . import _triton_checksum

logger = logging.getLogger("sdc_agent")

FP32_UNIT_ROUNDOFF = 2.0**-24
"""``u`` of fp32: every check runs on fp32 values."""

BOUND_FLOOR = 1e-30
"""Added to each row's bound, so an all-zero row (ratio 0/0) reads as agreement, not NaN."""


BACKEND_ENV = "SDC_SENSOR_BACKEND"
"""How checks compute their ratio: ``auto`` (default): the Triton kernel on GPUs when Triton is
importable and the kernel passed its self-check on that device, else torch ops; ``torch``: always
torch ops; ``triton``: always the kernel (on CPU tensors only in Triton's interpreter,
``TRITON_INTERPRET=1``)."""
_BACKENDS = ("auto", "torch", "triton")

# Per device: whether the kernel passed its self-check there (auto mode; checked once).
_TRITON_TRUSTED: dict[torch.device, bool] = {}


def sensor_backend(device: torch.device) -> str:
    """``"torch"`` or ``"triton"``: how checks of tensors on ``device`` run (see
    :data:`BACKEND_ENV`). Raises ValueError for an unknown choice or a kernel that cannot run."""
    choice = os.environ.get(BACKEND_ENV, "auto").strip().lower() or "auto"
    if choice == "auto":
        if device.type != "cuda" or not _triton_checksum.AVAILABLE:
            return "torch"
        if device not in _TRITON_TRUSTED:
            _TRITON_TRUSTED[device] = _self_check(device)
        return "triton" if _TRITON_TRUSTED[device] else "torch"
    if choice == "torch":
        return "torch"
    if choice != "triton":
        raise ValueError(f"{BACKEND_ENV} must be one of {', '.join(_BACKENDS)}, got {choice!r}")
    if not _triton_checksum.AVAILABLE:
        raise ValueError(f"{BACKEND_ENV}=triton but Triton is not installed")
    if device.type == "cpu" and not _triton_checksum.interpreting():
        raise ValueError(
            f"{BACKEND_ENV}=triton on CPU tensors needs Triton's interpreter (TRITON_INTERPRET=1)"
        )
    return "triton"


def kernel_agrees(device: torch.device) -> bool:
    """Whether the Triton kernel reproduces the torch path on :func:`._triton_checksum.
    self_check_cases` on ``device``: both read +Inf, or both below 3 (healthy data: rounding
    noise, which no threshold flags, differs with the order of summation), or within 0.1% of
    each other (a fault of known size). Syncs the host; raises what the kernel raises."""
    for result, left, right, bias in _triton_checksum.self_check_cases(device):
        scale = _bound_scale(left.shape[1], result.shape[1])
        by_torch = float(_ratio_torch(result, left, right, bias, scale))
        by_kernel = float(_triton_checksum.row_checksum_ratio(result, left, right, bias, scale))
        if math.isinf(by_torch) or math.isinf(by_kernel):
            same = by_torch == by_kernel
        elif by_torch < 3.0:
            same = by_kernel < 3.0
        else:
            same = abs(by_kernel - by_torch) <= 1e-3 * by_torch
        if not same:
            logger.warning(
                "sdc_agent: the Triton checksum kernel reads %s where torch reads %s (%s x %s)",
                by_kernel,
                by_torch,
                tuple(left.shape),
                tuple(right.shape),
            )
            return False
    return True


def _self_check(device: torch.device) -> bool:
    """Trust the kernel on ``device`` only if it agrees with torch (once per device): a wrong
    kernel would flag healthy GEMMs in every job, or miss faults."""
    try:
        return kernel_agrees(device)
    except Exception:  # a kernel that cannot even run is not trusted either
        logger.warning(
            "sdc_agent: the Triton checksum kernel failed on %s; using torch ops",
            device,
            exc_info=True,
        )
        return False


def _bound_scale(inner: int, width: int) -> float:
    """The bound's ``u (1 + sqrt(C / L))`` (module docstring)."""
    return FP32_UNIT_ROUNDOFF * (1.0 + math.sqrt(width / max(inner, 1)))


def row_checksum_ratio(
    result: torch.Tensor,
    left: torch.Tensor,
    right: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """The largest per-row ``|result @ 1 - (left @ (right @ 1) + Σbias)| / bound_r`` (0-dim fp32).

    ``result`` is the fp32 GEMM result ``left @ right (+ bias)``, R x C; ``left`` R x L; ``right``
    L x C; every operand is read as fp32. The bound is the module docstring's. NaN/Inf anywhere
    in the checksums gives a NaN/Inf result. No host synchronisation (except the kernel's
    one-time self-check on a GPU).
    """
    scale = _bound_scale(left.shape[1], result.shape[1])
    # The CPU's default is torch ops: skip the choice unless a backend is forced.
    chosen = result.device.type != "cpu" or BACKEND_ENV in os.environ
    if chosen and sensor_backend(result.device) == "triton":
        return _triton_checksum.row_checksum_ratio(result, left, right, bias, scale)
    return _ratio_torch(result, left, right, bias, scale)


def _ratio_torch(
    result: torch.Tensor,
    left: torch.Tensor,
    right: torch.Tensor,
    bias: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """:func:`row_checksum_ratio` by torch ops."""
    left32 = left.float()
    right32 = right.float()
    reference = right32.sum(dim=1)
    expected = left32 @ reference
    observed = result.sum(dim=1, dtype=torch.float32)
    if left32.stride(-1) == 1:
        row_norms = torch.linalg.vector_norm(left32, dim=1)
    else:
        # The weight-gradient check's dYᵀ is a transposed view: vector_norm reduces across its
        # strided rows ~20x slower on the CPU than squaring and summing them.
        row_norms = left32.square().sum(dim=1).sqrt()
    magnitude = row_norms * _triton_checksum.right_magnitude(
        torch.linalg.vector_norm(right32), reference, scale
    )
    if bias is not None:
        bias32 = bias.float()
        expected = expected + bias32.sum()
        magnitude = magnitude + torch.linalg.vector_norm(bias32)
    ratio = (observed - expected).abs() / (scale * magnitude + BOUND_FLOOR)
    if ratio.numel() == 0:
        return ratio.new_zeros(())
    # max() drops NaN on some backends; keep a NaN row visible as +Inf.
    return torch.where(torch.isfinite(ratio), ratio, torch.full_like(ratio, math.inf)).max()


def forward_ratio(
    y32: torch.Tensor, x32: torch.Tensor, weight32: torch.Tensor, bias32: torch.Tensor | None
) -> torch.Tensor:
    """Forward GEMM check: ``y @ 1 = x @ (Wᵀ @ 1) + Σb`` (2-D fp32 ``y`` M x N, ``x`` M x K)."""
    return row_checksum_ratio(y32, x32, weight32.t(), bias32)


def dgrad_ratio(dx32: torch.Tensor, dy32: torch.Tensor, weight32: torch.Tensor) -> torch.Tensor:
    """Input-gradient GEMM check: ``dX @ 1 = dY @ (W @ 1)`` (``dX`` M x K, ``dY`` M x N)."""
    return row_checksum_ratio(dx32, dy32, weight32)


def wgrad_ratio(dw32: torch.Tensor, dy32: torch.Tensor, x32: torch.Tensor) -> torch.Tensor:
    """Weight-gradient GEMM check: ``dW @ 1 = dYᵀ @ (X @ 1)`` (``dW`` N x K)."""
    return row_checksum_ratio(dw32, dy32.t(), x32)


def check_cost(rows_out: int, inner: int, width: int) -> float:
    """Cost of one check relative to its GEMM's (``2 R L C`` flops): the sum of the result
    (R C), the reference mat-vec (R L) and the row norms (R L), plus the ``B`` reductions
    (L C), amortised over R rows; about ``1/L + 1/C`` for R >= L, C."""
    gemm = 2.0 * rows_out * inner * width
    check = rows_out * width + 2.0 * rows_out * inner + 2.0 * inner * width
    return check / gemm


def layer_norm_row_sums(
    x: torch.Tensor,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of a layer norm's R x D input ``x``: the expected output row sum
    ``r ((x - μ) @ gamma) + sum(beta)`` and the magnitude its rounding grows with,
    ``r (|x - μ| + |μ|) |gamma| + |beta|`` (fp32, R values each), with the kernel's own ``μ``
    and ``r`` (see :func:`layer_norm_ratio`)."""
    x32 = x.float()
    features = x32.shape[1]
    mean32, rstd32 = mean.float().reshape(-1, 1), rstd.float().reshape(-1)
    centred = x32 - mean32
    gamma = weight.float().reshape(-1) if weight is not None else x32.new_ones(features)
    expected = rstd32 * (centred @ gamma)
    spread = torch.linalg.vector_norm(centred, dim=1) + mean32.reshape(-1).abs()
    magnitude = rstd32 * spread * torch.linalg.vector_norm(gamma)
    if bias is not None:
        bias32 = bias.float().reshape(-1)
        expected = expected + bias32.sum()
        magnitude = magnitude + torch.linalg.vector_norm(bias32)
    return expected, magnitude


def layer_norm_ratio(
    y32: torch.Tensor,
    x: torch.Tensor,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """Layer-norm check: each output row's sum against the affine parameters (0-dim fp32).

    ``y = gamma ⊙ (x - μ) r + beta`` over a row of D features, so

        y @ 1 = r * ((x - μ) @ gamma) + sum(beta)

    with the kernel's own row mean ``μ`` and ``r = 1/sqrt(var + eps)`` (``torch.native_layer_norm``
    returns them): recomputing them here would differ from the kernel's by far more than a
    fault when the row's mean is large against its spread (a one-pass variance loses
    ``u μ²/var``). O(D) work per row. The remaining rounding (``x - μ`` per element, the D-term
    sums) is bounded by ``u (1 + sqrt(D)) (r (|x - μ| + |μ|) |gamma| + |beta|)``. ``y32`` and ``x`` are
    R x D (the normalised dimensions flattened), ``mean``/``rstd`` R values; NaN/Inf gives
    NaN/Inf. Measured (CPU, 16 rows, healthy inputs of mean 0..1000): healthy ratios below 4,
    x1.1 on one element above 5 in 99% of trials for D <= 4096 with mean 0, less as the mean
    grows against the spread (the output's own precision shrinks with it).
    """
    expected, magnitude = layer_norm_row_sums(x, mean, rstd, weight, bias)
    features = x.shape[1]
    observed = y32.sum(dim=1, dtype=torch.float32)
    scale = FP32_UNIT_ROUNDOFF * (1.0 + math.sqrt(features))
    ratio = (observed - expected).abs() / (scale * magnitude + BOUND_FLOOR)
    if ratio.numel() == 0:
        return ratio.new_zeros(())
    return torch.where(torch.isfinite(ratio), ratio, torch.full_like(ratio, math.inf)).max()

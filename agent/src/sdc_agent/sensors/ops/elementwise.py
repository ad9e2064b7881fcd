"""Element-wise ops checked by recomputation: gated activations (SiLU, GELU), the gating
product and adds; and the embedding lookup (a copy, compared) and its weight gradient (column
sums).

An element-wise op has no cheap invariant: each output element depends on its own input element
only, so no row sum of the output can be predicted without computing every element again. The
checks here therefore recompute the op, element by element, in fp32 through a *different* route
than the kernel's (``x * sigmoid(x)`` against the fused ``silu`` kernel; the ``erf``/``tanh``
formula against the fused ``gelu``; the derivative formula against ``silu_backward``/
``gelu_backward``; a widened fp32 add against a 16-bit add), and compare each element with its
own rounding bound. That costs about what the op costs (a few passes over memory, no GEMM-sized
work), like the row-invariant checks of norms and softmax (:mod:`.rows`), and it is sharper than
any row sum: the bound of an element is its own rounding, not its row's, so a 10% change of one
bf16 element (25 bf16 roundings) stands out where a row sum of 64 bf16 values cannot see it.

Bounds, per element (``u = 2^-24``, ``u_out`` the unit roundoff of the checked value's dtype when
coarser than fp32, else 0):

* activation output ``y = f(x)``: the kernel computes f in fp32 (16-bit inputs are widened
  exactly) with a few roundings (``exp``/``erf``/``tanh``, a division or two), the reference
  alike, and the result is rounded once to y's dtype: ``|y - f_ref(x)| <= 8 u M + 2 u_out
  |f_ref(x)|`` with ``M`` the magnitude the kernel's arithmetic works at: ``|f(x)|`` for SiLU,
  ``|x| (1 + |erf|) / 2`` for GELU (torch's kernel computes ``1 + erf(x / sqrt 2)``, which
  cancels for x << 0: it reads 17% off at x = -5 in fp32, 100% at -6, while the reference uses
  ``erfc``), ``|x| (1 + |tanh|) / 2`` for its tanh form (:func:`activation_ratio`);
* activation input gradient ``dx = dy ⊙ f'(x)``: ``f'`` is a sum of terms that can cancel
  (SiLU: ``s + x s (1 - s)``; GELU: ``Φ(x) + x φ(x)``), so the bound is relative to the sum of
  their magnitudes, ``M = |dy| (|t_1| + |t_2|)``: ``8 u M + 2 u_out |dy f'(x)|``
  (:func:`activation_dgrad_ratio`);
* add ``y = a + b`` and product ``y = a ⊙ b`` (the gating product of SwiGLU/GeGLU,
  ``act(gate(x)) * up(x)``; and its input gradients ``dy ⊙ b``, ``dy ⊙ a``): IEEE addition and
  multiplication are correctly rounded, so ``y`` is the exact result rounded once to y's dtype
  and the fp32 reference errs by at most ``u`` of it: ``|y - ref_32| <= (2 u + 2 u_out)
  |ref_32|`` (:func:`add_ratio`, :func:`mul_ratio`). For fp32 operands this is a bitwise
  recomputation (the bound is a formality: healthy ratios are 0); a product of two bf16 values
  is exact in fp32.

Each bound is computed from the op's inputs (the reference), never from the checked value, and
has a floor of the checked dtype's smallest normal number (subnormal results carry an absolute
error of that order). The ratio handed to the board is the largest over the elements; NaN/Inf in
the checked value gives +Inf.

Memory: a check works in blocks of at most :data:`CHUNK_ELEMENTS` elements (row blocks of the
checked tensor, a row cut where one row alone is larger), so its fp32 temporaries (the widened
inputs, the reference, its bound, the ratios: several per element) never exceed a few blocks
whatever the tensor (a SwiGLU activation of a 16K-token batch of an 8B model is 230M elements:
several GB of fp32 temporaries unchunked). Every element's ratio is computed by the same formula
in a block as in the whole tensor, and the largest of the blocks' largest is the largest of all,
so the ratio is the same bits chunked or not.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F

from .rows import CHUNK_ELEMENTS, FP32_UNIT_ROUNDOFF, OpSensor

ACTIVATIONS = ("silu", "gelu")
"""The activation functions checked (``F.silu``, ``F.gelu`` with ``approximate`` ``none`` or
``tanh``): what SwiGLU and GeGLU MLPs call, and what ``nn.SiLU``/``nn.GELU`` and Hugging Face's
``SiLUActivation``/``GELUActivation`` call."""

_KERNEL_ROUNDINGS = 8.0  # fp32 roundings allowed to the kernel and the reference together
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_TANH_CUBIC = 0.044715  # the tanh approximation's constant (F.gelu(approximate="tanh"))


def _blocks(shape: torch.Size | tuple[int, ...], limit: int) -> Iterator[tuple[int | slice, ...]]:
    """Indices that cover a tensor of ``shape`` in blocks of at most ``limit`` elements: runs of
    whole rows of the first dimension where a row fits, else each row cut the same way."""
    if not shape:
        yield ()
        return
    inner = math.prod(shape[1:])
    if inner <= limit:
        step = max(1, limit // max(1, inner))
        for start in range(0, shape[0], step):
            yield (slice(start, start + step),)
        return
    for row in range(shape[0]):
        for rest in _blocks(shape[1:], limit):
            yield (row, *rest)


def chunked_max(
    ratio_of: Callable[..., torch.Tensor],
    shape: torch.Size | tuple[int, ...],
    *tensors: torch.Tensor,
    chunk: int | None = None,
) -> torch.Tensor:
    """The largest of ``ratio_of(*blocks)`` over blocks of ``tensors`` (each broadcast to
    ``shape``: a view, no copy) of at most ``chunk`` (default :data:`CHUNK_ELEMENTS`) elements
    (0-dim fp32; 0 for an empty tensor). ``ratio_of`` must be element-wise up to its final max,
    so the result is the bits of ``ratio_of`` on the whole tensors."""
    limit = chunk if chunk is not None else CHUNK_ELEMENTS
    if limit < 1:
        raise ValueError(f"chunk must be >= 1 element, got {limit}")
    views = [t.expand(shape) for t in tensors]
    if math.prod(shape) <= limit:
        return ratio_of(*views)
    parts = [ratio_of(*(v[index] for v in views)) for index in _blocks(shape, limit)]
    return torch.stack(parts).max()


def _output_unit(dtype: torch.dtype) -> float:
    """The unit roundoff of a checked value's dtype when it is coarser than fp32, else 0."""
    if dtype in (torch.float32, torch.float64) or not dtype.is_floating_point:
        return 0.0
    return torch.finfo(dtype).eps / 2


def elementwise_ratio(
    observed: torch.Tensor, reference: torch.Tensor, magnitude: torch.Tensor, relative: float
) -> torch.Tensor:
    """The largest ``|observed - reference| / (relative * magnitude + tiny)`` over the elements
    (0-dim fp32); NaN/Inf anywhere in ``observed`` gives +Inf. ``tiny``: the smallest normal
    number of ``observed``'s dtype."""
    tiny = torch.finfo(observed.dtype).tiny if observed.dtype.is_floating_point else 0.0
    work = reference.dtype
    ratio = (observed.to(work) - reference).abs() / (relative * magnitude + tiny)
    if ratio.numel() == 0:
        return ratio.new_zeros((), dtype=torch.float32)
    ratio = torch.where(torch.isfinite(ratio), ratio, torch.full_like(ratio, math.inf))
    return ratio.max().float()


def _work_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """fp64 when any operand is fp64, else fp32: the precision the references are computed in."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def activation_reference(
    name: str, x: torch.Tensor, approximate: str = "none"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``f(x)``, ``f'(x)``, and the magnitudes the kernels' rounding grows with for each
    (:func:`activation_ratio`), of activation ``name`` in fp32 (fp64 for fp64 inputs), by
    formulas independent of the kernels'."""
    x32 = x.to(_work_dtype(x))
    if name == "silu":
        s = torch.sigmoid(x32)
        # f' = s + x s (1 - s): two terms that cancel near x = -1.28
        term2 = x32 * s * (1.0 - s)
        return x32 * s, s + term2, (x32 * s).abs(), s + term2.abs()
    if name != "gelu":
        raise ValueError(f"no reference for activation {name!r}")
    if approximate == "tanh":
        inner = _SQRT_2_OVER_PI * (x32 + _TANH_CUBIC * x32 * x32 * x32)
        t = torch.tanh(inner)
        # The kernels compute 1 + tanh, which cancels for x << 0: bound by |1| + |tanh|.
        half = 0.5 * (1.0 + t.abs())
        slope_inner = _SQRT_2_OVER_PI * (1.0 + 3.0 * _TANH_CUBIC * x32 * x32)
        term2 = 0.5 * x32 * (1.0 - t * t) * slope_inner
        magnitude = half + 0.5 * x32.abs() * (1.0 + t * t) * slope_inner
        return 0.5 * x32 * (1.0 + t), 0.5 * (1.0 + t) + term2, x32.abs() * half, magnitude
    # Φ by erfc, accurate for x << 0 where the kernels' 1 + erf cancels: bound by 1 + |erf|.
    cdf = 0.5 * torch.erfc(-x32 * _INV_SQRT_2)
    half = 0.5 * (1.0 + torch.erf(x32 * _INV_SQRT_2).abs())
    density = torch.exp(-0.5 * x32 * x32) / math.sqrt(2.0 * math.pi)
    return x32 * cdf, cdf + x32 * density, x32.abs() * half, half + (x32 * density).abs()


def activation_ratio(
    y: torch.Tensor,
    x: torch.Tensor,
    name: str,
    approximate: str = "none",
    *,
    chunk: int | None = None,
) -> torch.Tensor:
    """Activation forward check: every ``y_i`` against ``f(x_i)`` recomputed (0-dim fp32), in
    blocks of ``chunk`` elements (:func:`chunked_max`).

    The inputs are exact (a 16-bit input is widened exactly); the kernel computes in fp32 and
    rounds once to y's dtype."""

    def block(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        value, _, magnitude, _ = activation_reference(name, x, approximate)
        relative = _KERNEL_ROUNDINGS * FP32_UNIT_ROUNDOFF
        bound = relative * magnitude + 2.0 * _output_unit(y.dtype) * value.abs()
        return elementwise_ratio(y, value, bound, 1.0)

    return chunked_max(block, y.shape, y, x, chunk=chunk)


def activation_dgrad_ratio(
    dx: torch.Tensor,
    dy: torch.Tensor,
    x: torch.Tensor,
    name: str,
    approximate: str = "none",
    *,
    chunk: int | None = None,
) -> torch.Tensor:
    """Activation backward check: every ``dx_i`` against ``dy_i f'(x_i)`` recomputed (0-dim
    fp32), bounded by the magnitudes of the derivative's terms (they can cancel) and the one
    rounding of dx to its dtype; in blocks of ``chunk`` elements (:func:`chunked_max`)."""

    def block(dx: torch.Tensor, dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        _, slope, _, magnitude = activation_reference(name, x, approximate)
        dy32 = dy.to(slope.dtype)
        reference = dy32 * slope
        bound = _KERNEL_ROUNDINGS * FP32_UNIT_ROUNDOFF * dy32.abs() * magnitude
        bound = bound + 2.0 * _output_unit(dx.dtype) * reference.abs()
        return elementwise_ratio(dx, reference, bound, 1.0)

    return chunked_max(block, dx.shape, dx, dy, x, chunk=chunk)


def _rounded_once_ratio(
    combine: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    y: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    chunk: int | None,
) -> torch.Tensor:
    """``y`` against ``combine(a, b)`` recomputed in fp32 (fp64 for fp64 operands), each element
    bounded by the one rounding of a correctly rounded op (:func:`add_ratio`)."""
    work = _work_dtype(y, a, b)
    relative = 2.0 * FP32_UNIT_ROUNDOFF + 2.0 * _output_unit(y.dtype)

    def block(y: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        reference = combine(a.to(work), b.to(work))
        return elementwise_ratio(y, reference, reference.abs(), relative)

    return chunked_max(block, y.shape, y, a, b, chunk=chunk)


def add_ratio(
    y: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, chunk: int | None = None
) -> torch.Tensor:
    """Add check: every ``y_i`` against ``a_i + b_i`` recomputed in fp32 (0-dim fp32), in
    blocks of ``chunk`` elements (:func:`chunked_max`).

    ``a`` and ``b`` are broadcast to ``y``'s shape by the add itself."""
    return _rounded_once_ratio(torch.add, y, a, b, chunk)


def mul_ratio(
    y: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, chunk: int | None = None
) -> torch.Tensor:
    """Product check: every ``y_i`` against ``a_i b_i`` recomputed in fp32 (0-dim fp32), in
    blocks of ``chunk`` elements (:func:`chunked_max`)."""
    return _rounded_once_ratio(torch.mul, y, a, b, chunk)


class MulFunction(torch.autograd.Function):
    """``a * b`` (one operand possibly broadcast to the other) with the calls autograd's
    ``MulBackward0`` makes (``grad * b``, ``grad * a``, each in its input's dtype; the engine
    sums a broadcast operand's gradient down to its shape, as for the plain product), so that
    the values are the plain product's bit for bit, with the product and both input gradients
    tapped and checked."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor, site: OpSensor) -> torch.Tensor:
        y = torch.mul(a, b)
        site.tap("forward", y)
        if site.checks("forward"):
            site.record("forward", mul_ratio(y, a, b))
        ctx.site = site
        ctx.check_dgrad = site.checks("dgrad")
        ctx.save_for_backward(a, b)
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        a, b = ctx.saved_tensors
        site: OpSensor = ctx.site
        need_a, need_b = ctx.needs_input_grad[:2]
        da = (grad * b).to(a.dtype) if need_a else None
        db = (grad * a).to(b.dtype) if need_b else None
        with torch.no_grad():
            for result in (da, db):
                if result is not None:
                    site.tap("dgrad", result)
            if ctx.check_dgrad:
                ratios = [mul_ratio(d, grad, o) for d, o in ((da, b), (db, a)) if d is not None]
                if ratios:
                    site.record("dgrad", torch.stack(ratios).max())
        return da, db, None


def embedding_wgrad_ratio(
    dw: torch.Tensor,
    dy: torch.Tensor,
    ids: torch.Tensor,
    padding_idx: int,
    *,
    chunk: int | None = None,
) -> torch.Tensor:
    """Embedding weight-gradient check: the gradient is a scatter-add of the output gradient's
    rows into the rows of the looked-up tokens, so its column sums equal the output gradient's
    (over the tokens that are not padding): ``1ᵀ dW = 1ᵀ dY`` (0-dim fp32). Both sides are sums
    in fp32 of the same terms in other orders: ``2 u (sqrt(V) + sqrt(T))`` times the column's
    norm bounds them (``V`` rows, ``T`` tokens).

    ``dW``'s column sums accumulate in fp32 without a widened copy of it; the output gradient is
    widened in row blocks of at most ``chunk`` elements (:data:`CHUNK_ELEMENTS`), each block's
    column sums, squares and magnitudes added up (one block when it fits: the sums of the whole
    tensor at once)."""
    width = dy.shape[-1]
    rows, tokens = dy.reshape(-1, width), ids.reshape(-1)
    limit = chunk if chunk is not None else CHUNK_ELEMENTS
    step = max(1, limit // max(1, width))
    totals: tuple[torch.Tensor, ...] | None = None
    for start in range(0, max(1, rows.shape[0]), step):
        block = rows[start : start + step].float()
        if padding_idx >= 0:
            block = block * (tokens[start : start + step].reshape(-1, 1) != padding_idx)
        parts = (block.sum(dim=0), block.square().sum(dim=0), block.abs().sum(dim=0))
        if totals is None:
            totals = parts
        else:
            totals = tuple(total + part for total, part in zip(totals, parts, strict=True))
    assert totals is not None  # the loop runs at least once (max(1, rows))
    expected, squares, magnitudes = totals
    observed = dw.sum(dim=0, dtype=torch.float32)
    growth = 2.0 * FP32_UNIT_ROUNDOFF * (math.sqrt(dw.shape[0]) + math.sqrt(rows.shape[0]))
    bound = growth * squares.sqrt() + 2.0 * _output_unit(dw.dtype) * magnitudes
    return elementwise_ratio(observed, expected, bound, 1.0)


class EmbeddingFunction(torch.autograd.Function):
    """``F.embedding`` with the kernels autograd runs (``embedding``, ``embedding_backward``):
    the lookup is compared with a second gather (a copy: any difference is a fault), the weight
    gradient checked by its column sums (:func:`embedding_wgrad_ratio`)."""

    @staticmethod
    def forward(
        ctx: Any, ids: torch.Tensor, weight: torch.Tensor, padding_idx: int, site: OpSensor
    ) -> torch.Tensor:
        y = torch.embedding(weight, ids, padding_idx, False, False)
        site.tap("forward", y)
        if site.checks("forward"):
            again = weight.index_select(0, ids.reshape(-1)).view_as(y)
            differ = (y != again).any()
            site.record("forward", torch.where(differ, math.inf, 0.0).float())
        ctx.site, ctx.padding_idx, ctx.rows = site, padding_idx, weight.shape[0]
        ctx.check = site.checks("wgrad")
        ctx.save_for_backward(ids)
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (ids,) = ctx.saved_tensors
        # The call autograd's EmbeddingBackward0 makes.
        dw = torch.ops.aten.embedding_backward(grad, ids, ctx.rows, ctx.padding_idx, False, False)
        with torch.no_grad():
            ctx.site.tap("wgrad", dw)
            if ctx.check:
                ctx.site.record("wgrad", embedding_wgrad_ratio(dw, grad, ids, ctx.padding_idx))
        return None, dw, None, None


class ActivationFunction(torch.autograd.Function):
    """``F.silu``/``F.gelu`` through the kernels autograd runs for them (``silu_backward``,
    ``gelu_backward``), so that the values are the plain call's bit for bit, with the output and
    the input gradient tapped (fault drills) and checked when the site's sensors say so."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, site: OpSensor, name: str, approximate: str
    ) -> torch.Tensor:
        y = F.silu(x) if name == "silu" else F.gelu(x, approximate=approximate)
        site.tap("forward", y)
        if site.checks("forward"):
            site.record("forward", activation_ratio(y.detach(), x.detach(), name, approximate))
        ctx.site, ctx.name, ctx.approximate = site, name, approximate
        ctx.check_dgrad = site.checks("dgrad")
        ctx.save_for_backward(x)
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (x,) = ctx.saved_tensors
        # The calls autograd's SiluBackward0 / GeluBackward0 make.
        if ctx.name == "silu":
            dx = torch.ops.aten.silu_backward(grad, x)
        else:
            dx = torch.ops.aten.gelu_backward(grad, x, approximate=ctx.approximate)
        with torch.no_grad():
            ctx.site.tap("dgrad", dx)
            if ctx.check_dgrad:
                ctx.site.record(
                    "dgrad", activation_dgrad_ratio(dx, grad, x, ctx.name, ctx.approximate)
                )
        return dx, None, None, None

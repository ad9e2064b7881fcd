"""Checked scaled-dot-product attention: ``F.scaled_dot_product_attention`` as an unfused path
whose batched GEMMs are checked by row checksums and whose softmax rows must sum to one.

A fused attention kernel (FlashAttention, the CPU's ``_scaled_dot_product_flash_attention_for_cpu``)
never materialises the scores ``S = Q Kᵀ`` nor the probabilities ``P``; what it returns (the output
and the row log-sum-exp) obeys no identity cheaper than recomputing the scores, i.e. the attention
itself. So the check needs the unfused computation, which :func:`sdc_agent.sensors.protect`
runs in place of the fused kernel only when asked (``protect(model, attention="checked")``;
the default ``"fused"`` keeps the kernel, and attention is then checked only by the recompute
comparison of checkpointed blocks, :mod:`.recompute`). The path, per batch and head, in fp32 (the
16-bit operands widened, as a 16-bit GEMM's fp32 accumulator sees them):

forward::

    S = Q Kᵀ           S @ 1 = Q (Kᵀ 1)                      (row checksum, :mod:`~sdc_agent.sensors.maths.abft`)
    P = softmax(S * scale + mask)     P @ 1 = 1               (rows sum to one)
    O = P V            O @ 1 = P (V 1)                        (row checksum)

backward (``dO`` given)::

    dV = Pᵀ dO         dV @ 1 = Pᵀ (dO 1)
    dP = dO Vᵀ         dP @ 1 = dO (Vᵀ 1)
    dZ = P ⊙ (dP - rowsum(dP ⊙ P))   dZ @ 1 = s (1 - P @ 1)   (:func:`.softmax.softmax_dgrad_ratio`)
    dQ = (dZ scale) K  dQ @ 1 = dS (K 1)
    dK = (dZ scale)ᵀ Q dK @ 1 = dSᵀ (Q 1)

Every GEMM check's bound is four times :mod:`~sdc_agent.sensors.maths.abft`'s (``u (1 + sqrt(C / L)) |a_r| |B|_F`` per row, per
batch and head; :data:`ATTENTION_BOUND_FACTOR` says why), the softmax bound :mod:`.softmax`'s with masked entries (probability 0) left out.
Grouped-query attention (``enable_gqa=True``, or K/V with fewer heads) repeats K and V over the
query heads as SDPA does and sums their gradients back. ``is_causal`` masks top-left aligned, as
SDPA does; a boolean mask keeps True, a float mask is added. With ``dropout_p > 0`` the fused
kernel runs, unchecked (the dropout mask is the kernel's own).

Cost: the unfused path stores ``S``'s probabilities (``B H Tq Tk`` fp32 values) for the backward
and runs five GEMMs of ``2 B H Tq Tk d`` flops where the fused kernel recomputes in tiles: on a
GPU at long context it is far slower and larger than FlashAttention, which is why it is opt-in
(``docs/performance.md`` has the cost measured on the CPU). Its values are not the fused
kernel's bit for bit (another order of summation); they are the same in training and in every
replay, whether or not a sensor checks, so replays stay bitwise reproducible.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..maths.abft import BOUND_FLOOR, _bound_scale
from .rows import FP32_UNIT_ROUNDOFF, OpSensor, sqrt_length
from .softmax import softmax_dgrad_ratio

ATTENTION_MODES = ("fused", "checked")
"""``protect(attention=...)``: keep the fused SDPA kernel (unchecked), or run the checked path."""


ATTENTION_BOUND_FACTOR = 4.0
"""Attention's GEMM checks use four times :mod:`~sdc_agent.sensors.maths.abft`'s probabilistic bound: their operands are
not the random-signed data the bound's random walk assumes (probabilities are non-negative,
causal masks zero whole triangles, a head's inner dimension is short), and healthy ratios were
measured up to 2.5 of the single bound (random operands, T from 16 to 256, head width 12 to 64;
the value gradient ``Pᵀ dO`` the largest): four times it, about 0.6 at most, while one x1.1
element still reads hundreds of bounds at these sizes."""


def batched_checksum_ratio(
    result: torch.Tensor, left: torch.Tensor, right: torch.Tensor
) -> torch.Tensor:
    """:func:`~sdc_agent.sensors.maths.abft.row_checksum_ratio` over leading batch dimensions: the largest per-row
    ``|result @ 1 - left @ (right @ 1)| / bound`` for ``result = left @ right`` (fp32, ``result``
    ... x R x C, ``left`` ... x R x L, ``right`` ... x L x C). 0-dim fp32; NaN/Inf gives +Inf."""
    left32, right32 = left.float(), right.float()
    observed = result.float().sum(dim=-1)
    expected = (left32 @ right32.sum(dim=-1, keepdim=True)).squeeze(-1)
    row_norms = left32.square().sum(dim=-1).sqrt()
    frobenius = right32.square().sum(dim=(-2, -1)).sqrt().unsqueeze(-1)
    scale = ATTENTION_BOUND_FACTOR * _bound_scale(left.shape[-1], result.shape[-1])
    ratio = (observed - expected).abs() / (scale * row_norms * frobenius + BOUND_FLOOR)
    if ratio.numel() == 0:
        return ratio.new_zeros(())
    return torch.where(torch.isfinite(ratio), ratio, torch.full_like(ratio, math.inf)).max()


def probabilities_ratio(p: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """Softmax forward check with masked entries: each row's ``|Σp - 1| / bound`` (0-dim fp32),
    the bound :mod:`.softmax`'s (``u (1 + sqrt(D)) |p ⊙ (2 + |z - max z|)|``, ``p`` clamped to
    [0, 1]) over the entries that are not masked: a masked entry's probability is exactly 0, and
    anything else there is a fault."""
    top = z.amax(dim=-1, keepdim=True)
    spread = (z - top).abs()
    kept = p.clamp(0.0, 1.0)
    # Masked scores (-inf) have probability 0 and add no rounding: whatever a fault writes
    # there must stand out, not widen the bound through an infinite spread.
    error = torch.where(torch.isfinite(z), kept * (2.0 + spread), torch.zeros_like(kept))
    norm = torch.linalg.vector_norm(error, dim=-1)
    bound = FP32_UNIT_ROUNDOFF * sqrt_length(p.shape[-1]) * norm + BOUND_FLOOR
    ratio = (p.sum(dim=-1) - 1.0).abs() / bound
    if ratio.numel() == 0:
        return ratio.new_zeros(())
    return torch.where(torch.isfinite(ratio), ratio, torch.full_like(ratio, math.inf)).max()


def _largest(*ratios: torch.Tensor) -> torch.Tensor:
    out = ratios[0]
    for ratio in ratios[1:]:
        out = torch.maximum(out, ratio)
    return out


def _mask_scores(
    z: torch.Tensor, mask: torch.Tensor | None, causal: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``z`` with the attention mask applied (float mask added, boolean/causal masked to -inf)."""
    if causal:
        rows, cols = z.shape[-2], z.shape[-1]
        keep = torch.ones(rows, cols, dtype=torch.bool, device=z.device).tril()
        z = z.masked_fill(~keep, -math.inf)
    if mask is None:
        return z, None
    if mask.dtype == torch.bool:
        return z.masked_fill(~mask, -math.inf), None
    return z + mask.float(), None


class AttentionFunction(torch.autograd.Function):
    """The checked attention of the module docstring: fp32 GEMMs of the (16-bit) operands, each
    checked before it is used; the output rounded once to the operands' dtype."""

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        site: OpSensor,
        scale: float,
        causal: bool,
        groups: int,
    ) -> torch.Tensor:
        q32, k32, v32 = q.float(), k.float(), v.float()
        if groups > 1:
            k32 = k32.repeat_interleave(groups, dim=-3)
            v32 = v32.repeat_interleave(groups, dim=-3)
        check = site.checks("forward")
        s = q32 @ k32.transpose(-2, -1)
        site.tap("scores", s)
        z, _ = _mask_scores(s * scale, mask, causal)
        p = torch.softmax(z, dim=-1)
        site.tap("probs", p)
        o = p @ v32
        site.tap("forward", o)
        if check:
            site.record(
                "forward",
                _largest(
                    batched_checksum_ratio(s, q32, k32.transpose(-2, -1)),
                    probabilities_ratio(p, z),
                    batched_checksum_ratio(o, p, v32),
                ),
            )
        ctx.site, ctx.scale, ctx.groups = site, scale, groups
        ctx.check_dgrad = site.checks("dgrad")
        ctx.dtypes = (q.dtype, k.dtype, v.dtype)
        ctx.save_for_backward(q, k, v, p)
        return o.to(q.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, p = ctx.saved_tensors
        site: OpSensor = ctx.site
        groups = ctx.groups
        q32, k32, v32 = q.float(), k.float(), v.float()
        if groups > 1:
            k32 = k32.repeat_interleave(groups, dim=-3)
            v32 = v32.repeat_interleave(groups, dim=-3)
        do = grad.float()
        with torch.no_grad():
            pt = p.transpose(-2, -1)
            dv = pt @ do
            site.tap("dgrad_v", dv)
            dp = do @ v32.transpose(-2, -1)
            site.tap("dprobs", dp)
            dz = torch._softmax_backward_data(dp, p, -1, torch.float32)
            site.tap("dscores", dz)
            ds = dz * ctx.scale
            dq = ds @ k32
            site.tap("dgrad", dq)
            dk = ds.transpose(-2, -1) @ q32
            site.tap("dgrad_k", dk)
            if ctx.check_dgrad:
                site.record(
                    "dgrad",
                    _largest(
                        batched_checksum_ratio(dv, pt, do),
                        batched_checksum_ratio(dp, do, v32.transpose(-2, -1)),
                        softmax_dgrad_ratio(dz, dp, p, -1),
                        batched_checksum_ratio(dq, ds, k32),
                        batched_checksum_ratio(dk, ds.transpose(-2, -1), q32),
                    ),
                )
            if groups > 1:
                dk = dk.unflatten(-3, (-1, groups)).sum(dim=-3)
                dv = dv.unflatten(-3, (-1, groups)).sum(dim=-3)
        q_dtype, k_dtype, v_dtype = ctx.dtypes
        return dq.to(q_dtype), dk.to(k_dtype), dv.to(v_dtype), None, None, None, None, None


def checked_call(
    site: OpSensor, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> torch.Tensor | None:
    """``F.scaled_dot_product_attention(*args, **kwargs)`` by the checked path, or None when the
    call is one it does not take (dropout, unusual shapes, a device whose autocast it does not
    mirror): the caller then runs the fused kernel."""
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
    bound = dict(zip(names, args, strict=False))
    bound.update(kwargs)
    q, k, v = bound.get("query"), bound.get("key"), bound.get("value")
    mask = bound.get("attn_mask")
    if not (
        isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)
    ) or set(bound) - set(names):
        return None
    if bound.get("dropout_p", 0.0) or q.dim() < 3 or not q.is_floating_point():
        return None
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2] or k.shape[:-2] != v.shape[:-2]:
        return None
    heads, kv_heads = (q.shape[-3], k.shape[-3]) if q.dim() >= 4 else (1, 1)
    if heads % kv_heads or (heads != kv_heads and not bound.get("enable_gqa", False)):
        return None
    groups = heads // kv_heads
    if q.shape[:-3] != k.shape[:-3] or (mask is not None and not isinstance(mask, torch.Tensor)):
        return None
    device = q.device.type
    if torch.is_autocast_enabled(device):
        if device not in ("cpu", "cuda"):
            return None
        # SDPA is on both devices' lower-precision autocast list.
        dtype = torch.get_autocast_dtype(device)
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    if not (q.dtype == k.dtype == v.dtype):
        return None
    scale = bound.get("scale")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    causal = bool(bound.get("is_causal", False))
    with torch.autocast(device, enabled=False):
        return AttentionFunction.apply(q, k, v, mask, site, scale, causal, groups)

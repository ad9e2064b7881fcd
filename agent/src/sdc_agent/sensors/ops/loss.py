"""Checked softmax cross-entropy: ``F.cross_entropy`` with its log-softmax and its gradient checked.

For class-index targets and no label smoothing, ``F.cross_entropy(x, t)`` is
``nll_loss(log_softmax(x, 1), t)`` (ATen's ``cross_entropy_loss`` is exactly that composition).
The checked path runs the very kernels autograd runs for it (``_log_softmax``,
``nll_loss_forward``; backward ``nll_loss_backward`` then ``_log_softmax_backward_data``), so the
loss and the logits' gradient are the plain call's bit for bit, and checks, per row of logits:

* forward: the log-probabilities ``y`` satisfy ``Σ exp(y) = 1`` (logsumexp 0;
  :func:`.softmax.log_softmax_ratio`);
* backward, the loss gradient: the NLL gradient ``g`` has one entry per row, at the target,
  ``-w[t] dL / W`` (``W`` the total weight of the targets not ignored; 0 for an ignored row), so
  its row sum is known from the target, the class weights and the incoming gradient alone
  (:func:`nll_grad_ratio`, bound ``4 u`` relative to that value: it is one product and one
  division); and the logits' gradient ``dx = g - softmax(x) Σg`` sums to ``Σg (1 - Σ exp(y))``,
  i.e. the softmax-cross-entropy gradient's rows sum to zero up to the forward's rounding
  (:func:`.softmax.log_softmax_dgrad_ratio`). The first catches a wrong entry of ``g`` (which the
  second cannot: any incoming gradient satisfies it), the second a wrong entry of ``dx``.

Calls it does not take run plain and unchecked: probability targets, label smoothing, the
deprecated ``size_average``/``reduce``, 16-bit logits under autocast, a class dimension other
than a 2-D input's. Hugging Face models compute the loss inside their forward (``labels=``), so
the site is found there; a loss computed outside the model's forward is not inside any protected
module and stays unchecked (``guard.coverage()`` says so).
"""

from __future__ import annotations

from typing import Any

import torch

from .rows import FP32_UNIT_ROUNDOFF, OpSensor, row_blocks, worst_row_ratio
from .softmax import log_softmax_dgrad_ratio, log_softmax_ratio

_REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}  # ATen's Reduction enum


def nll_grad_ratio(
    g: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None,
    ignore_index: int,
    reduction: str,
    grad_out: torch.Tensor,
    total_weight: torch.Tensor,
    *,
    chunk: int | None = None,
) -> torch.Tensor:
    """The NLL gradient's row sums against ``-w[t] dL / W`` (0 for ignored rows; module
    docstring), relative to ``4 u`` of that value (0-dim fp32). The row sums are taken over
    blocks of rows of at most ``chunk`` elements (:func:`.rows.row_blocks`): no full-size fp32
    copy of the gradient (vocabulary wide) is made."""
    # Each row's fp32 sum, computed on a widened block of rows at a time.
    observed = torch.cat([part.float().sum(dim=1) for part in _row_parts(g, chunk)])
    valid = target != ignore_index
    safe = torch.where(valid, target, torch.zeros_like(target))
    w = (
        weight.float()[safe]
        if weight is not None
        else torch.ones(g.shape[0], dtype=torch.float32, device=g.device)
    )
    w = torch.where(valid, w, torch.zeros_like(w))
    upstream = grad_out.float().reshape(-1) if reduction == "none" else grad_out.float()
    expected = -w * upstream
    if reduction == "mean":
        expected = expected / total_weight.float()
    bound = 4.0 * FP32_UNIT_ROUNDOFF * expected.abs() + torch.finfo(torch.float32).tiny
    return worst_row_ratio(observed, expected, bound)


def _row_parts(g: torch.Tensor, chunk: int | None) -> list[torch.Tensor]:
    """``g`` (R x V) as blocks of whole rows (:func:`.rows.row_blocks`)."""
    if g.shape[0] == 0:
        return [g]
    return [g[block] for block in row_blocks(g.shape[0], g.shape[1], chunk)]


class CrossEntropyFunction(torch.autograd.Function):
    """``F.cross_entropy`` (class indices, no smoothing) through the kernels autograd runs for
    it, with the log-probabilities and both backward results tapped and checked."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        target: torch.Tensor,
        weight: torch.Tensor | None,
        ignore_index: int,
        reduction: str,
        site: OpSensor,
    ) -> torch.Tensor:
        logp = torch._log_softmax(x, 1, False)
        site.tap("forward", logp)
        if site.checks("forward"):
            site.record("forward", log_softmax_ratio(logp, x, 1))
        loss, total_weight = torch.ops.aten.nll_loss_forward(
            logp, target, weight, _REDUCTIONS[reduction], ignore_index
        )
        ctx.site, ctx.ignore_index, ctx.reduction = site, ignore_index, reduction
        ctx.check_dgrad = site.checks("dgrad")
        ctx.save_for_backward(logp, target, weight, total_weight)
        return loss

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        logp, target, weight, total_weight = ctx.saved_tensors
        site: OpSensor = ctx.site
        # The calls autograd's NllLossBackward0 and LogSoftmaxBackward0 make.
        g = torch.ops.aten.nll_loss_backward(
            grad,
            logp,
            target,
            weight,
            _REDUCTIONS[ctx.reduction],
            ctx.ignore_index,
            total_weight,
        )
        with torch.no_grad():
            site.tap("dlogp", g)
        dx = torch._log_softmax_backward_data(g, logp, 1, logp.dtype)
        with torch.no_grad():
            site.tap("dgrad", dx)
            if ctx.check_dgrad:
                site.record(
                    "dgrad",
                    torch.maximum(
                        nll_grad_ratio(
                            g,
                            target,
                            weight,
                            ctx.ignore_index,
                            ctx.reduction,
                            grad,
                            total_weight,
                        ),
                        log_softmax_dgrad_ratio(dx, g, logp, 1),
                    ),
                )
        return dx, None, None, None, None, None


def checked_call(
    site: OpSensor, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> torch.Tensor | None:
    """``F.cross_entropy(*args, **kwargs)`` by the checked path, or None when the call is one it
    does not take (module docstring): the caller then runs it plain."""
    names = (
        "input",
        "target",
        "weight",
        "size_average",
        "ignore_index",
        "reduce",
        "reduction",
        "label_smoothing",
    )
    bound = dict(zip(names, args, strict=False))
    bound.update(kwargs)
    x, target = bound.get("input"), bound.get("target")
    weight = bound.get("weight")
    if set(bound) - set(names) or not isinstance(x, torch.Tensor):
        return None
    if not isinstance(target, torch.Tensor) or target.is_floating_point():
        return None  # probability targets
    if bound.get("size_average") is not None or bound.get("reduce") is not None:
        return None
    if bound.get("label_smoothing", 0.0) or x.dim() != 2 or target.dim() != 1:
        return None
    if weight is not None and not isinstance(weight, torch.Tensor):
        return None
    reduction = bound.get("reduction", "mean")
    if reduction not in _REDUCTIONS or not x.is_floating_point():
        return None
    device = x.device.type
    if torch.is_autocast_enabled(device) and x.dtype not in (torch.float32, torch.float64):
        return None  # autocast would widen 16-bit logits first: left to the plain call
    ignore_index = int(bound.get("ignore_index", -100))
    with torch.autocast(device, enabled=False):
        return CrossEntropyFunction.apply(x, target, weight, ignore_index, reduction, site)

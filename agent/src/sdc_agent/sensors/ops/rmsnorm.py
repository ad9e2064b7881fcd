"""RMSNorm sensors: any module computing ``y = x * rsqrt(mean(x²) + eps) * w``, found and checked
without changing its code.

Which modules: ``nn.RMSNorm`` (one normalised dimension), and any leaf module with one 1-D
``weight`` and an ``eps`` (or ``variance_epsilon``/``epsilon``) attribute whose output, on a probe
input and a probe weight (put back bit for bit afterwards), is the formula above: Hugging Face's
``LlamaRMSNorm`` (and its copies in other models), torchtitan's, T5's. A variant that computes
something else (Gemma's ``x̂ (1 + w)``, a layer norm without bias) fails the probe and is left
alone. The module keeps its own forward: :func:`attach` adds a forward pre-hook and a forward hook
(and, when a sensor checks, hooks on the backward nodes of that call), so its values, gradients,
parameters and ``state_dict`` are untouched (``protect()`` keeps them bit for bit).

Both checks recompute the op element by element in fp32 from the norm's input, weight and (for
the backward) output gradient, and compare every element with its own rounding bound, as the
element-wise sensors do (:mod:`.elementwise`): an RMSNorm is O(D) per row like any row invariant,
and an element's own bound is far sharper than a row sum's when the values are 16-bit.

Forward (:func:`rms_norm_ratio`), ``r = (mean(x²) + eps)^-1/2`` recomputed in fp32::

    y_i = w_i x_i r

Unlike a layer norm's mean, ``r`` is well conditioned (a sum of squares), so recomputing it is
safe: the module's ``r̂`` and ours each differ from the exact ``r`` by ``δ <= u (sqrt(D) + 8)``
relative (the D-term sum of squares as a random walk of roundings, a division, an addition, the
square root and ``rsqrt``'s own ulps), and each ``y_i`` carries two more roundings (``x_i r̂``,
then the weight): ``|y_i - w_i x_i r| <= (2 δ + 4 u) |w_i x_i r|``, i.e.::

    bound_i = (u (2 sqrt(D) + 20) + 4 u_16) |w_i x_i r|

where the 16-bit term counts two roundings to a 16-bit input, weight or output dtype (Hugging Face
rounds ``x r`` to the input's dtype, then multiplies by ``w``). A wrong ``r̂`` (a whole row
scaled) moves every element of its row by its relative error, so it is caught as one wrong
element is. The modules this finds compute ``r`` in fp32 even for 16-bit inputs (Hugging Face,
torchtitan and ``nn.RMSNorm`` upcast); one computing it in 16 bits would read healthy ratios of
up to ``u_16 sqrt(D) / u`` bounds and is not what the probe accepts.

Backward (:func:`rms_norm_dgrad_ratio`): with ``x̂ = x r``, ``g = dy ⊙ w`` and ``m = mean(g ⊙ x̂)``
the input gradient is::

    dx_i = r (g_i - x̂_i m)

Its two terms ``a_i = r |g_i|`` and ``b_i = r |x̂_i m|`` can cancel, so the bound is relative to
each: the first carries ``r``'s error on both sides (``2 δ``) and a few roundings; the second is of
degree 3 in ``r`` (``6 δ``); and ``m``, a D-term sum that may itself cancel to ~0, errs on both
sides by ``u sqrt(D)`` of the size of its terms, ``c_i = r |x̂_i| mean(|g ⊙ x̂|)``::

    bound_i = u ((2 sqrt(D) + 20) a_i + (6 sqrt(D) + 48) b_i + (2 sqrt(D) + 6) c_i)
              + u_16 (a_i + c_i + |dx_i|)

(the 16-bit term when dy, dx or x is 16-bit: ``g`` rounded to it, as Hugging Face's and
torchtitan's backward do, which moves ``a`` and ``m``; and dx rounded once; ``|dx_i|`` is the
reference's, computed from the inputs).

Weight gradient (:func:`rms_norm_wgrad_ratio`): ``dw_i = Σ_rows dy_i x̂_i``, a sum over the R rows
of the batch, recomputed: both sums err as random walks (``2 u (1 + sqrt(R))`` times the norm of
the terms ``t = dy ⊙ x̂``) and every term carries ``r``'s error (``(2 sqrt(D) + 16) u`` times
``Σ |t_i|``), plus ``3 u_16 |t|`` when a 16-bit dtype is involved (each term rounded once, at
random: a random walk). It is read at the weight's
gradient accumulation (the gradient of this call, summed over the rows by autograd), once per
backward; a norm module called twice in one forward (its weight's gradient then sums both
calls) is not checked there. The
module's own input gradient is the sum of its ops' contributions (two in Hugging Face's: the
product ``x r`` and the square in ``mean(x²)``), added in fp32 for the check. Every term comes
from the inputs, never from the values checked; healthy ratios and detection are measured by
tests/unit/test_sensor_functions.py and ``benchmarks/campaign.py`` (docs/performance.md).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..runtime.board import Gemm, SensorBoard
from .elementwise import elementwise_ratio
from .rows import FP32_UNIT_ROUNDOFF, OpSensor, outside_function_modes, row_block_max, row_blocks

EPS_NAMES = ("eps", "variance_epsilon", "epsilon")
"""Attributes a module's RMSNorm epsilon is read from, in this order."""

_PROBE_SEED = 20261201


def _coarse_unit(*dtypes: torch.dtype) -> float:
    """The unit roundoff of the coarsest 16-bit dtype among ``dtypes`` (0 when none is)."""
    unit = 0.0
    for dtype in dtypes:
        if dtype.is_floating_point and torch.finfo(dtype).bits == 16:
            unit = max(unit, torch.finfo(dtype).eps / 2)
    return unit


def _rows(t: torch.Tensor, features: int) -> torch.Tensor:
    return t.detach().reshape(-1, features).float()


def _epsilon(eps: float | None, dtype: torch.dtype) -> float:
    """``nn.RMSNorm``'s rule: ``eps=None`` means the input dtype's machine epsilon."""
    return torch.finfo(dtype).eps if eps is None else float(eps)


def _reference(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """``x`` as fp32 rows, ``r`` per row (R x 1), the weight in fp32 (or ones), ``sqrt(D)``."""
    features = x.shape[-1]
    x32 = _rows(x, features)
    r = torch.rsqrt(x32.square().mean(dim=1, keepdim=True) + _epsilon(eps, x.dtype))
    w32 = weight.detach().float() if weight is not None else x32.new_ones(features)
    return x32, r, w32, math.sqrt(features)


def _rms_norm_rows(
    y: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, eps: float | None
) -> torch.Tensor:
    """:func:`rms_norm_ratio` on one block of rows."""
    x32, r, w32, root = _reference(x, weight, eps)
    reference = x32 * r * w32
    dtypes = (x.dtype, y.dtype) + ((weight.dtype,) if weight is not None else ())
    relative = FP32_UNIT_ROUNDOFF * (2.0 * root + 20.0) + 4.0 * _coarse_unit(*dtypes)
    observed = _rows(y, x.shape[-1])
    return elementwise_ratio(observed, reference, reference.abs(), relative)


def _rms_norm_dgrad_rows(
    dx: torch.Tensor,
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float | None,
) -> torch.Tensor:
    """:func:`rms_norm_dgrad_ratio` on one block of rows."""
    x32, r, w32, root = _reference(x, weight, eps)
    xhat = x32 * r
    g = _rows(dy, x.shape[-1]) * w32
    m = (g * xhat).mean(dim=1, keepdim=True)
    reference = r * (g - xhat * m)
    # The terms' magnitudes: r g, r x̂ m, and r x̂ mean(|g x̂|), the size of m's rounding (m
    # itself can cancel to ~0 while its terms do not).
    a, b = r * g.abs(), r * (xhat * m).abs()
    c = r * xhat.abs() * (g * xhat).abs().mean(dim=1, keepdim=True)
    u, coarse = FP32_UNIT_ROUNDOFF, _coarse_unit(dx.dtype, dy.dtype, x.dtype)
    bound = u * ((2.0 * root + 20.0) * a + (6.0 * root + 48.0) * b + (2.0 * root + 6.0) * c)
    bound = bound + coarse * (a + c + reference.abs())
    return elementwise_ratio(_rows(dx, x.shape[-1]), reference, bound, 1.0)


def rms_norm_ratio(
    y: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float | None,
    *,
    chunk: int | None = None,
) -> torch.Tensor:
    """Forward check: every ``y_i`` against ``w_i x_i r`` recomputed (0-dim fp32; module
    docstring). ``y`` and ``x`` have the normalised features last. In blocks of rows of at most
    ``chunk`` elements (:func:`.rows.row_block_max`)."""
    features = x.shape[-1]

    def block(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return _rms_norm_rows(y, x, weight, eps)

    views = (y.reshape(-1, features), x.reshape(-1, features))
    return row_block_max(block, features, *views, chunk=chunk)


def rms_norm_dgrad_ratio(
    dx: torch.Tensor,
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float | None,
    *,
    chunk: int | None = None,
) -> torch.Tensor:
    """Backward check: every ``dx_i`` against ``r (g_i - x̂_i m)`` recomputed (0-dim fp32;
    module docstring). In blocks of rows of at most ``chunk`` elements
    (:func:`.rows.row_block_max`)."""
    features = x.shape[-1]

    def block(dx: torch.Tensor, dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return _rms_norm_dgrad_rows(dx, dy, x, weight, eps)

    views = [t.reshape(-1, features) for t in (dx, dy, x)]
    return row_block_max(block, features, *views, chunk=chunk)


def rms_norm_wgrad_ratio(
    dw: torch.Tensor,
    dy: torch.Tensor,
    x: torch.Tensor,
    eps: float | None,
    *,
    chunk: int | None = None,
) -> torch.Tensor:
    """Weight-gradient check: every ``dw_i`` against ``Σ_rows dy_i x_i r`` recomputed (0-dim
    fp32; module docstring). The terms are widened in blocks of rows (:func:`.rows.row_blocks`,
    at most ``chunk`` elements), their column sums, magnitudes and squares added up over the
    blocks (one block when the tensor fits: the sums over all rows at once)."""
    features = x.shape[-1]
    x_rows, dy_rows = x.reshape(-1, features), dy.reshape(-1, features)
    rows = x_rows.shape[0]
    totals: list[torch.Tensor] | None = None
    for block in row_blocks(rows, features, chunk):
        x32, r, _, _ = _reference(x_rows[block], None, eps)
        terms = _rows(dy_rows[block], features) * x32 * r
        parts = [terms.sum(dim=0), terms.abs().sum(dim=0), terms.square().sum(dim=0)]
        totals = parts if totals is None else [t + p for t, p in zip(totals, parts, strict=True)]
    assert totals is not None
    reference, spread, squares = totals
    root = math.sqrt(features)
    u, coarse = FP32_UNIT_ROUNDOFF, _coarse_unit(dw.dtype, dy.dtype, x.dtype)
    walk = squares.sqrt()
    bound = u * (2.0 * (1.0 + math.sqrt(rows)) * walk + (2.0 * root + 16.0) * spread)
    # A 16-bit x̂ (Hugging Face rounds x r to the input's dtype) errs in every term at random.
    bound = bound + 3.0 * coarse * walk
    return elementwise_ratio(dw.detach().reshape(-1).float(), reference, bound, 1.0)


# ---------------------------------------------------------------- finding RMSNorm modules
def rms_norm_epsilon(module: nn.Module) -> tuple[bool, float | None]:
    """Whether ``module`` computes an RMSNorm (module docstring), and its epsilon (None:
    ``nn.RMSNorm``'s dtype-dependent default)."""
    if type(module) is nn.RMSNorm:
        ok = len(module.normalized_shape) == 1
        return ok, module.eps
    if any(True for _ in module.children()):
        return False, None
    params = dict(module.named_parameters(recurse=False))
    weight = params.get("weight")
    if set(params) != {"weight"} or weight is None or weight.dim() != 1:
        return False, None
    eps = next(
        (getattr(module, n) for n in EPS_NAMES if isinstance(getattr(module, n, None), float)),
        None,
    )
    if eps is None or weight.device.type == "meta":
        return False, None
    return _probe(module, weight, eps), eps


def _probe(module: nn.Module, weight: nn.Parameter, eps: float) -> bool:
    """Run ``module`` on a probe input with a probe weight (restored bit for bit) and compare
    with the RMSNorm formula: a module that computes anything else fails."""
    gen = torch.Generator().manual_seed(_PROBE_SEED)
    features = weight.shape[0]
    x = (torch.randn(3, features, generator=gen) + 1.0).to(weight.device, weight.dtype)
    probe_weight = (1.0 + 0.5 * torch.randn(features, generator=gen)).to(weight.device)
    saved = weight.detach().clone()
    try:
        with torch.no_grad():
            weight.copy_(probe_weight.to(weight.dtype))
            device = weight.device.type
            with torch.autocast(device, enabled=False):
                y = module(x)
    except Exception:  # a module that cannot run on a probe is not one we can check
        return False
    finally:
        with torch.no_grad():
            weight.copy_(saved)
    if not isinstance(y, torch.Tensor) or y.shape != x.shape:
        return False
    x32 = x.float()
    expected = x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps)
    expected = expected * probe_weight.to(weight.dtype).float()
    tolerance = 8 * torch.finfo(weight.dtype).eps * float(expected.abs().max()) + 1e-30
    return bool((y.float() - expected).abs().max() <= tolerance)


# ---------------------------------------------------------------- the sensor, on hooks
_MAX_NODES = 64  # backward nodes searched from a norm's output for the edges into its input


def _edges_into(
    root: Any, target: torch.autograd.graph.GradientEdge, stop: Any = None
) -> list[tuple[Any, int]]:
    """The (node, input index) pairs of the backward graph below ``root`` whose gradient flows
    into ``target`` (the norm's input or weight): the norm's own ops that read it. The search
    does not go below ``target`` nor ``stop`` (the norm's input: what is below it is the rest of
    the model), stops at parameters, and gives up (returns []) beyond :data:`_MAX_NODES`."""
    found: list[tuple[Any, int]] = []
    seen: set[int] = set()
    todo = [root]
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if len(seen) > _MAX_NODES:
            return []
        for index, (child, output_nr) in enumerate(node.next_functions):
            if child is None:
                continue
            if child is target.node and output_nr == target.output_nr:
                found.append((node, index))
            elif child.next_functions and child is not stop:
                todo.append(child)
    return found


class _Call:
    """One checked call of an RMSNorm: its input, the output's gradient, and the input
    gradient's contributions as they arrive (one per op of the norm that reads its input)."""

    __slots__ = ("dy", "parts", "waiting", "x")

    def __init__(self, x: torch.Tensor, waiting: int) -> None:
        self.x = x
        self.dy: torch.Tensor | None = None
        self.parts: list[torch.Tensor] = []
        self.waiting = waiting


class RMSNormSensor(OpSensor):
    """The sensors of one RMSNorm module (output and input gradient), installed on it by hooks;
    the module gets the attributes fault drills and the guard look for (``sensor_board``,
    ``sensor_ops``, ``gemm_taps``, ``layer_name``).

    Nothing is inserted into the autograd graph: the output's gradient is read by a pre-hook of
    the output's backward node, and the input gradient by hooks on the norm's own backward nodes
    that read the input (Hugging Face's RMSNorm has two: the product ``x r`` and the square in
    ``mean(x²)``; their contributions sum to ``dx``). So the gradients accumulate into the input
    exactly as without the sensor, checked or not. A fault drill's ``dgrad`` corrupts the sum of the
    contributions (the difference is added to the last one to arrive), its ``forward`` a copy of
    the output."""

    sensor_ops: tuple[Gemm, ...] = ("forward", "dgrad", "wgrad")

    def __init__(self, module: nn.Module, board: SensorBoard, name: str, eps: float | None) -> None:
        """Register the sensors of ``module`` (an RMSNorm, see :func:`rms_norm_epsilon`)."""
        self.module = module
        self.eps = eps
        features = self.features()
        # Per row of D: the forward check reads x and y (~7 D) against the norm's ~5 D; the
        # input-gradient check ~16 D against the backward's ~10 D; the weight gradient's ~5 D
        # against its ~2 D.
        costs = [(7 * features, 5 * features), (16 * features, 10 * features)]
        self._attach_sensor(board, name, "rms_norm", [*costs, (5 * features, 2 * features)])
        self._inputs: list[torch.Tensor | None] = []
        self._weight_calls: dict[int, list[_Call]] = {}  # per accumulation node, this backward
        for attribute in ("sensor_board", "sensor_base", "layer_name", "gemm_taps", "sensor_ops"):
            setattr(module, attribute, getattr(self, attribute))
        module.register_forward_pre_hook(self._before)
        module.register_forward_hook(self._after, always_call=True)

    def features(self) -> int:
        """D: the normalised features."""
        weight = self.weight()
        if weight is not None:
            return weight.shape[0]
        shape: Any = self.module.normalized_shape  # nn.Module's __getattr__ types it loosely
        return int(shape[0])  # nn.RMSNorm without affine weight

    def weight(self) -> torch.Tensor | None:
        """The module's weight (None for ``nn.RMSNorm(elementwise_affine=False)``)."""
        return getattr(self.module, "weight", None)

    def _before(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        x = args[0] if args else None
        wanted = isinstance(x, torch.Tensor) and x.shape[-1:] == (self.features(),)
        self._inputs.append(x if wanted and self.sensing() else None)

    def _after(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
        x = self._inputs.pop() if self._inputs else None
        if x is None or not isinstance(output, torch.Tensor):
            return None
        out = output
        if self.gemm_taps:
            out = output.clone()  # a drill corrupts a copy (the kernel's output may be saved)
            with torch.no_grad(), outside_function_modes():
                self.tap("forward", out)
        with torch.no_grad(), outside_function_modes():
            if self.checks("forward"):
                self.record("forward", rms_norm_ratio(out, x, self.weight(), self.eps))
        backward = self.gemm_taps or self.checks("dgrad") or self.checks("wgrad")
        if out.grad_fn is not None and backward:
            self._watch_backward(out, x)
        return out if out is not output else None

    def _watch_backward(self, out: torch.Tensor, x: torch.Tensor) -> None:
        """Hook the output's backward node (dy), the norm's nodes that read x (dx's parts) and
        those that read the weight (which arm a one-shot check of the weight's gradient)."""
        call = _Call(x.detach(), 0)
        dy_node = out.grad_fn
        assert dy_node is not None  # _after watches only an output with a grad_fn

        def took_dy(grad_outputs: tuple[torch.Tensor | None, ...]) -> None:
            call.dy = grad_outputs[0]

        dy_node.register_prehook(took_dy)
        if x.requires_grad:
            edges = _edges_into(out.grad_fn, torch.autograd.graph.get_gradient_edge(x))
            call.waiting = len(edges)
            check = self.checks("dgrad")
            for node, index in edges:
                node.register_hook(self._part_hook(call, index, check))
        weight = self.weight()
        if weight is not None and weight.requires_grad:
            target = torch.autograd.graph.get_gradient_edge(weight)
            below = torch.autograd.graph.get_gradient_edge(x).node if x.requires_grad else None
            producers = _edges_into(out.grad_fn, target, stop=below)
            if len(producers) == 1:  # the one product by w: its gradient is this call's dw
                node, _ = producers[0]
                node.register_hook(lambda grads, outputs: self._arm_wgrad(call, target.node))

    def _arm_wgrad(self, call: _Call, accumulate: Any) -> None:
        """In this backward, before the weight's gradient is accumulated: check (and tap) it."""
        calls = self._weight_calls.setdefault(id(accumulate), [])
        calls.append(call)
        if len(calls) > 1:
            return  # armed already by another call of this norm in this backward

        handle: list[Any] = []

        def check(grad_outputs: tuple[Any, ...]) -> Any:
            handle[0].remove()
            mine = self._weight_calls.pop(id(accumulate), [])
            dw = grad_outputs[0]
            if dw is None or len(mine) != 1 or mine[0].dy is None:
                return None  # several calls summed into one gradient: not this check's
            replaced = None
            with torch.no_grad(), outside_function_modes():
                if self.gemm_taps:
                    dw = dw.clone()
                    self.tap("wgrad", dw)
                    replaced = (dw, *grad_outputs[1:])
                if self.checks("wgrad"):
                    self.record("wgrad", rms_norm_wgrad_ratio(dw, mine[0].dy, mine[0].x, self.eps))
            return replaced

        handle.append(accumulate.register_prehook(check))

    def _part_hook(self, call: _Call, index: int, check: bool) -> Any:
        def hook(grad_inputs: tuple[Any, ...], grad_outputs: tuple[Any, ...]) -> Any:
            part = grad_inputs[index]
            call.waiting -= 1
            if part is not None:
                call.parts.append(part)
            if call.waiting or not call.parts:
                return None
            # The last part: the norm's whole input gradient is known.
            replaced = None
            with torch.no_grad(), outside_function_modes():
                dx = call.parts[0].float()
                for more in call.parts[1:]:
                    dx = dx + more.float()
                if self.gemm_taps and part is not None:
                    # A drill corrupts dx as a whole (x1.1 of one element of the sum): the
                    # difference goes into this last part, so training sees the corrupted sum.
                    corrupted = dx.to(part.dtype, copy=True)
                    self.tap("dgrad", corrupted)
                    part = part + (corrupted.float() - dx).to(part.dtype)
                    replaced = (*grad_inputs[:index], part, *grad_inputs[index + 1 :])
                    dx = corrupted.float()
                if check and call.dy is not None:
                    ratio = rms_norm_dgrad_ratio(
                        dx.to(call.parts[0].dtype), call.dy, call.x, self.weight(), self.eps
                    )
                    self.record("dgrad", ratio)
            call.parts.clear()
            return replaced

        return hook


def attach(module: nn.Module, board: SensorBoard, name: str) -> RMSNormSensor | None:
    """Put an RMSNorm sensor on ``module`` when it is one (:func:`rms_norm_epsilon`), else None."""
    found, eps = rms_norm_epsilon(module)
    if not found:
        return None
    return RMSNormSensor(module, board, name, eps)

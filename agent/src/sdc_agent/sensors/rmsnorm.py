"""RMSNorm sensors: any module computing ``y = x * rsqrt(mean(x²) + eps) * w``, found and checked
without changing its code.

Which modules: ``nn.RMSNorm`` (one normalised dimension), and any leaf module with one 1-D
``weight`` and an ``eps`` (or ``variance_epsilon``/``epsilon``) attribute whose output, on a probe
input and a probe weight (put back bit for bit afterwards), is the formula above: Hugging Face's
``LlamaRMSNorm`` (and its copies in other models), torchtitan's, T5's. A variant that computes
something else (Gemma's ``x̂ (1 + w)``, a layer norm without bias) fails the probe and is left
alone. The module keeps its own forward: :func:`attach` adds a forward pre-hook and a forward hook
that wrap its input and output in identity autograd functions when a sensor checks, so its values,
parameters and ``state_dict`` are untouched (``protect()`` keeps outputs bit for bit).

Forward (:func:`rms_norm_ratio`), per row of D features, with ``r = (mean(x²) + eps)^-1/2``
recomputed in fp32 from the input::

    y @ 1 = r (x @ w)

Unlike a layer norm's mean, ``r`` is well conditioned (a sum of squares), so recomputing it is
safe: the kernel's ``r̂`` and ours differ by ``δ <= u (sqrt(D) + 8)`` relative (the D-term sum of
squares as a random walk of roundings, then a division, an addition, a square root, halved by
the root, plus ``rsqrt``'s own ulps). The row sum then differs by ``δ |r (x @ w)|`` from ``r̂``,
each element ``y_i = w_i (x_i r̂)`` carries two roundings (``2 u r |x_i w_i|``, a random walk
``2 u r |x ⊙ w|`` over the row), and the two D-term sums (ours and the observed one) add
``u (1 + sqrt(D)) r |x ⊙ w|`` each::

    bound_r = u ((sqrt(D) + 8) |r (x @ w)| + (2 + 2 (1 + sqrt(D))) r |x ⊙ w|)

plus, when the input, weight or output is a 16-bit dtype, the same terms for its rounding
(Hugging Face rounds ``x r`` to the input's dtype before multiplying by ``w``: two 16-bit
roundings per element, and ``r`` itself may be computed in 16 bits): ``2 u_16 (|r (x @ w)| +
2 r |x ⊙ w|)``. Every term comes from the input and the weight, not from the output checked.

Backward (:func:`rms_norm_dgrad_ratio`): with ``x̂ = x r``, ``g = dy ⊙ w`` and ``m = mean(g ⊙ x̂)``
the input gradient is ``dx = r (g - x̂ m)``. Its row sum and its row dotted with ``x̂``::

    Σ dx       = r (Σg - m Σx̂)
    Σ dx ⊙ x̂   = r m (D - Σx̂²) = r³ eps D m

The first catches any wrong element of dx (its whole error moves the sum), the second a wrong
``m`` (which shifts dx by a multiple of ``x̂``, invisible to the first when ``Σx̂ ≈ 0``). Each
element errs by a few roundings of ``e_i = r (|g_i| + |x̂_i m|)``; ``r`` by ``δ`` as above (dx is
of degree 1 in ``r`` through ``g r`` and 3 through ``x̂ m``); ``m`` by a ``D``-term sum. Bounds::

    bound1 = u (2 (1 + sqrt(D)) |e| + 3 (sqrt(D) + 8) r (|Σg| + |m Σx̂|) + 2 r |g ⊙ x̂| |Σx̂| / sqrt(D))
    bound2 = u (2 (1 + sqrt(D)) |e ⊙ (1 + |x̂|)| + 3 (sqrt(D) + 8) |e| |x̂|)

plus the 16-bit terms ``2 u_16`` times the same magnitudes when dy, dx or x is 16-bit (the
contributions are summed in fp32 for the check: one more rounding of each, inside the bound). Healthy
ratios and detection are measured by tests/unit/test_sensor_llama.py (and
``docs/performance.md``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from .board import Gemm, SensorBoard
from .rows import FP32_UNIT_ROUNDOFF, OpSensor, outside_function_modes, worst_row_ratio

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


def rms_norm_ratio(
    y: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, eps: float | None
) -> torch.Tensor:
    """Forward check: each output row's sum against ``r (x @ w)`` (0-dim fp32; module
    docstring). ``y`` and ``x`` have the normalised features last."""
    features = x.shape[-1]
    x32, y32 = _rows(x, features), _rows(y, features)
    r = torch.rsqrt(x32.square().mean(dim=1) + _epsilon(eps, x.dtype))
    xw = x32 * weight.detach().float() if weight is not None else x32
    expected = r * xw.sum(dim=1)
    spread = r * torch.linalg.vector_norm(xw, dim=1)
    root = math.sqrt(features)
    bound = FP32_UNIT_ROUNDOFF * ((root + 8.0) * expected.abs() + (4.0 + 2.0 * root) * spread)
    dtypes = (x.dtype, y.dtype) + ((weight.dtype,) if weight is not None else ())
    bound = bound + 2.0 * _coarse_unit(*dtypes) * (expected.abs() + 2.0 * spread)
    return worst_row_ratio(y32.sum(dim=1), expected, bound)


def rms_norm_dgrad_ratio(
    dx: torch.Tensor,
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float | None,
) -> torch.Tensor:
    """Backward check: the input gradient's row sum and its row dotted with ``x̂`` against the
    module docstring's identities (0-dim fp32, the larger of the two ratios)."""
    features = x.shape[-1]
    x32, dx32, dy32 = _rows(x, features), _rows(dx, features), _rows(dy, features)
    eps_value = _epsilon(eps, x.dtype)
    r = torch.rsqrt(x32.square().mean(dim=1, keepdim=True) + eps_value)
    xhat = x32 * r
    g = dy32 * weight.detach().float() if weight is not None else dy32
    m = (g * xhat).mean(dim=1, keepdim=True)
    sum_g, sum_xhat = g.sum(dim=1, keepdim=True), xhat.sum(dim=1, keepdim=True)
    expected1 = r * (sum_g - m * sum_xhat)
    expected2 = r.pow(3) * eps_value * features * m
    e = r * (g.abs() + (xhat * m).abs())
    root = math.sqrt(features)
    walk, scale = 2.0 * (1.0 + root), 3.0 * (root + 8.0)
    norm_e = torch.linalg.vector_norm(e, dim=1, keepdim=True)
    norm_gx = torch.linalg.vector_norm(g * xhat, dim=1, keepdim=True)
    magnitude1 = (
        walk * norm_e
        + scale * r * (sum_g.abs() + (m * sum_xhat).abs())
        + 2.0 * r * norm_gx * sum_xhat.abs() / root
    )
    norm_xhat = torch.linalg.vector_norm(xhat, dim=1, keepdim=True)
    magnitude2 = (
        walk * torch.linalg.vector_norm(e * (1.0 + xhat.abs()), dim=1, keepdim=True)
        + scale * norm_e * norm_xhat
    )
    coarse = 2.0 * _coarse_unit(dx.dtype, dy.dtype, x.dtype)
    bound1 = (FP32_UNIT_ROUNDOFF + coarse) * magnitude1
    bound2 = (FP32_UNIT_ROUNDOFF + coarse) * magnitude2
    first = worst_row_ratio(dx32.sum(dim=1), expected1.reshape(-1), bound1.reshape(-1))
    second = worst_row_ratio((dx32 * xhat).sum(dim=1), expected2.reshape(-1), bound2.reshape(-1))
    return torch.maximum(first, second)


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


def _edges_into(root: Any, target: torch.autograd.graph.GradientEdge) -> list[tuple[Any, int]]:
    """The (node, input index) pairs of the backward graph below ``root`` whose gradient flows
    into ``target`` (the norm's input): the norm's own ops that read its input. The search stops
    at the input and at parameters, and gives up (returns []) beyond :data:`_MAX_NODES` nodes."""
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
            elif child.next_functions:
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
    exactly as without the sensor, checked or not. A fault drill's ``dgrad`` corrupts the first
    contribution to arrive, its ``forward`` a copy of the output."""

    sensor_ops: tuple[Gemm, ...] = ("forward", "dgrad")

    def __init__(self, module: nn.Module, board: SensorBoard, name: str, eps: float | None) -> None:
        """Register the sensors of ``module`` (an RMSNorm, see :func:`rms_norm_epsilon`)."""
        self.module = module
        self.eps = eps
        features = self.features()
        # Per row of D: the forward check reads x and y, squares, two dots (~7 D) against the
        # norm's ~5 D; the backward check ~16 D against the backward's ~10 D.
        self._attach_sensor(
            board, name, "rms_norm", [(7 * features, 5 * features), (16 * features, 10 * features)]
        )
        self._inputs: list[torch.Tensor | None] = []
        for attribute in ("sensor_board", "sensor_base", "layer_name", "gemm_taps", "sensor_ops"):
            setattr(module, attribute, getattr(self, attribute))
        module.register_forward_pre_hook(self._before)
        module.register_forward_hook(self._after, always_call=True)

    def features(self) -> int:
        """D: the normalised features."""
        weight = self.weight()
        if weight is not None:
            return weight.shape[0]
        return int(self.module.normalized_shape[0])  # nn.RMSNorm without affine weight

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
        if out.grad_fn is not None and x.requires_grad and (self.gemm_taps or self.checks("dgrad")):
            self._watch_backward(out, x)
        return out if out is not output else None

    def _watch_backward(self, out: torch.Tensor, x: torch.Tensor) -> None:
        """Hook the output's backward node (dy) and the norm's nodes that read x (dx's parts)."""
        edges = _edges_into(out.grad_fn, torch.autograd.graph.get_gradient_edge(x))
        if not edges:
            return
        call = _Call(x.detach(), len(edges))
        check = self.checks("dgrad")

        def took_dy(grad_outputs: tuple[torch.Tensor | None, ...]) -> None:
            call.dy = grad_outputs[0]

        out.grad_fn.register_prehook(took_dy)
        for node, index in edges:
            node.register_hook(self._part_hook(call, index, check))

    def _part_hook(self, call: _Call, index: int, check: bool) -> Any:
        def hook(grad_inputs: tuple[Any, ...], grad_outputs: tuple[Any, ...]) -> Any:
            part = grad_inputs[index]
            replaced = None
            if part is not None and not call.parts and self.gemm_taps:
                with torch.no_grad():
                    part = part.clone()
                    self.tap("dgrad", part)
                replaced = (*grad_inputs[:index], part, *grad_inputs[index + 1 :])
            if part is not None:
                call.parts.append(part)
            call.waiting -= 1
            if call.waiting == 0 and check and call.dy is not None and call.parts:
                with torch.no_grad():
                    dx = call.parts[0].float()
                    for more in call.parts[1:]:
                        dx = dx + more.float()
                    ratio = rms_norm_dgrad_ratio(
                        dx.to(call.parts[0].dtype), call.dy, call.x, self.weight(), self.eps
                    )
                    self.record("dgrad", ratio)
            return replaced

        return hook


def attach(module: nn.Module, board: SensorBoard, name: str) -> RMSNormSensor | None:
    """Put an RMSNorm sensor on ``module`` when it is one (:func:`rms_norm_epsilon`), else None."""
    found, eps = rms_norm_epsilon(module)
    if not found:
        return None
    return RMSNormSensor(module, board, name, eps)

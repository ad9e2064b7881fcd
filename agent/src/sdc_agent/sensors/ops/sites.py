"""Checked ops that have no module of their own: the functions a model calls in its forward.

A real LLM block writes most of its ops as function calls, not modules: the residual adds
(``h = x + attn(x)``), the SwiGLU activation (``F.silu(w1(x)) * w3(x)`` in torchtitan; an
``act_fn`` module calling ``F.silu`` in Hugging Face), the attention
(``F.scaled_dot_product_attention``) and the loss (``F.cross_entropy``, inside the forward of a
Hugging Face ``...ForCausalLM`` given ``labels``). :func:`sdc_agent.sensors.protect` reaches them
without any change to the model's code by one :class:`torch.overrides.TorchFunctionMode`
(:class:`~sdc_agent._function_mode.RoutingMode` over the sites' handlers), entered while a
module of the protected model runs its forward (a forward pre-hook and an ``always_call`` forward hook on every module keep the stack of running modules).
The mode sees every torch function called in those forwards and routes these few to their
checked versions:

============================== ============== ===========================================
function                       sensor kind    check
============================== ============== ===========================================
``F.silu``, ``F.gelu``         activation     output and input gradient recomputed
                                              element-wise (:mod:`.elementwise`)
``a + b`` (``Tensor.add``,     add            the sum recomputed element-wise in fp32
``torch.add``; two tensors of                 (:func:`.elementwise.add_ratio`)
one shape)
``a * b`` (two tensors, one    mul            the product (SwiGLU's gate times up, the
broadcast to the other)                       rotary ``q * cos``) and its input
                                              gradients, recomputed element-wise
``F.embedding``                embedding      the lookup gathered again; the weight
                                              gradient's column sums
``F.scaled_dot_product_``      attention      only with ``protect(attention="checked")``:
``attention``                                 the unfused checked path (:mod:`.attention`)
``F.cross_entropy``            cross_entropy  log-softmax rows and the loss gradient
                                              (:mod:`.loss`)
============================== ============== ===========================================

Every other function runs untouched, and the checked versions compute the same values as the
plain calls (the same kernels, forward and backward), except the checked attention path, which
replaces the fused kernel and therefore runs in training and in every replay alike.

A *site* is one of these functions called inside one module's forward; its sensor is named
``"<module>/<function>"`` (``model.layers.0.mlp.act_fn/silu``, ``model.layers.1/add``,
``/cross_entropy`` for the model's own forward), and every call of that function in that
module's forward (the decoder layer's two residual adds) is checked by the one sensor, which
reports the largest ratio. Sites are found when they first run: in the model's first forward
and backward, before the guard plans the sensors (at its second step, once it knows the batch's
rows), and on every rank alike (the same code runs everywhere), so every rank registers the
same sensors in the same order. A site that first runs after the plan was made (a branch the
first step did not take) is registered but not in the budget's rotation (it checks in the
guard's burn-in only), and says so once in the log.

The mode costs a Python call per torch function in a module's forward (about 5 µs each on the
CPU), so it is entered only when it has work: on a step where some sensor checks (every step of
the guard's burn-in and at full coverage, one in ``period`` at the default budget), while a
fault drill taps a site, in the model's first forward (discovery), and always with the checked
attention path (whose values must not depend on whether a sensor checks). Activation
checkpointing's recompute comparisons (:mod:`.recompute`) ride on the same hooks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..._function_mode import RoutingMode
from ..runtime.board import Gemm, SensorBoard
from . import attention, loss
from .elementwise import ActivationFunction, EmbeddingFunction, MulFunction, add_ratio
from .recompute import RecomputeComparisons, in_backward
from .rows import OpSensor

logger = logging.getLogger("sdc_agent")

SEPARATOR = "/"
"""Between a site's module name and its function: module names never contain it."""

FUNCTIONS: dict[str, tuple[str, tuple[Gemm, ...]]] = {
    "silu": ("activation", ("forward", "dgrad")),
    "gelu": ("activation", ("forward", "dgrad")),
    "add": ("add", ("forward",)),
    "mul": ("mul", ("forward", "dgrad")),
    "embedding": ("embedding", ("forward", "wgrad")),
    "scaled_dot_product_attention": ("attention", ("forward", "dgrad")),
    "cross_entropy": ("cross_entropy", ("forward", "dgrad")),
    "recompute": ("recompute", ("forward",)),
}
"""Per function a site can check: its sensor kind and ops (``forward``: the result, ``dgrad``:
the input gradient; ``recompute``: the comparison of a checkpointed block's recomputation)."""


def site_name(module: str, function: str) -> str:
    """The sensor name of ``function`` called in the forward of the module named ``module``."""
    return f"{module}{SEPARATOR}{function}"


class Site(OpSensor):
    """One function called inside one module's forward: its sensors, registered on the board
    the first time it runs (fault drills may tap it before that)."""

    def __init__(self, name: str, function: str) -> None:
        """An unregistered site named ``name`` (:func:`site_name`) for ``function``."""
        kind, ops = FUNCTIONS[function]
        self.layer_name = name
        self.function = function
        self.kind = kind
        self.sensor_ops = ops
        self.gemm_taps = []
        self.registered = False

    def register(
        self, board: SensorBoard, costs: list[tuple[int, int]], fixed: list[int] | None = None
    ) -> None:
        """Register this site's sensors on ``board`` (per-row ``costs`` of each op, and the
        elements each op's check reads once whatever the batch, ``fixed``)."""
        self.sensor_board = board
        self.sensor_base = board.register_op(
            self.layer_name, self.kind, self.sensor_ops, costs, fixed
        )
        self.registered = True

    def checks(self, op: Gemm) -> bool:
        """Whether the sensor of ``op`` checks now (never before registration)."""
        return self.registered and super().checks(op)

    def sensing(self) -> bool:
        """Whether a sensor of this site checks now, or a drill taps it."""
        return bool(self.gemm_taps) or (
            self.registered and any(self.checks(op) for op in self.sensor_ops)
        )


def _rows(board: SensorBoard, t: torch.Tensor) -> int:
    """The batch's rows for the cost model: what the protected linear layers saw, else this
    tensor's rows along its last dimension."""
    if board.rows:
        return board.rows
    return max(1, t.numel() // max(1, t.shape[-1] if t.dim() else 1))


class FunctionSensors:
    """The sites of one protected model: the module stack, the mode, the handlers, the
    recompute comparisons. Made by :func:`sdc_agent.sensors.protect` (``functions=True``)."""

    def __init__(
        self,
        model: nn.Module,
        board: SensorBoard,
        *,
        attention_mode: str = "fused",
        recompute: bool = True,
        include: Callable[[str, nn.Module], bool] | None = None,
    ) -> None:
        """Hook every module of ``model``; ``attention_mode``: ``fused`` (SDPA untouched) or
        ``checked`` (:mod:`.attention`); ``recompute``: compare checkpointed recomputations;
        ``include(name, module)``: the modules whose function calls are checked (default: all;
        the others' calls run plain)."""
        if attention_mode not in attention.ATTENTION_MODES:
            raise ValueError(
                f"protect: attention must be one of {attention.ATTENTION_MODES}, "
                f"got {attention_mode!r}"
            )
        self.board = board
        self.attention_mode = attention_mode
        self.sites: dict[str, Site] = {}
        """Every site by name (registered or only tapped so far)."""
        self.modules: dict[str, nn.Module] = dict(model.named_modules())
        # Modules with sensors of their own (linear layers, norms, softmax): their internals
        # are theirs, and their checks' own arithmetic runs inside them (under this mode).
        self.excluded = frozenset(
            n
            for n, m in self.modules.items()
            if (include is not None and not include(n, m)) or "sensor_board" in m.__dict__
        )
        self.stack: list[str] = []
        """Names of the modules whose forward runs now (innermost last), while tracking."""
        self.forwards = 0
        """The model's forwards so far (outside backward passes): the first is tracked whatever
        checks (discovery), and a site first met after it is late for the plan."""
        self._depth = 0
        self._tracking = False
        self._mode: RoutingMode | None = None
        self._late: set[str] = set()
        self.recompute = RecomputeComparisons(self) if recompute else None
        self.handlers: dict[Callable[..., Any], Callable[..., Any]] = {
            F.silu: self._silu,
            F.gelu: self._gelu,
            torch.Tensor.add: self._add,
            torch.Tensor.__add__: self._add,
            torch.add: self._add,
            torch.Tensor.mul: self._mul,
            torch.Tensor.__mul__: self._mul,
            torch.mul: self._mul,
            F.cross_entropy: self._cross_entropy,
            F.embedding: self._embedding,
        }
        if attention_mode == "checked":
            self.handlers[F.scaled_dot_product_attention] = self._attention
        for name, module in self.modules.items():
            module.register_forward_pre_hook(self._pre_hook(name), with_kwargs=True)
            module.register_forward_hook(self._post_hook(name), always_call=True)
        model.sensor_sites = self  # type: ignore[assignment]  # nn.Module types attributes Tensor | Module

    # ------------------------------------------------------------------ sites
    def site(self, module: str, function: str) -> Site:
        """The site of ``function`` in the forward of ``module`` (made on first use)."""
        name = site_name(module, function)
        found = self.sites.get(name)
        if found is None:
            found = self.sites[name] = Site(name, function)
        return found

    def lookup(self, name: str) -> Site:
        """The site named ``name`` for a fault drill (made now if it has not run yet).

        Raises ValueError naming the problem when ``name`` cannot be a site of this model."""
        module, _, function = name.rpartition(SEPARATOR)
        if module not in self.modules:
            raise ValueError(f"no module {module!r} in the protected model (site {name!r})")
        if function not in FUNCTIONS:
            raise ValueError(
                f"site {name!r}: {function!r} is not a checked function "
                f"(one of {sorted(FUNCTIONS)})"
            )
        if function == "scaled_dot_product_attention" and self.attention_mode != "checked":
            raise ValueError(
                f"site {name!r}: attention is checked only with protect(attention='checked')"
            )
        return self.site(module, function)

    def _current(self, function: str) -> Site | None:
        """The site of ``function`` in the innermost running module (None: not included)."""
        module = self.stack[-1] if self.stack else ""
        return None if module in self.excluded else self.site(module, function)

    def ensure_registered(
        self,
        site: Site,
        costs: Callable[[], list[tuple[int, int]]],
        fixed: Callable[[], list[int]] | None = None,
    ) -> None:
        """Register ``site`` the first time it runs (``costs``, ``fixed``: :meth:`Site.register`'s)."""
        if site.registered:
            return
        site.register(self.board, costs(), fixed() if fixed is not None else None)
        # The guard plans at its second step, from the sites the first forward and backward met.
        if self.forwards > 1 and site.layer_name not in self._late:
            self._late.add(site.layer_name)
            logger.warning(
                "sdc_agent: sensor site %s first ran after the sensor plan was made: checked "
                "only in the burn-in, not in the budget's rotation",
                site.layer_name,
            )

    # ------------------------------------------------------------------ tracking
    def _wanted(self) -> bool:
        """Whether this forward needs the mode (module docstring)."""
        if self.board.active_layers or self.attention_mode == "checked" or self.forwards <= 1:
            return True
        return any(site.gemm_taps for site in self.sites.values())

    def _pre_hook(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            outermost = self._depth == 0
            if outermost:
                if not in_backward():
                    self.forwards += 1
                self._tracking = self._wanted()
                if self._tracking:
                    self._mode = RoutingMode(self.handlers)
                    self._mode.__enter__()
            self._depth += 1
            if self._tracking:
                self.stack.append(name)
                if self.recompute is not None:
                    self.recompute.before(name, module, args, kwargs)

        return hook

    def _post_hook(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            if self._tracking and self.stack:
                self.stack.pop()
                if self.recompute is not None:
                    self.recompute.after(name)
            self._depth = max(0, self._depth - 1)
            if self._depth == 0 and self._mode is not None:
                mode, self._mode = self._mode, None
                self._tracking = False
                self.stack.clear()
                mode.__exit__(None, None, None)

        return hook

    # ------------------------------------------------------------------ handlers
    def _silu(self, func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        return self._activation("silu", func, args, kwargs, "none")

    def _gelu(self, func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        names = ("input", "approximate")
        bound = dict(zip(names, args, strict=False)) | kwargs
        return self._activation("gelu", func, args, kwargs, bound.get("approximate", "none"))

    def _activation(
        self, name: str, func: Callable[..., Any], args: tuple, kwargs: dict, approximate: str
    ) -> Any:
        x = args[0] if args else kwargs.get("input")
        inplace = kwargs.get("inplace", args[1] if name == "silu" and len(args) > 1 else False)
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or inplace:
            return func(*args, **kwargs)
        if approximate not in ("none", "tanh") or (name == "silu" and len(args) > 2):
            return func(*args, **kwargs)
        site = self._current(name)
        if site is None:
            return func(*args, **kwargs)
        self.ensure_registered(site, lambda: self._elementwise_costs(x, 10, 4, (14, 8)))
        if not site.sensing():
            return func(*args, **kwargs)
        return ActivationFunction.apply(x, site, name, approximate)

    def _add(self, func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        out = func(*args, **kwargs)
        if kwargs or len(args) != 2 or not isinstance(out, torch.Tensor):
            return out
        a, b = args
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return out
        if a.shape != b.shape or not out.is_floating_point() or out.numel() == 0:
            return out  # a bias, a mask, a scalar: not two activations
        site = self._current("add")
        if site is None:
            return out
        self.ensure_registered(site, lambda: self._elementwise_costs(out, 5, 1))
        if site.sensing():
            with torch.no_grad():
                site.tap("forward", out)
                if site.checks("forward"):
                    site.record("forward", add_ratio(out.detach(), a.detach(), b.detach()))
        return out

    def _mul(self, func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        if kwargs or len(args) != 2:
            return func(*args, **kwargs)
        a, b = args
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return func(*args, **kwargs)  # a scale by a number
        floating = a.is_floating_point() and b.is_floating_point()
        if not floating or min(a.numel(), b.numel()) <= 1 or a.device != b.device:
            return func(*args, **kwargs)  # a scale by a one-element tensor, an integer mask
        try:
            shape = torch.broadcast_shapes(a.shape, b.shape)
        except RuntimeError:
            return func(*args, **kwargs)  # torch raises the shape error itself
        if shape not in (a.shape, b.shape):
            return func(*args, **kwargs)  # an outer product: not an element-wise gating
        site = self._current("mul")
        if site is None:
            return func(*args, **kwargs)
        big = a if shape == a.shape else b
        self.ensure_registered(site, lambda: self._elementwise_costs(big, 5, 1, (10, 2)))
        if not site.sensing():
            return func(*args, **kwargs)
        return MulFunction.apply(a, b, site)

    def _embedding(self, func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        names = ("input", "weight", "padding_idx", "max_norm", "norm_type")
        bound = dict(zip(names, args, strict=False)) | kwargs
        ids, weight = bound.get("input"), bound.get("weight")
        plain = set(bound) - {"input", "weight", "padding_idx", "max_norm", "norm_type"}
        extra = {k: bound[k] for k in plain}
        if (
            not isinstance(ids, torch.Tensor)
            or not isinstance(weight, torch.Tensor)
            or bound.get("max_norm") is not None
            or any(extra.get(k) for k in ("scale_grad_by_freq", "sparse"))
            or set(extra) - {"scale_grad_by_freq", "sparse"}
            or weight.dim() != 2
        ):
            return func(*args, **kwargs)
        site = self._current("embedding")
        if site is None:
            return func(*args, **kwargs)
        self.ensure_registered(
            site, lambda: self._embedding_costs(weight), lambda: [0, weight.numel()]
        )
        if not site.sensing():
            return func(*args, **kwargs)
        padding = bound.get("padding_idx")
        if padding is None:
            padding = -1
        elif padding < 0:
            padding += weight.shape[0]
        return EmbeddingFunction.apply(ids, weight, padding, site)

    def _attention(self, func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        site = self._current("scaled_dot_product_attention")
        if site is None:
            return func(*args, **kwargs)
        query = args[0] if args else kwargs.get("query")
        key = args[1] if len(args) > 1 else kwargs.get("key")
        if isinstance(query, torch.Tensor) and isinstance(key, torch.Tensor):
            self.ensure_registered(site, lambda: self._attention_costs(query, key))
        out = attention.checked_call(site, args, kwargs)
        return func(*args, **kwargs) if out is None else out

    def _cross_entropy(self, func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        site = self._current("cross_entropy")
        logits = args[0] if args else kwargs.get("input")
        if site is not None and isinstance(logits, torch.Tensor) and logits.dim() == 2:
            self.ensure_registered(site, lambda: self._elementwise_costs(logits, 6, 5, (10, 4)))
            if site.sensing():
                out = loss.checked_call(site, args, kwargs)
                if out is not None:
                    return out
        return func(*args, **kwargs)

    # ------------------------------------------------------------------ cost model
    def _elementwise_costs(
        self, t: torch.Tensor, check: int, op: int, backward: tuple[int, int] | None = None
    ) -> list[tuple[int, int]]:
        """Per-row costs of an element-wise op over ``t``: ``check``/``op`` flops per element
        forward (and ``backward`` for the input gradient)."""
        per_row = max(1, t.numel() // _rows(self.board, t))
        costs = [(check * per_row, op * per_row)]
        if backward is not None:
            costs.append((backward[0] * per_row, backward[1] * per_row))
        return costs

    @staticmethod
    def _embedding_costs(weight: torch.Tensor) -> list[tuple[int, int]]:
        """Per-row costs of the checked embedding over a vocabulary x D ``weight``: the lookup
        gathered again and compared (~3 D a row) against the gather's D; the weight gradient's
        check reads each row's output gradient (~4 D) against the scatter's 2 D, and once a
        check the whole vocabulary x D weight gradient (registered as its ``fixed`` cost)."""
        d = weight.shape[-1]
        return [(3 * d, d), (4 * d, 2 * d)]

    def _attention_costs(self, q: torch.Tensor, k: torch.Tensor) -> list[tuple[int, int]]:
        """Per-row costs of the checked attention: its GEMMs' flops against the checks' reads."""
        rows = _rows(self.board, q)
        lead = q.numel() // max(1, q.shape[-1])  # batch x heads x queries
        keys, width = k.shape[-2], q.shape[-1]
        pairs = lead * keys
        forward_op, backward_op = 4 * pairs * width, 8 * pairs * width
        forward_check = 6 * pairs + 4 * (lead + keys) * width
        backward_check = 8 * pairs + 8 * (lead + keys) * width
        return [
            (max(1, forward_check // rows), max(1, forward_op // rows)),
            (max(1, backward_check // rows), max(1, backward_op // rows)),
        ]


def find_sites(model: nn.Module) -> FunctionSensors | None:
    """The function sites :func:`sdc_agent.sensors.protect` put on ``model``, or None."""
    for module in model.modules():
        sites = module.__dict__.get("sensor_sites")
        if isinstance(sites, FunctionSensors):
            return sites
    return None

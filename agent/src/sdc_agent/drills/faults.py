"""Fault injectors: make one rank compute wrong, on purpose, to prove the checks catch it.

The test suite uses them, and so can you: a fire drill on your own cluster shows that the guard
names the right GPU and that the remediation pipeline contains it. Each fault fires on one global
``rank`` from ``step`` on: every time (``persistent=True``, like a bad GPU, including when that
rank replays someone else's batch) or once (``persistent=False``, like a transient upset).
Attach a fault after building the guard, on every rank (it installs itself only on its rank)::

    guard = sdc.Guard(...)
    faults.ScaleOutputElement("layers.2", factor=1000.0, rank=3, step=20).attach(guard)

Forward faults corrupt the output of the named submodule; backward faults corrupt a gradient;
weight faults change one replica's weights right after an optimizer step (or now, with
:meth:`WeightFault.apply_now`); :class:`NaNReducedGradient` corrupts a rank's gradient after the
all-reduce. GEMM faults (:class:`ScaleGemmElement`, :class:`FlipGemmBit`) corrupt the fp32 result
of one GEMM of a protected linear layer (:func:`sdc_agent.sensors.protect`), between the
accumulator and the sensor's check: exactly what the online sensors see. The same injectors, and
their aliases :class:`ScaleOpElement` and :class:`FlipOpBit`, corrupt the other protected ops
the same way, between the kernel and the check: a layer norm's output (``forward``) or input
gradient (``dgrad``), a residual add's sum (``forward``), a softmax's or log-softmax's output
(``forward``) or input gradient (``dgrad``).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from ..fingerprint import bit_patterns

if TYPE_CHECKING:
    from ..guard import Guard


__all__ = [
    "CompensatingWeightChange",
    "Fault",
    "FlipCallBit",
    "FlipGemmBit",
    "FlipOpBit",
    "FlipOutputBit",
    "FlipWeightBit",
    "NaNOutputElement",
    "NaNReducedGradient",
    "OutputNoise",
    "ScaleCallElement",
    "ScaleGemmElement",
    "ScaleInputGradElement",
    "ScaleOpElement",
    "ScaleOutputColumn",
    "ScaleOutputElement",
    "ScaleWeightGradElement",
    "SwapWeights",
    "WeightFault",
]


def _flip_bit_(flat: torch.Tensor, index: int, bit: int) -> None:
    """Flip one bit of one element's raw pattern, in place."""
    width = flat.element_size() * 8
    if not 0 <= bit < width:
        raise ValueError(f"bit must be in [0, {width}) for {flat.dtype}, got {bit}")
    raw = bit_patterns(flat[index : index + 1])
    mask = -(1 << bit) if bit == width - 1 else 1 << bit  # the sign bit as a signed value
    raw.bitwise_xor_(mask)


def _on_local(tensor: torch.Tensor, corrupt_: Callable[[torch.Tensor], None]) -> torch.Tensor:
    """A corrupted copy of ``tensor`` (``corrupt_`` changes it in place, without autograd); a
    DTensor's local slice is what is corrupted, as one GPU would (tensor parallel)."""
    if isinstance(tensor, DTensor):
        local = tensor.to_local().clone()
        with torch.no_grad():
            corrupt_(local)
        return DTensor.from_local(
            local,
            tensor.device_mesh,
            tensor.placements,
            run_check=False,
            shape=tensor.shape,
            stride=tensor.stride(),
        )
    corrupted = tensor.clone()
    with torch.no_grad():
        corrupt_(corrupted)
    return corrupted


class Fault(ABC):
    """Base of every injector: which rank, from which step, how often."""

    def __init__(
        self,
        *,
        rank: int,
        step: int = 0,
        persistent: bool = True,
        micro_batch: int | None = None,
    ) -> None:
        """Fire on global ``rank`` from ``step``; every time, or once when not ``persistent``.

        ``micro_batch``: with gradient accumulation, fire only while the micro-batch at that
        position is computed (in training, and when this rank replays that position of a
        step); None: any micro-batch."""
        if rank < 0 or step < 0:
            raise ValueError(f"rank and step must be >= 0, got rank={rank}, step={step}")
        if micro_batch is not None and micro_batch < 0:
            raise ValueError(f"micro_batch must be >= 0 or None, got {micro_batch}")
        self.rank = rank
        self.step = step
        self.persistent = persistent
        self.micro_batch = micro_batch
        self.fired = 0
        """How many times the fault has fired on this process."""
        self._guard: Guard | None = None
        self._handles: list[Any] = []

    def attach(self, guard: Guard) -> Fault:
        """Install on ``guard``'s model if this process is ``rank``; a no-op elsewhere."""
        if dist.get_rank() == self.rank:
            self._guard = guard
            self._install(guard)
        return self

    def detach(self) -> None:
        """Remove every hook this fault installed."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    @abstractmethod
    def _install(self, guard: Guard) -> None:
        """Register this injector's hook on ``guard``'s model or optimizer."""

    def _should_fire(self) -> bool:
        step = self._guard.current_step if self._guard is not None else None
        if step is None or step < self.step:
            return False
        if self.micro_batch is not None and (
            self._guard is None or self._guard.current_micro_batch != self.micro_batch
        ):
            return False
        if not self.persistent and (step != self.step or self.fired):
            return False
        self.fired += 1
        return True

    @staticmethod
    def _submodule(guard: Guard, layer: str | nn.Module) -> nn.Module:
        return layer if isinstance(layer, nn.Module) else guard.module.get_submodule(layer)


class _OutputFault(Fault):
    """Corrupts a copy of a submodule's forward output (autograd sees the corrupted value)."""

    def __init__(self, layer: str | nn.Module, **when: Any) -> None:
        super().__init__(**when)
        self.layer = layer

    def _install(self, guard: Guard) -> None:
        module = self._submodule(guard, self.layer)
        # First among the layer's forward hooks: the layer's own output, before any wrapper's
        # output hook uses it (tensor parallel's all-reduce of a row-parallel partial output).
        self._handles.append(module.register_forward_hook(self._hook, prepend=True))

    def _hook(self, module: nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor | None:
        if not self._should_fire():
            return None
        return _on_local(output, self.corrupt_)

    @abstractmethod
    def corrupt_(self, output: torch.Tensor) -> None:
        """Change ``output`` in place."""


class ScaleOutputElement(_OutputFault):
    """Multiply one element of the layer's output (flat ``index``) by ``factor``."""

    def __init__(
        self, layer: str | nn.Module, *, index: int = 0, factor: float = 1000.0, **when: Any
    ) -> None:
        super().__init__(layer, **when)
        self.index, self.factor = index, factor

    def corrupt_(self, output: torch.Tensor) -> None:
        """Scale the element."""
        output.view(-1)[self.index] *= self.factor


class NaNOutputElement(_OutputFault):
    """Replace one element of the layer's output with NaN."""

    def __init__(self, layer: str | nn.Module, *, index: int = 0, **when: Any) -> None:
        super().__init__(layer, **when)
        self.index = index

    def corrupt_(self, output: torch.Tensor) -> None:
        """Write the NaN."""
        output.view(-1)[self.index] = math.nan


class FlipOutputBit(_OutputFault):
    """Flip bit ``bit`` of one output element's raw pattern (in the output's own dtype)."""

    def __init__(
        self, layer: str | nn.Module, *, index: int = 0, bit: int = 0, **when: Any
    ) -> None:
        super().__init__(layer, **when)
        self.index, self.bit = index, bit

    def corrupt_(self, output: torch.Tensor) -> None:
        """Flip the bit."""
        _flip_bit_(output.view(-1), self.index, self.bit)


class OutputNoise(_OutputFault):
    """Multiply the whole output by (1 + relative * N(0, 1)) noise from a private generator."""

    def __init__(
        self, layer: str | nn.Module, *, relative: float = 0.1, seed: int = 0, **when: Any
    ) -> None:
        super().__init__(layer, **when)
        self.relative, self.seed = relative, seed
        self._generator: torch.Generator | None = None

    def corrupt_(self, output: torch.Tensor) -> None:
        """Apply the noise (never touching the job's RNG, which replays depend on)."""
        if self._generator is None:
            self._generator = torch.Generator(device=output.device).manual_seed(self.seed)
        noise = torch.randn(
            output.shape, generator=self._generator, device=output.device, dtype=torch.float32
        )
        output.mul_((1 + self.relative * noise).to(output.dtype))


class ScaleOutputColumn(_OutputFault):
    """Multiply one column (last dimension) of the output by ``factor``."""

    def __init__(
        self, layer: str | nn.Module, *, column: int = 0, factor: float = 1.1, **when: Any
    ) -> None:
        super().__init__(layer, **when)
        self.column, self.factor = column, factor

    def corrupt_(self, output: torch.Tensor) -> None:
        """Scale the column."""
        output[..., self.column] *= self.factor


class ScaleInputGradElement(Fault):
    """Backward only: multiply one element of the gradient w.r.t. a layer's input by ``factor``."""

    def __init__(
        self, layer: str | nn.Module, *, index: int = 0, factor: float = 1000.0, **when: Any
    ) -> None:
        super().__init__(**when)
        self.layer, self.index, self.factor = layer, index, factor

    def _install(self, guard: Guard) -> None:
        module = self._submodule(guard, self.layer)
        self._handles.append(module.register_full_backward_hook(self._hook))

    def _hook(self, module: nn.Module, grad_input: Any, grad_output: Any) -> Any:
        if grad_input[0] is None or not self._should_fire():
            return None
        corrupted = grad_input[0].clone()
        corrupted.view(-1)[self.index] *= self.factor
        return (corrupted, *grad_input[1:])


class ScaleWeightGradElement(Fault):
    """Backward only: multiply one element of a parameter's local gradient by ``factor``."""

    def __init__(self, param: str, *, index: int = 0, factor: float = 1000.0, **when: Any) -> None:
        super().__init__(**when)
        self.param, self.index, self.factor = param, index, factor

    def _install(self, guard: Guard) -> None:
        # The tensor autograd computes the local gradient for: the parameter under DDP, the
        # unsharded parameter under FSDP2 (which exists from the first forward on).
        guard._run.parallel.with_autograd_parameter(
            self.param, lambda parameter: self._handles.append(parameter.register_hook(self._hook))
        )

    def _hook(self, grad: torch.Tensor) -> torch.Tensor | None:
        if not self._should_fire():
            return None
        return _on_local(grad, self._scale_)

    def _scale_(self, grad: torch.Tensor) -> None:
        grad.view(-1)[self.index] *= self.factor


class NaNReducedGradient(Fault):
    """Write NaN into this rank's gradient AFTER the all-reduce (every local gradient finite)."""

    def __init__(self, *, index: int = 0, **when: Any) -> None:
        super().__init__(**when)
        self.index = index

    def _install(self, guard: Guard) -> None:
        guard._run.gradients.add_reduced_tap(self._tap)

    def _tap(self, bucket: dist.GradBucket, reduced: torch.Tensor) -> None:
        if bucket.index() == 0 and self._should_fire():
            reduced.view(-1)[self.index] = math.nan


class WeightFault(Fault):
    """Changes one replica's weights once, right after the optimizer step of ``step``."""

    def __init__(self, param: str, *, rank: int, step: int = 0) -> None:
        super().__init__(rank=rank, step=step, persistent=False)  # after the update: no micro-batch
        self.param = param

    def _install(self, guard: Guard) -> None:
        self._handles.append(guard.optimizer.register_step_post_hook(self._after_step))

    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._should_fire():
            self.apply_now(self._guard)

    def apply_now(self, guard: Guard | None = None) -> None:
        """Apply the change immediately (e.g. right after loading a checkpoint) on ``rank``."""
        guard = guard or self._guard
        if guard is None:
            raise ValueError("apply_now needs the guard (or attach the fault first)")
        if dist.get_rank() != self.rank:
            return
        with torch.no_grad():
            # This rank's copy: under FSDP2, its local shard of the parameter.
            self.change_(guard._run.parallel.local_weight(self.param).view(-1))

    @abstractmethod
    def change_(self, flat: torch.Tensor) -> None:
        """Change the flattened parameter in place."""


class FlipWeightBit(WeightFault):
    """Flip one bit of one weight element's raw pattern."""

    def __init__(
        self, param: str, *, index: int = 0, bit: int = 20, rank: int, step: int = 0
    ) -> None:
        super().__init__(param, rank=rank, step=step)
        self.index, self.bit = index, bit

    def change_(self, flat: torch.Tensor) -> None:
        """Flip the bit."""
        _flip_bit_(flat, self.index, self.bit)


class SwapWeights(WeightFault):
    """Swap two weight values (the plain sum of the tensor is unchanged)."""

    def __init__(self, param: str, *, i: int = 0, j: int = 1, rank: int, step: int = 0) -> None:
        super().__init__(param, rank=rank, step=step)
        self.i, self.j = i, j

    def change_(self, flat: torch.Tensor) -> None:
        """Swap the two values."""
        a, b = flat[self.i].clone(), flat[self.j].clone()
        flat[self.i], flat[self.j] = b, a


class CompensatingWeightChange(WeightFault):
    """Add +delta to one weight's bit pattern and -delta to another's (plain sum unchanged)."""

    def __init__(
        self, param: str, *, i: int = 0, j: int = 1, delta: int = 4096, rank: int, step: int = 0
    ) -> None:
        super().__init__(param, rank=rank, step=step)
        self.i, self.j, self.delta = i, j, delta

    def change_(self, flat: torch.Tensor) -> None:
        """Shift the two bit patterns in opposite directions."""
        bits = bit_patterns(flat)
        bits[self.i] += self.delta
        bits[self.j] -= self.delta


# ---------------------------------------------------------------- inside a protected GEMM (sensors)
class _GemmFault(Fault):
    """Corrupts one GEMM's fp32 result inside a protected linear layer (or the result of
    another protected op), before its check."""

    def __init__(self, layer: str, *, gemm: str = "forward", index: int = 0, **when: Any) -> None:
        """``layer``: the protected layer's qualified name, or a function site's sensor name
        (``"model.layers.0.mlp.act_fn/silu"``: :mod:`sdc_agent.sensors.ops.sites`); ``gemm``:
        ``forward``, ``dgrad`` (input gradient) or ``wgrad`` (weight gradient) of a protected
        linear layer; for the other protected layers and sites (norms, adds, softmax,
        activations, attention, the loss) ``forward`` is the op's output and ``dgrad`` its input
        gradient, where it has one (``sensor_ops`` says); ``index``: the flat element (modulo
        the result's size)."""
        from ..sensors.runtime.board import GEMMS

        if gemm not in GEMMS:
            raise ValueError(f"gemm must be one of {GEMMS}, got {gemm!r}")
        if index < 0:
            raise ValueError(f"index must be >= 0, got {index}")
        super().__init__(**when)
        self.layer, self.gemm, self.index = layer, gemm, index

    def _install(self, guard: Guard) -> None:
        module = _sensor_target(guard, self.layer)
        ops = getattr(module, "sensor_ops", None)
        if ops is None:
            raise ValueError(
                f"{type(self).__name__}: layer {self.layer!r} is not protected; call "
                "sdc_agent.sensors.protect(model) before building the guard"
            )
        if self.gemm not in ops:
            raise ValueError(
                f"{type(self).__name__}: layer {self.layer!r} has no {self.gemm!r} to corrupt "
                f"(it has {list(ops)})"
            )
        taps = module.gemm_taps
        taps.append(self._tap)
        self._handles.append(_TapHandle(taps, self._tap))

    def _tap(self, gemm: str, result: torch.Tensor) -> None:
        if gemm == self.gemm and self._should_fire():
            with torch.no_grad():
                self.corrupt_(result.view(-1), self.index % result.numel())

    @abstractmethod
    def corrupt_(self, flat: torch.Tensor, index: int) -> None:
        """Change element ``index`` of the flattened fp32 result in place."""


class _TapHandle:
    """Removes a GEMM tap, as a hook handle removes a hook."""

    def __init__(self, taps: list[Any], tap: Any) -> None:
        self.taps, self.tap = taps, tap

    def remove(self) -> None:
        if self.tap in self.taps:
            self.taps.remove(self.tap)


class ScaleGemmElement(_GemmFault):
    """Multiply one element of a protected GEMM's fp32 result by ``factor`` (default x1.1)."""

    def __init__(self, layer: str, *, factor: float = 1.1, **kw: Any) -> None:
        super().__init__(layer, **kw)
        self.factor = factor

    def corrupt_(self, flat: torch.Tensor, index: int) -> None:
        """Scale the element."""
        flat[index] *= self.factor


class FlipGemmBit(_GemmFault):
    """Flip one bit of one element of a protected GEMM's fp32 result."""

    def __init__(self, layer: str, *, bit: int = 22, **kw: Any) -> None:
        if not 0 <= bit < 32:
            raise ValueError(f"bit must be in [0, 32) for an fp32 result, got {bit}")
        super().__init__(layer, **kw)
        self.bit = bit

    def corrupt_(self, flat: torch.Tensor, index: int) -> None:
        """Flip the bit."""
        _flip_bit_(flat, index, self.bit)


class ScaleOpElement(ScaleGemmElement):
    """:class:`ScaleGemmElement` by the name that fits the ops beyond GEMMs: multiply one element
    of a protected op's result (``forward``) or input gradient (``dgrad``) by ``factor``."""


class FlipOpBit(FlipGemmBit):
    """:class:`FlipGemmBit` by the name that fits the ops beyond GEMMs: flip one bit of one
    element of a protected op's result or input gradient. The bit must exist in the result's
    dtype (0-31 for fp32, 0-15 for a bf16 output)."""


def _sensor_target(guard: Guard, layer: str | nn.Module) -> Any:
    """What a sensor fault taps: a protected module, or a function site (a name with ``/``)."""
    from ..sensors.ops.sites import SEPARATOR, find_sites

    if not isinstance(layer, str) or SEPARATOR not in layer:
        return Fault._submodule(guard, layer)
    sites = find_sites(guard.module)
    if sites is None:
        raise ValueError(
            f"site {layer!r}: the model's function calls are not protected; call "
            "sdc_agent.sensors.protect(model) (functions=True) before building the guard"
        )
    site = sites.lookup(layer)
    if site.function == "recompute":
        raise ValueError(
            f"site {layer!r}: a recompute comparison has no result of its own to corrupt; "
            "corrupt an op inside the checkpointed block instead"
        )
    return site


# ---------------------------------------------------------------- any function call in a forward
class _CallFault(Fault):
    """Corrupts the result of one call of a torch function inside a module's forward: ops that
    have no module and no sensor of their own (the SwiGLU product ``mul``, a fused
    ``scaled_dot_product_attention``, ``embedding``), which only the checks downstream (or a
    recompute comparison) can see."""

    def __init__(
        self, layer: str, *, function: str, call: int = 0, index: int = 0, **when: Any
    ) -> None:
        """``layer``: the module in whose own forward the call runs (calls inside its
        submodules do not count);
        ``function``: the torch function's name (``mul``, ``scaled_dot_product_attention``,
        ``embedding``, ...); ``call``: which of its calls in that forward (0: the first);
        ``index``: the flat element of its result (modulo the result's size)."""
        if call < 0 or index < 0:
            raise ValueError(f"call and index must be >= 0, got call={call}, index={index}")
        if not function:
            raise ValueError("function must name a torch function, e.g. 'mul'")
        super().__init__(**when)
        self.layer, self.function, self.call, self.index = layer, function, call, index

    def _install(self, guard: Guard) -> None:
        from torch.overrides import TorchFunctionMode

        target = self._submodule(guard, self.layer)
        fault = self
        state = {"depth": 0, "seen": 0}  # modules entered below the target; its own calls

        class _Mode(TorchFunctionMode):
            def __torch_function__(
                self, func: Any, types: Any, args: Any = (), kwargs: Any = None
            ) -> Any:
                out = func(*args, **(kwargs or {}))
                # Only the target's own calls, not those of its submodules (whose internals,
                # checks included, are theirs).
                if state["depth"] != 1 or getattr(func, "__name__", None) != fault.function:
                    return out
                state["seen"] += 1
                if state["seen"] - 1 != fault.call or not isinstance(out, torch.Tensor):
                    return out
                if not out.is_floating_point() or not fault._should_fire():
                    return out
                out = out.clone()
                with torch.no_grad():
                    fault.corrupt_(out, fault.index)
                return out

        modes: list[_Mode] = []

        def enter(module: nn.Module, args: Any) -> None:
            state["depth"] += 1
            if module is target:
                state["seen"] = 0
                modes.append(_Mode())
                modes[-1].__enter__()

        def leave(module: nn.Module, args: Any, output: Any) -> None:
            state["depth"] -= 1
            if module is target and modes:
                modes.pop().__exit__(None, None, None)

        for module in target.modules():
            self._handles.append(module.register_forward_pre_hook(enter))
            self._handles.append(module.register_forward_hook(leave, always_call=True))

    @abstractmethod
    def corrupt_(self, result: torch.Tensor, index: int) -> None:
        """Change element ``index`` (modulo the size) of the call's result, in place."""


class ScaleCallElement(_CallFault):
    """Multiply one element of a function call's result by ``factor`` (default x1.1)."""

    def __init__(self, layer: str, *, factor: float = 1.1, **kw: Any) -> None:
        super().__init__(layer, **kw)
        self.factor = factor

    def corrupt_(self, result: torch.Tensor, index: int) -> None:
        """Scale the element."""
        flat = result.reshape(-1)
        flat[index % flat.numel()] *= self.factor
        if flat.data_ptr() != result.data_ptr():
            result.copy_(flat.view_as(result))


class FlipCallBit(_CallFault):
    """Flip one bit of one element of a function call's result (in the result's dtype)."""

    def __init__(self, layer: str, *, bit: int = 22, **kw: Any) -> None:
        super().__init__(layer, **kw)
        self.bit = bit

    def corrupt_(self, result: torch.Tensor, index: int) -> None:
        """Flip the bit."""
        flat = result.reshape(-1).contiguous()
        _flip_bit_(flat, index % flat.numel(), self.bit)
        result.copy_(flat.view_as(result))

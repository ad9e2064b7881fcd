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
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from ..fingerprint import bit_patterns

if TYPE_CHECKING:
    from ..guard import Guard


__all__ = [
    "CompensatingWeightChange",
    "Fault",
    "FlipGemmBit",
    "FlipOpBit",
    "FlipOutputBit",
    "FlipWeightBit",
    "NaNOutputElement",
    "NaNReducedGradient",
    "OutputNoise",
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
        self._handles.append(module.register_forward_hook(self._hook))

    def _hook(self, module: nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor | None:
        if not self._should_fire():
            return None
        corrupted = output.clone()
        with torch.no_grad():
            self.corrupt_(corrupted)
        return corrupted

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
        guard.parallel.with_autograd_parameter(
            self.param, lambda parameter: self._handles.append(parameter.register_hook(self._hook))
        )

    def _hook(self, grad: torch.Tensor) -> torch.Tensor | None:
        if not self._should_fire():
            return None
        corrupted = grad.clone()
        corrupted.view(-1)[self.index] *= self.factor
        return corrupted


class NaNReducedGradient(Fault):
    """Write NaN into this rank's gradient AFTER the all-reduce (every local gradient finite)."""

    def __init__(self, *, index: int = 0, **when: Any) -> None:
        super().__init__(**when)
        self.index = index

    def _install(self, guard: Guard) -> None:
        guard.gradients.add_reduced_tap(self._tap)

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
            self.change_(guard.parallel.local_weight(self.param).view(-1))

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
        """``layer``: the protected layer's qualified name; ``gemm``: ``forward``, ``dgrad``
        (input gradient) or ``wgrad`` (weight gradient) of a protected linear layer; for the
        other protected layers (norm, residual add, softmax, log-softmax) ``forward`` is the op's
        output and ``dgrad`` its input gradient, where it has one (``sensor_ops`` says);
        ``index``: the flat element (modulo the result's size)."""
        from ..sensors import GEMMS

        if gemm not in GEMMS:
            raise ValueError(f"gemm must be one of {GEMMS}, got {gemm!r}")
        if index < 0:
            raise ValueError(f"index must be >= 0, got {index}")
        super().__init__(**when)
        self.layer, self.gemm, self.index = layer, gemm, index

    def _install(self, guard: Guard) -> None:
        module = self._submodule(guard, self.layer)
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

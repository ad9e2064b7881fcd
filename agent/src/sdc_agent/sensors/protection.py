"""``protect()``: put a sensor on every op of a model that has one, in place, without changing
the model's code or values.

The GEMMs of ``nn.Linear`` and the ``nn.LayerNorm`` norms are swapped by
:func:`~sdc_agent.sensors.ops.linear.protect`; this adds the op families beyond GEMMs that live in modules of their
own: ``nn.Softmax``/``nn.LogSoftmax`` (:mod:`~sdc_agent.sensors.ops.softmax`) and the residual adds a model writes as
:class:`~sdc_agent.sensors.ops.residual.ResidualAdd` (:mod:`~sdc_agent.sensors.ops.residual`); RMSNorm modules of any class (:mod:`~sdc_agent.sensors.ops.rmsnorm`,
by hooks); and the functions a model calls in its forward (activations, residual adds written
as ``+``, scaled-dot-product attention, the cross-entropy loss) and activation checkpointing's
recomputations (:mod:`~sdc_agent.sensors.ops.sites`, :mod:`~sdc_agent.sensors.ops.recompute`). Every protected layer registers its sensors
on one board, in module order (linear layers and norms first, then the other modules, then the
function sites as they first run), which the guard finds.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from .ops import rmsnorm
from .ops.linear import protect as protect_linear_and_norms
from .ops.residual import ProtectedResidualAdd, ResidualAdd
from .ops.sites import FunctionSensors
from .ops.softmax import ProtectedLogSoftmax, ProtectedSoftmax
from .runtime.board import SensorBoard, SensorConfig

OP_SWAPS: dict[type, type] = {
    nn.Softmax: ProtectedSoftmax,
    nn.LogSoftmax: ProtectedLogSoftmax,
    ResidualAdd: ProtectedResidualAdd,
}
"""The op families beyond GEMMs and norms that :func:`protect` swaps (exact types only)."""


def protect(
    model: nn.Module,
    *,
    config: SensorConfig | None = None,
    include: Callable[[str, nn.Module], bool] | None = None,
    norms: bool = True,
    ops: bool = True,
    functions: bool = True,
    attention: str = "fused",
    recompute: bool = True,
) -> SensorBoard:
    """Protect ``model``'s layers in place; returns their sensor board.

    ``nn.Linear`` (its three GEMMs); with ``norms`` ``nn.LayerNorm`` (output and input gradient)
    and every RMSNorm module (``nn.RMSNorm``, Hugging Face's ``LlamaRMSNorm`` and any module
    computing ``x * rsqrt(mean(x²) + eps) * w``: :mod:`~sdc_agent.sensors.ops.rmsnorm`); with ``ops``
    ``nn.Softmax``/``nn.LogSoftmax`` with an explicit ``dim`` (output and input gradient) and
    :class:`~sdc_agent.sensors.ops.residual.ResidualAdd` (its sum); with ``functions`` the functions called in the
    model's forward: ``F.silu``/``F.gelu`` (output and input gradient), adds of two same-shaped
    tensors (``x + f(x)``), ``F.cross_entropy`` (log-probabilities and the loss gradient), and,
    with ``attention="checked"``, ``F.scaled_dot_product_attention`` by an unfused checked path
    instead of the fused kernel (``"fused"``, the default, leaves it alone: the checked path
    stores the attention probabilities and runs several times slower than a fused kernel on a
    GPU at long context; docs/performance.md); with ``recompute`` (and ``functions``) the
    recomputation of activation-checkpointed blocks is compared with their first forward
    (:mod:`~sdc_agent.sensors.ops.recompute`). Linear, LayerNorm and softmax modules of exactly these types are
    protected. Call it before building :class:`sdc_agent.Guard` (and before wrapping the model in
    DDP or FSDP2); ``config``: the sensors' thresholds; ``include(name, module)`` selects layers
    and the modules whose function calls are checked (default: all). Raises ValueError when the
    model has no ``nn.Linear``, is protected already (see :func:`~sdc_agent.sensors.ops.linear.protect`), or
    ``attention`` is not ``"fused"`` or ``"checked"``.
    """
    if attention not in ("fused", "checked"):
        raise ValueError(f"protect: attention must be 'fused' or 'checked', got {attention!r}")
    board = protect_linear_and_norms(model, config=config, include=include, norms=norms)
    for name, module in model.named_modules() if ops else ():
        protected = OP_SWAPS.get(type(module))
        if protected is None or (include is not None and not include(name, module)):
            continue
        if getattr(module, "dim", 0) is None:
            continue  # nn.Softmax(dim=None): torch's deprecated implicit dim, left unchecked
        # Swapping the class keeps the module object, its hooks and state_dict keys.
        module.__class__ = protected
        module._attach(board, name)
    for name, module in model.named_modules() if norms else ():
        if getattr(module, "sensor_board", None) is not None:
            continue  # protected already (a linear layer, a layer norm, a softmax)
        if include is None or include(name, module):
            rmsnorm.attach(module, board, name)
    if functions:
        # After every module sensor: the sites register on the board as they first run.
        FunctionSensors(
            model, board, attention_mode=attention, recompute=recompute, include=include
        )
    return board

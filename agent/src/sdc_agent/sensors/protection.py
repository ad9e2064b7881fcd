"""``protect()``: turn every layer of a model that has a sensor into its protected twin, in place.

The GEMMs of ``nn.Linear`` and the ``nn.LayerNorm`` norms are swapped by
:func:`.linear.protect`; this adds the op families beyond GEMMs that live in modules of their
own: ``nn.Softmax``/``nn.LogSoftmax`` (:mod:`.softmax`) and the residual adds a model writes as
:class:`~.residual.ResidualAdd` (:mod:`.residual`). Every protected layer registers its sensors on
one board, in module order (linear layers and norms first), which the guard finds.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from .board import SensorBoard, SensorConfig
from .linear import protect as protect_linear_and_norms
from .residual import ProtectedResidualAdd, ResidualAdd
from .softmax import ProtectedLogSoftmax, ProtectedSoftmax

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
) -> SensorBoard:
    """Protect ``model``'s layers in place; returns their sensor board.

    ``nn.Linear`` (its three GEMMs), with ``norms`` ``nn.LayerNorm`` (output and input gradient),
    and with ``ops`` ``nn.Softmax``/``nn.LogSoftmax`` with an explicit ``dim`` (output and input
    gradient) and :class:`~.residual.ResidualAdd` (its sum). Only modules of exactly these types
    are protected. Call it before building :class:`sdc_agent.Guard`; ``config``: the sensors'
    thresholds; ``include(name, module)`` selects layers (default: all). Raises ValueError when
    the model has no ``nn.Linear`` or is protected already (see :func:`.linear.protect`).
    """
    board = protect_linear_and_norms(model, config=config, include=include, norms=norms)
    if not ops:
        return board
    for name, module in model.named_modules():
        protected = OP_SWAPS.get(type(module))
        if protected is None or (include is not None and not include(name, module)):
            continue
        if getattr(module, "dim", 0) is None:
            continue  # nn.Softmax(dim=None): torch's deprecated implicit dim, left unchecked
        # Swapping the class keeps the module object, its hooks and state_dict keys.
        module.__class__ = protected
        module._attach(board, name)  # type: ignore[attr-defined]
    return board

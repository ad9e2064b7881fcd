"""Protected linear layers under tensor parallelism: the GEMMs on this rank's local slices.

``protect()`` before ``parallelize_module``: ``ColwiseParallel`` and ``RowwiseParallel`` accept a
:class:`~.linear.ProtectedLinear` (an ``nn.Linear``) and turn its weight into a DTensor over the
``tp`` dimension (under FSDP2, the unsharded parameter FSDP2 hands the layer). What one GPU
computes is the GEMM of its slices, so that is what the sensor checks: :func:`local_linear`
takes the DTensors' local tensors, runs the protected function on them (the checks see the fp32
result of the local GEMM, as on one GPU), and wraps the result as the DTensor that
``F.linear`` on the DTensors would have returned, with the same autograd:

* column-parallel (weight ``Shard(0)``, input ``Replicate``): ``y_local = x W_localᵀ + b_local``,
  the output ``Shard(-1)``; the input's gradient on this rank is a partial sum (``dy_local
  W_local``), marked ``Partial`` for DTensor to all-reduce, as its own ``mm`` backward does;
* row-parallel (weight ``Shard(1)``, input ``Shard(-1)``): ``y_partial = x_local W_localᵀ +
  b / n``, the output ``Partial``: DTensor adds a replicated bias to a partial sum as ``b / n`` on
  every rank (``Partial._partition_value``), and passes the replicated gradient of the partial
  output back to the bias whole; :class:`_BiasShare` does the same here, so the bias's value
  and gradient are DTensor's. The checksum identity holds for the local
  partial output, bias share included: ``y_partial 1 = x_local (W_localᵀ 1) + Σ b / n``.

The values are those ``F.linear`` computes on the DTensors (the same ``addmm`` on the same
local tensors); an unarmed layer runs that plain ``F.linear`` on the local tensors, an armed one
its protected function (:mod:`.linear`: which GEMMs are on the checked path is the step's, in
training and in its replays alike). Any other layout (a replicated weight, an input laid out
otherwise) runs ``F.linear`` on the DTensors unchecked.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard


class LocalLinear(Protocol):
    """What :func:`local_linear` needs of a protected linear layer (:class:`~.linear.ProtectedLinear`)."""

    @property
    def weight(self) -> torch.Tensor:
        """The layer's weight (a DTensor where :func:`local_linear` is called)."""
        ...

    @property
    def bias(self) -> torch.Tensor | None:
        """The layer's bias, if any."""
        ...

    def local_forward(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        """The protected, checked ``F.linear`` on local tensors."""
        ...


class _BiasShare(torch.autograd.Function):
    """A replicated bias's share of each partial sum, ``b / n``, as DTensor makes it
    (``Partial._partition_value``); its gradient passes through whole, as DTensor's
    redistribution passes the (replicated) gradient of a partial output back to the bias."""

    @staticmethod
    def forward(ctx: Any, bias: torch.Tensor, n: int) -> torch.Tensor:
        return bias / n

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def _is_shard(placement: object, dim: int, ndim: int) -> bool:
    """Whether ``placement`` shards tensor dimension ``dim`` (negative: from the end)."""
    return isinstance(placement, Shard) and placement.dim % ndim == dim % ndim


def local_linear(layer: LocalLinear, x: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, layer.weight, layer.bias)`` for a DTensor weight over one mesh dimension,
    its GEMMs computed and checked on this rank's slices (see the module docstring)."""
    weight, bias = layer.weight, layer.bias
    assert isinstance(weight, DTensor)
    mesh = weight.device_mesh
    if mesh.ndim != 1 or not isinstance(x, DTensor) or x.device_mesh != mesh:
        return F.linear(x, weight, bias)
    (w_placement,), (x_placement,) = weight.placements, x.placements
    if _is_shard(w_placement, 0, 2) and isinstance(x_placement, Replicate):
        # Column-parallel: this rank's output columns; its input gradient is a partial sum.
        x_local = x.to_local(grad_placements=[Partial()])
        b_local = bias.to_local() if isinstance(bias, DTensor) else bias
        output: Placement = Shard(x.dim() - 1)
    elif _is_shard(w_placement, 1, 2) and _is_shard(x_placement, -1, x.dim()):
        # Row-parallel: this rank's partial output, the bias shared out as DTensor shares it.
        x_local = x.to_local()
        b_local = (
            _BiasShare.apply(bias.to_local(), mesh.size()) if isinstance(bias, DTensor) else bias
        )
        output = Partial()
    else:
        return F.linear(x, weight, bias)
    y_local = layer.local_forward(x_local, weight.to_local(), b_local)
    return DTensor.from_local(y_local, mesh, [output], run_check=False)

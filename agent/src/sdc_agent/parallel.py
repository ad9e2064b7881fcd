"""What the guard needs from the data-parallel wrapper, behind one small adapter.

The checks themselves do not know how gradients are synchronised; they ask the adapter for:

* :attr:`DDPAdapter.model`: the model training runs (``compute_loss`` gets it);
* :attr:`DDPAdapter.module`: the bare module replays run on, without collectives;
* :meth:`DDPAdapter.register_gradient_hook`: where check 1 sees each local gradient before the
  reduction and each reduced gradient after it;
* :meth:`DDPAdapter.no_sync`: accumulate gradients without synchronising them;
* :attr:`DDPAdapter.dp_group` and the rank bookkeeping of the data-parallel group.

Seams for what is planned (docs/architecture.md, "Beyond plain DDP"), none of it built here:

* FSDP2 (``fully_shard``): an ``FSDP2Adapter`` would return the root module for both
  :attr:`model` and :attr:`module` (a replay then needs the full parameters, gathered or resharded
  on the replaying rank), use ``set_requires_gradient_sync(False)`` in :meth:`no_sync`, and, as
  FSDP2 has no comm hooks, implement :meth:`register_gradient_hook` with per-parameter
  post-accumulate-grad hooks on the unsharded gradient (the local check, before the
  reduce-scatter) plus a check of the sharded DTensor gradient after it (the reduced check).
  Check 1's flags and exchange stay as they are; parameters are DTensors, so weight fingerprints
  compare the local shards across replicas of the same shard (the HSDP replicate group).

Built on these seams (docs/architecture.md, "Gradient accumulation and mixed precision"):

* Gradient accumulation: :class:`~sdc_agent.guard.GuardedStep` runs the first N-1 micro-batches
  inside :meth:`no_sync` and the last outside it, so the hook sees only the last one, which
  carries the accumulated gradient; check 1 is unchanged. The audit isolates one micro-batch's
  gradient in :mod:`sdc_agent.accumulation` with per-parameter post-accumulate-grad hooks, which
  run before DDP's reducer reads the gradient (an FSDP2 adapter would need the same ordering).
* A GradScaler: the scaled gradient goes through the same hook; a non-finite step that a replay
  reproduces at the same scale is an overflow the scaler skips, decided in the audit
  (:meth:`~sdc_agent.audit.RingAudit.judge_nonfinite`), not here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from .topology import collective_device, group_ranks


class DDPAdapter:
    """The guard's view of a ``DistributedDataParallel`` model."""

    def __init__(self, model: DistributedDataParallel, dp_group: dist.ProcessGroup | None) -> None:
        """Check the wrapper and record the data-parallel group (None: WORLD)."""
        if not isinstance(model, DistributedDataParallel):
            raise TypeError(
                f"Guard needs a torch.nn.parallel.DistributedDataParallel model, got {type(model).__name__}"
            )
        self.model: nn.Module = model
        """The model training runs: the DDP wrapper, whose backward all-reduces the gradients."""
        self.module: nn.Module = model.module
        """The bare module replays run on: DDP ignores a backward it did not prepare."""
        self.dp_group = dp_group
        """The data-parallel process group (None: WORLD)."""
        self.rank = dist.get_rank()
        """This process's global rank."""
        self.dp_rank = dist.get_rank(dp_group)
        """This process's rank in :attr:`dp_group`."""
        self.global_ranks = group_ranks(dp_group)
        """Global rank of each DP rank."""
        self.world = len(self.global_ranks)
        """Number of data-parallel replicas."""
        self.collective_device = collective_device(dp_group)
        """Where tensors for collectives over :attr:`dp_group` must live."""
        self.params = [p for p in self.module.parameters() if p.requires_grad]
        """The trainable parameters, in the order of every fingerprint table."""
        self.named_weights = list(self.module.named_parameters())
        """Every parameter by name, as the weight check compares them."""
        self.param_device = self.params[0].device if self.params else torch.device("cpu")
        """Where the parameters (and so the gradients) live."""

    def global_rank(self, dp_rank: int) -> int:
        """The global rank of DP rank ``dp_rank``."""
        return self.global_ranks[dp_rank]

    def register_gradient_hook(
        self, state: Any, hook: Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]
    ) -> None:
        """Register check 1's comm hook; DDP takes one comm hook per model."""
        try:
            self.model.register_comm_hook(state, hook)  # type: ignore[operator]
        except RuntimeError as err:
            raise RuntimeError(
                f"sdc_agent.Guard could not register its DDP comm hook ({err}); a DDP model takes "
                "one comm hook, so build one Guard per model and register no other hook"
            ) from err

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally: backward passes inside do not all-reduce (nor run the
        hook, so check 1 sees only the synchronising micro-batch)."""
        with self.model.no_sync():  # type: ignore[operator]
            yield

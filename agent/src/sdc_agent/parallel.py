"""What the guard needs from the data-parallel wrapper, behind one small adapter.

The checks themselves do not know how gradients are synchronised; they ask the adapter for:

* :attr:`DDPAdapter.model`: the model training runs (``compute_loss`` gets it);
* :attr:`DDPAdapter.module`: the bare module replays run on, without collectives;
* :meth:`DDPAdapter.register_gradient_hook`: where check 1 sees each local gradient before the
  reduction and each reduced gradient after it;
* :meth:`DDPAdapter.no_sync`: accumulate gradients without synchronising them;
* :attr:`DDPAdapter.dp_group` and the rank bookkeeping of the data-parallel group.

FSDP2 (``fully_shard``, full sharding and HSDP) plugs in here as
:class:`sdc_agent.parallel_fsdp.FSDP2Adapter`, with the same surface;
:func:`sdc_agent.parallel_fsdp.adapter_for` picks the adapter from the model. Each adapter
also builds the parts of checks 2 and 3 that depend on the wrapper
(:meth:`DDPAdapter.make_replayer`, :meth:`DDPAdapter.make_audit`,
:meth:`DDPAdapter.make_weight_check`), so the guard's wiring does not branch on the wrapper.

Built on these seams (docs/architecture.md, "Gradient accumulation and mixed precision"), under
both adapters:

* Gradient accumulation: :class:`~sdc_agent.guard.GuardedStep` runs the first N-1 micro-batches
  inside :meth:`no_sync` and the last outside it, so the hook sees only the last one, which
  carries the accumulated gradient; check 1 is unchanged. The audit isolates one micro-batch's
  gradient in :mod:`sdc_agent.accumulation` with per-parameter post-accumulate-grad hooks, which
  run before DDP's reducer reads the gradient. Under FSDP2 the same isolation runs on the
  unsharded parameters, first in check 1's local taps, before FSDP2's post-backward reads the
  gradient (:meth:`Replayer.micro_batch_isolation`, overridden in :mod:`sdc_agent.replay_fsdp`).
* A GradScaler: the scaled gradient goes through the same hook; a non-finite step that a replay
  reproduces at the same scale is an overflow the scaler skips, decided in the audit
  (:meth:`~sdc_agent.audit.RingAudit.judge_nonfinite`), not here. Under FSDP2 ``unscale_`` is
  itself a collective (:attr:`DDPAdapter.unscale_is_collective`), so every rank decides every
  step together (:mod:`sdc_agent.parallel_fsdp`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from .coverage import ddp_facts
from .topology import collective_device, group_ranks

if TYPE_CHECKING:
    from .audit import RebuildBatch, RingAudit
    from .divergence import WeightCheck
    from .gradients import GradientCheck
    from .replay import ComputeLoss, Replayer
    from .reporting import Reporter


class DDPAdapter:
    """The guard's view of a ``DistributedDataParallel`` model."""

    unscale_is_collective = False
    """Whether ``GradScaler.unscale_`` (and so ``scaler.step``) is a collective: no under DDP,
    where every replica holds the whole reduced gradient and finds the same inf by itself."""

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

    # ------------------------------------------------------------------ the checks' parts
    # (FSDP2Adapter has the same methods; the guard builds each check through its adapter.)
    @property
    def weight_redundancy(self) -> bool:
        """Whether check 3 can compare weights: every DDP replica holds all of them."""
        return self.world >= 2

    def coverage_facts(self) -> dict[str, Any]:
        """What the layout lets check 3 see, JSON-ready (same keys as FSDP2Adapter's)."""
        return ddp_facts(list(self.global_ranks))

    def make_replayer(
        self,
        compute_loss: ComputeLoss,
        gradients: GradientCheck,
        *,
        grad_accum: int = 1,
        scaler: Any | None = None,
        divide_loss: bool = True,
    ) -> Replayer:
        """Check 2's replays: on the bare module, alone (DDP ignores a backward it did not
        prepare); ``grad_accum``, ``scaler`` and ``divide_loss`` say how training
        back-propagated each micro-batch's loss."""
        from .replay import Replayer

        return Replayer(
            self.module,
            self.params,
            compute_loss,
            grad_accum=grad_accum,
            scaler=scaler,
            divide_loss=divide_loss,
        )

    def make_audit(
        self, replayer: Replayer, rebuild_batch: RebuildBatch, reporter: Reporter, **kw: Any
    ) -> RingAudit:
        """Check 2's ring audit (keywords: ``peer_offset``, ``can_confirm``,
        ``overflow_is_expected``)."""
        from .audit import RingAudit

        return RingAudit(self, replayer, rebuild_batch, reporter, **kw)

    def make_weight_check(self, reporter: Reporter) -> WeightCheck:
        """Check 3: every replica's full weights compared."""
        from .divergence import WeightCheck

        return WeightCheck(self.named_weights, self.dp_group, reporter)

    def with_autograd_parameter(self, name: str, use: Callable[[nn.Parameter], None]) -> None:
        """Call ``use`` with the tensor autograd computes ``name``'s local gradient for."""
        use(self.module.get_parameter(name))

    def local_weight(self, name: str) -> torch.Tensor:
        """This rank's copy of parameter ``name`` (writing to it changes the weights)."""
        return self.module.get_parameter(name)

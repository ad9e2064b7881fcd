"""The guard's view of a ``DistributedDataParallel`` model (:class:`DDPAdapter`).

Every replica holds the whole model and trains on its own micro-batch; what each check asks
(:class:`~.adapter.ParallelAdapter`) is answered from the DDP wrapper:

* check 1 sees each local gradient before the reduction and each reduced gradient after it in
  one comm hook (:mod:`sdc_agent.checks.gradients.comm_hook`); ``no_sync`` is DDP's own.
* check 2 replays on the bare module inside the wrapper (``model.module``), each rank alone:
  DDP's autograd hooks ignore a backward they did not prepare, so no collective runs.
* check 3 compares every replica's full weights over the data-parallel group.

Built on these seams (docs/architecture.md, "Gradient accumulation and mixed precision"):

* Gradient accumulation: :class:`~sdc_agent.guard.GuardedStep` runs the first N-1 micro-batches
  inside :meth:`DDPAdapter.no_sync` and the last outside it, so the hook sees only the last one,
  which carries the accumulated gradient; check 1 is unchanged. The audit isolates one
  micro-batch's gradient in :mod:`sdc_agent.checks.replay.accumulation` with per-parameter
  post-accumulate-grad hooks, which run before DDP's reducer reads the gradient.
* A GradScaler: the scaled gradient goes through the same hook; a non-finite step that a replay
  reproduces at the same scale is an overflow the scaler skips, decided by check 1's verdicts
  (:meth:`~sdc_agent.checks.gradients.verdicts.NonfiniteVerdicts.judge`), not here. Under DDP
  ``unscale_`` is not a collective: every replica holds the whole reduced gradient and finds
  the same inf by itself (:attr:`DDPAdapter.unscale_is_collective`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..checks.gradients.comm_hook import grad_stats_hook
from ..checks.gradients.stats import GradStatsState
from ..checks.replay.replayer import ComputeLoss, Replayer
from ..coverage import LayoutFacts, ddp_facts
from ..topology import collective_device, group_ranks
from .adapter import ParallelAdapter, WeightReplicas


def require_ddp(model: nn.Module) -> DistributedDataParallel:
    """``model`` as the DDP wrapper the DDP adapter needs; TypeError for anything else."""
    if not isinstance(model, DistributedDataParallel):
        raise TypeError(
            f"Guard needs a torch.nn.parallel.DistributedDataParallel model, got {type(model).__name__}"
        )
    return model


class DDPAdapter(ParallelAdapter):
    """The guard's view of a ``DistributedDataParallel`` model (see the module docstring)."""

    unscale_is_collective = False
    """Whether ``GradScaler.unscale_`` (and so ``scaler.step``) is a collective: no under DDP,
    where every replica holds the whole reduced gradient and finds the same inf by itself."""
    replays_in_lockstep = False
    """Each rank replays alone, on the bare module: DDP ignores a backward it did not prepare."""

    def __init__(self, model: DistributedDataParallel, dp_group: dist.ProcessGroup | None) -> None:
        """Check the wrapper and record the data-parallel group (None: WORLD)."""
        model = require_ddp(model)  # the annotation does not bind untyped callers
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
        self.named_weights: list[tuple[str, nn.Parameter]] = list(self.module.named_parameters())
        """Every parameter by name, as the weight check compares them."""
        self.param_device = self.params[0].device if self.params else torch.device("cpu")
        """Where the parameters (and so the gradients) live."""

    compute_groups: tuple[tuple[int, ...], ...] = ()
    """Every DP rank computes its micro-batch alone."""

    def global_rank(self, dp_rank: int) -> int:
        """The global rank of DP rank ``dp_rank``."""
        return self.global_ranks[dp_rank]

    def seed_rank(self, rank: int) -> int:
        """Each rank's computation runs with its own seed."""
        return rank

    def replica_columns(self) -> tuple[tuple[int, ...], ...]:
        """One ring over every DP rank: each holds the whole model (or replays it whole)."""
        return (tuple(self.global_ranks),)

    def install_gradient_taps(self, stats: GradStatsState) -> None:
        """Register check 1's comm hook writing into ``stats``; DDP takes one comm hook per
        model."""
        try:
            self.model.register_comm_hook(stats, grad_stats_hook)  # type: ignore[operator]  # DDP's method; the attribute is typed nn.Module, whose __getattr__ says Tensor | Module
        except RuntimeError as err:
            raise RuntimeError(
                f"sdc_agent.Guard could not register its DDP comm hook ({err}); a DDP model takes "
                "one comm hook, so build one Guard per model and register no other hook"
            ) from err

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally: backward passes inside do not all-reduce (nor run the
        hook, so check 1 sees only the synchronising micro-batch)."""
        with self.model.no_sync():  # type: ignore[operator]  # DDP's method, typed through nn.Module's __getattr__
            yield

    # ------------------------------------------------------------------ the checks' parts
    @property
    def weight_redundancy(self) -> bool:
        """Whether check 3 can compare weights: every DDP replica holds all of them."""
        return self.world >= 2

    def coverage_facts(self) -> LayoutFacts:
        """What the layout lets check 3 see (same keys as every adapter's)."""
        return ddp_facts(list(self.global_ranks))

    def make_replayer(
        self,
        compute_loss: ComputeLoss,
        stats: GradStatsState,
        *,
        grad_accum: int = 1,
        scaler: torch.amp.GradScaler | None = None,
        divide_loss: bool = True,
    ) -> Replayer:
        """Check 2's replays: on the bare module, alone (DDP ignores a backward it did not
        prepare); ``grad_accum``, ``scaler`` and ``divide_loss`` say how training
        back-propagated each micro-batch's loss (``stats`` is not needed: the replay reads the
        parameters' own gradients, in the tables' order)."""
        del stats
        return Replayer(
            self.module,
            self.params,
            compute_loss,
            grad_accum=grad_accum,
            scaler=scaler,
            divide_loss=divide_loss,
        )

    def weight_replicas(self) -> WeightReplicas:
        """Check 3 compares every replica's full weights over the data-parallel group."""
        return WeightReplicas(
            named_weights=list(self.named_weights),  # a copy: a list of Tensors, not Parameters
            sharded=False,
            replica_group=self.dp_group,
            shard_group=None,
            group=self.dp_group,
            replicas_of_shard=(tuple(self.global_ranks),),
            collective_device=self.collective_device,
        )

    def with_autograd_parameter(self, name: str, use: Callable[[nn.Parameter], None]) -> None:
        """Call ``use`` with the tensor autograd computes ``name``'s local gradient for."""
        use(self.module.get_parameter(name))

    def local_weight(self, name: str) -> torch.Tensor:
        """This rank's copy of parameter ``name`` (writing to it changes the weights)."""
        return self.module.get_parameter(name)

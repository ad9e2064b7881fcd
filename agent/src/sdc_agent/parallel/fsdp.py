"""The guard's view of a model sharded with FSDP2 (``fully_shard``): full sharding or HSDP.

The same questions as :class:`~.ddp.DDPAdapter` answers (:class:`~.adapter.ParallelAdapter`), so
the checks and the guard's wiring do not know which wrapper they run on. What differs, and why:

* The mesh is learned from the parameters themselves (DTensor ``device_mesh`` / ``placements``,
  :mod:`.mesh`): a 1-D mesh with ``Shard`` placements is full sharding; a 2-D mesh named
  ``("replicate", "shard")`` (or torchtitan's and Accelerate's names for the same two
  dimensions, :data:`HSDP_DIM_NAME_PAIRS`) with ``(Replicate(), Shard)`` placements is HSDP
  (replicas across nodes, shards within a node). A mesh with a tensor-parallel dimension is
  :class:`~.tp.TensorParallelAdapter`'s, torchtitan's expert parallel over HSDP
  :class:`~.ep.ExpertParallelAdapter`'s; anything else (a mesh that does not cover every rank,
  meshes that are not one mesh's dimensions, context or other expert parallel) is refused with
  a clear error: the checks' reasoning (every rank trains on its own micro-batch; replicas of a shard
  hold the same bits) would not hold.
* Every rank is a data-parallel rank: each trains on its own micro-batch, so the ring replay,
  check 1's flags and the rank map run over the whole mesh (WORLD), as under DDP.
* FSDP2 has no comm hook. Check 1's taps are post-accumulate-grad hooks
  (:mod:`sdc_agent.checks.gradients.taps`): on the unsharded parameters for the local, pre-reduction
  gradient, and on the sharded parameters for the reduced one.
* Replays run collectively through the sharded module with gradient sync off
  (:mod:`sdc_agent.checks.replay.collective`): each rank then holds its own local gradient of the replayed
  micro-batch, unsharded, and no reduce-scatter mixes it with the others'.
* Gradient accumulation: :meth:`FSDP2Adapter.no_sync` is ``set_requires_gradient_sync(False)``;
  the audited micro-batch is isolated on the unsharded parameters
  (:mod:`sdc_agent.checks.replay.collective`).
* A GradScaler (fp16) works as under DDP: each micro-batch's loss is scaled in training and in
  the collective replays, and a non-finite local gradient that the third GPU reproduces at the
  same scale is an overflow: no alarm, the scaler skips the step and lowers the scale. What
  differs is who sees the inf. Each rank holds only its shard of the reduced gradient, but in
  torch 2.13 ``GradScaler.unscale_`` on DTensor gradients max-reduces ``found_inf`` over the
  mesh's ``Shard`` dimension (DTensor's handler of ``_amp_foreach_non_finite_check_and_unscale_``)
  and HSDP's replicas hold identical reduced shards, so every rank skips the same steps and
  lowers the scale alike, as ``ShardedGradScaler`` would. That makes ``unscale_`` (and
  ``scaler.step``) a collective (:attr:`FSDP2Adapter.unscale_is_collective`): every rank must
  call it, with its gradients in place, or none. So with a scaler the guard waits for every
  step's flag reduction on every rank and judges any flagged step on every rank at once (never
  leaving a step applied by some ranks and dropped by others), and an overflow verdict needs
  only SOME rank's reduced shard to be non-finite (:meth:`CollectiveRingAudit.scaler_skips_everywhere
  <sdc_agent.checks.replay.audit.CollectiveRingAudit.scaler_skips_everywhere>`).
* Check 3 compares each shard across its replicas (:mod:`sdc_agent.checks.weights.sharded`); with full
  sharding a shard has one copy, so there is nothing to compare: check 3 is off, and the guard
  says so at start (:attr:`FSDP2Adapter.weight_redundancy`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from ..checks.gradients.stats import GradStatsState
from ..checks.gradients.taps import ShardedGradientTaps
from ..checks.replay.collective import CollectiveReplayer
from ..checks.replay.replayer import ComputeLoss, Replayer
from ..coverage import LayoutFacts
from ..topology import collective_device, group_ranks
from .adapter import ParallelAdapter, WeightReplicas
from .mesh import (
    HSDP_DIM_NAME_PAIRS,
    HSDP_DIM_NAMES,
    REPLICATE,
    ShardedLayout,
    ShardingLayoutError,
    learn_layout,
)

__all__ = [
    "HSDP_DIM_NAMES",
    "HSDP_DIM_NAME_PAIRS",
    "FSDP2Adapter",
    "ShardedLayout",
    "ShardingLayoutError",
    "is_fsdp2",
    "sharded_coverage_facts",
]

logger = logging.getLogger("sdc_agent")


def is_fsdp2(model: nn.Module) -> bool:
    """Whether ``model`` was sharded with FSDP2's ``fully_shard``."""
    return isinstance(model, FSDPModule)


def _local_shard(name: str, param: torch.Tensor) -> torch.Tensor:
    """This rank's shard of parameter ``name`` (a view); FSDP2 holds every parameter as a
    DTensor, so anything else is a layout the guard does not support."""
    if not isinstance(param, DTensor):
        raise ShardingLayoutError(
            f"sdc_agent.Guard: parameter {name} is not sharded (not a DTensor); apply "
            "fully_shard to the root module too, so that every parameter is sharded"
        )
    return param.to_local()


def _layout(
    params: list[tuple[str, nn.Parameter]], mesh_size: int | None = None
) -> tuple[DeviceMesh, ShardedLayout]:
    """The mesh and its layout, learned from the parameters (:func:`.mesh.learn_layout`); raises
    when unsupported, or when the mesh does not cover the ranks it must.

    ``mesh_size``: the ranks the mesh must cover (None: every rank of the job; a pipeline
    stage's data-parallel mesh covers the ranks of its stage)."""
    mesh, layout = learn_layout(params)
    if mesh_size is not None:
        if mesh.size() != mesh_size:
            raise ShardingLayoutError(
                f"sdc_agent.Guard: the stage's FSDP2 mesh has {mesh.size()} ranks, expected "
                f"{mesh_size} (the job's ranks divided by the pipeline's); shard each stage over "
                "the data-parallel dimension of the job's mesh"
            )
    elif mesh.size() != dist.get_world_size():
        raise ShardingLayoutError(
            f"sdc_agent.Guard: the FSDP2 mesh has {mesh.size()} ranks but the job has "
            f"{dist.get_world_size()}; every rank must hold a slice of the model on it: with "
            "tensor parallelism, the parameters of the TP plan's layers live on the whole mesh "
            "(parallelize_module on mesh['tp'], then fully_shard on the data-parallel dimensions)"
        )
    return mesh, layout


def _replica_ranks_group(mesh: DeviceMesh, layout: ShardedLayout) -> dist.ProcessGroup:
    """The process group of this rank's replica: every rank holding another slice of the same
    copy of the weights (collective when a replica spans several mesh dimensions)."""
    inner = [dim for dim, role in enumerate(layout.roles) if role != REPLICATE]
    if len(inner) == 1:
        return mesh.get_group(inner[0])
    # Shard x tp: one group per replica, made by every rank in the same order.
    replicas = [list(ranks) for ranks in zip(*layout.replicas_of_shard, strict=True)]
    group, _ = dist.new_subgroups_by_enumeration(replicas)
    return group


def sharded_coverage_facts(layout: ShardedLayout) -> LayoutFacts:
    """What an FSDP2/HSDP ``layout`` lets check 3 see, JSON-ready: a function of the layout
    alone, so the docs' coverage matrix (benchmarks/coverage_matrix.py) asks it of an example
    mesh without a process group."""
    if not layout.weight_redundancy:
        why = "full sharding: each weight shard has one copy, nothing to compare it with"
    elif not layout.majority_possible:
        why = "2 replicas per shard: a divergence is reported, nobody is named"
    else:
        why = f"each shard compared across its {layout.replicas} replicas"
    return {
        "parallel": layout.kind,
        "replicas": layout.replicas,
        "shards": layout.shards,
        "weights_compared": layout.weight_redundancy,
        "weights_named_by_majority": layout.majority_possible,
        "weights_why": why,
        "replicas_of_shard": [list(r) for r in layout.replicas_of_shard],
        "mesh": layout.dims(),
    }


class FSDP2Adapter(ParallelAdapter):
    """The guard's view of an FSDP2 (``fully_shard``) model; see the module docstring."""

    unscale_is_collective = True
    """``GradScaler.unscale_`` on DTensor gradients all-reduces ``found_inf`` over the mesh (see
    the module docstring): every rank must reach ``scaler.step`` together, or none."""
    replays_in_lockstep = True
    """A replay's forward all-gathers the other ranks' shards: every rank replays at once."""
    tensor_parallel = False
    """Whether this adapter checks a tensor-parallel dimension (:mod:`.tp`'s does)."""
    expert_parallel = False
    """Whether this adapter checks an expert-parallel layout (:mod:`.ep`'s does)."""

    def __init__(
        self,
        model: nn.Module,
        dp_group: dist.ProcessGroup | None,
        *,
        mesh_size: int | None = None,
    ) -> None:
        """Check the layout and learn the mesh from the parameters (``dp_group`` must be None).

        ``mesh_size``: the mesh covers this many ranks, not the whole job (a pipeline stage,
        sharded over the data-parallel dimension; :mod:`.pp` builds the job's view around it)."""
        if not is_fsdp2(model):
            raise TypeError(f"FSDP2Adapter needs a fully_shard module, got {type(model).__name__}")
        if dp_group is not None:
            raise ValueError(
                "sdc_agent.Guard: dp_group must be None for an FSDP2 model; the guard learns the "
                "data-parallel mesh from the parameters (DTensor device_mesh)"
            )
        trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.mesh, self.layout = _layout(trainable, mesh_size)
        if self.layout.tensor_parallel and not self.tensor_parallel:
            raise ShardingLayoutError(
                f"sdc_agent: {type(self).__name__} does not check tensor parallel layouts "
                f"({self.layout.kind}); build the Guard (sdc_agent.parallel.adapter_for picks "
                "TensorParallelAdapter)"
            )
        if self.layout.expert_parallel and not self.expert_parallel:
            raise ShardingLayoutError(
                f"sdc_agent: {type(self).__name__} does not check expert parallel layouts "
                f"({self.layout.kind}); build the Guard without a pipeline (expert parallel "
                "under pipeline parallel is not supported; sdc_agent.parallel.adapter_for picks "
                "ExpertParallelAdapter)"
            )
        self.model: nn.Module = model
        """The model training runs: the root FSDP module (``compute_loss`` gets it)."""
        self.module: nn.Module = model
        """The module replays run on: the same root module, replayed collectively with gradient
        sync off (:mod:`sdc_agent.checks.replay.collective`)."""
        self.dp_group: dist.ProcessGroup | None = None
        """Every rank of the mesh is a data-parallel rank: WORLD."""
        self.rank = dist.get_rank()
        """This process's global rank."""
        self.dp_rank = dist.get_rank()
        """This process's data-parallel rank (its global rank: the mesh covers WORLD)."""
        self.global_ranks = group_ranks(None)
        """Global rank of each DP rank."""
        self.world = len(self.global_ranks)
        """Number of data-parallel ranks (each trains on its own micro-batch)."""
        self.collective_device = collective_device(None)
        """Where tensors for the guard's collectives must live."""
        self.params = [p for _, p in trainable]
        """The trainable (sharded) parameters, in the order of every fingerprint table."""
        self.param_names = [n for n, _ in trainable]
        """Their names, row by row."""
        self.named_weights: list[tuple[str, nn.Parameter]] = list(model.named_parameters())
        """Every parameter by name (sharded DTensors: compare their local shards)."""
        self.param_device = _local_shard(self.param_names[0], self.params[0]).device
        """Where the parameters' shards (and so the gradients) live."""
        self.replicate_group: dist.ProcessGroup | None = (
            self.mesh.get_group(0) if self.layout.roles[0] == REPLICATE else None
        )
        """The ranks holding copies of this rank's shard (HSDP; None under full sharding)."""
        # A pipeline stage's view (mesh_size) makes no group: the pipeline's check 3 agrees over
        # groups that span every stage (sdc_agent.parallel.pp), and a group made here would be a
        # collective only this stage's ranks reach.
        self.shard_group: dist.ProcessGroup | None = (
            _replica_ranks_group(self.mesh, self.layout) if mesh_size is None else None
        )
        """The ranks holding the other shards of this rank's replica (None in a pipeline
        stage's view)."""
        self.taps: ShardedGradientTaps | None = None
        """Check 1's hooks, once :meth:`install_gradient_taps` installed them."""
        self._fsdp_modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
        if self.layout.weight_redundancy is False and self.rank == 0:
            logger.warning(
                "sdc_agent: FSDP2 full sharding (%s): each weight shard has a single copy, so "
                "check 3 (weight fingerprints across replicas) is off; a bit flip in a stored "
                "weight is caught only when it changes a computation that an audit replays. Use "
                "HSDP (a ('replicate', 'shard') mesh, ('replicate', 'shard', 'tp') with tensor "
                "parallel, with >= 3 replicas) for weight redundancy",
                self.layout.kind,
            )

    # ------------------------------------------------------------------ the adapter's answers
    @property
    def weight_redundancy(self) -> bool:
        """Whether check 3 can compare weights at all (HSDP with >= 2 replicas)."""
        return self.layout.weight_redundancy

    def coverage_facts(self) -> LayoutFacts:
        """What the layout lets check 3 see, JSON-ready (for a report of the guard's coverage:
        :func:`sharded_coverage_facts`)."""
        return sharded_coverage_facts(self.layout)

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
        """Install check 1's taps writing into ``stats``: FSDP2 has no comm hook, so they are
        post-accumulate-grad hooks (see :mod:`sdc_agent.checks.gradients.taps`)."""
        if self.taps is not None:
            raise RuntimeError("sdc_agent.Guard: build one Guard per FSDP2 model")
        self.taps = ShardedGradientTaps(self.model, self.params, self.param_names, stats)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally: FSDP2's ``set_requires_gradient_sync(False)``; check 1's
        local taps record no entry of their own (DDP's comm hook does not run inside ``no_sync``
        either) but check each micro-batch's local gradient into a flag the step carries.

        That is needed under a ``MixedPrecisionPolicy`` whose reduce dtype differs from the
        parameters': FSDP2 then moves each earlier micro-batch's gradient into a private float32
        buffer, and the synchronising micro-batch's tap sees its own gradient alone, not the
        accumulated one as DDP's hook does; a NaN in an earlier micro-batch is still named as
        this rank's local one. The check is one fused pass per parameter and micro-batch
        (:mod:`sdc_agent.checks.gradients.finiteness`), so it is made whatever the policy.
        """
        self.set_gradient_sync(False)
        try:
            with self.gradient_taps().paused():
                yield
        finally:
            self.set_gradient_sync(True)

    def set_gradient_sync(self, enabled: bool) -> None:
        """Turn the reduce-scatter (and HSDP's all-reduce) of later backward passes on or off."""
        self.model.set_requires_gradient_sync(enabled)  # type: ignore[operator]  # FSDPModule's method on a model typed nn.Module

    def discard_unsynced_gradients(self) -> None:
        """Drop the local gradients a backward with sync off left on the unsharded parameters.

        FSDP2 keeps them for the next synchronising backward to add to; a replay's must not be
        added to anything. FSDP2 has no public call for this: the accumulated gradient of a
        reduce dtype other than the parameters' lives on its private ``FSDPParam`` objects.
        """
        for leaf in self.gradient_taps().unsharded_parameters():
            leaf.grad = None
        for module in self._fsdp_modules:
            state = module._get_fsdp_state()
            for group in state._fsdp_param_groups:
                for fsdp_param in group.fsdp_params:
                    if getattr(fsdp_param, "unsharded_accumulated_grad", None) is not None:
                        fsdp_param.unsharded_accumulated_grad = None

    def with_autograd_parameter(self, name: str, use: Callable[[nn.Parameter], None]) -> None:
        """Call ``use`` with the tensor autograd computes ``name``'s local gradient for: FSDP2's
        unsharded parameter, which exists from the first forward on (fault drills use it)."""
        self.gradient_taps().when_unsharded(name, use)

    def local_weight(self, name: str) -> torch.Tensor:
        """This rank's shard of parameter ``name`` (a view: writing to it changes the weights)."""
        return _local_shard(name, self.model.get_parameter(name))

    # ------------------------------------------------------------------ the checks' parts
    def make_replayer(
        self,
        compute_loss: ComputeLoss,
        stats: GradStatsState,
        *,
        grad_accum: int = 1,
        scaler: torch.amp.GradScaler | None = None,
        divide_loss: bool = True,
    ) -> Replayer:
        """Check 2's replays: collective, through the sharded module, with sync off; with a
        ``scaler`` each replayed micro-batch's loss is scaled by the step's scale, as in
        training, so an overflow reproduces (see the module docstring); ``divide_loss`` as
        the guard's."""
        return CollectiveReplayer(
            self,
            compute_loss,
            stats,
            grad_accum=grad_accum,
            scaler=scaler,
            divide_loss=divide_loss,
        )

    def weight_replicas(self) -> WeightReplicas:
        """Check 3 compares each local shard across its replicas (HSDP's replicate group); under
        full sharding a shard has one copy (``replicas`` 1: check 3 is off)."""
        return WeightReplicas(
            named_weights=list(self.named_weights),  # a copy: a list of Tensors, not Parameters
            sharded=True,
            replica_group=self.replicate_group,
            shard_group=self.shard_group,
            group=self.dp_group,
            replicas_of_shard=self.layout.replicas_of_shard,
            collective_device=self.collective_device,
        )

    def gradient_taps(self) -> ShardedGradientTaps:
        """Check 1's hooks on this model (installed when the Guard is built)."""
        if self.taps is None:
            raise RuntimeError(
                "sdc_agent: check 1's taps are not installed (build the Guard first)"
            )
        return self.taps

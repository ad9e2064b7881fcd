"""How the model is parallelised, behind one protocol: what each check asks, answered per layout.

The checks and the guard's wiring never branch on the wrapper. Each check asks a
:class:`ParallelAdapter` (:mod:`.adapter`) for what it compares, and :func:`adapter_for` picks
the adapter from the model:

* :mod:`.ddp`: :class:`DDPAdapter`, a ``DistributedDataParallel`` model;
* :mod:`.fsdp`: :class:`FSDP2Adapter`, a model sharded with FSDP2's ``fully_shard``: full
  sharding (1-D mesh) or HSDP (a ``("replicate", "shard")`` mesh, or torchtitan's and
  Accelerate's names for it), learned from the parameters;
* :mod:`.tp`: :class:`TensorParallelAdapter`, tensor parallelism (``ColwiseParallel``,
  ``RowwiseParallel``, ``SequenceParallel``) composed with FSDP2 or HSDP on a ``("dp", "tp")``
  or ``("replicate", "shard", "tp")`` mesh;
* :mod:`.pp`: :class:`PipelineAdapter`, when a ``torch.distributed.pipelining`` schedule drives
  the model (``Guard(..., pipeline=schedule)``): this rank's stage, sharded with FSDP2 over the
  replicas, tensor parallel inside it or not (the stage's view is then
  :class:`TensorParallelAdapter`'s); how it answers each question below is its module docstring.

:mod:`.mesh` learns the mesh and every dimension's role (replicate, shard, tp) from the
parameters' DTensor placements, sub-meshes included, and refuses what it cannot check (context
parallel, and expert parallel other than torchtitan's over HSDP, by the dimension it found).

* :mod:`.ep`: :class:`ExpertParallelAdapter`, torchtitan's expert parallel (MoE) over HSDP
  (the routed experts on ``("dp_replicate", "efsdp", "ep")``, the rest on
  ``("dp_replicate", "fsdp")``): checks 1 and 3 as HSDP's, check 2 and the sensors off with
  the reason (its module docstring says why).

What each check asks, and how DDP and FSDP2 answer:

* The job: the module training runs (``model``) and the one replays run on (``module``); the
  data-parallel ranks (each trains on its own micro-batch; the ring audit and the flags run over
  them), the group and device of the guard's collectives.
* The step: ``run_step`` runs one training step's forward and backward (a pipeline's is its
  schedule's ``step``: ``schedule_runs_backward``), ``steps_judged_together`` says whether every
  rank decides each step with the others, and ``make_audit`` builds check 2's audit for the
  replay unit (a pipeline's compares stages), so the guard never asks which layout it has.
* Check 1 (:mod:`sdc_agent.checks.gradients`): ``install_gradient_taps``, where each rank's
  LOCAL gradient is seen before any reduction mixes it and the REDUCED one after (DDP: the comm
  hook; FSDP2: post-accumulate-grad hooks on the unsharded and the sharded parameters);
  ``no_sync``; ``unscale_is_collective``.
* Check 2 (:mod:`sdc_agent.checks.replay`): the replay unit, ``make_replayer`` (DDP: the bare
  module, alone; FSDP2: the sharded module with gradient sync off, its taps fingerprinting each
  rank's local gradient), and the group that replays together, ``replays_in_lockstep`` (DDP:
  each rank alone; FSDP2: every rank at once, confirmations in rounds).
* Check 3 (:mod:`sdc_agent.checks.weights`): ``weight_replicas``, the tensors this rank holds
  and which ranks hold copies of the same bits (DDP: every replica, whole; HSDP: each shard's
  replicas along ``replicate``, the shard group to agree on one verdict; full sharding: one
  copy, nothing to compare).

How tensor parallelism (:mod:`.tp`) and pipeline parallelism (:mod:`.pp`) answer them, as
further dimensions of the same device mesh, each adapter answering the questions above for its
dimension, composed with the data-parallel one:

* The job: the ranks of a TP group (a PP group too, for the pipeline) compute ONE micro-batch
  together (``rebuild_batch(step, rank)`` returns the micro-batch of global ``rank``'s group),
  and draw one RNG stream (``seed_rank``). Every rank is still one of the guard's ranks (it has
  its own local results to check); ``compute_groups`` lists the groups.
* Check 1: the local gradient is each rank's own, before the data-parallel reduction (a TP
  slice of the gradient, a stage's gradients): the same taps as FSDP2's, on the tensors the TP
  and PP modules own; every reduced gradient after it; one flag reduction over the whole world.
* Check 2: the replay unit is a whole group (a TP group replaying collectively; a pipeline
  schedule's ``step`` over the stages), so ``replays_in_lockstep`` holds for every rank of the
  mesh; what is compared is each rank's LOCAL work before a collective mixes it (partial
  outputs before a row-parallel all-reduce, gradient slices before reduce-scatter, the
  activations a stage sends and the gradients it receives), rank by rank at the same (tp, pp)
  coordinates, so that the earliest local divergence names one GPU, not its group.
* Check 3: ``weight_replicas`` with ``sharded`` true: each local slice compared across the
  data-parallel replicas at the same (tp, pp, shard) coordinates, the other coordinates of the
  replica as the shard group.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from .._compile import refuse_compiled
from ..checks.replay.replayer import ComputeLoss
from .adapter import ParallelAdapter, WeightReplicas
from .ddp import DDPAdapter, require_ddp
from .ep import ExpertParallelAdapter
from .fsdp import FSDP2Adapter, is_fsdp2
from .mesh import ShardedLayout, ShardingLayoutError, learn_layout
from .pp import PipelineAdapter, check_pipeline_options
from .tp import TensorParallelAdapter

__all__ = [
    "DDPAdapter",
    "ExpertParallelAdapter",
    "FSDP2Adapter",
    "ParallelAdapter",
    "PipelineAdapter",
    "ShardedLayout",
    "ShardingLayoutError",
    "TensorParallelAdapter",
    "WeightReplicas",
    "adapter_for",
    "check_step_options",
]


def check_step_options(
    pipeline: Any, compute_loss: ComputeLoss | None, scaler: Any, grad_accum: int
) -> None:
    """Refuse how the guard was asked to run the step when the layout cannot honour it: a
    ``pipeline`` schedule runs its own loss and backward (no ``compute_loss``, no scaler);
    every other layout needs ``compute_loss``. Called before :func:`adapter_for`, whose
    collectives every rank then reaches alike."""
    if pipeline is not None:
        check_pipeline_options(pipeline, compute_loss, scaler, grad_accum)
    elif not callable(compute_loss):
        raise TypeError(
            "Guard needs callables compute_loss(model, batch) and rebuild_batch(step, rank)"
        )


def adapter_for(
    model: nn.Module, dp_group: dist.ProcessGroup | None, pipeline: Any = None
) -> ParallelAdapter:
    """The adapter for ``model``: :class:`PipelineAdapter` when a ``pipeline`` schedule drives
    it (``model`` is then this rank's stage module), :class:`ExpertParallelAdapter` for an FSDP2
    module whose experts live on an expert-parallel mesh, :class:`TensorParallelAdapter` for an
    FSDP2 module whose mesh has a tensor-parallel dimension, :class:`FSDP2Adapter` for another FSDP2
    module, else DDP's. A compiled model, or compiled autograd, is refused first."""
    refuse_compiled(model)  # before any adapter's collectives: every rank refuses alike
    if pipeline is not None:
        return PipelineAdapter(model, pipeline, dp_group)
    if is_fsdp2(model):
        trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        _, layout = learn_layout(trainable)
        if layout.expert_parallel:
            return ExpertParallelAdapter(model, dp_group)
        if layout.tensor_parallel:
            return TensorParallelAdapter(model, dp_group)
        return FSDP2Adapter(model, dp_group)
    if any(is_fsdp2(m) for m in model.modules()):
        raise ShardingLayoutError(
            f"sdc_agent.Guard: {type(model).__name__} has fully_shard submodules but is not "
            "sharded itself; apply fully_shard to the root module too and pass that"
        )
    if any(isinstance(p, DTensor) for p in model.parameters()):
        raise ShardingLayoutError(
            f"sdc_agent.Guard: {type(model).__name__} has DTensor (tensor parallel) parameters "
            "but is not sharded with fully_shard; the guard checks tensor parallelism composed "
            "with FSDP2 or HSDP: fully_shard the model on the data-parallel dimensions of the "
            "mesh (('dp', 'tp') or ('replicate', 'shard', 'tp'))"
        )
    return DDPAdapter(require_ddp(model), dp_group)  # TypeError for anything that is not DDP

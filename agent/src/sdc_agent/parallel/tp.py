"""The guard's view of a tensor-parallel model composed with FSDP2 (full sharding or HSDP).

torchtitan's recipe: ``parallelize_module(model, mesh["tp"], plan)`` with ``ColwiseParallel``,
``RowwiseParallel`` and ``SequenceParallel``, then ``fully_shard`` on the data-parallel
dimensions of a ``("dp", "tp")`` or ``("replicate", "shard", "tp")`` mesh. The mesh and every
dimension's role are learned from the parameters (:mod:`.mesh`); :class:`TensorParallelAdapter`
answers the checks' questions (:class:`~.adapter.ParallelAdapter`) as FSDP2's adapter does, and
what differs is why:

* Who computes what. The ranks of a TP group (the mesh's last dimension; inside a node) compute
  ONE micro-batch together, each with its slice of the weights, so ``rebuild_batch(step, rank)``
  returns the micro-batch of ``rank``'s group. Every rank is still one of the guard's ranks: each
  has its own local results to check, and rank r replays the micro-batch of rank
  r + ``peer_offset``, which must sit at the same tp coordinate in another group (``peer_offset``
  a multiple of the TP degree: the GPUs per node when TP fills a node). So every TP group
  replays another group's micro-batch, collectively, on another node, and each rank's replay is
  compared with the one rank that computed the same slice of it (:mod:`sdc_agent.topology`
  checks this placement at start).
* The RNG. A TP group draws one RNG stream (its replicated activations must agree, e.g. a
  dropout after a row-parallel all-reduce): an audited step is seeded from (step, the group's
  first rank) on every rank of the group (:meth:`TensorParallelAdapter.seed_rank`), and a replay
  of that group's micro-batch draws the same numbers.
* Check 1: FSDP2's taps (:mod:`sdc_agent.checks.gradients.taps`). The unsharded parameters are
  DTensors over the tp dimension; each rank's local gradient is its slice, seen before the
  data-parallel reduce-scatter, and its shard of the reduced gradient after it. One flag
  reduction per step over the whole world, as before.
* Check 2: what a rank computes locally, in order (:meth:`TensorParallelAdapter.install_gradient_taps`):
  the output of every module that owns parameters, seen before the module's own output hooks
  (so before ``RowwiseParallel`` all-reduces a partial output, and ``ColwiseParallel``'s local
  slice), and each local gradient slice as autograd stores it, before the reduce-scatter. A
  wrong value on one rank reaches its TP partners only through a collective, AFTER that rank's
  own result diverged; so the pairs whose local results diverge first name the GPU, not its
  group (:func:`~sdc_agent.checks.replay.attribution.earliest_local_mismatches`), and the
  ring's attribution (culprits, confirmations on a third group, verdicts) runs on them. With
  ``grad_accum`` > 1 the audited micro-batch's own gradient is isolated per parameter
  (:mod:`sdc_agent.checks.replay.accumulation`) and its local results are not recorded, so the
  replays compare per-parameter local gradients, as FSDP2's do: a divergence is named on every
  rank whose slices it reached (a wrong value a collective carried names the TP partners too).
* Check 3: each slice compared across its replicas at the same (shard, tp) coordinate
  (``("replicate", "shard", "tp")``: a strict majority of >= 3 replicas names the rank); under
  ``("dp", "tp")`` every slice has one copy and check 3 is off, as under full sharding.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..checks.gradients.stats import GradStatsState
from ..checks.gradients.taps import ShardedGradientTaps
from ..coverage import LayoutFacts
from ..fingerprint import fingerprints
from .fsdp import FSDP2Adapter, sharded_coverage_facts
from .mesh import ShardedLayout


def _first_tensor(output: Any) -> torch.Tensor | None:
    """A module's output tensor (the first of a tuple or list), or None."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)):
        return next((o for o in output if isinstance(o, torch.Tensor)), None)
    return None


def tp_coverage_facts(layout: ShardedLayout) -> LayoutFacts:
    """FSDP2's facts (:func:`~sdc_agent.parallel.fsdp.sharded_coverage_facts`, the mesh
    included), with each slice named by its (shard, tp) coordinate, and the TP groups."""
    facts = sharded_coverage_facts(layout)
    if not layout.weight_redundancy:
        facts["weights_why"] = (
            "no replicate dimension: each (shard, tp) slice of the weights has one copy, "
            "nothing to compare it with"
        )
    elif layout.majority_possible:
        facts["weights_why"] = (
            f"each (shard, tp) slice compared across its {layout.replicas} replicas"
        )
    facts["compute_groups"] = [list(g) for g in layout.tp_groups]
    return facts


class TensorParallelAdapter(FSDP2Adapter):
    """The guard's view of a TP x FSDP2 / HSDP model; see the module docstring."""

    tensor_parallel = True
    """This adapter checks the tensor-parallel dimension."""

    def __init__(
        self,
        model: nn.Module,
        dp_group: dist.ProcessGroup | None,
        *,
        mesh_size: int | None = None,
    ) -> None:
        """Check the layout and learn the mesh, the TP groups among it, from the parameters.

        ``mesh_size``: the mesh covers this many ranks, not the whole job (a pipeline stage
        with tensor parallelism inside it; :mod:`.pp` builds the job's view around it)."""
        super().__init__(model, dp_group, mesh_size=mesh_size)
        layout = self.layout
        self.tp_group: dist.ProcessGroup = self.mesh.get_group(len(layout.roles) - 1)
        """The ranks of this rank's TP group."""
        self.compute_groups: tuple[tuple[int, ...], ...] = layout.tp_groups
        """Every TP group's ranks (the guard's ranks are the global ranks), in tp order."""
        self._group_seed = {rank: group[0] for group in layout.tp_groups for rank in group}
        self._probes: list[Any] = []

    def seed_rank(self, rank: int) -> int:
        """The first rank of ``rank``'s TP group: the group computes its micro-batch with one
        RNG stream (see the module docstring)."""
        return self._group_seed[rank]

    def coverage_facts(self) -> LayoutFacts:
        """FSDP2's facts with each slice named by its (shard, tp) coordinate, and the TP groups
        (:func:`tp_coverage_facts`)."""
        return tp_coverage_facts(self.layout)

    def install_gradient_taps(self, stats: GradStatsState) -> None:
        """FSDP2's taps (:meth:`FSDP2Adapter.install_gradient_taps`), recording the local
        gradients in order too, and check 2's probes: a forward hook on every module that owns
        parameters, first among its hooks (``prepend``: before tensor parallel's output
        redistribution), that fingerprints its local output on steps that capture."""
        super().install_gradient_taps(stats)
        stats.records_events = True
        taps = self.gradient_taps()
        for module in self.module.modules():
            if next(module.parameters(recurse=False), None) is None:
                continue
            self._probes.append(module.register_forward_hook(self._probe(taps), prepend=True))

    @staticmethod
    def _probe(taps: ShardedGradientTaps) -> Callable[[nn.Module, Any, Any], None]:
        def probe(module: nn.Module, args: Any, output: Any) -> None:
            state = taps.state  # the step's, or a replay's own (ShardedGradientTaps.recording_into)
            events = state.local_events
            if events is None or not state.capture_fingerprints:
                return
            tensor = _first_tensor(output)
            if tensor is not None and state.local_fingerprints is not None:
                # A DTensor's fingerprint is its local slice's: a row-parallel layer's partial
                # output before the all-reduce, a column-parallel layer's local columns.
                state.add_local_event(fingerprints([tensor])[0].to(state.local_fingerprints.device))

        return probe

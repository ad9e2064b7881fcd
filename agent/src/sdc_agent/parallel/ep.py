"""The guard's view of an expert-parallel (MoE) model over HSDP, as torchtitan lays it out.

torchtitan's recipe (``ParallelDims(dp_replicate=R, dp_shard=S, ep=E)``, plain DTensors): the
routed experts' weights are sharded ``Shard(0)`` (the expert dimension) over an ``ep`` dimension,
then ``fully_shard`` puts them on the expert mesh ``("dp_replicate", "efsdp", "ep")`` and every
other parameter (attention, the router's gate, shared experts, embeddings) on the HSDP mesh
``("dp_replicate", "fsdp")``; the MoE layer routes each token to its top-k experts and sends it
to the EP rank holding each by an all-to-all, computes the local experts with grouped GEMMs and
sends the results back by a second all-to-all. :mod:`.mesh` learns this layout (``"hsdp+ep"``)
from the parameters and refuses every other expert-parallel layout by the dimension it found
(EP with TP, ``etp``, older ``dp_shard_in_ep`` / ``dp_shard_mod_ep`` names, EP without replicas).

What each check does here, and why:

* The job. Every rank trains on its own micro-batch (its tokens), as under HSDP: the EP ranks
  exchange tokens inside the MoE layer, but each rank's loss and gradients are its own batch's.
  So the ranks, the flags and the rank map are FSDP2's (:class:`~.fsdp.FSDP2Adapter`).
* Check 1: FSDP2's taps (:mod:`sdc_agent.checks.gradients.taps`), on every parameter, the
  experts included (their unsharded parameters are the tensors autograd accumulates into
  through ``to_local()``): each rank's local gradient before the reduce-scatter / all-reduce,
  its shard of the reduced one after it; one flag reduction per step over the whole world. An
  expert's gradient holds the contributions of every token routed to it, from every rank of
  the EP group, so a NaN that one rank's tokens carry through the combine all-to-all reaches
  its EP partners' expert gradients within the step: check 1 names every rank whose local
  gradient it reached (``coverage()`` says so). Without a replay audit there is no
  confirmation replay: a non-finite local gradient is named without one. A NaN in one expert's
  gradient reaches, through the reduction over that expert's copies, only the ranks holding
  it: the other EP ranks' reduced gradients stay finite, so every rank waits for each step's
  flags and a flagged step is dropped by every rank together
  (:attr:`ExpertParallelAdapter.steps_judged_together`: one blocking flag reduction per
  step, as under a pipeline).
* Check 2 does not run (:meth:`ExpertParallelAdapter.make_audit` turns it off, with the
  reason, before the first step): a replay of another replica's micro-batch would have to
  replay a whole EP group's all-to-all dispatch, with the same routing, and compare each
  expert's local inputs, outputs and gradients in order; nothing replays that yet. A replay
  that did not would compare GPUs on work that never happened in training: the audit is off,
  so it can never raise a false alarm. For the same reason the online sensors are off (their
  candidates are confirmed by replays), and ``coverage()`` says both.
* Check 3: both meshes unflatten the same ranks with ``dp_replicate`` outermost, so the ranks
  at one position within a replica hold the same dense shard and the same experts' shard (the
  experts' expert-data-parallel copies are HSDP's replicas): each local shard, dense or expert,
  is compared across its ``dp_replicate`` copies exactly as under HSDP
  (:mod:`sdc_agent.checks.weights.sharded`); with >= 3 replicas a strict majority names the
  rank whose stored expert weight changed, and the checkpoint is blocked.
"""

from __future__ import annotations

import torch.distributed as dist
from torch import nn

from ..checks.replay.audit import RebuildBatch, RingAudit
from ..checks.replay.replayer import Replayer
from ..coverage import LayoutFacts
from ..reporting import Reporter
from .fsdp import FSDP2Adapter, sharded_coverage_facts
from .mesh import ShardedLayout

NO_REPLAY = (
    "expert parallel: the replay audit does not yet run (routing and the all-to-all dispatch "
    "and combine are not replayed), so a finite wrong value in an expert's or the router's "
    "computation is caught only if it leaves the replicas' weights different or makes a "
    "gradient non-finite"
)
"""Why check 2 is off under expert parallel (``coverage()``'s replay_audit entry)."""

NO_SENSORS = (
    "expert parallel: the online sensors are off (their candidates are confirmed by replays, "
    "which do not run under EP; sdc.protect does not instrument grouped GEMMs "
    "(torch._grouped_mm) or the router)"
)
"""Why the online sensors are off under expert parallel."""


def ep_coverage_facts(layout: ShardedLayout) -> LayoutFacts:
    """HSDP's facts (:func:`~sdc_agent.parallel.fsdp.sharded_coverage_facts`), each shard's
    replicas holding the dense shard and the experts' shard alike, with the EP groups and why
    the replays are off; a function of the layout alone."""
    facts = sharded_coverage_facts(layout)
    if layout.weight_redundancy:
        facts["weights_why"] = (
            f"each dense shard and each expert shard compared across its {layout.replicas} "
            "expert-data-parallel copies (the dp_replicate replicas)"
        )
    facts["mesh"] = {**layout.dims(), "ep": layout.ep}
    facts["expert_groups"] = [list(g) for g in layout.ep_groups]
    facts["replays_off"] = NO_REPLAY
    return facts


class ExpertParallelAdapter(FSDP2Adapter):
    """The guard's view of torchtitan's EP x HSDP model; see the module docstring."""

    expert_parallel = True
    """This adapter checks the ``"hsdp+ep"`` layout."""
    sensors_unsupported = NO_SENSORS
    """Online sensors cannot run under EP (see :data:`NO_SENSORS`)."""
    steps_judged_together = True
    """Every rank waits for each step's flags and judges a flagged step with the others: a NaN
    in one expert's gradient reaches only the ranks holding that expert (its copies' reduction),
    not their EP partners, whose reduced gradients stay finite; without this they would apply
    a step the others drop, and the model's experts would no longer be one step's."""

    def __init__(self, model: nn.Module, dp_group: dist.ProcessGroup | None) -> None:
        """Check the layout and learn both meshes from the parameters (:mod:`.mesh`)."""
        super().__init__(model, dp_group)
        self.ep_groups: tuple[tuple[int, ...], ...] = self.layout.ep_groups
        """Every EP group's ranks (they exchange one MoE layer's tokens by all-to-all)."""

    def coverage_facts(self) -> LayoutFacts:
        """HSDP's facts with the EP groups (:func:`ep_coverage_facts`)."""
        return ep_coverage_facts(self.layout)

    def make_audit(
        self,
        replayer: Replayer,
        rebuild_batch: RebuildBatch,
        reporter: Reporter,
        **options: object,
    ) -> RingAudit:
        """FSDP2's audit, turned off before the first step with the reason (see the module
        docstring): it runs no replay and confirms nothing, so it never names a GPU."""
        audit = super().make_audit(replayer, rebuild_batch, reporter, **options)
        audit.turn_off(NO_REPLAY, setup_finding=False)
        return audit

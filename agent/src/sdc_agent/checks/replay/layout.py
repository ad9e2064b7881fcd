"""What check 2 asks of the parallel layout, as the protocol check 2 owns.

:class:`sdc_agent.parallel.ParallelAdapter` answers it (every adapter is a
:class:`ReplayLayout`), but check 2 does not import the adapters: the adapters build check 2's
audit (``ParallelAdapter.make_audit``), so the dependency points one way, from the layouts to
the checks.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.distributed as dist
from torch import nn


class ReplayLayout(Protocol):
    """Who replays whom, and where the audit's collectives run: the part of
    :class:`~sdc_agent.parallel.ParallelAdapter` (which extends it) that check 2 asks for.

    Ranks are counted in the data-parallel dimension (DP ranks: the replicas that each train on
    their own micro-batch and replay each other's), numbered 0..world-1; :meth:`global_rank`
    maps them to global ranks."""

    model: nn.Module
    """The model training runs (``compute_loss`` gets it)."""
    module: nn.Module
    """The module replays run on."""
    rank: int
    """This process's global rank."""
    dp_rank: int
    """This process's data-parallel rank."""
    world: int
    """Number of data-parallel ranks."""
    global_ranks: list[int]
    """Global rank of each DP rank."""
    dp_group: dist.ProcessGroup | None
    """The data-parallel process group the guard's collectives run over (None: WORLD)."""
    collective_device: torch.device
    """Where tensors for collectives over :attr:`dp_group` must live."""
    param_device: torch.device
    """Where the parameters (and so the gradients) live."""
    compute_groups: tuple[tuple[int, ...], ...]
    """DP ranks that compute ONE micro-batch together, each on its own slice of the weights
    (tensor-parallel groups), by group; empty when every DP rank computes its micro-batch alone
    (DDP, FSDP2). Check 2 compares the LOCAL results of a group's ranks one by one and names
    the rank whose result diverged first (:func:`~sdc_agent.checks.replay.attribution.earliest_local_mismatches`)."""

    def global_rank(self, dp_rank: int) -> int:
        """The global rank of DP rank ``dp_rank``."""
        ...

    def seed_rank(self, rank: int) -> int:
        """The global rank whose seed global ``rank``'s computation of an audited (or seeded)
        step runs with (:func:`~sdc_agent.checks.replay.environment.step_seed`): its own, or the
        first rank of the group it computes with (a TP group draws one RNG stream, as its
        replicated activations need), so that a replay on another rank draws the same numbers."""
        ...

    def replica_columns(self) -> tuple[tuple[int, ...], ...]:
        """Check 2's rings: per coordinate of the model that replicas hold (one under data
        parallelism alone; one per pipeline stage), the global ranks holding it, by replica.
        Each replays and is compared along its ring; the placement rule holds on each."""
        ...

    replays_in_lockstep: bool
    """The group that replays together: False when each rank recomputes another's micro-batch
    alone; True when a replay's forward needs the other ranks (sharded parameters), so every
    rank replays at the same time and confirmations run in rounds."""

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
    """Who replays whom, and where the audit's collectives run (answered by a
    :class:`~sdc_agent.parallel.ParallelAdapter`; its docstrings say what each member means)."""

    model: nn.Module
    """The model training runs."""
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
    """The data-parallel process group the audit's collectives run over (None: WORLD)."""
    collective_device: torch.device
    """Where tensors for collectives over :attr:`dp_group` must live."""
    param_device: torch.device
    """Where the parameters (and so the gradients) live."""
    compute_groups: tuple[tuple[int, ...], ...]
    """DP ranks that compute one micro-batch together (tensor parallel), by group."""
    replays_in_lockstep: bool
    """Every rank replays at once (sharded parameters) rather than each alone."""

    def global_rank(self, dp_rank: int) -> int:
        """The global rank of DP rank ``dp_rank``."""
        ...

    def seed_rank(self, rank: int) -> int:
        """The global rank whose seed global ``rank``'s seeded computation runs with."""
        ...

    def replica_columns(self) -> tuple[tuple[int, ...], ...]:
        """Check 2's rings: per replicated coordinate, the global ranks holding it, by replica."""
        ...

"""Check 3, weight fingerprints: the guard's comparisons of the replicas' weights, and their verdict.

:class:`WeightCheck` runs comparisons at once (before a checkpoint, after a load) or launches one
after an update and judges it at the next agreement point. What it compares is the parallelism
adapter's answer (:meth:`~sdc_agent.parallel.adapter.ParallelAdapter.weight_replicas`):
whole replicas (:mod:`.divergence`), each shard across its replicas (:mod:`.sharded`), or, when
no weight has a second copy (FSDP2 full sharding), nothing (:class:`WeightCheckOff`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ...alarm import Alarm
from ...parallel.adapter import WeightReplicas
from ...reporting import Reporter
from ..protocol import Check
from .divergence import DivergenceCheck, ReplicaComparison
from .sharded import ShardedDivergenceCheck


def weight_check(replicas: WeightReplicas, reporter: Reporter) -> WeightCheck | WeightCheckOff:
    """Check 3 over ``replicas``: whole replicas compared, each shard across its replicas, or off
    when a shard has a single copy."""
    if not replicas.sharded:
        return WeightCheck(replicas.named_weights, replicas.replica_group, reporter)
    if replicas.replicas < 2:
        return WeightCheckOff()
    return ShardedWeightCheck(replicas, reporter)


class WeightCheck(Check):
    """Check 3 for one guard: compares every replica's weights and reports the verdict.

    Collective like :class:`DivergenceCheck`: every rank calls :meth:`compare_now` and
    :meth:`launch` at the same steps, and settles what :meth:`launch` started at the same
    agreement point (:meth:`take_in_flight` then :meth:`judge` or :meth:`DivergenceCheck.wait`).
    It runs after updates, not inside a step: the step hooks of :class:`.Check` do nothing.
    """

    coverage_key = "weight_fingerprints"

    def __init__(
        self,
        named_weights: list[tuple[str, torch.Tensor]],
        dp_group: dist.ProcessGroup | None,
        reporter: Reporter,
    ) -> None:
        """``named_weights``: what every replica must hold bit-identically."""
        self._named_weights = named_weights
        self._group = dp_group
        self._reporter = reporter
        self._in_flight: tuple[int, ReplicaComparison] | None = None

    def _start_comparison(self) -> ReplicaComparison:
        """Fingerprint the weights as they are now and launch their comparison."""
        return DivergenceCheck(self._named_weights, self._group)

    def compare_now(self, step: int) -> Alarm | None:
        """Compare the weights as they are now, after ``step``'s update (collective, blocking)."""
        return self.judge(step, self._start_comparison())

    def launch(self, step: int) -> None:
        """Fingerprint the weights after ``step``'s update and launch their comparison; it is
        judged at the next agreement point."""
        if self._in_flight is not None:
            raise RuntimeError(
                "sdc_agent: a weight check is still in flight; call check_gradients (or "
                "Guard.finish) between two after_update calls"
            )
        self._in_flight = (step, self._start_comparison())

    def take_in_flight(self) -> tuple[int, ReplicaComparison] | None:
        """The launched comparison (the step it was taken after), now owned by the caller."""
        in_flight, self._in_flight = self._in_flight, None
        return in_flight

    def judge(self, step: int, check: ReplicaComparison) -> Alarm | None:
        """Check 3's verdict on a comparison of the weights after ``step``'s update: records the
        pass and the agreed digest, or logs, publishes and returns the Alarm."""
        report = check.report()
        reporter = self._reporter
        if report.agreed:
            reporter.record_pass("weights", step, digest=report.digest)
            return None
        return reporter.log_and_publish(reporter.weights_alarm(step, report))


class ShardedWeightCheck(WeightCheck):
    """Check 3 for sharded weights with replicas (HSDP): :class:`WeightCheck` (the guard calls
    it at the same points, a pass records the combined digest), comparing each shard across its
    replicas."""

    def __init__(self, replicas: WeightReplicas, reporter: Reporter) -> None:
        """Compare this rank's local shards over its replica group."""
        super().__init__(replicas.named_weights, replicas.replica_group, reporter)
        self._replicas = replicas

    def _start_comparison(self) -> ShardedDivergenceCheck:
        """Fingerprint this rank's shards now and launch their comparison with the replicas'."""
        return ShardedDivergenceCheck(self._replicas)


class WeightCheckOff(Check):
    """Check 3 where weights have no redundancy (full sharding): compares nothing, records no
    pass (``last_weight_check_pass`` stays None, so checkpoint tags say the weights were not
    verified)."""

    coverage_key = "weight_fingerprints"

    def compare_now(self, step: int) -> Alarm | None:
        """Nothing to compare: no alarm."""
        return None

    def launch(self, step: int) -> None:
        """Nothing to launch."""

    def take_in_flight(self) -> None:
        """Nothing is ever in flight."""
        return None

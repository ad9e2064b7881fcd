"""Check 1's taps on an FSDP2 model: where the local and the reduced gradient can be seen.

FSDP2 has no comm hook, and its reduce-scatter input is a flat buffer that mixes every
parameter of a group in chunk order. The taps are post-accumulate-grad hooks instead:

* LOCAL (pre-reduction) gradient: a hook on each UNSHARDED parameter (the plain ``nn.Parameter``
  FSDP2 all-gathers into and swaps onto the module during forward and backward). Autograd runs it
  right after accumulating this rank's own gradient into ``unsharded_param.grad`` and before
  FSDP2's post-backward copies that gradient into the reduce-scatter buffer and frees it. So it
  sees exactly this rank's contribution, per parameter, in the parameter's own layout: the
  non-finite flag (element by element, as DDP's hook does, in one fused pass per parameter
  into one flag per step: :mod:`.finiteness`) every step, and on audit steps the
  gradient's fingerprint (taken first, from the gradient as autograd left it). Those
  fingerprints are in the same terms whether the backward synchronises or not, which is what
  lets a replay with gradient sync off be compared bit for bit with the audited training step
  (:mod:`sdc_agent.checks.replay.collective`).
  Why not FSDP2's ``set_custom_reduce_scatter``: its input is the padded, chunk-interleaved flat
  buffer of a whole parameter group, which a replay with sync off never builds; and it is not
  called at all when the shard dimension has one rank.
* REDUCED gradient: a hook on each SHARDED parameter. FSDP2 calls the sharded parameter's
  post-accumulate-grad hooks itself after the reduce-scatter (and HSDP's all-reduce) has written
  the sharded gradient, so the hook sums this rank's shard of the reduced gradient.

The unsharded parameters exist only from the first all-gather on (FSDP2 creates them lazily and
reuses the same objects afterwards), so the local hooks are installed by a forward pre-hook
registered after FSDP2's own (which unshards): the first time a module runs, its unsharded
parameters are on it. Once every trainable parameter is hooked, the pre-hooks are removed.
Both taps write into the same :class:`~.stats.GradStatsState` DDP's comm hook
fills, so :class:`~.exchange.GradientCheck` and its flag exchange are unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from ...fingerprint import fingerprints
from ..replay.accumulation import MicroBatchIsolation
from .finiteness import mark_non_finite, new_flag
from .stats import GradStatsState


@dataclass(frozen=True)
class ShardOfGradient:
    """What a reduced-gradient tap is told about the tensor it sees (DDP's taps get a bucket)."""

    row: int
    """The parameter's row in the fingerprint tables."""

    def index(self) -> int:
        """The row, as DDP's ``GradBucket.index()`` (fault drills key on it)."""
        return self.row


class ShardedGradientTaps:
    """Check 1's post-accumulate-grad hooks on an FSDP2 model, writing into a GradStatsState."""

    def __init__(
        self,
        root: nn.Module,
        params: list[nn.Parameter],
        names: list[str],
        state: GradStatsState,
    ) -> None:
        """Hook the sharded ``params`` (rows of the tables, named ``names``) now and the
        unsharded ones at their first forward."""
        self.state = state
        self.recording = True
        """False while gradients accumulate without sync: the local taps add no entry to the
        step's flags (the synchronising backward does, as DDP's comm hook does) but check each
        micro-batch's gradient into a flag that backward carries on."""
        self._row_by_name = {name: row for row, name in enumerate(names)}
        modules = {name.rpartition(".")[0] for name in names}
        module_index = {module: i for i, module in enumerate(sorted(modules))}
        self._module_of_row = [module_index[name.rpartition(".")[0]] for name in names]
        """Per row: its module's index (a module's gradients are one run of local events)."""
        self._unsharded: dict[int, nn.Parameter] = {}
        self._unsharded_by_name: dict[str, nn.Parameter] = {}
        self._waiting: dict[str, list[Callable[[nn.Parameter], None]]] = {}
        self._carried: tuple[list[torch.Tensor], torch.Tensor] | None = None
        """(the step's ``local_flags`` list, the flag its micro-batches without sync raise):
        keyed by the list, which ``GradStatsState.arm`` makes anew each step, so a flag left by
        a step that never synchronised is never carried into the next one."""
        self.isolation: MicroBatchIsolation | None = None
        """Gradient accumulation: isolates the audited micro-batch's local gradient, run from
        the local taps (:meth:`isolate_with`)."""
        for row, param in enumerate(params):
            param.register_post_accumulate_grad_hook(self._reduced_tap(row))
        self._sharded = {id(p) for p in root.parameters()}
        """The sharded parameters (FSDP2 swaps unsharded ones in for forward and backward)."""
        prefixes = {id(m): name for name, m in root.named_modules()}
        # Removed once every trainable parameter's unsharded form is hooked: walking the
        # parameters on every forward would cost O(parameters) per FSDP module and step.
        self._discovery = [
            module.register_forward_pre_hook(self._discover(prefixes[id(module)]))
            for module in root.modules()
            if isinstance(module, FSDPModule)
        ]

    # ------------------------------------------------------------------ the taps
    def _local_tap(self, row: int) -> Callable[[torch.Tensor], None]:
        def tap(param: torch.Tensor) -> None:
            if self.isolation is not None:
                # First: the audited micro-batch's own gradient is fingerprinted and the
                # accumulated one added back, so the flags below see the sum, as DDP's hook does.
                self.isolation.gradient_accumulated(row, param)  # type: ignore[arg-type]  # the hook is handed the Parameter, typed Tensor by torch
            state, grad = self.state, param.grad
            if grad is None:
                return
            if isinstance(grad, DTensor):
                # Tensor parallel: the unsharded parameter is a DTensor over the tp dimension;
                # this rank's own gradient is its local slice (a Partial one is this rank's
                # contribution, before any reduction).
                grad = grad.to_local()
            if not self.recording:
                # A micro-batch without sync. Under a MixedPrecisionPolicy whose reduce dtype
                # is not the parameters', FSDP2 moves this gradient into a private buffer after
                # this hook, and the synchronising micro-batch's tap would see its own gradient
                # alone; so each micro-batch's is checked here, into a flag the step carries
                # (one fused pass each: cheap enough to do whatever the policy).
                mark_non_finite([grad], self._carried_flag(state.local_flags, grad.device))
                return
            if state.capture_fingerprints and state.local_fingerprints is not None:
                fingerprint = fingerprints([grad])[0]
                state.record_local_fingerprint(row, fingerprint)
                # in the order autograd ran, a module's parameters in row order
                state.add_local_event(
                    fingerprint.to(state.local_fingerprints.device),
                    group=self._module_of_row[row],
                    order=row,
                )
            flags = state.local_flags
            # One flag per step, raised in place by every tap (one fused pass per
            # parameter, no temporaries, nothing read back: see sdc_agent.checks.gradients.finiteness). It is
            # appended once per tapped parameter, as many times as the reduced taps append
            # sums, because GradientCheck pairs the two lists to tell that the reduction ran.
            # Only these taps append to ``local_flags`` under FSDP2, so its last entry, when
            # there is one, is this step's flag (a replay records into a state of its own).
            # A pipeline schedule back-propagates each of its micro-batches into the same
            # parameters: every pass is checked, into the one flag, appended once per row.
            if row in state.flagged_rows and flags and flags[-1].device == grad.device:
                mark_non_finite([grad], flags[-1])
                return
            state.flagged_rows.add(row)
            if flags and flags[-1].device == grad.device:
                flag = flags[-1]
            elif self._carried is not None and self._carried[0] is flags:
                # raised by this step's micro-batches without sync: the step's flag from now on
                flag = self._carried[1].to(grad.device)
                self._carried = None
            else:
                flag = new_flag(grad.device)
            mark_non_finite([grad], flag)
            flags.append(flag)

        return tap

    def _reduced_tap(self, row: int) -> Callable[[torch.Tensor], None]:
        def tap(param: torch.Tensor) -> None:
            grad = param.grad
            if grad is None:
                return
            shard = grad.to_local() if isinstance(grad, DTensor) else grad
            for extra in self.state.reduced_taps:
                extra(ShardOfGradient(row), shard)  # type: ignore[arg-type]  # ReducedTap names DDP's GradBucket; FSDP2's taps get a ShardOfGradient
            # float32 accumulation, as for DDP's buckets: finite exactly when every element is
            self.state.reduced_sums.append(shard.sum(dtype=torch.float32))

        return tap

    def _carried_flag(self, flags: list[torch.Tensor], device: torch.device) -> torch.Tensor:
        """The flag of the micro-batches without sync of the step whose flags are ``flags``."""
        carried = self._carried
        if carried is None or carried[0] is not flags or carried[1].device != device:
            carried = self._carried = (flags, new_flag(device))
        return carried[1]

    # ------------------------------------------------------------------ the unsharded parameters
    def _discover(self, prefix: str) -> Callable[..., None]:
        """A forward pre-hook (after FSDP2's, which unsharded the module): hook every unsharded
        parameter seen for the first time."""

        def hook(module: nn.Module, args: object) -> None:
            for name, param in module.named_parameters(prefix=prefix):
                if id(param) in self._sharded or id(param) in self._unsharded:
                    continue  # still sharded (a nested FSDP module), or already hooked
                row = self._row_by_name.get(name)
                if row is None:
                    continue  # frozen: not in the tables
                self._unsharded[id(param)] = param
                self._unsharded_by_name[name] = param
                if self.isolation is not None:
                    self.isolation.attach(row, param)
                param.register_post_accumulate_grad_hook(self._local_tap(row))
                for use in self._waiting.pop(name, []):
                    use(param)
            if len(self._unsharded_by_name) == len(self._row_by_name):
                for handle in self._discovery:
                    handle.remove()
                self._discovery.clear()

        return hook

    def unsharded_parameters(self) -> list[nn.Parameter]:
        """Every unsharded parameter hooked so far."""
        return list(self._unsharded.values())

    def when_unsharded(self, name: str, use: Callable[[nn.Parameter], None]) -> None:
        """Call ``use(unsharded_parameter)`` once parameter ``name``'s unsharded form exists."""
        if name not in self._row_by_name:
            raise KeyError(f"no trainable parameter named {name!r}")
        if name in self._unsharded_by_name:
            use(self._unsharded_by_name[name])
            return
        self._waiting.setdefault(name, []).append(use)

    def isolate_with(self, isolation: MicroBatchIsolation) -> None:
        """Run ``isolation`` (rows in the tables' order) at the start of every local tap, so it
        sees each unsharded gradient right after autograd stored it: before check 1's flags and
        before FSDP2's post-backward reads it (:mod:`sdc_agent.checks.replay.accumulation`)."""
        if self.isolation is not None:
            raise RuntimeError("sdc_agent: the FSDP2 taps isolate micro-batches for one audit")
        self.isolation = isolation
        for name, param in self._unsharded_by_name.items():
            isolation.attach(self._row_by_name[name], param)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Inside the block (backward passes without sync) record no local flag in the step's
        list: check each local gradient into a flag the step's synchronising backward takes up."""
        was, self.recording = self.recording, False
        try:
            yield
        finally:
            self.recording = was

    @contextlib.contextmanager
    def recording_into(self, state: GradStatsState) -> Iterator[GradStatsState]:
        """Record into ``state`` instead (a replay's own statistics), then put the step's back."""
        saved, was = self.state, self.recording
        self.state, self.recording = state, True
        try:
            yield state
        finally:
            self.state, self.recording = saved, was

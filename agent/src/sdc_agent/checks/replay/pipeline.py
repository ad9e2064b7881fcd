"""Check 2 under pipeline parallelism: what each stage received, computed and sent, and replays
of a whole pipeline step.

A pipeline stage computes on what other ranks send it: activations from the stage before, the
gradient of its output from the stage after. A fault on one stage therefore changes everything
downstream of it, on other ranks: comparing each rank's results with its replayer's would blame
the whole pipeline. So each rank records, per stage it holds and per pipeline step, fingerprints
of its LOCAL work at its boundaries (:class:`PipelineRecorder`):

* ``received``: what its forward started from: the first stage's inputs, or the activations
  received from the stage before (the last stage's targets too);
* ``sent``: its forward's outputs (the activations it sends on; the last stage's outputs) and,
  on the last stage, the bits of every micro-batch's loss;
* ``grads_received``: the gradient of its outputs received from the stage after;
* ``grads_sent``: the gradient of its inputs it sends back;
* ``gradients``: its local parameter gradients before the data-parallel reduction (check 1's
  taps on the unsharded parameters, every micro-batch folded in).

Two computations of the same pipeline step on two replicas are compared stage by stage
(:class:`PipelineOutcome`): a stage whose inputs agree and whose outputs do not diverged
LOCALLY, on that rank (:meth:`StageOutcome.diverges_locally_from`); a stage whose inputs already
differ is downstream of someone else's divergence and is not blamed. The earliest local
divergence in the pipeline's dataflow names one GPU, not its pipeline group.

With tensor parallelism inside the stages, the ranks of a stage's TP group compute each
micro-batch together, and a TP all-reduce inside the stage carries one rank's wrong value to its
partners before anything is sent: the whole group diverges locally. The TP probes then record
each rank's local results in order, in the audited pipeline step and in its replay alike
(:func:`ordered_local_results`), and per stage only the pairs that diverged first are kept
(:func:`earliest_in_stages`): one GPU, not its TP group.

The same boundaries say where a NaN or Inf started (check 1): a stage that received finite
values and produced a non-finite one (:meth:`PipelineRecorder.flags`,
:func:`started_on_this_stage`).

Replays (:class:`PipelineReplayer`) run the pipeline schedule's own ``step`` on every rank at
once, each replica replaying another replica's pipeline step, with the data-parallel gradient
reduction off: the schedule's final reduction (``perform_reduce_grad``) is replaced, for the
replay, by the same bookkeeping without the reduce-scatter, so each rank keeps its own local
gradient and nothing is mixed across replicas. Gradients, buffers, the RNG and the FSDP2 state
are put back afterwards: training continues bit-identically.
"""

from __future__ import annotations

import contextlib
import hashlib
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from ...fingerprint import fingerprints
from ..gradients.finiteness import new_flag
from ..gradients.stats import GradStatsState
from ..gradients.taps import ShardedGradientTaps
from .attribution import (
    earliest_local_mismatches,
    find_culprits,
    find_mismatches,
    unexplained,
)
from .environment import deterministic_kernels, seed_all
from .replayer import Replayer, loss_bits

Digest = tuple[int, int]
"""Two signed 64-bit words of a hash."""

NO_DIGEST: Digest = (0, 0)
"""The digest of a boundary a stage does not have (the first stage receives no gradient)."""

STAGE_WORDS = 11
"""Int64 values per stage in the audit's rows: five two-word digests and the finite flag."""

FLAG_KINDS = ("received", "sent", "grads_received", "grads_sent")
"""The boundary flags of one stage, in :meth:`PipelineRecorder.flags`' order."""


def digest_of(parts: Sequence[torch.Tensor | int]) -> Digest:
    """A two-word digest of ``parts`` (fingerprint tables and integers), in order."""
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        if isinstance(part, torch.Tensor):
            raw = part.detach().to("cpu", torch.int64).contiguous().reshape(-1)
            h.update(struct.pack(f"<q{raw.numel()}q", raw.numel(), *raw.tolist()))
        else:
            h.update(struct.pack("<q", part))
    low, high = struct.unpack("<qq", h.digest())
    return low, high


# ---------------------------------------------------------------------------------- outcomes
@dataclass(frozen=True)
class StageOutcome:
    """One stage's local work in one pipeline step, reduced to comparable bits (see the module
    docstring for each boundary)."""

    received: Digest
    sent: Digest
    grads_received: Digest
    grads_sent: Digest
    gradients: Digest
    finite: bool
    """Every value recorded at its boundaries (and its local gradient) was finite."""

    def forward_matches(self, other: StageOutcome) -> bool:
        """Same inputs and same outputs in the forward."""
        return (self.received, self.sent) == (other.received, other.sent)

    def backward_matches(self, other: StageOutcome) -> bool:
        """Same gradients received, sent back and accumulated on the parameters."""
        return (self.grads_received, self.grads_sent, self.gradients) == (
            other.grads_received,
            other.grads_sent,
            other.gradients,
        )

    def diverges_locally_from(self, other: StageOutcome, *, compare_grads: bool) -> bool:
        """Whether this stage computed something else than ``other`` from the same inputs: its
        forward's outputs differ while its inputs agree, or (``compare_grads``: deterministic
        audits) its backward's results differ while the whole forward and the gradient it
        received agree. Differing inputs put the divergence upstream (or downstream, for the
        gradient received), on another stage."""
        if self.received != other.received:
            return False
        if self.sent != other.sent:
            return True
        if not compare_grads or self.grads_received != other.grads_received:
            return False
        return (self.grads_sent, self.gradients) != (other.grads_sent, other.gradients)

    def words(self) -> list[int]:
        """The outcome as :data:`STAGE_WORDS` int64 values."""
        return [
            *self.received,
            *self.sent,
            *self.grads_received,
            *self.grads_sent,
            *self.gradients,
            int(self.finite),
        ]

    @classmethod
    def from_words(cls, words: Sequence[int]) -> StageOutcome:
        """Inverse of :meth:`words`."""
        return cls(
            received=(words[0], words[1]),
            sent=(words[2], words[3]),
            grads_received=(words[4], words[5]),
            grads_sent=(words[6], words[7]),
            gradients=(words[8], words[9]),
            finite=bool(words[10]),
        )


@dataclass(frozen=True)
class PipelineOutcome:
    """A rank's local work in one pipeline step: one :class:`StageOutcome` per stage it holds,
    by stage index. Compared with :mod:`.attribution`'s pure logic, per pipeline coordinate:
    :meth:`matches` is the full comparison (who agrees with whom in a confirmation),
    :meth:`diverges_locally_from` the one that says a rank computed wrong itself."""

    stages: tuple[StageOutcome, ...]

    @property
    def finite(self) -> bool:
        """Every stage's values were finite."""
        return all(s.finite for s in self.stages)

    def matches(self, other: PipelineOutcome, *, compare_grads: bool) -> bool:
        """Bit-for-bit agreement of every stage's forward (and backward, with ``compare_grads``)."""
        if len(self.stages) != len(other.stages) or self.finite != other.finite:
            return False
        return all(
            a.forward_matches(b) and (not compare_grads or a.backward_matches(b))
            for a, b in zip(self.stages, other.stages, strict=True)
        )

    def diverges_locally_from(self, other: PipelineOutcome, *, compare_grads: bool) -> bool:
        """Whether some stage of this rank diverged locally from ``other``'s same stage."""
        return any(
            a.diverges_locally_from(b, compare_grads=compare_grads)
            for a, b in zip(self.stages, other.stages, strict=True)
        )

    def to_row(self) -> list[int]:
        """The outcome as a row of ``row_width(len(stages))`` int64 (the last marks it filled)."""
        return [w for s in self.stages for w in s.words()] + [1]

    @classmethod
    def from_row(cls, row: Sequence[int]) -> PipelineOutcome:
        """Inverse of :meth:`to_row`."""
        if (len(row) - 1) % STAGE_WORDS or row[-1] != 1:
            raise ValueError(f"not a filled pipeline outcome row: {list(row)!r}")
        count = (len(row) - 1) // STAGE_WORDS
        return cls(
            tuple(
                StageOutcome.from_words(row[i * STAGE_WORDS : (i + 1) * STAGE_WORDS])
                for i in range(count)
            )
        )


def row_width(stages: int) -> int:
    """Int64 values in the row of a rank holding ``stages`` stages."""
    return stages * STAGE_WORDS + 1


def failed_row(stages: int) -> list[int]:
    """Sent instead of an outcome when a replay raised (the last value marks it)."""
    return [0] * (row_width(stages) - 1) + [2]


def is_failed_row(row: Sequence[int]) -> bool:
    """Whether ``row`` is :func:`failed_row`."""
    return row[-1] == 2


# ---------------------------------------------------------------------------------- recording
def tensors_in(value: Any) -> list[torch.Tensor]:
    """The tensors in ``value`` (a tensor, or nested tuples/lists/dicts of them), in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in tensors_in(v)]
    if isinstance(value, dict):
        return [t for k in sorted(value) for t in tensors_in(value[k])]
    return []


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (what this rank computed and sends), else the tensor."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


@dataclass
class StageRecord:
    """What one stage's boundaries saw in one pipeline step (see the module docstring)."""

    fingerprinting: bool
    """Take fingerprints (audited pipeline steps and replays); flags are always raised."""
    device: torch.device
    feed: list[torch.Tensor] = field(default_factory=list)
    """Fingerprints of what this rank fed the pipeline (inputs, targets)."""
    parts: dict[str, dict[int, torch.Tensor]] = field(default_factory=dict)
    """Per boundary, per micro-batch: the fingerprint table of its tensors."""
    losses: list[int] = field(default_factory=list)
    """The bits of each micro-batch's loss (last stage)."""
    extremes: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    """Per boundary: the [min, max] of each floating tensor that crossed it (finite exactly
    when every element was); judged once, when the flags are read (:meth:`flag`)."""

    def __post_init__(self) -> None:
        for kind in FLAG_KINDS:
            self.parts[kind] = {}
            self.extremes[kind] = []

    def see(self, kind: str, micro_batch: int, tensors: list[torch.Tensor]) -> None:
        """Tensors crossing boundary ``kind`` for ``micro_batch``: keep their extremes, and
        fingerprint them when fingerprinting.

        Why extremes: these tensors are saved for the backward, or are leaves that require
        grad, so check 1's fused kernel (which writes every value back, bumping the tensor's
        version) must not touch them. One ``aminmax`` pass per tensor reads them only: NaN
        propagates to both extremes and an infinity is one of them."""
        tensors = [_local(t) for t in tensors if t is not None]
        if self.fingerprinting:
            self.parts[kind][micro_batch] = (
                fingerprints(tensors) if tensors else torch.zeros((0, 2), dtype=torch.int64)
            )
        for t in tensors:
            if t.is_floating_point() and t.numel():
                self.extremes[kind].append(torch.stack(torch.aminmax(t.detach())).float())

    def flag(self, kind: str) -> torch.Tensor:
        """One float32 element on the device, nonzero when a value that crossed ``kind`` was
        non-finite (nothing read back to the host)."""
        seen = self.extremes[kind]
        if not seen:
            return new_flag(self.device)
        return (~torch.isfinite(torch.cat(seen))).any().reshape(1).to(torch.float32)

    def digest(self, kind: str, *extra: torch.Tensor | int) -> Digest:
        """The digest of boundary ``kind`` over the micro-batches, in order (NO_DIGEST when
        nothing crossed it)."""
        parts = self.parts[kind]
        if not parts and not extra:
            return NO_DIGEST
        return digest_of([*extra, *(parts[i] for i in sorted(parts))])

    def outcome(self, gradients: Digest, gradients_finite: bool) -> StageOutcome:
        """The stage's outcome, given its local gradients' digest (host reads: audits only)."""
        finite = gradients_finite and not any(bool(self.flag(kind)) for kind in FLAG_KINDS)
        return StageOutcome(
            received=self.digest("received", *self.feed),
            sent=self.digest("sent", *self.losses),
            grads_received=self.digest("grads_received"),
            grads_sent=self.digest("grads_sent"),
            gradients=gradients,
            finite=finite,
        )


class PipelineStageLike(Protocol):
    """What the recorder reads of a ``torch.distributed.pipelining`` stage (``PipelineStage``)."""

    stage_index: int
    is_first: bool
    is_last: bool
    args_recv_info: dict[int, tuple[Any, ...]]
    grad_recv_info: dict[int, tuple[Any, ...]]
    fwd_cache: dict[int, tuple[Any, Any]]
    bwd_cache: dict[int, tuple[Any, ...]]

    def forward_one_chunk(self, fwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        """Run one micro-batch's forward."""
        ...

    def backward_one_chunk(self, bwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        """Run one micro-batch's backward."""
        ...


class PipelineRecorder:
    """Watches one rank's pipeline stages: what each receives, computes and sends, per pipeline
    step (see the module docstring).

    It wraps the stages' ``forward_one_chunk`` and ``backward_one_chunk`` (the per-micro-batch
    entry points every ``torch.distributed.pipelining`` schedule calls): before a forward the
    received activations are in the stage's receive buffers, after it the outputs to send are in
    its forward cache; before a backward the received gradient is in its receive buffers, after
    it the gradient to send back is in its backward cache. Every step it raises a flag per
    boundary on a non-finite value (one ``aminmax`` pass per tensor, nothing read back); on an
    audited pipeline step and in replays it also fingerprints them.
    """

    def __init__(self, stages: Sequence[PipelineStageLike], device: torch.device) -> None:
        """Wrap ``stages`` (this rank's, by stage index); ``device``: where the flags live."""
        self.stages = sorted(stages, key=lambda s: s.stage_index)
        self.device = device
        self.records: dict[int, StageRecord] = {}
        """This pipeline step's record, by stage index."""
        self._step_flags: dict[str, torch.Tensor] | None = None
        self.start(fingerprinting=False)
        for stage in self.stages:
            self._wrap(stage)

    # ------------------------------------------------------------------ per pipeline step
    def start(self, *, fingerprinting: bool) -> None:
        """Begin a new record of every stage (before a pipeline step, or a replay)."""
        self.records = {
            s.stage_index: StageRecord(fingerprinting=fingerprinting, device=self.device)
            for s in self.stages
        }

    def arm_step(self) -> None:
        """A training step begins: its boundary flags start lowered (they gather every pipeline
        step of the training step, as check 1's flags gather every micro-batch)."""
        self._step_flags = {kind: new_flag(self.device) for kind in FLAG_KINDS}

    def end_pipeline_step(self) -> None:
        """A training pipeline step is over: its flags go into the step's."""
        if self._step_flags is None:
            return
        for record in self.records.values():
            for kind in FLAG_KINDS:
                self._step_flags[kind].add_(record.flag(kind))

    def flags(self) -> torch.Tensor:
        """The training step's boundary flags, :data:`FLAG_KINDS` in order (check 1 reads them
        with its own: :class:`PipelineOrigin`)."""
        step = self._step_flags or {kind: new_flag(self.device) for kind in FLAG_KINDS}
        return torch.cat([step[kind] for kind in FLAG_KINDS])

    def note_feed(self, tensors: list[torch.Tensor]) -> None:
        """What this rank feeds the pipeline this step (the first stage's inputs, the last
        stage's targets): part of what the stages' forwards start from."""
        if not tensors:
            return
        first, last = self.stages[0], self.stages[-1]
        for stage in {id(first): first, id(last): last}.values():
            record = self.records[stage.stage_index]
            if stage.is_first or stage.is_last:
                record.see("received", -1, tensors)  # flags a non-finite input too
                if record.fingerprinting:
                    record.feed.append(record.parts["received"].pop(-1))

    def note_losses(self, losses: list[torch.Tensor]) -> None:
        """The last stage's per-micro-batch losses of this pipeline step."""
        last = self.stages[-1]
        if not last.is_last or not losses:
            return
        record = self.records[last.stage_index]
        record.extremes["sent"] += [loss.detach().reshape(1).float() for loss in losses]
        if record.fingerprinting:
            record.losses = [loss_bits(loss) for loss in losses]

    @contextlib.contextmanager
    def recording(self, *, fingerprinting: bool) -> Iterator[dict[int, StageRecord]]:
        """Record one pipeline step into fresh records (a replay's), then put the step's back."""
        saved = self.records
        self.start(fingerprinting=fingerprinting)
        try:
            yield self.records
        finally:
            self.records = saved

    # ------------------------------------------------------------------ the stages' entry points
    def _wrap(self, stage: PipelineStageLike) -> None:
        forward, backward = stage.forward_one_chunk, stage.backward_one_chunk
        index = stage.stage_index

        def forward_one_chunk(fwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
            record = self.records[index]
            if not stage.is_first:
                buffers = [
                    getattr(info, "buffer", None) for info in stage.args_recv_info[fwd_chunk_id]
                ]
                record.see("received", fwd_chunk_id, [b for b in buffers if b is not None])
            output = forward(fwd_chunk_id, *args, **kwargs)
            outputs, _ = stage.fwd_cache[fwd_chunk_id]
            record.see("sent", fwd_chunk_id, tensors_in(outputs))
            return output

        def backward_one_chunk(bwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
            record = self.records[index]
            if not stage.is_last:
                buffers = [
                    getattr(info, "buffer", None) for info in stage.grad_recv_info[bwd_chunk_id]
                ]
                record.see("grads_received", bwd_chunk_id, [b for b in buffers if b is not None])
            result = backward(bwd_chunk_id, *args, **kwargs)
            if not stage.is_first and bwd_chunk_id in stage.bwd_cache:
                record.see("grads_sent", bwd_chunk_id, tensors_in(stage.bwd_cache[bwd_chunk_id]))
            return result

        # Instance attributes shadow the methods the schedules call (self._stage.forward_one_chunk).
        stage.forward_one_chunk = forward_one_chunk  # type: ignore[method-assign]  # the recording wrappers, set on this stage instance
        stage.backward_one_chunk = backward_one_chunk  # type: ignore[method-assign]  # the recording wrappers, set on this stage instance

    # ------------------------------------------------------------------ outcomes
    def outcome(
        self,
        records: dict[int, StageRecord],
        gradient_table: torch.Tensor | None,
        rows_of_stage: dict[int, list[int]],
        finite: bool,
    ) -> PipelineOutcome:
        """The outcome of one recorded pipeline step (``records``: the training step's kept
        records, or a replay's): each stage's record with the digest of its rows of
        ``gradient_table`` (local gradient fingerprints; None: not compared); ``finite``: the
        local gradients were finite."""
        stages = []
        for stage in self.stages:
            rows = rows_of_stage[stage.stage_index]
            grads = digest_of([gradient_table[rows]]) if gradient_table is not None else NO_DIGEST
            stages.append(records[stage.stage_index].outcome(grads, finite))
        return PipelineOutcome(tuple(stages))


def started_on_this_stage(gradient_bad: bool, flags: Sequence[float]) -> bool:
    """Whether a non-finite value started on a stage with these :data:`FLAG_KINDS` flags: its
    forward received finite values and sent (or lost) a non-finite one, or its whole forward
    and the gradient it received were finite and its backward made a non-finite gradient (sent
    back, or of its own parameters)."""
    received, sent, grads_received, grads_sent = (bool(f) for f in flags[:4])
    if received:
        return False  # it arrived from the stage before (or the data)
    if sent:
        return True
    if grads_received:
        return False  # it arrived from the stage after
    return grads_sent or gradient_bad


class PipelineOrigin:
    """Check 1's :class:`~sdc_agent.checks.gradients.stats.LocalOrigin` for a pipeline stage:
    its local gradient counts as non-finite only when the non-finite value started on it."""

    def __init__(self, recorder: PipelineRecorder) -> None:
        """Read the boundary flags of ``recorder``."""
        self.recorder = recorder

    def flags(self) -> torch.Tensor:
        """The step's boundary flags."""
        return self.recorder.flags()

    def started_here(self, gradient_bad: bool, flags: list[float]) -> bool:
        """See :func:`started_on_this_stage`."""
        return started_on_this_stage(gradient_bad, flags)


# ---------------------------------------------------------------------------------- replays
class PipelinedModel(Protocol):
    """What a pipeline replay needs from its parallelism adapter
    (:class:`sdc_agent.parallel.pp.PipelineAdapter` is one)."""

    module: nn.Module
    params: list[nn.Parameter]
    param_device: torch.device
    recorder: PipelineRecorder
    rows_of_stage: dict[int, list[int]]

    def gradient_taps(self) -> ShardedGradientTaps:
        """Check 1's taps on the stage's unsharded parameters."""
        ...

    def run_pipeline_step(self, feed: Any, *, reduce: bool = True) -> list[torch.Tensor]:
        """Run the schedule's ``step`` with this rank's ``feed``; ``reduce``: reduce the stage's
        gradient over the data-parallel dimension at the end (False in replays). Returns the
        last stage's per-micro-batch losses (empty elsewhere)."""
        ...


class PipelineReplayer(Replayer):
    """Replays one replica's pipeline step through this rank's stage, every rank at once, with
    the data-parallel reduction off (see the module docstring)."""

    def __init__(self, adapter: PipelinedModel, step_state: GradStatsState) -> None:
        """``step_state``: check 1's statistics (the training step's local fingerprints and
        the row order the replay's follow)."""
        super().__init__(adapter.module, adapter.params, _no_loss)
        self.adapter = adapter
        self.step_state = step_state

    def note_gradients_at_start(self, step: int) -> None:
        """Nothing to refuse: a stage's local gradient starts from none at every pipeline step
        (the schedule's reduction frees it), and only local gradients are compared."""
        self.zero_grads_at_start = None

    def replay(self, batch: Any, *, seed: int, deterministic: bool) -> PipelineOutcome:  # type: ignore[override]  # a whole pipeline step, not one micro-batch: its own outcome type
        """Run ``batch`` (what this rank's stage is fed: the target replica's inputs or
        targets) through the pipeline with RNG ``seed`` (collective: every rank at once)."""
        adapter = self.adapter
        with self.state_set_aside():
            record = GradStatsState(
                process_group=None,
                param_index=self.step_state.param_index,
                # Tensor parallel inside the stage: the TP probes record this replay's ordered
                # local results too, as they do the audited pipeline step's.
                records_events=self.step_state.records_events,
            )
            record.arm(capture_fingerprints=deterministic, device=adapter.param_device)
            with (
                adapter.recorder.recording(fingerprinting=True) as records,
                adapter.gradient_taps().recording_into(record),
            ):
                seed_all(seed)
                with deterministic_kernels(deterministic):
                    adapter.run_pipeline_step(batch, reduce=False)
                flags = record.local_flags
                finite = not bool(torch.cat(flags).any()) if flags else True
                self.last_table = ordered_local_results(record) if deterministic else None
                return adapter.recorder.outcome(
                    records,
                    record.local_fingerprints if deterministic else None,
                    adapter.rows_of_stage,
                    finite,
                )


def _no_loss(module: nn.Module, batch: Any) -> torch.Tensor:
    raise RuntimeError("sdc_agent: a pipeline's loss is its schedule's loss_fn")


def combine_pipeline_outcomes(outcomes: list[PipelineOutcome]) -> PipelineOutcome:
    """One outcome for several pipeline steps replayed one by one (a whole accumulating step):
    each stage's digests over the steps, finite when all are; equal to another combination
    exactly when every part is."""
    if len(outcomes) == 1:
        return outcomes[0]
    stages = []
    for parts in zip(*(o.stages for o in outcomes), strict=True):

        def fold(field: str, parts: tuple[StageOutcome, ...] = parts) -> Digest:
            return digest_of([w for p in parts for w in getattr(p, field)])

        stages.append(
            StageOutcome(
                received=fold("received"),
                sent=fold("sent"),
                grads_received=fold("grads_received"),
                grads_sent=fold("grads_sent"),
                gradients=fold("gradients"),
                finite=all(p.finite for p in parts),
            )
        )
    return PipelineOutcome(tuple(stages))


@dataclass(frozen=True)
class PipelineComparison:
    """What one audit's rows say, per pipeline coordinate (replica indices, not ranks)."""

    local: dict[int, list[tuple[int, int]]]
    """Per coordinate: (target, replayer) replica pairs whose stage diverged locally."""
    culprits: dict[int, list[int]]
    """Per coordinate: replicas whose stage diverged locally as target AND as replayer."""
    disputed: dict[int, list[tuple[int, int]]]
    """Per coordinate: locally diverging pairs no culprit explains (a confirmation settles each)."""
    unexplained: dict[int, list[tuple[int, int]]]
    """Replica pairs that disagree somewhere but diverge locally nowhere (a corruption between
    stages, in transit): listed at the first coordinate where they disagree, nobody named."""

    @property
    def agreed(self) -> bool:
        """Every replay matched what it replayed, stage by stage."""
        return not any(self.local.values()) and not any(self.unexplained.values())

    def keeping(self, local: dict[int, list[tuple[int, int]]]) -> PipelineComparison:
        """The comparison with only ``local``'s locally diverging pairs (a subset of
        :attr:`local`: :func:`earliest_in_stages`), culprits and disputes recomputed from them;
        the dropped pairs diverged too, so they are not :attr:`unexplained`."""
        culprits = {c: find_culprits(pairs) for c, pairs in local.items()}
        return PipelineComparison(
            local=local,
            culprits=culprits,
            disputed={c: unexplained(pairs, culprits[c]) for c, pairs in local.items()},
            unexplained=self.unexplained,
        )


def compare_pipelines(
    own: list[list[PipelineOutcome]],
    replayed: list[list[PipelineOutcome]],
    offset: int,
    *,
    compare_grads: bool,
) -> PipelineComparison:
    """Compare, coordinate by coordinate, each replica's own pipeline step with the replay of it
    (``own[c][r]``: replica r's rank at coordinate c; ``replayed[c][r]``: its replay of replica
    ``r + offset``'s step), with :mod:`.attribution`'s ring logic: a rank is in a mismatch only
    where its own stage diverged LOCALLY (:meth:`PipelineOutcome.diverges_locally_from`)."""
    local: dict[int, list[tuple[int, int]]] = {}
    culprits: dict[int, list[int]] = {}
    disputed: dict[int, list[tuple[int, int]]] = {}
    anywhere: dict[int, list[tuple[int, int]]] = {}
    for c, (owns, replays) in enumerate(zip(own, replayed, strict=True)):
        local[c] = find_mismatches(
            owns,
            replays,
            offset,
            compare_grads=compare_grads,
            differs=lambda a, b: a.diverges_locally_from(b, compare_grads=compare_grads),
        )
        culprits[c] = find_culprits(local[c])
        disputed[c] = unexplained(local[c], culprits[c])
        anywhere[c] = find_mismatches(owns, replays, offset, compare_grads=compare_grads)
    explained = {pair for pairs in local.values() for pair in pairs}
    seen: set[tuple[int, int]] = set()
    lost: dict[int, list[tuple[int, int]]] = {}
    for c in sorted(anywhere):
        lost[c] = [p for p in anywhere[c] if p not in explained and p not in seen]
        seen.update(lost[c])
    return PipelineComparison(local=local, culprits=culprits, disputed=disputed, unexplained=lost)


# ---------------------------------------------------------------------------------- TP inside
# Tensor parallel inside a stage: the ranks of a stage's TP group compute each micro-batch
# together, and the TP all-reduce of a row-parallel layer's partial outputs carries one rank's
# wrong value to its partners BEFORE the stage sends anything, so every rank of the group
# diverges locally at that stage. Their ordered local results (the TP probes':
# :meth:`~sdc_agent.parallel.tp.TensorParallelAdapter.install_gradient_taps`) say who diverged
# first, as in a TP job without a pipeline (:func:`.attribution.earliest_local_mismatches`).
def ordered_local_results(state: GradStatsState) -> torch.Tensor:
    """The local results ``state``'s taps and TP probes recorded, in the order the rank
    computed them ([events, 2] int64; empty when they were not recorded: no tensor parallelism,
    or no fingerprints captured)."""
    events = state.local_events
    if not events:
        return torch.zeros((0, 2), dtype=torch.int64)
    return torch.stack(events)


def tp_group_ids(
    columns: Sequence[Sequence[int]], groups: Sequence[Sequence[int]]
) -> list[list[int]]:
    """Per pipeline coordinate, per replica: an id of the TP group of the rank there
    (``columns[c][replica]``, global ranks; ``groups``: every TP group of the job, global
    ranks); a rank in no group gets an id of its own."""
    group_of = {rank: index for index, group in enumerate(groups) for rank in group}
    return [[group_of.get(rank, len(groups) + rank) for rank in column] for column in columns]


def earliest_in_stages(
    local: dict[int, list[tuple[int, int]]],
    first: dict[int, dict[tuple[int, int], int]],
    group_of: Sequence[Sequence[int]],
) -> dict[int, list[tuple[int, int]]]:
    """Per pipeline coordinate ``c``: the pairs of ``local[c]`` (locally diverging (target,
    replayer) replicas) whose ordered local results diverged first among the pairs of the same
    two TP groups; ``first[c][pair]``: the index of the first local result where the target's
    own differs from its replayer's replay (:func:`.attribution.first_divergence`);
    ``group_of[c][replica]``: the TP group of that replica's rank at ``c``
    (:func:`tp_group_ids`). A later pair only received a wrong result through a TP collective;
    ranks alone in their group keep every pair."""
    return {
        c: earliest_local_mismatches(pairs, first[c], group_of[c]) if pairs else []
        for c, pairs in local.items()
    }

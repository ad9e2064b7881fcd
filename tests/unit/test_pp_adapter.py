"""The pipeline's pure logic (per-stage outcomes, the earliest local divergence, where a NaN
started) and the pipeline adapter on a one-rank gloo group: what it refuses, and a guarded
one-stage pipeline that trains and audits."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe, ScheduleLoopedBFS

import sdc_agent as sdc
from sdc_agent.checks.replay.pipeline import (
    NO_DIGEST,
    PipelineOutcome,
    StageOutcome,
    compare_pipelines,
    failed_row,
    is_failed_row,
    started_on_this_stage,
)
from sdc_agent.drills.sharded import ShardedDrillModel

GOOD = StageOutcome(
    received=(1, 1), sent=(2, 2), grads_received=(3, 3), grads_sent=(4, 4), gradients=(5, 5),
    finite=True,
)  # fmt: skip


def stage(**changed: object) -> StageOutcome:
    return StageOutcome(**{**GOOD.__dict__, **changed})  # type: ignore[arg-type]


def one(s: StageOutcome) -> PipelineOutcome:
    return PipelineOutcome((s,))


# ---------------------------------------------------------------------------------- pure logic
def test_an_outcome_row_round_trips_and_a_failed_row_is_told_apart():
    outcome = PipelineOutcome((GOOD, stage(sent=(-7, 9), finite=False)))
    assert PipelineOutcome.from_row(outcome.to_row()) == outcome
    assert is_failed_row(failed_row(2)) and not is_failed_row(outcome.to_row())
    assert len(failed_row(2)) == len(outcome.to_row())


def test_a_stage_diverges_locally_only_from_the_same_inputs():
    # Different outputs from the same inputs: this stage computed wrong
    assert stage(sent=(9, 9)).diverges_locally_from(GOOD, compare_grads=False)
    # Different inputs: the divergence is upstream, whatever the outputs
    assert not stage(received=(0, 0), sent=(9, 9)).diverges_locally_from(GOOD, compare_grads=True)
    # A backward that differs after an equal forward and an equal received gradient: local,
    # but only compared with deterministic audits
    wrong_backward = stage(grads_sent=(0, 0))
    assert wrong_backward.diverges_locally_from(GOOD, compare_grads=True)
    assert not wrong_backward.diverges_locally_from(GOOD, compare_grads=False)
    # A differing received gradient puts it downstream
    assert not stage(grads_received=(0, 0), gradients=(0, 0)).diverges_locally_from(
        GOOD, compare_grads=True
    )


def test_only_the_stage_where_a_persistent_fault_sits_is_a_culprit():
    # Given 3 replicas x 2 stages; replica 1's stage 0 computes wrong forward outputs, so
    # replica 1's stage 1 (and, in its replay of replica 2, its stage 1 too) get other inputs
    bad0 = stage(sent=(66, 66))
    downstream = stage(received=(66, 66), sent=(77, 77))
    own = [[one(GOOD), one(bad0), one(GOOD)], [one(GOOD), one(downstream), one(GOOD)]]
    # replica r replays replica r+1: replica 0 replays 1 (right), 1 replays 2 (wrong), 2 replays 0
    replayed = [[one(GOOD), one(bad0), one(GOOD)], [one(GOOD), one(downstream), one(GOOD)]]
    found = compare_pipelines(own, replayed, 1, compare_grads=True)
    # Then stage 0 has the two mismatches that make replica 1 its culprit; stage 1 none
    assert found.local == {0: [(1, 0), (2, 1)], 1: []}
    assert found.culprits == {0: [1], 1: []}
    assert found.disputed == {0: [], 1: []}
    assert found.unexplained == {0: [], 1: []} and not found.agreed


def test_a_disagreement_no_stage_explains_is_reported_unexplained():
    # Given replica 1's stage 1 receiving other activations than its stage 0 sent (in transit)
    in_transit = stage(received=(66, 66), sent=(77, 77))
    own = [[one(GOOD)] * 3, [one(GOOD), one(in_transit), one(GOOD)]]
    replayed = [[one(GOOD)] * 3, [one(GOOD)] * 3]
    found = compare_pipelines(own, replayed, 1, compare_grads=True)
    # Then no stage diverged locally, and the pair is listed where it first disagrees
    assert found.local == {0: [], 1: []}
    assert found.unexplained == {0: [], 1: [(1, 0)]}


def test_a_nan_started_on_the_stage_that_received_finite_values_and_made_one():
    # FLAG order: received, sent, grads_received, grads_sent
    assert started_on_this_stage(False, [0, 1, 0, 0])  # its forward made it
    assert not started_on_this_stage(True, [1, 1, 1, 1])  # it arrived with the activations
    assert not started_on_this_stage(True, [0, 0, 1, 1])  # it arrived with the gradient
    assert started_on_this_stage(False, [0, 0, 0, 1])  # its backward made the one it sent
    assert started_on_this_stage(True, [0, 0, 0, 0])  # its own gradient
    assert not started_on_this_stage(False, [0, 0, 0, 0])


def test_no_digest_is_what_a_missing_boundary_compares_as():
    assert GOOD.forward_matches(GOOD) and stage(grads_received=NO_DIGEST) != GOOD


# ---------------------------------------------------------------------------------- one rank
@pytest.fixture
def one_rank(tmp_path):
    """A one-rank gloo process group."""
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(output, target)


def one_stage(*, shard: bool = True, **schedule_options: object) -> tuple[nn.Module, ScheduleGPipe]:
    """A one-stage pipeline of the sharded drill model on the one rank."""
    torch.manual_seed(0)
    model = ShardedDrillModel()
    if shard:
        fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
    stage = PipelineStage(model, 0, 1, torch.device("cpu"))
    return model, ScheduleGPipe(stage, n_microbatches=2, loss_fn=loss_fn, **schedule_options)  # type: ignore[arg-type]


def guard(model: nn.Module, pipeline: object, **options: object) -> sdc.Guard:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    kwargs = {"rebuild_batch": feed, "schedule": sdc.Schedule(audit_every=0), **options}
    return sdc.Guard(model, optimizer, pipeline=pipeline, **kwargs)  # type: ignore[arg-type]


def feed(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)


def test_a_guarded_one_stage_pipeline_trains_and_says_what_it_checks(one_rank):
    # Given a one-stage pipeline (first and last: fed (inputs, target)), sharded on one rank
    model, pipeline = one_stage()
    g = guard(model, pipeline)
    before = [p.to_local().clone() for p in model.parameters()]
    # When it trains 3 steps
    assert g.train(feed(s, 0) for s in range(3)) is None
    # Then the updates changed the weights, and coverage() describes a pipeline
    assert any(
        not torch.equal(b, p.to_local()) for b, p in zip(before, model.parameters(), strict=True)
    )
    cov = g.coverage()
    assert cov["parallelism"] == "pp+fsdp" and cov["pipeline"]["stages"] == 1
    assert cov["pipeline"]["stage_ranks"] == [[0]]


def test_the_step_api_runs_the_pipeline_and_refuses_the_plain_backward(one_rank):
    model, pipeline = one_stage()
    g = guard(model, pipeline)
    with g.step(0) as guarded:
        losses = guarded.run_pipeline(feed(0, 0))
        assert len(losses) == 2 and all(math.isfinite(x.detach().item()) for x in losses)
        with pytest.raises(RuntimeError, match="run_pipeline"):
            guarded.backward(losses[0])
        assert guarded.check_gradients() is None


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"compute_loss": lambda m, b: m(b)}, TypeError, "loss_fn"),
        ({"scaler": torch.amp.GradScaler("cpu")}, ValueError, "GradScaler"),
        ({"schedule": sdc.Schedule(audit_every=0, grad_accum=2)}, ValueError, "scale_grads=False"),
    ],
)
def test_options_a_pipeline_cannot_honour_are_refused(one_rank, options, error, match):
    model, pipeline = one_stage()
    with pytest.raises(error, match=match):
        guard(model, pipeline, **options)


def test_an_unsharded_stage_a_foreign_model_and_a_multi_stage_schedule_are_refused(one_rank):
    # A stage module not sharded with FSDP2: nothing to compare it with
    model, pipeline = one_stage(shard=False)
    with pytest.raises(sdc.ShardingLayoutError, match="fully_shard"):
        guard(model, pipeline)
    # A model that is not the schedule's stage
    model, pipeline = one_stage()
    with pytest.raises(ValueError, match="stage module"):
        guard(fully_shard(ShardedDrillModel(), mesh=init_device_mesh("cpu", (1,))), pipeline)
    # A schedule that drives several stages per rank
    stages = [PipelineStage(model, i, 2, torch.device("cpu")) for i in range(2)]
    looped = ScheduleLoopedBFS(stages, n_microbatches=2, loss_fn=loss_fn)
    with pytest.raises(sdc.ShardingLayoutError, match="one stage per rank"):
        guard(model, looped)

"""The parallelism adapters on a one-rank gloo group: the FSDP2 layouts refused, each adapter's
answers to the checks' questions, and the replay's exactness."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import sdc_agent as sdc
from sdc_agent.checks.replay.replayer import outcome_of
from sdc_agent.drills.job import build_sharded, make_batch, make_loss
from sdc_agent.drills.sharded import ShardedDrillModel
from sdc_agent.parallel import DDPAdapter, FSDP2Adapter, ParallelAdapter, adapter_for


@pytest.fixture
def one_rank(tmp_path):
    """A one-rank gloo process group."""
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_mesh_without_the_hsdp_dimension_names_is_refused(one_rank):
    # Given a model sharded on a 2-D mesh named ("dp", "tp")
    model = fully_shard(
        ShardedDrillModel(), mesh=init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))
    )
    # When the adapter reads the layout, then it refuses it, saying what is supported
    with pytest.raises(sdc.ShardingLayoutError, match=r"\('replicate', 'shard'\)"):
        adapter_for(model, None)


def test_blocks_sharded_without_the_root_are_refused(one_rank):
    # Given fully_shard applied to the blocks only
    model = ShardedDrillModel()
    for block in model.blocks:
        fully_shard(block, mesh=init_device_mesh("cpu", (1,)))
    # Then the error says to shard the root too (not that the model is not DDP)
    with pytest.raises(sdc.ShardingLayoutError, match="root module too"):
        adapter_for(model, None)


def test_a_dp_group_is_refused_for_fsdp2(one_rank):
    # Given an FSDP2 model and an explicit data-parallel group
    model = fully_shard(ShardedDrillModel(), mesh=init_device_mesh("cpu", (1,)))
    # Then the adapter says the group comes from the mesh
    with pytest.raises(ValueError, match="dp_group must be None"):
        FSDP2Adapter(model, dist.new_group([0]))


def test_hsdp_layout_is_learned_from_the_parameters(one_rank):
    # Given an HSDP mesh of one replica and one shard
    mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("replicate", "shard"))
    adapter = adapter_for(fully_shard(ShardedDrillModel(), mesh=mesh), None)
    # Then the layout, and check 3's facts, come from the DTensor placements
    assert (adapter.layout.kind, adapter.layout.replicas, adapter.layout.shards) == ("hsdp", 1, 1)
    assert adapter.weight_redundancy is False
    assert adapter.coverage_facts()["weights_compared"] is False


def test_each_adapter_answers_the_checks_questions_for_its_layout(one_rank):
    # Given a DDP model and an FSDP2 one (full sharding) on the same group
    ddp = adapter_for(torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2)), None)
    fsdp = adapter_for(fully_shard(ShardedDrillModel(), mesh=init_device_mesh("cpu", (1,))), None)
    # Then each is the adapter of its wrapper and a ParallelAdapter
    assert isinstance(ddp, DDPAdapter) and isinstance(ddp, ParallelAdapter)
    assert isinstance(fsdp, FSDP2Adapter) and isinstance(fsdp, ParallelAdapter)
    # And check 2's replay unit: alone under DDP, every rank at once under FSDP2
    assert (ddp.replays_in_lockstep, fsdp.replays_in_lockstep) == (False, True)
    # And check 3's replicas: DDP's whole weights over the group, FSDP2's shards by the mesh
    whole, shards = ddp.weight_replicas(), fsdp.weight_replicas()
    assert (whole.sharded, whole.replicas, whole.shards) == (False, 1, 1)
    assert [name for name, _ in whole.named_weights] == ["weight", "bias"]
    assert shards.sharded and shards.replicas_of_shard == fsdp.layout.replicas_of_shard


def test_a_replay_with_sync_off_fingerprints_the_local_gradient_as_training_did(one_rank):
    # Given a trained step with gradient sync on, its local gradients fingerprinted by check 1
    model, _, guard = build_sharded(
        {"audit_every": 0, "check_every": 0, "peer_offset": 1}, parallel="fsdp"
    )
    compute_loss, batch = make_loss(), make_batch(0, 0)
    guard._run.gradients.arm(capture_fingerprints=True, device=torch.device("cpu"))
    torch.manual_seed(123)
    loss = compute_loss(model, batch)
    loss.backward()
    trained = guard._run.gradients.local_fingerprints.clone()
    reduced = [p.grad.to_local().clone() for p in model.parameters()]
    # When the same micro-batch is replayed with the same seed (sync off)
    replayed = guard._run.audit.replayer.replay(batch, seed=123, deterministic=True)
    # Then loss bits and per-parameter local gradient fingerprints agree bit for bit
    assert replayed == outcome_of(loss, trained, True)
    assert int(trained.abs().sum()) != 0
    # And the step's reduced gradients are back, the replay's unsharded ones dropped
    assert all(
        torch.equal(p.grad.to_local(), r) for p, r in zip(model.parameters(), reduced, strict=True)
    )
    taps = guard._run.parallel.gradient_taps()
    assert taps.unsharded_parameters() and all(
        leaf.grad is None for leaf in taps.unsharded_parameters()
    )

"""Tensor parallel: the mesh learned from the parameters on a one-rank gloo group, the layouts
refused by name, and check 2's earliest-local-divergence reasoning on synthetic tables."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

import sdc_agent as sdc
from sdc_agent.checks.replay.attribution import (
    earliest_local_mismatches,
    find_culprits,
    first_divergence,
)
from sdc_agent.drills.faults import ScaleWeightGradElement
from sdc_agent.drills.tp import TPDrillModel, tp_plan
from sdc_agent.parallel import FSDP2Adapter, TensorParallelAdapter, adapter_for, learn_layout
from sdc_agent.topology import TopologyError, groups_on, validate_placement
from tests.unit import test_fsdp_adapter

one_rank = test_fsdp_adapter.one_rank
"""A one-rank gloo process group (the FSDP2 adapter tests' fixture)."""


def tp_model(names: tuple[str, ...]) -> nn.Module:
    """The TP drill model: column/row-parallel blocks on ``mesh["tp"]``, fully_shard on the rest
    (each block and the root; embedding, norm and head on the data-parallel sub-mesh only)."""
    mesh = init_device_mesh("cpu", (1,) * len(names), mesh_dim_names=names)
    model = TPDrillModel()
    parallelize_module(model, mesh["tp"], tp_plan(model, sequence_parallel=False))
    dp = mesh[names[:-1]] if len(names) > 2 else mesh[names[0]]
    for block in model.blocks:
        fully_shard(block, mesh=dp)
    return fully_shard(model, mesh=dp)


@pytest.mark.parametrize(
    ("names", "kind"),
    [(("dp", "tp"), "fsdp+tp"), (("replicate", "shard", "tp"), "hsdp+tp")],
)
def test_the_whole_mesh_is_learned_from_parameters_on_it_and_its_sub_meshes(one_rank, names, kind):
    # Given torchtitan's layout: TP on mesh["tp"], fully_shard on the data-parallel dimensions,
    # so the embedding, norm and head live on a sub-mesh without "tp"
    model = tp_model(names)
    params = list(model.named_parameters())
    assert len({p.device_mesh.ndim for _, p in params}) == 2
    # When the layout is learned
    _, layout = learn_layout(params)
    # Then every dimension has its role and the TP groups are known
    assert layout.kind == kind and layout.tensor_parallel
    assert layout.roles == (("replicate",) if len(names) == 3 else ()) + ("shard", "tp")
    assert layout.tp_groups == ((0,),)
    # And the guard's adapter is the tensor-parallel one
    adapter = adapter_for(model, None)
    assert isinstance(adapter, TensorParallelAdapter)
    assert adapter.compute_groups == ((0,),) and adapter.seed_rank(0) == 0
    assert adapter.coverage_facts()["mesh"] == dict.fromkeys(layout.roles, 1)


def test_the_fsdp2_adapter_refuses_a_tensor_parallel_layout_itself(one_rank):
    # Given a TP x FSDP2 model, the adapter for FSDP2 alone would miss the TP groups' RNG
    with pytest.raises(sdc.ShardingLayoutError, match="TensorParallelAdapter"):
        FSDP2Adapter(tp_model(("dp", "tp")), None)


@pytest.mark.parametrize(
    ("names", "what"),
    [(("dp", "cp"), "context parallel"), (("dp_replicate", "cp"), "context parallel")],
)
def test_context_parallel_meshes_are_refused_naming_what_was_found(one_rank, names, what):
    # Given a model sharded over a mesh with a context-parallel dimension
    mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=names)
    model = fully_shard(TPDrillModel(), mesh=mesh)
    # Then the guard refuses it, naming the parallelism and the dimension
    with pytest.raises(sdc.ShardingLayoutError, match=what) as err:
        adapter_for(model, None)
    assert "'cp'" in str(err.value)


def test_experts_on_a_mesh_of_their_own_are_refused_as_expert_parallel(one_rank):
    # Given dense layers on a ("dp", "tp") mesh and MoE experts sharded on a ("dp", "ep") mesh
    model = TPDrillModel()
    experts = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "ep"))
    fully_shard(model.blocks[1], mesh=experts)
    dense = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))
    parallelize_module(model.blocks[0], dense["tp"], {"up": ColwiseParallel()})
    fully_shard(model, mesh=dense["dp"])
    # Then the two meshes are not one mesh's dimensions: refused, naming expert parallelism
    with pytest.raises(sdc.ShardingLayoutError, match="Expert parallel"):
        adapter_for(model, None)


def test_tensor_parallel_without_fully_shard_is_refused(one_rank):
    # Given column/row-parallel layers but no data-parallel sharding
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
    model = TPDrillModel()
    parallelize_module(model, mesh, {"blocks.0.up": ColwiseParallel()})
    # Then the error says to compose it with FSDP2
    with pytest.raises(sdc.ShardingLayoutError, match="not sharded with fully_shard"):
        adapter_for(model, None)


def test_a_weight_gradient_fault_corrupts_a_dtensors_local_slice(one_rank):
    # Given a gradient DTensor sharded over a one-rank tp mesh
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
    grad = DTensor.from_local(torch.ones(4, 2), mesh, [Shard(0)])
    fault = ScaleWeightGradElement("w", index=3, factor=1000.0, rank=0)
    # When the fault's hook changes it
    fault._should_fire = lambda: True  # type: ignore[method-assign]
    corrupted = fault._hook(grad)
    # Then the local slice holds the change, the layout is kept, the input is untouched
    assert isinstance(corrupted, DTensor) and corrupted.placements == (Shard(0),)
    assert corrupted.to_local().view(-1)[3] == 1000.0 and grad.to_local().sum() == 8


# ---------------------------------------------------------------- check 2's pure reasoning
def test_first_divergence_is_the_first_differing_local_result():
    assert first_divergence([[1, 1], [2, 2], [3, 3]], [[1, 1], [2, 9], [3, 9]]) == 1
    assert first_divergence([[1, 1]], [[1, 1]]) == 1  # equal: only the loss differed


def test_the_pairs_that_diverged_first_are_kept_and_name_the_gpu():
    # Given 3 TP groups of 2 (ranks 2g, 2g+1), offset 2, and rank 3 wrong in its own local
    # result 4 and in its replay of rank 5's (persistent); its partner 2 diverges at result 6,
    # after the row-parallel all-reduce carried rank 3's wrong value to it
    pairs = [(2, 0), (3, 1), (4, 2), (5, 3)]
    first = {(2, 0): 6, (3, 1): 4, (4, 2): 6, (5, 3): 4}
    group_of = [0, 0, 1, 1, 2, 2]
    # When the earliest local mismatches are kept
    kept = earliest_local_mismatches(pairs, first, group_of)
    # Then the ring's attribution names rank 3 alone
    assert kept == [(3, 1), (5, 3)]
    assert find_culprits(kept) == [3]


def test_ranks_that_diverge_at_the_same_local_result_are_both_kept():
    # Given both ranks of a group wrong from the same local result (a wrong collective result)
    pairs = [(2, 0), (3, 1)]
    kept = earliest_local_mismatches(pairs, {(2, 0): 5, (3, 1): 5}, [0, 0, 1, 1, 2, 2])
    # Then neither is dropped: the group is what the evidence names
    assert kept == pairs


def test_a_peer_offset_that_splits_a_tp_group_is_refused():
    # Given TP groups of 2 ranks, one per node, and peer_offset 1: rank 1 would replay rank 2's
    # slice 0 with its slice 1
    nodes = ["n0", "n0", "n1", "n1", "n2", "n2"]
    groups = [[0, 1], [2, 3], [4, 5]]
    with pytest.raises(TopologyError, match="multiple of the TP degree"):
        validate_placement(nodes, 1, groups)
    # And peer_offset 2 maps each group onto the next node's, slice by slice
    validate_placement(nodes, 2, groups)


def test_a_12_rank_hsdp_x_tp_mesh_lays_out_replicas_slices_and_tp_groups(one_rank):
    # Given a ("replicate", "shard", "tp") mesh of 3 replicas x 2 shards x 2 (ranks row-major),
    # as rank 0 sees it (the layout's maths does not need the other ranks)
    from torch.distributed.device_mesh import DeviceMesh

    from sdc_agent.parallel.mesh import _layout_of

    grid = torch.arange(12).reshape(3, 2, 2)
    mesh = DeviceMesh("cpu", grid, mesh_dim_names=("replicate", "shard", "tp"), _init_backend=False)
    layout = _layout_of(mesh, ("replicate", "shard", "tp"), "hsdp+tp")
    # Then each (shard, tp) slice has 3 replicas, one per replica of 4 ranks, and the TP groups
    # are consecutive pairs
    assert (layout.replicas, layout.shards, layout.tp) == (3, 4, 2)
    assert layout.replicas_of_shard == ((0, 4, 8), (1, 5, 9), (2, 6, 10), (3, 7, 11))
    assert layout.tp_groups == ((0, 1), (2, 3), (4, 5), (6, 7), (8, 9), (10, 11))
    assert layout.dims() == {"replicate": 3, "shard": 2, "tp": 2}
    # And with 4 ranks per node, peer_offset 4 replays each TP group on the next node, while
    # peer_offset 2 would replay on the same node (the other shard's group): refused
    nodes = [f"n{r // 4}" for r in range(12)]
    validate_placement(nodes, 4, layout.tp_groups)
    with pytest.raises(TopologyError, match=r"three\s+different nodes"):
        validate_placement(nodes, 2, layout.tp_groups)


def test_tp_groups_inside_pipeline_stages_are_placed_along_each_stages_ring(one_rank):
    # Given TP x PP x HSDP on 12 ranks: a ("replicate", "shard", "pp", "tp") mesh of 3 x 1 x 2 x
    # 2 (one replica's 2 stages x TP 2 on each node of 4), each stage's parameters on the
    # ("replicate", "shard", "tp") mesh of its stage
    from torch.distributed.device_mesh import DeviceMesh

    from sdc_agent.parallel.mesh import _layout_of

    grid = torch.arange(12).reshape(3, 1, 2, 2)
    nodes = [f"n{r // 4}" for r in range(12)]
    stage_0 = DeviceMesh(
        "cpu", grid[:, :, 0, :], mesh_dim_names=("replicate", "shard", "tp"), _init_backend=False
    )
    layout = _layout_of(stage_0, ("replicate", "shard", "tp"), "hsdp+tp")
    # (rank 0 sees stage 0's TP groups; stage 1's are its ranks' pairs the same way)
    assert layout.tp_groups == ((0, 1), (4, 5), (8, 9))
    tp_groups = [*layout.tp_groups, (2, 3), (6, 7), (10, 11)]
    for stage in range(2):
        # Then each stage's ring of pipelines holds its ranks in pipeline order, and its TP
        # groups are consecutive positions on that ring (the other stage's are not on it)
        ring = grid[:, :, stage, :].flatten().tolist()
        positions = groups_on(ring, tp_groups)
        assert positions == [[0, 1], [2, 3], [4, 5]]
        # And an offset of 2 pipelines (one node's TP group) replays each group on the next
        # node, slice by slice; an offset of 1 would split a TP group: refused
        validate_placement([nodes[r] for r in ring], 2, positions)
        with pytest.raises(TopologyError, match="multiple of the TP degree"):
            validate_placement([nodes[r] for r in ring], 1, positions)
    # And groups whose ranks are not on a ring are not that ring's
    assert groups_on([0, 4, 8], [(0, 1), (4, 5)]) == []
    assert groups_on([0, 1, 4, 5], [(0, 1), (8, 9)]) == [[0, 1]]


def test_a_modules_parameter_gradients_are_recorded_in_row_order_whatever_autograd_chose():
    # Given a step that records its local results, a forward output and then one module's two
    # gradients (rows 4 and 5), accumulated bias first in one computation and weight first in
    # the other (a protected layer's own backward against F.linear's)
    from sdc_agent.checks.gradients.stats import GradStatsState

    def record(order: list[int]) -> list[list[int]]:
        state = GradStatsState(process_group=None, param_index={}, records_events=True)
        state.arm(capture_fingerprints=True, device=torch.device("cpu"))
        state.add_local_event(torch.tensor([1, 1]))  # a module's output
        for row in order:
            state.add_local_event(torch.tensor([row, row]), group=7, order=row)
        state.add_local_event(torch.tensor([9, 9]), group=8, order=9)  # the next module's
        return state.local_table().tolist()

    # Then both record the same table: the run of one module's gradients in row order
    assert record([5, 4]) == record([4, 5]) == [[1, 1], [4, 4], [5, 5], [9, 9]]

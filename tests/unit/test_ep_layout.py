"""Expert parallel: which layouts the guard accepts, learned from the parameters on a one-rank
gloo group, and which it still refuses by the dimension it found."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.placement_types import Placement

import sdc_agent as sdc
from sdc_agent.coverage import NOT_COVERED_EP
from sdc_agent.parallel import ExpertParallelAdapter, adapter_for, learn_layout
from sdc_agent.parallel.ep import ep_coverage_facts
from tests.unit import test_fsdp_adapter
from tests.unit.test_tp_adapter import tp_model

one_rank = test_fsdp_adapter.one_rank
"""A one-rank gloo process group (the FSDP2 adapter tests' fixture)."""

TORCHTITAN_EXPERT_MESH = ("dp_replicate", "efsdp", "ep")
EP_PLACEMENTS = (Replicate(), Replicate(), Shard(0))


def moe_like(
    dense: tuple[str, ...] = ("dp_replicate", "fsdp"),
    expert: tuple[str, ...] = TORCHTITAN_EXPERT_MESH,
    placements: tuple[Placement, ...] = EP_PLACEMENTS,
) -> nn.Module:
    """A dense model sharded by fully_shard on ``dense``, with one 'experts' parameter (experts
    x out x in, Shard(0) on the expert dimension) on a mesh named ``expert``, as torchtitan
    lays out the routed experts."""
    torch.manual_seed(0)
    model: nn.Module
    if "tp" in dense:  # the TP drill model: column/row-parallel blocks, FSDP2 on the rest
        model = tp_model(dense)
    else:
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        fully_shard(model, mesh=init_device_mesh("cpu", (1,) * len(dense), mesh_dim_names=dense))
    expert_mesh = init_device_mesh("cpu", (1,) * len(expert), mesh_dim_names=expert)
    experts = distribute_tensor(torch.randn(2, 4, 4), expert_mesh, list(placements))
    model.get_submodule(
        next(n for n, m in model.named_modules() if n and isinstance(m, nn.Linear))
    ).register_parameter("experts", nn.Parameter(experts))
    return model


def test_torchtitans_expert_parallel_over_hsdp_is_learned_with_its_ep_groups(one_rank):
    # Given the routed experts on ("dp_replicate", "efsdp", "ep") and the rest on HSDP's mesh
    model = moe_like()
    # When the layout is learned
    mesh, layout = learn_layout(list(model.named_parameters()))
    # Then it is HSDP with expert parallel: the dense mesh, its replicas, and the EP groups
    assert layout.kind == "hsdp+ep" and layout.expert_parallel
    assert mesh.mesh_dim_names == ("dp_replicate", "fsdp")
    assert layout.ep_groups == ((0,),) and layout.expert_params == ("0.experts",)
    assert layout.replicas_of_shard == ((0,),)
    # And the guard's adapter is the expert-parallel one
    assert isinstance(adapter_for(model, None), ExpertParallelAdapter)


def test_the_coverage_facts_say_the_replays_are_off_and_name_the_ep_groups(one_rank):
    # Given the accepted layout
    _, layout = learn_layout(list(moe_like().named_parameters()))
    # When its coverage facts are asked for
    facts = ep_coverage_facts(layout)
    # Then they carry the EP groups and why no replay runs
    assert facts["parallel"] == "hsdp+ep" and facts["expert_groups"] == [[0]]
    assert "replay audit does not yet run" in facts["replays_off"]
    assert facts["mesh"]["ep"] == 1
    assert any("replay audit does not yet run" in line for line in NOT_COVERED_EP)
    # and the adapter says why the sensors cannot run (shown when layers are protected)
    assert "grouped GEMMs" in (ExpertParallelAdapter.sensors_unsupported or "")


@pytest.mark.parametrize(
    ("dense", "expert", "placements", "message"),
    [
        # torchtitan's expert tensor parallel dimension: refused by name
        (
            ("dp_replicate", "fsdp"),
            ("dp_replicate", "ep", "etp"),
            EP_PLACEMENTS,
            r"\['ep', 'etp'\]",
        ),
        # torchtitan's older names for the expert mesh
        (
            ("dp_replicate", "fsdp"),
            ("dp_replicate", "dp_shard_in_ep", "ep"),
            EP_PLACEMENTS,
            r"\['dp_shard_in_ep', 'ep'\]",
        ),
        # EP without replicas: nothing to compare the experts with
        (("fsdp",), ("efsdp", "ep"), (Replicate(), Shard(0)), r"\('efsdp', 'ep'\)"),
        # EP composed with tensor parallel on the dense mesh
        (
            ("replicate", "shard", "tp"),
            TORCHTITAN_EXPERT_MESH,
            EP_PLACEMENTS,
            "dense HSDP\\+TP mesh",
        ),
        # the experts replicated along ep: not expert parallel as torchtitan shards it
        (
            ("dp_replicate", "fsdp"),
            TORCHTITAN_EXPERT_MESH,
            (Replicate(), Replicate(), Replicate()),
            "expert parameter 0.experts has placements",
        ),
    ],
)
def test_other_expert_parallel_layouts_are_still_refused_by_name(
    one_rank, dense, expert, placements, message
):
    # Given an expert-parallel layout other than torchtitan's over HSDP
    model = moe_like(dense, expert, placements)
    # When the guard reads the layout, then it refuses it, saying what was found and what is
    # supported
    with pytest.raises(sdc.ShardingLayoutError, match=message) as refused:
        adapter_for(model, None)
    assert "('dp_replicate', 'efsdp', 'ep')" in str(refused.value)
    assert "does not check yet" in str(refused.value)


def test_a_model_whose_every_parameter_is_on_the_expert_mesh_is_refused(one_rank):
    # Given every parameter on an expert mesh (no dense HSDP mesh to read the replicas from)
    mesh = init_device_mesh("cpu", (1, 1, 1), mesh_dim_names=TORCHTITAN_EXPERT_MESH)
    experts = distribute_tensor(torch.randn(2, 4, 4), mesh, list(EP_PLACEMENTS))
    params = [("experts", nn.Parameter(experts))]
    # When the layout is learned, then it is refused
    with pytest.raises(sdc.ShardingLayoutError, match="no dense HSDP mesh"):
        learn_layout(params)

"""Expert-parallel (MoE) jobs the multi-process tests run on every rank: torchtitan's MoE.

torchtitan 0.3.0's DeepSeek-V3 debug model (its config builders, shrunk: 2 layers, the second a
MoE of 4 routed experts, top-2 token-choice routing, the standard all-to-all token dispatcher,
grouped experts), built on the meta device and initialised by its own ``init_weights`` (no
weights are downloaded), parallelised as its Trainer does with
``ParallelDims(dp_replicate=3, dp_shard=2, ep=2)`` on 6 gloo processes (3 simulated nodes x 2
ranks): the dense weights on HSDP's ``("dp_replicate", "fsdp")`` mesh (3 replicas x 2 shards),
the routed experts on ``("dp_replicate", "efsdp", "ep")`` (3 x 1 x 2: each EP rank holds 2 of the
4 experts, every expert has 3 copies, one per node).

Three workarounds make torchtitan's MoE run on the CPU with gloo (docs/usage/ep.md):

* ``torchtitan.tools.utils.device_type`` falls back to ``"cuda"`` when no accelerator is found,
  and ``ParallelDims.build_mesh`` builds its meshes on it: set it to ``"cpu"`` where it was
  imported (:func:`_cpu_device_type`).
* The token dispatcher's module imports the minimal-async-EP backend, which needs Triton (CUDA
  only): where that import fails, a stub module stands in whose functions raise if called (the
  standard all-to-all dispatcher used here never calls them) (:func:`_stub_async_ep`).
* torchtitan turns off FSDP2's gradient division (its loss is already divided by the global
  token count), which makes FSDP2 reduce with NCCL's ``PREMUL_SUM``, which gloo lacks: a plain
  sum is the same reduction (``set_force_sum_reduction_for_comms``, :func:`moe_model`).

The MLA attention's inner attention is SDPA (FlexAttention runs only compiled or on CUDA), and
torchtitan's SPMD backend is ``"partial_dtensor"`` (plain DTensors, which its Trainer sets from
``ParallelismConfig.spmd_backend``): the default ``"spmd_types"`` backend needs a typed mesh the
token dispatcher reads its EP group from.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import torch
import torch.distributed as dist

import sdc_agent as sdc
from sdc_agent.drills.job import make_fault
from tests.agent.scenarios import CountingPublisher

VOCAB, DIM, BATCH, SEQ = 64, 32, 2, 8
EXPERTS, TOP_K = 4, 2


def _cpu_device_type() -> None:
    """Workaround 1: torchtitan's mesh code builds on ``device_type``, "cuda" without one."""
    import torchtitan.distributed.parallel_dims as parallel_dims
    import torchtitan.tools.utils as utils

    utils.device_type = "cpu"
    parallel_dims.device_type = "cpu"  # imported by name: patch its copy too


def _stub_async_ep() -> None:
    """Workaround 2: the dispatcher's module imports a Triton-only backend; a stub stands in
    (only where the real import fails) whose functions raise if anything calls them."""
    name = "torchtitan.distributed.minimal_async_ep"
    try:
        __import__(name)
        return
    except ImportError:
        pass

    def unavailable(*_: Any, **__: Any) -> Any:
        raise RuntimeError("minimal_async_ep needs Triton on CUDA (stubbed on the CPU)")

    stub = types.ModuleType(name)
    for attr in (
        "combine_op",
        "dispatch_op",
        "init_buffer",
        "maybe_update_minimal_async_ep_config",
    ):
        setattr(stub, attr, unavailable)
    stub.MinimalAsyncEPDispatchMetadata = type("MinimalAsyncEPDispatchMetadata", (), {})  # type: ignore[attr-defined]
    sys.modules[name] = stub


def moe_config() -> Any:
    """DeepSeek-V3's debug model from its config builders, smaller (see the module docstring)."""
    _stub_async_ep()
    from torchtitan.models.common import Embedding, Linear, RMSNorm
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.common.rope import ComplexRoPE
    from torchtitan.models.deepseek_v3 import (
        _EMBEDDING_INIT,
        _NORM_INIT,
        _build_dsv3_layers,
        _output_linear_init,
    )
    from torchtitan.models.deepseek_v3.model import DeepSeekV3Model

    layers = _build_dsv3_layers(
        n_layers=2,
        n_dense_layers=1,
        dim=DIM,
        n_heads=2,
        q_lora_rank=0,
        kv_lora_rank=16,
        qk_nope_head_dim=8,
        qk_rope_head_dim=8,
        v_head_dim=8,
        mscale=0.70,
        dense_hidden_dim=64,
        moe_hidden_dim=32,
        num_experts=EXPERTS,
        num_shared_experts=1,
        router_top_k=TOP_K,
        router_score_func="softmax",
        attn_backend="flex",
        moe_comm_backend="standard",
        non_blocking_capacity_factor=None,
        rope=ComplexRoPE.Config(
            dim=8,
            max_seq_len=4 * SEQ,
            theta=10000.0,
            scaling="yarn",
            rope_factor=40.0,
            beta_fast=32.0,
            beta_slow=1.0,
            original_seq_len=SEQ,
        ),
    )
    for layer in layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()  # type: ignore[attr-defined]
    return DeepSeekV3Model.Config(
        vocab_size=VOCAB,
        dim=DIM,
        tok_embeddings=Embedding.Config(
            num_embeddings=VOCAB, embedding_dim=DIM, param_init=_EMBEDDING_INIT
        ),
        norm=RMSNorm.Config(normalized_shape=DIM, param_init=_NORM_INIT),
        lm_head=Linear.Config(
            in_features=DIM, out_features=VOCAB, param_init=_output_linear_init(DIM)
        ),
        layers=layers,
        mtp_layers=[],
    )


def moe_model() -> Any:
    """Built on the meta device, parallelised as torchtitan's Trainer does (EP, then FSDP2 on
    the dense and the expert meshes), materialised and initialised by its init_weights."""
    _cpu_device_type()
    from torch.distributed.fsdp import FSDPModule
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed.fsdp import apply_fsdp_to_decoder
    from torchtitan.distributed.utils import set_spmd_backend
    from torchtitan.models.deepseek_v3.sharding import set_deepseek_v3_sharding_config

    # Plain DTensors (torchtitan's "partial_dtensor" backend), as its Trainer sets from
    # ParallelismConfig.spmd_backend: the dispatcher reads the EP group from its mesh.
    set_spmd_backend("partial_dtensor")
    parallel_dims = ParallelDims(
        dp_replicate=3,
        dp_shard=2,
        cp=1,
        tp=1,
        pp=1,
        ep=2,
        world_size=dist.get_world_size(),
        spmd_backend="partial_dtensor",
    )
    parallel_dims.build_mesh()
    config = moe_config()
    # What the Trainer's update_from_config does: every sub-config's sharding (the routed
    # experts Shard(0) on "ep"), which Module.parallelize applies.
    set_deepseek_v3_sharding_config(config, enable_sp=False, enable_ep=True)
    with torch.device("meta"):
        model = config.build()
    model.parallelize(parallel_dims)
    apply_fsdp_to_decoder(
        model,
        parallel_dims.get_mesh(["dp_replicate", "fsdp"]),
        param_dtype=torch.float32,
        reduce_dtype=torch.float32,
        pp_enabled=False,
        ep_degree=parallel_dims.ep,
        edp_mesh=parallel_dims.get_optional_mesh(["dp_replicate", "efsdp"]),
    )
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_force_sum_reduction_for_comms(True)  # workaround 3: gloo has no PREMUL_SUM
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    model.train()
    return model


EXPERT_W1 = "layers.1.moe.routed_experts.inner_experts.w1_EFD"
"""The first grouped GEMM's weights of the MoE layer's routed experts (this rank's 2 of 4)."""
EXPERT_W2 = "layers.1.moe.routed_experts.inner_experts.w2_EDF"
"""The experts' down projection (this rank's 2 of 4)."""


def micro_batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, next tokens) of ``rank`` at ``step``: rebuildable from (step, rank)."""
    g = torch.Generator().manual_seed(step * 1009 + rank)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def make_loss(bf16: bool) -> Any:
    """Cross-entropy of the next token; ``bf16``: the forward under bf16 autocast."""

    def compute_loss(model: Any, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        tokens, labels = batch
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(tokens)
        return torch.nn.functional.cross_entropy(
            logits.float().reshape(-1, VOCAB), labels.reshape(-1)
        )

    return compute_loss


def train(
    *,
    steps: int,
    schedule: dict[str, Any],
    faults: list[dict[str, Any]] = (),  # type: ignore[assignment]
    bf16: bool = False,
) -> dict[str, Any]:
    """torchtitan's MoE under the guard for ``steps`` steps (``guard.train``, a checkpoint
    callback at the schedule's ``ckpt_every``); ``faults`` as the drills' (sdc_agent.drills)."""
    rank = dist.get_rank()
    model = moe_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    publisher = CountingPublisher()
    guard = sdc.Guard(
        model,
        optimizer,
        compute_loss=make_loss(bf16),
        rebuild_batch=micro_batch,
        schedule=sdc.Schedule(**schedule),
        publisher=publisher,
    )
    for spec in faults:
        make_fault(spec).attach(guard)
    updates: list[int] = []
    optimizer.register_step_post_hook(lambda *_: updates.append(guard.current_step))
    saves: list[list[Any]] = []
    alarm = guard.train(
        (micro_batch(s, rank) for s in range(steps)),
        save_checkpoint=lambda s, tags: saves.append([s, tags]),
    )
    return {
        "rank": rank,
        "alarm": alarm.to_dict() if alarm else None,
        "updates": updates,
        "saves": saves,
        "audit_passes": publisher.audit_passes,
        "weight_check_passes": publisher.weight_check_passes,
        "alarms_published": len(publisher.alarms),
        "adapter": type(guard._run.parallel).__name__,
        "coverage": guard.coverage(),
    }


def refused(*, layout: str) -> dict[str, Any]:
    """A Guard over an expert-parallel layout the guard does not check: the error it raises.

    ``etp``: the experts on a mesh with torchtitan's expert-tensor-parallel dimension;
    ``dp_shard_in_ep``: torchtitan's older names for the expert mesh."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    names = {
        "etp": ("dp_replicate", "ep", "etp"),
        "dp_shard_in_ep": ("dp_replicate", "dp_shard_in_ep", "ep"),
    }[layout]
    torch.manual_seed(0)
    dense_mesh = init_device_mesh("cpu", (3, 2), mesh_dim_names=("dp_replicate", "fsdp"))
    expert_mesh = init_device_mesh("cpu", (3, 1, 2), mesh_dim_names=names)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    fully_shard(model, mesh=dense_mesh)
    # One parameter moved onto the expert mesh, as EP shards the experts' weights.
    experts = torch.nn.Parameter(
        distribute_tensor(torch.randn(2, 4, 4), expert_mesh, [Replicate(), Replicate(), Shard(0)])
    )
    model[0].register_parameter("experts", experts)
    try:
        sdc.Guard(
            model,
            torch.optim.SGD(model.parameters(), lr=0.1),
            compute_loss=lambda m, b: m(b).sum(),
            rebuild_batch=lambda step, rank: torch.zeros(1, 4),
            schedule=sdc.Schedule(peer_offset=2),
        )
    except ValueError as err:
        return {"error_type": type(err).__name__, "message": str(err)}
    return {"error_type": None, "message": ""}

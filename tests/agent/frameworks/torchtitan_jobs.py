"""torchtitan jobs: its Llama 3 built from its config classes (small, SDPA attention: flex
attention has no backward on the CPU), sharded by its FSDP2 function on an HSDP mesh
(3 replicas across the nodes x 2 shards within a node), its AdamW container, LR scheduler,
cross-entropy loss, clip_grad_norm_ and DCP CheckpointManager, under TitanGuard."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import sdc_agent as sdc
from tests.agent.frameworks.common import (
    SCHEDULE,
    CountingPublisher,
    UpdateRecord,
    alarm_dict,
    attach,
    quiet_environment,
    report,
    run_docs_example,
    sink_for,
    use_cloudwatch,
)

ACCUMULATION = 2
BATCH, SEQ, VOCAB, DIM, HEADS = 2, 16, 256, 64, 4


def llama3_config() -> Any:
    """A two-layer Llama 3 in torchtitan's config classes (its debug model, smaller)."""
    from torchtitan.models.common import (
        ComplexRoPE,
        Embedding,
        Linear,
        RMSNorm,
        compute_ffn_hidden_dim,
    )
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.common.config_utils import make_ffn_config, make_gqa_config
    from torchtitan.models.llama3 import Llama3Model
    from torchtitan.models.llama3.model import Llama3TransformerBlock

    linear = {"weight": partial(nn.init.trunc_normal_, std=0.02), "bias": nn.init.zeros_}
    norm = {"weight": nn.init.ones_}
    rope = ComplexRoPE.Config(dim=DIM // HEADS, max_seq_len=4 * SEQ, theta=500000, scaling="llama")
    layers = [
        Llama3TransformerBlock.Config(
            attention_norm=RMSNorm.Config(normalized_shape=DIM, param_init=norm),
            ffn_norm=RMSNorm.Config(normalized_shape=DIM, param_init=norm),
            attention=make_gqa_config(
                dim=DIM,
                n_heads=HEADS,
                n_kv_heads=2,
                wqkv_param_init=linear,
                wo_param_init=linear,
                inner_attention=ScaledDotProductAttention.Config(),
                fuse_qkv=True,
                rope=rope,
            ),
            feed_forward=make_ffn_config(
                dim=DIM,
                hidden_dim=compute_ffn_hidden_dim(DIM, multiple_of=64),
                w1_param_init=linear,
                w2w3_param_init=linear,
            ),
        )
        for _ in range(2)
    ]
    return Llama3Model.Config(
        dim=DIM,
        vocab_size=VOCAB,
        tok_embeddings=Embedding.Config(
            num_embeddings=VOCAB,
            embedding_dim=DIM,
            param_init={"weight": partial(nn.init.normal_, std=1.0)},
        ),
        norm=RMSNorm.Config(normalized_shape=DIM, param_init=norm),
        lm_head=Linear.Config(in_features=DIM, out_features=VOCAB, param_init=linear),
        layers=layers,
    )


def sharded_llama3() -> nn.Module:
    """Built on the meta device, sharded by torchtitan's apply_fsdp_to_decoder on an HSDP
    mesh, materialised and initialised by its init_weights, as its Trainer does."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule
    from torchtitan.distributed.fsdp import apply_fsdp_to_decoder

    with torch.device("meta"):
        model = llama3_config().build()
    mesh = init_device_mesh("cpu", (3, 2), mesh_dim_names=("dp_replicate", "fsdp"))
    apply_fsdp_to_decoder(
        model, mesh, param_dtype=torch.float32, reduce_dtype=torch.float32, pp_enabled=False
    )
    for module in model.modules():
        if isinstance(module, FSDPModule):
            # torchtitan sums gradients (its loss is already divided by the global token
            # count) through NCCL's PREMUL_SUM, which gloo lacks: a plain SUM is the same.
            module.set_force_sum_reduction_for_comms(True)
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    model.train()
    return model


def micro_batch(index: int, rank: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """(input_dict, labels) as torchtitan's text datasets yield them."""
    g = torch.Generator().manual_seed(index * 1009 + rank)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    positions = torch.arange(SEQ).expand(BATCH, SEQ).contiguous()
    return {"input": tokens[:, :-1], "positions": positions}, tokens[:, 1:]


def rebuild_batch(step: int, rank: int) -> list[tuple]:
    return [micro_batch(step * ACCUMULATION + i, rank) for i in range(ACCUMULATION)]


def parts(ckpt_every: int, run_dir: str | None) -> tuple[Any, Any, Any, Any]:
    """(model, optimizers, lr_schedulers, checkpointer) as torchtitan's Trainer builds them."""
    from torchtitan.components.checkpointer import CheckpointManager
    from torchtitan.components.optimizer import (
        LRSchedulersContainer,
        OptimizersContainer,
        ParamGroupConfig,
    )

    model = sharded_llama3()
    optimizers = OptimizersContainer.Config(
        param_groups=[
            ParamGroupConfig(pattern=".*", optimizer_name="AdamW", optimizer_kwargs={"lr": 1e-3})
        ],
        implementation="for-loop",
    ).build(model_parts=[model])
    lr_schedulers = LRSchedulersContainer.Config(warmup_steps=2).build(
        optimizers=optimizers, training_steps=100
    )
    checkpointer = None
    if ckpt_every:
        checkpointer = CheckpointManager.Config(
            enable=True, folder="checkpoint", interval=ckpt_every, keep_latest_k=0
        ).build(
            dataloader=None,
            model_parts=[model],
            optimizers=optimizers,
            lr_schedulers=lr_schedulers,
            states={},
            sd_adapter=None,
            base_folder=run_dir,
        )
    return model, optimizers, lr_schedulers, checkpointer


def train(
    *,
    steps: int,
    faults: tuple[str, ...] = (),
    ckpt_every: int = 0,
    run_dir: str | None = None,
    resume: bool = False,
    publish: dict[str, str] | None = None,
) -> dict[str, Any]:
    """torchtitan's parts under TitanGuard; ``faults`` as in the other jobs; ``ckpt_every``:
    the CheckpointManager's interval into ``run_dir``; ``resume``: from the newest checkpoint
    first (refused when an alarm covers it), then from the one TitanGuard.resume chooses;
    ``publish``: CloudWatch (moto) instead of counting."""
    from torchtitan.components.loss import CrossEntropyLoss

    from sdc_agent.integrations.torchtitan import TitanGuard

    quiet_environment()
    rank = dist.get_rank()
    model, optimizers, lr_schedulers, checkpointer = parts(ckpt_every, run_dir)
    counting = CountingPublisher()
    sink = sink_for(publish, counting)
    titan = TitanGuard(
        [model],
        optimizers,
        loss_fn=CrossEntropyLoss.Config().build(),
        lr_schedulers=lr_schedulers,
        checkpointer=checkpointer,
        max_norm=1.0,
        rebuild_batch=rebuild_batch,
        schedule=sdc.Schedule(**SCHEDULE, grad_accum=ACCUMULATION),
        publisher=sink,
        alarm_dir=run_dir,
    )
    guard = titan.guard
    ffn = model.layers["0"].feed_forward
    attach(guard, faults, forward=ffn.w2, weight="layers.0.feed_forward.w1.weight")
    if "shard_nan" in faults:
        # NaN in rank 4's shard of the reduced gradient at step 7 (every local gradient, and
        # every other rank's shard, finite): only rank 4 sees it.
        sdc.faults.NaNReducedGradient(index=3, rank=4, step=7, persistent=False).attach(guard)
    record = UpdateRecord(optimizers, guard.params).counting(lambda: guard.current_step)
    refused = None
    start = 0
    if resume:
        newest = max(int(p.name[5:]) for p in Path(run_dir, "checkpoint").glob("step-*"))
        checkpointer.load(step=newest)
        try:
            titan.train([], start_step=newest)
        except sdc.UnsafeResumeError as err:
            refused = f"step-{newest}: {err}"
        start = titan.resume()
    loaded_tags = titan.tags.tags
    with counting_clips(guard) as clips:
        alarm = titan.train((rebuild_batch(s, rank) for s in range(start, steps)), start_step=start)
    return report(
        alarm=alarm,
        record=record,
        optimizers=optimizers.optimizers,
        framework_step=lr_schedulers.schedulers[0].last_epoch,  # steps its scheduler took
        counting=counting,
        sink=sink,
        refused=refused,
        start=start,
        loaded_tags=loaded_tags,
        saved=checkpoint_steps(run_dir),
        clips=clips,
    )


@contextmanager
def counting_clips(guard: sdc.Guard) -> Iterator[list[int]]:
    """The guard steps at which this rank entered torchtitan's ``clip_grad_norm_`` (a
    collective under FSDP2: the sharded norm's all-reduce), while the block runs."""
    from torchtitan.distributed import utils as titan_dist

    clips: list[int] = []
    original = titan_dist.clip_grad_norm_

    def counted(*args: Any, **kwargs: Any) -> Any:
        clips.append(int(guard.current_step))
        return original(*args, **kwargs)

    titan_dist.clip_grad_norm_ = counted
    try:
        yield clips
    finally:
        titan_dist.clip_grad_norm_ = original


def checkpoint_steps(run_dir: str | None) -> list[int]:
    """The guard steps of torchtitan's checkpoints (``step-N``: guard step N - 1)."""
    if run_dir is None:
        return []
    return sorted(int(p.name[5:]) - 1 for p in Path(run_dir, "checkpoint").glob("step-*"))


def docs_example(*, steps: int, run_dir: str, publish: dict[str, str]) -> dict[str, Any]:
    """docs/integrations.md's torchtitan example, as written, for ``steps`` steps."""
    from torchtitan.components.loss import CrossEntropyLoss

    quiet_environment()
    use_cloudwatch(**publish)
    model, optimizers, lr_schedulers, checkpointer = parts(5, run_dir)
    namespace = run_docs_example(
        "torchtitan",
        {
            "model": model,
            "optimizers": optimizers,
            "lr_schedulers": lr_schedulers,
            "loss_fn": CrossEntropyLoss.Config().build(),
            "checkpointer": checkpointer,
            "rebuild_batch": rebuild_batch,
            "rank": dist.get_rank(),
            "STEPS": steps,
            "CKPT_DIR": run_dir,
        },
    )
    guard = namespace["guard"].guard
    return {
        "alarm": alarm_dict(namespace["alarm"]),
        "start": namespace["start"],
        "steps_applied": lr_schedulers.schedulers[0].last_epoch,
        "saved": checkpoint_steps(run_dir),
        "last_audit_pass": guard.last_audit_pass,
        "delivered": guard.flush(30.0),
    }

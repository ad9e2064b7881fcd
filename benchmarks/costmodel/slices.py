"""Shape-faithful slices of the named models, and their plain and guarded steps, recorded.

A slice is a Hugging Face ``LlamaForCausalLM`` built from a config (no download): one or two
decoder layers at the real width, heads, key/value heads and FFN size (under tensor parallelism
the shapes one rank holds: its heads and its share of the FFN), a short sequence and a small
vocabulary, wrapped as the job wraps it (DDP, or FSDP2 ``fully_shard`` per layer and on the root
with bf16 parameters and fp32 gradient reduction). :func:`record_steps` runs it plainly or under
``sdc_agent.Guard`` with a configuration's schedule, and records chosen steps with
:class:`~.recorder.StepRecorder`: the micro-batch's forward and backward as phase ``micro``,
everything else of the step (the guard's step entry, ``check_gradients``, the optimizer,
``after_update``) as phase ``step``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import torch.distributed as dist
from torch import nn

import sdc_agent as sdc

from .recorder import Emulator, Scaling, StepRecorder, install


@dataclass(frozen=True, kw_only=True)
class SliceShape:
    """What one rank holds of one decoder layer, and how the slice is wrapped."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    parallel: str
    """``ddp`` or ``fsdp`` (FSDP2 over every rank of the slice's group)."""
    bf16: str
    """``autocast`` (fp32 parameters, bf16 autocast) or ``params`` (FSDP2's bf16 parameters)."""

    def __post_init__(self) -> None:
        if self.parallel not in ("ddp", "fsdp"):
            raise ValueError(f"parallel: 'ddp' or 'fsdp', got {self.parallel!r}")
        if self.bf16 not in ("autocast", "params"):
            raise ValueError(f"bf16: 'autocast' or 'params', got {self.bf16!r}")
        if self.bf16 == "params" and self.parallel != "fsdp":
            raise ValueError("bf16='params' is FSDP2's MixedPrecisionPolicy: parallel='fsdp'")


@dataclass(frozen=True, kw_only=True)
class Configuration:
    """One guard configuration of the cost table: the schedule the slice runs and the steps
    recorded (after the warm-up steps before the first of them)."""

    name: str
    schedule: dict[str, Any]
    protect: bool = False
    recorded: tuple[int, ...] = (2,)
    warmup: tuple[int, ...] = (1,)
    optimizer: str = "sgd"
    """``sgd`` (plain SGD), or ``fused_adamw`` (``torch.optim.AdamW(fused=True)``: the guard
    then skips a bad common step on the device, with no host read on a healthy one)."""


PLAIN = Configuration(name="plain", schedule={}, recorded=(2,), warmup=(1,))
COMMON = {"audit_every": 0, "check_every": 0, "check_on_start": False, "peer_offset": 1}
CONFIGURATIONS: tuple[Configuration, ...] = (
    Configuration(name="checks", schedule={**COMMON, "sensors": False}),
    # The default budget, after the burn-in: a step on which no sensor checks (the burst steps
    # are what "every sensor" records; the period comes from the GPU plan). Two warm-up steps:
    # the plan is made (an all-reduce and a read of the agreed rows) at the first step after a
    # protected layer ran, i.e. step 2.
    Configuration(
        name="sensors_idle",
        schedule={**COMMON, "sensor_burn_in": 0},
        protect=True,
        warmup=(1, 2),
        recorded=(3,),
    ),
    Configuration(
        name="sensors_all",
        schedule={**COMMON, "sensor_burn_in": 0, "sensor_budget": math.inf},
        protect=True,
        warmup=(1, 2),
        recorded=(3,),
    ),
)
"""What one process records (no replica needed)."""
PERIODIC = Configuration(
    name="periodic",
    schedule={**COMMON, "sensors": False, "check_every": 4, "audit_every": 5},
    recorded=(2, 3, 4, 5, 7, 8, 10),
)
"""What three processes (three nodes) record, in the order of ``project.PERIODIC_ROLES``: step 2
a common step (it settles step 1's flags); the first weight fingerprints, launched after step 3's
update ((3 + 1) % 4 == 0) and judged in step 4; the first audit step, 5 (5 % 5 == 0: the
preflight's two self-replays, and each fingerprint plan's constants built once); then the
steady state: weight fingerprints launched after step 7 and judged in step 8, and the audit of
step 10. Steps 6 and 9 run unrecorded."""
PLAIN_FUSED_ADAMW = Configuration(name="plain_fused_adamw", schedule={}, optimizer="fused_adamw")
CHECKS_FUSED_ADAMW = Configuration(
    name="checks_fused_adamw", schedule={**COMMON, "sensors": False}, optimizer="fused_adamw"
)
"""Check 1 with a fused AdamW, and its plain step: the common step the sync pin records with
no host sync (tests/unit/test_step_sync_pin.py); not in the cost table."""
BY_NAME = {
    c.name: c for c in (PLAIN, *CONFIGURATIONS, PERIODIC, PLAIN_FUSED_ADAMW, CHECKS_FUSED_ADAMW)
}


def llama(shape: SliceShape, *, layers: int, vocab: int, seed: int = 0) -> nn.Module:
    """The slice's Llama (fp32 parameters), the same on every rank."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.ffn,
        num_hidden_layers=layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        tie_word_embeddings=False,
        use_cache=False,  # training: no key/value cache
        attn_implementation="sdpa",
    )
    # Built without initialisation (seconds per layer at the real width on a busy CPU), then
    # filled once: N(0, 0.02) weights, unit norms, the rotary table recomputed.
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model.to_empty(device="cpu")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if param.ndim == 1:
                param.fill_(1.0)
            else:
                param.normal_(0.0, 0.02, generator=gen)
    rotary = model.model.rotary_emb
    model.model.rotary_emb = type(rotary)(config)
    return model


def wrap(model: nn.Module, shape: SliceShape) -> nn.Module:
    """The slice as the job wraps it: DDP, or FSDP2 on every layer and the root."""
    if shape.parallel == "ddp":
        return nn.parallel.DistributedDataParallel(model)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:  # type: ignore[union-attr]
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def batch(step: int, rank: int, *, tokens: int, vocab: int) -> torch.Tensor:
    """Rank ``rank``'s micro-batch at ``step``: one sequence of ``tokens`` ids (rebuilt alike)."""
    gen = torch.Generator().manual_seed(step * 1009 + rank)
    return torch.randint(0, vocab, (1, tokens), generator=gen)


def loss_function(shape: SliceShape) -> Callable[[nn.Module, torch.Tensor], torch.Tensor]:
    """``compute_loss(model, ids)``: the causal-LM loss Hugging Face computes in the forward."""
    autocast = shape.bf16 == "autocast"

    def compute_loss(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            return model(input_ids=ids, labels=ids).loss

    return compute_loss


@dataclass
class Slice:
    """One built slice: the wrapped model, its optimizer, and the guard (None: plain)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    guard: sdc.Guard | None
    board: Any
    """The sensor board ``sdc.protect`` returned (None: not protected)."""
    compute_loss: Callable[[nn.Module, torch.Tensor], torch.Tensor]
    tokens: int
    vocab: int

    def step(self, n: int, recorder: StepRecorder | None = None) -> None:
        """Run step ``n`` (recorded by ``recorder`` when given)."""
        rank = dist.get_rank()
        ids = batch(n, rank, tokens=self.tokens, vocab=self.vocab)
        with recorder if recorder is not None else Emulator():
            if recorder is not None:
                recorder.phase = "step"
            if self.guard is None:
                if recorder is not None:
                    recorder.phase = "micro"
                self.compute_loss(self.model, ids).backward()
                if recorder is not None:
                    recorder.phase = "step"
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                return
            with self.guard.step(n) as guarded:
                if recorder is not None:
                    recorder.phase = "micro"
                loss = self.compute_loss(self.model, ids)
                loss.backward()
                if recorder is not None:
                    recorder.phase = "step"
                alarm = guarded.check_gradients(loss)
                if alarm is None:
                    self.optimizer.step()
                    self.optimizer.zero_grad(set_to_none=True)
                    alarm = guarded.after_update()
        if alarm is not None:
            raise RuntimeError(f"alarm in a fault-free run at step {n}: {alarm.to_dict()}")


def cuda_linear_path() -> None:
    """Make protected 16-bit layers take their CUDA path: ``torch.mm(..., out_dtype=float32)``
    on the 16-bit operands (torch >= 2.8 on a GPU), not the CPU's fp32 copies and fp32 GEMM.
    The recorder (and the warm-up's emulator) compute that operator as an fp32 product, and
    record it as the 16-bit GEMM with an fp32 output that a GPU runs."""
    from sdc_agent.sensors.ops import linear

    def supported(device: torch.device, dtype: torch.dtype) -> bool:
        return dtype in (torch.bfloat16, torch.float16)

    linear._fp32_out_supported = supported  # type: ignore[assignment]


def build(
    shape: SliceShape,
    configuration: Configuration,
    *,
    layers: int,
    tokens: int,
    vocab: int,
    model: nn.Module | None = None,
) -> Slice:
    """The slice under ``configuration`` (its model built by :func:`llama` unless given)."""
    install()  # before any collective: a step's flags are waited for in the next step
    if configuration.protect:
        cuda_linear_path()
    module = model if model is not None else llama(shape, layers=layers, vocab=vocab)
    board = sdc.protect(module) if configuration.protect else None
    wrapped = wrap(module, shape)
    optimizer: torch.optim.Optimizer
    if configuration.optimizer == "fused_adamw":
        optimizer = torch.optim.AdamW(wrapped.parameters(), lr=1e-4, fused=True)
    else:
        optimizer = torch.optim.SGD(wrapped.parameters(), lr=1e-4)
    compute_loss = loss_function(shape)
    guard = None
    if configuration not in (PLAIN, PLAIN_FUSED_ADAMW):
        guard = sdc.Guard(
            wrapped,
            optimizer,
            compute_loss=compute_loss,
            rebuild_batch=lambda step, rank: batch(step, rank, tokens=tokens, vocab=vocab),
            schedule=sdc.Schedule(**configuration.schedule),
        )
    return Slice(wrapped, optimizer, guard, board, compute_loss, tokens, vocab)


def record_steps(
    built: Slice,
    configuration: Configuration,
    *,
    scaling: Scaling | None = None,
    emulate_16bit_gemms: bool = True,
    timer: Any = None,
) -> list[dict[str, Any]]:
    """Run every step from the configuration's first warm-up step to its last recorded step,
    recording each of its recorded steps; returns one :meth:`StepRecorder.summary` per recorded
    step, in order."""
    steps = sorted(set(configuration.warmup) | set(configuration.recorded))
    out = []
    for n in range(steps[0], steps[-1] + 1):
        if n not in configuration.recorded:
            built.step(n)
            continue
        recorder = StepRecorder(
            scaling=scaling, emulate_16bit_gemms=emulate_16bit_gemms, timer=timer
        )
        built.step(n, recorder)
        recorder.stop()
        summary = recorder.summary()
        guard = built.guard
        summary["sensing"] = bool(guard is not None and guard._run.sensors.sensing)
        out.append(summary)
    return out

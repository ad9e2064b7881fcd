"""A small Hugging Face Llama built from a config, for the sensor tests and the campaign.

No weights, tokenizer or anything else comes from a hub: ``HF_HUB_OFFLINE=1`` is set before
transformers is imported, and the model is built from a ``LlamaConfig`` (RMSNorm, SwiGLU with
``SiLUActivation``, SDPA attention with rotary embeddings and grouped-query attention).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB = 128
SEQUENCE = 16
"""Tokens per sequence: short, so that a 6-rank run on 2 cores stays fast."""


def llama(seed: int = 0, *, layers: int = 2) -> LlamaForCausalLM:
    """The issue's Llama: vocab 128, width 64, MLP 128, 4 heads over 2 key/value heads."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    return LlamaForCausalLM(config)


def tokens(step: int, rank: int, *, batch: int = 2, seed: int = 0) -> torch.Tensor:
    """Rank ``rank``'s token batch at ``step`` (the same on every call: replays rebuild it)."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
    return torch.randint(0, VOCAB, (batch, SEQUENCE), generator=gen)


def causal_lm_loss(model: nn.Module, ids: torch.Tensor, *, bf16: bool = False) -> torch.Tensor:
    """The next-token loss as Hugging Face computes it inside the forward (``labels=``)."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        return model(input_ids=ids, labels=ids).loss

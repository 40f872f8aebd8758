"""Checkers for lesson 00 (setup and model anatomy). Each returns a verdict string; print it."""

from __future__ import annotations

import torch

from ..runtime import as_dtype
from .common import check_number, checker


def parameter_bytes(model, dtype: torch.dtype) -> int:
    """Bytes of ``model``'s distinct parameters stored in ``dtype`` (a tied embedding/lm_head matrix counts once)."""
    return sum(p.numel() for p in model.parameters()) * as_dtype(dtype).itemsize


@checker
def check_parameter_bytes(answer, *, model, dtype: torch.dtype = torch.bfloat16) -> str:
    """Exercise: how many bytes do the model's weights take in ``dtype``?"""
    return check_number(
        answer, parameter_bytes(model, dtype),
        what=f"bytes of the parameters in {dtype}",
        hint=("count the parameters (sum of p.numel() over model.parameters(); the embedding matrix shared with "
              "the lm_head counts once) and multiply by the bytes of one element (bf16 and fp16: 2, fp32: 4)."),
    )


@checker
def check_queries_per_kv_head(answer, *, config) -> str:
    """Exercise: how many query heads share one key/value head (grouped-query attention)?"""
    return check_number(
        answer, config.num_attention_heads // config.num_key_value_heads,
        what="query heads per key/value head",
        hint="divide the number of attention (query) heads by the number of key/value heads in the config.",
    )


@checker
def check_head_dim(answer, *, config) -> str:
    """Exercise: the length of the vector one attention head works with."""
    expected = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return check_number(
        answer, expected,
        what="head_dim",
        hint="the hidden size is split evenly among the query heads: hidden_size / num_attention_heads.",
    )

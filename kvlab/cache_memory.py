"""How many bytes a KV cache holds, from the model's config alone.

Every layer keeps one key and one value vector per kv head for every token it has seen:

    bytes per token = 2 (K and V) x layers x kv_heads x head_dim x bytes per element

Grouped-query attention (GQA) shares each kv head among several query heads, so ``kv_heads`` (not the
number of query heads) is what the cache pays for.
"""

from __future__ import annotations

import torch


def _dtype(dtype) -> torch.dtype:
    if isinstance(dtype, str):
        found = getattr(torch, dtype, None)
        if not isinstance(found, torch.dtype):
            raise ValueError(f"unknown dtype {dtype!r}: use a torch dtype such as torch.float16 or 'bfloat16'")
        return found
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype must be a torch.dtype (e.g. torch.float16, or model.dtype), got {dtype!r}")
    return dtype


def kv_sizes(config) -> tuple[int, int, int]:
    """``(layers, kv_heads, head_dim)`` of a model config; kv_heads defaults to the query heads (plain MHA)."""
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return cfg.num_hidden_layers, kv_heads, head_dim


def kv_bytes_per_token(config, dtype) -> int:
    """``2 x layers x kv_heads x head_dim x element size``: the cache's growth per token of one sequence."""
    layers, kv_heads, head_dim = kv_sizes(config)
    return 2 * layers * kv_heads * head_dim * _dtype(dtype).itemsize


def kv_cache_bytes(config, tokens: int, dtype, *, batch: int = 1) -> int:
    """Bytes of keys and values held for ``batch`` sequences of ``tokens`` cached tokens each."""
    for name, value in (("tokens", tokens), ("batch", batch)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return batch * tokens * kv_bytes_per_token(config, dtype)

"""Checkers for lesson 03 (HuggingFace DynamicCache and StaticCache). Each returns a verdict string; print it.

Expected values are measured live on a tiny model with transformers' own caches where a measurement exists.
"""

from __future__ import annotations

import torch

from ..sizes import kv_cache_bytes
from .common import check_number, checker


@checker
def check_static_cache_bytes(answer, *, config, max_cache_len: int, dtype, batch: int = 1) -> str:
    """Exercise: bytes a StaticCache of ``max_cache_len`` slots holds, however few tokens were decoded."""
    return check_number(
        answer, kv_cache_bytes(config, max_cache_len, dtype, batch=batch),
        what=f"StaticCache bytes for max_cache_len={max_cache_len} in {dtype}",
        hint="it is preallocated: 2 (K and V) x layers x kv_heads x head_dim x bytes per element x max_cache_len, "
             "whatever the number of tokens decoded so far.",
    )


@torch.inference_mode()
def counter_after(prompt_len: int, steps: int) -> int:
    """Layer 0's ``cumulative_length`` after an eager prefill of ``prompt_len`` tokens and ``steps`` one-token
    decode calls, measured on a tiny model."""
    from ..hf_caches import make_static_cache
    from ..models import tiny_model

    model = tiny_model("tiny-llama")
    cache = make_static_cache(model, prompt_len + steps + 1)
    model(torch.arange(1, prompt_len + 1).unsqueeze(0), cache=cache)
    for _ in range(steps):
        model(torch.ones(1, 1, dtype=torch.long), cache=cache)
    return int(cache.layers[0].cumulative_length)


@checker
def check_counter_after(answer, *, prompt_len: int = 12, steps: int = 5) -> str:
    """Exercise: ``cumulative_length`` after a ``prompt_len``-token prefill and ``steps`` decode calls."""
    return check_number(
        answer, counter_after(prompt_len, steps),
        what=f"cumulative_length after a {prompt_len}-token prefill and {steps} decode calls",
        hint="StaticLayer.update adds key_states.shape[-2] each call: the prompt's length once, then 1 per call.",
    )

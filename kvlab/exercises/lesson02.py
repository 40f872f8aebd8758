"""Checkers for lesson 02 (a hand-written KV cache). Each returns a verdict string; print it."""

from __future__ import annotations

from ..handwritten import cat_bytes_copied
from ..sizes import kv_cache_bytes
from .common import check_number, checker


@checker
def check_cache_bytes(answer, *, config, tokens: int, dtype, batch: int = 1) -> str:
    """Exercise: bytes of K and V a cache holds for ``batch`` sequences of ``tokens`` tokens."""
    return check_number(
        answer, kv_cache_bytes(config, tokens, dtype, batch=batch),
        what=f"KV cache bytes for {batch} x {tokens} tokens in {dtype}",
        hint="2 (K and V) x layers x kv_heads (not query heads) x head_dim x bytes per element, per token.",
    )


@checker
def check_cat_bytes(answer, *, config, prompt_len: int, new_tokens: int, dtype, batch: int = 1) -> str:
    """Exercise: bytes torch.cat copies while the hand-written cache makes ``new_tokens`` tokens."""
    return check_number(
        answer, cat_bytes_copied(config, prompt_len, new_tokens, dtype, batch=batch),
        what=f"bytes copied by torch.cat for a {prompt_len}-token prompt and {new_tokens} new tokens",
        hint=("each step's cat rewrites the whole cache: after step i it holds prompt_len + i tokens "
              "(i = 0 .. n-1); multiply the sum by the bytes per token."),
    )


@checker
def check_cached_positions(answer, *, prompt_len: int, new_tokens: int) -> str:
    """Exercise: token positions the cached loop feeds to the model in total."""
    return check_number(
        answer, prompt_len + new_tokens - 1,
        what=f"positions fed by the cached loop for a {prompt_len}-token prompt and {new_tokens} new tokens",
        hint="the prompt once, then one token per later step; the last token made is never fed back.",
    )

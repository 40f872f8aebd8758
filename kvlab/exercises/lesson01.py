"""Checkers for lesson 01 (naive decoding). Each returns a verdict string; print it."""

from __future__ import annotations

from ..sizes import forward_flops
from .common import check_number, checker


def naive_positions(prompt_len: int, new_tokens: int) -> int:
    """Token positions the naive loop runs through the model: p + (p+1) + ... + (p+n-1)."""
    return new_tokens * prompt_len + new_tokens * (new_tokens - 1) // 2


@checker
def check_positions(answer, *, prompt_len: int, new_tokens: int) -> str:
    """Exercise: how many token positions does the naive loop process to make ``new_tokens`` after a prompt?"""
    return check_number(
        answer, naive_positions(prompt_len, new_tokens),
        what=f"positions processed for a {prompt_len}-token prompt and {new_tokens} new tokens",
        hint="step i feeds the prompt plus the i tokens made so far; add that up over i = 0 .. n-1.",
    )


@checker
def check_step_flops(answer, *, config, length: int) -> str:
    """Exercise: FLOPs of the naive step that runs ``length`` positions (logits at every position, causal)."""
    return check_number(
        answer, forward_flops(config, length), rel_tol=0.01,
        what=f"FLOPs of one naive step over {length} positions",
        hint=("count 2 FLOPs per multiply-add for, per layer and position, the q/k/v/o projections, the "
              "attention scores and weighted values (causal: position j sees j+1 keys) and the 3 MLP matrices, "
              "then the lm_head at every position (kvlab.sizes.flops_breakdown has the formula)."),
    )

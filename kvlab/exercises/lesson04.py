"""Checkers for lesson 04 (graph capture and replay of a vanilla StaticCache). Each returns a verdict string.

Expected values are measured live on a tiny model through ``kvlab.graphs``, not typed in.
"""

from __future__ import annotations

import torch

from .common import NOT_ANSWERED, check_number, checker


@torch.inference_mode()
def counter_at_first_replay(prompt_len: int, warmup: int) -> int:
    """Layer 0's counter when the first replay starts: eager prefill, then ``capture(step, warmup=warmup)``."""
    from ..decoding import greedy
    from ..graphs import capture
    from ..hf_caches import decode_step_fn, make_static_cache
    from ..models import tiny_model

    model = tiny_model("tiny-llama")
    cache = make_static_cache(model, prompt_len + warmup + 4)
    ids = greedy(model(torch.arange(1, prompt_len + 1).unsqueeze(0), cache=cache).logits)
    capture(decode_step_fn(model, cache), ids, warmup=warmup, emulate=True)
    return int(cache.layers[0].cumulative_length)


@checker
def check_counter_at_first_replay(answer, *, prompt_len: int = 20, warmup: int = 3) -> str:
    """Exercise: the counter a captured decode graph finds at its first replay."""
    return check_number(
        answer, counter_at_first_replay(prompt_len, warmup),
        what=f"cumulative_length at the first replay ({prompt_len}-token prompt, {warmup} warm-up calls)",
        hint="warm-up calls are real calls: each one writes a token and adds 1. Capturing itself runs nothing.",
    )


@checker
def check_first_decode_slot(answer, *, prompt_len: int = 37, bucket: int = 64) -> str:
    """Exercise: after a prefill captured at ``bucket`` tokens replays a ``prompt_len``-token prompt, into which
    slot does the first decoded token's key go?"""
    return check_number(
        answer, bucket,
        what=f"the first decode write after a {prompt_len}-token prompt padded to {bucket}",
        hint="the prefill wrote and counted every row of the padded input; the next write goes at the counter.",
    )


@checker
def check_eager_would_be_right(answer) -> str:
    """Exercise: which lesson-04 scenarios would give the right tokens if the step ran eagerly (no capture)?
    Answer with a set of scenario names."""
    from ..failures import SCENARIOS

    if answer is None:
        return NOT_ANSWERED
    if isinstance(answer, str | dict) or not hasattr(answer, "__iter__") or not all(isinstance(a, str) for a in answer):
        return f"not quite: give a set of scenario names (strings), e.g. {{'cache-recreated'}}; got {answer!r}"
    answer = set(answer)
    unknown = answer - set(SCENARIOS)
    if unknown:
        return f"not quite: {sorted(unknown)} are not scenario names; choose from {sorted(SCENARIOS)}"
    expected = {name for name, spec in SCENARIOS.items() if spec["frozen"]}
    if answer == expected:
        return f"correct: {sorted(expected)} fail only because capture froze an address or a Python value"
    missing, extra = sorted(expected - answer), sorted(answer - expected)
    return (f"not quite: missing {missing}, wrongly included {extra}. Hint: a failure that comes from what the calls "
            "did to the cache (padding written, warm-up writes, counters moved) happens eagerly too; one that comes "
            "from a rebinding or a changed Python int only hits the graph, which froze the old one.")

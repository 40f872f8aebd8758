"""Checkers for lesson 05 (the graph-safe StaticCache). Each returns a verdict string; print it.

The expected values are measured live on a tiny model with the package's own caches, not typed in.
"""

from __future__ import annotations

import numbers

import torch

from .common import NOT_ANSWERED, check_number, checker


def _tiny():
    from ..models import tiny_model

    return tiny_model("tiny-llama")


@torch.inference_mode()
def padded_prefill_counters(prompt_len: int, bucket: int) -> tuple[int, int]:
    """(vanilla StaticCache counter, GraphSafeStaticCache counter) after one prefill padded to ``bucket`` tokens
    of which the first ``prompt_len`` are the prompt."""
    from transformers import StaticCache

    from ..graph_safe_cache import GraphSafeStaticCache

    model = _tiny()
    ids = torch.zeros(1, bucket, dtype=torch.long)
    ids[:, :prompt_len] = torch.arange(1, prompt_len + 1)
    vanilla = StaticCache(config=model.config, max_cache_len=2 * bucket)
    safe = GraphSafeStaticCache(config=model.config, max_cache_len=2 * bucket)
    model(ids, cache=vanilla)
    with safe.valid_window(torch.tensor(prompt_len)):
        model(ids, cache=safe)
    return int(vanilla.get_seq_length()), int(safe.cache_position)


@checker
def check_counters_after_padded_prefill(answer, *, prompt_len: int = 21, bucket: int = 32) -> str:
    """Exercise: a prefill padded to ``bucket`` runs a ``prompt_len``-token prompt. Give (vanilla counter,
    graph-safe counter) afterwards."""
    if answer is None:
        return NOT_ANSWERED
    expected = padded_prefill_counters(prompt_len, bucket)
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        return f"not quite: give a pair (vanilla counter, graph-safe counter), got {answer!r}"
    answer = tuple(a.item() if isinstance(a, torch.Tensor) and a.numel() == 1 else a for a in answer)
    if not all(isinstance(a, numbers.Integral) and not isinstance(a, bool) for a in answer):
        return f"not quite: a counter is a whole number of tokens; give two ints, got {answer!r}"
    if answer == expected:
        return f"correct: vanilla counts every row of the bucket ({expected[0]}), graph-safe only the valid ones ({expected[1]})"
    return (f"not quite: you gave {tuple(answer)!r}. Hint: vanilla StaticLayer.update adds key_states.shape[-2] (the padded length); "
            "the graph-safe update adds the valid count.")


@torch.inference_mode()
def seed_reset_next_slot(max_cache_len: int) -> int:
    """The slot a vanilla StaticCache's next write targets after the first seed's reset (counters = max_cache_len)."""
    from ..failures import seed_reset
    from ..hf_caches import make_static_cache

    model = _tiny()
    cache = make_static_cache(model, max_cache_len)
    model(torch.arange(1, 4)[None], cache=cache)
    seed_reset(cache)
    return int(torch.arange(1) + cache.layers[0].cumulative_length)  # what StaticLayer.update computes


@checker
def check_seed_reset_slot(answer, *, max_cache_len: int = 64) -> str:
    """Exercise: after the seed's reset, which slot index does the next token's write target?"""
    expected = seed_reset_next_slot(max_cache_len)
    verdict = check_number(
        answer, expected, what="the slot of the next write",
        hint="StaticLayer.update writes at arange(T) + cumulative_length, and the reset set cumulative_length to max_cache_len.",
    )
    if verdict.startswith("correct"):
        verdict += f": but a layer has slots 0..{max_cache_len - 1} only, so this write is out of range"
    return verdict


def reference_write_positions(counter: int, valid: int, bucket: int, max_cache_len: int) -> torch.Tensor:
    """What ``GraphSafeStaticCache`` computes: the slot each of ``bucket`` incoming rows is written to. [bucket]"""
    from ..graph_safe_cache import GraphSafeStaticCache

    cache = GraphSafeStaticCache(config=_tiny().config, max_cache_len=max_cache_len)
    cache.set_position(counter)
    with cache.valid_window(torch.tensor(valid)):
        return cache.write_positions(bucket, torch.device("cpu"))


CASES = [(0, 5, 8, 16), (10, 3, 4, 16), (0, 8, 8, 16), (14, 4, 4, 16), (7, 1, 1, 16)]  # (counter, valid, bucket, slots)


@checker
def check_write_positions(fn) -> str:
    """Exercise: write ``positions(counter, valid, bucket, max_cache_len) -> LongTensor [bucket]``: valid rows go to
    counter + i, padded rows (and anything past the end) to the trash slot ``max_cache_len``."""
    if fn is None:
        return NOT_ANSWERED
    for case in CASES:
        expected = reference_write_positions(*case)
        try:
            got = torch.as_tensor(fn(*case))
        except Exception as e:  # a student's bug: report it, never raise
            return f"not quite: positions{case} raised {type(e).__name__}: {e}"
        if got.dtype.is_floating_point or got.dtype.is_complex or got.dtype == torch.bool:
            return (f"not quite: positions{case} gave a {got.dtype} tensor; slots are indices: return a LongTensor "
                    "(torch.where of integer tensors stays integer)")
        if got.shape != expected.shape or not torch.equal(got.long().cpu(), expected):
            return (f"not quite: positions(counter, valid, bucket, max_cache_len)={case} gave {got.tolist()}, expected "
                    f"{expected.tolist()}. Hint: rows = arange(bucket); keep = (rows < valid) & (counter + rows < max_cache_len); "
                    "torch.where(keep, counter + rows, max_cache_len).")
    return f"correct: all {len(CASES)} cases match GraphSafeStaticCache.write_positions (trash slot and end of cache included)"


def launch_cost_us(record: dict) -> float:
    """Host time per kernel launch implied by a recorded GPU eager-vs-replay result, in microseconds."""
    eager, replay = record["work_per_step"]["eager"], record["work_per_step"]["replay"]
    if "kernel_launch_calls" not in eager:
        raise ValueError("this record has no kernel launch counts (a CPU run counts aten operations): use the "
                         "recorded GPU result, data/lesson05_gpu.json")
    saved_ms = record["eager_ms_per_token"] - record["replay_ms_per_token"]
    removed = eager["kernel_launch_calls"] - replay["kernel_launch_calls"]
    if removed <= 0:
        raise ValueError("in this record the replay removed no kernel launch, so there is no cost per launch to find")
    return 1e3 * saved_ms / removed


@checker
def check_launch_cost_us(answer, *, record: dict) -> str:
    """Exercise: from the recorded GPU result, how many microseconds did each removed kernel launch cost?"""
    return check_number(
        answer, launch_cost_us(record), what="host microseconds per removed kernel launch", rel_tol=0.1,
        hint="(eager ms per token - replay ms per token) / (kernel launches per eager step - per replay), times 1000.",
    )

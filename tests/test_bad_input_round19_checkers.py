"""Round 19 of the hostile-user probe, exercise checkers: named mistakes a float rounding away from
the right value refused right answers; checkers that tested batch 1 only, or rows whose minimum sat
at one row, called wrong code right; hints that blamed the wrong part."""

from __future__ import annotations

import math
import statistics
from fractions import Fraction

import numpy as np
import pytest
import torch

from kvlab.exercises import common, lesson06

MEDIAN = statistics.median


# ---- 1 · a mistake within float rounding of the right value is no mistake -----------------------

@pytest.mark.parametrize("rate", [
    lambda t1, tn, n, b: b * (n - 1) / (MEDIAN(tn) - MEDIAN(t1)),
    lambda t1, tn, n, b: b / ((MEDIAN(tn) - MEDIAN(t1)) / (n - 1)),
    lambda t1, tn, n, b: b * (n - 1) / float(np.median(tn) - np.median(t1)),
    lambda t1, tn, n, b: b * (n - 1) / float(
        torch.tensor(tn, dtype=torch.float64).quantile(.5)
        - torch.tensor(t1, dtype=torch.float64).quantile(.5)),
    lambda t1, tn, n, b: torch.tensor(b * (n - 1) / (MEDIAN(tn) - MEDIAN(t1))),
    lambda t1, tn, n, b: np.float32(b * (n - 1) / (MEDIAN(tn) - MEDIAN(t1))),
    lambda t1, tn, n, b: Fraction(b * (n - 1) / (MEDIAN(tn) - MEDIAN(t1))),
], ids=["formula", "per-step", "numpy", "quantile", "tensor", "float32", "Fraction"])
def test_tokens_per_s_right_forms_are_right(rate):
    """check_tokens_per_s refused the plain formula: named variants equal to the right value in a
    case landed 1 ulp from it and were taken for mistakes; a rounded rate fell nearer a variant."""
    assert lesson06.check_tokens_per_s(rate).startswith("correct"), lesson06.check_tokens_per_s(
        rate)


def test_tokens_per_s_rounded_by_the_function_is_told_so():
    """A rate rounded to 3 significant digits (1,280 for 1,282.12) was read to its last zero and
    refused with a wrong hint. Since round 20 a function's value may be rounded to 5 significant
    digits or more only (3 hid int(context) in the floor): fewer is "not quite", and the hint says
    it is rounded. Given as a number (not a function), 1,280 reads as 3 digits; a count (no
    tolerance) is still read to its last digit."""
    for rate in (lambda t1, tn, n, b: float(f"{b * (n - 1) / (MEDIAN(tn) - MEDIAN(t1)):.3g}"),
                 lambda t1, tn, n, b: round(b * (n - 1) / (MEDIAN(tn) - MEDIAN(t1)))):
        verdict = lesson06.check_tokens_per_s(rate)
        assert verdict.startswith("not quite") and "your value is rounded" in verdict, verdict
    rate = lambda t1, tn, n, b: round(b * (n - 1) / (MEDIAN(tn) - MEDIAN(t1)), 1)  # noqa: E731
    assert lesson06.check_tokens_per_s(rate).startswith("correct")
    assert common.is_right(1280, 1282.12, rel_tol=1e-6)
    assert not common.is_right(134515000, 134515008)
    assert common.is_right(1000, 1000.3, rel_tol=1e-6)


def test_tokens_per_s_cases_tell_rounded_answers_apart():
    """A rate rounded to a whole number was nearer the paired-repeats variant than the right value:
    every wrong variant must lie over 1% from the right value, or be it up to float rounding."""
    for case in lesson06.RATE_CASES:
        t1, tn = lesson06.timing_case(*case)
        right = lesson06.tokens_per_s_solution(t1, tn, *case[:2])
        for value in lesson06._rate_variants(t1, tn, *case[:2]).values():
            assert common.within_noise(value, right) or abs(value - right) > 0.01 * right


def test_a_mistake_a_rounding_away_is_skipped():
    """nearest_mistake skipped a mistake only when equal to the right value: one a float rounding
    away refused the right answer (and an answer a rounding from the right one)."""
    right = 1660.4741332876622
    below = math.nextafter(right, 0)
    mistakes = [(below, "paired"), (1500.0, "far")]
    assert common.is_right(right, right, mistakes=mistakes)
    assert common.is_right(math.nextafter(right, math.inf), right, mistakes=mistakes)
    assert common.nearest_mistake(1500.0, right, mistakes) == "far"
    # counts stay exact
    assert not common.is_right(10**10 + 1, 10**10)


# ---- 2 · kept drafts: the fewest at every row position -----------------------------------------

def _prefix(rows, verified):
    return (rows[:, 1:] == verified[:, :-1]).long().cumprod(-1).sum(-1)


@pytest.mark.parametrize("rows_read", [
    slice(1, None), slice(None, -1), slice(None, 2), slice(1, None, 2), slice(None, None, 2)],
    ids=["[1:]", "[:-1]", "[:2]", "[1::2]", "[::2]"])
def test_kept_drafts_that_skips_rows_is_refused(rows_read):
    """check_kept_drafts called right a count over a fixed subset of rows (pre[1:].min()): in every
    case of batch > 1 the fewest sat at row 1 or was a tie. Refused, it is told so (not a hint of
    a mistake whose count coincides)."""
    from kvlab.exercises import lesson07

    def some_rows(rows, verified):
        pre = _prefix(rows, verified)
        return pre[rows_read].min() if rows.shape[0] > 1 else pre.min()

    verdict = lesson07.check_kept_drafts(some_rows)
    assert verdict.startswith("not quite") and "reads some rows only" in verdict, verdict


def test_kept_cases_put_the_fewest_at_first_middle_and_last_row():
    """The cases' minima sat at row 1 or tied; each position alone must be the fewest somewhere."""
    from kvlab.exercises import lesson07

    where = set()
    for _, rows, verified in lesson07.kept_cases():
        pre = _prefix(rows, verified)
        at = (pre == pre.min()).nonzero().flatten().tolist()
        if rows.shape[0] > 2 and len(at) == 1:
            where.add("first" if at[0] == 0 else "last" if at[0] == rows.shape[0] - 1 else "middle")
    assert where == {"first", "middle", "last"}


# ---- 3 · lesson 03/04: a batch of 2 -------------------------------------------------------------

def _row0_step(model, cache, ids, position):
    logits = model(ids, cache=cache, position_ids=position.reshape(1, 1)).logits
    position.add_(1)
    return logits[0, -1].argmax().view(1, 1)  # row 0 only


def _row0_broadcast_step(model, cache, ids, position):
    logits = model(ids, cache=cache, position_ids=position.reshape(1, 1)).logits
    position.add_(1)
    return logits[0, -1].argmax().expand(ids.shape[0], 1)  # row 0's token for every row


@pytest.mark.parametrize("step", [_row0_step, _row0_broadcast_step], ids=["shape", "broadcast"])
def test_decode_step_of_row_0_only_is_refused(step):
    """check_decode_step tested batch 1 only: a step returning row 0's token was correct."""
    from kvlab.exercises import lesson03

    verdict = lesson03.check_decode_step(step)
    assert verdict.startswith("not quite") and "batch of 2" in verdict, verdict


def test_graph_decode_with_batch_1_hard_coded_is_refused():
    """check_graph_decode tested batch 1 only: positions [[prompt_len]] and logits[0, -1]
    hard-coded were correct."""
    from kvlab.exercises import lesson04
    from kvlab.graphs import capture

    def graph_decode(model, cache, first_ids, prompt_len, n):
        ids, pos = first_ids.clone(), torch.tensor([[prompt_len]])
        graph = capture(lambda i, p: model(i, cache=cache, position_ids=p).logits[0, -1].argmax()
                        .view(1, 1), ids, pos, warmup=0)
        out = [first_ids]
        for _ in range(1, n):
            t = graph.replay().clone()
            out.append(t)
            ids.copy_(t)
            pos.add_(1)
        return torch.cat(out, 1)

    verdict = lesson04.check_graph_decode(graph_decode)
    assert verdict.startswith("not quite") and "batch of 2" in verdict, verdict


def test_reset_of_row_0_only_is_refused():
    """check_reset_in_place used a batch-1 cache: l.keys[0].zero_() emptied all of it."""
    from kvlab.exercises import lesson03

    def reset(cache):
        for layer in cache.layers:
            layer.keys[0].zero_()
            layer.values[0].zero_()
            layer.cumulative_length.zero_()

    verdict = lesson03.check_reset_in_place(reset)
    assert verdict.startswith("not quite") and "row(s) [1] of the batch" in verdict, verdict


@pytest.mark.parametrize("counter", [
    lambda c: c.fill_(1), lambda c: c.sub_(1), lambda c: c.fill_(-1)], ids=["1", "-1 off", "-1"])
def test_reset_to_a_wrong_counter_says_where_the_write_lands(counter):
    """check_reset_in_place said "the next write would land at slot 14 (the old position)" for
    counters set to another wrong value."""
    from kvlab.exercises import lesson03

    def reset(cache):
        for layer in cache.layers:
            layer.keys.zero_()
            layer.values.zero_()
            counter(layer.cumulative_length)

    verdict = lesson03.check_reset_in_place(reset)
    model = lesson03.check_model()
    cache = lesson03.filled_cache(model)
    landing = int(counter(cache.layers[0].cumulative_length.clone()))
    assert verdict.startswith("not quite") and "old position" not in verdict, verdict
    assert f"land at slot {landing}" in verdict, verdict


# ---- 4 · lesson 05: valid rows past the end, no valid row ---------------------------------------

def test_write_valid_with_no_end_check_is_refused():
    """check_write_valid never had valid rows running past the end of the cache: a write sending
    valid row i to counter + i with no end check was correct."""
    from kvlab.exercises import lesson05

    def write_valid(keys, values, new_k, new_v, counter, valid):
        rows, trash = torch.arange(new_k.shape[2]), keys.shape[2] - 1
        at = torch.where(rows < valid, counter + rows, trash)  # no end-of-cache check
        keys.index_copy_(2, at, new_k)
        values.index_copy_(2, at, new_v)
        return counter.add_(valid)

    verdict = lesson05.check_write_valid(write_valid)
    assert verdict.startswith("not quite") and "past max_cache_len" in verdict, verdict
    assert lesson05.check_write_valid(lesson05.write_valid_solution).startswith("correct")


def test_write_positions_with_valid_clamped_to_1_is_refused():
    """check_write_positions had no case with valid = 0: valid.clamp(min=1) was correct."""
    from kvlab.exercises import lesson05

    def positions(counter, valid, bucket, max_cache_len):
        rows, valid = torch.arange(bucket), valid.clamp(min=1)
        return torch.where((rows < valid) & (counter + rows < max_cache_len), counter + rows,
                           max_cache_len)

    verdict = lesson05.check_write_positions(positions)
    assert verdict.startswith("not quite") and "valid=0" in verdict, verdict


# ---- 5 · lesson 00: a Llama-style count on a Qwen2 / Qwen3 config --------------------------------

def _llama_style_count(c):
    h, heads, kv, inter, vocab, layers = (c.hidden_size, c.num_attention_heads,
                                          c.num_key_value_heads, c.intermediate_size,
                                          c.vocab_size, c.num_hidden_layers)
    d = getattr(c, "head_dim", None) or h // heads
    return (layers * (2 * h * heads * d + 2 * h * kv * d + 3 * h * inter + 2 * h) + vocab * h + h
            + (0 if c.tie_word_embeddings else vocab * h))


@pytest.mark.parametrize("name, part", [("tiny-qwen2", "biases"), ("tiny-qwen3", "q_norm")])
def test_llama_style_count_on_qwen_names_the_part_it_leaves_out(name, part):
    """check_parameter_count blamed RMSNorm weights or the final norm for a Llama-style count on a
    Qwen2 (q/k/v biases) or Qwen3 (q_norm/k_norm) config, which its own message suggests."""
    from kvlab.exercises import lesson00
    from kvlab.lab.models import tiny_model

    verdict = lesson00.check_parameter_count(_llama_style_count, config=tiny_model(name).config)
    assert verdict.startswith("not quite") and part in verdict and "norm" not in verdict.split(
        "Hint:")[1].replace("q_norm", "").replace("k_norm", "").replace("normalizes", ""), verdict


# ---- 6 · minor: spellings, units, row 0, a graph kept across calls ------------------------------

def test_numbers_spelled_with_what_they_count_or_in_words_are_read():
    """" 13 blocks" and "three" were refused as not numbers; a scale or unit after a number stays
    refused."""
    from kvlab.exercises import lesson06, lesson07

    assert lesson07.check_blocks_held(" 13 blocks").startswith("correct")
    assert lesson06.check_padding_rows("three").startswith("correct")
    for text in ("13 thousand", "13 MiB", "13 seconds"):
        with pytest.raises(common.NotANumber):
            common.number_in_text(text)


def test_choices_spelled_with_answer_colon_percent_or_a_ratio_are_read():
    """"answer: B", "10 percent" and "1.1x" (for "10%") named no choice."""
    from kvlab.exercises import lesson00

    assert common.choice_of("answer: B", {"A": "a", "B": "b"}) == "B"
    for text in ("10 percent", "about 10 percent", "1.1x"):
        assert common.choice_of(text, lesson00.GQA_CHOICES) == "10%", text
    assert common.choice_of(1.1, lesson00.GQA_CHOICES) is None  # 1.1x or 1.1%: neither


def test_static_cache_bytes_in_mib_is_told_to_give_bytes():
    """check_static_cache_bytes(1.125), the size in MiB, got the generic formula hint."""
    from kvlab.exercises import lesson00, lesson03
    from kvlab.sizes import kv_cache_bytes

    cfg = lesson00.small_gqa_config()
    mib = kv_cache_bytes(cfg, 1024, torch.bfloat16, batch=4) / 2**20
    verdict = lesson03.check_static_cache_bytes(mib, config=cfg, max_cache_len=1024,
                                                dtype=torch.bfloat16, batch=4)
    assert verdict.startswith("not quite") and "give bytes" in verdict, verdict


def test_naive_decode_with_row_0_for_every_row_is_named():
    """check_naive_decode did not name a loop that appends row 0's token to every row."""
    from kvlab.exercises import lesson01

    def row0(model, prompt, n):
        seq = prompt
        for _ in range(n):
            nxt = model(seq).logits[:, -1].argmax(-1, keepdim=True)[:1].expand(seq.shape[0], 1)
            seq = torch.cat([seq, nxt], 1)
        return seq[:, prompt.shape[1]:]

    verdict = lesson01.check_naive_decode(row0)
    assert verdict.startswith("not quite") and "row 0's tokens" in verdict, verdict


def test_graph_loop_with_a_graph_kept_across_calls_is_named():
    """check_graph_loop blamed a frozen Python position for a graph kept in a global, captured over
    an earlier call's cache."""
    from kvlab.exercises import lesson05
    from kvlab.graphs import capture

    kept = {}

    def loop(model, cache, prompts, n):
        outs = []
        for prompt in prompts:
            cache.reset()
            first = model(prompt, cache=cache).logits[:, -1:].argmax(-1)
            if "graph" not in kept:
                kept["token"] = first.clone()
                kept["graph"] = capture(lambda ids: model(ids, cache=cache).logits[:, -1:]
                                        .argmax(-1), kept["token"], warmup=3)
                for layer in cache.layers:
                    layer.cumulative_length.sub_(3)
            kept["token"].copy_(first)
            out = [first]
            for _ in range(n - 1):
                kept["token"].copy_(kept["graph"].replay())
                out.append(kept["token"].clone())
            outs.append(torch.cat(out, 1))
        return outs

    verdict = lesson05.check_graph_loop(loop)
    assert verdict.startswith("not quite") and "earlier call" in verdict, verdict

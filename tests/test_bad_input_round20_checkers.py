"""Probe round 20 (a hostile student, the checkers): wrong answers called correct."""

import torch

from kvlab import sizes
from kvlab.decoding import greedy
from kvlab.exercises import lesson03, lesson04, lesson06, lesson07
from kvlab.graphs import capture


def _row_offset_step(model, cache, ids, position):
    pos = position + torch.arange(ids.shape[0]).reshape(-1, 1)  # row b at position + b
    out = greedy(model(ids, cache=cache, position_ids=pos).logits)
    position.add_(1)
    return out


def _row_offset_graph_decode(model, cache, first_ids, prompt_len, n):
    static_ids = first_ids.clone()
    static_pos = prompt_len + torch.arange(first_ids.shape[0]).reshape(-1, 1)
    graph = capture(lambda i, p: greedy(model(i, cache=cache, position_ids=p).logits),
                    static_ids, static_pos, warmup=0)
    out = [first_ids]
    for _ in range(1, n):
        token = graph.replay().clone()
        out.append(token)
        static_ids.copy_(token)
        static_pos.add_(1)
    return torch.cat(out, 1)


def test_a_batch_row_fed_at_another_position_is_caught():
    """The batch-of-2 cases compared tokens only, and the second prompt's tokens did not change
    when its positions were shifted by one: a step feeding row b at position + b was correct."""
    for verdict in (lesson03.check_decode_step(_row_offset_step),
                    lesson04.check_graph_decode(_row_offset_graph_decode)):
        assert verdict.startswith("not quite") and "row 1's keys" in verdict, verdict


def test_the_reference_loops_still_pass():
    for check in (lesson03.check_decode_step, lesson04.check_graph_decode):
        assert check(check.solution).startswith("correct"), check


def test_kept_drafts_over_a_fixed_first_rows_is_caught():
    """A count over the first 3 rows passed: no batch put its only fewest row past row 2."""
    def first_three(rows, verified):
        return (rows[:, 1:] == verified[:, :-1]).long().cumprod(-1).sum(-1)[:3].min()

    verdict = lesson07.check_kept_drafts(first_three)
    assert verdict.startswith("not quite") and "reads some rows only" in verdict, verdict


def test_a_floor_rounded_by_the_function_does_not_hide_a_slip():
    """A function rounding its result to 3 significant digits was read at that precision, which
    hid int(context) (the contexts 400.5 and 95.5 are there to catch it)."""
    def floor(cfg, weight_bytes, dtype, batch, context, gb_per_s):
        s = sizes.model_sizes(cfg)
        kv = batch * int(context) * 2 * s.layers * s.kv_heads * s.head_dim * dtype.itemsize
        return float(f"{1e3 * (weight_bytes + kv) / (gb_per_s * 1e9):.3g}")

    verdict = lesson06.check_step_floor_ms(floor)
    assert verdict.startswith("not quite"), verdict


# ---- round 21 (a short re-probe of the changed checkers): right answers refused -----------------
def test_a_floor_rounded_to_5_digits_ending_in_0_is_right():
    """0.214898 to 5 significant digits is 0.21490, stored as 0.2149: read as 4 digits and refused
    with a hint that it was rounded to fewer than 5."""
    def floor(config, weight_bytes, dtype, batch, context, gb_per_s):
        exact = lesson06.step_floor_ms_solution(config, weight_bytes, dtype, batch, context,
                                                gb_per_s)
        return float(f"{exact:.5g}")

    verdict = lesson06.check_step_floor_ms(floor)
    assert verdict.startswith("correct"), verdict


def test_a_counter_held_at_the_cache_end_is_right():
    """check_write_valid's case of valid rows past the end wanted the counter at counter + valid
    (18 of 16), a position GraphSafeStaticCache.set_position refuses; holding it at
    max_cache_len is right too."""
    from kvlab.exercises import lesson05

    def write_valid(keys, values, new_k, new_v, counter, valid):
        slots = keys.shape[2] - 1
        rows = torch.arange(new_k.shape[2])
        at = torch.where((rows < valid) & (counter + rows < slots), counter + rows, slots)
        keys.index_copy_(2, at, new_k)
        values.index_copy_(2, at, new_v)
        return counter.copy_((counter + valid).clamp(max=slots))

    verdict = lesson05.check_write_valid(write_valid)
    assert verdict.startswith("correct"), verdict

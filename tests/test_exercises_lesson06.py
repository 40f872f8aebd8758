"""Lesson 06's checkers: each gets its solution (correct), typical wrong answers (the specific
hint), an unattempted stub (not attempted, or the reference filled in under KVLAB_SOLUTIONS=1) and
code that raises (reported)."""

import statistics

import pytest
import torch
from student_code import FILLED, STUDENT_ERROR, raises, stub

from kvlab import sizes
from kvlab.exercises import lesson06
from kvlab.exercises.common import NOT_ANSWERED, NOT_ATTEMPTED
from kvlab.lab import bench


@pytest.mark.parametrize("check", [lesson06.check_tokens_per_s, lesson06.check_step_floor_ms,
                                   lesson06.check_norm_matmul])
def test_stub_none_and_errors(check, monkeypatch):
    assert check(check.solution).startswith("correct")
    assert check(raises).startswith("not quite: your code raised ValueError: " + STUDENT_ERROR)
    assert check(stub).startswith(FILLED)  # the suite runs with KVLAB_SOLUTIONS=1
    monkeypatch.delenv("KVLAB_SOLUTIONS", raising=False)
    assert check(stub) == NOT_ATTEMPTED and check(None) == NOT_ATTEMPTED


# ---- tokens per second by the decode rule --------------------------------------------------------

def rule(t1, tn, n, batch, *, middle=statistics.median, steps=lambda n: n - 1, prefill=True,
         per_batch=True):
    step = (middle(tn) - (middle(t1) if prefill else 0)) / steps(n)
    return (batch if per_batch else 1) / step


def test_tokens_per_s():
    check = lesson06.check_tokens_per_s
    assert check(rule).startswith("correct")  # written out = kvlab.lab.measure's DecodeTiming
    assert "divided by n: T(n) holds the prefill" in check(
        lambda *a: rule(*a, prefill=False, steps=lambda n: n))
    assert "off by one" in check(lambda *a: rule(*a, steps=lambda n: n))
    assert "mean of the repeats" in check(lambda *a: rule(*a, middle=statistics.fmean))
    assert "fastest repeat (min)" in check(lambda *a: rule(*a, middle=min))
    assert "multiply by batch" in check(lambda *a: rule(*a, per_batch=False))
    assert "seconds per step" in check(lambda t1, tn, n, batch: 1 / rule(t1, tn, n, 1))
    paired = lambda t1, tn, n, b: statistics.median(  # noqa: E731
        b * (n - 1) / (y - x) for x, y in zip(t1, tn, strict=True))
    assert "paired repeat i" in check(paired)
    assert "no number" in check(lambda *a: "fast")


def test_timing_cases_tell_the_mistakes_apart():
    for case in lesson06.RATE_CASES:
        t1, tn = lesson06.timing_case(*case)
        right = lesson06.tokens_per_s_solution(t1, tn, *case[:2])
        assert right == pytest.approx(
            case[1] * (case[0] - 1) / (statistics.median(tn) - statistics.median(t1)))
        wrong = [v for v in lesson06._rate_variants(t1, tn, *case[:2]).values()
                 if v != pytest.approx(right, rel=1e-6)]
        # batch 1 makes "multiply by batch" the right answer, and a pairing may agree
        assert len(wrong) >= 6


# ---- the bandwidth floor -------------------------------------------------------------------------

def floor(config, weight_bytes, dtype, batch, context, gbps, *, heads="kv_heads", k_and_v=2,
          weights_per_seq=False, cache_batch=True):
    s = sizes.model_sizes(config)
    kv = (k_and_v * s.layers * getattr(s, heads) * s.head_dim
          * torch.empty((), dtype=dtype).element_size())
    weights = weight_bytes * (batch if weights_per_seq else 1)
    return 1e3 * (weights + (batch if cache_batch else 1) * context * kv) / (gbps * 1e9)


def test_step_floor_ms():
    check = lesson06.check_step_floor_ms
    # written out = kvlab.sizes.floor_ms with kv_bytes_per_token
    assert check(floor).startswith("correct")
    assert "kv_heads heads per layer, not the query heads" in check(
        lambda *a: floor(*a, heads="heads"))
    assert "K without V" in check(lambda *a: floor(*a, k_and_v=1))
    assert "not once per sequence" in check(lambda *a: floor(*a, weights_per_seq=True))
    assert "multiply the cache term by batch" in check(lambda *a: floor(*a, cache_batch=False))
    assert "not 2**30" in check(lambda *a: floor(*a) * 1e9 / 2**30)
    assert "that is seconds" in check(lambda *a: floor(*a) / 1e3)

    def two_bytes(config, weight_bytes, dtype, *rest):
        return floor(config, weight_bytes, torch.float16, *rest)

    assert "read it from the dtype" in check(two_bytes)

    def hidden_over_heads(config, *rest):
        return floor(config.__class__(**{**config.to_dict(), "head_dim": None}), *rest)

    assert "not hidden_size / heads" in check(hidden_over_heads)


def test_floor_is_the_benchmarks():
    from transformers import LlamaConfig

    from kvlab.lab.models import SMOLLM2_SHAPE

    record = bench.recorded("h200_batch1")
    assert record is not None, "data/h200_batch1.json is part of the course"
    s, m = record["settings"], record["model"]
    config = LlamaConfig(**SMOLLM2_SHAPE)
    assert sizes.kv_bytes_per_token(config, torch.bfloat16) == m["kv_bytes_per_token"]
    context = s["prompt_len"] + (s["new_tokens"] - 1) / 2  # the benchmark's average context
    ours = lesson06.step_floor_ms_solution(config, m["weight_bytes"], torch.bfloat16, 1, context,
                                           record["copy_bandwidth_gbps"])
    assert ours == pytest.approx(record["results"][0]["floor_ms_per_token"])


# ---- predict, then read: the fastest at batch 64 -------------------------------------------------

def test_fastest_prediction(monkeypatch):
    sweep = bench.recorded("h200_batch_sweep")
    assert sweep is not None, "data/h200_batch_sweep.json is part of the course"
    rates = lesson06.rates_at(sweep, 64)
    fastest = max(rates, key=rates.get)
    slower = min(rates, key=rates.get)
    assert lesson06.check_fastest_prediction(fastest, sweep).startswith("correct")
    wrong = lesson06.check_fastest_prediction(slower, sweep)
    assert (wrong.startswith(f"not quite: you predicted {slower!r}")
            and f"{rates[fastest]:,.0f}" in wrong)
    assert "one of" in lesson06.check_fastest_prediction("flash", sweep)
    assert lesson06.check_fastest_prediction(max(lesson06.rates_at(sweep, 1),
                                                 key=lesson06.rates_at(sweep, 1).get),
                                             sweep, batch=1).startswith("correct")
    assert "no record here" in lesson06.check_fastest_prediction("static", None)
    with pytest.raises(ValueError, match="batch sizes are"):
        lesson06.rates_at(sweep, 3)
    monkeypatch.delenv("KVLAB_SOLUTIONS", raising=False)
    unanswered = lesson06.check_fastest_prediction(None, sweep)
    # nothing given away
    assert unanswered.startswith("not predicted") and "tokens/s" not in unanswered


# ---- predict, then read: the fastest kernel in the tile sweep ------------------------------------

def test_tile_prediction(monkeypatch):
    record = bench.recorded("h200_tile_sweep")
    assert record is not None, "data/h200_tile_sweep.json is part of the course"
    cells = {name.split()[0]: by_rows for name, by_rows in bench.tile_sweep(record).items()}
    for projection, by_rows in cells.items():
        for rows, cell in by_rows.items():
            right = cell["path"]
            verdict = lesson06.check_tile_prediction(right, record, projection=projection,
                                                     rows=rows)
            assert verdict.startswith("correct") and f"{cell['tile']:.1f} µs" in verdict, verdict
            wrong = next(path for path in lesson06.TILE_PATHS if path != right)
            assert lesson06.check_tile_prediction(wrong, record, projection=projection,
                                                  rows=rows).startswith(
                f"not quite: you predicted {wrong!r}")
    assert "one of" in lesson06.check_tile_prediction("flash", record)
    assert "no recorded tile sweep" in lesson06.check_tile_prediction("tile", None)
    with pytest.raises(ValueError, match="projections"):
        lesson06.check_tile_prediction("tile", record, rows=3)
    monkeypatch.delenv("KVLAB_SOLUTIONS", raising=False)
    unanswered = lesson06.check_tile_prediction(None, record)
    assert unanswered.startswith("not predicted") and "µs" not in unanswered  # nothing given away


# ---- the padded rows of a batch bucket -----------------------------------------------------------

def test_padding_rows():
    assert lesson06.bucket_for(5, (1, 2, 4, 8)) == 8 and lesson06.bucket_for(8, (8, 1)) == 8
    assert lesson06.check_padding_rows(None) == NOT_ANSWERED
    assert (lesson06.check_padding_rows(3).startswith("correct")
            and "valid window" in lesson06.check_padding_rows(3))
    assert "5 is the number of real rows" in lesson06.check_padding_rows(5)
    assert "8 is the bucket the engine replays" in lesson06.check_padding_rows(8)
    assert lesson06.check_padding_rows(2).startswith("not quite")
    assert lesson06.check_padding_rows(0, running=16).startswith("correct")
    with pytest.raises(ValueError, match="do not fit"):
        lesson06.bucket_for(40, (1, 2, 4, 8, 16, 32))


def test_number_answers_as_one_element_tensors_or_arrays_are_taken_and_nan_is_wrong():
    import numpy as np

    assert lesson06.check_padding_rows(torch.tensor([3])).startswith("correct")
    assert "8 is the bucket the engine replays" in lesson06.check_padding_rows(np.array([8]))
    assert "not a finite number" in lesson06.check_padding_rows(float("nan"))
    rate = lesson06.tokens_per_s_solution
    assert lesson06.check_tokens_per_s(lambda *a: np.array([rate(*a)])).startswith("correct")
    assert lesson06.check_tokens_per_s(
        lambda *a: torch.tensor([round(rate(*a)) + 2], dtype=torch.float64)).startswith(
        "not quite")  # a number, but not the rule's (a whole-number rounding is right)
    assert ("no number (nan, which is not a finite number: a division by zero"
            in lesson06.check_tokens_per_s(lambda *a: float("nan")))
    floor = lesson06.step_floor_ms_solution
    assert lesson06.check_step_floor_ms(lambda *a: np.array([[floor(*a)]])).startswith("correct")


# ---- RMSNorm + matmul ----------------------------------------------------------------------------

def norm_matmul(x, norm_weight, weight, eps):
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * norm_weight) @ weight.T


def test_norm_matmul():
    check = lesson06.check_norm_matmul
    assert check(norm_matmul).startswith("correct")
    # float64: the same values
    assert check(lambda *a: norm_matmul(*a).double()).startswith("correct")
    assert "no normalization" in check(lambda x, nw, w, eps: (x * nw) @ w.T)
    assert "norm_weight left out" in check(
        lambda x, nw, w, eps: norm_matmul(x, torch.ones_like(nw), w, eps))
    assert "eps left out" in check(lambda x, nw, w, eps: norm_matmul(x, nw, w, 0.0))
    assert "LayerNorm" in check(
        lambda x, nw, w, eps: norm_matmul(x - x.mean(-1, keepdim=True), nw, w, eps))
    # [rows, K] @ [N, K]
    assert "your code raised RuntimeError" in check(lambda x, nw, w, eps: x @ w)
    assert "multiply by weight.T" in check(lambda *a: norm_matmul(*a).T)
    assert "float" in check(lambda *a: norm_matmul(*a).long())

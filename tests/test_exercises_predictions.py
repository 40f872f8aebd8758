"""The eight "predict, then run" checkers: every reasonable spelling of the right answer is right (a
list of one, any case, spaces or quotes around, a number as text, a NumPy scalar, a one-element
tensor), anything else gets "one of" (never a TypeError), and a measurement that cannot decide (NaN,
infinity, zero, negative, not a number) is "not checked", never "correct" and never a
ZeroDivisionError."""

import math

import numpy as np
import pytest
import torch

from kvlab.exercises import (
    common,
    lesson00,
    lesson01,
    lesson02,
    lesson03,
    lesson04,
    lesson05,
    lesson06,
    lesson07,
)
from kvlab.lab import bench

SWEEP = {"results": [{"strategy": "static", "batch": 64, "tokens_per_s": 10.0, "exact": True},
                     {"strategy": "graph-safe", "batch": 64, "tokens_per_s": 20.0, "exact": True}]}


def live_key(check, choices):
    """The key a live-run checker calls right (it runs the experiment itself)."""
    (key,) = [k for k in choices if check(k).startswith("correct")]
    return key


def tile_case():
    record = bench.recorded("h200_tile_sweep")
    name, by_rows = next(iter(bench.tile_sweep(record).items()))
    rows, cell = next(iter(by_rows.items()))
    return (lambda p: lesson06.check_tile_prediction(p, record, projection=name.split()[0],
                                                     rows=rows)), cell["path"]


CASES = {  # name -> () -> (check(prediction) -> verdict, the right key)
    "gqa": lambda: (lambda p: lesson00.check_gqa_prediction(p, gqa_parameters=100,
                                                            mha_parameters=110), "10%"),
    "doubling": lambda: (lambda p: lesson01.check_doubling_prediction(p, seconds=1.0,
                                                                      doubled_seconds=3.0),
                         "2x-4x"),
    "cache-vs-weights": lambda: (
        lambda p: lesson02.check_cache_vs_weights_prediction(p, weight_bytes=10**6,
                                                             cache_bytes_per_token=1000.0),
        1000),
    "crop": lambda: (lesson03.check_crop_prediction, lesson03.crop_experiment()["outcome"]),
    "no-warmup": lambda: (lesson04.check_no_warmup_prediction, lesson04.no_warmup_run()["outcome"]),
    "counters": lambda: (lesson05.check_counters_prediction,
                         live_key(lesson05.check_counters_prediction, lesson05.COUNTER_CHOICES)),
    "fastest": lambda: ((lambda p: lesson06.check_fastest_prediction(p, SWEEP)), "graph-safe"),
    "tile": tile_case,
    "verify": lambda: (lesson07.check_verify_prediction,
                       live_key(lesson07.check_verify_prediction, lesson07.VERIFY_CHOICES)),
}


def spellings(key):
    if isinstance(key, str):
        return [key, [key], (key,), f" {key} ", key.upper(), key.lower(), f"'{key}'", f'"{key}"\n',
                key.replace("-", " - ")]
    return [key, [key], str(key), f"{key:,}", f" {key} ", f"{key:.0e}", float(key), np.int64(key),
            np.float64(key), torch.tensor(key), torch.tensor([key]), torch.tensor(float(key))]


@pytest.mark.parametrize("name", CASES)
def test_every_spelling_of_the_right_answer_is_right_and_others_are_refused_clearly(
        name, monkeypatch):
    monkeypatch.delenv(common.SOLUTIONS_ENV, raising=False)
    check, right = CASES[name]()
    for spelled in spellings(right):
        verdict = check(spelled)
        assert verdict.startswith("correct"), (spelled, verdict)
    for odd in (["B", "C"], [right, right], {}, {"a": 1}, [[right]], "", "nope", float("nan"),
                object(), b"x"):
        verdict = check(odd)
        assert verdict.startswith("not quite") and "one of" in verdict, (odd, verdict)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), 0, 0.0, -1.0,
                                 torch.tensor(float("nan")), np.float64("nan"), "fast", None,
                                 [1.0, 2.0]])
def test_a_measurement_that_cannot_decide_is_not_checked(bad):
    verdicts = [
        lesson01.check_doubling_prediction("2x-4x", seconds=bad, doubled_seconds=3.0),
        lesson01.check_doubling_prediction("2x", seconds=1.0, doubled_seconds=bad),
        lesson00.check_gqa_prediction("10%", gqa_parameters=bad, mha_parameters=110),
        lesson00.check_gqa_prediction("10%", gqa_parameters=100, mha_parameters=bad),
        lesson02.check_cache_vs_weights_prediction(1000, weight_bytes=bad,
                                                   cache_bytes_per_token=1000.0),
        lesson02.check_cache_vs_weights_prediction(1000, weight_bytes=10**6,
                                                   cache_bytes_per_token=bad),
        lesson06.check_fastest_prediction("graph-safe", {"results": [
            {**SWEEP["results"][0], "tokens_per_s": bad}, SWEEP["results"][1]]}),
    ]
    for verdict in verdicts:
        assert verdict.startswith("not checked: the measurement") and "again" in verdict, verdict


def test_a_broken_tile_record_is_not_checked(monkeypatch):
    monkeypatch.setattr(bench, "tile_sweep", lambda record: {
        "down proj": {64: {"path": "tile", "gemv": math.nan, "torch": 2.0, "tile": 1.0}}})
    verdict = lesson06.check_tile_prediction("tile", {"sweeps": []}, projection="down", rows=64)
    assert (verdict.startswith("not checked: the measurement gemv µs is nan")
            and "record it again" in verdict)


def test_measurements_given_as_tensors_and_numpy_scalars_are_read():
    verdict = lesson01.check_doubling_prediction("2x-4x", seconds=torch.tensor(1.0),
                                                 doubled_seconds=np.float64(3))
    assert verdict.startswith("correct") and "x3.00" in verdict
    assert lesson00.check_gqa_prediction("10%", gqa_parameters=np.int64(100),
                                         mha_parameters=torch.tensor(110)).startswith("correct")


# ---- the number checkers: every spelling of a number is read at the door (common.real_number) ---


def number_cases():
    from kvlab.lab.models import tiny_model
    from kvlab.sizes import kv_cache_bytes

    config = tiny_model("tiny-llama").config
    record = {"eager_ms_per_token": 3.0, "replay_ms_per_token": 0.5,
              "work_per_step": {"eager": {"kernel_launch_calls": 1000},
                                "replay": {"kernel_launch_calls": 0}}}
    return {  # name -> (check(answer) -> verdict, the right number)
        "cache bytes": (
            lambda a: lesson02.check_cache_bytes(a, config=config, tokens=10, dtype=torch.float32),
            kv_cache_bytes(config, 10, torch.float32)),
        "cached positions": (
            lambda a: lesson02.check_cached_positions(a, prompt_len=9, new_tokens=6), 14),
        "static cache bytes": (lambda a: lesson03.check_static_cache_bytes(
            a, config=config, max_cache_len=64, dtype=torch.float32),
            kv_cache_bytes(config, 64, torch.float32)),
        "launch cost": (lambda a: lesson05.check_launch_cost_us(a, record=record), 2.5),
        "padding rows": (lesson06.check_padding_rows, 3),
        "blocks held": (lesson07.check_blocks_held, 13),
        "check_number": (lambda a: common.check_number(a, 5120, what="x", hint="h"), 5120),
    }


def number_spellings(value):
    spelled = [value, float(value), [value], (value,), str(value), f" {value} ", f"'{value}'",
               f"{value:,}", [str(value)], np.float64(value), torch.tensor(value),
               torch.tensor([float(value)]),
               np.array([value])]
    if float(value) == int(value):
        spelled += [f"{int(value):_}", f"{float(value):e}", np.int64(value), f"{int(value):,}.0"]
    return spelled


def test_every_number_checker_reads_every_spelling_of_a_number_and_says_what_form_to_give():
    for name, (check, right) in number_cases().items():
        for spelled in number_spellings(right):
            verdict = check(spelled)
            assert verdict.startswith("correct"), (name, spelled, verdict)
        for odd in ("1,5", "5 120", "13 apples", "", [right, right], [[right]], {"a": right}, b"5",
                    "nan", "inf", float("nan"), -float("inf"), True, 1 + 0j, object()):
            verdict = check(odd)
            assert verdict.startswith("not quite:") and "a number" in verdict, (name, odd, verdict)
            if not isinstance(odd, float | str) or odd in ("1,5", "5 120", "13 apples", ""):
                says = "give one number, e.g. 5120" in verdict or "one value" in verdict
                assert says, (name, odd, verdict)


def test_a_measurement_spelled_as_text_or_a_list_of_one_is_read():
    verdict = lesson02.check_cache_vs_weights_prediction("1,000", weight_bytes="1,000,000",
                                                         cache_bytes_per_token=[1000])
    assert verdict.startswith("correct"), verdict
    verdict = lesson01.check_doubling_prediction(["2x-4x"], seconds="1.0", doubled_seconds=(3,))
    assert verdict.startswith("correct"), verdict


def test_checker_settings_given_as_numpy_or_0d_tensor_integers_are_read():
    from kvlab.lab.models import tiny_model

    config = tiny_model("tiny-llama").config
    for n in (np.int64(16), torch.tensor(16), np.array(16)):
        assert lesson07.check_blocks_held(13, block_size=n).startswith("correct"), n
        verdict = lesson02.check_cached_positions(14, prompt_len=np.int64(9), new_tokens=n - 10)
        assert verdict.startswith("correct"), verdict
        verdict = lesson02.check_cache_bytes(1, config=config, tokens=n, dtype=torch.float32)
        assert "x 16 tokens" in verdict, verdict
    flops = lesson01.check_step_flops.solution
    assert lesson01.check_step_flops(flops, length=np.int64(100)).startswith("correct")
    verdict = lesson05.check_counters_prediction("x", prompt_len=np.int64(21),
                                                 bucket=torch.tensor(32))
    assert verdict.startswith("not quite") and "21-token prompt padded to 32" in verdict, verdict
    assert common.plain_setting(torch.tensor([[5]])).shape == (1, 1)  # prompt ids stay a tensor
    assert type(common.plain_setting(np.float64(0.5))) is np.float64  # floats stay as given

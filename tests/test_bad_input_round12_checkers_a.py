"""Issue 48, probe round 12 (checkers, part a): settings under which a checker cannot tell a wrong
answer from a right one, so a WRONG answer was called right. Each is now refused at the checker's
door (or the benchmark's), with a message that names the settings."""

import pytest
import torch

from kvlab.decoding import greedy
from kvlab.exercises import lesson04, lesson05
from kvlab.graphs import capture
from kvlab.lab import bench


def _no_refill(model, cache, first_ids, prompt_len, n):
    """Captures once and replays, but never refills the token nor advances the position."""
    sid = first_ids.clone()
    spos = torch.full_like(first_ids, prompt_len)
    g = capture(lambda i, p: greedy(model(i, cache=cache, position_ids=p).logits), sid, spos,
                warmup=0)
    return torch.cat([first_ids] + [g.replay().clone() for _ in range(1, n)], 1)


def test_graph_decode_needs_two_replays_to_see_a_missing_refill():
    """check_graph_decode(no_refill, n=2) said "correct": one replay reads the buffers exactly as
    capture left them, so a loop that never refills or advances them cannot fail."""
    with pytest.raises(ValueError, match=r"\bn\b.*3"):
        lesson04.check_graph_decode(_no_refill, n=2)
    assert lesson04.check_graph_decode(_no_refill, n=3).startswith("not quite")


def _subtract(k):
    def fix(cache, valid_len):
        for layer in cache.layers:
            layer.cumulative_length.sub_(k)
    return fix


@pytest.mark.parametrize("prompt_len, warmup", [(31, 1), (30, 2)])
def test_put_back_refuses_settings_where_padding_equals_warmup(prompt_len, warmup):
    """check_put_back(sub_(warmup), warmup=1, prompt_len=31) said "correct: both scenarios fixed
    (32 -> 31), (32 -> 31)": when the padding (bucket_len(prompt_len) - prompt_len) equals the
    warm-up, both scenarios move the counters by the same amount, so "subtract the warm-up" looks
    like "fill to valid_len"."""
    with pytest.raises(ValueError, match=rf"prompt_len={prompt_len}.*warmup={warmup}"):
        lesson04.check_put_back(_subtract(warmup), prompt_len=prompt_len, warmup=warmup)
    # the same mistake under settings that can tell them apart
    assert lesson04.check_put_back(_subtract(warmup), prompt_len=prompt_len,
                                   warmup=warmup + 1).startswith("not quite")


@pytest.mark.parametrize("prompt_len, bucket", [(32, 32), (40, 32)])
def test_counters_prediction_needs_padding(prompt_len, bucket):
    """check_counters_prediction("A", prompt_len=32, bucket=32, steps=0) said "correct": with no
    padding all four choices describe the same counters."""
    with pytest.raises(ValueError, match=r"padding.*prompt_len < bucket"):
        lesson05.check_counters_prediction("A", prompt_len=prompt_len, bucket=bucket, steps=0)


def test_bench_check_tokens_one_is_refused(capsys):
    """--check-tokens 1 recorded exact=True, though one token is only the prefill's argmax: no
    decode step through a cache was checked."""
    with pytest.raises(SystemExit) as exit_:
        bench.parse_args(["--check-tokens", "1"])
    assert exit_.value.code == 2 and "--check-tokens" in capsys.readouterr().err
    assert bench.parse_args(["--check-tokens", "0"]).check_tokens == 0
    assert bench.parse_args(["--check-tokens", "2"]).check_tokens == 2
    with pytest.raises(bench.BenchArgumentError, match=r"check_tokens.*0.*>= 2"):
        bench.run_bench("tiny-llama", prompt_len=4, new_tokens=3, check_tokens=1, progress=False)

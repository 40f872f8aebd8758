"""kvlab.measure.time_interleaved and time_decodes: turns, warm-up, medians, bad input."""

import time

import pytest
import torch

from kvlab.measure import TimingError, time_decodes, time_interleaved


def test_order_warmup_and_medians():
    calls = []
    out = time_interleaved({"a": lambda: calls.append("a"), "b": lambda: (calls.append("b"), time.sleep(0.02))}, rounds=3)
    assert calls == ["a", "b"] * 4  # one warm-up call each, then 3 rounds taking turns
    assert set(out) == {"a", "b"}
    assert out["b"] >= 0.02 > out["a"]


@pytest.mark.parametrize("fns, rounds", [({}, 3), ({"a": lambda: None}, 0)])
def test_bad_arguments(fns, rounds):
    with pytest.raises(ValueError):
        time_interleaved(fns, rounds=rounds)


def fake_decode(name, calls, per_token_s):
    def run(n, on_token):
        calls.append((name, n))
        time.sleep(0.005 + per_token_s * n)  # a prefill, then n tokens
        return torch.zeros(1, n, dtype=torch.long)
    return run


def test_time_decodes_takes_turns_path_after_path():
    calls = []
    timed = time_decodes({"a": fake_decode("a", calls, 0.001), "b": fake_decode("b", calls, 0.004)}, 6, "cpu",
                         repeats=2)
    # the warm-ups (full length), the untimed one-token calls, then per round each path's T(1) and T(6) in turns
    assert calls == [("a", 6), ("b", 6), ("a", 1), ("b", 1)] + [("a", 1), ("a", 6), ("b", 1), ("b", 6)] * 2
    assert list(timed) == ["a", "b"] and timed["a"].label == "a" and timed["b"].new_tokens == 6
    assert timed["b"].ms_per_token > timed["a"].ms_per_token > 0


def test_time_decodes_refuses_what_means_nothing():
    with pytest.raises(ValueError, match="at least one run"):
        time_decodes({}, 6, "cpu")
    with pytest.raises(TimingError, match="not above T\\(1\\)"):
        time_decodes({"backwards": fake_decode("backwards", [], -0.002)}, 2, "cpu", repeats=1)  # T(2) < T(1)

"""kvlab.lab.measure.time_interleaved and time_decodes: turns, warm-up, medians, bad input."""

import gc
import time

import pytest
import torch

from kvlab.lab.measure import TimingError, time_decodes, time_interleaved


def test_order_warmup_and_medians():
    calls = []
    out = time_interleaved({"a": lambda: calls.append("a"),
                            "b": lambda: (calls.append("b"), time.sleep(0.02)),
                            "c": lambda: calls.append("c")}, rounds=4)
    # one warm-up call each, then 4 rounds taking turns, each round starting one function later
    assert calls == list("abc") + list("abc") + list("bca") + list("cab") + list("abc")
    assert set(out) == {"a", "b", "c"}
    assert out["b"] >= 0.02 > max(out["a"], out["c"])


def test_collector_paused_only_while_timing():
    seen = []
    time_interleaved({"a": lambda: seen.append(gc.isenabled())}, rounds=2)
    # the warm-up runs as usual; the timed rounds do not collect
    assert seen == [True, False, False] and gc.isenabled()
    gc.disable()
    try:
        time_interleaved({"a": lambda: None}, rounds=1)
        assert not gc.isenabled()  # a collector the caller paused stays paused
    finally:
        gc.enable()


@pytest.mark.parametrize("fns, rounds", [({}, 3), ({"a": lambda: None}, 0)])
def test_bad_arguments(fns, rounds):
    with pytest.raises(ValueError):
        time_interleaved(fns, rounds=rounds)


def fake_decode(name, calls, per_token_s, prefill_s=0.005):
    def run(n, on_token):
        calls.append((name, n))
        time.sleep(prefill_s + per_token_s * n)  # a prefill, then n tokens
        return torch.zeros(1, n, dtype=torch.long)
    return run


def test_time_decodes_takes_turns_path_after_path():
    calls = []
    timed = time_decodes({"a": fake_decode("a", calls, 0.001), "b": fake_decode("b", calls, 0.004)},
                         6, "cpu",
                         repeats=2)
    # the warm-ups (full length), the untimed one-token calls, then per round each path's T(1) and
    # T(6) in turns
    assert calls == [("a", 6), ("b", 6), ("a", 1), ("b", 1)] + [("a", 1), ("a", 6), ("b", 1),
                                                                ("b", 6)] * 2
    assert list(timed) == ["a", "b"] and timed["a"].label == "a" and timed["b"].new_tokens == 6
    assert timed["b"].ms_per_token > timed["a"].ms_per_token > 0


def test_time_decodes_refuses_what_means_nothing():
    with pytest.raises(ValueError, match="at least one run"):
        time_decodes({}, 6, "cpu")
    with pytest.raises(TimingError, match="not above T\\(1\\)"):
        # T(1) = 30 ms, T(2) = 10 ms: margins a loaded host's sleeps cannot cross (2 ms did, on the
        # H200 with 14 workers)
        time_decodes({"backwards": fake_decode("backwards", [], -0.02, prefill_s=0.05)}, 2, "cpu",
                     repeats=1)


def test_garbage_is_collected_between_calls_only_when_asked(monkeypatch):
    collected = []
    monkeypatch.setattr(gc, "collect", lambda *a: collected.append(gc.isenabled()) or 0)
    time_interleaved({"a": lambda: None, "b": lambda: None}, rounds=3)
    assert collected == []  # by default nothing runs between the timed calls
    time_interleaved({"a": lambda: None, "b": lambda: None}, rounds=3, collect_garbage=True)
    # once after each timed call, the automatic collector still paused
    assert collected == [False] * 6

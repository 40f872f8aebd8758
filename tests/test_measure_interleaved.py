"""kvlab.measure.time_interleaved: turns, warm-up, medians, bad input."""

import time

import pytest

from kvlab.measure import time_interleaved


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

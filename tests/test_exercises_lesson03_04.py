"""Exercise checkers of lessons 03 and 04: right answers pass, wrong ones get a hint, None is 'not answered'."""

import torch

from kvlab.exercises import lesson03, lesson04
from kvlab.models import tiny_model


def test_static_cache_bytes():
    config = tiny_model("tiny-llama").config
    right = 2 * 2 * 2 * 16 * 100 * 4  # K+V x layers x kv_heads x head_dim x slots x fp32
    assert lesson03.check_static_cache_bytes(right, config=config, max_cache_len=100, dtype=torch.float32).startswith("correct")
    assert lesson03.check_static_cache_bytes(right // 2, config=config, max_cache_len=100, dtype=torch.float32).startswith("not quite")
    assert "not answered" in lesson03.check_static_cache_bytes(None, config=config, max_cache_len=100, dtype=torch.float32)


def test_counter_after():
    assert lesson03.counter_after(12, 5) == 17
    assert lesson03.check_counter_after(17).startswith("correct")
    assert "Hint" in lesson03.check_counter_after(12)
    assert "not answered" in lesson03.check_counter_after(None)


def test_counter_at_first_replay():
    assert lesson04.counter_at_first_replay(20, 3) == 23
    assert lesson04.check_counter_at_first_replay(23).startswith("correct")
    assert lesson04.check_counter_at_first_replay(24).startswith("not quite")  # capture itself runs nothing
    assert "not answered" in lesson04.check_counter_at_first_replay(None)


def test_first_decode_slot():
    assert lesson04.check_first_decode_slot(64).startswith("correct")
    assert lesson04.check_first_decode_slot(37).startswith("not quite")


def test_eager_would_be_right():
    right = {"cache-recreated", "reset-rebinds-counter", "frozen-position"}
    assert lesson04.check_eager_would_be_right(right).startswith("correct")
    assert "missing" in lesson04.check_eager_would_be_right(right - {"frozen-position"})
    assert "not scenario names" in lesson04.check_eager_would_be_right({"nope"})
    assert "set of scenario names" in lesson04.check_eager_would_be_right("cache-recreated")
    assert "not answered" in lesson04.check_eager_would_be_right(None)


def test_a_dict_or_nested_list_is_not_a_set_of_names():
    from kvlab.exercises import lesson04
    from kvlab.failures import SCENARIOS

    frozen = {n for n, s in SCENARIOS.items() if s["frozen"]}
    assert lesson04.check_eager_would_be_right(frozen).startswith("correct")
    assert lesson04.check_eager_would_be_right({n: False for n in frozen}).startswith("not quite")
    assert lesson04.check_eager_would_be_right([["cache-recreated"]]).startswith("not quite")

"""Exercise checkers of lessons 01 and 02: None, right, wrong and ill-typed answers."""

import numpy as np
import pytest
import torch
from transformers import LlamaConfig

from kvlab.exercises import lesson01, lesson02
from kvlab.exercises.common import NOT_ANSWERED, check_number
from kvlab.sizes import forward_flops


def cfg():
    return LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                       num_attention_heads=4, num_key_value_heads=2)


def test_check_number_verdicts():
    assert check_number(None, 5, what="x", hint="h") == NOT_ANSWERED
    assert check_number(5, 5, what="x", hint="h").startswith("correct")
    assert check_number(np.int64(5), 5, what="x", hint="h").startswith("correct")
    assert check_number(torch.tensor(5), 5, what="x", hint="h").startswith("correct")
    wrong = check_number(6, 5, what="x", hint="think again")
    assert wrong.startswith("not quite") and "20.0% off" in wrong and "think again" in wrong
    assert check_number("5", 5, what="x", hint="h").startswith("not quite")
    assert check_number(True, 1, what="x", hint="h").startswith("not quite")
    assert check_number(104, 100, what="x", hint="h", rel_tol=0.05).startswith("correct")
    assert check_number(1, 0, what="x", hint="h").startswith("not quite")


def test_positions():
    # p=10, n=4: 10 + 11 + 12 + 13
    assert lesson01.naive_positions(10, 4) == 46
    assert lesson01.check_positions(46, prompt_len=10, new_tokens=4).startswith("correct")
    assert lesson01.check_positions(40, prompt_len=10, new_tokens=4).startswith("not quite")
    assert lesson01.check_positions(None, prompt_len=10, new_tokens=4) == NOT_ANSWERED


def test_step_flops():
    right = forward_flops(cfg(), 50)
    assert lesson01.check_step_flops(right, config=cfg(), length=50).startswith("correct")
    assert lesson01.check_step_flops(right * 1.005, config=cfg(), length=50).startswith("correct")
    # forgetting the lm_head is a real mistake and must be caught
    no_head = right - 50 * 2 * 64 * 1000
    assert lesson01.check_step_flops(no_head, config=cfg(), length=50).startswith("not quite")
    assert lesson01.check_step_flops(None, config=cfg(), length=50) == NOT_ANSWERED


def test_cache_bytes():
    # 2 x 3 layers x 2 kv heads x 16 dims x 2 bytes = 384 bytes per token
    assert lesson02.check_cache_bytes(384 * 100, config=cfg(), tokens=100, dtype=torch.float16).startswith("correct")
    assert lesson02.check_cache_bytes(384 * 200, config=cfg(), tokens=100, dtype=torch.float16, batch=2).startswith("correct")
    # counting query heads instead of kv heads: 2x too much
    assert lesson02.check_cache_bytes(768 * 100, config=cfg(), tokens=100, dtype=torch.float16).startswith("not quite")
    assert lesson02.check_cache_bytes(None, config=cfg(), tokens=100, dtype=torch.float16) == NOT_ANSWERED


def test_cat_bytes():
    # p=10, n=3: the cache holds 10, 11, 12 tokens after each step -> 33 tokens copied, 384 bytes each in fp16
    assert lesson02.check_cat_bytes(33 * 384, config=cfg(), prompt_len=10, new_tokens=3, dtype=torch.float16).startswith("correct")
    assert lesson02.check_cat_bytes(12 * 384, config=cfg(), prompt_len=10, new_tokens=3, dtype=torch.float16).startswith("not quite")
    assert lesson02.check_cat_bytes(None, config=cfg(), prompt_len=10, new_tokens=3, dtype=torch.float16) == NOT_ANSWERED


def test_cached_positions():
    assert lesson02.check_cached_positions(12, prompt_len=10, new_tokens=3).startswith("correct")
    assert lesson02.check_cached_positions(13, prompt_len=10, new_tokens=3).startswith("not quite")
    assert lesson02.check_cached_positions(None, prompt_len=10, new_tokens=3) == NOT_ANSWERED


@pytest.mark.parametrize("bad", ["12", [12], {"a": 1}])
def test_ill_typed_answers_get_a_verdict_not_an_exception(bad):
    assert lesson02.check_cached_positions(bad, prompt_len=10, new_tokens=3).startswith("not quite")

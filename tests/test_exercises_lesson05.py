"""Exercise checkers of lesson 05: None, right and wrong answers."""

import torch

from kvlab.exercises import lesson05
from kvlab.exercises.common import NOT_ANSWERED


def test_counters_after_padded_prefill():
    assert lesson05.padded_prefill_counters(21, 32) == (32, 21)
    assert lesson05.check_counters_after_padded_prefill(None) == NOT_ANSWERED
    assert lesson05.check_counters_after_padded_prefill((32, 21)).startswith("correct")
    assert lesson05.check_counters_after_padded_prefill((21, 21)).startswith("not quite")
    assert lesson05.check_counters_after_padded_prefill((32, 32)).startswith("not quite")
    assert lesson05.check_counters_after_padded_prefill(32).startswith("not quite")
    assert lesson05.check_counters_after_padded_prefill((16, 5), prompt_len=5, bucket=16).startswith("correct")


def test_seed_reset_slot():
    assert lesson05.seed_reset_next_slot(64) == 64
    assert lesson05.check_seed_reset_slot(None) == NOT_ANSWERED
    assert "out of range" in lesson05.check_seed_reset_slot(64)
    assert lesson05.check_seed_reset_slot(63).startswith("not quite")
    assert lesson05.check_seed_reset_slot(0).startswith("not quite")
    assert lesson05.check_seed_reset_slot(16, max_cache_len=16).startswith("correct")


def right_positions(counter, valid, bucket, max_cache_len):
    rows = torch.arange(bucket)
    keep = (rows < valid) & (counter + rows < max_cache_len)
    return torch.where(keep, counter + rows, max_cache_len)


def test_write_positions():
    assert lesson05.check_write_positions(None) == NOT_ANSWERED
    assert lesson05.check_write_positions(right_positions).startswith("correct")
    no_trash = lambda c, v, b, m: torch.arange(b) + c  # noqa: E731  (writes the padding, like vanilla)
    assert lesson05.check_write_positions(no_trash).startswith("not quite")
    no_end_check = lambda c, v, b, m: torch.where(torch.arange(b) < v, torch.arange(b) + c, m)  # noqa: E731
    assert "(14, 4, 4, 16)" in lesson05.check_write_positions(no_end_check)
    assert "raised ZeroDivisionError" in lesson05.check_write_positions(lambda *a: 1 / 0)


def test_launch_cost():
    record = {"eager_ms_per_token": 3.0, "replay_ms_per_token": 0.5,
              "work_per_step": {"eager": {"kernel_launch_calls": 1001}, "replay": {"kernel_launch_calls": 1}}}
    assert abs(lesson05.launch_cost_us(record) - 2.5) < 1e-9
    assert lesson05.check_launch_cost_us(None, record=record) == NOT_ANSWERED
    assert lesson05.check_launch_cost_us(2.5, record=record).startswith("correct")
    assert lesson05.check_launch_cost_us(2.6, record=record).startswith("correct")  # within 10 %
    assert lesson05.check_launch_cost_us(3.0, record=record).startswith("not quite")  # eager time / launches


def test_truncated_or_mistyped_answers_are_not_correct():
    from kvlab.exercises import lesson05

    right = lesson05.padded_prefill_counters(21, 32)
    assert lesson05.check_counters_after_padded_prefill(right).startswith("correct")
    for wrong in [(right[0] + 0.9, right[1] + 0.7), tuple(str(x) for x in right), ("a", 21), (None, 21), ([32], [21])]:
        assert lesson05.check_counters_after_padded_prefill(wrong).startswith("not quite"), wrong
    assert lesson05.check_write_positions(lambda *case: right_positions(*case).double() + 0.7).startswith("not quite")
    assert lesson05.check_write_positions(lambda *case: right_positions(*case).to("meta")).startswith("not quite")
    cpu_like = {"eager_ms_per_token": 2.0, "replay_ms_per_token": 1.0,
                "work_per_step": {"eager": {"aten_ops": 10}, "replay": {"aten_ops": 10}}}
    assert "GPU result" in lesson05.check_launch_cost_us(1.0, record=cpu_like)

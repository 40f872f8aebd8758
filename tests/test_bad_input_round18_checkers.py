"""Round 18 of the hostile-user probe, exercise checkers: a tolerance wide enough to call a named
mistake right, right answers refused (a rounded rate, a loop that reuses its inputs as buffers,
inputs captured in another order, clear spellings of a choice) and a Python position counter
called graph-safe."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kvlab.exercises import lesson05, lesson06

LESSON05_GPU = Path(__file__).resolve().parents[1] / "data" / "lesson05_gpu.json"


def _launch_records() -> dict:
    return {k: v for k, v in json.loads(LESSON05_GPU.read_text()).items()
            if isinstance(v, dict) and "eager_ms_per_token" in v}


@pytest.mark.parametrize("name", sorted(_launch_records()))
def test_launch_cost_whole_step_mistake_is_refused(name):
    """check_launch_cost_us's 10% tolerance called the named mistake "whole eager step over its
    launches" right (9.6% off on the float32 record)."""
    record = _launch_records()[name]
    launches = record["work_per_step"]["eager"]["kernel_launch_calls"]
    whole_step = 1e3 * record["eager_ms_per_token"] / launches
    verdict = lesson05.check_launch_cost_us(whole_step, record=record)
    assert verdict.startswith("not quite"), verdict
    assert "whole eager step over its launches" in verdict
    right = lesson05.launch_cost_us(record)
    # an answer nearer the right value than the mistake, within the tolerance, is still right
    between = right + 0.4 * (whole_step - right)
    assert lesson05.check_launch_cost_us(between, record=record).startswith("correct")
    assert lesson05.check_launch_cost_us(right * 0.97, record=record).startswith("correct")


def test_rate_rounded_to_its_digits_is_right():
    """check_tokens_per_s refused a rate rounded to 0.1 ("you gave 1,660.5, the rule gives
    1,660.47"): an answer equal to the right one at the precision it is given in is right."""
    def rounded(t1, tn, n, batch):
        return round(lesson06.tokens_per_s_solution(t1, tn, n, batch), 1)

    def two_digits(t1, tn, n, batch):  # fewer than 3 significant digits: too coarse
        rate = lesson06.tokens_per_s_solution(t1, tn, n, batch)
        return float(f"{rate:.2g}")

    assert lesson06.check_tokens_per_s(rounded).startswith("correct")
    assert lesson06.check_tokens_per_s(two_digits).startswith("not quite")


def test_rounded_answer_nearer_a_mistake_is_the_mistake():
    """The precision rule (a rounded answer is right) never calls right an answer at least as near a
    named mistake as the right value."""
    from kvlab.exercises.common import check_number

    assert check_number(100.4, 100.0, what="x", hint="h").startswith("not quite")
    assert check_number(100.0, 100.04, what="x", hint="h").startswith("correct")
    verdict = check_number(100.0, 100.04, what="x", hint="h", mistakes=[(100.02, "the slip")])
    assert verdict.startswith("not quite") and "the slip" in verdict

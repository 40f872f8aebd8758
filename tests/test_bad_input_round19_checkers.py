"""Round 19 of the hostile-user probe, exercise checkers: named mistakes a float rounding away from
the right value refused right answers; checkers that tested batch 1 only, or rows whose minimum sat
at one row, called wrong code right; hints that blamed the wrong part."""

from __future__ import annotations

import math
import statistics
from fractions import Fraction

import numpy as np
import pytest
import torch

from kvlab.exercises import common, lesson06

MEDIAN = statistics.median


# ---- 1 · a mistake within float rounding of the right value is no mistake -----------------------

@pytest.mark.parametrize("rate", [
    lambda t1, tn, n, b: b * (n - 1) / (MEDIAN(tn) - MEDIAN(t1)),
    lambda t1, tn, n, b: b / ((MEDIAN(tn) - MEDIAN(t1)) / (n - 1)),
    lambda t1, tn, n, b: round(b * (n - 1) / (MEDIAN(tn) - MEDIAN(t1))),
    lambda t1, tn, n, b: b * (n - 1) / float(np.median(tn) - np.median(t1)),
    lambda t1, tn, n, b: b * (n - 1) / float(
        torch.tensor(tn, dtype=torch.float64).quantile(.5)
        - torch.tensor(t1, dtype=torch.float64).quantile(.5)),
    lambda t1, tn, n, b: torch.tensor(b * (n - 1) / (MEDIAN(tn) - MEDIAN(t1))),
    lambda t1, tn, n, b: np.float32(b * (n - 1) / (MEDIAN(tn) - MEDIAN(t1))),
    lambda t1, tn, n, b: Fraction(b * (n - 1) / (MEDIAN(tn) - MEDIAN(t1))),
], ids=["formula", "per-step", "int", "numpy", "quantile", "tensor", "float32", "Fraction"])
def test_tokens_per_s_right_forms_are_right(rate):
    """check_tokens_per_s refused the plain formula: named variants equal to the right value in a
    case landed 1 ulp from it and were taken for mistakes; a rounded rate fell nearer a variant."""
    assert lesson06.check_tokens_per_s(rate).startswith("correct"), lesson06.check_tokens_per_s(
        rate)


def test_tokens_per_s_cases_tell_rounded_answers_apart():
    """A rate rounded to a whole number was nearer the paired-repeats variant than the right value:
    every wrong variant must lie over 1% from the right value, or be it up to float rounding."""
    for case in lesson06.RATE_CASES:
        t1, tn = lesson06.timing_case(*case)
        right = lesson06.tokens_per_s_solution(t1, tn, *case[:2])
        for value in lesson06._rate_variants(t1, tn, *case[:2]).values():
            assert common.within_noise(value, right) or abs(value - right) > 0.01 * right


def test_a_mistake_a_rounding_away_is_skipped():
    """nearest_mistake skipped a mistake only when equal to the right value: one a float rounding
    away refused the right answer (and an answer a rounding from the right one)."""
    right = 1660.4741332876622
    below = math.nextafter(right, 0)
    mistakes = [(below, "paired"), (1500.0, "far")]
    assert common.is_right(right, right, mistakes=mistakes)
    assert common.is_right(math.nextafter(right, math.inf), right, mistakes=mistakes)
    assert common.nearest_mistake(1500.0, right, mistakes) == "far"
    # counts stay exact
    assert not common.is_right(10**10 + 1, 10**10)

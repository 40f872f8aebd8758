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


# ---- 2 · kept drafts: the fewest at every row position -----------------------------------------

def _prefix(rows, verified):
    return (rows[:, 1:] == verified[:, :-1]).long().cumprod(-1).sum(-1)


@pytest.mark.parametrize("rows_read", [
    slice(1, None), slice(None, -1), slice(None, 2), slice(1, None, 2), slice(None, None, 2)],
    ids=["[1:]", "[:-1]", "[:2]", "[1::2]", "[::2]"])
def test_kept_drafts_that_skips_rows_is_refused(rows_read):
    """check_kept_drafts called right a count over a fixed subset of rows (pre[1:].min()): in every
    case of batch > 1 the fewest sat at row 1 or was a tie. Refused, it is told so (not a hint of
    a mistake whose count coincides)."""
    from kvlab.exercises import lesson07

    def some_rows(rows, verified):
        pre = _prefix(rows, verified)
        return pre[rows_read].min() if rows.shape[0] > 1 else pre.min()

    verdict = lesson07.check_kept_drafts(some_rows)
    assert verdict.startswith("not quite") and "reads some rows only" in verdict, verdict


def test_kept_cases_put_the_fewest_at_first_middle_and_last_row():
    """The cases' minima sat at row 1 or tied; each position alone must be the fewest somewhere."""
    from kvlab.exercises import lesson07

    where = set()
    for _, rows, verified in lesson07.kept_cases():
        pre = _prefix(rows, verified)
        at = (pre == pre.min()).nonzero().flatten().tolist()
        if rows.shape[0] > 2 and len(at) == 1:
            where.add("first" if at[0] == 0 else "last" if at[0] == rows.shape[0] - 1 else "middle")
    assert where == {"first", "middle", "last"}

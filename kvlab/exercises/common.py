"""The verdict every exercise checker returns: "not answered yet", "correct: ..." or "not quite: ... Hint: ..."."""

from __future__ import annotations

import numbers

NOT_ANSWERED = "not answered yet: replace `answer = None` with your number and run the cell again"


def check_number(answer, expected: float, *, what: str, hint: str, rel_tol: float = 0.0) -> str:
    """Compare a numeric ``answer`` with ``expected`` (exactly, or within ``rel_tol``); return the verdict."""
    if answer is None:
        return NOT_ANSWERED
    if hasattr(answer, "item") and getattr(answer, "ndim", 0) == 0:  # a 0-dim tensor or numpy scalar
        answer = answer.item()
    if isinstance(answer, bool) or not isinstance(answer, numbers.Real):
        return f"not quite: {what} is a number, but you gave a {type(answer).__name__} ({answer!r})"
    error = abs(answer - expected)
    if error <= rel_tol * abs(expected) or error == 0:
        return f"correct: {what} = {expected:,}"
    off = f"{error / abs(expected):.1%} off" if expected else f"{error:g} off"
    return f"not quite: you gave {answer:,} for {what}, which is {off}. Hint: {hint}"

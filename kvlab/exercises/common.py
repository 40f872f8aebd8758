"""The verdict every exercise checker returns: "not answered yet", "correct: ..." or "not quite: ... Hint: ..."."""

from __future__ import annotations

import functools
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


def checker(fn):
    """Make ``fn`` a checker that always returns a verdict: ``None`` as the answer is "not answered yet", and an
    answer the comparison cannot even handle (a wrong type, a tensor on another device, ...) gets "not quite" with
    what went wrong, never a traceback."""
    @functools.wraps(fn)
    def check(answer=None, *args, **kwargs) -> str:
        if answer is None:
            return NOT_ANSWERED
        try:
            return fn(answer, *args, **kwargs)
        except Exception as e:  # the answer's shape or type, or a setting the checker cannot use: say so
            return (f"not quite: this answer could not be checked ({type(e).__name__}: {str(e).splitlines()[0][:200]}). "
                    f"Hint: {(fn.__doc__ or '').strip().splitlines()[0]}")

    return check

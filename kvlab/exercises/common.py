"""The verdict every exercise checker returns: "not answered yet", "correct: ..." or "not quite: ... Hint: ..."."""

from __future__ import annotations

import functools
import inspect
import math
import numbers
import os

NOT_ANSWERED = "not answered yet: replace `answer = None` with your number and run the cell again"


class NotANumber(ValueError):
    """An answer that is not one finite real number; the message says what it is instead."""


def real_number(answer) -> numbers.Real:
    """The one finite real number ``answer`` holds, as a Python int or float (or another ``numbers.Real``): a number,
    a NumPy scalar, or a tensor or array of one element (0-d, ``[1]``, ``[1, 1]``, ...). Raises :class:`NotANumber`
    for anything else (a bool, a complex number, several elements, text, NaN or infinity)."""
    if hasattr(answer, "item") and not isinstance(answer, numbers.Number):  # a tensor, an array, a NumPy scalar
        size = answer.numel() if callable(getattr(answer, "numel", None)) else getattr(answer, "size", None)
        if size != 1:
            shape = tuple(getattr(answer, "shape", ()))
            raise NotANumber(f"a {type(answer).__name__} of shape {shape} ({size} elements), not one number: return "
                             "one value (x.item() of a one-element tensor or array)")
        answer = answer.item()
    elif hasattr(answer, "item") and not isinstance(answer, int | float):  # numpy's float64, int64, bool_, ...
        answer = answer.item()
    if isinstance(answer, bool) or not isinstance(answer, numbers.Real):
        raise NotANumber(f"a {type(answer).__name__} ({answer!r:.80}), not a number")
    if isinstance(answer, float) and not math.isfinite(answer):
        raise NotANumber(f"{answer}, which is not a finite number: a division by zero or an overflow on the way?")
    return answer


def as_number(answer):
    """``real_number(answer)`` where ``answer`` holds one finite real number, else ``answer`` unchanged: what a
    number checker's entry does, so that its own comparisons see a Python number (``check_number`` then refuses the
    rest with what it is)."""
    try:
        return real_number(answer)
    except NotANumber:
        return answer


def check_number(answer, expected: float, *, what: str, hint: str, rel_tol: float = 0.0) -> str:
    """Compare a numeric ``answer`` with ``expected`` (exactly, or within ``rel_tol``); return the verdict. Any one
    real number is accepted (``real_number``: a tensor or array of one element too); NaN and infinity are wrong."""
    if answer is None:
        return NOT_ANSWERED
    try:
        answer = real_number(answer)
    except NotANumber as e:
        return f"not quite: {what} is a number, but you gave {e}"
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


# ---- exercises where the student writes code (issue 14's shape; every lesson uses it) ----------------------------
#
# A code exercise in a notebook is a cell tagged ``exercise`` holding a stub the student replaces:
#
#     def attend(q, keys, values):          # the student's code goes here
#         raise NotImplementedError         # <- "not attempted" until this line is gone
#     print(lesson02.check_attend(attend))  # a verdict, never a traceback
#     # lesson02.check_attend.show_solution()  <- a solution, only on request
#
# With ``KVLAB_SOLUTIONS=1`` in the environment (the test suite sets it), a stub that is still unattempted is
# replaced by the reference solution, so nbmake runs every checker's full path against the reference.


SOLUTIONS_ENV = "KVLAB_SOLUTIONS"
NOT_ATTEMPTED = ("not attempted: replace the `raise NotImplementedError` line with your code and run the cell "
                 "again (the lesson runs on without it)")


class NotAttempted(Exception):
    """The student's code still raises NotImplementedError (or the answer is still None)."""


def solutions_filled_in() -> bool:
    """True where ``KVLAB_SOLUTIONS=1``: unattempted exercises are checked with the reference solution."""
    return os.environ.get(SOLUTIONS_ENV, "") == "1"


def call_student(fn, *args, **kwargs):
    """Call the student's ``fn``; a NotImplementedError becomes NotAttempted, any other error propagates."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedError as e:
        raise NotAttempted from e


def code_checker(solution):
    """Make ``check(student_fn, **settings) -> verdict`` a checker of code written against ``solution``.

    The verdict is "not attempted" while the student's function still raises NotImplementedError (or is None),
    "not quite: your code raised ..." with the error's first line when it fails otherwise, and whatever ``check``
    says when it runs. ``check`` calls the student's code through :func:`call_student`. Under
    ``KVLAB_SOLUTIONS=1`` an unattempted function is replaced by ``solution`` and the verdict says so. The
    checker gets ``.solution`` and ``.show_solution()`` (prints the reference source: on request only).
    """
    def wrap(check):
        @functools.wraps(check)
        def checked(student=None, *args, **kwargs) -> str:
            filled = ""
            if student is None:
                if not solutions_filled_in():
                    return NOT_ATTEMPTED
                student, filled = solution, f"(the reference solution, filled in by {SOLUTIONS_ENV}=1) "
            try:
                return filled + check(student, *args, **kwargs)
            except NotAttempted:
                if not solutions_filled_in() or filled:
                    return NOT_ATTEMPTED
                return f"(the reference solution, filled in by {SOLUTIONS_ENV}=1) " + check(solution, *args, **kwargs)
            except Exception as e:  # the student's code failed: say how, and where to look
                return (f"not quite: your code raised {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}. "
                        f"Hint: {(check.__doc__ or '').strip().splitlines()[0]}")

        checked.solution = solution
        checked.show_solution = lambda: print(inspect.getsource(solution))
        return checked

    return wrap


def choice_of(prediction, choices):
    """The key of ``choices`` that ``prediction`` names, else None. Any reasonable spelling of a key names it: a
    list or tuple of one element, text in any case with spaces or quotes around (``" b "``, ``"'B'"``), a number
    key as text (``"1000"``, ``"1,000"``, ``"1e3"``), a NumPy scalar or a one-element tensor. Never hashes
    ``prediction`` (a list is not an error)."""
    if isinstance(prediction, list | tuple) and len(prediction) == 1:
        prediction = prediction[0]
    numeric = [k for k in choices if isinstance(k, numbers.Real) and not isinstance(k, bool)]
    if isinstance(prediction, str):
        text = prediction.strip().strip("'\"").strip()
        spelled = {"".join(str(k).split()).casefold(): k for k in choices if isinstance(k, str)}
        if "".join(text.split()).casefold() in spelled:
            return spelled["".join(text.split()).casefold()]
        if not numeric:
            return None
        try:
            prediction = float(text.replace(",", "").replace("_", ""))
        except ValueError:
            return None
    try:
        value = real_number(prediction)
    except NotANumber:
        return None
    return next((k for k in numeric if k == value), None)


RUN_AGAIN = "run the cell that measures it again, then this check"


def bad_measurement(measured: dict, fix: str = RUN_AGAIN) -> str | None:
    """The verdict for a measurement of ``measured`` (name -> value) that cannot decide a prediction (NaN,
    infinity, zero or below, not a number), else None: a checker never calls a prediction right against such a
    number. ``fix``: what to do about it."""
    for name, value in measured.items():
        try:
            number = real_number(value)
        except NotANumber as e:
            return f"not checked: the measurement {name} is {e}; {fix}"
        if number <= 0:
            return (f"not checked: the measurement {name} = {number} is not a positive number, so it cannot decide "
                    f"the question; {fix}")
    return None


def check_prediction(prediction, *, measured, choices: dict, what: str) -> str:
    """A "predict, then run" question: ``prediction`` names one key of ``choices`` (key -> what it would mean;
    any spelling :func:`choice_of` reads), ``measured`` the key the run just showed. Under ``KVLAB_SOLUTIONS=1`` a
    missing prediction is filled in."""
    if prediction is None:
        if not solutions_filled_in():
            return "not predicted: write your prediction (one of " + ", ".join(map(repr, choices)) + ") before running"
        prediction = measured
    given, prediction = prediction, choice_of(prediction, choices)
    if prediction is None:
        return f"not quite: {what} is one of {', '.join(map(repr, choices))}, got {given!r:.80}"
    if prediction == measured:
        return f"correct: {what} is {measured!r}: {choices[measured]}"
    return (f"not quite: you predicted {prediction!r} ({choices[prediction]}), but the run shows {measured!r}: "
            f"{choices[measured]}")

"""Name the mistake behind a wrong answer: compare it with what each typical mistake would have
given."""

from __future__ import annotations

import inspect
import numbers

import torch

from .common import NotANumber, real_number


def same(answer, value, *, rtol: float = 0.0, atol: float = 0.0) -> bool:
    """True where ``answer`` equals ``value``: numbers within ``rtol``/``atol``, tensors of one
    shape allclose (NaN equal to NaN; integer tensors exactly), anything else by ``==``."""
    if value is None:
        return False
    if isinstance(value, torch.Tensor):
        if not (isinstance(answer, torch.Tensor) and answer.shape == value.shape):
            return False
        answer = answer.to(value.device, value.dtype)
        if not value.is_floating_point():  # token ids and counts: exactly
            return torch.equal(answer, value)
        return torch.allclose(answer, value, rtol=rtol, atol=atol, equal_nan=True)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        try:
            answer = real_number(answer)  # a tensor or array of one element too
        except NotANumber:
            return False
        try:
            return abs(answer - value) <= atol + rtol * abs(value)
        except OverflowError:  # an int past a float's range against a float: far from it
            return False
    return answer == value


def first_match(answer, mistakes, **tolerance) -> str | None:
    """The hint of the first ``(value, hint)`` of ``mistakes`` whose value ``answer`` equals
    (:func:`same`), else None. A ``value`` of None stands for a mistake that cannot show in this
    case and is skipped."""
    return next((hint for value, hint in mistakes if same(answer, value, **tolerance)), None)


def show_sources(checker, *objects) -> None:
    """Make ``checker.show_solution()`` print the source of all ``objects`` (the reference and the
    package code it calls), on request only, as every solution."""
    checker.show_solution = lambda: print("\n\n".join(inspect.getsource(obj) for obj in objects))

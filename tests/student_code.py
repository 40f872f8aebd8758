"""What the exercise checkers' tests pass for the student's code: an untouched stub, code that
raises, and the verdict an untouched stub gets under KVLAB_SOLUTIONS=1 (tests/conftest.py sets
it)."""

STUDENT_ERROR = "a bug of the student's"
FILLED = "(the reference solution, filled in by KVLAB_SOLUTIONS=1) correct"


def stub(*args):
    raise NotImplementedError


def raises(*args):
    raise ValueError(STUDENT_ERROR)


def assert_unattempted_filled_in_and_raising(check, monkeypatch, unattempted=stub, raising=raises):
    """A code checker's three verdicts on code the student did not write: "not attempted" for an
    untouched stub (or None), the raised error with a hint, and under KVLAB_SOLUTIONS=1 the
    reference checked in the stub's place."""
    from kvlab.exercises.common import NOT_ATTEMPTED

    monkeypatch.delenv("KVLAB_SOLUTIONS", raising=False)
    assert check(unattempted) == NOT_ATTEMPTED
    assert check(None) == NOT_ATTEMPTED
    raised = check(raising)
    assert (raised.startswith("not quite: your code raised ValueError: " + STUDENT_ERROR)
            and "Hint:" in raised)
    monkeypatch.setenv("KVLAB_SOLUTIONS", "1")
    filled = check(unattempted)
    assert filled.startswith(FILLED), filled

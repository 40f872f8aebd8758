"""What the exercise checkers' tests pass for the student's code: an untouched stub, code that raises, and the
verdict an untouched stub gets under KVLAB_SOLUTIONS=1 (tests/conftest.py sets it)."""

STUDENT_ERROR = "a bug of the student's"
FILLED = "(the reference solution, filled in by KVLAB_SOLUTIONS=1) correct"


def stub(*args):
    raise NotImplementedError


def raises(*args):
    raise ValueError(STUDENT_ERROR)

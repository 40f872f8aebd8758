"""Issue 48, probe round 13: a generate stopped by its on_token (or an interrupt) left the counter
after tokens the caller never got, and decode_steps continued from there with wrong tokens."""

import pytest
import torch

import kvlab
from kvlab.graph_safe_cache import GraphSafeError
from kvlab.lab.models import tiny_model

HELD = [("graph-safe", {}), ("graph-safe-kernels", {"steps": 4}), ("graph-safe-speculative", {})]


class Stop(Exception):
    pass


def _stop_at(index, error=Stop):
    def on_token(i, token):
        if i == index:
            raise error()
    return on_token


@pytest.mark.parametrize("error", [Stop, KeyboardInterrupt])
@pytest.mark.parametrize(("name", "options"), HELD, ids=[name for name, _ in HELD])
def test_a_stopped_generate_leaves_nothing_to_continue(name, options, error, prompt):
    model = tiny_model("tiny-llama")
    ids = prompt(6)
    reference = kvlab.decode(model, ids, 12)
    decoder = kvlab.STRATEGIES[name].state(model, ids, 12, graph="emulate",
                                           **options)["decoder"]
    with pytest.raises(error):
        decoder.generate(ids, 12, on_token=_stop_at(2, error))  # inside a 4-step chunk
    with pytest.raises(GraphSafeError, match=r"cache is empty.*stopped early"):
        decoder.decode_steps(2)
    # what the message says works, and the decoder is as good as new
    first = decoder.prefill(ids)
    assert torch.equal(torch.cat([first, decoder.decode_steps(5)], dim=1), reference[:, :6])
    assert torch.equal(decoder.generate(ids, 12), reference)
    assert torch.equal(decoder.decode_steps(1), kvlab.decode(model, ids, 13)[:, 12:])


@pytest.mark.parametrize(("name", "options"), HELD, ids=[name for name, _ in HELD])
def test_a_refused_generate_keeps_what_the_cache_holds(name, options, prompt):
    """The empty-on-stop rule starts after the checks: a call refused at its door writes nothing."""
    model = tiny_model("tiny-llama")
    ids = prompt(6)
    decoder = kvlab.STRATEGIES[name].state(model, ids, 12, graph="emulate",
                                           **options)["decoder"]
    decoder.generate(ids, 4)
    with pytest.raises(GraphSafeError, match="do not fit"):
        decoder.generate(ids, 100)
    assert torch.equal(decoder.decode_steps(2), kvlab.decode(model, ids, 6)[:, 4:])


def test_a_code_checkers_own_setting_error_is_the_callers_not_the_students():
    """A code checker turned every exception into "not quite: your code raised", its own refusal of
    settings that do not go together too."""
    from kvlab.exercises.common import SettingError, code_checker

    def solution(x):
        return x

    @code_checker(solution)
    def check(student, *, a: int = 1):
        if a == 2:
            raise SettingError("a=2 does not go with this question")
        return "correct" if student(a) == a else "not quite"

    assert check(solution) == "correct"
    with pytest.raises(SettingError, match="a=2"):
        check(solution, a=2)
    assert check(lambda x: 1 / 0).startswith("not quite: your code raised ZeroDivisionError")


import pytest
import torch

import kvlab.notebook as nbk
from kvlab.models import ModelUnavailableError, tiny_model


@pytest.fixture
def tiny_random(monkeypatch):
    """Stand in a tiny model for the 135M random one, to keep the test fast."""
    monkeypatch.setattr(nbk, "random_smollm2", lambda device=None, dtype=None: tiny_model("tiny-llama", dtype=dtype))


def test_random_weights_when_asked(monkeypatch, tiny_random):
    monkeypatch.setenv(nbk.RANDOM_ENV, "1")
    monkeypatch.setattr(nbk, "load_model", lambda **kw: pytest.fail("must not load the real model"))
    course = nbk.course_model("cpu", torch.float32)
    assert course.random and course.tokenizer is None
    assert course.label.startswith("RANDOM WEIGHTS") and "float32" in course.label


def test_falls_back_to_random_weights_when_the_model_is_unavailable(monkeypatch, tiny_random, capsys):
    monkeypatch.delenv(nbk.RANDOM_ENV, raising=False)

    def unavailable(**kw):
        raise ModelUnavailableError("no network\nwhat to do ...")

    monkeypatch.setattr(nbk, "load_model", unavailable)
    course = nbk.course_model("cpu")
    assert course.random
    assert "no network" in capsys.readouterr().out


def test_real_model_path_keeps_the_tokenizer(monkeypatch):
    monkeypatch.delenv(nbk.RANDOM_ENV, raising=False)
    sentinel = object()
    monkeypatch.setattr(nbk, "load_model", lambda **kw: (tiny_model("tiny-llama"), sentinel))
    course = nbk.course_model("cpu", torch.float32)
    assert not course.random and course.tokenizer is sentinel
    assert course.label == "SmolLM2-135M-Instruct, float32"


def test_random_encode_and_text(monkeypatch, tiny_random):
    monkeypatch.setenv(nbk.RANDOM_ENV, "1")
    course = nbk.course_model("cpu")
    ids = course.encode("hello")
    assert ids.tolist() == [list(b"hello")] and ids.dtype == torch.long
    assert course.encode("abcdef", max_random_tokens=3).tolist() == [[97, 98, 99]]
    assert course.text(torch.tensor([1, 2, 3])) == "1 2 3"
    assert course.text(torch.arange(20)) == "0 1 2 3 4 5 ... 14 15 16 17 18 19"


def test_show_source_displays_the_package_code(monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj: shown.append(obj))
    nbk.show_source(nbk.course_model)
    assert len(shown) == 1 and "def course_model" in shown[0].data

import pytest
import torch

import kvlab.lab.notebook as nbk
from kvlab.lab.models import ModelUnavailableError, tiny_model


@pytest.fixture
def tiny_random(monkeypatch):
    """Stand in a tiny model for the 135M random one, to keep the test fast."""
    monkeypatch.setattr(nbk, "random_smollm2",
                        lambda device=None, dtype=None: tiny_model("tiny-llama", dtype=dtype))


def test_random_weights_when_asked(monkeypatch, tiny_random):
    monkeypatch.setenv(nbk.RANDOM_ENV, "1")
    monkeypatch.setattr(nbk, "load_model", lambda **kw: pytest.fail("must not load the real model"))
    course = nbk.course_model("cpu", torch.float32)
    assert course.random and course.tokenizer is None
    assert course.label.startswith("RANDOM WEIGHTS") and "float32" in course.label


def test_falls_back_to_random_weights_when_the_model_is_unavailable(monkeypatch, tiny_random,
                                                                    capsys):
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


def test_lesson_setup_loads_prints_and_holds_what_the_cells_use(monkeypatch, tiny_random, capsys):
    monkeypatch.setenv(nbk.RANDOM_ENV, "1")
    lesson = nbk.lesson_setup(device="cpu", graphs=True, max_random_tokens=3)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == lesson.label and lesson.label.startswith("RANDOM WEIGHTS")
    assert out[1].startswith(f"hardware: {lesson.env['hardware']} | quick mode: ")
    cfg = lesson.config
    assert out[2] == (
        f"model: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
        f"{cfg.num_attention_heads} query "
        f"heads, {cfg.num_key_value_heads} kv heads, head_dim {cfg.head_dim}")
    assert out[3].startswith("capture here: EMULATED") and len(out) == 4
    assert lesson.device == torch.device("cpu") and not lesson.gpu and lesson.env["device"] == "cpu"
    assert lesson.model is lesson.course.model and lesson.random and lesson.tokenizer is None
    assert next(lesson.model.parameters()).dtype == torch.float32
    assert lesson.encode("abcdef").tolist() == [[97, 98, 99]]  # max_random_tokens
    assert lesson.text(torch.tensor([1, 2])) == "1 2"


def test_lesson_setup_without_graphs_prints_no_capture_line(monkeypatch, tiny_random, capsys):
    monkeypatch.setenv(nbk.RANDOM_ENV, "1")
    lesson = nbk.lesson_setup(torch.bfloat16, device="cpu")
    assert "capture here" not in capsys.readouterr().out
    assert (next(lesson.model.parameters()).dtype == torch.bfloat16
            and lesson.encode("abcdef").shape == (1, 6))


def test_show_doc_and_show_diff_display_the_package(monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj: shown.append(obj))
    nbk.show_doc(nbk)
    nbk.show_diff(nbk.show_source, nbk.show_doc)
    assert shown[0].data.startswith("```text\nWhat the lessons' cells share")
    diff = shown[1].data
    assert diff.startswith("--- show_source\n+++ show_doc\n")
    assert "-def show_source(*objects) -> None:" in diff and "+def show_doc(obj) -> None:" in diff

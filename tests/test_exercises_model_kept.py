"""Checkers that hand a model to student code: code that changes the model (weights, modules,
settings, config) is never "correct", and the caller's model is put back as it was (issue 48)."""

import torch

from kvlab.decoding import decode_naive
from kvlab.exercises import lesson01, lesson02, lesson03, lesson04, lesson05
from kvlab.exercises.common import model_kept
from kvlab.handwritten import HandwrittenCache
from kvlab.lab.models import tiny_model

CHANGED = "not quite: your code changed the model"


def snapshot(model):
    return ({k: v.clone() for k, v in model.state_dict().items()}, dict(model.named_modules()),
            model.config.to_dict(), model.model.norm.variance_epsilon,
            [m.training for m in model.modules()])


def same(model, before) -> bool:
    weights, modules, config, eps, training = before
    now = model.state_dict()
    return (now.keys() == weights.keys() and all(torch.equal(now[k], weights[k]) for k in now)
            and dict(model.named_modules()) == modules and model.config.to_dict() == config
            and model.model.norm.variance_epsilon == eps
            and [m.training for m in model.modules()] == training)


EDITS = {  # name -> what the student's code does to the model after its (right) work
    "zero lm_head in place": lambda m: m.lm_head.weight.data.zero_(),
    "zero lm_head under no_grad": lambda m: torch.no_grad()(m.lm_head.weight.zero_)(),
    "replace a weight's data": lambda m: setattr(m.model.norm.weight, "data",
                                                 torch.zeros_like(m.model.norm.weight)),
    "replace a module": lambda m: setattr(m.model.layers[0], "mlp", torch.nn.Identity()),
    "remove a layer": lambda m: setattr(m.model, "layers", m.model.layers[:1]),
    "a setting": lambda m: setattr(m.model.norm, "variance_epsilon", 0.5),
    "the config": lambda m: setattr(m.config, "vocab_size", 7),
}
# name -> (a mode flag the student's code flips, what the note says); it changes no token
MODE_EDITS = {
    "train mode": (lambda m: m.train(), "switched the model to train mode (model.train())"),
    "no grad": (lambda m: m.requires_grad_(False), "set requires_grad=False on"),
}


def after(fn, edit):
    def student(model, *args):
        out = fn(model, *args)
        with torch.inference_mode(False):
            edit(model)
        return out
    return student


def test_naive_decode_that_changes_the_callers_model_is_not_correct_and_the_model_is_put_back():
    model = tiny_model("tiny-llama")
    before = snapshot(model)
    assert lesson01.check_naive_decode(lesson01.check_naive_decode.solution,
                                       model=model).startswith("correct")
    for name, edit in EDITS.items():
        verdict = lesson01.check_naive_decode(after(decode_naive, edit), model=model)
        assert verdict.startswith(CHANGED), (name, verdict)
        assert same(model, before), name
    assert lesson01.check_naive_decode(
        after(decode_naive, EDITS["zero lm_head in place"])).startswith(CHANGED)


def test_a_cache_that_changes_the_model_is_not_correct():
    model = tiny_model("tiny-llama")
    before = snapshot(model)

    class Meddling(HandwrittenCache):
        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            with torch.inference_mode(False):
                model.model.norm.variance_epsilon = 1e-3
            return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    verdict = lesson02.check_cache_update(Meddling, model=model)
    assert verdict.startswith(CHANGED) and "variance_epsilon" in verdict, verdict
    assert same(model, before)
    assert lesson02.check_cache_update(HandwrittenCache, model=model).startswith("correct")


def test_lesson03_to_05_checkers_call_code_that_changes_their_model_wrong():
    edit = EDITS["a setting"]
    for check, reference in ((lesson03.check_decode_step, lesson03.decode_step),
                             (lesson04.check_graph_decode, lesson04.graph_decode),
                             (lesson05.check_graph_loop, lesson05.graph_loop_solution)):
        assert check(reference).startswith("correct"), check.__name__
        verdict = check(after(reference, edit))
        assert (verdict.startswith(CHANGED)
                and "variance_epsilon" in verdict), (check.__name__, verdict)


def test_model_kept_lists_and_undoes_every_kind_of_change():
    model = tiny_model("tiny-qwen3")
    before = snapshot(model)
    for name, edit in EDITS.items():
        with model_kept(model) as changed:
            edit(model)
        assert changed and same(model, before), name
    for name, (edit, _) in MODE_EDITS.items():
        with model_kept(model) as changed:
            edit(model)
        assert len(changed) == 1 and same(model, before), (name, changed)
        assert all(p.requires_grad for p in model.parameters()), name
    with model_kept(model) as changed, torch.inference_mode():
        decode_naive(model, torch.tensor([[1, 2, 3]]), 3)  # reading is no change
    assert changed == []


def test_a_right_decode_that_only_flips_a_mode_flag_is_right_with_a_note_and_is_put_back():
    for start in ("eval", "train"):
        model = tiny_model("tiny-llama")
        getattr(model, start)()
        before = snapshot(model)
        flips = dict(MODE_EDITS, **{
            "eval mode": (lambda m: m.eval(), "switched the model to eval mode (model.eval())")})
        for name, (edit, says) in flips.items():
            verdict = lesson01.check_naive_decode(after(decode_naive, edit), model=model)
            if (name, start) in (("train mode", "train"), ("eval mode", "eval")):  # no flip
                assert verdict.startswith("correct") and "note" not in verdict, (name, verdict)
                continue
            assert verdict.startswith("correct: your loop makes the naive loop's tokens"), verdict
            assert verdict.count(says) == 1 and verdict.count("note:") == 1, (name, verdict)
            assert "the check put it back" in verdict, verdict
            assert "Leave the mode to the caller" in verdict, verdict
            assert same(model, before), (name, start)
            assert all(p.requires_grad for p in model.parameters()), (name, start)


def test_a_changed_model_is_named_once_by_its_path_with_the_mode_among_the_changes():
    model = tiny_model("tiny-llama")
    before = snapshot(model)

    def student(model, *args):
        out = decode_naive(model, *args)
        model.train()
        model.model.norm.variance_epsilon = 0.5
        with torch.inference_mode(False):
            model.model.norm.weight = torch.nn.Parameter(torch.ones_like(model.model.norm.weight))
        return out

    verdict = lesson01.check_naive_decode(student, model=model)
    assert verdict.startswith(CHANGED), verdict
    for says in ("model.model.norm.weight replaced",
                 "model.model.norm.variance_epsilon changed from 1e-06 to 0.5"):
        assert verdict.count(says) == 1, (says, verdict)
    # every module's .training flag: one entry
    assert verdict.count("training") == 0 and verdict.count("train mode") == 1, verdict
    assert same(model, before)

"""Exercise checkers of lessons 03 and 04: every reference solution is "correct", typical wrong
answers get the hint that names their mistake, an unattempted stub is "not attempted" (or, with
KVLAB_SOLUTIONS=1, checked with the reference), and code that raises is reported, never a
traceback."""

import pytest
import torch
import transformers
from student_code import raises, stub

from kvlab.decoding import greedy
from kvlab.exercises import lesson03, lesson04
from kvlab.exercises.common import FILLED_PREDICTION, SOLUTIONS_ENV
from kvlab.graphs import capture
from kvlab.lab.models import SMOLLM2_SHAPE
from kvlab.sizes import model_sizes

CODE_CHECKERS = [lesson03.check_reset_in_place, lesson03.check_decode_step,
                 lesson04.check_graph_decode,
                 lesson04.check_put_back]
PREDICTIONS = [  # (checker, choices, what the run measures)
    (lesson03.check_crop_prediction, lesson03.CROP_CHOICES,
     lambda: lesson03.crop_experiment()["outcome"]),
    (lesson04.check_no_warmup_prediction, lesson04.NO_WARMUP_CHOICES,
     lambda: lesson04.no_warmup_run()["outcome"]),
]


@pytest.mark.parametrize("check", CODE_CHECKERS, ids=lambda c: c.__name__)
def test_the_reference_solution_is_correct(check):
    assert check(check.solution).startswith("correct"), check(check.solution)


@pytest.mark.parametrize("check", CODE_CHECKERS, ids=lambda c: c.__name__)
def test_a_stub_is_not_attempted_or_checked_with_the_reference(check, monkeypatch):
    monkeypatch.delenv(SOLUTIONS_ENV, raising=False)
    assert check(stub).startswith("not attempted")
    assert check(None).startswith("not attempted")
    monkeypatch.setenv(SOLUTIONS_ENV, "1")
    verdict = check(stub)
    assert "reference solution, filled in" in verdict and "correct" in verdict, verdict


@pytest.mark.parametrize("check", CODE_CHECKERS, ids=lambda c: c.__name__)
def test_code_that_raises_is_reported(check):
    verdict = check(raises)
    assert (verdict.startswith("not quite: your code raised ValueError")
            and "Hint" in verdict), verdict


@pytest.mark.parametrize("check, choices, measure", PREDICTIONS, ids=["crop", "no-warmup"])
def test_predictions(check, choices, measure, monkeypatch):
    monkeypatch.delenv(SOLUTIONS_ENV, raising=False)
    assert check(None).startswith("not predicted")  # and nothing runs before a prediction is made
    assert "is one of" in check("certainly")
    measured = measure()
    assert check(measured).startswith("correct")
    other = next(key for key in choices if key != measured)
    assert check(other).startswith(f"not quite: you predicted {other!r}")
    monkeypatch.setenv(SOLUTIONS_ENV, "1")
    # KVLAB_SOLUTIONS=1 fills it in, and says so (round 14)
    assert check(None).startswith(FILLED_PREDICTION + "correct")


# ---------------------------------------------------------------------------------------- lesson 03


def test_static_cache_bytes_names_the_slip():
    config = transformers.LlamaConfig(**SMOLLM2_SHAPE)  # 30 layers, 9 query heads over 3 kv heads
    s = model_sizes(config)
    # K+V x layers x kv heads x head_dim x bf16 x slots x batch
    right = 2 * s.layers * s.kv_heads * s.head_dim * 2 * 1024 * 4

    def check(answer):
        return lesson03.check_static_cache_bytes(answer, config=config, max_cache_len=1024,
                                                 dtype=torch.bfloat16, batch=4)

    assert check(right).startswith("correct")
    assert "V is a second buffer" in check(right // 2)
    assert "one sequence" in check(right // 4)
    assert "query heads" in check(right * s.heads // s.kv_heads)
    assert "4 bytes per element" in check(right * 2)
    assert "one token" in check(right // 1024)
    assert "Hint: it is preallocated" in check(right + 1)
    assert "not answered" in check(None)
    import numpy as np

    assert (check(torch.tensor([right])).startswith("correct")
            and check(np.array([right])).startswith("correct"))
    # a one-element tensor's slip is named too
    assert "V is a second buffer" in check(torch.tensor([right // 2]))
    assert "not a finite number" in check(float("nan"))


def rebinds_keys(cache):
    for layer in cache.layers:
        layer.keys = torch.zeros_like(layer.keys)
        layer.values.zero_()
        layer.cumulative_length.zero_()


def keeps_counters(cache):
    for layer in cache.layers:
        layer.keys.zero_()
        layer.values.zero_()


def forgets_values(cache):
    for layer in cache.layers:
        layer.keys.zero_()
        layer.cumulative_length.zero_()


def resets_layer0_counter(cache):
    for layer in cache.layers:
        layer.keys.zero_()
        layer.values.zero_()
    cache.layers[0].cumulative_length.zero_()


def calls_builtin(cache):
    cache.reset()


@pytest.mark.parametrize("wrong, words", [
    (rebinds_keys, ["rebound instead of written in place", "data_ptr"]),
    (keeps_counters, ["counters not reset", "the old position"]),
    (forgets_values, ["values forgotten (K without V)"]),
    (resets_layer0_counter, ["every layer has its own cumulative_length"]),
    (calls_builtin, ["transformers' own reset()"]),
], ids=lambda x: getattr(x, "__name__", ""))
def test_reset_in_place_hints(wrong, words):
    verdict = lesson03.check_reset_in_place(wrong)
    assert verdict.startswith("not quite") and all(w in verdict for w in words), verdict


def never_advances(model, cache, ids, position):
    return greedy(model(ids, cache=cache, position_ids=position.reshape(1, 1)).logits)


def advances_first(model, cache, ids, position):
    position.add_(1)
    return greedy(model(ids, cache=cache, position_ids=position.reshape(1, 1)).logits)


def reads_an_int(model, cache, ids, position):
    at = int(position)
    position += 1
    return greedy(model(ids, cache=cache, position_ids=torch.tensor([[at]])).logits)


def passes_no_position(model, cache, ids, position):
    position.add_(1)
    return greedy(model(ids, cache=cache).logits)


def returns_logits(model, cache, ids, position):
    position.add_(1)
    return model(ids, cache=cache, position_ids=position.reshape(1, 1) - 1).logits


@pytest.mark.parametrize("wrong, words", [
    (never_advances, ["every step fed position 9", "position.add_(1)"]),
    (advances_first, ["off by one position (+1)", "is the first that differs"]),
    (reads_an_int, ["Python int", "on the host", "recompiles"]),
    (passes_no_position, ["no position_ids"]),
    (returns_logits, ["[batch, 1]"]),
], ids=lambda x: getattr(x, "__name__", ""))
def test_decode_step_hints(wrong, words):
    verdict = lesson03.check_decode_step(wrong)
    assert verdict.startswith("not quite") and all(w in verdict for w in words), verdict


def test_crop_keeps_the_slots_and_the_mask_hides_them():
    seen = lesson03.crop_experiment(extra=6, k=3)
    assert seen["counter after"] == seen["counter before"] - 3
    assert (len(seen["cropped slots' key norms"]) == 3
            and all(n > 0 for n in seen["cropped slots' key norms"]))
    assert seen["outcome"] == "kept-hidden"
    assert lesson03.check_crop_prediction("kept-hidden").startswith("correct")
    with pytest.raises(ValueError, match="k must be"):
        lesson03.crop_experiment(extra=2, k=3)


# ---------------------------------------------------------------------------------------- lesson 04


def graph_decode_with(slip):
    """The reference graph_decode with one typical slip."""
    def graph_decode(model, cache, first_ids, prompt_len, n):
        static_ids = first_ids.clone()
        static_pos = torch.full_like(first_ids,
                                     prompt_len + (1 if slip == "position off by one" else 0))

        def step(ids, pos):
            return greedy(model(ids, cache=cache, position_ids=pos).logits)

        graph = capture(step, static_ids, static_pos, warmup=3 if slip == "warm-up" else 0)
        out = [first_ids]
        for _ in range(1, n):
            next_ids = graph.replay()
            next_ids = next_ids if slip == "no clone" else next_ids.clone()
            out.append(next_ids)
            if slip == "ids rebound":
                static_ids = next_ids
            else:
                static_ids.copy_(next_ids)
            if slip != "position kept":
                static_pos.add_(1)
        return torch.cat(out, dim=1)

    return graph_decode


def eager_decode(model, cache, first_ids, prompt_len, n):
    out, ids = [first_ids], first_ids
    for _ in range(1, n):
        ids = greedy(model(ids, cache=cache).logits)
        out.append(ids)
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("slip, words", [
    ("ids rebound",
     ["rebound instead of written in place", "stale input", "is the first that differs"]),
    ("position kept", ["forgot to advance the position"]),
    ("position off by one", ["off by one position (+1)"]),
    ("warm-up", ["a counter advanced by warm-up", "warmup=3"]),
    ("no clone", ["overwritten by every replay", "clone"]),
])
def test_graph_decode_hints(slip, words):
    verdict = lesson04.check_graph_decode(graph_decode_with(slip))
    assert verdict.startswith("not quite") and all(w in verdict for w in words), verdict


def test_graph_decode_must_replay_a_graph():
    assert "never replayed a captured graph" in lesson04.check_graph_decode(eager_decode)


def leaves_counters(cache, valid_len):
    pass


def rebinds_counters(cache, valid_len):
    for layer in cache.layers:
        layer.cumulative_length = torch.tensor(valid_len)


def moves_layer0(cache, valid_len):
    cache.layers[0].cumulative_length.fill_(valid_len)


# right for 4a's two warm-up calls, not for the padding
def takes_back_the_warmup(cache, valid_len):
    for layer in cache.layers:
        layer.cumulative_length.sub_(2)


def empties_the_cache(cache, valid_len):
    cache.reset()


def raises_runtime_error(cache, valid_len):
    raise RuntimeError("inside the scenario")


@pytest.mark.parametrize("wrong, words", [
    (leaves_counters,
     ["a counter advanced by warm-up", "warmup-advance: the first differing token is"]),
    (rebinds_counters, ["rebound instead of written in place"]),
    (moves_layer0, ["only layer 0's counter", "every layer has its own"]),
    (takes_back_the_warmup,
     ["the padding counted", "padding-pollution: the first differing token is"]),
    (empties_the_cache, ["you emptied the cache"]),
    (raises_runtime_error, ["your code raised RuntimeError: inside the scenario"]),
], ids=lambda x: getattr(x, "__name__", ""))
def test_put_back_hints(wrong, words):
    verdict = lesson04.check_put_back(wrong)
    assert verdict.startswith("not quite") and all(w in verdict for w in words), verdict


def test_no_warmup_capture_decodes_right():
    seen = lesson04.no_warmup_run(new_tokens=8)
    assert seen["outcome"] == "none" and seen["first differing token"] is None
    assert seen["counters after the decode"] == [seen["prompt + tokens fed"]]

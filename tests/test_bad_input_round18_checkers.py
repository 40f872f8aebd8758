"""Round 18 of the hostile-user probe, exercise checkers: a tolerance wide enough to call a named
mistake right, right answers refused (a rounded rate, a loop that reuses its inputs as buffers,
inputs captured in another order, clear spellings of a choice) and a Python position counter
called graph-safe."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kvlab.exercises import lesson05, lesson06

LESSON05_GPU = Path(__file__).resolve().parents[1] / "data" / "lesson05_gpu.json"


def _launch_records() -> dict:
    return {k: v for k, v in json.loads(LESSON05_GPU.read_text()).items()
            if isinstance(v, dict) and "eager_ms_per_token" in v}


@pytest.mark.parametrize("name", sorted(_launch_records()))
def test_launch_cost_whole_step_mistake_is_refused(name):
    """check_launch_cost_us's 10% tolerance called the named mistake "whole eager step over its
    launches" right (9.6% off on the float32 record)."""
    record = _launch_records()[name]
    launches = record["work_per_step"]["eager"]["kernel_launch_calls"]
    whole_step = 1e3 * record["eager_ms_per_token"] / launches
    verdict = lesson05.check_launch_cost_us(whole_step, record=record)
    assert verdict.startswith("not quite"), verdict
    assert "whole eager step over its launches" in verdict
    right = lesson05.launch_cost_us(record)
    # an answer nearer the right value than the mistake, within the tolerance, is still right
    between = right + 0.4 * (whole_step - right)
    assert lesson05.check_launch_cost_us(between, record=record).startswith("correct")
    assert lesson05.check_launch_cost_us(right * 0.97, record=record).startswith("correct")


def test_rate_rounded_to_its_digits_is_right():
    """check_tokens_per_s refused a rate rounded to 0.1 ("you gave 1,660.5, the rule gives
    1,660.47"): an answer equal to the right one at the precision it is given in is right."""
    def rounded(t1, tn, n, batch):
        return round(lesson06.tokens_per_s_solution(t1, tn, n, batch), 1)

    def two_digits(t1, tn, n, batch):  # fewer than 3 significant digits: too coarse
        rate = lesson06.tokens_per_s_solution(t1, tn, n, batch)
        return float(f"{rate:.2g}")

    assert lesson06.check_tokens_per_s(rounded).startswith("correct")
    assert lesson06.check_tokens_per_s(two_digits).startswith("not quite")


def test_rounded_answer_nearer_a_mistake_is_the_mistake():
    """The precision rule (a rounded answer is right) never calls right an answer at least as near a
    named mistake as the right value."""
    from kvlab.exercises.common import check_number

    assert check_number(100.4, 100.0, what="x", hint="h").startswith("not quite")
    assert check_number(100.0, 100.04, what="x", hint="h").startswith("correct")
    verdict = check_number(100.0, 100.04, what="x", hint="h", mistakes=[(100.02, "the slip")])
    assert verdict.startswith("not quite") and "the slip" in verdict


def test_graph_decode_with_first_ids_as_token_buffer_is_right():
    """check_graph_decode refused a right loop that used first_ids as its static token buffer: it
    read first_ids after the loop had overwritten it, as the prefill's token."""
    from kvlab.decoding import greedy
    from kvlab.exercises import lesson04
    from kvlab.graphs import capture

    def graph_decode(model, cache, first_ids, prompt_len, n):
        out = [first_ids.clone()]
        pos = torch.full_like(first_ids, prompt_len)

        def step(ids, p):
            return greedy(model(ids, cache=cache, position_ids=p).logits)

        graph = capture(step, first_ids, pos, warmup=0)  # first_ids: the static token buffer
        for _ in range(1, n):
            nxt = graph.replay().clone()
            out.append(nxt)
            first_ids.copy_(nxt)
            pos.add_(1)
        return torch.cat(out, 1)

    verdict = lesson04.check_graph_decode(graph_decode)
    assert verdict.startswith("correct"), verdict


def _graph_loop(order: str):
    from kvlab.graphs import capture

    def graph_loop(model, cache, prompts, n):
        token, pos, graph, outs = None, None, None, []
        for prompt in prompts:
            cache.reset()
            first = model(prompt, cache=cache).logits[:, -1:].argmax(-1)
            if graph is None:
                token, pos = first.clone(), torch.tensor([[prompt.shape[1]]])

                def step(a, b):
                    p, ids = (a, b) if order == "position first" else (b, a)
                    return model(ids, cache=cache, position_ids=p).logits[:, -1:].argmax(-1)

                inputs = (pos, token) if order == "position first" else (token, pos)
                graph = capture(step, *inputs, warmup=3)
                for layer in cache.layers:
                    layer.cumulative_length.sub_(3)
            token.copy_(first)
            pos.fill_(prompt.shape[1])
            out = [first]
            for _ in range(n - 1):
                token.copy_(graph.replay())
                pos.add_(1)
                out.append(token.clone())
            outs.append(torch.cat(out, 1))
        return outs

    return graph_loop


@pytest.mark.parametrize("order", ["position first", "token first"])
def test_graph_loop_with_position_captured_first_is_right(order):
    """check_graph_loop took the first static input as the token, so a right loop that captured
    (position, token) in that order was refused with a false hint."""
    verdict = lesson05.check_graph_loop(_graph_loop(order))
    assert verdict.startswith("correct"), verdict


def test_decode_step_with_a_python_counter_is_refused():
    """check_decode_step called right a step that read position once (int() on its first call) and
    then counted in Python: under a graph its positions would freeze."""
    from kvlab.decoding import greedy
    from kvlab.exercises import lesson03

    def decode_step(model, cache, ids, position):
        if not hasattr(decode_step, "p"):
            decode_step.p = int(position)  # read once, then a Python counter
        logits = model(ids, cache=cache, position_ids=torch.tensor([[decode_step.p]])).logits
        decode_step.p += 1
        position.add_(1)
        return greedy(logits)

    verdict = lesson03.check_decode_step(decode_step)
    assert verdict.startswith("not quite"), verdict
    assert "handed position" in verdict and "position.reshape(1, 1)" in verdict
    assert lesson03.check_decode_step(lesson03.decode_step).startswith("correct")


def test_no_position_ids_message_says_what_the_model_used():
    """The verdict "you passed no position_ids, so the model took the positions from the cache's
    counter" did not say a cache_position= was given instead, nor what the model used."""
    from kvlab.decoding import greedy
    from kvlab.exercises import lesson03

    def decode_step(model, cache, ids, position):
        logits = model(ids, cache=cache, cache_position=position.reshape(1) + 5).logits
        position.add_(1)
        return greedy(logits)

    prompt_len = 7  # the first step's counter: the prompt's tokens
    verdict = lesson03.check_decode_step(decode_step, prompt_len=prompt_len)
    assert verdict.startswith("not quite: you passed no position_ids"), verdict
    assert "cache_position= given instead" in verdict
    assert f"from the cache's counter ({prompt_len})" in verdict


def _spelling_cases():
    from kvlab.exercises.lesson00 import GQA_CHOICES
    from kvlab.exercises.lesson01 import DOUBLING_CHOICES
    from kvlab.exercises.lesson02 import CACHE_VS_WEIGHTS_CHOICES
    from kvlab.exercises.lesson05 import COUNTER_CHOICES

    return [
        (GQA_CHOICES, "~10%", "10%"), (GQA_CHOICES, "+10%", "10%"),
        (GQA_CHOICES, "about 10%", "10%"), (DOUBLING_CHOICES, "2\u00d7", "2x"),
        (DOUBLING_CHOICES, "2 to 4x", "2x-4x"), (DOUBLING_CHOICES, "~2x", "2x"),
        (CACHE_VS_WEIGHTS_CHOICES, "1000 tokens", 1000), (CACHE_VS_WEIGHTS_CHOICES, "10^3", 1000),
        (COUNTER_CHOICES, "option B", "B"), (COUNTER_CHOICES, "B,", "B"),
        (COUNTER_CHOICES, "\uff22", "B"),  # full-width B
        (CACHE_VS_WEIGHTS_CHOICES, CACHE_VS_WEIGHTS_CHOICES[1000], 1000),
    ]


@pytest.mark.parametrize("case", range(12))
def test_clear_spellings_name_their_choice(case):
    """Clear spellings of a choice ("~10%", "about 10%", "2×", "2 to 4x", "1000 tokens", "10^3",
    "option B", "B,", a full-width "Ｂ", a choice's own description) were refused as "is one of"."""
    from kvlab.exercises.common import choice_of

    choices, text, key = _spelling_cases()[case]
    assert choice_of(text, choices) == key


def test_wrong_or_unclear_spellings_still_name_nothing():
    """A spelling that names another value, or several choices, names none: a minus sign is kept
    ("-10%" was read as "10%"), words from no choice's description are refused."""
    from kvlab.exercises.common import choice_of
    from kvlab.exercises.lesson00 import GQA_CHOICES
    from kvlab.exercises.lesson02 import CACHE_VS_WEIGHTS_CHOICES
    from kvlab.exercises.lesson06 import TILE_PATHS

    for text in ("-10%", "about 20%", "about", "option"):
        assert choice_of(text, GQA_CHOICES) is None, text
    assert choice_of("1000 parameters", CACHE_VS_WEIGHTS_CHOICES) is None
    assert choice_of("about a", CACHE_VS_WEIGHTS_CHOICES) is None  # the start of all four
    assert choice_of("the", TILE_PATHS) is None


@pytest.mark.parametrize("lower", [torch.bfloat16, torch.float16])
def test_attend_computed_at_lower_precision_is_named(lower):
    """check_attend gave an attention computed in bfloat16 and returned as float64 a generic hint
    ("row 0 is the first that differs"): the error size says it was computed at lower precision."""
    from kvlab.exercises import lesson02

    def attend(q, keys, values):
        return lesson02.attend(q.to(lower), keys.to(lower), values.to(lower)).to(q.dtype)

    verdict = lesson02.check_attend(attend)
    assert verdict.startswith("not quite"), verdict
    assert f"right only to {lower}'s rounding" in verdict and "lower precision" in verdict

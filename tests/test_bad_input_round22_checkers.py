"""Probe round 22 (a hostile student, the checkers): wrong answers called correct, right answers
refused, hints that miss."""

import pytest
import torch
from transformers import DynamicCache, LlamaConfig

from kvlab.decoding import decode_naive
from kvlab.exercises import lesson01, lesson02, lesson05, lesson07
from kvlab.graphs import capture


def _full_sequence_loop(positions):
    def naive_decode(model, prompt_ids, n):
        seq = prompt_ids
        for _ in range(n):
            logits = model(seq, position_ids=positions(seq)).logits
            seq = torch.cat([seq, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        return seq[:, prompt_ids.shape[1]:]
    return naive_decode


def _cached_loop(position):
    def naive_decode(model, prompt_ids, n):
        cache = DynamicCache(config=model.config)
        token = model(prompt_ids, cache=cache).logits[:, -1:].argmax(-1)
        out, p = [token], prompt_ids.shape[1]
        for step in range(1, n):
            at = torch.full_like(token, position(p, step))
            token = model(token, cache=cache, position_ids=at).logits[:, -1:].argmax(-1)
            out.append(token)
        return torch.cat(out, 1)
    return naive_decode


@pytest.mark.parametrize("wrong", [
    _full_sequence_loop(torch.zeros_like),  # every position 0
    _full_sequence_loop(lambda seq: torch.arange(1, seq.shape[1] + 1).expand_as(seq)),
    _cached_loop(lambda p, step: step),  # the step's index, not the sequence's
    _cached_loop(lambda p, step: p + step),  # one too far
])
def test_a_naive_loop_feeding_wrong_positions_is_not_correct(wrong):
    """The tiny checker model's greedy tokens hardly move with positions (all four made the right
    tokens): the positions the rotary embedding took are read."""
    verdict = lesson01.check_naive_decode(wrong)
    assert verdict.startswith("not quite") and "positions" in verdict, verdict


@pytest.mark.parametrize("right", [
    decode_naive,
    _full_sequence_loop(lambda seq: torch.arange(seq.shape[1]).expand_as(seq)),
    _cached_loop(lambda p, step: p + step - 1),
])
def test_a_naive_loop_with_the_right_positions_stays_correct(right):
    assert lesson01.check_naive_decode(right).startswith("correct")


def _graph_loop(prefill_positions):
    def graph_loop(model, cache, prompts, n):
        token, graph, outs = None, None, []
        for prompt in prompts:
            cache.reset()
            first = model(prompt, cache=cache,
                          position_ids=prefill_positions(prompt)).logits[:, -1:].argmax(-1)
            if graph is None:
                token = first.clone()
                graph = capture(lambda ids: model(ids, cache=cache).logits[:, -1:].argmax(-1),
                                token, warmup=3)
                for layer in cache.layers:
                    layer.cumulative_length.sub_(3)
            token.copy_(first)
            out = [first]
            for _ in range(n - 1):
                token.copy_(graph.replay())
                out.append(token.clone())
            outs.append(torch.cat(out, dim=1))
        return outs
    return graph_loop


@pytest.mark.parametrize("positions", [
    lambda prompt: torch.arange(1, prompt.shape[1] + 1)[None], torch.zeros_like])
def test_a_graph_loop_whose_prefill_writes_other_positions_is_not_correct(positions):
    verdict = lesson05.check_graph_loop(_graph_loop(positions))
    assert verdict.startswith("not quite") and "prefill" in verdict, verdict


def test_the_same_graph_loop_with_the_prefills_positions_right_is_correct():
    loop = _graph_loop(lambda prompt: torch.arange(prompt.shape[1])[None])
    assert lesson05.check_graph_loop(loop).startswith("correct")


def test_a_draft_searching_the_ids_as_text_is_not_correct():
    def draft(tokens, k, max_ngram):
        text = " ".join(map(str, tokens))
        for n in range(min(max_ngram, len(tokens) - 1), 0, -1):
            suffix = " ".join(map(str, tokens[-n:]))
            at = text.find(suffix)
            if at != -1 and at < len(text) - len(suffix):
                start = len(text[:at].split())
                return tokens[start + n:start + n + k]
        return []

    verdict = lesson07.check_draft(draft)
    assert verdict.startswith("not quite") and "as text" in verdict, verdict
    assert lesson07.check_draft(lesson07.check_draft.solution).startswith("correct")


QWEN_7B = dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4)


@pytest.mark.parametrize("answer, right", [
    (1_879_048_192, True), (1.879e9, True), ("1.879e9", True), (1.88e9, True),
    (1.87e9, False), (1.9e9, False), (1.8790e9, True), (1879000000, False)])
def test_a_byte_count_written_rounded_as_a_float_is_read_to_its_digits(answer, right):
    """A whole float spells a rounded count (1.879e9): read to its last nonzero digit. A whole int
    is a count to its last digit."""
    verdict = lesson02.check_cache_bytes(answer, config=LlamaConfig(**QWEN_7B), tokens=32768,
                                         dtype=torch.bfloat16)
    assert verdict.startswith("correct") == right, verdict


def test_a_class_checker_handed_an_instance_says_to_pass_the_class():
    class MyCache(lesson02.HandwrittenCache):
        pass

    verdict = lesson02.check_cache_update(MyCache())
    assert verdict.startswith("not quite") and "pass the class itself" in verdict, verdict
    assert lesson02.check_cache_update(MyCache).startswith("correct")


@pytest.mark.parametrize("returned", [torch.zeros(1, 6, dtype=torch.long), 3, [1, 2]])
def test_a_function_checker_handed_a_value_says_to_pass_the_function(returned):
    verdict = lesson01.check_naive_decode(returned)
    assert verdict.startswith("not quite") and "pass the function itself" in verdict, verdict


def test_a_choice_with_a_question_mark_is_read():
    assert lesson05.check_counters_prediction("B?").startswith("correct")

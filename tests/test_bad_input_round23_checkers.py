"""Probe round 23 (a hostile student, the checkers): positions fed past the outer model, a cache
under its older keyword."""

import warnings

import pytest
import torch
from transformers import DynamicCache

from kvlab.exercises import lesson01, lesson05
from kvlab.graphs import capture


def _inner_model_loop(start):
    """The decoder stack and the head called apart, positions given by hand from ``start``."""
    def naive_decode(model, prompt_ids, n):
        seq = prompt_ids
        for _ in range(n):
            at = torch.arange(start, start + seq.shape[1]).unsqueeze(0)
            hidden = model.model(seq, position_ids=at).last_hidden_state
            seq = torch.cat([seq, model.lm_head(hidden)[:, -1].argmax(-1, keepdim=True)], 1)
        return seq[:, prompt_ids.shape[1]:]
    return naive_decode


@pytest.mark.parametrize("start, right", [(1, False), (5, False), (0, True)])
def test_positions_fed_to_the_decoder_stack_directly_are_read(start, right):
    verdict = lesson01.check_naive_decode(_inner_model_loop(start))
    assert verdict.startswith("correct") == right, verdict


def _cache_loop(keyword):
    def naive_decode(model, prompt_ids, n):
        cache, out, ids = DynamicCache(config=model.config), [], prompt_ids
        for _ in range(n):
            ids = model(ids, use_cache=True, **{keyword: cache}).logits[:, -1].argmax(
                -1, keepdim=True)
            out.append(ids)
        return torch.cat(out, 1)
    return naive_decode


@pytest.mark.parametrize("keyword", ["cache", "past_key_values"])
def test_a_cache_loop_under_either_keyword_is_right(keyword):
    """transformers 5.24 calls it cache= and still takes past_key_values= (with a warning):
    the cache's counter was read under the new name only, and a right loop refused."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        verdict = lesson01.check_naive_decode(_cache_loop(keyword))
    assert verdict.startswith("correct"), verdict


def _graph_loop(keyword, eager_tokens=False):
    def graph_loop(model, cache, prompts, n):
        token, graph, outs = None, None, []
        for prompt in prompts:
            cache.reset()
            first = model(prompt, **{keyword: cache}).logits[:, -1:].argmax(-1)
            if graph is None:
                token = first.clone()
                graph = capture(
                    lambda ids: model(ids, **{keyword: cache}).logits[:, -1:].argmax(-1),
                    token, warmup=3)
                for layer in cache.layers:
                    layer.cumulative_length.sub_(3)
            token.copy_(first)
            out, seq = [first], torch.cat([prompt, first], 1)
            for _ in range(n - 1):
                made = graph.replay()
                if eager_tokens:  # the replay's token thrown away, each recomputed eagerly
                    made = model(seq, use_cache=False).logits[:, -1:].argmax(-1)
                token.copy_(made)
                out.append(token.clone())
                seq = torch.cat([seq, token], 1)
            outs.append(torch.cat(out, dim=1))
        return outs
    return graph_loop


def test_a_graph_loop_passing_the_cache_as_past_key_values_is_right():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        verdict = lesson05.check_graph_loop(_graph_loop("past_key_values"))
    assert verdict.startswith("correct"), verdict


def test_a_graph_loop_recomputing_its_tokens_without_a_cache_is_told_so():
    verdict = lesson05.check_graph_loop(_graph_loop("cache", eager_tokens=True))
    assert verdict.startswith("not quite") and "without a cache" in verdict, verdict

"""Probe round 24 (short, on the code changed by rounds 22-23): a named mistake read as rounded, a
decoder stack reached through .forward, a refused call that allocated the caller's cache."""

import numpy as np
import pytest
import torch
from transformers import StaticCache

import kvlab
from kvlab.exercises import lesson01, lesson02, lesson03


@pytest.mark.parametrize("answer", [1020.0, "1020.0", np.float64(1020), torch.tensor(1020.0)])
def test_a_named_off_by_one_given_as_a_whole_float_is_still_that_mistake(answer):
    """Round 22 read a whole float to its last nonzero digit (1020.0: 3 digits, a step of 5), and
    check_cached_positions passed no mistakes=: p + n as a float was called right."""
    verdict = lesson02.check_cached_positions(answer, prompt_len=1000, new_tokens=20)
    assert verdict.startswith("not quite") and "never fed back" in verdict, verdict
    assert lesson02.check_cached_positions(1019.0, prompt_len=1000,
                                           new_tokens=20).startswith("correct")


def test_positions_fed_through_the_stacks_forward_method_are_read():
    def naive_decode(model, prompt_ids, n):
        seq = prompt_ids
        for _ in range(n):
            at = torch.arange(1, seq.shape[1] + 1)[None]
            hidden = model.model.forward(seq, position_ids=at).last_hidden_state
            seq = torch.cat([seq, model.lm_head(hidden[:, -1]).argmax(-1, keepdim=True)], 1)
        return seq[:, prompt_ids.shape[1]:]

    verdict = lesson01.check_naive_decode(naive_decode)
    assert verdict.startswith("not quite") and "positions" in verdict, verdict


@pytest.mark.parametrize("through", ["stack", "forward"])
def test_a_right_step_through_the_stack_or_forward_is_counted(through):
    """check_decode_step counted calls of the whole model only: 'called the model 0 times'."""
    def step(model, cache, ids, position):
        at = position.reshape(1, 1).expand(ids.shape[0], 1)
        if through == "stack":
            logits = model.lm_head(model.model(ids, cache=cache, position_ids=at).last_hidden_state)
        else:
            logits = model.forward(ids, cache=cache, position_ids=at).logits
        position.add_(1)
        return logits[:, -1:].argmax(-1)

    verdict = lesson03.check_decode_step(step)
    assert verdict.startswith("correct"), verdict


def test_a_refused_static_graph_call_leaves_the_callers_cache_unallocated():
    """The door allocated the cache before the function's room check refused the call: the cache
    was then tied to that call's batch and dtype."""
    model = kvlab.tiny_model("tiny-llama")
    ids, two = torch.randint(1, 256, (1, 6)), torch.randint(1, 256, (2, 6))
    cache = StaticCache(config=model.config, max_cache_len=12)
    with pytest.raises(ValueError, match="needs 45 cache slots"):
        kvlab.decode(model, ids, 40, strategy="static-graph", cache=cache)
    assert not cache.is_initialized
    assert torch.equal(kvlab.decode(model, two, 4, strategy="static", cache=cache),
                       kvlab.decode(model, two, 4))

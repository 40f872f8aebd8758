"""Probe round 25 (short, on round 24's code): a named mistake ending in 000, capture settings
refused after the prefill wrote into the caller's cache, a hint showing the wrong row."""

import pytest
import torch
from transformers import StaticCache

import kvlab
from kvlab.exercises import lesson01, lesson07


def test_the_floor_as_a_whole_float_ending_in_000_is_still_the_floor():
    length = 16 * 123000 + 1  # ceil: 123,001 blocks
    verdict = lesson07.check_blocks_held(length // 16.0, lengths=(length,), block_size=16)
    assert verdict.startswith("not quite") and "rounded down" in verdict, verdict
    assert lesson07.check_blocks_held(123001.0, lengths=(length,),
                                      block_size=16).startswith("correct")


@pytest.mark.parametrize("option, error, says", [
    ({"warmup": -1}, ValueError, "warmup"), ({"warmup": "3"}, ValueError, "warmup"),
    ({"runner": "bogus"}, ValueError, "unknown runner 'bogus'"),
    ({"keep": []}, TypeError, "keep must be a dict")])
def test_static_graphs_capture_settings_are_refused_before_the_cache_is_touched(option, error,
                                                                                 says):
    model = kvlab.tiny_model("tiny-llama")
    cache = StaticCache(config=model.config, max_cache_len=40)
    with pytest.raises(error, match=says):
        kvlab.decode(model, torch.tensor([[3, 1, 4, 1, 5, 9, 2]]), 6, strategy="static-graph",
                     cache=cache, **option)
    assert not cache.is_initialized


def test_a_wrong_row_of_positions_is_shown_as_that_row():
    def naive_decode(model, ids, n):
        out = []
        for _ in range(n):
            at = torch.arange(ids.shape[1]).expand(ids.shape[0], -1) + torch.arange(
                ids.shape[0])[:, None]  # row 1 one further on
            token = model(ids, position_ids=at).logits[:, -1].argmax(-1, keepdim=True)
            out.append(token)
            ids = torch.cat([ids, token], 1)
        return torch.cat(out, 1)

    verdict = lesson01.check_naive_decode(naive_decode)
    assert verdict.startswith("not quite") and "positions [1, 2, 3, 4]" in verdict, verdict

"""Probe round 23 (the decoding side): caches that cache.reset() could not empty."""

import pytest
import torch
from transformers import StaticCache

import kvlab
from kvlab.hf_caches import make_static_cache

IDS = torch.tensor([[1, 2, 3, 4, 5, 6]])


@pytest.fixture(scope="module")
def model():
    return kvlab.tiny_model("tiny-llama")


@pytest.mark.parametrize("make", [lambda m: StaticCache(config=m.config, max_cache_len=32),
                                  lambda m: make_static_cache(m, 32)])
def test_a_cache_static_graph_filled_empties_with_cache_reset(model, make):
    """Its buffers were made on first use inside inference mode: cache.reset() outside it raised
    torch's 'Inplace update to inference tensor outside InferenceMode'. 'static' allocated them
    outside; the door now does for 'static-graph'."""
    cache = make(model)
    first = kvlab.decode(model, IDS, 5, strategy="static-graph", cache=cache)
    cache.reset()
    assert torch.equal(kvlab.decode(model, IDS, 5, strategy="static-graph", cache=cache), first)


def test_a_reduce_overhead_states_cache_empties_with_cache_reset(model):
    state = kvlab.STRATEGIES["reduce-overhead"].state(model, IDS, 5, max_cache_len=16)
    first = kvlab.decode(model, IDS, 5, strategy="reduce-overhead", **state)
    state["cache"].reset()
    assert torch.equal(kvlab.decode(model, IDS, 5, strategy="reduce-overhead", **state), first)
    assert torch.equal(first, kvlab.decode(model, IDS, 5))

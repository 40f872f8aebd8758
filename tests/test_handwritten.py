"""kvlab.handwritten: token-exact with the naive loop on several architectures, bytes held, bytes
copied."""

import pytest
import torch

import kvlab
from kvlab.decoding import decode_naive
from kvlab.handwritten import (
    HandwrittenCache,
    HandwrittenLayer,
    cat_bytes_copied,
    decode_handwritten,
)
from kvlab.lab.measure import cache_bytes
from kvlab.lab.models import TINY_CONFIGS, tiny_model
from kvlab.sizes import kv_cache_bytes


@pytest.mark.parametrize("name", sorted(TINY_CONFIGS))
def test_token_exact_with_naive_batch_2(name, prompt):
    model = tiny_model(name)
    ids = prompt(9, batch=2)
    naive = kvlab.decode(model, ids, 24, strategy="naive")
    cached = kvlab.decode(model, ids, 24, strategy="handwritten")
    assert cached.shape == (2, 24)
    assert torch.equal(naive, cached)
    # the two rows are different sequences, not one repeated
    assert not torch.equal(naive[0], naive[1])


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3", "tiny-phi3"])
def test_cache_holds_exactly_the_formula(name, prompt):
    model = tiny_model(name)
    cache = HandwrittenCache()
    decode_handwritten(model, prompt(9, batch=2), 10, cache=cache)
    # prompt 9 + 10 new tokens, but the last token is never fed back: 18 cached
    assert cache.get_seq_length() == 18
    assert len(cache.layers) == model.config.num_hidden_layers
    assert cache_bytes(cache) == kv_cache_bytes(model.config, 18, model.dtype, batch=2)
    layer = cache.layers[0]
    assert layer.keys.shape == (2, model.config.num_key_value_heads, 18, layer.keys.shape[-1])
    assert layer.keys.is_contiguous() and layer.values.is_contiguous()


def test_bytes_copied_per_step_and_in_total(prompt):
    model = tiny_model("tiny-llama")
    cache, copied = HandwrittenCache(), []
    decode_handwritten(model, prompt(9, batch=2), 6, cache=cache,
                       on_token=lambda step, ids: copied.append(cache.bytes_copied))
    per_token = kv_cache_bytes(model.config, 1, model.dtype, batch=2)
    steps = [b - a for a, b in zip([0] + copied, copied, strict=False)]
    assert steps == [per_token * (9 + i) for i in range(6)]  # each step rewrites the whole cache
    assert cache.bytes_copied == cat_bytes_copied(model.config, 9, 6, model.dtype, batch=2)


def test_bf16_cache_bytes(prompt):
    model = tiny_model("tiny-llama", dtype=torch.bfloat16)
    cache = HandwrittenCache()
    decode_handwritten(model, prompt(9), 3, cache=cache)
    assert cache_bytes(cache) == kv_cache_bytes(model.config, 11, torch.bfloat16)


def test_on_token_sees_every_step(prompt):
    model = tiny_model("tiny-llama")
    seen = []
    out = decode_handwritten(model, prompt(9), 5,
                             on_token=lambda step, ids: seen.append((step, int(ids))))
    assert [s for s, _ in seen] == list(range(5))
    assert [t for _, t in seen] == out[0].tolist()


def test_interface_answers_before_and_after_updates():
    cache = HandwrittenCache()
    assert cache.get_seq_length() == 0 and cache.get_query_offset() == 0
    assert cache.get_mask_sizes(5, 0) == (5, 0)
    k = torch.randn(1, 2, 5, 4)
    keys, values = cache.update(k, k + 1, 1)  # layers are made on first use, up to layer_idx
    assert len(cache.layers) == 2 and torch.equal(keys, k) and torch.equal(values, k + 1)
    assert cache.get_seq_length(1) == 5 and cache.get_seq_length(0) == 0
    assert cache.get_mask_sizes(1, 1) == (6, 0)


def test_used_cache_is_refused(prompt):
    model = tiny_model("tiny-llama")
    cache = HandwrittenCache()
    decode_handwritten(model, prompt(9, batch=2), 2, cache=cache)
    with pytest.raises(ValueError, match="fresh"):
        decode_handwritten(model, prompt(9, batch=2), 2, cache=cache)
    with pytest.raises(ValueError, match="fresh"):
        decode_handwritten(model, prompt(9, batch=2), 2, cache=object())


def test_states_that_do_not_fit_are_refused_before_anything_is_written():
    layer = HandwrittenLayer()
    layer.append(torch.zeros(2, 1, 3, 4), torch.zeros(2, 1, 3, 4))
    for k, v in ((torch.zeros(1, 1, 1, 4), torch.zeros(1, 1, 1, 4)),  # another batch
                 (torch.zeros(2, 2, 1, 4), torch.zeros(2, 2, 1, 4)),  # other kv heads
                 (torch.zeros(2, 1, 1, 8), torch.zeros(2, 1, 1, 8)),  # another head_dim
                 (torch.zeros(2, 1, 1, 4, dtype=torch.float64),
                  torch.zeros(2, 1, 1, 4, dtype=torch.float64))):
        with pytest.raises(ValueError, match="do not fit the cached"):
            layer.append(k, v)
    # K without its V's tokens
    with pytest.raises(ValueError, match="must share batch, kv heads, token count"):
        layer.append(torch.zeros(2, 1, 2, 4), torch.zeros(2, 1, 1, 4))
    with pytest.raises(ValueError, match=r"\[batch, kv_heads, new_tokens, head_dim\]"):
        layer.append(torch.zeros(2, 4), torch.zeros(2, 4))
    assert layer.seq_len == 3  # nothing was written


def test_decode_checks_inputs_for_this_strategy(prompt):
    model = tiny_model("tiny-llama")
    with pytest.raises(ValueError, match="max_new_tokens"):
        kvlab.decode(model, prompt(9, batch=2), 0, strategy="handwritten")


@pytest.mark.parametrize("kw", [dict(prompt_len=0), dict(new_tokens=0), dict(new_tokens=1.5)])
def test_cat_bytes_copied_bad_arguments(kw):
    args = dict(prompt_len=4, new_tokens=3) | kw
    with pytest.raises(ValueError):
        cat_bytes_copied(tiny_model("tiny-llama").config, args["prompt_len"], args["new_tokens"],
                         torch.float32)


def test_naive_and_handwritten_agree_with_generate(prompt):
    """Both loops against HF's own greedy generate (no EOS stop, so every token is compared)."""
    model = tiny_model("tiny-qwen3")
    ids = prompt(9)
    ref = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                         max_new_tokens=12, eos_token_id=None)[:, ids.shape[1]:]
    assert torch.equal(decode_naive(model, ids, 12), ref)
    assert torch.equal(decode_handwritten(model, ids, 12), ref)

"""Issue 48, probe round 14: a NumPy count lost a speculative decode's tokens, a captured cache
taken by another strategy, caches and views that met the wrong layout or dtype with a raw error, and
settings refused, ignored or mislabelled."""

import numpy as np
import pytest
import torch

import kvlab
from kvlab.graph_safe_cache import GraphSafeError, GraphSafeStaticCache
from kvlab.lab.models import tiny_model
from kvlab.paged_cache import PagedCacheError


def test_every_strategy_decodes_under_inference_mode_and_a_model_made_there():
    """A decode wrapped in torch.inference_mode(), or of a model converted there, raised "Inference
    tensors do not track version counter" from the check of what a decoder froze."""
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.inference_mode():
        made_there = tiny_model("tiny-llama").half().float()
    for model in (tiny_model("tiny-llama"), made_there):
        want = kvlab.decode(model, ids, 5)
        for name, strategy in kvlab.STRATEGIES.items():
            if strategy.cuda_only or strategy.compiled or name == "static-graph":
                continue
            with torch.inference_mode():
                got = kvlab.decode(model, ids, 5, strategy=name)
            assert torch.equal(got, want), name
    with torch.inference_mode():  # a compiled strategy builds its fused copy there
        assert torch.equal(kvlab.decode(made_there, ids, 5, strategy="graph-safe-compiled"),
                           kvlab.decode(made_there, ids, 5))


def test_a_numpy_count_decodes_speculatively_and_leaves_the_decoder_right():
    """SpeculativeDecoder.generate(ids, np.int64(9)) raised a raw TypeError after decoding (the
    tokens lost) and left the counter one past, so decode_steps went on with wrong tokens."""
    from kvlab.speculative import SpeculativeDecoder

    model = tiny_model("tiny-llama")
    ids = torch.tensor([[5, 6, 7, 5, 6, 7, 5, 6]])
    reference = kvlab.decode(model, ids, 12)
    decoder = SpeculativeDecoder(model, 40, graph="emulate")
    assert torch.equal(decoder.generate(ids, np.int64(9)), reference[:, :9])
    assert torch.equal(decoder.decode_steps(3), reference[:, 9:])
    cache = GraphSafeStaticCache(config=model.config, max_cache_len=8)
    cache.set_position(np.int64(3))
    assert int(cache.cache_position) == 3


def test_a_cache_a_decoder_captured_is_refused_by_the_other_strategies(prompt):
    """static took a captured decoder's cache once reset (as its own message advises), and the
    decoder's decode_steps then continued the other prompt."""
    model = tiny_model("tiny-llama")
    a, b = prompt(4), prompt(3, seed=1)
    state = kvlab.STRATEGIES["graph-safe"].state(model, a, 5, max_cache_len=20, graph="emulate")
    decoder = state["decoder"]
    kvlab.decode(model, a, 5, strategy="graph-safe", **state)
    decoder.prefill(b)
    with torch.inference_mode():
        decoder.cache.reset()
    with pytest.raises(ValueError, match="bound to a GraphSafeDecoder's captured graphs"):
        kvlab.decode(model, a, 5, strategy="static", cache=decoder.cache)
    decoder.prefill(b)
    assert torch.equal(decoder.decode_steps(3), kvlab.decode(model, b, 4)[:, 1:])


def test_a_paged_pool_of_another_dtype_is_refused_by_name():
    from kvlab.paged_cache import PagedKVCache, model_mask, paged_mask, slots_of, table_row

    model = tiny_model("tiny-llama", dtype=torch.bfloat16)
    cache = PagedKVCache(model.config, num_blocks=4, block_size=4, max_blocks_per_request=2)
    with (pytest.raises(PagedCacheError, match="pool holds torch.float32.*dtype= and device="),
          torch.inference_mode(),
          cache.reading(torch.tensor([table_row([0], 2)]), torch.tensor([slots_of([0], 0, 3, 4)]))):
        model(torch.tensor([[1, 2, 3]]), past_key_values=cache,
              attention_mask=model_mask(paged_mask(torch.tensor([3]), 3, 8), model),
              position_ids=torch.arange(3)[None], use_cache=True)


def test_the_cache_view_says_a_paged_pool_is_not_one_sequences(prompt):
    from kvlab.cache_view import CacheRecorder, describe_layer, slot_norms

    model = tiny_model("tiny-llama")
    ids = prompt(5)
    state = kvlab.STRATEGIES["paged"].state(model, ids, 6)
    kvlab.decode(model, ids, 6, strategy="paged", **state)
    layer = state["batcher"].cache.layers[0]
    for look in (describe_layer, slot_norms, lambda layer: CacheRecorder(state["batcher"].cache)):
        with pytest.raises(ValueError, match=r"paged pool \[slots, kv_heads, head_dim\]"):
            look(layer)


def test_time_strategy_takes_what_kvlab_decode_takes(prompt):
    """A paged state (batcher=) was an unknown keyword; static's max_cache_len= was refused as a
    state to hold."""
    from kvlab.lab.measure import time_strategy

    model = tiny_model("tiny-llama")
    ids = prompt(4)
    want = kvlab.decode(model, ids, 16)
    state = kvlab.STRATEGIES["paged"].state(model, ids, 16)
    for strategy, kwargs in (("paged", state), ("static", {"max_cache_len": 30}),
                             ("graph-safe", {"cache": GraphSafeStaticCache(config=model.config,
                                                                           max_cache_len=24)})):
        timing = time_strategy(model, ids, 16, strategy=strategy, repeats=2, **kwargs)
        assert torch.equal(timing.tokens, want), strategy


def test_a_kernels_decoder_takes_the_prefill_bucket_its_message_names(prompt):
    model = tiny_model("tiny-llama")
    state = kvlab.STRATEGIES["graph-safe-kernels"].state(model, prompt(5), 10, max_cache_len=64,
                                                         graph="emulate")
    with pytest.raises(GraphSafeError, match="larger prefill_bucket"):
        kvlab.decode(model, prompt(9), 10, strategy="graph-safe-kernels", **state)
    state = kvlab.STRATEGIES["graph-safe-kernels"].state(model, prompt(5), 10, max_cache_len=64,
                                                         graph="emulate", prefill_bucket=32)
    for length in (5, 9, 32):
        assert torch.equal(kvlab.decode(model, prompt(length), 10, strategy="graph-safe-kernels",
                                        **state), kvlab.decode(model, prompt(length), 10))
    with pytest.raises(ValueError, match="pass one of the two"):
        kvlab.decode(model, prompt(5), 4, strategy="graph-safe-kernels", captured_prefill=False,
                     prefill_bucket=8)


def test_an_unfused_compiled_copy_refuses_an_attention_it_would_ignore(prompt):
    model = tiny_model("tiny-llama")
    ids = prompt(5)
    for attention in ("triton", "sdpa", "no-such-attention"):
        with pytest.raises(ValueError, match="fuse=False keeps the model's own attention"):
            kvlab.decode(model, ids, 4, strategy="graph-safe-compiled", fuse=False,
                         attention=attention)
    assert torch.equal(kvlab.decode(model, ids, 4, strategy="graph-safe-compiled", fuse=False),
                       kvlab.decode(model, ids, 4))


def test_a_decoder_built_by_hand_is_refused_under_another_strategys_name(prompt):
    from kvlab import GraphSafeDecoder
    from kvlab.kernels.decoder import kernels_decoder
    from kvlab.speculative import SpeculativeDecoder, speculative_decoder

    model = tiny_model("tiny-llama")
    ids = prompt(5)
    want = kvlab.decode(model, ids, 4)
    made = {"graph-safe": lambda: GraphSafeDecoder(model, 20, graph="emulate"),
            "graph-safe-speculative": lambda: SpeculativeDecoder(model, 20, graph="emulate"),
            "graph-safe-kernels": lambda: kernels_decoder(model, ids, 4, graph="emulate")}
    for own, build in made.items():
        assert torch.equal(kvlab.decode(model, ids, 4, strategy=own, decoder=build()), want)
        for other in made:
            if other != own:
                with pytest.raises(ValueError, match=f"decodes the '{own}' way.*'{other}'"):
                    kvlab.decode(model, ids, 4, strategy=other, decoder=build())
    with pytest.raises(ValueError, match="decodes the 'graph-safe-speculative' way"):
        kvlab.decode(model, ids, 4, strategy="graph-safe-speculative/kernels",
                     decoder=speculative_decoder(model, ids, 4, graph="emulate"))
    # an ablation's name takes its strategy's decoder: the caller picked its options
    kvlab.decode(model, ids, 4, strategy="graph-safe-kernels/row-gemv",
                 decoder=kernels_decoder(model, ids, 4, graph="emulate", tiles=False))


def test_the_paged_strategy_takes_graph_emulate_as_the_others_do(prompt):
    from kvlab.continuous_batching import ContinuousBatcher

    model = tiny_model("tiny-llama")
    ids = prompt(5)
    assert torch.equal(kvlab.decode(model, ids, 4, strategy="paged", graph="emulate"),
                       kvlab.decode(model, ids, 4))
    assert ContinuousBatcher(model, num_blocks=4, graph="emulate").emulate is True
    with pytest.raises(ValueError, match="pass one of the two"):
        ContinuousBatcher(model, num_blocks=4, graph="emulate", emulate=False)


@pytest.mark.parametrize("strategy", ["naive", "static", "graph-safe", "paged"])
def test_an_on_token_that_cannot_take_k_and_token_is_refused_before_any_work(strategy, prompt):
    model = tiny_model("tiny-llama")
    calls = []

    def one_argument(token):
        calls.append(token)

    with pytest.raises(TypeError, match=r"on_token\(k, token\).*one_argument\(token\)"):
        kvlab.decode(model, prompt(5), 4, strategy=strategy, on_token=one_argument)
    assert not calls
    seen = []
    kvlab.decode(model, prompt(5), 4, strategy=strategy, on_token=lambda *a: seen.append(a[0]))
    assert seen == [0, 1, 2, 3]

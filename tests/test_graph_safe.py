"""GraphSafeStaticCache and the "graph-safe" strategy: token-exact against "naive" on several
architectures, several prompts through one graph, batch > 1, and every bad input refused before a
tensor is touched.

The same tests run on a CUDA GPU with real CUDA graphs (``device`` is parametrized over what is
present); on CPU the capture is kvlab.graphs' emulation.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, StaticCache

import kvlab
from kvlab.graph_decoder import GraphSafeDecoder, decode_graph_safe, model_step
from kvlab.graph_safe_cache import GraphSafeError, GraphSafeStaticCache, capturing
from kvlab.graphs import capture
from kvlab.lab.measure import eager_vs_replay, step_op_counts
from kvlab.lab.models import TINY_COMMON, tiny_model

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU: run on Colab/GPU machine")
DEVICES = ["cpu"] + (["cuda"] if CUDA else [])
ARCHS = ["tiny-llama", "tiny-qwen3", "tiny-mistral", "tiny-qwen2", "tiny-gemma", "tiny-phi3"]
NEW = 12  # new tokens per prompt

_models: dict = {}


def model_on(name: str, device: str):
    """One fp32 tiny model per (architecture, device), shared by the tests that only read it."""
    if (name, device) not in _models:
        _models[name, device] = tiny_model(name).to(device)
    return _models[name, device]


def state(cache: GraphSafeStaticCache):
    """Everything a bad input must leave untouched: counter, addresses, and a copy of every
    buffer."""
    return int(cache.cache_position), cache.fingerprint(), [
        t.clone() for layer in cache.layers for t in (layer.keys, layer.values)]


def assert_unchanged(cache, before) -> None:
    counter, fingerprint, buffers = before
    assert int(cache.cache_position) == counter
    assert cache.fingerprint() == fingerprint
    now = [t for layer in cache.layers for t in (layer.keys, layer.values)]
    assert all(torch.equal(a, b) for a, b in zip(buffers, now, strict=True))


# ------------------------------------------------------------------------------ token-exact, many
# shapes


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch", ARCHS)
def test_several_prompts_through_one_graph_match_naive(arch, device, prompt):
    model = model_on(arch, device)
    decoder = GraphSafeDecoder(model, max_cache_len=48)
    graph = None
    for i, length in enumerate((5, 17, 2, 30)):
        ids = prompt(length, seed=i, device=device)
        expected = kvlab.decode(model, ids, NEW, strategy="naive")
        got = decoder.generate(ids, NEW)
        assert torch.equal(got, expected), f"{arch} prompt {length}: {got} != {expected}"
        graph = graph or decoder.step_graph
        assert decoder.step_graph is graph  # captured once, replayed for every prompt
    assert graph.emulated == (device == "cpu")
    assert graph.replays == 4 * (NEW - 1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch", ["tiny-llama", "tiny-qwen3", "tiny-gemma", "tiny-phi3"])
def test_one_padded_prefill_graph_serves_every_length_up_to_the_bucket(arch, device, prompt):
    model = model_on(arch, device)
    decoder = GraphSafeDecoder(model, max_cache_len=48, prefill_bucket=16)
    for i, length in enumerate((16, 1, 7, 12)):
        ids = prompt(length, seed=i, device=device)
        assert torch.equal(decoder.generate(ids, NEW), kvlab.decode(model, ids, NEW)), (
            f"{arch} prompt {length}")
    assert decoder.prefill_graph.replays == 4
    with pytest.raises(GraphSafeError, match="longer than prefill_bucket"):
        decoder.generate(prompt(17, device=device), 2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch", ["tiny-llama", "tiny-qwen3"])
def test_batch_above_one(arch, device, prompt):
    model = model_on(arch, device)
    decoder = GraphSafeDecoder(model, max_cache_len=48, batch=3, prefill_bucket=16)
    for i, length in enumerate((9, 4)):
        ids = prompt(length, batch=3, seed=i, device=device)
        expected = kvlab.decode(model, ids, NEW)
        assert not torch.equal(expected[0], expected[1])  # the rows really differ
        assert torch.equal(decoder.generate(ids, NEW), expected)


@pytest.mark.parametrize("device", DEVICES)
def test_eager_step_matches_naive(device, prompt):
    model = model_on("tiny-mistral", device)
    ids = prompt(11, device=device)
    decoder = GraphSafeDecoder(model, max_cache_len=32, graph=False)
    assert torch.equal(decoder.generate(ids, NEW), kvlab.decode(model, ids, NEW))
    assert decoder.step_graph is None and "eager" in decoder.describe()


@pytest.mark.parametrize("device", DEVICES)
def test_a_held_decoder_serves_several_prompts_and_calls_on_token(device, prompt):
    model = tiny_model("tiny-qwen2").to(device)
    seen = []
    a, b = prompt(6, device=device), prompt(13, seed=1, device=device)
    decoder = GraphSafeDecoder(model, 32)
    got_a = kvlab.decode(model, a, NEW, strategy="graph-safe", decoder=decoder,
                         on_token=lambda step, ids: seen.append((step, ids.clone())))
    assert torch.equal(got_a, kvlab.decode(model, a, NEW))
    assert ([s for s, _ in seen] == list(range(NEW))
            and torch.equal(torch.cat([t for _, t in seen], 1), got_a))
    assert torch.equal(kvlab.decode(model, b, NEW, strategy="graph-safe", decoder=decoder),
                       kvlab.decode(model, b, NEW))
    assert decoder.step_graph.replays == 2 * (NEW - 1)  # one graph served both calls
    # one of its own
    assert torch.equal(kvlab.decode(model, b, NEW, strategy="graph-safe"),
                       kvlab.decode(model, b, NEW))
    own = GraphSafeDecoder(model, 40)
    assert torch.equal(decode_graph_safe(model, b, 5, decoder=own), kvlab.decode(model, b, 5))
    fresh = GraphSafeStaticCache(config=model.config, max_cache_len=40)
    assert torch.equal(decode_graph_safe(model, b, 5, cache=fresh), kvlab.decode(model, b, 5))


# ------------------------------------------------------------------------------ graphs freed at the
# right moment


def kernels_decoder(model):
    from kvlab.kernels.decoder import kernels_decoder

    return kernels_decoder(model, torch.ones(1, 9, dtype=torch.long), 20, max_cache_len=40, steps=4)


DECODER_BUILDS = {"one-step": lambda model: GraphSafeDecoder(model, 40),
                  "bucketed-16-step": lambda model: GraphSafeDecoder(model, 40, prefill_bucket=16,
                                                                     steps=16),
                  "kernels": kernels_decoder}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("build", DECODER_BUILDS.values(), ids=DECODER_BUILDS.keys())
def test_a_dropped_decoder_is_freed_at_once_with_its_graphs(device, build, prompt):
    """No reference cycle holds a decoder's graphs: `del` frees them, whenever the garbage collector
    would run."""
    model = model_on("tiny-llama", device)
    gc.collect()
    gc.disable()
    try:
        decoder = build(model)
        decoder.generate(prompt(9, device=device), 20)
        graphs = [*decoder.graphs.values()] + (
            [decoder.prefill_graph] if decoder.prefill_graph else [])
        refs = [weakref.ref(x) for x in (decoder, decoder.cache, *graphs)]
        assert len(refs) >= 3
        del decoder, graphs
        assert [r() for r in refs] == [None] * len(refs)
    finally:
        gc.enable()


@pytest.mark.parametrize("device", DEVICES)
def test_a_dropped_decoder_collected_inside_the_next_capture_spoils_nothing(device, prompt):
    """The H200's failure made deterministic: a collection inside the next decoder's capture. A
    dropped decoder whose graphs sat in a reference cycle was freed there and CUDA invalidated the
    capture ('operation failed due to a previous error during capture'); now nothing is left for the
    collector to free."""
    model = model_on("tiny-llama", device)
    ids = prompt(9, device=device)
    expected = kvlab.decode(model, ids, NEW)

    def collect_inside_a_capture(module, args):
        if capturing():
            gc.collect()

    gc.collect()
    handle = model.register_forward_pre_hook(collect_inside_a_capture)
    try:
        dropped = GraphSafeDecoder(model, 40)
        dropped.generate(ids, 4)
        del dropped
        assert torch.equal(GraphSafeDecoder(model, 40).generate(ids, NEW), expected)
    finally:
        handle.remove()


@needs_cuda
def test_real_graph_and_emulation_give_the_same_tokens(prompt):
    model = model_on("tiny-llama", "cuda")
    ids = prompt(10, device="cuda")
    real = GraphSafeDecoder(model, 40, prefill_bucket=16)
    emulated = GraphSafeDecoder(model, 40, prefill_bucket=16, graph="emulate")
    assert torch.equal(real.generate(ids, NEW), emulated.generate(ids, NEW))
    assert not real.step_graph.emulated and emulated.step_graph.emulated


@needs_cuda
def test_compiled_step_captured_by_kvlab_matches_naive(prompt):
    model = model_on("tiny-llama", "cuda")
    decoder = GraphSafeDecoder(model, 40,
                               step=torch.compile(model_step, mode="default", fullgraph=True))
    for length in (7, 3):
        ids = prompt(length, device="cuda")
        assert torch.equal(decoder.generate(ids, NEW), kvlab.decode(model, ids, NEW))
    assert "compiled" in decoder.describe()


# ------------------------------------------------------------------------------ the three overrides


def test_update_writes_only_the_valid_window_and_counts_it(prompt):
    model = model_on("tiny-llama", "cpu")
    ids = prompt(16)
    vanilla = StaticCache(config=model.config, max_cache_len=32)
    safe = GraphSafeStaticCache(config=model.config, max_cache_len=32)
    with torch.inference_mode():
        model(ids, cache=vanilla)
        with safe.valid_window(torch.tensor(5)):
            model(ids, cache=safe)
    # vanilla: the 11 padded rows are written and counted
    assert int(vanilla.get_seq_length()) == 16
    assert int(safe.cache_position) == 5  # graph-safe: only the 5 valid ones
    keys = safe.layers[0].keys  # [batch, kv_heads, 33, head_dim]; slot 32 is the trash slot
    assert keys.shape[2] == 33
    assert (keys[:, :, :5].abs().sum() > 0 and keys[:, :, 5:32].abs().sum() == 0
            and keys[:, :, 32].abs().sum() > 0)
    assert torch.equal(keys[:, :, :5], vanilla.layers[0].keys[:, :, :5])


def test_reset_is_in_place_and_a_reset_to_max_cache_len_is_out_of_range(prompt):
    model = model_on("tiny-llama", "cpu")
    cache = GraphSafeStaticCache(config=model.config, max_cache_len=24)
    with torch.inference_mode():
        model(prompt(9), cache=cache)
        before = cache.fingerprint()
        counter = cache.cache_position
        cache.reset()
    assert cache.fingerprint() == before and cache.cache_position is counter and int(counter) == 0
    assert all(layer.keys.abs().sum() == 0 and layer.values.abs().sum() == 0
               for layer in cache.layers)
    # a reset that sets every counter to max_cache_len, on a vanilla 5.24 StaticCache: the next
    # write targets slot max_cache_len, which does not exist
    vanilla = StaticCache(config=model.config, max_cache_len=24)
    with torch.inference_mode():
        model(prompt(9), cache=vanilla)
        for layer in vanilla.layers:
            layer.reset()
            layer.cumulative_length.fill_(layer.max_cache_len)
        with pytest.raises((IndexError, RuntimeError), match="out of (range|bounds)"):
            model(prompt(1), cache=vanilla)


def test_one_live_counter_shared_by_every_layer(prompt):
    model = model_on("tiny-qwen3", "cpu")
    cache = GraphSafeStaticCache(config=model.config, max_cache_len=24)
    assert int(cache.cache_position) == 0 and cache.get_seq_length() == 0
    with torch.inference_mode():
        model(prompt(7), cache=cache)
    counter = cache.cache_position
    assert all(layer.cumulative_length is counter for layer in cache.layers)
    assert cache.get_seq_length() is counter and int(counter) == 7
    cache.set_position(3)
    assert cache.cache_position is counter and int(counter) == 3
    with pytest.raises(ValueError, match="position must be"):
        cache.set_position(25)


# lesson 05 counts on the student's device: CUDA picks other SDPA kernels
@pytest.mark.parametrize("device", DEVICES)
def test_shared_counter_removes_work_per_step(prompt, device):
    """Counted on the decode step: vanilla computes positions and advances a counter in every layer,
    graph-safe computes the positions once and advances its one counter once."""
    config = LlamaConfig(**{**TINY_COMMON, "num_hidden_layers": 4})
    model = AutoModelForCausalLM.from_config(config).eval().to(device)
    counts = {}
    for cls in (StaticCache, GraphSafeStaticCache):
        cache = cls(config=model.config, max_cache_len=24)
        with torch.inference_mode():
            model(prompt(5, device=device), cache=cache)
        before = int(cache.get_seq_length())
        counts[cls] = step_op_counts(model, cache, prompt(1, device=device))
        assert int(cache.get_seq_length()) == before  # counting ran the step, then undid it
    vanilla, safe, layers = (counts[StaticCache], counts[GraphSafeStaticCache],
                             model.config.num_hidden_layers)
    assert vanilla["add_"] == layers and safe["add_"] == 1
    assert vanilla["index_copy_"] == safe["index_copy_"] == 2 * layers
    assert vanilla["arange"] - safe["arange"] == layers - 1
    assert sum(safe.values()) < sum(vanilla.values())


# ------------------------------------------------------------------------------ bad input, refused
# first


@pytest.mark.parametrize("device", DEVICES)
def test_decoding_past_max_cache_len_is_refused_before_any_write(device, prompt):
    model = model_on("tiny-llama", device)
    decoder = GraphSafeDecoder(model, max_cache_len=24)
    decoder.generate(prompt(5, device=device), 4)
    before = state(decoder.cache)
    with pytest.raises(GraphSafeError, match="do not fit in max_cache_len=24"):
        decoder.generate(prompt(10, device=device), 16)  # 10 + 16 - 1 = 25 > 24
    assert_unchanged(decoder.cache, before)
    decoder.generate(prompt(10, device=device), 15)  # exactly full is fine
    assert int(decoder.cache.cache_position) == 24


def test_eager_forward_past_the_end_is_refused_before_any_write(prompt):
    model = model_on("tiny-llama", "cpu")
    cache = GraphSafeStaticCache(config=model.config, max_cache_len=10)
    with torch.inference_mode():
        model(prompt(8), cache=cache)
        before = state(cache)
        with pytest.raises(GraphSafeError, match="8 of 10 tokens and 3 more do not fit"):
            model(prompt(3), cache=cache)
    assert_unchanged(cache, before)


@pytest.mark.parametrize("device", DEVICES)
def test_capture_before_the_cache_is_initialized_is_refused(device, prompt):
    model = model_on("tiny-llama", device)
    decoder = GraphSafeDecoder(model, max_cache_len=24)
    with pytest.raises(GraphSafeError, match="before the cache is initialized"):
        decoder.capture_graph(decoder.one_step, decoder.token)
    assert not decoder.cache.is_initialized
    # a hand-made capture of a step over an empty cache: refused inside lazy_initialization, nothing
    # allocated
    cache = GraphSafeStaticCache(config=model.config, max_cache_len=24)
    ids = prompt(1, device=device)
    with pytest.raises(Exception, match="not initialized yet and a step is being captured"):
        capture(lambda t: model(t, cache=cache).logits, ids, warmup=0)
    assert not cache.is_initialized and cache.layers[0].keys is None


@pytest.mark.parametrize("device", DEVICES)
def test_replay_after_the_cache_was_reallocated_is_refused(device, prompt):
    model = model_on("tiny-llama", device)
    decoder = GraphSafeDecoder(model, max_cache_len=24)
    decoder.generate(prompt(5, device=device), 4)
    cache = decoder.cache
    with pytest.raises(GraphSafeError, match="bound to a captured graph"):
        cache.layers[0].lazy_initialization(cache.layers[0].keys, cache.layers[0].values)
    with pytest.raises(GraphSafeError, match="bound to a captured graph"):
        cache.early_initialization(1, 2, 16, torch.float32, torch.device(device))
    layer = cache.layers[1]
    layer.keys = layer.keys.clone()  # rebinding: the graph would keep writing the old buffer
    before = state(cache)
    with pytest.raises(GraphSafeError, match="reallocated or rebound"):
        decoder.generate(prompt(5, device=device), 4)
    assert_unchanged(cache, before)


@pytest.mark.parametrize("device", DEVICES)
def test_batch_size_different_from_capture_is_refused(device, prompt):
    model = model_on("tiny-llama", device)
    decoder = GraphSafeDecoder(model, max_cache_len=24)
    decoder.generate(prompt(5, device=device), 4)
    before = state(decoder.cache)
    with pytest.raises(GraphSafeError, match="built .* for batch 1, got batch 2"):
        decoder.generate(prompt(5, batch=2, device=device), 4)
    assert_unchanged(decoder.cache, before)
    with torch.inference_mode(), pytest.raises(GraphSafeError, match="built for batch 1"):
        # straight through the model, eagerly
        model(prompt(2, batch=2, device=device), cache=decoder.cache)
    assert_unchanged(decoder.cache, before)


@pytest.mark.parametrize("device", DEVICES)
def test_dtype_different_from_capture_is_refused(device, prompt):
    model = tiny_model("tiny-llama").to(device)
    decoder = GraphSafeDecoder(model, max_cache_len=24)
    decoder.generate(prompt(5, device=device), 4)
    before = state(decoder.cache)
    model.to(torch.float64)
    with pytest.raises(GraphSafeError, match="the model is now torch.float64"):
        decoder.generate(prompt(5, device=device), 4)
    with torch.inference_mode(), pytest.raises(GraphSafeError,
                                               match="torch.float32 .* but got .* torch.float64"):
        model(prompt(2, device=device), cache=decoder.cache)
    assert_unchanged(decoder.cache, before)


def test_other_bad_arguments(prompt):
    model = model_on("tiny-llama", "cpu")
    with pytest.raises(ValueError, match="full-attention layers only"):
        GraphSafeStaticCache(
            config=tiny_model("tiny-mistral").config.__class__(sliding_window=8,
                                                               num_hidden_layers=2),
            max_cache_len=8)
    with pytest.raises(ValueError, match="max_cache_len must be a positive int"):
        GraphSafeStaticCache(config=model.config, max_cache_len=0)
    with pytest.raises(ValueError, match="batch must be a positive int"):
        GraphSafeDecoder(model, 16, batch=0)
    with pytest.raises(ValueError, match="prefill_bucket must be in"):
        GraphSafeDecoder(model, 16, prefill_bucket=17)
    if CUDA:
        from kvlab.compiled_step import compiled_decoder

        with pytest.raises(ValueError, match="cannot trace a compiled step"):
            compiled_decoder(model_on("tiny-llama", "cuda"), prompt(3, device="cuda"), 2,
                             graph="emulate")
    with pytest.raises(ValueError, match="graph must be True, False or 'emulate'"):
        GraphSafeDecoder(model, 16, graph="emulated")
    with pytest.raises(TypeError, match="GraphSafeStaticCache"):
        decode_graph_safe(model, prompt(3), 2,
                          cache=StaticCache(config=model.config, max_cache_len=8))
    with pytest.raises(GraphSafeError, match="offloaded"):
        GraphSafeStaticCache(config=model.config, max_cache_len=8).layers[0].offload()
    assert not capturing()


def test_cache_made_in_inference_mode_can_be_reset_outside_it(prompt):
    model = model_on("tiny-llama", "cpu")
    with torch.inference_mode():
        cache = GraphSafeStaticCache(config=model.config, max_cache_len=16)
        model(prompt(4), cache=cache)
    cache.set_position(2)
    cache.reset()
    assert int(cache.cache_position) == 0 and not cache.layers[0].keys.is_inference()


@pytest.mark.parametrize("device", DEVICES)
def test_capture_leaves_no_trace(device, prompt):
    """After capture the counter, the token and every slot past the prompt are as before the warm-up
    calls."""
    model = model_on("tiny-qwen3", device)
    decoder = GraphSafeDecoder(model, max_cache_len=32)
    ids = prompt(6, device=device)
    decoder.prefill(ids)
    before = state(decoder.cache)
    token = decoder.token.clone()
    with torch.inference_mode():
        decoder.graphs[1] = decoder.capture_graph(decoder.multi_step(1), decoder.token)
    assert_unchanged(decoder.cache, before)
    assert torch.equal(decoder.token, token)


def test_a_step_past_the_end_and_a_position_past_the_cache_are_refused(prompt):
    model = tiny_model("tiny-llama")
    decoder = GraphSafeDecoder(model, max_cache_len=8)
    decoder.generate(prompt(5), 2)  # the cache holds 6 tokens, the next token is in decoder.token
    decoder.step()
    decoder.step()  # 8 of 8 slots
    with pytest.raises(GraphSafeError,
                       match="the cache holds 8 of 8 tokens: 1 more steps would decode garbage"):
        decoder.step()
    cache = decoder.cache
    for bad, error in ((9, ValueError), (-1, ValueError), (torch.tensor(9), ValueError),
                       (2.0, TypeError),
                       (True, TypeError), (torch.tensor([1, 2]), ValueError),
                       (torch.tensor(1.5), ValueError)):
        with pytest.raises(error, match="position must be"):
            cache.set_position(bad)
    cache.set_position(torch.tensor(3))
    assert int(cache.cache_position) == 3


def test_eager_vs_replay_runs_outside_inference_mode(prompt):
    # lesson 05 calls it like this
    live = eager_vs_replay(tiny_model("tiny-llama"), prompt(5), steps=2, rounds=1)
    assert live["eager_ms_per_token"] > 0 and live["replay_ms_per_token"] > 0


def test_decoder_buffers_and_caches_cannot_be_shared_or_rebound(prompt):
    model = model_on("tiny-llama", "cpu")
    cache = GraphSafeStaticCache(config=model.config, max_cache_len=24)
    # alive while it is referenced (no cycle keeps it longer)
    owner = GraphSafeDecoder(model, cache)
    with pytest.raises(GraphSafeError, match="already belongs to another GraphSafeDecoder"):
        GraphSafeDecoder(model, cache)
    del owner
    decoder = GraphSafeDecoder(model, 24)
    with pytest.raises(GraphSafeError, match="read decoder.token by address"):
        decoder.token = torch.zeros(1, 1, dtype=torch.long)
    first = decoder.prefill(prompt(5))
    kept = first.clone()
    decoder.step()
    # prefill's answer is a copy, not the static buffer the next step overwrites
    assert torch.equal(first, kept)


def test_values_and_valid_windows_are_checked_before_any_write(prompt):
    model = model_on("tiny-llama", "cpu")
    cache = GraphSafeStaticCache(config=model.config, max_cache_len=16)
    with torch.inference_mode():
        model(prompt(4), cache=cache)
    before = state(cache)
    k = torch.zeros(1, model.config.num_key_value_heads, 2, model.config.head_dim)
    for v, says in [(k.double(), "values of shape"),
                    (k[:, :, :1], "keys hold 2 tokens but values 1"),
                    (k[..., :8], "values of shape")]:
        with torch.inference_mode(), pytest.raises(GraphSafeError, match=says):
            cache.update(k, v, 0)
    for valid, says in [(torch.tensor(-2), "must be in \\[0, 2\\]"),
                        (torch.tensor(6), "must be in \\[0, 2\\]")]:
        with torch.inference_mode(), cache.valid_window(valid), pytest.raises(
            GraphSafeError, match=says):
            cache.update(k, k, 0)
    with pytest.raises(GraphSafeError, match="0-dim integer tensor"):
        with cache.valid_window(torch.tensor(2.5)):
            pass
    assert_unchanged(cache, before)


def test_a_decoder_of_another_model_and_bad_layer_indices_are_refused(prompt):
    model, other = model_on("tiny-llama", "cpu"), tiny_model("tiny-llama", seed=3)
    with pytest.raises(GraphSafeError, match="built for another model"):
        decode_graph_safe(model, prompt(4), 3, decoder=GraphSafeDecoder(other, 16))
    cache = GraphSafeStaticCache(config=model.config, max_cache_len=8)
    k = torch.zeros(1, model.config.num_key_value_heads, 1, model.config.head_dim)
    with torch.inference_mode(), pytest.raises(GraphSafeError,
                                               match="is not a layer of this cache"):
        cache.update(k, k, 5)
    with pytest.raises(ValueError, match="prefill_bucket must be in"):
        GraphSafeDecoder(model, 16, prefill_bucket=2.5)

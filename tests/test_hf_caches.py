"""kvlab.hf_caches and kvlab.cache_view: HF caches in the course's loop, token-exact against the
naive loop."""

import matplotlib
import pytest
import torch
from transformers import DynamicCache

from kvlab.cache_view import (
    CacheRecorder,
    counters,
    describe_layer,
    slot_norms,
)
from kvlab.failures import decode_static_graph, room_guard
from kvlab.graphs import ReplayError
from kvlab.hf_caches import (
    check_room,
    decode_compiled,
    decode_generate,
    decode_static,
    make_static_cache,
)
from kvlab.lab.models import tiny_model
from kvlab.lab.plots import plot_cache_heatmaps, plot_memory_per_step
from kvlab.strategies import decode

matplotlib.use("Agg")


@pytest.fixture(scope="module")
def llama():
    return tiny_model("tiny-llama")


@pytest.mark.parametrize("arch", ["tiny-llama", "tiny-qwen3", "tiny-mistral", "tiny-gemma"])
@pytest.mark.parametrize("strategy", ["dynamic", "static"])
def test_hf_cache_strategies_are_token_exact_against_naive(arch, strategy, prompt):
    model = tiny_model(arch)
    ids = prompt(7, batch=2)
    assert torch.equal(decode(model, ids, 20, strategy=strategy),
                       decode(model, ids, 20, strategy="naive"))


def test_static_graph_without_warmup_is_exact_and_with_warmup_matches_eager_replay(llama, prompt):
    ids = prompt(9)
    naive = decode(llama, ids, 24, strategy="naive")
    keep = {}
    assert torch.equal(decode(llama, ids, 24, strategy="static-graph", warmup=0, keep=keep), naive)
    # the model is on the CPU: emulated
    assert keep["graph"].emulated and keep["graph"].replays == 23
    # warm-up calls advance the counters: the same calls made eagerly give the same (wrong) tokens
    graph = decode(llama, ids, 24, strategy="static-graph", warmup=3)
    eager = decode(llama, ids, 24, strategy="static-graph", warmup=3, runner="eager")
    assert torch.equal(graph, eager)


def test_static_graph_warmup_advances_every_counter(llama, prompt):
    ids = prompt(5)
    keep = {}
    decode_static_graph(llama, ids, 4, warmup=3, keep=keep)
    # prompt 5 + 3 warm-up writes + 3 replays
    assert counters(keep["cache"]) == [11] * llama.config.num_hidden_layers


def test_static_cache_is_preallocated_and_written_in_place(llama, prompt):
    ids = prompt(6)
    cache = make_static_cache(llama, 32)
    rec = CacheRecorder(cache, layers=(0, 1))
    decode_static(llama, ids, 5, cache=cache, on_token=rec)
    info = describe_layer(cache.layers[0])
    assert info["keys.shape"] == (1, 2, 32, 16) and info["cumulative_length"] == 6 + 4
    assert info["slots written (nonzero keys)"] == 10
    assert rec.matrix.shape == (5, 32) and rec.matrix_of(1).shape == (5, 32)
    assert [int((row > 0).sum()) for row in rec.matrix] == [6, 7, 8, 9, 10]
    assert rec.token_ids.shape == (1, 5)
    assert describe_layer(make_static_cache(llama, 8).layers[0])["initialized"] is False
    assert slot_norms(cache.layers[0]).shape == (32,)


def test_bad_sizes_are_refused(llama, prompt):
    with pytest.raises(ValueError, match="max_cache_len"):
        make_static_cache(llama, 0)
    cache = make_static_cache(llama, 8)
    with pytest.raises(ValueError, match="needs 10 cache slots"):
        check_room(cache, 6, 5)
    with pytest.raises(ValueError, match="max_cache_len >= 10"):
        decode_static(llama, prompt(6), 5, cache=cache)


def test_room_guard_stops_a_write_past_the_end(llama, prompt):
    cache = make_static_cache(llama, 8)
    decode_static(llama, prompt(7), 2, cache=cache)  # 8 slots now full
    with pytest.raises(ReplayError, match="device-side assert"):
        room_guard(cache)()


def test_generate_static_and_dynamic_match_naive(llama, prompt):
    ids = prompt(9)
    naive = decode(llama, ids, 12, strategy="naive")
    for impl in ("dynamic", "static"):
        assert torch.equal(decode_generate(llama, ids, 12, cache_implementation=impl), naive)


def test_compiled_step_matches_naive(llama, prompt):
    ids = prompt(9)
    assert torch.equal(decode_compiled(llama, ids, 8, mode="default"),
                       decode(llama, ids, 8, strategy="naive"))


def test_plots_draw(llama, prompt):
    cache = make_static_cache(llama, 16)
    rec = CacheRecorder(cache)
    decode_static(llama, prompt(4), 4, cache=cache, on_token=rec)
    fig, axes = plot_cache_heatmaps({"a": rec.matrix, "b": rec.matrix}, title="t",
                                    frontier=[4, 5, 6, 7])
    assert len(axes) == 2
    fig2, ax = plot_memory_per_step({"x": [1024, 2048]}, title="m")
    assert len(ax.lines) == 1


@pytest.mark.parametrize("strategy", ["dynamic", "static", "static-graph"])
def test_a_used_cache_is_refused_and_a_reset_one_is_exact(llama, strategy, prompt):
    ids, other = prompt(5), prompt(3, seed=1)
    cache = DynamicCache(config=llama.config) if strategy == "dynamic" else make_static_cache(
        llama, 32)
    kwargs = {"warmup": 0} if strategy == "static-graph" else {}
    decode(llama, other, 4, strategy=strategy, cache=cache, **kwargs)
    # 3 prompt + 3 fed back
    with pytest.raises(ValueError, match="already holds 6 tokens.*cache.reset"):
        decode(llama, ids, 10, strategy=strategy, cache=cache, **kwargs)
    with torch.inference_mode():  # as the error says
        cache.reset()
    assert torch.equal(decode(llama, ids, 10, strategy=strategy, cache=cache, **kwargs),
                       decode(llama, ids, 10))


def test_a_cache_of_another_model_or_class_is_refused_before_any_write(llama, prompt):
    from transformers import StaticCache

    other = tiny_model("tiny-llama").to(torch.bfloat16)  # the same shapes in another dtype
    ids = prompt(5)
    with pytest.raises(TypeError, match="DynamicCache"):
        decode(llama, ids, 3, strategy="dynamic",
               cache=StaticCache(config=llama.config, max_cache_len=16))
    with pytest.raises(TypeError, match="StaticCache"):
        decode(llama, ids, 3, strategy="static", cache=DynamicCache(config=llama.config))
    deeper = llama.config.__class__(
        **(llama.config.to_dict() | {"num_hidden_layers": llama.config.num_hidden_layers + 1}))
    with pytest.raises(ValueError, match="layers but the model has"):
        decode(llama, ids, 3, strategy="dynamic", cache=DynamicCache(config=deeper))
    cache = StaticCache(config=other.config, max_cache_len=16)
    with torch.inference_mode():
        other(ids, cache=cache)
        cache.reset()  # empty, but its buffers are shaped for the other model
    with pytest.raises(ValueError,
                       match="torch.bfloat16 on cpu; this model needs 2, 16, torch.float32"):
        decode(llama, ids, 3, strategy="static", cache=cache)


def test_counted_compile_counts_a_recompile_per_python_int_and_none_for_a_tensor():
    from kvlab.hf_caches import counted_compile

    torch.compiler.reset()
    buf_t, buf_i = torch.zeros(8), torch.zeros(8)
    pos_t, state = torch.zeros((), dtype=torch.long), {"pos": 0}

    def at_tensor(x):
        buf_t.index_copy_(0, pos_t.reshape(1), x)
        pos_t.add_(1)
        return buf_t.sum()

    def at_int(x):
        buf_i[state["pos"]] = x[0]
        return buf_i.sum()

    a = counted_compile(at_tensor, backend="eager", fullgraph=True)
    b = counted_compile(at_int, backend="eager", fullgraph=True)
    for i in range(4):
        a(torch.tensor([i + 1.0]))
        b(torch.tensor([i + 1.0]))
        state["pos"] += 1
    # the int costs recompiles (one per value for a global, as lesson 03 shows; from a closure, as
    # here, Dynamo may make it symbolic after the first recompile): a recompile either way, never a
    # frozen value
    assert a.compiles == 1 and a.calls == 4 and b.compiles >= 2
    # recompiled, never stale
    assert buf_t.tolist()[:5] == buf_i.tolist()[:5] == [1.0, 2.0, 3.0, 4.0, 0.0]


def test_a_static_cache_kvlab_filled_can_be_reset_outside_inference_mode(llama, prompt):
    from transformers import StaticCache

    cache = StaticCache(config=llama.config, max_cache_len=16)
    ids = prompt(5)
    first = decode(llama, ids, 3, strategy="static", cache=cache)
    cache.reset()  # no "inplace update to inference tensor" error
    assert torch.equal(decode(llama, ids, 3, strategy="static", cache=cache), first)


def test_a_sliding_window_static_cache_needs_only_the_window():
    """transformers 5.24's sliding-window StaticCache layers hold min(max_cache_len, window) slots
    and roll: any max_cache_len >= min(prompt + new - 1, window) is token-exact, a smaller one is
    refused saying so."""
    import transformers

    from kvlab.lab.models import TINY_COMMON

    config = transformers.MistralConfig(**{**TINY_COMMON, "sliding_window": 8})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(1, 200, (1, 10), generator=torch.Generator().manual_seed(0))
    want = decode(model, ids, 4)  # 10 + 4 - 1 = 13 positions, more than the window
    for length in (None, 8, 9, 13, 32):
        kw = {} if length is None else {"max_cache_len": length}
        assert torch.equal(decode(model, ids, 4, strategy="static", **kw), want), length
    with pytest.raises(ValueError,
                       match=r"window 8\) keep the last .* max_cache_len >= min\(13, 8\) = 8"
                             r".* hold only 7"):
        decode(model, ids, 4, strategy="static", max_cache_len=7)
    short = torch.randint(1, 200, (1, 4), generator=torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match=r"min\(6, 8\) = 6"):
        decode(model, short, 3, strategy="static", max_cache_len=5)
    assert torch.equal(decode(model, short, 3, strategy="static", max_cache_len=6),
                       decode(model, short, 3))

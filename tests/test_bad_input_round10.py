"""Issue 48, probe round 10: a cache built from another config (sliding window or full attention)
than the model's, a model with dynamic RoPE under the graph strategies, a prefill_bucket past the
cache a call sized, the state of a strategy that builds none, and the bench's quick-mode record."""

import pytest
import torch
import transformers

import kvlab
from kvlab.graph_safe_cache import GraphSafeError
from kvlab.lab.models import TINY_COMMON, tiny_model

SLIDING = transformers.MistralConfig(**TINY_COMMON, sliding_window=4)


def _cache(strategy, config):
    if strategy == "dynamic":
        return transformers.DynamicCache(config=config)
    return transformers.StaticCache(config=config, max_cache_len=64)


@pytest.mark.parametrize("strategy", ["dynamic", "static"])
def test_a_sliding_window_cache_is_refused_for_a_full_attention_model(strategy, prompt):
    """A DynamicCache or StaticCache built from a sliding-window config was accepted for a
    full-attention Llama: its layers dropped all but the last 4 tokens, and the tokens differed
    from "naive" from the second one, no error. The door checked the cache's class, layer count and
    buffer shapes, not each layer's kind."""
    model = tiny_model("tiny-llama")
    ids = prompt(6, batch=2)
    with pytest.raises(ValueError, match=r"layer 0 keeps a sliding window of 4 tokens .* full "
                                         r"attention.*config=model.config"):
        kvlab.decode(model, ids, 12, strategy=strategy, cache=_cache(strategy, SLIDING))


def test_a_narrower_window_is_refused_for_a_sliding_model_and_a_wider_one_decodes(prompt):
    """A DynamicCache of window 4 for a model of window 8 was accepted and dropped tokens the model
    attends to: wrong tokens past 4 positions, no error. A cache that keeps more than the model
    reads (full attention, a wider window) holds only what the mask leaves out, and decodes as
    "naive" does, as does one built from the model's own config."""
    model = transformers.MistralForCausalLM(
        transformers.MistralConfig(**TINY_COMMON, sliding_window=8)).eval()
    ids = prompt(6, batch=2)
    with pytest.raises(ValueError, match="window of 4 tokens .* sliding window of 8"):
        kvlab.decode(model, ids, 40, strategy="dynamic", cache=_cache("dynamic", SLIDING))
    naive = kvlab.decode(model, ids, 40, strategy="naive")
    wider = transformers.MistralConfig(**TINY_COMMON, sliding_window=16)
    for config in (tiny_model("tiny-llama").config, wider, model.config):
        for strategy in ("dynamic", "static"):
            out = kvlab.decode(model, ids, 40, strategy=strategy, cache=_cache(strategy, config))
            assert torch.equal(out, naive), (config.model_type, strategy)


def _dynamic_rope_llama():
    config = transformers.LlamaConfig(**TINY_COMMON,
                                      rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    return transformers.LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("strategy,options", [
    ("graph-safe", {}), ("graph-safe", {"graph": "emulate"}), ("graph-safe-speculative", {}),
    ("graph-safe-speculative", {"graph": "emulate"}), ("paged", {}),
])
def test_a_dynamic_rope_is_refused_by_the_graph_strategies_at_the_door(strategy, options, prompt):
    """A Llama with dynamic RoPE under a captured strategy failed mid-capture with
    "Tensor.__bool__() ... move the check outside the captured function": the `if` is inside
    transformers' RoPE, so
    the advice could not be followed. It is refused before anything is captured, naming the
    strategies that run it; with graph=False (nothing captured) it decodes as "naive" does."""
    from kvlab.graphs import CaptureError

    model, ids = _dynamic_rope_llama(), prompt(6)
    with pytest.raises(CaptureError, match=r"'dynamic' RoPE .* strategy='static', 'dynamic' or "
                                           r"'naive', or pass graph=False") as caught:
        kvlab.decode(model, ids, 8, strategy=strategy, **options)
    assert "__bool__" not in str(caught.value)
    eager = kvlab.decode(model, ids, 8, strategy=strategy, graph=False)
    assert torch.equal(eager, kvlab.decode(model, ids, 8, strategy="naive"))


def test_the_kernels_send_a_dynamic_rope_to_a_strategy_that_runs_it(prompt):
    """graph-safe-kernels refused a dynamic RoPE with "use the 'graph-safe' strategy for it", which
    cannot capture it either: it names the strategies that run it."""
    with pytest.raises(ValueError, match=r"'dynamic' RoPE .* strategy='static', 'dynamic' or "
                                         r"'naive', or strategy='graph-safe' with graph=False"):
        kvlab.decode(_dynamic_rope_llama(), prompt(6), 8, strategy="graph-safe-kernels")


def test_a_prefill_bucket_beyond_the_sized_cache_says_to_pass_max_cache_len(prompt):
    """kvlab.decode(..., strategy="graph-safe", prefill_bucket=64) for 12 + 21 tokens said only
    "prefill_bucket must be in [1, max_cache_len=33], got 64", a max_cache_len the user never
    passed: it says what to pass."""
    model = tiny_model("tiny-llama")
    with pytest.raises(ValueError, match=r"max_cache_len=33\].* pass max_cache_len >= 64 too, or "
                                         r"a smaller prefill_bucket"):
        kvlab.decode(model, prompt(12), 21, strategy="graph-safe", prefill_bucket=64)
    out = kvlab.decode(model, prompt(12), 21, strategy="graph-safe", prefill_bucket=64,
                       max_cache_len=64)
    assert torch.equal(out, kvlab.decode(model, prompt(12), 21, strategy="naive"))


def test_an_eager_decoder_does_not_speak_of_a_captured_prefill(prompt):
    """With graph=False a prompt longer than prefill_bucket was refused as longer than "the captured
    prefill's length", when nothing was captured."""
    model = tiny_model("tiny-llama")
    decoder = kvlab.GraphSafeDecoder(model, 32, prefill_bucket=8, graph=False)
    with pytest.raises(GraphSafeError, match="padded to") as caught:
        decoder.generate(prompt(12), 5)
    assert "captured" not in str(caught.value)


def test_the_state_of_a_strategy_that_builds_none_says_where_its_keywords_go(prompt):
    """STRATEGIES["static"].state(model, ids, 20, max_cache_len=64) said "takes no max_cache_len=;
    it takes no options", as if static took no max_cache_len: static builds no state, and
    max_cache_len= goes to kvlab.decode (or a held cache= is the state to keep)."""
    model, ids = tiny_model("tiny-llama"), prompt(5)
    with pytest.raises(TypeError, match=r"static builds no state to hold.* pass max_cache_len= to "
                                        r"kvlab.decode.*hold a cache=") as caught:
        kvlab.STRATEGIES["static"].state(model, ids, 20, max_cache_len=64)
    assert "no options" not in str(caught.value)
    with pytest.raises(TypeError, match=r"naive builds no state.* 'naive' takes on_token="):
        kvlab.STRATEGIES["naive"].state(model, ids, 20, max_cache_len=64)
    assert kvlab.STRATEGIES["static"].state(model, ids, 20) == {}


@pytest.mark.parametrize("quick", [True, False])
def test_the_bench_record_says_the_mode_the_run_used(quick, tmp_path, monkeypatch):
    """`python -m kvlab.lab.bench --quick` recorded env.quick_mode False (and env_quick_mode False
    in the CSV) beside settings.quick True: the env read only the KVLAB_QUICK variable."""
    import csv

    from kvlab.lab import bench

    monkeypatch.setenv("KVLAB_QUICK", "0" if quick else "1")  # the variable says the other mode
    rec = bench.run_bench("tiny-llama", prompt_len=4, new_tokens=16, strategies=["naive"],
                          check_tokens=0, profile_k=0, repeats=3, quick=quick, progress=False,
                          out=tmp_path / "run")
    assert rec["settings"]["quick"] is quick and rec["env"]["quick_mode"] is quick
    with open(tmp_path / "run.csv") as f:
        assert [row["env_quick_mode"] for row in csv.DictReader(f)] == [str(quick)]

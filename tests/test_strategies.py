"""kvlab.strategies: every strategy the benchmark lists decodes through ``kvlab.decode``,
token-exact with naive in float32 on a tiny model, and calls ``on_token`` once per token.

On a CPU the compiled graph-safe paths and their ablations run uncompiled (their step is the same
computation); on a GPU the same test compiles and captures them.
"""

import pytest
import torch

import kvlab
from kvlab import decoding
from kvlab.lab import bench
from kvlab.strategies import BENCHMARKED, STRATEGIES, Strategy

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
N = 9


@pytest.fixture(scope="module")
def model():
    return kvlab.tiny_model("tiny-llama").to(DEVICE)


@pytest.fixture(scope="module")
def ids():
    return torch.randint(1, 256, (2, 7), generator=torch.Generator().manual_seed(5)).to(DEVICE)


@pytest.fixture(scope="module")
def naive(model, ids):
    return kvlab.decode(model, ids, N)


@pytest.mark.parametrize("name", BENCHMARKED)
def test_every_benchmarked_strategy_is_token_exact_through_kvlab_decode(name, model, ids, naive):
    seen = []
    out = kvlab.decode(model, ids, N, strategy=name,
                       on_token=lambda step, t: seen.append((step, t.clone())))
    assert out.shape == (2, N) and torch.equal(out, naive), name
    assert ([s for s, _ in seen] == list(range(N))
            and torch.equal(torch.cat([t for _, t in seen], 1).to(out.device), out))


def test_the_benchmark_lists_exactly_the_registry(capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--help"])
    # argparse wraps lines, also at hyphens
    listed = "".join(capsys.readouterr().out.split()).split("known:")[-1]
    assert all(name in listed for name in BENCHMARKED)
    # lesson 04's first attempt: wrong by design, never benchmarked
    assert "static-graph" not in listed


def test_a_declaration_is_all_a_strategy_needs(model, ids, naive, monkeypatch):
    """One Strategy(...) entry makes a name usable by kvlab.decode (here: naive again, under another
    name)."""
    extra = Strategy("naive-again", "the naive loop, declared twice", decoding.decode_naive, 1,
                     "eager")
    monkeypatch.setitem(STRATEGIES, extra.name, extra)
    assert torch.equal(kvlab.decode(model, ids, N, strategy="naive-again"), naive)


# One case per strategy, so that pytest-xdist spreads them (one case of them all was the GPU suite's
# slowest). On a CPU the compiled ones are left out: the test above already runs them uncompiled,
# and a second CPU compile would add half a minute.
SIZED = [name for name in BENCHMARKED if STRATEGIES[name].sized and not (
    STRATEGIES[name].compiled and DEVICE == "cpu")]


@pytest.mark.parametrize("name", SIZED)
def test_sized_strategies_take_the_benchmarks_cache_length(name, model, ids, naive):
    assert torch.equal(kvlab.decode(model, ids, N, strategy=name, max_cache_len=32), naive), name


def test_the_gqa_attention_reads_the_kv_heads_as_they_are_and_is_set_back(
        model, ids, naive, monkeypatch):
    """reduce-overhead/gqa's attention: token-exact (here eagerly, through the static strategy),
    called instead of transformers' SDPA attention, and the caller's model left with the attention
    it had."""
    from kvlab import compiled_step

    calls = []
    real = compiled_step.gqa_sdpa_attention
    monkeypatch.setattr(compiled_step, "gqa_sdpa_attention",
                        lambda *a, **kw: calls.append(1) or real(*a, **kw))
    before = model.config._attn_implementation
    with compiled_step.gqa_attention(model):
        assert model.config._attn_implementation == compiled_step.GQA_ATTENTION
        assert torch.equal(kvlab.decode(model, ids, N, strategy="static"), naive)
    assert model.config._attn_implementation == before and calls


def test_every_strategy_names_a_function_that_exists():
    for strategy in STRATEGIES.values():
        assert (callable(strategy.function)
                and (strategy.builds is None or callable(strategy.build))), strategy.name

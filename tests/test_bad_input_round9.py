"""Issue 48, probe round 9: a held decoder's cache decoded into by another call while the decoder
ran, a module's class swapped under a held decoder or the kernels, and what Strategy.build made."""

import pytest
import torch

import kvlab
from kvlab.graph_safe_cache import GraphSafeError
from kvlab.lab.models import tiny_model
from kvlab.paged_cache import PagedCacheError

HELD = ["graph-safe", "graph-safe-kernels", "graph-safe-speculative"]


@pytest.mark.parametrize("strategy", HELD)
def test_a_held_decoders_cache_is_refused_to_a_call_inside_the_decoder(strategy, prompt):
    """kvlab.decode(strategy="static", cache=D.cache) whose on_token ran the held decoder D (or the
    other way round) decoded two sequences in one cache: wrong tokens, no error. The door locked
    the cache and the decoder locked itself, two different locks."""
    model = tiny_model("tiny-llama")
    ids, other = prompt(7), prompt(5, seed=1)
    state = kvlab.STRATEGIES[strategy].state(model, ids, 9)
    decoder = state["decoder"]

    def run_decoder(k, token):
        if k == 2:
            decoder.generate(other, 4)

    decoder.cache.reset()
    # since round 18 a live decoder's cache is refused to another decode at its door, before
    # any token: the nested run never starts
    with pytest.raises(ValueError, match="belongs to a live"):
        kvlab.decode(model, ids, 9, strategy="static", cache=decoder.cache, on_token=run_decoder)

    def run_static(k, token):
        if k == 2:
            kvlab.decode(model, other, 4, strategy="static", cache=decoder.cache)

    with pytest.raises((GraphSafeError, RuntimeError), match="already decoding"):
        kvlab.decode(model, ids, 9, strategy=strategy, on_token=run_static, **state)
    # both still decode right afterwards
    assert torch.equal(kvlab.decode(model, ids, 9, strategy=strategy, **state),
                       kvlab.decode(model, ids, 9))


def test_a_graph_safe_decode_into_a_callers_cache_takes_one_lock(prompt):
    """The door leaves the lock of a cache handed to graph-safe to the decoder built around it (two
    locks of one cache would refuse the call itself)."""
    from kvlab.graph_safe_cache import GraphSafeStaticCache

    model = tiny_model("tiny-llama")
    ids = prompt(6)
    cache = GraphSafeStaticCache(model.config, max_cache_len=24)
    assert torch.equal(kvlab.decode(model, ids, 5, strategy="graph-safe", cache=cache),
                       kvlab.decode(model, ids, 5))


def _negated(module):
    class Negated(type(module)):
        def forward(self, *args, **kwargs):
            return -super().forward(*args, **kwargs)

    return Negated


@pytest.mark.parametrize("strategy", ["graph-safe", "graph-safe-kernels", "graph-safe-speculative",
                                      "paged"])
def test_a_class_swapped_under_a_held_decoder_is_refused(strategy, prompt):
    """m.model.norm.__class__ = Negated after a held decode: the decoder replayed the old class's
    forward, and the kernels computed the stock math, with no error."""
    model = tiny_model("tiny-llama")
    ids = prompt(6)
    state = kvlab.STRATEGIES[strategy].state(model, ids, 5, max_cache_len=24)
    kvlab.decode(model, ids, 5, strategy=strategy, **state)
    model.model.norm.__class__ = _negated(model.model.norm)
    with pytest.raises((GraphSafeError, PagedCacheError), match="norm's class changed"):
        kvlab.decode(model, ids, 5, strategy=strategy, **state)


@pytest.mark.parametrize("strategy", ["graph-safe-kernels", "graph-safe-speculative/kernels"])
def test_the_kernels_refuse_a_module_of_a_class_of_its_own(strategy, prompt):
    """A layer's MLP swapped for a subclass with its own forward: the kernels read its weights and
    computed the stock MLP (wrong tokens); a plain module there raised a raw AttributeError."""
    model = tiny_model("tiny-llama")
    ids = prompt(6)
    mlp = model.model.layers[0].mlp
    mlp.__class__ = _negated(mlp)
    with pytest.raises(ValueError, match=r"layers\.0\.mlp \(a class of its own, .*Negated"):
        kvlab.decode(model, ids, 5, strategy=strategy)
    # graph-safe runs the class's forward
    assert torch.equal(kvlab.decode(model, ids, 5, strategy="graph-safe"),
                       kvlab.decode(model, ids, 5))


def test_build_applies_the_strategys_options_and_names_what_it_built(prompt):
    """STRATEGIES["graph-safe-kernels/1-step-graphs"].build made 16 steps a graph (the variant's
    steps=1 was dropped), and a decoder build made ran under any strategy's name."""
    model = tiny_model("tiny-llama")
    ids = prompt(6)
    built = kvlab.STRATEGIES["graph-safe-kernels/1-step-graphs"].build(model, ids, 5)
    assert built.steps == 1
    speculative = kvlab.STRATEGIES["graph-safe-speculative"].build(model, ids, 5)
    with pytest.raises(ValueError, match="built by STRATEGIES\\['graph-safe-speculative'\\]"):
        kvlab.decode(model, ids, 5, strategy="graph-safe", decoder=speculative)
    assert torch.equal(kvlab.decode(model, ids, 5, strategy="graph-safe-speculative",
                                    decoder=speculative), kvlab.decode(model, ids, 5))


def test_gradient_checkpointing_in_eval_mode_changes_no_held_decoder(prompt):
    """gradient_checkpointing_enable() sets model.model.gradient_checkpointing = True, which acts
    only where gradients are computed: held decoders refused the model as changed."""
    model = tiny_model("tiny-llama")
    ids = prompt(6)
    state = kvlab.STRATEGIES["graph-safe"].state(model, ids, 5)
    model.gradient_checkpointing_enable()
    model.eval()
    assert torch.equal(kvlab.decode(model, ids, 5, strategy="graph-safe", **state),
                       kvlab.decode(model, ids, 5))

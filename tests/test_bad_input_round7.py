"""Issue 48, probe round 7: silent wrong tokens a hostile but ordinary user still got after round
6's fixes (model hooks a held decoder or the kernels missed, a cache shared by two calls), and a
state decoding under another strategy's name."""

import threading

import pytest
import torch

import kvlab
from kvlab.graph_safe_cache import GraphSafeError
from kvlab.lab.models import tiny_model
from kvlab.paged_cache import PagedCacheError

HELD = ["graph-safe", "graph-safe-speculative", "paged", "graph-safe-compiled"]


def _flip(module, args, out):
    return -out


def _triple(module, args, out):
    return out * 3


def _pre_half(module, args):
    return (args[0] * 0.5,)


SWAPS = {
    "another hook on the same module": lambda m: m.model.layers[0].mlp.register_forward_hook(
        _triple),
    "a pre-hook for the forward hook": lambda m: m.model.layers[0].mlp.register_forward_pre_hook(
        _pre_half),
    "a hook on another layer": lambda m: m.model.layers[1].mlp.register_forward_hook(_flip),
    "a global hook": lambda m: torch.nn.modules.module.register_module_forward_hook(
        lambda module, args, out: -out if module is m.model.layers[1].mlp else None),
}


@pytest.mark.parametrize("swap", SWAPS)
@pytest.mark.parametrize("strategy", HELD)
def test_a_hook_swapped_after_a_held_decode_is_refused(strategy, swap, prompt):
    """frozen_state counted forward hooks summed over all modules: a hook removed and another added
    kept the count, and a held decoder replayed the model with the old hook."""
    model = tiny_model("tiny-llama")
    ids = prompt(6)
    first = model.model.layers[0].mlp.register_forward_hook(_flip)
    state = kvlab.STRATEGIES[strategy].state(model, ids, 5, max_cache_len=24)
    assert torch.equal(kvlab.decode(model, ids, 5, strategy=strategy, **state),
                       kvlab.decode(model, ids, 5))
    first.remove()
    second = SWAPS[swap](model)
    try:
        with pytest.raises((GraphSafeError, PagedCacheError), match="hooks changed"):
            kvlab.decode(model, ids, 5, strategy=strategy, **state)
    finally:
        second.remove()


def _scaled(scale):
    def forward(self, x):
        return type(self).forward(self, x) * scale

    return forward


@pytest.mark.parametrize("strategy", ["graph-safe", "paged"])
def test_a_forward_patched_again_at_a_freed_address_is_refused(strategy, prompt):
    """A patched forward was recorded by id(): a notebook cell run again (`mlp.forward = ...`)
    could put the new function at the old one's freed address, and the held decoder replayed the
    old one. Here the old function is dropped first, as a re-run cell does, until an id repeats."""
    import types

    model = tiny_model("tiny-llama")
    mlp, ids = model.model.layers[0].mlp, prompt(6)
    mlp.forward = types.MethodType(_scaled(2.0), mlp)
    state = kvlab.STRATEGIES[strategy].state(model, ids, 5, max_cache_len=24)
    assert torch.equal(kvlab.decode(model, ids, 5, strategy=strategy, **state),
                       kvlab.decode(model, ids, 5))
    old = id(mlp.__dict__["forward"])
    for _ in range(50):  # CPython reuses the freed memory most of the time
        del mlp.forward
        mlp.forward = types.MethodType(_scaled(-3.0), mlp)
        if id(mlp.__dict__["forward"]) == old:
            break
    with pytest.raises((GraphSafeError, PagedCacheError), match="forward was replaced"):
        kvlab.decode(model, ids, 5, strategy=strategy, **state)


KERNELS = ["graph-safe-kernels", "graph-safe-speculative/kernels", "graph-safe-kernels/row-gemv"]
OVERRIDES = {
    "a forward hook": lambda m: m.model.layers[0].mlp.register_forward_hook(_flip),
    "a forward pre-hook": lambda m: m.model.layers[1].self_attn.register_forward_pre_hook(
        lambda module, args, kwargs: (args, kwargs), with_kwargs=True),
    "a global hook": lambda m: torch.nn.modules.module.register_module_forward_hook(
        lambda module, args, out: None),
}


@pytest.mark.parametrize("override", [*OVERRIDES, "a patched forward"])
@pytest.mark.parametrize("strategy", KERNELS)
def test_the_kernels_refuse_a_model_whose_python_they_would_skip(strategy, override, prompt):
    """The kernels read the weights and never run the modules' Python: a model with a forward hook
    or a patched forward decoded as if it had none, on a fresh decode too."""
    import types

    model = tiny_model("tiny-llama")
    ids = prompt(6)
    if override == "a patched forward":
        mlp = model.model.layers[0].mlp
        mlp.forward = types.MethodType(_scaled(-1.0), mlp)
        handle = None
    else:
        handle = OVERRIDES[override](model)
    try:
        with pytest.raises(ValueError, match="never run its modules' Python.*'graph-safe'"):
            kvlab.decode(model, ids, 5, strategy=strategy)
        # the strategy the message names runs them
        assert torch.equal(kvlab.decode(model, ids, 5, strategy="graph-safe"),
                           kvlab.decode(model, ids, 5))
    finally:
        if handle is not None:
            handle.remove()


def test_the_fused_copy_refuses_a_hook_on_what_it_rebuilds_and_keeps_the_others(prompt):
    """graph-safe-compiled's fused copy drops q/k/v and gate/up and rewrites the attention's and
    MLP's forward: a hook there was silently lost. A hook on a module it keeps still runs."""
    model = tiny_model("tiny-llama")
    ids = prompt(6)
    handle = model.model.layers[0].self_attn.k_proj.register_forward_hook(_triple)
    try:
        with pytest.raises(ValueError, match=r"rebuilds model\.model\.layers\.0\.self_attn\.k"):
            kvlab.decode(model, ids, 5, strategy="graph-safe-compiled")
    finally:
        handle.remove()
    handle = model.model.layers[1].register_forward_hook(
        lambda module, args, out: out * -1 if isinstance(out, torch.Tensor) else
        (-out[0], *out[1:]))
    try:
        assert torch.equal(kvlab.decode(model, ids, 5, strategy="graph-safe-compiled"),
                           kvlab.decode(model, ids, 5))
    finally:
        handle.remove()


SHARED = ["handwritten", "dynamic", "static", "graph-safe"]


def _fresh_cache(strategy, model, length=24):
    from transformers import DynamicCache

    from kvlab.graph_safe_cache import GraphSafeStaticCache
    from kvlab.handwritten import HandwrittenCache
    from kvlab.hf_caches import make_static_cache

    return {"handwritten": HandwrittenCache, "dynamic": lambda: DynamicCache(config=model.config),
            "static": lambda: make_static_cache(model, length),
            "graph-safe": lambda: GraphSafeStaticCache(model.config, max_cache_len=length)
            }[strategy]()


@pytest.mark.parametrize("strategy", SHARED)
def test_a_cache_decoding_in_one_thread_is_refused_to_another(strategy, prompt, one_waits_inside):
    """Two threads handing one cache= to kvlab.decode interleaved their prefills and steps in it
    and got wrong tokens (static and handwritten: most of 80 races); round 6's guard covered only
    reduce-overhead's cache. The second call is refused while the first runs."""
    model = tiny_model("tiny-llama")
    ids = [prompt(6), prompt(4, seed=1)]
    want = [kvlab.decode(model, x, 5) for x in ids]
    cache = _fresh_cache(strategy, model)

    def decode(i, on_token):
        return kvlab.decode(model, ids[i], 5, strategy=strategy, cache=cache, on_token=on_token)

    got = one_waits_inside(decode)
    assert torch.equal(got[0], want[0])
    assert isinstance(got[1], RuntimeError)
    if strategy == "graph-safe":  # the second call's decoder cannot bind a cache bound to the first
        assert "already bound to a captured graph" in str(got[1])
    else:
        assert "already decoding" in str(got[1]) and "another thread" in str(got[1])


@pytest.mark.parametrize("strategy", ["handwritten", "static"])
def test_two_threads_racing_on_one_cache_never_get_wrong_tokens(strategy, prompt):
    """The race itself: both threads start together on one fresh cache. Each call returns the
    naive tokens or is refused, never wrong tokens."""
    model = tiny_model("tiny-llama")
    ids = [prompt(6), prompt(6, seed=1)]
    want = [kvlab.decode(model, x, 4) for x in ids]
    for _ in range(10):
        cache, start, got = _fresh_cache(strategy, model), threading.Barrier(2), {}

        def run(i, cache=cache, start=start, got=got):
            start.wait(30)
            try:
                got[i] = kvlab.decode(model, ids[i], 4, strategy=strategy, cache=cache)
            except (RuntimeError, ValueError) as e:  # refused: the cache was busy or used
                got[i] = e

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for i in range(2):
            assert isinstance(got[i], Exception) or torch.equal(got[i], want[i])


@pytest.mark.parametrize("inner", ["static", "reduce-overhead"])
def test_a_nested_decode_on_the_running_cache_says_it_is_running(inner, prompt):
    """A static decode whose on_token decoded again on the same cache: reduce-overhead's call reset
    it (the static call held no lock) and the outer call returned wrong tokens; static's own was
    refused as "an earlier decode", which was still running."""
    model = tiny_model("tiny-llama")
    ids, other = prompt(6), prompt(4, seed=1)
    state = kvlab.STRATEGIES["reduce-overhead"].state(model, ids, 5, max_cache_len=24)

    def nested(k, token):
        if k == 1:
            if inner == "static":
                kvlab.decode(model, other, 3, strategy="static", cache=state["cache"])
            else:
                kvlab.decode(model, other, 3, strategy="reduce-overhead", **state)

    state["cache"].reset()
    with pytest.raises(RuntimeError, match="already decoding.*on_token"):
        kvlab.decode(model, ids, 5, strategy="static", cache=state["cache"], on_token=nested)
    state["cache"].reset()
    assert torch.equal(kvlab.decode(model, ids, 5, strategy="static", cache=state["cache"]),
                       kvlab.decode(model, ids, 5))


def test_a_cache_stays_copyable_after_a_decode(prompt):
    """The guard keeps its lock beside the cache, not on it: copy.deepcopy of a used cache works."""
    import copy

    model = tiny_model("tiny-llama")
    cache = _fresh_cache("static", model)
    kvlab.decode(model, prompt(6), 5, strategy="static", cache=cache)
    assert copy.deepcopy(cache).get_seq_length() == cache.get_seq_length()


@pytest.mark.parametrize(("built", "named"), [
    ("graph-safe-kernels", "graph-safe"),
    ("graph-safe-kernels/1-step-graphs", "graph-safe-kernels"),
    ("graph-safe", "graph-safe-kernels"),
    ("reduce-overhead/gqa", "reduce-overhead"),
])
def test_a_state_under_another_strategys_name_is_refused(built, named, prompt):
    """A decoder (or compiled step) built by one strategy's state and handed to kvlab.decode under
    another's name decoded its own way under the wrong name: a benchmark row or a timing would be
    labelled with a path that never ran."""
    model = tiny_model("tiny-llama")
    ids = prompt(6)
    state = kvlab.STRATEGIES[built].state(model, ids, 5)
    with pytest.raises(ValueError, match=f"built by STRATEGIES\\[{built!r}\\].state"):
        kvlab.decode(model, ids, 5, strategy=named, **state)
    assert torch.equal(kvlab.decode(model, ids, 5, strategy=built, **state),
                       kvlab.decode(model, ids, 5))

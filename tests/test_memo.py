"""What kvlab keeps per model (decoders, caches, graphs, fused copies) never outlives the model (kvlab.memo)."""

import copy
import gc
import weakref

import pytest
import torch

import kvlab
from kvlab import memo
from kvlab.graph_decoder import decode_graph_safe, decode_graph_safe_compiled, decode_graph_safe_kernels

IDS = torch.tensor([[1, 2, 3, 4, 5]])
STRATEGIES = {
    "graph-safe": decode_graph_safe,
    "graph-safe-kernels": decode_graph_safe_kernels,
    "graph-safe-compiled": decode_graph_safe_compiled,  # on CPU: the fused copy, not compiled, emulated graphs
}


@pytest.mark.parametrize("name", STRATEGIES)
def test_a_model_decoded_with_a_memoised_strategy_is_freed_with_its_decoders(name):
    model = kvlab.tiny_model("tiny-llama")
    tokens = STRATEGIES[name](model, IDS, 4)
    assert torch.equal(tokens, kvlab.decode(model, IDS, 4))  # the memo is in use, and exact
    assert memo.kept(model, "fused-copy" if name == "graph-safe-compiled" else "graph-decoder")
    alive = weakref.ref(model)
    del model
    gc.collect()
    assert alive() is None, "kvlab kept the model (and its caches and graphs) alive after the last reference went"


def test_second_call_reuses_the_decoder_and_a_copy_of_the_model_starts_empty():
    model = kvlab.tiny_model("tiny-llama")
    decode_graph_safe(model, IDS, 4)
    decode_graph_safe(model, IDS[:, :3], 4)
    (decoder,) = memo.kept(model, "graph-decoder")
    twin = copy.deepcopy(model)  # a deepcopy must not copy (or share) decoders bound to the original's cache
    assert memo.kept(twin, "graph-decoder") == []
    assert torch.equal(decode_graph_safe(twin, IDS, 4), decode_graph_safe(model, IDS, 4))
    assert memo.kept(model, "graph-decoder") == [decoder]
    memo.forget(model)
    assert memo.kept(model, "graph-decoder") == []


def test_decoders_and_fused_copies_follow_the_models_weights():
    model = kvlab.tiny_model("tiny-llama")
    for decode_fn in (decode_graph_safe, decode_graph_safe_compiled):
        decode_fn(model, IDS, 4)
    (decoder,) = memo.kept(model, "graph-decoder")
    (fast,) = memo.kept(model, "fused-copy")
    with torch.no_grad():  # new weights written in place: a replay reads them, the fused copy must be made again
        for p in model.parameters():
            p.mul_(1.5)
    naive = kvlab.decode(model, IDS, 4)
    assert torch.equal(decode_graph_safe(model, IDS, 4), naive) and memo.kept(model, "graph-decoder") == [decoder]
    assert torch.equal(decode_graph_safe_compiled(model, IDS, 4), naive) and memo.kept(model, "fused-copy") != [fast]
    model.double()  # replaced tensors: the old graph would read freed memory; the strategy builds a new decoder
    assert torch.equal(decode_graph_safe(model, IDS, 4), kvlab.decode(model, IDS, 4))
    assert memo.kept(model, "graph-decoder") != [decoder]


def test_an_explicit_decoder_refuses_replaced_weights():
    from kvlab.graph_decoder import GraphSafeDecoder, GraphSafeError

    model = kvlab.tiny_model("tiny-llama")
    decoder = GraphSafeDecoder(model, 32)
    decoder.generate(IDS, 4)
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    assert decoder.stale()
    with pytest.raises(GraphSafeError, match="weights were replaced or rewritten"):
        decoder.generate(IDS, 4)


def test_the_kernels_decoder_follows_weights_written_in_place():
    """Its step reads a fused copy (other tensors): a weight written in place in the original makes it stale."""
    model = kvlab.tiny_model("tiny-llama")
    decode_graph_safe_kernels(model, IDS, 4)
    (decoder,) = memo.kept(model, "graph-decoder")
    with torch.no_grad():
        model.lm_head.weight.mul_(-1.0)
    assert decoder.stale()
    assert torch.equal(decode_graph_safe_kernels(model, IDS, 4), kvlab.decode(model, IDS, 4))
    assert memo.kept(model, "graph-decoder") != [decoder]


@pytest.mark.parametrize("name", ["graph-safe-kernels", "graph-safe-compiled"])
def test_weights_written_through_data_or_numpy_are_seen(name):
    """Writes that bypass autograd's version counter (p.data, a NumPy view) still make the fused copy stale."""
    model = kvlab.tiny_model("tiny-llama")
    STRATEGIES[name](model, IDS, 4)
    model.lm_head.weight.data.mul_(-1.0)
    assert torch.equal(STRATEGIES[name](model, IDS, 4), kvlab.decode(model, IDS, 4))
    model.model.layers[0].mlp.down_proj.weight.detach().numpy()[:] *= 3.0
    assert torch.equal(STRATEGIES[name](model, IDS, 4), kvlab.decode(model, IDS, 4))


@pytest.mark.parametrize("change", ["hook", "patched-forward", "eps", "swapped-act"])
@pytest.mark.parametrize("name", ["graph-safe", "graph-safe-kernels"])
def test_a_changed_module_makes_kept_decoders_stale(name, change):
    """A hook, a patched forward, a norm's eps or a swapped submodule after the first decode: the next decode follows
    the model as it is now (naive), instead of replaying what the graph froze."""
    model = kvlab.tiny_model("tiny-llama")
    STRATEGIES[name](model, IDS, 4)
    layer = model.model.layers[0]
    if change == "hook":
        layer.mlp.register_forward_hook(lambda m, args, out: out * 2.0)
    elif change == "patched-forward":
        original = layer.mlp.forward
        layer.mlp.forward = lambda x: original(x) * 0.5
    elif change == "eps":
        layer.input_layernorm.variance_epsilon = 0.5
    else:
        layer.mlp.act_fn = torch.nn.GELU()
    if name == "graph-safe-kernels" and change in ("hook", "patched-forward", "swapped-act"):
        return  # the kernels compute the layer themselves: modules' hooks and forwards are not what they run
    assert torch.equal(STRATEGIES[name](model, IDS, 4), kvlab.decode(model, IDS, 4))

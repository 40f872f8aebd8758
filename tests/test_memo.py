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

"""What kvlab keeps per model (decoders, caches, graphs, fused copies) never outlives the model (kvlab.memo)."""

import copy
import gc
import weakref

import pytest
import torch

import kvlab
from kvlab import memo
from kvlab.fast_decode import decode_graph_safe_fast
from kvlab.graph_safe import decode_graph_safe
from kvlab.kernel_step import decode_graph_safe_kernels

IDS = torch.tensor([[1, 2, 3, 4, 5]])
STRATEGIES = {
    "graph-safe": decode_graph_safe,
    "graph-safe-kernels": decode_graph_safe_kernels,
    "graph-safe-compiled": decode_graph_safe_fast,  # on CPU: the fused copy, not compiled, emulated graphs
}


@pytest.mark.parametrize("name", STRATEGIES)
def test_a_model_decoded_with_a_memoised_strategy_is_freed_with_its_decoders(name):
    model = kvlab.tiny_model("tiny-llama")
    tokens = STRATEGIES[name](model, IDS, 4)
    assert torch.equal(tokens, kvlab.decode(model, IDS, 4))  # the memo is in use, and exact
    assert memo.kept(model, "fused-copy" if name == "graph-safe-compiled" else name)
    alive = weakref.ref(model)
    del model
    gc.collect()
    assert alive() is None, "kvlab kept the model (and its caches and graphs) alive after the last reference went"


def test_second_call_reuses_the_decoder_and_a_copy_of_the_model_starts_empty():
    model = kvlab.tiny_model("tiny-llama")
    decode_graph_safe(model, IDS, 4)
    decode_graph_safe(model, IDS[:, :3], 4)
    (decoder,) = memo.kept(model, "graph-safe")
    twin = copy.deepcopy(model)  # a deepcopy must not copy (or share) decoders bound to the original's cache
    assert memo.kept(twin, "graph-safe") == []
    assert torch.equal(decode_graph_safe(twin, IDS, 4), decode_graph_safe(model, IDS, 4))
    assert memo.kept(model, "graph-safe") == [decoder]
    memo.forget(model)
    assert memo.kept(model, "graph-safe") == []

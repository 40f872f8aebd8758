"""kvlab.kernel_step's decode step in its PyTorch form (what a CPU runs; the kernels themselves are checked against
it in test_decode_kernel.py): token-exact against naive, across prompts and through the graph, and clear refusals."""

import pytest
import torch

import kvlab
from kvlab import kernel_step
from kvlab.models import tiny_model


@pytest.fixture(autouse=True)
def pytorch_form(monkeypatch):
    monkeypatch.setattr(kernel_step, "_use_triton", lambda x: False)  # also under TRITON_INTERPRET


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-mistral"])
@pytest.mark.parametrize("graph", [False, True])
def test_kernel_step_is_token_exact(name, graph):
    model = tiny_model(name)
    gen = torch.Generator().manual_seed(3)
    for prompt_len, n in [(9, 14), (4, 14), (20, 5)]:  # several prompts through one decoder (and its graphs)
        ids = torch.randint(0, 256, (2, prompt_len), generator=gen)
        out = kernel_step.decode_graph_safe_kernels(model, ids, n, steps=4, graph=graph, max_cache_len=32)
        assert torch.equal(out, kvlab.decode(model, ids, n)), (name, prompt_len)


def test_the_step_advances_the_cache_counter_once():
    model = tiny_model("tiny-llama")
    ids = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(4))
    decoder = kernel_step.KernelStepDecoder(model, 32, 1, steps=2, graph=False)
    decoder.generate(ids, 5)  # prefill (6 tokens) + 4 decode steps
    assert int(decoder.cache.cache_position) == 6 + 4


@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-gemma", "tiny-phi3"])
def test_other_layers_are_refused_with_what_to_do(name):
    with pytest.raises(ValueError, match="graph-safe-compiled"):
        kernel_step.KernelStepDecoder(tiny_model(name), 32)


def test_a_length_dependent_rope_is_refused():
    model = tiny_model("tiny-llama")
    model.model.rotary_emb.rope_type = "dynamic"
    with pytest.raises(ValueError, match="dynamic"):
        kernel_step.check_supported(model)


def test_kernels_refuse_layouts_they_would_misread():
    x = torch.randn(4, 2).t()  # rows of stride 1 element apart: not contiguous rows
    with pytest.raises(ValueError, match="contiguous rows"):
        kernel_step._require_dense_rows(x=x)
    kernel_step._require_dense_rows(x=x.contiguous(), residual=None)  # accepted

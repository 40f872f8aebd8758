"""kvlab.fusion and kvlab.graph_decoder's multi-step graphs: fewer kernels, several steps per graph,
the same tokens as naive; the decoder's constructor stays small, and ``import kvlab`` loads no
Triton."""

import inspect
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import kvlab
from kvlab import fusion
from kvlab.compiled_step import compiled_decoder, decode_graph_safe_compiled
from kvlab.graph_decoder import GraphSafeDecoder, GraphSafeError, model_step
from kvlab.lab.models import tiny_model


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-mistral", "tiny-qwen2"])
def test_fused_model_is_token_exact(name):
    model = tiny_model(name)
    ids = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(1))
    fast = fusion.fused_copy(model)
    # a new copy each time: the caller holds it
    assert fast is not model and fusion.fused_copy(model) is not fast
    assert hasattr(fast.model.layers[0].self_attn,
                   "qkv_proj") and not hasattr(fast.model.layers[0].self_attn, "q_proj")
    assert hasattr(model.model.layers[0].self_attn, "q_proj")  # the original is untouched
    assert torch.equal(kvlab.decode(fast, ids, 24), kvlab.decode(model, ids, 24))


def test_fusion_refuses_other_layouts():
    with pytest.raises(ValueError, match="Llama-style"):
        fusion.fuse_projections(tiny_model("tiny-qwen3"))  # q_norm/k_norm per head


def test_gemv_path_matches_linear(monkeypatch):
    layer = torch.nn.Linear(16, 24, bias=True)
    x = torch.randn(2, 1, 16)
    fusion.use_gemv(layer)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    # the reduction form
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
    big = torch.randn(3, fusion.REDUCTION_MAX_ROWS, 16)  # too many rows: back to F.linear
    torch.testing.assert_close(layer(big), F.linear(big, layer.weight, layer.bias))


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
def test_multi_step_graphs_are_exact_across_prompts(name):
    model = tiny_model(name)
    gen = torch.Generator().manual_seed(2)
    # several prompts through the same captured graphs
    for prompt_len, n in [(7, 11), (3, 11), (12, 11)]:
        ids = torch.randint(0, 256, (2, prompt_len), generator=gen)
        # emulated on CPU
        out = decode_graph_safe_compiled(model, ids, n, steps=4, graph=True, max_cache_len=32)
        assert torch.equal(out, kvlab.decode(model, ids, n)), (name, prompt_len)


def test_unfused_and_eager_variants_are_exact():
    model = tiny_model("tiny-qwen3")  # not fusable: fuse=False keeps the model's own layers
    ids = torch.randint(0, 256, (1, 5), generator=torch.Generator().manual_seed(3))
    ref = kvlab.decode(model, ids, 9)
    assert torch.equal(decode_graph_safe_compiled(model, ids, 9, fuse=False, steps=3), ref)
    assert torch.equal(decode_graph_safe_compiled(model, ids, 9, fuse=False, steps=1, gemv=False),
                       ref)


def test_bad_settings_are_refused():
    model = tiny_model("tiny-llama")
    with pytest.raises(ValueError, match="steps must be a positive int"):
        GraphSafeDecoder(model, 32, 1, steps=0)
    with pytest.raises(Exception, match="max_cache_len"):
        decode_graph_safe_compiled(model, torch.ones(1, 30, dtype=torch.long), 10, max_cache_len=32)


def test_a_decoder_refuses_to_be_pickled_or_copied_saying_to_build_a_new_one():
    import copy
    import pickle

    model = tiny_model("tiny-llama")
    decoder = GraphSafeDecoder(model, 16)
    decoder.generate(torch.tensor([[1, 2, 3]]), 4)  # a captured graph
    for copier in (pickle.dumps, copy.deepcopy, copy.copy):
        with pytest.raises(TypeError,
                           match="cannot be pickled or copied: it holds captured graphs bound to "
                                 "live "
                                 "memory.*Build a new GraphSafeDecoder"):
            copier(decoder)
    with pytest.raises(TypeError, match=r"load_model returns \(model, tokenizer\)"):
        GraphSafeDecoder((model, None), 16)


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA GPU: run on Colab/GPU machine")
def test_compiled_multi_step_graph_on_cuda():
    model = tiny_model("tiny-llama").cuda()
    ids = torch.randint(0, 256, (1, 8), device="cuda")
    ref = kvlab.decode(model, ids, 40)
    assert torch.equal(decode_graph_safe_compiled(model, ids, 40, steps=8), ref)
    # replayed, not recaptured
    assert torch.equal(decode_graph_safe_compiled(model, ids, 40, steps=8), ref)


def test_a_fused_copy_refuses_an_unknown_attention():
    with pytest.raises(ValueError, match="attention must be"):
        fusion.fused_copy(tiny_model("tiny-llama"), attention="flash")


def test_prefill_mask_is_causal_from_the_counter():
    from kvlab.graph_decoder import prefill_mask

    mask = prefill_mask(torch.tensor(3), batch=2, bucket=4, slots=10)
    assert mask.shape == (2, 1, 4, 10) and mask.dtype == torch.bool
    for i in range(4):  # row i sits at position 3 + i and sees slots 0..3 + i
        assert mask[1, 0, i].tolist() == [s <= 3 + i for s in range(10)]


def test_the_decoder_takes_at_most_eight_parameters_and_its_step_as_a_function():
    """gpt-fast's shape: the step is a function handed to the decoder, which owns only what every
    step shares."""
    params = inspect.signature(GraphSafeDecoder).parameters
    assert len(params) <= 8, list(params)
    assert params["step"].default is model_step and params["graph"].default is True
    model = tiny_model("tiny-llama")
    ids = torch.randint(0, 256, (1, 5), generator=torch.Generator().manual_seed(6))
    calls = []

    # any function of (model, cache, token) that writes the next token
    def counted_step(model, cache, token):
        calls.append(1)
        return model_step(model, cache, token)

    decoder = GraphSafeDecoder(model, 16, step=counted_step, steps=3, graph=False)
    assert torch.equal(decoder.generate(ids, 7), kvlab.decode(model, ids, 7)) and len(calls) == 6
    assert "counted_step" in decoder.describe()
    with pytest.raises(TypeError, match="step must be a function"):
        GraphSafeDecoder(model, 16, step="kernels")
    with pytest.raises(ValueError, match="graph must be True, False or 'emulate'"):
        GraphSafeDecoder(model, 16, graph="yes")


def test_the_compiled_builder_makes_the_fused_copy_and_the_decoder_checks_its_source():
    model = tiny_model("tiny-llama")
    ids = torch.randint(0, 256, (1, 5), generator=torch.Generator().manual_seed(7))
    # CPU: not compiled
    decoder = compiled_decoder(model, ids, 6, steps=2, max_cache_len=16, graph=True)
    assert decoder.model is not model and decoder.source is model  # a copy, made by the builder
    assert hasattr(decoder.model.model.layers[0].self_attn, "qkv_proj")
    assert torch.equal(decode_graph_safe_compiled(model, ids, 6, decoder=decoder),
                       kvlab.decode(model, ids, 6))
    # the SOURCE moved
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    with pytest.raises(GraphSafeError, match=r"lm_head\.weight was replaced.*copy of the model"):
        decoder.generate(ids, 6)


IMPORT_CHECK = (
    "import kvlab, sys; assert 'triton' not in sys.modules and 'torch._dynamo' not in sys.modules "
    "and not any(m.startswith('kvlab.kernels') for m in sys.modules)")


def test_import_kvlab_loads_no_triton_and_no_kernels():
    """Lesson 00's first ``import kvlab`` does not pay for Triton: a strategy imports its module
    when it runs."""
    done = subprocess.run([sys.executable, "-c", IMPORT_CHECK], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_kernels_strategy_loads_the_kernels_when_it_runs():
    code = ("import kvlab, sys, torch; m = kvlab.tiny_model('tiny-llama'); "
            "ids = torch.tensor([[1, 2, 3]]); "
            "kvlab.decode(m, ids, 2, strategy='graph-safe-kernels'); assert 'kvlab.kernels.step' "
            "in sys.modules")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]

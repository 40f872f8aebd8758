"""kvlab.sizes: the per-pass FLOP formula against torch's own FLOP counter, its decode-step series,
and the cache's per-token bytes (GQA, the 7B example, bad input)."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import LlamaConfig, LlamaForCausalLM

from kvlab.lab.models import TINY_CONFIGS, tiny_model
from kvlab.sizes import (
    decode_step_flops,
    flops_breakdown,
    forward_flops,
    kv_bytes_per_token,
    kv_cache_bytes,
    llama_parameter_count,
    model_sizes,
)


def counted_flops(model, input_ids, **kw) -> int:
    """FLOPs torch's FlopCounterMode records for one forward pass (matmuls; eager attention's
    too)."""
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        model(input_ids, **kw)
    return counter.get_total_flops()


@pytest.mark.parametrize("name", sorted(TINY_CONFIGS))
def test_matmul_parts_match_torch_counter(name):
    """sdpa on CPU is not counted by FlopCounterMode, so the projections + MLP + lm_head must match
    exactly."""
    model = tiny_model(name)
    ids = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(0))
    parts = flops_breakdown(model.config, 7, batch=2)
    assert counted_flops(model, ids,
                         use_cache=False) == parts["projections"] + parts["mlp"] + parts["lm_head"]


def test_full_rectangle_attention_matches_eager_counter():
    """Eager attention multiplies the whole q x ctx rectangle: causal=False must match the counter
    exactly."""
    model = tiny_model("tiny-llama")
    model.config._attn_implementation = "eager"
    ids = torch.randint(0, 256, (1, 9), generator=torch.Generator().manual_seed(1))
    assert counted_flops(model, ids, use_cache=False) == forward_flops(model.config, 9,
                                                                       causal=False)


def test_cached_pass_matches_counter():
    """One token after 9 cached ones: the eager counter sees 1 x 10 attention pairs, as the formula
    says."""
    from kvlab.handwritten import HandwrittenCache

    model = tiny_model("tiny-llama")
    model.config._attn_implementation = "eager"
    ids = torch.randint(0, 256, (1, 10), generator=torch.Generator().manual_seed(2))
    cache = HandwrittenCache()
    with torch.inference_mode():
        model(ids[:, :9], cache=cache)
    assert counted_flops(model, ids[:, 9:], cache=cache) == forward_flops(model.config, 1, past=9)


def test_causal_pairs_and_parts():
    cfg = tiny_model("tiny-llama").config
    full, causal = flops_breakdown(cfg, 8, causal=False), flops_breakdown(cfg, 8)
    # 8 queries over 8 keys: 64 pairs in the rectangle, 1 + 2 + ... + 8 = 36 under the causal mask
    assert causal["attention"] * 64 == full["attention"] * 36
    assert ({k: v for k, v in causal.items() if k != "attention"}
            == {k: v for k, v in full.items() if k != "attention"})
    assert flops_breakdown(cfg, 8, logits="last")["lm_head"] * 8 == causal["lm_head"]
    assert forward_flops(cfg, 3, batch=4) == 4 * forward_flops(cfg, 3)


def test_naive_steps_grow_and_cached_steps_stay_flat():
    cfg = tiny_model("tiny-llama").config
    naive = decode_step_flops(cfg, 5, 6, cached=False)
    cached = decode_step_flops(cfg, 5, 6, cached=True)
    assert naive[0] == cached[0] == forward_flops(cfg, 5)  # both start by reading the prompt
    assert all(b > a for a, b in zip(naive, naive[1:], strict=False))
    assert naive[3] == forward_flops(cfg, 8)
    assert cached[3] == forward_flops(cfg, 1, past=7)
    # a cached step only adds attention over one more key
    assert (cached[4] - cached[3]
            == flops_breakdown(cfg, 1, 8)["attention"] - flops_breakdown(cfg, 1, 7)["attention"])


@pytest.mark.parametrize(
    "kw", [dict(new_tokens=0), dict(new_tokens=2.0), dict(past=-1), dict(batch=0),
           dict(logits="first"), dict(new_tokens=True)]
)
def test_bad_arguments_raise(kw):
    cfg = tiny_model("tiny-llama").config
    args = dict(new_tokens=3, past=0) | kw
    with pytest.raises(ValueError):
        flops_breakdown(cfg, args.pop("new_tokens"), **args)


def test_bad_decode_arguments_raise():
    cfg = tiny_model("tiny-llama").config
    with pytest.raises(ValueError, match="prompt_len"):
        decode_step_flops(cfg, 0, 3, cached=True)
    with pytest.raises(ValueError, match="new_tokens"):
        decode_step_flops(cfg, 3, 0, cached=False)




def smollm2_config():
    return LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                       num_hidden_layers=30,
                       num_attention_heads=9, num_key_value_heads=3)


def test_smollm2_per_token():
    s = model_sizes(smollm2_config())
    assert (s.layers, s.kv_heads, s.head_dim) == (30, 3, 64)
    assert kv_bytes_per_token(smollm2_config(), torch.float16) == 23_040
    assert kv_bytes_per_token(smollm2_config(), "float32") == 46_080


def test_gqa_is_heads_over_kv_heads_smaller():
    mha = smollm2_config()
    mha.num_key_value_heads = 9
    assert kv_bytes_per_token(mha, torch.bfloat16) == 3 * kv_bytes_per_token(
        smollm2_config(), torch.bfloat16)


def test_llama2_7b():
    cfg = LlamaConfig(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=32)
    assert kv_bytes_per_token(cfg, torch.float16) == 512 * 1024
    assert kv_cache_bytes(cfg, 4096, torch.float16) == 2 * 1024**3
    assert kv_cache_bytes(cfg, 4096, torch.float16, batch=3) == 6 * 1024**3


def test_explicit_head_dim_wins():
    cfg = smollm2_config()
    cfg.head_dim = 32
    assert model_sizes(cfg).head_dim == 32


@pytest.mark.parametrize("dtype", ["floatx", "nn", 2, None])
def test_bad_dtype(dtype):
    with pytest.raises(ValueError, match="dtype"):
        kv_bytes_per_token(smollm2_config(), dtype)


@pytest.mark.parametrize("kw", [dict(tokens=-1), dict(tokens=1.0), dict(batch=-2)])
def test_bad_counts(kw):
    args = dict(tokens=4) | kw
    with pytest.raises(ValueError):
        kv_cache_bytes(smollm2_config(), args.pop("tokens"), torch.float16, **args)


@pytest.mark.parametrize("extra", [{}, dict(tie_word_embeddings=True),
                                   dict(attention_bias=True, mlp_bias=True),
                                   dict(head_dim=32)])
def test_llama_parameter_count_matches_the_tensors(extra):
    cfg = LlamaConfig(**{**dict(vocab_size=256, hidden_size=64, intermediate_size=128,
                                num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2), **extra})
    model = LlamaForCausalLM(cfg)
    assert llama_parameter_count(cfg) == sum(p.numel() for p in model.parameters())


def test_llama2_7b_parameter_count():
    """LLaMA-2-7B's published count, 6,738,415,616, from its config (counted on the meta device: no
    memory)."""
    cfg = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                      num_attention_heads=32,
                      num_key_value_heads=32, vocab_size=32000)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    assert llama_parameter_count(cfg) == sum(p.numel() for p in model.parameters()) == 6_738_415_616
    smol = smollm2_config()
    smol.tie_word_embeddings = True
    assert llama_parameter_count(smol) == 134_515_008


def test_size_arithmetic_refuses_nonsense():
    from kvlab.handwritten import cat_bytes_copied
    from kvlab.sizes import floor_ms, tensor_bytes

    cfg = smollm2_config()
    with pytest.raises(ValueError, match="batch must be a positive int"):
        cat_bytes_copied(cfg, 4, 3, torch.float32, batch=-1)
    for kw in (dict(gbps=-1.0), dict(gbps=0.0), dict(batch=-1)):
        args = dict(weight_bytes=1e9, kv_per_token=1000, batch=1, context=10.0, gbps=100.0) | kw
        with pytest.raises(ValueError, match="floor_ms needs"):
            floor_ms(**args)
    bad = smollm2_config()
    bad.num_attention_heads = 0
    with pytest.raises(ValueError, match="num_attention_heads must be a positive int"):
        model_sizes(bad)
    from types import SimpleNamespace

    odd = SimpleNamespace(num_hidden_layers=2, hidden_size=65, num_attention_heads=4,
                          num_key_value_heads=4,
                          intermediate_size=128, vocab_size=256)  # no head_dim given
    with pytest.raises(ValueError, match="not a multiple"):
        model_sizes(odd)
    if hasattr(torch, "float4_e2m1fn_x2"):
        with pytest.raises(ValueError, match="packs several elements"):
            kv_bytes_per_token(cfg, "float4_e2m1fn_x2")
    meta = [torch.empty(4, 4, device="meta"), torch.empty(8, device="meta")]
    assert tensor_bytes(meta) == (16 + 8) * 4  # meta tensors have no address: each counts

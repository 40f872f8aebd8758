"""kvlab.cache_memory: the per-token formula, GQA, the 7B example, and bad input."""

import pytest
import torch
from transformers import LlamaConfig

from kvlab.cache_memory import kv_bytes_per_token, kv_cache_bytes, kv_sizes


def smollm2_config():
    return LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                       num_attention_heads=9, num_key_value_heads=3)


def test_smollm2_per_token():
    assert kv_sizes(smollm2_config()) == (30, 3, 64)
    assert kv_bytes_per_token(smollm2_config(), torch.float16) == 23_040
    assert kv_bytes_per_token(smollm2_config(), "float32") == 46_080


def test_gqa_is_heads_over_kv_heads_smaller():
    mha = smollm2_config()
    mha.num_key_value_heads = 9
    assert kv_bytes_per_token(mha, torch.bfloat16) == 3 * kv_bytes_per_token(smollm2_config(), torch.bfloat16)


def test_llama2_7b():
    cfg = LlamaConfig(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32)
    assert kv_bytes_per_token(cfg, torch.float16) == 512 * 1024
    assert kv_cache_bytes(cfg, 4096, torch.float16) == 2 * 1024**3
    assert kv_cache_bytes(cfg, 4096, torch.float16, batch=3) == 6 * 1024**3


def test_explicit_head_dim_wins():
    cfg = smollm2_config()
    cfg.head_dim = 32
    assert kv_sizes(cfg) == (30, 3, 32)


@pytest.mark.parametrize("dtype", ["floatx", "nn", 2, None])
def test_bad_dtype(dtype):
    with pytest.raises(ValueError, match="dtype"):
        kv_bytes_per_token(smollm2_config(), dtype)


@pytest.mark.parametrize("kw", [dict(tokens=-1), dict(tokens=1.0), dict(batch=-2)])
def test_bad_counts(kw):
    args = dict(tokens=4) | kw
    with pytest.raises(ValueError):
        kv_cache_bytes(smollm2_config(), args.pop("tokens"), torch.float16, **args)

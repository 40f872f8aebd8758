"""Exercise checkers of lesson 00: None, right and wrong answers."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from kvlab.exercises import lesson00
from kvlab.exercises.common import NOT_ANSWERED
from kvlab.models import tiny_model


def tied_model():
    cfg = LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=True)
    return LlamaForCausalLM(cfg)


def test_parameter_bytes_counts_tied_weights_once():
    model = tied_model()
    tensors = {t.data_ptr(): t for t in model.state_dict().values()}  # the tied matrix appears twice, one storage
    expected = sum(t.numel() for t in tensors.values()) * 2
    assert lesson00.parameter_bytes(model, torch.bfloat16) == expected
    assert lesson00.parameter_bytes(model, torch.float32) == 2 * expected
    assert lesson00.check_parameter_bytes(expected, model=model).startswith("correct")
    twice = expected + 100 * 32 * 2  # counting the tied lm_head again
    assert lesson00.check_parameter_bytes(twice, model=model).startswith("not quite")
    assert lesson00.check_parameter_bytes(expected * 2, model=model).startswith("not quite")  # fp32 bytes
    assert lesson00.check_parameter_bytes(expected * 2, model=model, dtype=torch.float32).startswith("correct")
    assert lesson00.check_parameter_bytes(None, model=model) == NOT_ANSWERED


def test_queries_per_kv_head():
    cfg = tiny_model("tiny-llama").config  # 4 query heads, 2 kv heads
    assert lesson00.check_queries_per_kv_head(2, config=cfg).startswith("correct")
    assert lesson00.check_queries_per_kv_head(0.5, config=cfg).startswith("not quite")
    assert lesson00.check_queries_per_kv_head(4, config=tied_model().config).startswith("correct")
    assert lesson00.check_queries_per_kv_head(None, config=cfg) == NOT_ANSWERED


def test_head_dim():
    assert lesson00.check_head_dim(16, config=tiny_model("tiny-llama").config).startswith("correct")
    assert lesson00.check_head_dim(8, config=tied_model().config).startswith("correct")
    assert lesson00.check_head_dim(64, config=tied_model().config).startswith("not quite")
    assert lesson00.check_head_dim(None, config=tied_model().config) == NOT_ANSWERED

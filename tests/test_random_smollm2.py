"""kvlab.lab.models.random_smollm2: SmolLM2-135M's shape with random weights (the GPU machine's
stand-in)."""

import json

import pytest
import torch

import kvlab
from kvlab.lab.models import SMOLLM2_SHAPE, cache_dir, random_smollm2


def test_shape_matches_smollm2_without_allocating():
    model = random_smollm2(device="meta")  # built on the meta device: shapes only, instant
    # SmolLM2-135M, embedding tied to lm_head
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.dtype == torch.float32 and not model.training
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads,
            cfg.hidden_size) == (30, 9, 3, 576)


def test_fewer_layers_keep_the_shape_of_each_layer():
    short, full = random_smollm2(device="meta", layers=4), random_smollm2(device="meta")
    assert short.config.num_hidden_layers == len(short.model.layers) == 4
    assert [p.shape for p in short.model.layers[0].parameters()] == [
        p.shape for p in full.model.layers[0].parameters()]


@pytest.mark.parametrize("layers", [0, 31, 2.0, True, "4"])
def test_layers_out_of_range_are_refused(layers):
    with pytest.raises(ValueError, match="layers must be an int from 1 to 30"):
        random_smollm2(device="meta", layers=layers)


def test_shape_matches_the_converted_real_model():
    config_file = cache_dir() / "smollm2-135m" / "config.json"
    if not config_file.is_file():
        pytest.skip("the real SmolLM2 has not been converted on this machine")
    real = json.loads(config_file.read_text())
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads",
                "num_key_value_heads", "rope_theta", "tie_word_embeddings"):
        if key in real:
            assert SMOLLM2_SHAPE[key] == real[key], key


def test_lazy_exports():
    assert kvlab.GraphSafeStaticCache.__name__ == "GraphSafeStaticCache"
    assert kvlab.GraphSafeDecoder.__name__ == "GraphSafeDecoder"
    with pytest.raises(AttributeError):
        kvlab.NoSuchThing  # noqa: B018

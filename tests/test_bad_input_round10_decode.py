"""Issue 48, probe round 10: generate-static following the user's generation config, a NumPy
setting edited under a held decoder, and decoding under torch.autocast: tokens other than naive's,
with no error."""

import numpy as np
import pytest
import torch

import kvlab
from kvlab.graph_safe_cache import GraphSafeError
from kvlab.lab.models import tiny_model
from kvlab.paged_cache import PagedCacheError

PICKING = {"repetition_penalty": 3.0, "no_repeat_ngram_size": 1, "num_beams": 2,
           "suppress_tokens": [5, 6], "encoder_repetition_penalty": 2.0,
           "return_dict_in_generate": True}


@pytest.mark.parametrize("field", PICKING)
def test_generate_static_refuses_a_generation_config_that_picks_other_tokens(field, prompt):
    """model.generation_config.repetition_penalty = 3.0 (or beams, suppressed tokens, ...) reached
    model.generate: generate-static returned other tokens than naive with no error;
    return_dict_in_generate=True raised a raw TypeError."""
    model = tiny_model("tiny-llama")
    ids = prompt(8)
    setattr(model.generation_config, field, PICKING[field])
    with pytest.raises(ValueError, match=f"follows model.generation_config: {field}="):
        kvlab.decode(model, ids, 6, strategy="generate-static")
    setattr(model.generation_config, field, None)  # as the message says
    assert torch.equal(kvlab.decode(model, ids, 6, strategy="generate-static"),
                       kvlab.decode(model, ids, 6))


def test_generate_static_takes_a_generation_config_of_neutral_values(prompt):
    """Token ids, lengths, sampling settings (unused: greedy) and a neutral penalty pick the same
    tokens: not refused."""
    model = tiny_model("tiny-llama")
    ids = prompt(8)
    config = model.generation_config
    config.temperature, config.top_k, config.repetition_penalty, config.max_length = 0.7, 5, 1.0, 9
    assert torch.equal(kvlab.decode(model, ids, 6, strategy="generate-static"),
                       kvlab.decode(model, ids, 6))


def test_generate_static_refuses_a_missing_generation_config(prompt):
    """model.generation_config = None raised AttributeError: 'NoneType' ... 'pad_token_id'."""
    model = tiny_model("tiny-llama")
    model.generation_config = None
    with pytest.raises(TypeError, match="model.generation_config is NoneType"):
        kvlab.decode(model, prompt(8), 6, strategy="generate-static")


@pytest.mark.parametrize("strategy", ["graph-safe", "graph-safe-speculative", "paged"])
def test_a_numpy_setting_edited_under_a_held_decoder_is_refused(strategy, prompt):
    """variance_epsilon = np.float32(...) edited after a held decode: the snapshot kept only float,
    int, bool, str and None settings, so the decoder replayed the old value."""
    model = tiny_model("tiny-llama")
    ids = prompt(6, batch=2)
    norm = model.model.layers[0].input_layernorm
    norm.variance_epsilon = np.float32(1e-6)
    state = kvlab.STRATEGIES[strategy].state(model, ids, 8)
    kvlab.decode(model, ids, 8, strategy=strategy, **state)
    norm.variance_epsilon = np.float32(0.5)
    with pytest.raises((GraphSafeError, PagedCacheError), match="variance_epsilon changed"):
        kvlab.decode(model, ids, 8, strategy=strategy, **state)


@pytest.mark.parametrize("strategy", ["naive", "static", "graph-safe", "graph-safe-kernels"])
def test_decoding_under_autocast_is_refused(strategy, prompt):
    """Under torch.autocast graph-safe's tokens differed from naive's (also under autocast), and
    static and the kernels raised a raw index_copy_ dtype error."""
    model = tiny_model("tiny-llama")
    ids = prompt(6, batch=3)
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(ValueError,
                                                                    match="torch.autocast is on"):
        kvlab.decode(model, ids, 5, strategy=strategy)
    assert torch.equal(kvlab.decode(model, ids, 5, strategy=strategy), kvlab.decode(model, ids, 5))


@pytest.mark.parametrize("checker", ["check_naive_decode", "check_cache_update"])
def test_a_checker_needs_two_tokens_to_check_a_loop(checker):
    """Round 11: check_naive_decode(bad, new_tokens=1) called a loop that never appends its token
    "correct": one token is the prefill's argmax, the same for a broken loop."""
    from kvlab.exercises import lesson01, lesson02

    check = getattr(lesson01, checker, None) or getattr(lesson02, checker)
    with pytest.raises(ValueError, match="new_tokens must be"):
        check(lambda model, ids, n: ids[:, -n:], model=tiny_model("tiny-llama"), new_tokens=1)


def test_return_dict_in_generate_is_named_for_what_it_changes(prompt):
    """Round 11: return_dict_in_generate was refused as picking other tokens; it changes the
    output."""
    model = tiny_model("tiny-llama")
    model.generation_config.return_dict_in_generate = True
    with pytest.raises(ValueError, match="return another output than the new tokens"):
        kvlab.decode(model, prompt(8), 6, strategy="generate-static")

"""kvlab.decoding: input validation, the strategy table, and the naive loop against
model.generate."""

import pytest
import torch

import kvlab
from kvlab import decoding, strategies
from kvlab.lab.models import TINY_CONFIGS, tiny_model


@pytest.fixture(scope="module")
def model():
    return tiny_model("tiny-llama")


@pytest.mark.parametrize("name", sorted(TINY_CONFIGS))
def test_naive_equals_generate_without_cache(name, prompt):
    model = tiny_model(name)
    ids = prompt(7, batch=2)
    expected = model.generate(ids, max_new_tokens=10, do_sample=False,
                              use_cache=False)[:, ids.shape[1]:]
    new = kvlab.decode(model, ids, 10, strategy="naive")
    assert new.dtype == torch.long and new.shape == (2, 10)
    assert torch.equal(new, expected)


def test_decode_defaults_to_naive_and_calls_on_token(model, prompt):
    ids = prompt(6)
    seen = []
    new = kvlab.decode(model, ids, 5, on_token=lambda step, tok: seen.append((step, tok.clone())))
    assert [s for s, _ in seen] == [0, 1, 2, 3, 4]
    assert all(t.shape == (1, 1) for _, t in seen)
    assert torch.equal(torch.cat([t for _, t in seen], dim=1), new)
    assert torch.equal(new, decoding.decode_naive(model, ids, 5))


def test_greedy_picks_the_last_positions_argmax():
    logits = torch.zeros(2, 3, 5)
    logits[0, -1, 4] = 1.0
    logits[1, -1, 2] = 1.0
    logits[0, 0, 1] = 9.0  # earlier positions do not count
    assert torch.equal(decoding.greedy(logits), torch.tensor([[4], [2]]))


@pytest.mark.parametrize(
    ("ids", "n", "match"),
    [
        ([[1, 2, 3]], 3, "LongTensor"),  # a list
        (torch.tensor([[1.0, 2.0]]), 3, "LongTensor"),  # floats
        (torch.tensor([1, 2, 3]), 3, "LongTensor"),  # 1-D
        (torch.zeros(1, 0, dtype=torch.long), 3, "empty"),
        (torch.tensor([[1, 2]]), 0, "positive int"),
        (torch.tensor([[1, 2]]), -2, "positive int"),
        (torch.tensor([[1, 2]]), 2.0, "positive int"),
        (torch.tensor([[1, 256]]), 2, "vocabulary"),
        (torch.tensor([[1, -1]]), 2, "vocabulary"),
        (torch.tensor([[1, 2]]), 1023, "max_position_embeddings"),
        (torch.tensor([[1, 2]], device="meta"), 2, "input_ids.to"),
    ],
)
def test_decode_rejects_bad_inputs(model, ids, n, match):
    with pytest.raises(ValueError, match=match):
        kvlab.decode(model, ids, n)


def test_check_inputs_accepts_the_longest_allowed(model):
    # 2 + 1022 == max_position_embeddings
    decoding.check_inputs(model, torch.tensor([[1, 2]]), 1022)


def test_unknown_strategy(model, prompt):
    with pytest.raises(ValueError, match="naive"):
        kvlab.decode(model, prompt(6), 2, strategy="speculative")
    with pytest.raises(ValueError, match="unknown strategy"):
        strategies.strategy_named("nope")


def test_strategy_table():
    assert "naive" in kvlab.STRATEGIES and kvlab.STRATEGIES is strategies.STRATEGIES
    for name, s in kvlab.STRATEGIES.items():
        assert (s.function.__module__.startswith("kvlab.") and s.name == name
                and s.kind in strategies.KINDS), name
    assert strategies.strategy_named("naive").function is decoding.decode_naive


def test_a_padded_batch_is_refused_and_a_tokenizers_output_is_accepted(prompt):
    from transformers import BatchEncoding

    model = tiny_model("tiny-llama")
    ids = prompt(6, batch=2)
    mask = torch.ones_like(ids)
    decode = kvlab.decode
    assert torch.equal(decode(model, BatchEncoding({"input_ids": ids, "attention_mask": mask}), 3),
                       decode(model, ids, 3))
    assert torch.equal(decode(model, ids, 3, attention_mask=mask), decode(model, ids, 3))
    mask[1, :2] = 0  # left padding of the second row
    for call in (lambda: decode(model, ids, 3, attention_mask=mask, strategy="handwritten"),
                 lambda: decode(model, {"input_ids": ids, "attention_mask": mask}, 3)):
        with pytest.raises(ValueError, match=r"padded rows \(row, padding tokens\): \[\(1, 2\)\]"):
            call()
    with pytest.raises(ValueError, match="attention_mask must be a tensor of the ids' shape"):
        decode(model, ids, 3, attention_mask=mask[:, :3])


def test_more_bad_inputs_get_a_clear_error(model, prompt):
    ids = prompt(5)
    for bad_ids, n, says in [(ids[:0], 3, "the batch is empty"),
                             (ids, True, "max_new_tokens must be a positive int"),
                             ({"ids": ids}, 3, "needs 'input_ids'")]:
        with pytest.raises(ValueError, match=says):
            kvlab.decode(model, bad_ids, n)
    for mask in (torch.full(ids.shape, 0.5), torch.full(ids.shape, 2)):
        with pytest.raises(ValueError, match="only 0 \\(padding\\) and 1"):
            kvlab.decode(model, ids, 2, attention_mask=mask)
    meta = tiny_model("tiny-llama").to("meta")
    with pytest.raises(ValueError, match="'meta' device"):
        kvlab.decode(meta, ids.to("meta"), 2)


def test_load_models_pair_is_refused_with_what_to_do(prompt):
    pair = kvlab.load_model("tiny-llama")
    with pytest.raises(TypeError,
                       match=r"load_model returns \(model, tokenizer\)\. Unpack it first"):
        kvlab.decode(pair, prompt(4), 2)
    with pytest.raises(TypeError, match="a torch.nn.Module"):
        kvlab.decode("tiny-llama", prompt(4), 2)


def test_float_ids_are_refused_with_the_conversion(model):
    with pytest.raises(ValueError, match=r"LongTensor .* input_ids\.long\(\)"):
        kvlab.decode(model, torch.tensor([[1.0, 2.0]]), 2)


def test_options_a_strategy_would_ignore_are_refused(model, prompt):
    from transformers import StaticCache

    from kvlab.graph_decoder import GraphSafeDecoder
    from kvlab.graph_safe_cache import GraphSafeStaticCache

    ids = prompt(4)
    decoder = GraphSafeDecoder(model, 16)
    cache = GraphSafeStaticCache(config=model.config, max_cache_len=16)
    with pytest.raises(ValueError, match="pass decoder= or cache=, not both.*Drop decoder="):
        kvlab.decode(model, ids, 3, strategy="graph-safe", decoder=decoder, cache=cache)
    with pytest.raises(ValueError, match="pass decoder= or max_cache_len=, not both"):
        kvlab.decode(model, ids, 3, strategy="graph-safe", decoder=decoder, max_cache_len=32)
    for strategy, made in (("graph-safe", cache),
                           ("static", StaticCache(config=model.config, max_cache_len=16))):
        with pytest.raises(ValueError,
                           match="pass cache= or max_cache_len=, not both.*Drop max_cache_len="):
            kvlab.decode(model, ids, 3, strategy=strategy, cache=made, max_cache_len=32)
    want = kvlab.decode(model, ids, 3)  # each one alone is still taken
    assert torch.equal(kvlab.decode(model, ids, 3, strategy="graph-safe", decoder=decoder), want)
    assert torch.equal(kvlab.decode(model, ids, 3, strategy="graph-safe", cache=cache), want)
    assert torch.equal(kvlab.decode(model, ids, 3, strategy="static", max_cache_len=32), want)

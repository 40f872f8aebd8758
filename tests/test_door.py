"""The door (kvlab.decoding.check_inputs, unpadded_ids): issue 48's bad inputs, refused once, with
what to do."""

import numpy as np
import pytest
import torch
from transformers import BatchEncoding

import kvlab
from kvlab import decoding
from kvlab.lab.models import tiny_model

ALL = sorted(kvlab.STRATEGIES)
EAGER = [name for name, s in kvlab.STRATEGIES.items() if not s.compiled and s.exact]


@pytest.mark.parametrize("strategy", ALL)
def test_removed_layers_are_refused_for_every_strategy(strategy, prompt):
    """Finding 1: the shared counter of the graph-safe cache advanced only when the last configured
    layer ran."""
    model = tiny_model("tiny-llama")
    model.model.layers = model.model.layers[:1]  # the config still says 2
    with pytest.raises(ValueError,
                       match=r"num_hidden_layers is 2 but the model has 1 decoder layers.*"
                             r"model\.config\.num_hidden_layers = 1"):
        kvlab.decode(model, prompt(5), 3, strategy=strategy)


def test_added_layers_and_a_held_decoder_are_refused_and_the_fix_works(prompt):
    from kvlab.graph_decoder import GraphSafeDecoder

    model = tiny_model("tiny-llama")
    ids = prompt(5)
    decoder = GraphSafeDecoder(model, 16, graph=False)
    # 3 present, 2 configured
    model.model.layers.append(tiny_model("tiny-llama", seed=1).model.layers[1])
    for call in (lambda: kvlab.decode(model, ids, 3, strategy="graph-safe", decoder=decoder),
                 lambda: decoder.generate(ids, 3), lambda: kvlab.decode(model, ids, 3)):
        with pytest.raises(ValueError, match=r"is 2 but the model has 3 decoder layers.*= 3"):
            call()
    model.config.num_hidden_layers = 3  # what the message says to do
    with pytest.raises(ValueError,
                       match=r"layers\[2\] reads and writes cache layer 1 .*layer_idx = 2"):
        # a copied layer would share layer 1's cache
        kvlab.decode(model, ids, 3, strategy="handwritten")
    model.model.layers[2].self_attn.layer_idx = 2  # every strategy agrees with naive again
    want = kvlab.decode(model, ids, 4)
    assert torch.equal(kvlab.decode(model, ids, 4, strategy="graph-safe", graph=False), want)
    assert torch.equal(kvlab.decode(model, ids, 4, strategy="handwritten"), want)


def test_a_second_mask_that_differs_is_refused(prompt):
    """Finding 4: the keyword used to win silently over the tokenizer's padded mask."""
    model = tiny_model("tiny-llama")
    ids = prompt(6, batch=2)
    padded, ones = torch.ones_like(ids), torch.ones_like(ids)
    padded[1, :2] = 0
    for inputs, keyword in ((BatchEncoding({"input_ids": ids, "attention_mask": padded}), ones),
                            ({"input_ids": ids, "attention_mask": ones}, padded),
                            ({"input_ids": ids, "attention_mask": ones}, ones[:, :3])):
        with pytest.raises(ValueError, match="two different attention masks.*Pass one of them"):
            kvlab.decode(model, inputs, 3, attention_mask=keyword)
    same = kvlab.decode(model, {"input_ids": ids, "attention_mask": ones}, 3,
                        attention_mask=ones.clone().bool())
    assert torch.equal(same, kvlab.decode(model, ids, 3))
    # the same padded mask twice: still padded
    with pytest.raises(ValueError, match=r"padded rows .*\[\(1, 2\)\]"):
        kvlab.decode(model, {"input_ids": ids, "attention_mask": padded}, 3,
                     attention_mask=padded.clone())


def test_inputs_a_strategy_would_not_read_are_refused(prompt):
    model = tiny_model("tiny-llama")
    ids = prompt(4)
    with pytest.raises(ValueError,
                       match=r"\['position_ids'\], which kvlab's strategies would not read"):
        kvlab.decode(model, {"input_ids": ids, "position_ids": torch.arange(4)[None] + 7}, 2)
    # a tokenizer's token_type_ids: decoder-only models do not read them
    zeros = torch.zeros_like(ids)
    assert torch.equal(kvlab.decode(model, {"input_ids": ids, "token_type_ids": zeros}, 2),
                       kvlab.decode(model, ids, 2))
    # list ids with a mask: the ids' error
    with pytest.raises(ValueError, match=r"LongTensor .*return_tensors='pt'"):
        kvlab.decode(model, {"input_ids": [[1, 2]], "attention_mask": torch.ones(1, 2)}, 2)


@pytest.mark.parametrize("n", [np.int64(4), np.int32(4), torch.tensor(4), np.uint8(4)])
def test_integer_likes_are_counts(n, prompt):
    model = tiny_model("tiny-llama")
    ids = prompt(5)
    got = decoding.check_inputs(model, ids, n)
    assert got == 4 and type(got) is int
    assert torch.equal(kvlab.decode(model, ids, n), kvlab.decode(model, ids, 4))


@pytest.mark.parametrize("n", [True, np.True_, torch.tensor(True), torch.tensor([4]), 4.0, "4",
                               None])
def test_non_counts_are_refused(n, prompt):
    with pytest.raises(ValueError, match="max_new_tokens must be a positive int"):
        kvlab.decode(tiny_model("tiny-llama"), prompt(5), n)


@pytest.mark.parametrize("strategy", ["static", "graph-safe", "graph-safe-speculative", "paged"])
def test_integer_likes_reach_every_strategy_as_ints(strategy, prompt):
    model = tiny_model("tiny-llama")
    ids = prompt(5)
    assert torch.equal(kvlab.decode(model, ids, np.int64(4), strategy=strategy),
                       kvlab.decode(model, ids, 4))


def test_ids_past_the_embedding_are_refused_whatever_the_config_says(prompt):
    model = tiny_model("tiny-llama")  # 256 embedding rows
    model.config.vocab_size = 300
    ids = torch.tensor([[1, 2, 260]])
    with pytest.raises(ValueError,
                       match=r"vocabulary \[0, 256\) \(model\.config\.vocab_size says 300; "
                             r"the embedding "
                             r"has 256 rows.*resize_token_embeddings"):
        kvlab.decode(model, ids, 2, strategy="handwritten")
    # the last row is still a token
    assert decoding.check_inputs(model, torch.tensor([[1, 255]]), 2) == 2
    # scores ids the embedding cannot read back
    model.lm_head = torch.nn.Linear(64, 300, bias=False)
    with pytest.raises(ValueError,
                       match=r"lm_head scores 300 token ids but its embedding reads 256"):
        kvlab.decode(model, torch.tensor([[1, 2]]), 2)


def test_a_module_without_a_config_is_refused(prompt):
    with pytest.raises(TypeError, match=r"a torch\.nn\.Module with a \.config.*load_model"):
        kvlab.decode(torch.nn.Linear(4, 4), prompt(3), 2)


def test_a_model_without_a_head_or_with_live_dropout_is_refused(prompt):
    from transformers import AutoModelForCausalLM

    model = tiny_model("tiny-llama")
    with pytest.raises(TypeError, match="no language-model head.*AutoModelForCausalLM"):
        kvlab.decode(model.model, prompt(3), 2)
    config = model.config.__class__(**{**model.config.to_dict(), "attention_dropout": 0.5})
    dropping = AutoModelForCausalLM.from_config(config).train()
    with pytest.raises(ValueError,
                       match=r"train mode and model\.layers\.0\.self_attn drops "
                             r".*p=0\.5.*model\.eval\(\)"):
        kvlab.decode(dropping, prompt(3), 2)
    assert torch.equal(kvlab.decode(dropping.eval(), prompt(3), 3),
                       kvlab.decode(dropping, prompt(3), 3))
    assert torch.equal(kvlab.decode(model.train(), prompt(3), 3),
                       kvlab.decode(model.eval(), prompt(3), 3))


@pytest.mark.parametrize("name", list(kvlab.STRATEGIES))
def test_an_unknown_keyword_is_refused_by_the_callers_name(name):
    """Every strategy refuses a keyword it does not take, naming it as the caller wrote it, before
    any work (not a Python TypeError naming kvlab's internals)."""
    model = kvlab.tiny_model("tiny-llama")
    with pytest.raises(TypeError, match=r"no_such_option") as caught:
        kvlab.decode(model, torch.tensor([[1, 2, 3]]), 2, strategy=name, no_such_option=1)
    assert "unexpected keyword" not in str(caught.value)
    accepted = kvlab.STRATEGIES[name].keywords()
    assert accepted is None or "on_token" in accepted


# ---- the second probe round of issue 48
# -------------------------------------------------------------------------

def test_stepping_a_held_decoder_by_hand_checks_the_model_too():
    """decode_steps and step replay the graphs like generate: a model changed since is refused, not
    decoded as it was."""
    model = tiny_model("tiny-llama")
    ids = torch.tensor([[3, 44, 90, 12, 200]])
    decoder = kvlab.STRATEGIES["graph-safe"].state(model, ids, 12)["decoder"]
    kvlab.decode(model, ids, 12, strategy="graph-safe", decoder=decoder)  # captures
    decoder.prefill(ids)
    model.model.layers[0].mlp.register_forward_hook(lambda mod, args, out: out * 50)
    with pytest.raises(kvlab.graph_safe_cache.GraphSafeError, match="forward hooks"):
        decoder.decode_steps(6)
    with pytest.raises(kvlab.graph_safe_cache.GraphSafeError, match="forward hooks"):
        decoder.step()


@pytest.mark.parametrize("strategy", ["graph-safe", "graph-safe-kernels", "paged"])
def test_an_edit_between_building_and_the_first_decode_is_refused(strategy):
    model = tiny_model("tiny-llama")
    ids = torch.tensor([[3, 44, 90, 12, 200]])
    state = kvlab.STRATEGIES[strategy].state(model, ids, 6)
    model.model.layers = model.model.layers[:1]
    model.config.num_hidden_layers = 1
    with pytest.raises(kvlab.graph_safe_cache.GraphSafeError, match="decoder layers"):
        kvlab.decode(model, ids, 6, strategy=strategy, **state)


def test_on_token_gets_a_copy_and_must_be_a_function():
    model = tiny_model("tiny-llama")
    ids = torch.tensor([[3, 44, 90]])
    expected = kvlab.decode(model, ids, 6)
    got = kvlab.decode(model, ids, 6, strategy="graph-safe",
                       on_token=lambda k, token: token.fill_(0))
    assert torch.equal(got, expected)
    with pytest.raises(TypeError, match="on_token must be a function"):
        kvlab.decode(model, ids, 6, strategy="graph-safe", on_token=5)


def test_a_decoder_that_is_not_one_is_refused():
    model = tiny_model("tiny-llama")
    with pytest.raises(TypeError, match="decoder= takes a GraphSafeDecoder"):
        kvlab.decode(model, torch.tensor([[1, 2, 3]]), 2, strategy="graph-safe", decoder="foo")


def test_integer_likes_are_counts_everywhere():
    model = tiny_model("tiny-llama")
    ids = torch.tensor([[3, 44, 90]])
    expected = kvlab.decode(model, ids, 4)
    for strategy in ("static", "graph-safe"):
        got = kvlab.decode(model, ids, 4, strategy=strategy, max_cache_len=np.int64(20))
        assert torch.equal(got, expected)
    assert torch.equal(kvlab.GraphSafeDecoder(model, np.int64(16), np.int64(1)).generate(ids, 4),
                       expected)
    assert tiny_model("tiny-llama", dtype="bf16").dtype == torch.bfloat16


def test_the_batcher_refuses_a_graph_setting_it_cannot_take():
    from kvlab.continuous_batching import ContinuousBatcher

    for graph in ("yes", None):
        with pytest.raises(ValueError, match="graph must be True, False or .emulate."):
            ContinuousBatcher(tiny_model("tiny-llama"), num_blocks=4, graph=graph)

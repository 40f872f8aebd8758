"""Exercise checkers of lesson 00: the reference passes, typical mistakes get their own hint, a stub
is "not attempted" (or, under KVLAB_SOLUTIONS=1, checked with the reference), and code that raises
gets "your code raised"."""

import copy
import re

import pytest
import torch
from student_code import assert_unattempted_filled_in_and_raising, raises
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from kvlab.exercises import lesson00
from kvlab.exercises.common import FILLED_PREDICTION
from kvlab.lab import models
from kvlab.lab.models import tiny_model
from kvlab.sizes import llama_parameter_count

SMOLLM2_CONFIG = LlamaConfig(**models.SMOLLM2_SHAPE)  # tied, 9 query heads sharing 3 kv heads


def sizes(c):
    return (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
            c.intermediate_size, c.vocab_size, c.num_hidden_layers)


def count(c, *, kv_heads=None, lm_head=None, norms=True):
    """A hand-written count with switchable mistakes (the right one with the defaults)."""
    h, H, K, d, intermediate, V, layers = sizes(c)
    K = K if kv_heads is None else kv_heads
    head = (not c.tie_word_embeddings) if lm_head is None else lm_head
    per_layer = 2 * h * H * d + 2 * h * K * d + 3 * h * intermediate + (2 * h if norms else 0)
    return V * h + layers * per_layer + (h if norms else 0) + (V * h if head else 0)


def test_reference_count_is_what_the_model_holds():
    for cfg in (tiny_model("tiny-llama").config, lesson00.small_gqa_config(),
                lesson00.with_changes(lesson00.small_gqa_config(), tie_word_embeddings=True)):
        assert llama_parameter_count(cfg) == sum(
            p.numel() for p in LlamaForCausalLM(cfg).parameters())
        assert count(cfg) == llama_parameter_count(cfg)


@pytest.mark.parametrize("config", [SMOLLM2_CONFIG, tiny_model("tiny-llama").config, None],
                         ids=["smollm2-shape", "tiny-llama", "default"])
def test_parameter_count_right_and_wrong(config):
    assert lesson00.check_parameter_count(llama_parameter_count,
                                          config=config).startswith("correct")
    assert lesson00.check_parameter_count(count, config=config).startswith("correct")
    q_heads = lesson00.check_parameter_count(lambda c: count(c, kv_heads=c.num_attention_heads),
                                             config=config)
    assert q_heads.startswith("not quite") and "num_key_value_heads" in q_heads
    never_head = lesson00.check_parameter_count(lambda c: count(c, lm_head=False), config=config)
    assert never_head.startswith("not quite") and "lm_head is a matrix of its own" in never_head
    always_head = lesson00.check_parameter_count(lambda c: count(c, lm_head=True), config=config)
    assert always_head.startswith("not quite") and "count it once" in always_head
    no_norms = lesson00.check_parameter_count(lambda c: count(c, norms=False), config=config)
    assert no_norms.startswith("not quite") and "norms" in no_norms
    assert re.search(r"\(-[\d,]+\)", no_norms)  # the signed difference is shown
    text = lesson00.check_parameter_count(lambda c: "many", config=config)
    assert text.startswith("not quite") and "return a number" in text


def test_parameter_count_takes_one_element_arrays_and_calls_nan_wrong():
    import numpy as np

    assert lesson00.check_parameter_count(
        lambda c: torch.tensor([llama_parameter_count(c)])).startswith("correct")
    assert lesson00.check_parameter_count(
        lambda c: np.array([llama_parameter_count(c)])).startswith("correct")
    nan = lesson00.check_parameter_count(lambda c: float("nan"))
    assert (nan.startswith("not quite: parameter_count should return a number")
            and "not a finite number" in nan)
    several = lesson00.check_parameter_count(lambda c: torch.tensor([1, 2]))
    assert "shape (2,)" in several and "return a number" in several


def test_parameter_count_names_the_config_it_failed_on():
    # a count that ignores tie_word_embeddings passes the tied SmolLM2 config but not its untied
    # twin
    verdict = lesson00.check_parameter_count(lambda c: count(c, lm_head=False),
                                             config=SMOLLM2_CONFIG)
    assert ("untied lm_head" in verdict
            and f"{llama_parameter_count(SMOLLM2_CONFIG) + 49152 * 576:,}" in verdict)


@pytest.fixture(scope="module")
def stand_in():
    return lesson00.stand_in_chat_tokenizer()


def no_generation_prompt(tok, q):
    return tok.apply_chat_template([{"role": "user", "content": q}],
                                   return_tensors="pt")["input_ids"]


def whole_encoding(tok, q):
    return tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                   return_tensors="pt")


def question_alone(tok, q):
    return tok(q, return_tensors="pt")["input_ids"]


def one_dimensional(tok, q):
    return lesson00.chat_ids(tok, q)[0]


def as_list(tok, q):
    return lesson00.chat_ids(tok, q).tolist()


def system_role(tok, q):
    return tok.apply_chat_template([{"role": "system", "content": q}], add_generation_prompt=True,
                                   return_tensors="pt")["input_ids"]


CHAT_MISTAKES = [(no_generation_prompt, "add_generation_prompt=True"),
                 (whole_encoding, "['input_ids']"),
                 (question_alone, "apply_chat_template"), (one_dimensional, "batch dimension"),
                 (as_list, "as a list"), (system_role, "role 'user'")]


def test_stand_in_tokenizer_writes_the_chat_format(stand_in):
    ids = lesson00.chat_ids(stand_in, "Hi?")
    assert ids.dtype == torch.long and ids.shape[0] == 1
    assert stand_in.decode(ids[0]) == "<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("tokenizer", [None, "stand-in"])
def test_chat_ids_right_and_wrong(tokenizer, stand_in):
    tok = stand_in if tokenizer else None
    right = lesson00.check_chat_ids(lesson00.chat_ids, tokenizer=tok)
    assert right.startswith("correct") and ("stand-in" in right) == (tok is None)
    for wrong, words in CHAT_MISTAKES:
        verdict = lesson00.check_chat_ids(wrong, tokenizer=tok)
        assert verdict.startswith("not quite") and words in verdict, (wrong.__name__, verdict)
    hard_coded = lesson00.chat_ids(stand_in, "What is the capital of France?")
    verdict = lesson00.check_chat_ids(lambda tok, q: hard_coded, tokenizer=tok)
    assert (verdict.startswith("not quite") and "Why is the sky blue" in verdict
            and "position" in verdict)


def test_chat_ids_on_the_real_tokenizer():
    folder = models.cache_dir() / models.DEFAULT_MODEL
    if not models.is_converted(folder):
        pytest.skip(f"no converted SmolLM2 in {folder} (set KVLAB_CACHE, or load the model once)")
    tok = AutoTokenizer.from_pretrained(folder)
    right = lesson00.check_chat_ids(lesson00.chat_ids, tokenizer=tok)
    assert right.startswith("correct") and "stand-in" not in right
    for wrong, words in CHAT_MISTAKES:
        verdict = lesson00.check_chat_ids(wrong, tokenizer=tok)
        assert verdict.startswith("not quite") and words in verdict, (wrong.__name__, verdict)


def test_gqa_prediction():
    cfg = copy.deepcopy(SMOLLM2_CONFIG)
    with torch.device("meta"):
        gqa = sum(p.numel() for p in LlamaForCausalLM(cfg).parameters())
        cfg.num_key_value_heads = cfg.num_attention_heads
        mha = sum(p.numel() for p in LlamaForCausalLM(cfg).parameters())
    assert lesson00.nearest_choice(mha / gqa, lesson00.GQA_RATIOS) == "10%"
    assert lesson00.check_gqa_prediction("10%", gqa_parameters=gqa,
                                         mha_parameters=mha).startswith("correct")
    wrong = lesson00.check_gqa_prediction("3x", gqa_parameters=gqa, mha_parameters=mha)
    assert wrong.startswith("not quite") and "'10%'" in wrong and f"{mha:,}" in wrong
    assert lesson00.check_gqa_prediction("lots", gqa_parameters=gqa,
                                         mha_parameters=mha).startswith("not quite")
    assert lesson00.nearest_choice(2.9, lesson00.GQA_RATIOS) == "3x"


def test_gqa_prediction_unanswered(monkeypatch):
    monkeypatch.delenv("KVLAB_SOLUTIONS", raising=False)
    assert lesson00.check_gqa_prediction(None, gqa_parameters=100,
                                         mha_parameters=110).startswith("not predicted")
    monkeypatch.setenv("KVLAB_SOLUTIONS", "1")
    # filled in, and says so (round 14)
    assert lesson00.check_gqa_prediction(None, gqa_parameters=100, mha_parameters=110).startswith(
        FILLED_PREDICTION + "correct")


CODE_CHECKERS = [lesson00.check_parameter_count, lesson00.check_chat_ids]


@pytest.mark.parametrize("check", CODE_CHECKERS, ids=lambda c: c.__name__)
def test_unattempted_filled_in_and_raising(check, monkeypatch):
    assert_unattempted_filled_in_and_raising(check, monkeypatch)
    # an attempt is checked as it is
    assert check(raises).startswith("not quite: your code raised ValueError")


@pytest.mark.parametrize("check", CODE_CHECKERS, ids=lambda c: c.__name__)
def test_solution_shown_on_request_only(check, capsys):
    check(check.solution)
    assert capsys.readouterr().out == ""
    check.show_solution()
    assert "def " in capsys.readouterr().out

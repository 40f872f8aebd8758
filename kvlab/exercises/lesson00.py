"""Checkers for lesson 00 (setup and model anatomy): code the student writes, and one prediction.

- ``check_parameter_count(parameter_count, config=...)``: a Llama-style parameter count from a
  config, checked against ``kvlab.sizes.llama_parameter_count`` on the config, its other tie setting
  and a small GQA config;
- ``check_chat_ids(chat_ids, tokenizer=...)``: a question turned into the chat template's ids;
- ``check_gqa_prediction(prediction, ...)``: how many more parameters the model would have without
  GQA.
"""

from __future__ import annotations

import copy
import functools
import math
import os

import torch

from ..sizes import llama_parameter_count, model_sizes
from .common import (
    NotANumber,
    SettingError,
    bad_measurement,
    call_student,
    check_prediction,
    code_checker,
    index_dtype_problem,
    measured_ratio,
    number_text,
    real_number,
    settings_read,
)
from .mistakes import first_match

# ---- exercise 1: the parameter count of a Llama-style model, from its config ---------------------


def small_gqa_config():
    """A small untied Llama config with grouped-query attention (4 query heads, 2 kv heads) and a
    head_dim (12) that is not hidden / heads (8), as some models have."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=200, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=12,
                       tie_word_embeddings=False)


def with_changes(config, **changes):
    """A copy of ``config`` with some attributes set."""
    changed = copy.deepcopy(config)
    for name, value in changes.items():
        setattr(changed, name, value)
    return changed


def describe(config) -> str:
    s = model_sizes(config)
    tied = "tied" if getattr(config, "tie_word_embeddings", False) else "untied"
    return (f"a config of {s.layers} layers, hidden {s.hidden}, {s.heads} query / {s.kv_heads} kv "
            f"heads of head_dim {s.head_dim}, MLP {s.intermediate}, vocab {s.vocab}, {tied} "
            "lm_head")


def head_dim_mistake(config, count):
    """``(count(config with head_dim = hidden // heads), hint)``, the count None where the config's
    head_dim is hidden // heads already."""
    s = model_sizes(config)
    odd = s.head_dim != s.hidden // s.heads
    return (count(with_changes(config, head_dim=s.hidden // s.heads)) if odd else None,
            f"head_dim is config.head_dim ({s.head_dim} here) where the config sets it, not hidden "
            f"/ heads ({s.hidden // s.heads}): read it as kvlab.sizes.model_sizes does.")


def parameter_mistakes(config) -> list[tuple[int | None, str]]:
    """``(count, hint)`` of the typical wrong counts for ``config`` (None where a mistake cannot
    show)."""
    s = model_sizes(config)
    right = llama_parameter_count(config)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    per_layer = llama_parameter_count(with_changes(config, num_hidden_layers=s.layers + 1)) - right
    return [*family_mistakes(config), *[
        head_dim_mistake(config, llama_parameter_count),
        (llama_parameter_count(with_changes(config, num_key_value_heads=s.heads))
         if s.kv_heads != s.heads else None,
         "k_proj and v_proj are hidden x (num_key_value_heads x head_dim): with grouped-query "
         "attention there are fewer kv heads than query heads."),
        (llama_parameter_count(with_changes(config, tie_word_embeddings=not tied)),
         "with tie_word_embeddings=True the lm_head IS the embedding matrix: count it once."
         if tied else "with tie_word_embeddings=False the lm_head is a matrix of its own, vocab x "
                      "hidden: count it."),
        (right - s.vocab * s.hidden if tied else None, "the embedding matrix, vocab x hidden."),
        (right - (2 * s.layers + 1) * s.hidden,
         "the norms: two RMSNorm weight vectors of hidden per layer (before attention, before the "
         "MLP) and a final one."),
        (right - 2 * s.layers * s.hidden, "each layer's two RMSNorm weight vectors (hidden each)."),
        (right - s.layers * s.hidden, "each layer has two norms, not one."),
        (right - s.hidden, "the final norm after the last layer (one vector of hidden)."),
        (right - s.layers * s.hidden * s.intermediate,
         "the MLP has three matrices: gate_proj and up_proj (hidden x MLP size) and down_proj "
         "(back)."),
        (right - s.layers * s.hidden * s.heads * s.head_dim, "the output projection o_proj, (heads "
                                                             "x head_dim) x hidden."),
        (right - (s.layers - 1) * per_layer, "every layer has its own weights: multiply one "
                                             "layer's count by num_hidden_layers."),
    ]]


def family_mistakes(config) -> list[tuple[int, str]]:
    """``(count, hint)`` of a Llama-style count (the exercise's: no biases, no q/k norms) on a
    Qwen2 or Qwen3 config, whose layers hold more; first, as its gap can equal a norm's."""
    s = model_sizes(config)
    right = llama_parameter_count(config)
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    model_type = getattr(cfg, "model_type", "")
    if model_type == "qwen2":
        bias = s.heads * s.head_dim + 2 * s.kv_heads * s.head_dim
        return [(right - s.layers * bias,
                 f"a Qwen2 layer's q_proj, k_proj and v_proj carry biases ({bias:,} per layer: "
                 "heads x head_dim + 2 x kv_heads x head_dim), which the exercise's Llama-style "
                 "count (no biases) leaves out; add them, or check with a Llama config.")]
    if model_type == "qwen3":
        return [(right - s.layers * 2 * s.head_dim,
                 f"a Qwen3 layer normalizes queries and keys per head (q_norm and k_norm, one "
                 f"head_dim vector each: {2 * s.head_dim} per layer), which the exercise's "
                 "Llama-style count leaves out; add them, or check with a Llama config.")]
    return []


def formula_covers(config) -> None:
    """Refuse (SettingError) a ``config=`` whose model has parameters that
    ``kvlab.sizes.llama_parameter_count`` does not count (experts, extra norms, ...): the truth is
    the model's own ``sum(p.numel())``, built on the meta device (no memory). A config transformers
    cannot build is left to the formula."""
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(copy.deepcopy(config))
    except Exception:  # not a causal LM transformers knows: nothing to compare with
        return
    true = sum(p.numel() for p in model.parameters())
    if true != llama_parameter_count(config):
        raise SettingError(
            f"config=: a {getattr(config, 'model_type', type(config).__name__)} model has "
            f"{true:,} parameters, but the exercise's Llama-style formula counts "
            f"{llama_parameter_count(config):,}: its layers hold parts the formula does not cover; "
            "check with a Llama, Mistral, Qwen2 or Qwen3 config (or none: a small GQA config)")


@code_checker(llama_parameter_count)
def check_parameter_count(student, *, config=None) -> str:
    """Per layer q/k/v/o projections, 3 MLP matrices, 2 norms; then embedding, final norm, lm_head
    if untied.

    Checks ``parameter_count(config) -> int`` on ``config`` (default: a small GQA config), the same
    config with the other ``tie_word_embeddings`` and a small untied GQA config, and names the
    mistake behind a wrong count."""
    base = small_gqa_config() if config is None else config
    if config is not None:
        formula_covers(config)
    configs = [base,
               with_changes(base,
                            tie_word_embeddings=not getattr(base, "tie_word_embeddings", False)),
               small_gqa_config()]
    for cfg in configs:
        got, right = call_student(student, copy.deepcopy(cfg)), llama_parameter_count(cfg)
        try:
            got = real_number(got, spelled=False)
        except NotANumber as e:
            return f"not quite: parameter_count should return a number, got {e}"
        if got != right:
            hint = first_match(got, parameter_mistakes(cfg)) or (
                "go part by part: per layer q_proj and o_proj (hidden x heads x head_dim), k_proj "
                "and v_proj (hidden x kv_heads x head_dim), three MLP matrices, two norms; then "
                "embedding, final norm, lm_head if untied.")
            return (f"not quite: for {describe(cfg)} you count {number_text(got)}, the model has "
                    f"{right:,} ({number_text(got - right, '+,')}). Hint: {hint}")
    return (f"correct: your count matches kvlab.sizes.llama_parameter_count on {len(configs)} "
            "configs, tied and untied")


# ---- exercise 2: a question as the chat template's ids -------------------------------------------

# SmolLM2's chat format without its default system prompt: what the stand-in tokenizer writes.
STAND_IN_TEMPLATE = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ "
                     "message['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt "
                     "%}<|im_start|>assistant\n{% endif %}")


@functools.cache
def stand_in_chat_tokenizer():
    """A small chat tokenizer for where the real one is missing (random weights, tests): one id per
    byte, the special tokens ``<|im_start|>`` and ``<|im_end|>``, and SmolLM2's chat format without
    a system prompt."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_chars = sorted(pre_tokenizers.ByteLevel.alphabet())
    core = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(byte_chars)}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core,
                                        extra_special_tokens=["<|im_start|>", "<|im_end|>"])
    tokenizer.chat_template = STAND_IN_TEMPLATE
    return tokenizer


def chat_ids(tokenizer, question: str) -> torch.Tensor:
    """The ids the model reads for ``question``: one user turn in the chat template, then the
    opening of the assistant's turn (``add_generation_prompt=True``), as a LongTensor
    ``[1, prompt_len]``."""
    chat = [{"role": "user", "content": question}]
    return tokenizer.apply_chat_template(chat, add_generation_prompt=True,
                                         return_tensors="pt")["input_ids"]


def template_ids(tokenizer, question: str, *, role: str = "user",
                 generation_prompt: bool = True) -> torch.Tensor:
    chat = [{"role": role, "content": question}]
    return tokenizer.apply_chat_template(chat, add_generation_prompt=generation_prompt,
                                         return_tensors="pt")["input_ids"]


def chat_mistakes(tokenizer, question: str) -> list[tuple[object, str]]:
    """``(ids, hint)`` of the typical wrong answers for ``question``."""
    return [
        (template_ids(tokenizer, question, generation_prompt=False),
         "pass add_generation_prompt=True: without it the prompt ends after your turn, and the "
         "model's likeliest continuation is not the assistant's answer (the opening of its turn is "
         "missing)."),
        (tokenizer(question, return_tensors="pt")["input_ids"],
         "that is the question alone: the model was trained on the chat format, so use "
         "tokenizer.apply_chat_template with a list of messages [{'role': 'user', 'content': "
         "question}]."),
        (tokenizer(question, add_special_tokens=False, return_tensors="pt")["input_ids"],
         "that is the question alone: use tokenizer.apply_chat_template with [{'role': 'user', "
         "'content': question}]."),
        (template_ids(tokenizer, question, role="system"), "the question is the user's turn: role "
                                                           "'user', not 'system'."),
        (template_ids(tokenizer, question, role="assistant"), "the question is the user's turn: "
                                                              "role 'user'."),
    ]


def chat_problem(got, right: torch.Tensor, tokenizer, question: str) -> str | None:
    """What is wrong with ``got`` as the ids of ``question`` (None: nothing)."""
    if isinstance(got, str):
        return "you returned text (tokenize=False?): return the ids, a LongTensor [1, prompt_len]."
    if hasattr(got, "keys") and "input_ids" in got:
        return ("you returned the whole encoding (input_ids and attention_mask; "
                "apply_chat_template returns a dict on transformers 5): return its ['input_ids'].")
    if isinstance(got, list | tuple):
        flat = got[0] if len(got) == 1 and isinstance(got[0], list | tuple) else got
        if list(flat) == right[0].tolist():
            return ("the ids are right, but as a list: return a tensor [1, prompt_len] "
                    "(return_tensors='pt').")
        return "return a LongTensor [1, prompt_len] (return_tensors='pt')."
    if not isinstance(got, torch.Tensor):
        return f"return a LongTensor [1, prompt_len], not a {type(got).__name__}."
    if got.dim() == 1 and torch.equal(got.cpu(), right[0]):
        return "the ids are right, but keep the batch dimension: shape [1, prompt_len]."
    wrong_dtype = index_dtype_problem(got, "token ids")
    if wrong_dtype:
        return wrong_dtype
    got = got.cpu()
    if torch.equal(got, right):
        return None
    hint = first_match(got, chat_mistakes(tokenizer, question))
    if hint:
        return hint
    if got.dim() != 2 or got.shape[0] != 1:
        return f"return shape [1, prompt_len] = (1, {right.shape[1]}), got {tuple(got.shape)}."
    n = min(got.shape[1], right.shape[1])
    k = next((i for i in range(n) if got[0, i] != right[0, i]), n)
    return (f"your {got.shape[1]} ids differ from the template's {right.shape[1]} from position "
            f"{k} on (expected {tokenizer.decode(right[0, k:k + 4])!r}): use "
            "tokenizer.apply_chat_template(chat, "
            "add_generation_prompt=True, return_tensors='pt').")


def tokenizer_setting(tokenizer):
    """``check_chat_ids``'s ``tokenizer=``: a tokenizer object (None: the stand-in), never its name
    or path, which would be silently replaced by the stand-in; else a ValueError saying what to
    pass."""
    if tokenizer is not None and (isinstance(tokenizer, str | bytes | os.PathLike)
                                  or not callable(tokenizer)):
        raise ValueError(f"tokenizer= takes a tokenizer object, got {tokenizer!r:.80}: pass the "
                         "tokenizer kvlab.load_model() returned (model, tokenizer = "
                         "kvlab.load_model()), or AutoTokenizer.from_pretrained(name) of it, or "
                         "leave it out for a stand-in chat tokenizer")
    return tokenizer


@code_checker(chat_ids, read={"tokenizer": tokenizer_setting})
def check_chat_ids(student, *, tokenizer=None,
                   question: str = "What is the capital of France?") -> str:
    """tokenizer.apply_chat_template([{'role': 'user', 'content': question}],
    add_generation_prompt=True, ...).

    Checks ``chat_ids(tokenizer, question) -> LongTensor [1, prompt_len]`` on two questions with
    ``tokenizer`` (a stand-in chat tokenizer where it is None or has no chat template) and names the
    mistake behind wrong ids."""
    stand_in = tokenizer is None or not getattr(tokenizer, "chat_template", None)
    tok = stand_in_chat_tokenizer() if stand_in else tokenizer
    where = " (on a stand-in chat tokenizer: the real one is not loaded here)" if stand_in else ""
    for q in (question, "Why is the sky blue? Answer in one sentence."):
        right = chat_ids(tok, q)
        problem = chat_problem(call_student(student, tok, q), right, tok, q)
        if problem:
            return f"not quite: for the question {q!r}{where}: {problem}"
    return ("correct: your ids equal the chat template's, generation prompt included "
            f"({right.shape[1]} ids for the second question){where}")


# ---- exercise 3 (predict, then run): the parameters grouped-query attention saves ----------------

GQA_CHOICES = {
    "1%": "about 1% more parameters",
    "10%": "about 10% more parameters: only k_proj and v_proj grow, a small part of each layer",
    "50%": "about 50% more parameters",
    "3x": "about three times as many (the KV cache would grow 3x, lesson 02, but the weights do "
          "not)",
}
GQA_RATIOS = {"1%": 1.01, "10%": 1.1, "50%": 1.5, "3x": 3.0}


def nearest_choice(ratio: float, ratios: dict[str, float]) -> str:
    """The key of ``ratios`` nearest to ``ratio`` on a log scale."""
    return min(ratios, key=lambda k: abs(math.log(ratio / ratios[k])))


@settings_read
def check_gqa_prediction(prediction, *, gqa_parameters: int, mha_parameters: int) -> str:
    """Predict, then run: how many more parameters would the model have with one kv head per query
    head? The measured counts (``model.parameters()`` of the model and of its multi-head twin)
    decide."""
    bad = bad_measurement({"gqa_parameters": gqa_parameters, "mha_parameters": mha_parameters})
    if bad:
        return bad
    gqa_parameters, mha_parameters = real_number(gqa_parameters), real_number(mha_parameters)
    ratio, bad = measured_ratio(mha_parameters, gqa_parameters, "mha_parameters / gqa_parameters")
    if bad:
        return bad
    if ratio <= 1:
        # one kv head per query head only adds k_proj/v_proj rows: never fewer parameters
        return (f"not checked: the measured counts give the model with grouped-query attention "
                f"{number_text(gqa_parameters)} parameters and its multi-head twin "
                f"{number_text(mha_parameters)}, but "
                "the twin has more k_proj and v_proj rows, so it cannot have as many or fewer: "
                "the two counts are swapped, or the twin is the same model (num_key_value_heads "
                "not set to num_attention_heads); count both again and pass gqa_parameters= "
                "(the model's) and mha_parameters= (the twin's).")
    verdict = check_prediction(prediction, measured=nearest_choice(ratio, GQA_RATIOS),
                               choices=GQA_CHOICES,
                               what="the growth without grouped-query attention")
    return (f"{verdict} (measured: {number_text(gqa_parameters)} -> {number_text(mha_parameters)} "
            f"parameters, x{number_text(ratio, '.3f')})")

"""Exercise checkers of lessons 01 and 02: the reference passes, typical mistakes get their own hint
(and, for the decode loop, the first token that differs), a stub is "not attempted" (or, under
KVLAB_SOLUTIONS=1, checked with the reference), code that raises gets "your code raised"; the number
checkers name the mistake behind a number."""

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from student_code import STUDENT_ERROR, assert_unattempted_filled_in_and_raising, raises, stub
from transformers import LlamaConfig

from kvlab.decoding import decode_naive
from kvlab.exercises import lesson01, lesson02
from kvlab.exercises.common import NOT_ANSWERED, check_number, checker_model
from kvlab.handwritten import HandwrittenCache, decode_handwritten
from kvlab.lab.models import tiny_model
from kvlab.sizes import flops_breakdown, forward_flops


def cfg():
    return LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                       num_attention_heads=4, num_key_value_heads=2)


def test_check_number_verdicts():
    assert check_number(None, 5, what="x", hint="h") == NOT_ANSWERED
    assert check_number(5, 5, what="x", hint="h").startswith("correct")
    assert check_number(np.int64(5), 5, what="x", hint="h").startswith("correct")
    assert check_number(torch.tensor(5), 5, what="x", hint="h").startswith("correct")
    wrong = check_number(6, 5, what="x", hint="think again")
    assert wrong.startswith("not quite") and "20.0% off" in wrong and "think again" in wrong
    assert check_number("6", 5, what="x", hint="h").startswith("not quite: you gave 6 for x")
    assert check_number(True, 1, what="x", hint="h").startswith("not quite")
    assert check_number(104, 100, what="x", hint="h", rel_tol=0.05).startswith("correct")
    assert check_number(1, 0, what="x", hint="h").startswith("not quite")


def test_check_number_takes_any_one_real_number_and_refuses_the_rest():
    for one in (torch.tensor([5]), torch.tensor([[5.0]]), np.array([5]), np.array(5.0),
                np.float32(5), np.int64(5)):
        assert check_number(one, 5, what="x", hint="h").startswith("correct"), one
    wrong = check_number(torch.tensor([6]), 5, what="x", hint="h")
    assert wrong.startswith("not quite: you gave 6 for x") and "20.0% off" in wrong
    for bad, says in ((torch.tensor([5, 5]), "shape (2,) (2 elements), not one number"),
                      (np.array([5.0, 5.0]), "shape (2,)"), (torch.tensor([True]), "a bool"),
                      (float("nan"), "nan, which is not a finite number"),
                      (float("inf"), "inf, which is not"),
                      (torch.tensor([float("nan")]), "not a finite number"), (1 + 0j, "a complex")):
        verdict = check_number(bad, 5, what="x", hint="h")
        assert (verdict.startswith("not quite: x is a number, but you gave")
                and says in verdict), (bad, verdict)
    # a wrong tensor answer still gets its mistake named
    assert "Hint: bytes, not bits" in lesson02.check_cache_bytes(
        torch.tensor([8 * 5120]), config=tiny_model("tiny-llama").config, tokens=10,
        dtype=torch.float32)


# ---- lesson 01: the naive loop -------------------------------------------------------------------


def loop(*, position=-1, steps=lambda n: range(n), keep_prompt=False, append=True, whole=True):
    """A naive loop with switchable mistakes (the right one with the defaults)."""
    def naive_decode(model, prompt_ids, n):
        seq = prompt_ids
        for _ in steps(n):
            fed = (seq if append else prompt_ids) if whole else seq[:, -1:]
            logits = model(fed, use_cache=False).logits
            seq = torch.cat([seq, logits[:, position].argmax(-1, keepdim=True)], dim=1)
        return seq if keep_prompt else seq[:, prompt_ids.shape[1]:]
    return naive_decode


NAIVE_MISTAKES = [
    (loop(keep_prompt=True), ["returned the prompt too"]),
    (loop(steps=lambda n: range(n - 1)), ["1 too few", "range(n)"]),
    (loop(steps=lambda n: range(n + 1)), ["1 too many"]),
    (loop(position=0), ["token 0", "FIRST position", "logits[:, -1]"]),
    (loop(position=-2), ["token 0", "second-to-last"]),
    (loop(append=False), ["token 1", "append"]),
    (loop(whole=False), ["token 0", "WHOLE sequence"]),
    (loop(keep_prompt=True, steps=lambda n: range(n - 1)),
     ["returned the prompt too", "1 too few"]),
]


def test_naive_decode_right():
    assert lesson01.check_naive_decode(decode_naive).startswith("correct")
    assert lesson01.check_naive_decode(loop()).startswith("correct")
    assert lesson01.check_naive_decode(loop(), model=tiny_model("tiny-qwen3"),
                                       new_tokens=3).startswith("correct")


@pytest.mark.parametrize("wrong, words", NAIVE_MISTAKES,
                         ids=["prompt", "n-1", "n+1", "first", "second-to-last",
                              "no-append", "newest-only", "prompt-and-n-1"])
def test_naive_decode_mistakes(wrong, words):
    verdict = lesson01.check_naive_decode(wrong)
    assert verdict.startswith("not quite") and all(w in verdict for w in words), verdict


def test_naive_decode_shapes_and_batches():
    one_row = lesson01.check_naive_decode(lambda m, ids, n: decode_naive(m, ids, n)[0])
    assert "keep the batch dimension" in one_row
    first_prompt_only = lesson01.check_naive_decode(lambda m, ids, n: decode_naive(m, ids[:1], n))
    # the batch of two decodes n + 1 = 7 tokens (round 14: two different n)
    assert "2 prompts" in first_prompt_only and "(2, 7)" in first_prompt_only
    as_list = lesson01.check_naive_decode(lambda m, ids, n: decode_naive(m, ids, n).tolist())
    assert "LongTensor" in as_list
    for dtype in (torch.float32, torch.bool):  # torch.equal compares values, not dtypes
        verdict = lesson01.check_naive_decode(
            lambda m, ids, n, dtype=dtype: decode_naive(m, ids, n).to(dtype))
        assert verdict.startswith("not quite") and str(dtype) in verdict, verdict


def test_naive_decode_names_the_first_differing_token():
    def wrong_from_token_3(model, prompt_ids, n):
        out = decode_naive(model, prompt_ids, n).clone()
        out[:, 3] = (out[:, 3] + 1) % model.config.vocab_size
        return out

    verdict = lesson01.check_naive_decode(wrong_from_token_3)
    assert verdict.startswith("not quite") and "agree up to token 3" in verdict


# ---- lesson 01: FLOPs of a naive step ------------------------------------------------------------


def with_kv_heads(config, kv):
    config = copy.deepcopy(config)
    config.num_key_value_heads = kv
    return config


FLOPS_MISTAKES = [
    (lambda c, n: forward_flops(c, n, causal=False), "L(L+1)/2 pairs, not L^2"),
    (lambda c, n: forward_flops(c, n, logits="last"), "EVERY position"),
    (lambda c, n: forward_flops(c, n) / 2, "a multiply-add is 2 FLOPs"),
    (lambda c, n: forward_flops(c, n) - flops_breakdown(c, n)["lm_head"], "the lm_head"),
    (lambda c, n: forward_flops(with_kv_heads(c, c.num_attention_heads), n), "num_key_value_heads"),
    (lambda c, n: forward_flops(c, n) - flops_breakdown(c, n)["mlp"] / 3, "three matrices"),
]


@pytest.mark.parametrize("config", [None, cfg()], ids=["default", "3 layers"])
def test_step_flops(config):
    assert lesson01.check_step_flops(lesson01.step_flops, config=config).startswith("correct")
    assert lesson01.check_step_flops(lambda c, n: forward_flops(c, n) * 1.005,
                                     config=config).startswith("not quite")
    for wrong, words in FLOPS_MISTAKES:
        verdict = lesson01.check_step_flops(wrong, config=config)
        assert verdict.startswith("not quite") and words in verdict, verdict
    assert "return a number" in lesson01.check_step_flops(lambda c, n: [1], config=config)


def test_step_flops_takes_one_element_arrays_and_calls_nan_and_inf_wrong():
    assert lesson01.check_step_flops(lambda c, n: torch.tensor([forward_flops(c, n)])).startswith(
        "correct")
    assert lesson01.check_step_flops(lambda c, n: np.array([forward_flops(c, n)])).startswith(
        "correct")
    for bad in (float("nan"), float("inf"), -float("inf"), np.array([float("nan")])):
        verdict = lesson01.check_step_flops(lambda c, n, bad=bad: bad)
        assert (verdict.startswith("not quite: step_flops should return a number")
                and "not a finite number" in verdict)


def test_doubling_prediction():
    assert [lesson01.doubling_choice(r) for r in (1.9, 2.8, 3.9)] == ["2x", "2x-4x", "4x"]
    right = lesson01.check_doubling_prediction("2x-4x", seconds=1.0, doubled_seconds=2.9)
    assert right.startswith("correct") and "x2.90" in right
    wrong = lesson01.check_doubling_prediction("4x", seconds=1.0, doubled_seconds=2.05)
    assert wrong.startswith("not quite") and "'2x'" in wrong


# ---- lesson 02: one head's attention over a cache ------------------------------------------------


def attention(*, scale=True, values=True, drop_newest=False, dim=-1, mask="causal"):
    """One head's attention with switchable mistakes (the right one with the defaults)."""
    def attend(q, keys, vals):
        if drop_newest:
            keys, vals = keys[:-1], vals[:-1]
        T, S, d = q.shape[0], keys.shape[0], q.shape[-1]
        scores = q @ keys.T / (math.sqrt(d) if scale else 1)
        if mask == "causal":
            scores = scores.masked_fill(~torch.ones(T, S, dtype=torch.bool).tril(S - T),
                                        float("-inf"))
        elif mask == "top-left":
            scores = scores.masked_fill(~torch.ones(T, S, dtype=torch.bool).tril(), float("-inf"))
        return torch.softmax(scores, dim=dim) @ (vals if values else keys)
    return attend


ATTEND_MISTAKES = [
    (attention(scale=False), "1/sqrt(d)"),
    (attention(values=False), "weights @ values"),
    (attention(drop_newest=True), "off by one"),
    (attention(dim=0), "dim=-1"),
    (attention(mask=None), "causal mask"),
    (attention(mask="top-left"), "NEWEST tokens"),
]


def test_attend_reference_is_pytorch_attention():
    for T, S in lesson02.ATTEND_CASES:
        q, keys, values = lesson02.attend_case(T, S, 0)
        mask = torch.ones(T, S, dtype=torch.bool).tril(S - T)
        expected = F.scaled_dot_product_attention(q[None], keys[None], values[None],
                                                  attn_mask=mask)[0]
        assert torch.allclose(lesson02.attend(q, keys, values), expected)


def test_attend_names_nan_and_inf_rows_instead_of_crashing():
    def poisoned(value, row):
        def attend(q, keys, values):
            out = lesson02.attend(q, keys, values)
            out[row % out.shape[0], 0] = value
            return out
        return attend

    # the mask counted from key 0: a single query sees no key, softmax is NaN
    def masks_everything(q, keys, values):
        T, S = q.shape[0], keys.shape[0]
        visible = torch.ones(T, S, dtype=torch.bool).tril(diagonal=-1)
        scores = (q @ keys.T / math.sqrt(q.shape[-1])).masked_fill(~visible, float("-inf"))
        return torch.softmax(scores, dim=-1) @ values

    for student in (poisoned(float("nan"), 0), poisoned(float("inf"), -1), masks_everything):
        verdict = lesson02.check_attend(student)
        assert (verdict.startswith("not quite: for 1 query")
                and "holds NaN or infinity" in verdict), verdict
        assert "your code raised" not in verdict


def test_attend_right_and_wrong():
    assert lesson02.check_attend(lesson02.attend).startswith("correct")
    assert lesson02.check_attend(attention()).startswith("correct")
    for wrong, words in ATTEND_MISTAKES:
        verdict = lesson02.check_attend(wrong)
        assert verdict.startswith("not quite") and words in verdict, verdict
    weights = lesson02.check_attend(lambda q, k, v: torch.softmax(q @ k.T, dim=-1))
    assert "attention weights" in weights
    off = lesson02.check_attend(lambda q, k, v: lesson02.attend(q, k, v) + 1e-3)
    assert "row 0" in off


def in_dtype(fn, dtype, back=False):
    """``fn`` computed in ``dtype`` (the inputs cast), returned in it or (``back``) cast back to the
    inputs' dtype."""
    def attend(q, keys, values):
        out = fn(q.to(dtype), keys.to(dtype), values.to(dtype))
        return out.to(q.dtype) if back else out
    return attend


def test_attend_accepts_a_right_answer_in_float32_or_lower_and_still_names_mistakes():
    def sdpa(q, keys, values):
        T, S = q.shape[0], keys.shape[0]
        mask = torch.ones(T, S, dtype=torch.bool).tril(S - T)
        return F.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=mask)[0]

    for right in (in_dtype(lesson02.attend, torch.float32),
                  in_dtype(lesson02.attend, torch.float32, back=True),
                  in_dtype(sdpa, torch.float32), in_dtype(lesson02.attend, torch.bfloat16),
                  in_dtype(lesson02.attend, torch.float16)):
        verdict = lesson02.check_attend(right)
        assert verdict.startswith("correct"), verdict
    for wrong, words in ATTEND_MISTAKES:
        for dtype in (torch.float32, torch.bfloat16):
            verdict = lesson02.check_attend(in_dtype(wrong, dtype))
            assert verdict.startswith("not quite") and words in verdict, (dtype, verdict)
    off = lesson02.check_attend(in_dtype(lambda q, k, v: lesson02.attend(q, k, v) + 1e-3,
                                         torch.float32))
    assert off.startswith("not quite") and "row 0" in off


# ---- lesson 02: a cache's update -----------------------------------------------------------------


class ListCache:
    """A hand-written cache with switchable mistakes (right with the defaults): one K and V tensor
    per layer."""

    def __init__(self, *, store_values=True, return_all=True, append=True, dim=-2, per_layer=True):
        self.keys, self.values = [], []
        self.store_values, self.return_all, self.append, self.dim, self.per_layer = \
            store_values, return_all, append, dim, per_layer

    def update(self, key_states, value_states, layer_idx):
        i = layer_idx if self.per_layer else 0
        if len(self.keys) <= i:
            self.keys.append(key_states)
            self.values.append(value_states)
        elif self.append:
            self.keys[i] = torch.cat([self.keys[i], key_states], dim=self.dim)
            if self.store_values:
                self.values[i] = torch.cat([self.values[i], value_states], dim=self.dim)
            else:
                self.values[i] = value_states
        else:
            self.keys[i], self.values[i] = key_states, value_states
        return (self.keys[i], self.values[i]) if self.return_all else (key_states, value_states)


def cache(**mistake):
    return lambda: ListCache(**mistake)


UPDATE_MISTAKES = [
    (cache(store_values=False), "K without V"),
    (cache(return_all=False), "returns only this call's"),
    (cache(append=False), "overwritten"),
    (cache(dim=1), "along dim 1 (kv_heads)"),
    (cache(dim=-1), "along dim 3 (head_dim)"),
    (cache(per_layer=False), "one K and one V per layer"),
]


def test_cache_update_right_and_wrong():
    assert lesson02.check_cache_update(HandwrittenCache).startswith("correct")
    assert lesson02.check_cache_update(cache()).startswith("correct")
    for wrong, words in UPDATE_MISTAKES:
        verdict = lesson02.check_cache_update(wrong)
        assert verdict.startswith("not quite") and words in verdict, verdict
    one = lesson02.check_cache_update(lambda: type("C", (), {"update": lambda self, k, v, i: k})())
    assert "two tensors" in one


def test_cache_update_plugged_into_the_model():
    # right for the unit calls' shapes, wrong once a layer holds more than 5 tokens
    class LateDrift(ListCache):
        def update(self, key_states, value_states, layer_idx):
            k, v = super().update(key_states, value_states, layer_idx)
            return (k, v) if k.shape[-2] <= 5 else (k, v * 0)

    verdict = lesson02.check_cache_update(LateDrift, new_tokens=4)
    # the first update call whose K/V differ, on the checker's own model (its layer count decides
    # it): named by call and layer, before any token differs
    model, prompt = checker_model("tiny-llama"), torch.arange(1, 6)[None]
    plugged = lesson02.PluggedCache(LateDrift())
    decode_handwritten(model, prompt, 4, cache=plugged)
    assert (verdict.startswith("not quite") and "plugged into a tiny model" in verdict
            and plugged.first_wrong and plugged.first_wrong in verdict
            and "values it returned differ" in verdict), verdict


# ---- lesson 02: numbers and the prediction -------------------------------------------------------


def test_cache_bytes():
    # 2 x 3 layers x 2 kv heads x 16 dims x 2 bytes = 384 bytes per token
    fp16 = dict(config=cfg(), tokens=100, dtype=torch.float16)
    assert lesson02.check_cache_bytes(384 * 100, **fp16).startswith("correct")
    assert lesson02.check_cache_bytes(384 * 200, **fp16, batch=2).startswith("correct")
    query_heads = lesson02.check_cache_bytes(768 * 100, **fp16)
    assert query_heads.startswith("not quite") and "not per query head" in query_heads
    only_k = lesson02.check_cache_bytes(192 * 100, **fp16)
    assert only_k.startswith("not quite") and "K AND V" in only_k
    mib = lesson02.check_cache_bytes(384 * 100 / 2**20, **fp16)
    assert "not MiB" in mib
    assert lesson02.check_cache_bytes(None, **fp16) == NOT_ANSWERED


def test_cache_bytes_element_size():
    mha = with_kv_heads(cfg(), 4)  # no GQA: a doubled count can only be the element size
    verdict = lesson02.check_cache_bytes(2 * 768 * 100, config=mha, tokens=100, dtype=torch.float16)
    assert verdict.startswith("not quite") and "float16 takes 2 bytes" in verdict


def test_cached_positions():
    assert lesson02.check_cached_positions(12, prompt_len=10, new_tokens=3).startswith("correct")
    fed_last = lesson02.check_cached_positions(13, prompt_len=10, new_tokens=3)
    assert fed_last.startswith("not quite") and "never fed back" in fed_last
    naive = lesson02.check_cached_positions(33, prompt_len=10, new_tokens=3)
    assert "naive loop's count" in naive
    assert lesson02.check_cached_positions(None, prompt_len=10, new_tokens=3) == NOT_ANSWERED


@pytest.mark.parametrize("bad", ["a dozen", [12, 12], {"a": 1}, {12}])
def test_ill_typed_answers_get_a_verdict_not_an_exception(bad):
    assert lesson02.check_cached_positions(bad, prompt_len=10, new_tokens=3).startswith("not quite")


@pytest.mark.parametrize("spelled", ["12", [12], (12.0,), " 12 ", "1_2"])
def test_a_number_spelled_as_text_or_a_list_of_one_is_read(spelled):
    verdict = lesson02.check_cached_positions(spelled, prompt_len=10, new_tokens=3)
    assert verdict.startswith("correct"), verdict


def test_cache_vs_weights_prediction(monkeypatch):
    right = lesson02.check_cache_vs_weights_prediction(10_000, weight_bytes=538_000_000,
                                                       cache_bytes_per_token=46_080)
    assert right.startswith("correct") and "11,675 tokens" in right
    wrong = lesson02.check_cache_vs_weights_prediction(100, weight_bytes=538_000_000,
                                                       cache_bytes_per_token=46_080)
    assert wrong.startswith("not quite") and "10000" in wrong
    monkeypatch.delenv("KVLAB_SOLUTIONS", raising=False)
    assert lesson02.check_cache_vs_weights_prediction(None, weight_bytes=1,
                                                      cache_bytes_per_token=1).startswith(
        "not predicted")


# ---- every code checker: not attempted, filled in, raising, solution on request ------------------


class StubCache:
    def __init__(self):
        self.keys, self.values = [], []

    def update(self, key_states, value_states, layer_idx):
        raise NotImplementedError


class RaisingCache(StubCache):
    def update(self, key_states, value_states, layer_idx):
        raise ValueError(STUDENT_ERROR)


CODE_CHECKERS = [(lesson01.check_naive_decode, stub, raises),
                 (lesson01.check_step_flops, stub, raises),
                 (lesson02.check_attend, stub, raises),
                 (lesson02.check_cache_update, StubCache, RaisingCache)]


@pytest.mark.parametrize("check, unattempted, raising", CODE_CHECKERS,
                         ids=lambda x: getattr(x, "__name__", ""))
def test_unattempted_filled_in_and_raising(check, unattempted, raising, monkeypatch):
    assert_unattempted_filled_in_and_raising(check, monkeypatch, unattempted, raising)


@pytest.mark.parametrize("check", [c for c, _, _ in CODE_CHECKERS], ids=lambda c: c.__name__)
def test_solution_shown_on_request_only(check, capsys):
    check(check.solution)
    assert capsys.readouterr().out == ""
    check.show_solution()
    assert "def " in capsys.readouterr().out

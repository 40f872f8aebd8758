"""Checkers for lesson 01 (naive decoding): one prediction, and code the student writes (in reading
order).

- ``check_doubling_prediction(prediction, ...)``: how the naive decode's total time grows when ``n``
  doubles;
- ``check_naive_decode(naive_decode)``: the greedy loop without a cache, token-exact against
  ``kvlab.decoding.decode_naive`` on a tiny random model; a wrong loop is told the first token that
  differs and why;
- ``check_step_flops(step_flops, config=...)``: the FLOPs of one naive step from the config, against
  ``kvlab.sizes.forward_flops``, with the mistake behind a wrong count named.
"""

from __future__ import annotations

import copy
import math

import torch

from ..decoding import decode_naive, first_mismatch
from ..sizes import flops_breakdown, forward_flops, model_sizes
from .common import (
    NotANumber,
    bad_measurement,
    call_student,
    check_prediction,
    code_checker,
    index_dtype_problem,
    kept,
    measured_ratio,
    number_text,
    real_number,
    settings_read,
    watch_positions,
)
from .lesson00 import describe, head_dim_mistake, small_gqa_config
from .mistakes import first_match, show_sources

# ---- exercise 2: the naive greedy loop -----------------------------------------------------------

# (batch, prompt_len, seed, extra n): one prompt, then a batch of two; seeds whose
# first step tells apart the argmax of the first, second-to-last and last position and of the newest
# token alone. The second case decodes one token more than new_tokens: each of n, the prompt length
# and the batch differs between the cases, so a loop that hard-codes any of them fails one.
DECODE_CASES = ((1, 5, 1, 0), (2, 4, 3, 1))


def case_prompt(model, batch: int, length: int, seed: int) -> torch.Tensor:
    """Random prompt ids ``[batch, length]`` in the model's vocabulary, on its device, the same for
    the same seed."""
    vocab = model.config.get_text_config().vocab_size
    ids = torch.randint(1, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))
    return ids.to(next(model.parameters()).device)


@torch.inference_mode()
def wrong_step(model, seq: torch.Tensor, token: torch.Tensor) -> str | None:
    """Why the loop chose ``token`` ``[batch]`` after ``seq`` ``[batch, len]`` where greedy decoding
    chooses another: the argmax of another position's logits, or of the newest token fed alone
    (None: neither)."""
    logits = model(seq, use_cache=False).logits  # [batch, len, vocab]
    if seq.shape[1] > 1 and torch.equal(logits[:, 0].argmax(-1), token):
        return ("that is the argmax of the FIRST position's logits: the next token comes from the "
                "last, logits[:, -1].")
    if seq.shape[1] > 1 and torch.equal(logits[:, -2].argmax(-1), token):
        return ("that is the argmax of the second-to-last position: the next token comes from "
                "logits[:, -1].")
    alone = model(seq[:, -1:], use_cache=False).logits[:, -1].argmax(-1)
    if seq.shape[1] > 1 and torch.equal(alone, token):
        return ("that is what the newest token alone predicts: without a cache, every step must "
                "feed the WHOLE sequence so far (prompt and all tokens made).")
    return None


def decode_problem(model, prompt: torch.Tensor, got, right: torch.Tensor) -> str | None:
    """What is wrong with ``got`` as the ``n`` new tokens after ``prompt`` (None: nothing)."""
    batch, p = prompt.shape
    n = right.shape[1]
    if not isinstance(got, torch.Tensor):
        return (f"return the new token ids as a LongTensor [batch, n] = ({batch}, {n}), not a "
                f"{type(got).__name__}.")
    if got.dim() == 1 and batch == 1 and torch.equal(got, right[0]):
        return "the tokens are right, but keep the batch dimension: return shape [batch, n]."
    if got.dim() != 2 or got.shape[0] != batch:
        return f"return shape [batch, n] = ({batch}, {n}), got {tuple(got.shape)}."
    wrong_dtype = index_dtype_problem(got, "token ids")
    if wrong_dtype:
        return wrong_dtype + " Keep argmax's torch.long, and build seq with torch.cat of them."
    returned_prompt = got.shape[1] > n and got.shape[1] >= p and torch.equal(got[:, :p], prompt)
    if returned_prompt:
        if torch.equal(got[:, p:], right):
            return ("you returned the prompt too: return only the new tokens, seq[:, "
                    "prompt_ids.shape[1]:].")
        got = got[:, p:]  # the prompt and more mistakes: diagnose the new tokens
    prefix = ("you returned the prompt too (return only the new tokens); besides, "
              if returned_prompt else "")
    m = got.shape[1]
    if m != n:
        k = min(m, n)
        agree = torch.equal(got[:, :k], right[:, :k])
        return (prefix + f"you made {m} tokens for n = {n}: {abs(m - n)} too "
                f"{'many' if m > n else 'few'} (one new token per step, `for step in range(n)`)"
                + ("; the tokens you made are right." if agree else
                   "; the first one that differs is token "
                   f"{first_mismatch(got[:, :k], right[:, :k])}."))
    k = first_mismatch(got, right)
    if k is None:
        return None
    if batch > 1 and torch.equal(got[0], right[0]) and torch.equal(got, got[:1].expand_as(got)):
        why = ("every row got row 0's tokens: take the argmax of every row's last logits, "
               "logits[:, -1].argmax(-1, keepdim=True) ([batch, 1]), not row 0's.")
    elif (k > 0 and torch.equal(got, got[:, :1].expand_as(got))
          and torch.equal(got[:, 0], right[:, 0])):
        why = ("every step made the same token: append each new token to the sequence "
               "(torch.cat([seq, next_id], dim=1)) and feed the grown sequence at the next step.")
    else:
        # what the loop had when it chose token k (it agrees up to k)
        seq = torch.cat([prompt, got[:, :k]], dim=1)
        why = wrong_step(model, seq, got[:, k]) or (
            f"step {k} must feed the prompt" + (f" and the {k} tokens made so far" if k else "")
            + " and take the argmax of the last position's logits, "
            "logits[:, -1].argmax(-1, keepdim=True).")
    return (prefix + f"your tokens agree up to token {k} and differ there (expected id "
            f"{right[:, k].tolist()}, got {got[:, k].tolist()}): {why}")


@code_checker(decode_naive)
def check_naive_decode(student, *, model=None, new_tokens: int = 6) -> str:
    """n times: the model on the whole sequence, argmax of logits[:, -1], appended; return the n new
    ids [batch, n].

    Checks ``naive_decode(model, prompt_ids, n)`` token for token (torch.equal) against kvlab's own
    naive loop on ``model`` (default: a tiny random model) for one prompt and a batch of two, and
    names the first token that differs and the likely mistake."""
    from ..lab.models import tiny_model

    model = tiny_model("tiny-llama") if model is None else model
    return kept(model, lambda: naive_decode_verdict(student, model, new_tokens))


def positions_problem(used: list) -> str | None:
    """The first model call (``watch_positions``' ``used``) whose rotary embedding took positions
    other than the ones after what its cache held (0 without a cache), row by row; None if none.
    A random tiny model's tokens hardly move with positions, so they are read, not inferred."""
    for call, did in enumerate(used, 1):
        if did.positions is None or did.shape is None:
            continue
        length = did.shape[1]
        start = did.counter or 0
        row = list(range(start, start + length))
        # one row of positions broadcast over the batch, or one per row
        fed = [did.positions[i:i + length] for i in range(0, len(did.positions), length)]
        wrong = next((r for r in fed if r != row), None)
        if wrong is not None:
            shown = wrong if length <= 6 else [*wrong[:3], "...", *wrong[-2:]]
            right = start if length == 1 else f"{start}..{start + length - 1}"
            return (f"the tokens are right here, but model call {call} fed {length} token"
                    f"{'s' if length > 1 else ''} per row at positions {shown} with {start} "
                    f"cached, not {right}. Hint: a token's position is its index in the sequence: "
                    "pass no position_ids (the model numbers the tokens fed after what its cache "
                    "holds), or exactly those.")
    return None


def naive_decode_verdict(student, model, new_tokens: int) -> str:
    """``check_naive_decode``'s cases on ``model``."""
    for batch, length, seed, extra in DECODE_CASES:
        prompt, n = case_prompt(model, batch, length, seed), new_tokens + extra
        right = decode_naive(model, prompt, n)
        used: list = []
        with torch.inference_mode(), watch_positions(model, used=used):
            got = call_student(student, model, prompt.clone(), n)
        problem = decode_problem(model, prompt, got, right) or positions_problem(used)
        if problem:
            return (f"not quite: for {batch} prompt{'s' if batch > 1 else ''} of {length} tokens "
                    f"and n = {n}, {problem}")
    return (f"correct: your loop makes the naive loop's tokens exactly (torch.equal), {new_tokens} "
            f"new tokens for one prompt and {new_tokens + 1} for a batch of two")


# ---- exercise 3: the FLOPs of one naive step -----------------------------------------------------


def step_flops(config, length: int) -> int:
    """The reference: one naive step over ``length`` positions is one forward pass with ``length``
    new tokens and nothing cached (``kvlab.sizes.forward_flops``, whose parts ``flops_breakdown``
    counts)."""
    return forward_flops(config, length)


def flops_mistakes(config, length: int) -> list[tuple[int | float | None, str]]:
    """``(flops, hint)`` of the typical wrong counts of one naive step (None where a mistake cannot
    show)."""
    s = model_sizes(config)
    parts = flops_breakdown(config, length)
    right = sum(parts.values())
    mha = copy.deepcopy(config)
    mha.num_key_value_heads = s.heads
    per_pair = s.layers * 2 * (2 * s.heads * s.head_dim)  # attention FLOPs per (query, key) pair
    diagonal = ("causal attention: position j sees the j + 1 keys up to AND including itself: "
                "L(L+1)/2 pairs, not L^2/2 or L(L-1)/2.")
    return [
        (right - per_pair * length / 2, diagonal),  # L^2/2 pairs
        (right - per_pair * length, diagonal),  # L(L-1)/2 pairs
        head_dim_mistake(config, lambda c: forward_flops(c, length)),
        (right / 2, "a multiply-add is 2 FLOPs: every matrix product of an m x k by a k x n matrix "
                    "costs 2*m*k*n."),
        (forward_flops(config, length, causal=False) if length > 1 else None,
         "causal attention: position j sees only the j + 1 keys up to itself, not all L: L(L+1)/2 "
         "pairs, not L^2."),
        (forward_flops(config, length, logits="last") if length > 1 else None,
         "HF computes the logits at EVERY position fed (the lm_head runs on all L rows), not only "
         "the last."),
        (right - parts["lm_head"], "the lm_head: hidden x vocab at every position, 2 * hidden * "
                                   "vocab FLOPs each."),
        (right - parts["attention"], "attention itself: the scores Q.K^T and the weighted sum of "
                                     "V, per head."),
        (right - parts["attention"] // 2, "attention is two products: the scores Q.K^T AND the "
                                          "weights times V."),
        (forward_flops(mha, length) if s.kv_heads != s.heads else None,
         "k_proj and v_proj produce num_key_value_heads x head_dim (grouped-query attention), not "
         "one per query head."),
        (right - parts["mlp"] // 3, "the MLP has three matrices (gate, up, down), not two."),
        (right - s.layers * length * 2 * s.hidden * s.heads * s.head_dim,
         "the output projection o_proj, (heads x head_dim) x hidden, per layer."),
        (right - (s.layers - 1) * (parts["projections"] + parts["attention"] + parts["mlp"])
         // s.layers,
         "every layer does this work: multiply one layer's FLOPs by num_hidden_layers."),
    ]


@code_checker(step_flops)
def check_step_flops(student, *, config=None, length: int = 1000) -> str:
    """Per layer and position: q/k/v/o projections, attention over j+1 keys, 3 MLP matrices; then
    the lm_head.

    Checks ``step_flops(config, length)`` against ``kvlab.sizes.forward_flops`` (exactly) at
    lengths 1, 7 and ``length``, on ``config`` and on a small GQA config (whose parts all differ in
    size, so that each mistake shows apart), and names the mistake behind a wrong count."""
    lengths = tuple(dict.fromkeys((1, 7, length)))
    configs = [small_gqa_config()] if config is None else [config, small_gqa_config()]
    for cfg in configs:
        for L in lengths:
            got, right = call_student(student, copy.deepcopy(cfg), L), forward_flops(cfg, L)
            try:
                got = real_number(got, spelled=False)
            except NotANumber as e:
                return f"not quite: step_flops should return a number, got {e}"
            # FLOPs are whole numbers: a float must equal the count exactly
            if got != right:
                hint = first_match(got, flops_mistakes(cfg, L)) or (
                    "count part by part (kvlab.sizes' docstring above has the formula): per layer "
                    "and position 2*hidden*(H*d + 2*K*d + H*d) for the projections and "
                    "3*2*hidden*I for the MLP, 2*2*H*d per "
                    "(query, key) pair for attention, and 2*hidden*vocab per position for the "
                    "lm_head.")
                try:
                    share = float((got - right) / right)
                except OverflowError:  # an int past a float's range
                    share = math.inf
                # a count off by a fraction shows it: never "68,672 ... (+0.0%)" for a wrong one
                integral = got == int(got)
                shown = number_text(got, ",.0f" if integral else ",")
                off = ("many orders of magnitude off" if share == math.inf else f"{share:+.1%}"
                       if round(share, 3) else f"{share * 100:+.2g}%")
                whole = ("" if integral else "FLOPs are whole numbers (a count "
                         "of multiplies and adds has no fraction); ")
                return (f"not quite: for {describe(cfg)}, a step over {L} "
                        f"position{'s' if L > 1 else ''}: you count {shown} FLOPs, the formula "
                        f"{right:,} ({off}). Hint: {whole}{hint}")
    return ("correct: your FLOPs match kvlab.sizes.forward_flops at lengths "
            f"{', '.join(map(str, lengths))} on {len(configs)} "
            f"config{'s' if len(configs) > 1 else ''}")


show_sources(check_step_flops, step_flops, flops_breakdown)


# ---- exercise 1 (predict, then run): doubling n --------------------------------------------------

DOUBLING_CHOICES = {
    "2x": "about twice as long: every step costs about the same, whatever its length",
    "2x-4x": "more than twice, less than four times: later steps cost more (each recomputes the "
             "whole sequence), but part of each step's cost does not grow with the length",
    "4x": "about four times: the total is quadratic in n, the prompt and each step's fixed cost "
          "are negligible",
}


def doubling_choice(ratio: float) -> str:
    """The choice a measured ratio T(2n) / T(n) falls in: below 2.3 "2x", from 3.5 on "4x", "2x-4x"
    between."""
    return "2x" if ratio < 2.3 else "4x" if ratio >= 3.5 else "2x-4x"


@settings_read
def check_doubling_prediction(prediction, *, seconds: float, doubled_seconds: float) -> str:
    """Predict, then run: the naive decode's total time for 2n tokens over its time for n,
    measured."""
    bad = bad_measurement({"seconds": seconds, "doubled_seconds": doubled_seconds})
    if bad:
        return bad
    seconds, doubled_seconds = real_number(seconds), real_number(doubled_seconds)
    ratio, bad = measured_ratio(doubled_seconds, seconds, "doubled_seconds / seconds")
    if bad:
        return bad
    if ratio <= 1:
        # twice the tokens, each step at least as long as before: never faster
        return (f"not checked: the doubled run took {number_text(doubled_seconds, '.3g')} s, no "
                f"longer than the single one ({number_text(seconds, '.3g')} s, "
                f"x{number_text(ratio, '.2f')}): decoding 2n tokens cannot be faster "
                "than n, so this is noise (a run too short to time) or a wrong run (the same n "
                "twice?); the measurement cannot answer the question. Time n and 2n again, with "
                "n large enough to take a second or more.")
    verdict = check_prediction(prediction, measured=doubling_choice(ratio),
                               choices=DOUBLING_CHOICES,
                               what="T(2n) / T(n) of the naive loop")
    return (f"{verdict} (measured: {number_text(seconds, '.2f')} s -> "
            f"{number_text(doubled_seconds, '.2f')} s, x{number_text(ratio, '.2f')})")

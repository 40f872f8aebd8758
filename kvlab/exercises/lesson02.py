"""Checkers for lesson 02 (a hand-written KV cache): code the student writes, two numbers and one
prediction.

- ``check_attend(attend)``: one head's attention for the newest queries over cached keys and values;
- ``check_cache_update(MyCache)``: a cache's ``update(key_states, value_states, layer_idx)``,
  against ``kvlab.handwritten.HandwrittenCache``, then plugged into a tiny model and decoded against
  the naive loop;
- ``check_cache_bytes``, ``check_cached_positions``: numbers, with the mistake behind a wrong one
  named;
- ``check_cache_vs_weights_prediction(prediction, ...)``: at how many tokens the cache outweighs the
  weights.
"""

from __future__ import annotations

import math

import torch

from ..decoding import decode_naive, first_mismatch
from ..handwritten import HandwrittenCache, HandwrittenLayer, decode_handwritten
from ..sizes import kv_cache_bytes, model_sizes
from .common import (
    CHECK_LAYERS,
    as_number,
    bad_measurement,
    call_student,
    check_number,
    check_prediction,
    checker,
    checker_model,
    code_checker,
    kept,
    measured_ratio,
    number_text,
    real_number,
    settings_read,
)
from .mistakes import first_match, show_sources

# ---- exercise 1: attention over a cache, one head ------------------------------------------------


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """One head's attention for the newest ``T`` tokens: ``q [T, d]`` over the cache's ``keys`` and
    ``values`` ``[S, d]`` (the ``T`` tokens' own keys and values are its last rows) -> ``[T, d]``.

    Query ``i`` stands at position ``S - T + i`` and sees keys ``0 .. S - T + i`` (the causal rule);
    a single new query (``T = 1``) sees every cached key.
    """
    T, S, d = q.shape[0], keys.shape[0], q.shape[-1]
    scores = q @ keys.T / math.sqrt(d)  # [T, S]
    # [T, S]: key j <= S - T + i
    visible = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(diagonal=S - T)
    # [T, S], each row sums to 1
    weights = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
    return weights @ values  # [T, d]


def attend_tolerance(dtype: torch.dtype) -> float:
    """rtol = atol for an attention returned in ``dtype``: float32 rounding at least (an answer
    computed in float32 and returned in float64 is right too); for a lower precision three of its
    roundings (1.5 machine epsilons: the scores', the weights', the output's), since the inputs are
    exact in it (``attend_case``). More would pass a wrong scale: 1/sqrt(d) off by 5% moves a
    bfloat16 output by about 3 epsilons."""
    eps = torch.finfo(dtype).eps if dtype.is_floating_point else 0.0
    return max(1e-5, 1.5 * eps)


def _computed_in(got: torch.Tensor, right: torch.Tensor, returned: torch.dtype):
    """The lower-precision dtype (float16, then bfloat16) that ``got`` (returned in ``returned``)
    was computed in: every value of it exact in that dtype, and no farther from ``right`` than its
    rounding; else None (an error of that size from a slip, an offset, is not exact in it)."""
    for lower in (torch.float16, torch.bfloat16):
        tol = attend_tolerance(lower)
        if (torch.finfo(lower).bits < torch.finfo(returned).bits
                and torch.equal(got.to(lower).to(got.dtype), got)
                and torch.allclose(got, right, rtol=tol, atol=tol)):
            return lower
    return None


# (T queries, S cached keys): a decode step, a chunk after a cache, a prefill
ATTEND_CASES = ((1, 6), (3, 8), (4, 4))
HEAD_DIM = 8
# the head_dim of each case: two of them, so that a scale hard-coded to 1/sqrt(8) fails one
ATTEND_HEAD_DIMS = (HEAD_DIM, HEAD_DIM, 2 * HEAD_DIM)


def attend_case(T: int, S: int, seed: int, head_dim: int = HEAD_DIM):
    """Random ``q [T, d]``, ``keys`` and ``values [S, d]`` in float64 (``d = head_dim``), the same
    for the same seed. Every value is exact in bfloat16 and float16 (8 significant bits): an answer
    computed in them errs by its own roundings only, never by the inputs' cast."""
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(n, head_dim, dtype=torch.float64, generator=gen)
                 .to(torch.bfloat16).to(torch.float64) for n in (T, S, S))


def attend_mistakes(q, keys, values) -> list[tuple[torch.Tensor | None, str]]:
    """``(output, hint)`` of the typical wrong attentions for one case (None where a mistake cannot
    show)."""
    T, S, d = q.shape[0], keys.shape[0], q.shape[-1]
    visible = torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T)
    masked = (q @ keys.T / math.sqrt(d)).masked_fill(~visible, float("-inf"))
    def rows(f):  # query by query
        return torch.cat([f(i) for i in range(T)])

    return [
        (attend(q * math.sqrt(d), keys, values), "scale the scores by 1/sqrt(d), d = q.shape[-1]: "
                                                 "q @ keys.T / d**0.5."),
        (attend(q / math.sqrt(d), keys, values), "divide the scores by sqrt(d), not by d."),
        (attend(q, keys, keys), "the weights average the VALUES: weights @ values, not weights @ "
                                "keys."),
        (attend(q, keys[:-1], values[:-1]),
         "off by one: the newest key is the query's own token (the cache's last row); a query sees "
         "keys up to and including its own position."),
        (torch.softmax(masked, dim=0) @ values, "softmax over the keys, dim=-1: each query's "
                                                "weights sum to 1."),
        (rows(lambda i: attend(q[i:i + 1], keys, values)) if T > 1 else None,
         "with several queries apply the causal mask: query i (at position S - T + i) sees keys 0 "
         ".. S - T + i only."),
        (rows(lambda i: attend(q[i:i + 1], keys[:i + 1], values[:i + 1])) if S > T else None,
         "the T queries are the NEWEST tokens, at positions S - T .. S - 1: query i sees keys 0 .. "
         "S - T + i (torch.ones(T, S).tril(diagonal=S - T)), not 0 .. i."),
    ]


@code_checker(attend)
def check_attend(student) -> str:
    """softmax(q @ keys.T / sqrt(d)), causal for T > 1 (query i sees keys 0..S-T+i), then @ values
    -> [T, d].

    Checks ``attend(q, keys, values)`` on a decode step (1 query over 6 keys), 3 queries over 8 keys
    and a prefill (4 over 4, head_dim 16, the others 8), given in float64, against the reference
    (within float32 rounding, or three roundings of the dtype returned, 16 bits at least), and names
    the mistake behind a wrong output."""
    for seed, ((T, S), d) in enumerate(zip(ATTEND_CASES, ATTEND_HEAD_DIMS, strict=True)):
        q, keys, values = attend_case(T, S, seed, d)
        right = attend(q, keys, values)
        got = call_student(student, q.clone(), keys.clone(), values.clone())
        where = (f"{T} quer{'y' if T == 1 else 'ies'} [{T}, {d}] over {S} cached keys and "
                 f"values [{S}, {d}]")
        if not isinstance(got, torch.Tensor):
            return f"not quite: for {where}, return a tensor [T, d], not a {type(got).__name__}"
        if got.shape != right.shape:
            if tuple(got.shape) == (T, S):
                why = "that is the shape of the attention weights: return weights @ values."
            elif got.numel() == right.numel():
                why = "keep one row per query: shape [T, d]."
            else:
                why = "one output row of d per query."
            return (f"not quite: for {where}, expected shape {tuple(right.shape)}, got "
                    f"{tuple(got.shape)}. Hint: {why}")
        # attention outputs are real floats: a cast to a complex or integer dtype drops or rounds
        if not got.dtype.is_floating_point:
            return (f"not quite: for {where}, you returned {got.dtype}; attention outputs are real "
                    f"floating-point numbers: return the inputs' dtype ({q.dtype}), with no "
                    "complex part and no integer rounding.")
        # under 16 bits the rounding alone hides the mistakes: all zeros, no causal mask
        if torch.finfo(got.dtype).bits < 16:
            return (f"not quite: for {where}, you returned {got.dtype}, too coarse to tell a right "
                    f"attention from a wrong one: return the inputs' dtype ({q.dtype}), or at "
                    "least 16 bits (float16, bfloat16).")
        tol, returned = attend_tolerance(got.dtype), got.dtype
        got = got.to(right.dtype)
        if torch.allclose(got, right, rtol=tol, atol=tol):
            continue
        hint = first_match(got, attend_mistakes(q, keys, values), rtol=tol, atol=tol)
        finite = torch.isfinite(got).all(dim=-1)  # [T]
        if hint is None and not bool(finite.all()):
            bad = int((~finite).nonzero()[0])
            hint = (f"row {bad} (the query at position {S - T + bad}) holds NaN or infinity: a "
                    "softmax over scores that are all -inf (every key masked) is NaN, and so is "
                    "everything computed from a NaN. Each query "
                    "sees at least its own key: query i sees keys 0 .. S - T + i.")
        elif hint is None and (lower := _computed_in(got, right, returned)) is not None:
            hint = (f"your output is right only to {lower}'s rounding, though returned in "
                    f"{returned}: it was computed at lower precision (a cast to {lower} on the "
                    f"way?). Compute in the inputs' dtype ({q.dtype}), or return the {lower} "
                    "result as it is (its own rounding is allowed then).")
        elif hint is None:
            bad = int((~torch.isclose(got, right, rtol=tol, atol=tol)).any(dim=-1).nonzero()[0])
            hint = (f"row {bad} (the query at position {S - T + bad}) is the first that differs: "
                    "softmax over the keys it may see of q @ keys.T / sqrt(d), times values.")
        return f"not quite: for {where}, your output differs. Hint: {hint}"
    return ("correct: your attention matches the reference for a decode step, a chunk of queries "
            "after a cache and a prefill (causal mask, 1/sqrt(d), softmax over the keys, values)")


# ---- exercise 2: a cache's update ----------------------------------------------------------------

# (layer_idx, new tokens) of each update call, through every layer of the checker's model
# (CHECK_LAYERS, more than two: storage for layers 0 and 1 only fails): a 1-token prefill, a decode
# step, a 3-token chunk
UPDATE_CALLS = tuple((layer, new) for new in (1, 1, 3) for layer in range(CHECK_LAYERS))
UPDATE_SHAPE = (2, 2, 4)  # batch, kv_heads, head_dim


class PluggedCache(HandwrittenCache):
    """A ``HandwrittenCache`` whose ``update`` hands the model what ``student_cache.update``
    returns; the lengths the model asks (positions, mask sizes) still come from kvlab's own layers,
    so only the returned K/V can differ."""

    def __init__(self, student_cache):
        super().__init__()
        self.student_cache = student_cache
        self.calls = 0
        self.first_wrong: str | None = None  # the first call whose K/V differ, in words

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        right = super().update(key_states, value_states, layer_idx)
        got = call_student(self.student_cache.update, key_states, value_states, layer_idx)
        self.calls += 1
        # every call's K/V equal the reference's exactly (a cat is exact): a cache that drops
        # positions the argmax tokens happen not to need still shows here
        if self.first_wrong is None and isinstance(got, tuple | list) and len(got) == 2:
            for name, mine, ref in zip(("keys", "values"), got, right, strict=True):
                if not isinstance(mine, torch.Tensor):
                    continue  # the model's own error says what is wrong
                if mine.shape != ref.shape:
                    self.first_wrong = (f"at update call {self.calls} (layer {layer_idx}) it "
                                        f"returned {name} of shape {tuple(mine.shape)}, where the "
                                        f"layer holds {tuple(ref.shape)}")
                elif not torch.equal(mine, ref):
                    self.first_wrong = (f"at update call {self.calls} (layer {layer_idx}) the "
                                        f"{name} it returned differ from the layer's")
                if self.first_wrong:
                    break
        return got


def stored_tensors(obj, depth: int = 3):
    """The tensors an object holds in its attributes, lists, tuples and dicts, a few levels deep."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth > 0:
        items = (vars(obj).values() if hasattr(obj, "__dict__")
                 else obj.values() if isinstance(obj, dict)
                 else obj if isinstance(obj, list | tuple) else ())
        for item in items:
            yield from stored_tensors(item, depth - 1)


def holds(tensor: torch.Tensor, part: torch.Tensor) -> bool:
    """True where ``part`` ``[batch, kv_heads, n, head_dim]`` lies in ``tensor`` along dim -2."""
    if tensor.dim() != 4 or tensor.shape[:2] != part.shape[:2] or (
            tensor.shape[-1] != part.shape[-1]):
        return False
    n = part.shape[-2]
    return any(torch.equal(tensor[:, :, s:s + n], part) for s in range(tensor.shape[-2] - n + 1))


def update_problem(cache, got, k, v, right_k, right_v, fed_k,
                   others: tuple = ()) -> str | None:
    """What is wrong with ``got`` as the return of one ``update`` call (None: nothing). ``k``,
    ``v``: this call's new K/V; ``right_k``, ``right_v``: the layer's expected K/V after it;
    ``fed_k``: every key fed so far, all layers; ``others``: the keys fed to the other layers."""
    if not (isinstance(got, tuple | list) and len(got) == 2
            and all(isinstance(t, torch.Tensor) for t in got)):
        return ("update returns two tensors: (all of the layer's keys, all of its values) after "
                "this call.")
    gk, gv = got
    # a cache in another dtype rounds (float16) or hands the model a dtype it cannot mix (float64)
    for name, g, fed in (("keys", gk, k), ("values", gv, v)):
        if g.dtype != fed.dtype:
            return (f"the returned {name} are {g.dtype}, but key_states and value_states came in "
                    f"{fed.dtype}: store and return them in the dtype they come in (the model's), "
                    "with no .half(), .double() or .to(dtype).")
    if torch.equal(gk, right_k) and torch.equal(gv, right_v):
        return None
    if torch.equal(gk, right_v) and torch.equal(gv, right_k):
        return "keys and values are swapped: return (keys, values)."
    if torch.equal(gk, right_k):
        if torch.equal(gv, right_k):
            return ("you return the keys as the values: store the values too, in a tensor of their "
                    "own.")
        if torch.equal(gv, v):
            return ("K without V: the keys are appended, the values are not; append value_states "
                    "the same way.")
    if torch.equal(gv, right_v) and torch.equal(gk, k):
        return ("V without K: the values are appended, the keys are not; append key_states the "
                "same way.")
    old = right_k.shape[-2] - k.shape[-2]  # tokens the layer held before this call
    if old and torch.equal(gk, k) and torch.equal(gv, v):
        if any(t.shape == right_k.shape and torch.equal(t, right_k) for t in stored_tensors(cache)):
            return ("your cache holds all the tokens but update returns only this call's: return "
                    "all of the layer's K/V.")
        return (f"you return only this call's {k.shape[-2]} token(s): the layer's {old} earlier "
                "ones are gone (overwritten?). Append instead: torch.cat([old_keys, key_states], "
                "dim=-2), and return the result.")
    if gk.shape != right_k.shape and (torch.equal(gk, fed_k)
                                      or any(holds(gk, other) for other in others)):
        return ("the layers' keys mix: keep one K and one V per layer, for every layer_idx (index "
                "the storage by layer_idx; a model has config.num_hidden_layers layers, SmolLM2 "
                "30).")
    if old and torch.equal(gk, torch.cat([k, right_k[:, :, :old]], dim=-2)):
        return "the new tokens go AFTER the old ones: torch.cat([old_keys, key_states], dim=-2)."
    for name, g, r in (("keys", gk, right_k), ("values", gv, right_v)):
        if g.shape != r.shape:
            # the dim the cat grew
            grown = [i for i in range(4) if g.dim() == 4 and g.shape[i] > r.shape[i]]
            if grown and grown != [2]:
                return (f"you concatenated the {name} along dim {grown[0]} "
                        f"({('batch', 'kv_heads', 'seq', 'head_dim')[grown[0]]}): tokens go along "
                        "the sequence axis, dim=-2 of [batch, kv_heads, seq, head_dim] (got "
                        f"{tuple(g.shape)}, expected {tuple(r.shape)}).")
            return (f"the {name} have shape {tuple(g.shape)}, expected {tuple(r.shape)} [batch, "
                    "kv_heads, seq, head_dim].")
        if not torch.equal(g, r):
            t = int((g != r).any(dim=(0, 1, 3)).nonzero()[0])
            return (f"the returned {name} differ from the layer's tokens so far from token {t} on "
                    f"(of {r.shape[-2]}).")
    return None


@code_checker(HandwrittenCache)
def check_cache_update(student, *, model=None, new_tokens: int = 5) -> str:
    """update(key_states, value_states, layer_idx): append the new K/V [batch, kv_heads, new,
    head_dim] on dim -2.

    Checks ``MyCache().update`` call by call (a prefill, a decode step and a chunk, through three
    layers) against ``HandwrittenCache``, then plugs it into ``model`` (default: a tiny random
    model of three layers) and decodes against the naive loop; names the mistake, the call and the
    first token that differs."""
    model = checker_model("tiny-llama") if model is None else model
    return kept(model, lambda: cache_update_verdict(student, model, new_tokens))


def cache_update_verdict(student, model, new_tokens: int) -> str:
    """``check_cache_update``'s calls and decode, with ``model``."""
    cache, reference = call_student(student), HandwrittenCache()
    gen = torch.Generator().manual_seed(0)
    fed = []  # (layer, key) of every call, in call order
    for i, (layer, new) in enumerate(UPDATE_CALLS):
        batch, kv_heads, head_dim = UPDATE_SHAPE
        k, v = (torch.randn(batch, kv_heads, new, head_dim, generator=gen) for _ in range(2))
        fed.append((layer, k))
        right_k, right_v = (t.clone() for t in reference.update(k, v, layer))
        got = call_student(cache.update, k.clone(), v.clone(), layer)
        problem = update_problem(cache, got, k, v, right_k, right_v,
                                 torch.cat([key for _, key in fed], dim=-2),
                                 tuple(key for at, key in fed if at != layer))
        if problem:
            return (f"not quite: at update call {i + 1} (layer {layer}, {new} new token(s), "
                    f"{right_k.shape[-2]} in the layer after it): {problem}")
    prompt = torch.arange(1, 6, device=next(model.parameters()).device)[None]  # [1, 5]
    right = decode_naive(model, prompt, new_tokens)
    plugged = PluggedCache(call_student(student))
    tokens = decode_handwritten(model, prompt, new_tokens, cache=plugged)
    if plugged.first_wrong:
        return ("not quite: your update passes call by call, but plugged into a tiny model's "
                f"decode of {new_tokens} tokens, {plugged.first_wrong}. Hint: return all the K/V "
                "the layer holds after the call (every position so far, in order), every call.")
    k = first_mismatch(tokens, right)
    if k is not None:
        return ("not quite: your update passes call by call, but plugged into a tiny model the "
                f"decode first differs from the naive loop at token {k}. Hint: return the layer's "
                "K/V as they are after the call, every call.")
    return ("correct: update matches HandwrittenCache call by call, and plugged into a tiny model "
            f"it decodes the naive loop's {new_tokens} tokens exactly")


show_sources(check_cache_update, HandwrittenCache.update, HandwrittenLayer.append)


# ---- numbers -------------------------------------------------------------------------------------


def cache_bytes_mistakes(config, tokens: int, dtype, batch: int) -> list[tuple[int | None, str]]:
    """``(bytes, hint)`` of the typical wrong cache sizes."""
    s = model_sizes(config)
    right = kv_cache_bytes(config, tokens, dtype, batch=batch)
    per_element = right // (2 * s.layers * s.kv_heads * s.head_dim * tokens * batch or 1)
    return [
        (right // batch if batch > 1 else None,
         f"one sequence: the cache holds K and V for each of the batch's {batch} sequences"
         + (" (or K without V: both are a factor 2)." if batch == 2 else ".")),
        (right * s.heads // s.kv_heads if s.heads != s.kv_heads else None,
         "the cache stores one K and one V per KV head (num_key_value_heads), not per query head."),
        (right // 2, "K AND V: two vectors per kv head, layer and token (or: the element size of "
                     "the dtype?)."),
        (right * 2 if per_element <= 2 else None,
         f"{str(dtype).removeprefix('torch.')} takes {per_element} bytes per element."),
        (right // s.layers if s.layers > 1 else None, "every layer keeps its own K and V: times "
                                                      "num_hidden_layers."),
        (right * 8, "bytes, not bits."),
        (right / 2**10, "give bytes, not KiB."), (right / 2**20, "give bytes, not MiB."),
        (right / 2**30, "give bytes, not GiB."),
    ]


@checker
def check_cache_bytes(answer, *, config, tokens: int, dtype, batch: int = 1) -> str:
    """Exercise: bytes of K and V a cache holds for ``batch`` sequences of ``tokens`` tokens."""
    answer = as_number(answer)
    return check_number(
        answer, kv_cache_bytes(config, tokens, dtype, batch=batch),
        what=f"KV cache bytes for {batch} x {tokens} tokens in {dtype}",
        hint=first_match(answer, cache_bytes_mistakes(config, tokens, dtype, batch), rtol=1e-3)
        or "2 (K and V) x layers x kv_heads (not query heads) x head_dim x bytes per element, per "
           "token.",
    )


@checker
def check_cached_positions(answer, *, prompt_len: int, new_tokens: int) -> str:
    """Exercise: token positions the cached loop feeds to the model in total."""
    answer = as_number(answer)
    p, n = prompt_len, new_tokens
    mistakes = [
        (p + n, "the last token made is never fed back: the loop stops once it has it."),
        (n, "step 0 feeds the whole prompt (the prefill): p positions, then one per later step."),
        (n * p + n * (n - 1) // 2, "that is the naive loop's count: the cached loop feeds each "
                                   "position once."),
        (p + n - 2, "the prompt once (p), then one token at each of the n - 1 later steps."),
    ]
    return check_number(
        answer, p + n - 1,
        what=f"positions fed by the cached loop for a {p}-token prompt and {n} new tokens",
        hint="the prompt once, then one token per later step.", mistakes=mistakes,
    )


# ---- exercise (predict, then run): the cache against the weights ---------------------------------

CACHE_VS_WEIGHTS_CHOICES = {
    100: "about a hundred tokens", 1_000: "about a thousand tokens",
    10_000: "about ten thousand tokens",
    100_000: "about a hundred thousand tokens",
}


@settings_read
def check_cache_vs_weights_prediction(prediction, *, weight_bytes: int,
                                      cache_bytes_per_token: float) -> str:
    """Predict, then run: at about how many cached tokens of one sequence does the KV cache hold as
    many bytes as the model's weights? The measured bytes (weights' tensors, a filled cache) decide,
    to the nearest power of 10."""
    bad = bad_measurement({"weight_bytes": weight_bytes,
                           "cache_bytes_per_token": cache_bytes_per_token})
    if bad:
        return bad
    weight_bytes, cache_bytes_per_token = (real_number(weight_bytes),
                                           real_number(cache_bytes_per_token))
    tokens, bad = measured_ratio(weight_bytes, cache_bytes_per_token,
                                 "weight_bytes / cache_bytes_per_token")
    if bad:
        return bad
    if tokens < 1:
        # one token's K and V (a vector per layer and kv head) never outweigh every weight matrix
        return (f"not checked: the measurements say one cached token holds "
                f"{number_text(cache_bytes_per_token)} B, more than all the weights "
                f"({number_text(weight_bytes)} B), "
                "which no model's cache does: the two are swapped, or one is not what it says "
                "(bytes, not elements or MiB); measure them again and pass weight_bytes= and "
                "cache_bytes_per_token=.")
    nearest = min(CACHE_VS_WEIGHTS_CHOICES, key=lambda k: abs(math.log10(tokens / k)))
    verdict = check_prediction(prediction, measured=nearest, choices=CACHE_VS_WEIGHTS_CHOICES,
                               what="the length at which the cache outweighs the weights")
    return (f"{verdict} (measured: {number_text(weight_bytes)} B of weights / "
            f"{number_text(cache_bytes_per_token, ',.0f')} B per cached token = "
            f"{number_text(tokens, ',.0f')} tokens)")

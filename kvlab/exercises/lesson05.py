"""Checkers for lesson 05 (the graph-safe StaticCache). Each returns a verdict string; print it.

The code exercises run the student's function beside the package's own cache
(``GraphSafeStaticCache``) on the same tensors, eagerly and inside a captured graph
(``kvlab.graphs.capture``, emulated on a CPU), and name the typical mistake they find. Expected
values are measured live on a tiny model or read from the recorded GPU file.
"""

from __future__ import annotations

import functools
import weakref
from contextlib import contextmanager
from types import SimpleNamespace

import torch

from ..cache_view import counters
from ..graph_safe_cache import GraphSafeStaticCache
from ..graphs import CapturedStep
from .common import (
    FILLED_PREDICTION,
    NotANumber,
    SettingError,
    as_number,
    bad_measurement,
    call_student,
    check_number,
    check_prediction,
    checker,
    checker_model,
    code_checker,
    index_dtype_problem,
    kept,
    read_record,
    real_number,
    settings_read,
)
from .lesson04 import buffer_roles


@functools.cache
def _tiny():
    """The checkers' tiny model, with ``CHECK_LAYERS`` layers (a layer count written in fails)."""
    return checker_model("tiny-llama")


def _cache(max_cache_len: int):
    """An empty one-layer GraphSafeStaticCache (the layer count is all a cache takes from a
    config)."""
    from transformers import LlamaConfig

    from ..lab.models import TINY_COMMON

    return GraphSafeStaticCache(config=LlamaConfig(**{**TINY_COMMON, "num_hidden_layers": 1}),
                                max_cache_len=max_cache_len)


def _as_int(x):
    """An int from an int or a one-element integer tensor, else None."""
    if (isinstance(x, torch.Tensor) and x.numel() == 1
        and not (x.dtype.is_floating_point or x.dtype == torch.bool)):
        return int(x)
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def _replay(fn, statics: list[torch.Tensor], refill) -> list[torch.Tensor] | str:
    """Capture ``fn(*statics)`` (no warm-up), call ``refill()`` to put new values in the static
    tensors, replay once; returns the replay's outputs, or a verdict when the capture refused the
    function (a host read of a tensor)."""
    from ..graphs import CaptureError, capture

    try:
        # inside a capture: no host compare (the eager call checked the inputs)
        graph = capture(lambda *t: call_student(fn, *t, writes_inputs=True), *statics, warmup=0,
                        emulate=True)
    except CaptureError as e:
        return ("not quite: right eagerly, but a captured graph refuses it "
                f"({str(e).split('. A captured')[0]}). Hint: keep counter and valid on the device: "
                "no int(), .item(), `if` or slice bound from them; compute with "
                "torch.arange / torch.where and index with the resulting tensor")
    refill()
    out = graph.replay()
    return list(out) if isinstance(out, (tuple, list)) else [out]


FROZEN = ("Hint: a Python value computed from counter or valid (or a slice) is frozen at capture; "
          "every replay must read the tensors where they live: torch.where(rows < valid, counter + "
          "rows, max_cache_len)")


# ---- 2 · predict, then run: the counters after a padded prefill ----------------------------------

@torch.inference_mode()
def padded_prefill_counters(prompt_len: int, bucket: int, steps: int = 0) -> tuple[int, int]:
    """(vanilla StaticCache counter, GraphSafeStaticCache counter) after one prefill padded to
    ``bucket`` tokens of which the first ``prompt_len`` are the prompt, then ``steps`` one-token
    decode steps, on a tiny model."""
    from transformers import StaticCache

    if not (isinstance(prompt_len, int) and isinstance(bucket, int) and 1 <= prompt_len <= bucket):
        raise ValueError(f"need 1 <= prompt_len <= bucket (ints), got prompt_len={prompt_len!r}, "
                         f"bucket={bucket!r}")
    model = _tiny()
    ids = torch.zeros(1, bucket, dtype=torch.long)
    ids[:, :prompt_len] = torch.arange(1, prompt_len + 1)
    vanilla = StaticCache(config=model.config, max_cache_len=bucket + steps + 1)
    safe = GraphSafeStaticCache(config=model.config, max_cache_len=bucket + steps + 1)
    model(ids, cache=vanilla)
    with safe.valid_window(torch.tensor(prompt_len)):
        model(ids, cache=safe)
    token = torch.ones(1, 1, dtype=torch.long)
    for _ in range(steps):
        model(token, cache=vanilla)
        model(token, cache=safe)
    return int(vanilla.get_seq_length()), int(safe.cache_position)


COUNTER_CHOICES = {
    "A": "both counters at prompt + steps",
    "B": "vanilla at bucket + steps, graph-safe at prompt + steps",
    "C": "both counters at bucket + steps",
    "D": "vanilla at prompt + steps, graph-safe at bucket + steps",
}
COUNTER_WHY = ("vanilla StaticLayer.update adds T, the padded length, so the padding counts as "
               "context; the graph-safe update adds the valid count, a device tensor")


@settings_read
def check_counters_prediction(prediction=None, *, prompt_len: int = 21, bucket: int = 32,
                              steps: int = 3) -> str:
    """Predict, then run: a ``prompt_len``-token prompt padded to ``bucket`` is prefilled, then
    ``steps`` tokens are decoded, once on a vanilla StaticCache and once on a GraphSafeStaticCache
    (valid window = the prompt). Which of ``COUNTER_CHOICES`` are the two counters? The run is made
    here, live."""
    if prompt_len >= bucket:
        # no padding: vanilla and graph-safe counters agree, and all four choices say the same
        raise SettingError(f"check_counters_prediction(prompt_len={prompt_len}, bucket={bucket}): "
                           "the question needs padding (prompt_len < bucket); without it every "
                           "choice describes the same counters")
    vanilla, safe = padded_prefill_counters(prompt_len, bucket, steps)
    p, b = prompt_len + steps, bucket + steps
    table = {"A": (p, p), "B": (b, p), "C": (b, b), "D": (p, b)}
    measured = next((key for key, pair in table.items() if pair == (vanilla, safe)), None)
    if measured is None:  # the package changed under the question: say what the run showed
        return (f"the run gave vanilla {vanilla}, graph-safe {safe}, which none of the choices "
                "describes")
    verdict = check_prediction(prediction, measured=measured, choices=COUNTER_CHOICES,
                               what=f"the pair of counters after a {prompt_len}-token prompt "
                                    f"padded to {bucket}, then {steps} steps")
    if verdict.removeprefix(FILLED_PREDICTION).startswith(("correct", "not quite: you predicted")):
        verdict += f" (measured just now: vanilla {vanilla}, graph-safe {safe}). Why: {COUNTER_WHY}"
    return verdict


# ---- 3 · the write positions of the valid window -------------------------------------------------

def write_positions_solution(counter, valid, bucket: int, max_cache_len: int) -> torch.Tensor:
    """The package's own positions: ``GraphSafeStaticCache.write_positions`` of a cache whose
    counter is ``counter``, inside ``valid_window(valid)``. [bucket]"""
    cache = _cache(max_cache_len)
    cache.set_position(counter)
    with cache.valid_window(torch.as_tensor(valid)):
        return cache.write_positions(bucket, torch.device("cpu"))


# counter, valid, bucket, slots
# (counter, valid, bucket, max_cache_len); the last two have another max_cache_len: a function
# that hard-codes 16 fails them
POSITION_CASES = [(0, 5, 8, 16), (10, 3, 4, 16), (0, 8, 8, 16), (14, 4, 4, 16), (7, 1, 1, 16),
                  (5, 0, 4, 16),  # no valid row: every row to the trash slot
                  (3, 2, 4, 8), (6, 4, 4, 8)]


def _positions_mistake(got: torch.Tensor, counter: int, valid: int, bucket: int, slots: int) -> str:
    rows = torch.arange(bucket)
    want = write_positions_solution(counter, valid, bucket, slots)
    real = (rows < valid) & (counter + rows < slots)  # rows that go to a real slot
    case = (f"positions(counter={counter}, valid={valid}, bucket={bucket}, max_cache_len={slots}) "
            f"gave {got.tolist()}, expected {want.tolist()}")
    for shift in (1, -1):
        if real.any() and torch.equal(got[real], want[real] + shift):
            return (f"not quite: {case}. Hint: off by one position: valid row i goes to slot "
                    "counter + i (row 0 to the counter itself: it counts the tokens already held, "
                    "so it is the next free slot)")
    padded = (rows >= valid) & (counter + rows < slots)
    if padded.any() and torch.equal(got[padded], counter + rows[padded]):
        return (f"not quite: {case}. Hint: padded rows (i >= valid) went to real slots counter + "
                "i: the padding enters the cache as context (padding-pollution). Send them to the "
                "trash slot, max_cache_len")
    if (~real).any() and torch.equal(got[~real], torch.full_like(got[~real], slots - 1)):
        return (f"not quite: {case}. Hint: the trash slot is the extra slot at index "
                "max_cache_len; slot max_cache_len - 1 is a real one, the last token's")
    if torch.equal(got[real], want[real]) and (got[~real] > slots).any():
        return (f"not quite: {case}. Hint: a row that would land past the end (counter + i >= "
                "max_cache_len) must go to the trash slot too: the buffers have max_cache_len + 1 "
                "slots, so a larger index is out of range")
    return (f"not quite: {case}. Hint: rows = arange(bucket); a row keeps counter + i only if i < "
            "valid and counter + i < max_cache_len, else max_cache_len (torch.where)")


@code_checker(write_positions_solution)
def check_write_positions(fn) -> str:
    """Exercise: positions(counter, valid, bucket, max_cache_len): counter + i for valid rows, else
    the trash slot.

    counter and valid are 0-dim long tensors; the result is a LongTensor [bucket]. Rows past the end
    (counter + i >= max_cache_len) go to the trash slot too. Checked eagerly, then replayed from a
    captured graph at other values."""
    for counter, valid, bucket, slots in POSITION_CASES:
        got = call_student(fn, torch.tensor(counter), torch.tensor(valid), bucket, slots)
        if not isinstance(got, torch.Tensor):
            return (f"not quite: positions returned a {type(got).__name__}; return a LongTensor of "
                    "shape [bucket]")
        # index_copy_ takes int64 slots only
        wrong_dtype = index_dtype_problem(got, "slots", widths=(torch.int64,))
        if wrong_dtype:
            return (f"not quite: positions gave a {got.dtype} tensor. {wrong_dtype} (torch.where "
                    "of long tensors stays long)")
        if got.device.type != "cpu" or tuple(got.shape) != (bucket,):
            return (f"not quite: positions(..., bucket={bucket}, ...) gave shape "
                    f"{tuple(got.shape)} on {got.device}; one slot per incoming row, padded rows "
                    f"included: shape [{bucket}], on the counter's device")
        if not torch.equal(got.long(), write_positions_solution(counter, valid, bucket, slots)):
            return _positions_mistake(got.long(), counter, valid, bucket, slots)
    counter, valid = torch.tensor(0), torch.tensor(5)
    replayed = _replay(lambda c, v: fn(c, v, 8, 16), [counter, valid],
                       lambda: (counter.fill_(6), valid.fill_(2)))
    if isinstance(replayed, str):
        return replayed
    want = write_positions_solution(6, 2, 8, 16)
    if not torch.equal(replayed[0].long(), want):
        return ("not quite: captured at counter 0, valid 5 and replayed at counter 6, valid 2, "
                f"your positions gave {replayed[0].tolist()}, expected {want.tolist()}. {FROZEN}")
    return (f"correct: all {len(POSITION_CASES)} cases match GraphSafeStaticCache.write_positions "
            "(trash slot and end of cache included), and a captured graph of your function "
            "follows new counter and valid values")


# ---- 4 · the valid-window write ------------------------------------------------------------------

def package_write(keys, values, new_k, new_v, counter: int, valid: int):
    """What ``GraphSafeStaticCache.update`` does to copies of these buffers:
    ``(keys, values, counter)`` afterwards.

    keys, values: ``[batch, kv_heads, max_cache_len + 1, head_dim]`` (the last slot is the trash
    slot); new_k, new_v: ``[batch, kv_heads, T, head_dim]``; counter, valid: ints."""
    batch, heads, slots, head_dim = keys.shape
    cache = _cache(slots - 1)
    cache.early_initialization(batch, heads, head_dim, keys.dtype, keys.device)
    layer = cache.layers[0]
    layer.keys.copy_(keys)
    layer.values.copy_(values)
    cache.set_position(counter)
    # as in a captured graph, no room check: rows past the end go to the trash slot
    with cache.valid_window(torch.tensor(valid)), cache.unchecked():
        cache.update(new_k, new_v, 0)
    return layer.keys.clone(), layer.values.clone(), int(cache.cache_position)


def write_valid_solution(keys, values, new_k, new_v, counter, valid):
    """The valid window on bare buffers: the slots of exercise 3 (the package's
    ``write_positions``), then what ``GraphSafeStaticCache.update`` does with them: one index_copy_
    each for K and V, the counter advanced in place."""
    at = write_positions_solution(counter, valid, new_k.shape[2], keys.shape[2] - 1)  # [T]
    keys.index_copy_(2, at, new_k)
    values.index_copy_(2, at, new_v)
    return counter.add_(valid)


WRITE_CASES = [  # (batch, kv_heads, max_cache_len, head_dim, T, counter, valid)
    (1, 2, 16, 4, 8, 0, 5),  # a prefill padded to a bucket of 8
    (2, 2, 16, 4, 4, 9, 3),  # batch 2, a later chunk
    (1, 2, 16, 4, 1, 7, 1),  # one decode step
    (1, 2, 16, 4, 4, 14, 2),  # near the end: the padded rows would land past the buffer
    (1, 2, 16, 4, 4, 14, 4),  # valid rows past the end too: a write with no end check fails
    (1, 2, 12, 4, 4, 10, 2),  # another max_cache_len, near its end: 16 hard-coded fails here
]


def write_inputs(batch, heads, slots, head_dim, length, seed):
    gen = torch.Generator().manual_seed(seed)
    # keys, values
    buffers = [torch.randn(batch, heads, slots + 1, head_dim, generator=gen) for _ in range(2)]
    # new_k, new_v
    new = [torch.randn(batch, heads, length, head_dim, generator=gen) for _ in range(2)]
    return buffers + new


def _lands(buffer, new, counter, valid, slots, shift) -> bool:
    """Do the valid rows of ``new`` sit at slots counter + i + shift of ``buffer``?"""
    rows = [i for i in range(valid) if 0 <= counter + i + shift < slots]
    return bool(rows) and all(torch.equal(buffer[:, :, counter + i + shift], new[:, :, i])
                              for i in rows)


def _write_mistake(got, before, new, counter, valid, slots, case) -> str | None:
    """A hint for buffers that differ from the package's, or None when they match."""
    (gk, gv), (bk, bv), (nk, nv), want = (got, before, new,
                                          package_write(*before, *new, counter, valid))
    k_ok, v_ok = (torch.equal(g[:, :, :slots], w[:, :, :slots])
                  for g, w in zip((gk, gv), want[:2], strict=True))
    if k_ok and v_ok:
        return None
    k_same, v_same = torch.equal(gk, bk), torch.equal(gv, bv)
    if k_same and v_same:
        return (f"not quite: {case}: nothing was written into keys or values. Hint: write into the "
                "buffers in place (keys.index_copy_(2, slots, new_k), with the underscore): "
                "keys.index_copy(...) or keys = ... makes a "
                "new tensor that neither the caller nor a captured graph ever reads")
    if k_ok and v_same:
        return (f"not quite: {case}: keys are right, values were never written. Hint: K without V: "
                "write new_v into values too")
    if v_ok and k_same:
        return (f"not quite: {case}: values are right, keys were never written. Hint: V without K: "
                "write new_k into keys too")
    for buffer, rows, what in ((gk, nk, "keys"), (gv, nv, "values")):
        for shift in (1, -1):
            if _lands(buffer, rows, counter, valid, slots, shift):
                return (f"not quite: {case}: your {what} put row i at slot counter + i "
                        f"{'+' if shift > 0 else '-'} 1. Hint: off by one position: the counter is "
                        "the number of tokens held, so row 0 goes to slot "
                        "counter itself")
    padded = [i for i in range(valid, nk.shape[2]) if counter + i < slots]
    for buffer, rows in ((gk, nk), (gv, nv)):
        if padded and any(torch.equal(buffer[:, :, counter + i], rows[:, :, i]) for i in padded):
            return (f"not quite: {case}: padded rows (i >= valid) were written into real slots "
                    "counter + i. Hint: padding written into the cache becomes context "
                    "(padding-pollution); send padded rows to the trash slot, "
                    "index max_cache_len")
    return (f"not quite: {case}: your buffers differ from GraphSafeStaticCache.update's in slots "
            "0..max_cache_len - 1. Hint: slots = torch.where((rows < valid) & (counter + rows < "
            "max_cache_len), counter + rows, "
            "max_cache_len); then index_copy_ along dim 2 into keys and into values")


def _counter_mistake(counter_after: int, returned, counter: int, valid: int, length: int,
                     case, slots: int) -> str | None:
    want = counter + valid
    if counter_after == min(want, slots) and _as_int(returned) == counter_after:
        return None  # valid rows past the end: the counter held at max_cache_len is right too
    if counter_after == want:
        if _as_int(returned) != want:
            return (f"not quite: {case}: the counter tensor is right ({want}) but you returned "
                    f"{returned!r}. Hint: return the counter (the tensor you advanced)")
        return None
    if counter_after == counter and _as_int(returned) == want:
        return (f"not quite: {case}: you returned {want}, but the counter tensor itself still "
                f"holds {counter}. Hint: a captured graph and every layer read the counter by "
                "address: advance it in place, counter.add_(valid)")
    if counter_after == counter + length and length != valid:
        return (f"not quite: {case}: the counter went from {counter} to {counter_after}, by the "
                f"padded length {length}. Hint: advance it by the valid count ({valid}), not by T: "
                "that is what a vanilla StaticLayer gets wrong")
    return (f"not quite: {case}: the counter went from {counter} to {counter_after}, expected "
            f"{want}. Hint: it advances by valid, once per write")


@code_checker(write_valid_solution)
def check_write_valid(fn) -> str:
    """Exercise: write_valid puts the first valid rows at slots counter + i in place, advances
    counter by valid in place.

    keys/values ``[batch, kv_heads, max_cache_len + 1, head_dim]`` (the last slot is the trash
    slot), new_k/new_v ``[batch, kv_heads, T, head_dim]``, counter and valid 0-dim long tensors; the
    padded rows go to the trash slot; returns the counter. Checked against
    GraphSafeStaticCache.update, eagerly and replayed from a captured graph."""
    for seed, (batch, heads, slots, head_dim, length, counter, valid) in enumerate(WRITE_CASES):
        case = (f"[batch {batch}, kv_heads {heads}, max_cache_len {slots}, T {length}], counter "
                f"{counter}, valid {valid}")
        inputs = write_inputs(batch, heads, slots, head_dim, length, seed)
        keys, values = (t.clone() for t in inputs[:2])
        c, v = torch.tensor(counter), torch.tensor(valid)
        addresses = keys.data_ptr(), values.data_ptr(), c.data_ptr()
        try:
            # writes keys, values and the counter in place: its contract
            returned = call_student(fn, keys, values, *inputs[2:], c, v, writes_inputs=True)
        except (IndexError, RuntimeError) as e:
            if counter + length > slots:
                return (f"not quite: {case}: your code raised {type(e).__name__}: "
                        f"{str(e).splitlines()[0][:120]}. Hint: rows that would land at or past "
                        "max_cache_len must go to the trash slot (index max_cache_len) "
                        "too: counter + i is only a slot while it is < max_cache_len")
            raise
        if (keys.data_ptr(), values.data_ptr(), c.data_ptr()) != addresses:
            return (f"not quite: {case}: keys, values or counter point at new memory after your "
                    "call (data_ptr changed: keys.data = ..., set_ or resize). Hint: a captured "
                    "graph keeps the old address; write into the "
                    "tensors in place (index_copy_, add_)")
        mistake = _write_mistake((keys, values), inputs[:2], inputs[2:], counter, valid, slots,
                                 case)
        mistake = mistake or _counter_mistake(int(c), returned, counter, valid, length, case,
                                              slots)
        if mistake:
            return mistake
    # captured once at one counter and valid count, replayed at others: only device-side values may
    # change
    batch, heads, slots, head_dim, length, _, _ = WRITE_CASES[0]
    statics = ([t.clone() for t in write_inputs(batch, heads, slots, head_dim, length, 10)]
               + [torch.tensor(0), torch.tensor(5)])
    later = write_inputs(batch, heads, slots, head_dim, length, 11)

    def refill():
        for static, new in zip(statics, later, strict=False):
            static.copy_(new)
        statics[4].fill_(3)
        statics[5].fill_(2)

    replayed = _replay(fn, statics, refill)
    if isinstance(replayed, str):
        return replayed
    want_k, want_v, want_c = package_write(*later, 3, 2)
    got_ok = all(torch.equal(g[:, :, :slots], w[:, :, :slots])
                 for g, w in ((statics[0], want_k), (statics[1], want_v)))
    if not got_ok or int(statics[4]) != want_c:
        return ("not quite: captured at counter 0, valid 5 and replayed at counter 3, valid 2, "
                f"your write left the counter at {int(statics[4])} (expected "
                f"{want_c}){'' if got_ok else ' and the buffers wrong'}. {FROZEN}")
    return (f"correct: all {len(WRITE_CASES)} cases give GraphSafeStaticCache.update's buffers and "
            "counter, in place at the same addresses, and a graph captured once follows a new "
            "counter and valid count at replay")


# ---- 1 · the whole loop: capture once, put the counters back, replay for every prompt ------------

LOOP_PROMPTS = (9, 5, 12)  # prompt lengths: the second is shorter than the first, the third longer
LOOP_NEW_TOKENS = 6
LOOP_OTHER_N = 4  # the checker's second run
LOOP_WARMUP = 3  # the warm-up calls of the CUDA-graph docs' recipe, which the exercise asks for


def graph_loop_solution(model, cache, prompts, n):
    """Greedy-decode ``n`` tokens after each prompt of ``prompts`` (``[1, p]`` each) over one
    vanilla ``StaticCache``, the decode step captured once (``kvlab.graphs.capture``, 3 warm-up
    calls) and replayed for every prompt."""
    from ..graphs import capture

    token, graph, outs = None, None, []
    for prompt in prompts:
        # rule 3: the same cache, emptied in place (5.24's reset: zero_() on buffers and counters)
        cache.reset()
        # eager prefill: the first new token [1, 1]
        first = model(prompt, cache=cache).logits[:, -1:].argmax(-1)
        if graph is None:
            token = first.clone()  # the static input: written in place from now on, never rebound

            def step(ids):
                # no position_ids: rule 2, the model reads positions from the cache's counters
                return model(ids, cache=cache).logits[:, -1:].argmax(-1)

            graph = capture(step, token, warmup=3)
            for layer in cache.layers:
                # rule 1: the 3 warm-up calls advanced every counter; put each back in place
                layer.cumulative_length.sub_(3)
        token.copy_(first)
        out = [first]
        for _ in range(n - 1):
            token.copy_(graph.replay())
            out.append(token.clone())
        outs.append(torch.cat(out, dim=1))  # [1, n]
    return outs


def loop_prompts() -> list[torch.Tensor]:
    """The exercise's prompts (``LOOP_PROMPTS`` lengths) in the tiny model's vocabulary."""
    g = torch.Generator().manual_seed(5)
    return [torch.randint(1, 256, (1, p), generator=g) for p in LOOP_PROMPTS]


class _RuleBroken(Exception):
    """Raised inside the student's loop by the watched replay: the verdict, before anything worse
    happens."""


@contextmanager
def _watch(model, cache, want: list[torch.Tensor], keys: list[torch.Tensor], n: int):
    """Inside: every ``CapturedStep.replay()`` is checked before it runs (one graph, warmup, the
    cache's addresses and counters, the static input token) and after (its token, and the key it
    wrote in layer 0), against the naive tokens ``want`` and the eager loop's layer-0 keys ``keys``
    of each prompt; the first rule broken raises ``_RuleBroken`` with its verdict. Yields the list
    of replays seen."""
    original = CapturedStep.replay
    seen: list = []
    # the cache's addresses at the first replay: what the graph reads
    captured_reading: list[int] = []
    read: list[SimpleNamespace] = []

    def replay(self):
        if not seen:
            captured_reading[:] = _addresses(cache)
        # what every replay read, for buffer_roles: which static input is the token
        read.append(SimpleNamespace(inputs=[t.detach().clone() for t in self.static_inputs]))
        mistake = _before_replay(self, seen, captured_reading, cache, want, n, read)
        if mistake:
            raise _RuleBroken(mistake)
        k, step = divmod(len(seen), n - 1)
        prompt_len = LOOP_PROMPTS[k]
        if step == 0 and not torch.allclose(cache.layers[0].keys[:, :, :prompt_len],
                                            keys[k][:, :, :prompt_len], atol=1e-5):
            raise _RuleBroken(
                f"not quite: prompt {k + 1}'s eager prefill wrote its {prompt_len} keys rotated "
                f"for other positions than 0..{prompt_len - 1}. Hint: after cache.reset() the "
                "prefill is an ordinary forward "
                "over the whole prompt: pass no position_ids (the model numbers the prompt from "
                "the cache's counter, 0 after the reset)")
        seen.append(self)
        out = original(self)
        slot, made, right = (LOOP_PROMPTS[k] + step, self.static_outputs[0].reshape(-1)[0].item(),
                             want[k][0, step + 1].item())
        # [batch, kv_heads, head_dim]: the key this replay wrote
        rotated = cache.layers[0].keys[:, :, slot]
        if made != right or not torch.allclose(rotated, keys[k][:, :, slot], atol=1e-5):
            wrong = (f"made {made} instead of {right}" if made != right
                     else f"wrote its key at slot {slot} rotated for another position")
            raise _RuleBroken(
                f"not quite: replay {step + 1} of prompt {k + 1} read the right token and found "
                "the right counters, yet "
                f"{wrong}. "
                "Hint: the step read a position other than the cache's counter: one frozen at "
                "capture (position_ids built from a Python int stay what they were then), or a "
                "position buffer of yours not refilled for this prompt. Pass no position_ids: "
                "the model reads positions from the cache's counters (rule 2)")
        return out

    def other_cache(module, args, kwargs):
        given = kwargs.get("cache", kwargs.get("past_key_values"))  # either name, 5.24 takes both
        if given is None:
            raise _RuleBroken(
                "not quite: a forward ran without a cache (no cache=, or use_cache=False). Hint: "
                "the prefill fills the cache you were given, model(prompt, cache=cache), and "
                "every token after it comes from a replay of the step captured on that cache")
        if given is not cache:
            raise _RuleBroken(
                "not quite: a forward ran on a cache other than the one you were given (a new "
                "StaticCache?). Hint: the captured graph reads and writes the cache it was "
                "captured on, by address: keep that one and empty it "
                "in place with cache.reset() before each prompt (rule 3)")

    hook = model.register_forward_pre_hook(other_cache, with_kwargs=True)
    CapturedStep.replay = replay
    try:
        yield seen
    finally:
        CapturedStep.replay = original
        hook.remove()


@torch.inference_mode()
def _eager_keys(model, prompt: torch.Tensor, n: int, slots: int) -> torch.Tensor:
    """Layer 0's keys ``[1, kv_heads, slots, head_dim]`` after the eager StaticCache loop decoded
    ``n`` tokens of ``prompt``: each slot's key rotated for its own position (what a frozen position
    gets wrong)."""
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=slots)
    token = model(prompt, cache=cache).logits[:, -1:].argmax(-1)
    for _ in range(n - 1):
        token = model(token, cache=cache).logits[:, -1:].argmax(-1)
    return cache.layers[0].keys.clone()


def _addresses(cache) -> list[int]:
    """The data pointers a captured step reads in ``cache``: every layer's counter, keys and
    values."""
    return [t.data_ptr() for layer in cache.layers if layer.is_initialized
            for t in (layer.cumulative_length, layer.keys, layer.values)]


# every graph a check of the loop has replayed: one replayed again in a later call was captured
# over that call's cache (kept in a global)
_REPLAYED: weakref.WeakSet = weakref.WeakSet()


def _before_replay(graph, seen, reading, cache, want, n, read) -> str | None:
    """What is wrong just before the next replay (``len(seen)`` replays so far), if anything.
    ``read``: the static inputs of every replay so far and this one, whose token input is found by
    what it holds (lesson 04's :func:`buffer_roles`), in any order of capture."""
    if not seen and graph in _REPLAYED:
        return ("not quite: your first replay ran a graph captured in an earlier call of your "
                "function, over that call's cache (a graph kept in a global or a default "
                "argument). Hint: a captured graph reads and writes the cache it was captured on, "
                "by address: capture inside the function, over the cache it is given, once per "
                "call")
    _REPLAYED.add(graph)
    if seen and graph is not seen[0]:
        return ("not quite: you captured a second graph. Hint: capture once, for the first prompt; "
                "every later prompt replays the same graph after cache.reset() and its own eager "
                "prefill")
    if graph.warmup != LOOP_WARMUP:
        return (f"not quite: capture(..., warmup={graph.warmup}). Hint: use the recipe's "
                f"warmup={LOOP_WARMUP}, and put the counters back after it: that is the rule this "
                "exercise is about (rule 1)")
    if len(seen) >= len(want) * (n - 1):
        return (f"not quite: more than {n - 1} replays per prompt. Hint: each prompt's first token "
                f"comes from its eager prefill, the other {n - 1} from one replay each")
    k, step = divmod(len(seen), n - 1)
    where, expected = (f"replay {step + 1} of prompt {k + 1} ({LOOP_PROMPTS[k]} tokens)",
                       LOOP_PROMPTS[k] + step)
    if _addresses(cache) != reading:
        return (f"not quite: before {where} a layer's counter or key/value buffer is a new tensor. "
                "Hint: a captured graph keeps the addresses it was captured with, and "
                "`layer.cumulative_length = torch.zeros(...)` (or a "
                "new buffer) is a tensor it never reads. Reset in place: cache.reset() (rule 3)")
    found = counters(cache)
    if found != [expected] * len(found):
        if all(c == expected + LOOP_WARMUP for c in found):
            return (f"not quite: before {where} every counter says {expected + LOOP_WARMUP}, not "
                    f"{expected}: the {LOOP_WARMUP} warm-up calls inside capture() ran the step "
                    "for real and advanced them. Hint: right "
                    "after capture, put every layer's counter back in place: "
                    f"layer.cumulative_length.sub_({LOOP_WARMUP}) (rule 1)")
        stale = [i for i, c in enumerate(found) if c != expected]
        if stale == list(range(1, len(found))) and all(found[i] == expected + LOOP_WARMUP
                                                       for i in stale):
            return (f"not quite: before {where} layer 0's counter says {expected}, the others "
                    f"{expected + LOOP_WARMUP}. Hint: get_seq_length() reads layer 0 only, but "
                    "every layer writes at its own counter: put all of "
                    "them back (rule 1)")
        if len(stale) < len(found) and all(found[i] == expected + LOOP_WARMUP for i in stale):
            return (f"not quite: before {where} layers {stale} of {len(found)} say "
                    f"{expected + LOOP_WARMUP}, the others {expected}. Hint: every layer writes "
                    "at its own counter: put all of them back, for layer in cache.layers (a "
                    "model has config.num_hidden_layers of them; rule 1)")
        if k and step == 0 and all(c > expected for c in found):
            return (f"not quite: before {where} the counters say {found[0]}, not {expected}: the "
                    "cache still held the previous prompt when this one was prefilled. Hint: "
                    "cache.reset() (in place) before each prompt's "
                    "prefill (rule 3)")
        return (f"not quite: before {where} the counters say {sorted(set(found))}, but the cache "
                f"should hold {expected} tokens (the prompt and the tokens decoded). Hint: only "
                "the prefill and the replays may move a counter; "
                "put back what capture's warm-up moved")
    fed = [want[i // (n - 1)][0, i % (n - 1)].item() for i in range(len(read))]
    token_at = buffer_roles(read, fed, 0)[0]
    token, right = graph.static_inputs[token_at].reshape(-1)[0].item(), want[k][0, step].item()
    if token != right:
        return (f"not quite: {where} read token {token}, but the token before it was {right}. "
                "Hint: the graph reads its input tensor by address: write each new token (and "
                "each prompt's first one) into it with "
                "token.copy_(...); `token = ...` names a new tensor the graph never reads")
    return None


@code_checker(graph_loop_solution)
def check_graph_loop(fn) -> str:
    """Exercise: prefill eagerly, capture the step once (warmup=3), put every counter back, replay;
    cache.reset() in place per prompt."""
    model = _tiny()

    def run() -> str:
        # two n: a loop that hard-codes the number of tokens fails one
        first = graph_loop_verdict(fn, model, LOOP_NEW_TOKENS)
        if not first.startswith("correct"):
            return first
        again = graph_loop_verdict(fn, model, LOOP_OTHER_N)
        if not again.startswith("correct"):
            return again.replace("not quite: ", f"not quite: with n = {LOOP_OTHER_N} (right for "
                                 f"n = {LOOP_NEW_TOKENS}): ", 1)
        return f"{first}; right for n = {LOOP_OTHER_N} too"

    return kept(model, run)


def graph_loop_verdict(fn, model, n: int) -> str:
    """``check_graph_loop``'s run on ``model``, ``n`` tokens per prompt."""
    from transformers import StaticCache

    from ..decoding import decode_naive

    prompts = loop_prompts()
    want = [decode_naive(model, p, n) for p in prompts]
    slots = max(LOOP_PROMPTS) + n + LOOP_WARMUP
    keys = [_eager_keys(model, p, n, slots) for p in prompts]
    cache = StaticCache(config=model.config, max_cache_len=slots)
    try:
        with torch.inference_mode(), _watch(model, cache, want, keys, n) as seen:
            # fills the cache in place, inside the watch: no host compare there
            got = call_student(fn, model, cache, [p.clone() for p in prompts], n,
                               writes_inputs=True)
    except _RuleBroken as e:
        return str(e)
    if not seen:
        return ("not quite: no captured graph was replayed. Hint: graph = capture(step, token, "
                "warmup=3) once, after the first prefill, then graph.replay() for every new token")
    if len(seen) != len(prompts) * (n - 1):
        return (f"not quite: {len(seen)} replays for {len(prompts)} prompts of {n} tokens. Hint: "
                f"each prompt's first token comes from its eager prefill, the other {n - 1} from "
                "one replay each")
    if not isinstance(got, (list, tuple)) or len(got) != len(prompts):
        return (f"not quite: you returned a {type(got).__name__}. Hint: return a list of "
                f"{len(prompts)} tensors [1, n], one per prompt")
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        if isinstance(g, torch.Tensor) and g.shape != w.shape:
            same = g.numel() == w.numel() and torch.equal(g.reshape(w.shape).to(w.device), w)
            return (f"not quite: for prompt {k + 1} you returned shape {tuple(g.shape)}, expected "
                    f"{tuple(w.shape)}. Hint: "
                    + ("the tokens are right: keep the batch dimension, [1, n] per prompt "
                       "(torch.cat(tokens, dim=1) of [1, 1] tokens)" if same else
                       "one tensor [1, n] per prompt: its first token and one per replay"))
        if isinstance(g, torch.Tensor) and index_dtype_problem(g, "token ids"):
            return f"not quite: for prompt {k + 1}: {index_dtype_problem(g, 'token ids')}"
        if not isinstance(g, torch.Tensor) or not torch.equal(g, w):
            return ("not quite: the replays made the right tokens, but what you returned for "
                    f"prompt {k + 1} is not them. Hint: the static output is overwritten by every "
                    "replay: keep a clone of each token")
    return (f"correct: {len(prompts)} prompts of {', '.join(map(str, LOOP_PROMPTS))} tokens, {n} "
            f"tokens each, token-exact against the naive loop, from {len(seen)} replays of one "
            f"graph captured with {LOOP_WARMUP} warm-up calls over "
            f"one vanilla StaticCache ({seen[0].describe()})")


# ---- the host cost of a launch, from the recorded GPU file (not asked by lesson 05 now) ----------

LAUNCH_EXAMPLE = ("the recorded GPU result: a section of data/lesson05_gpu.json (e.g. "
                  "record=data['eager_vs_replay_bfloat16']), that file's path, or the dict "
                  "kvlab.lab.measure.eager_vs_replay returned on a GPU")


def launch_record(record) -> dict:
    """``check_launch_cost_us``'s ``record=`` read at the door (:func:`read_record`: a dict, a path,
    the file of sections): an eager-vs-replay record measured on a GPU, with the ms per token of
    both and a count of kernel launches per step for both; a :class:`SettingError` naming what to
    pass otherwise (a CPU run counts aten operations, not launches)."""
    record = read_record(record, has="work_per_step", kind="an eager-vs-replay record",
                         example=LAUNCH_EXAMPLE)
    missing = [k for k in ("eager_ms_per_token", "replay_ms_per_token") if k not in record]
    if missing:
        raise SettingError(f"record= has no {missing[0]!r}: pass {LAUNCH_EXAMPLE}")
    work = record["work_per_step"]
    if not (isinstance(work, dict) and all(isinstance(work.get(k), dict)
                                           for k in ("eager", "replay"))):
        raise SettingError("record['work_per_step'] must hold an 'eager' and a 'replay' dict of "
                           f"counts: pass {LAUNCH_EXAMPLE}")
    if not all("kernel_launch_calls" in work[k] for k in ("eager", "replay")):
        raise SettingError("this record has no kernel launch counts (a run on the CPU counts aten "
                           f"operations, and there is no launch to cost): pass {LAUNCH_EXAMPLE}")
    # counts and times are read as every measurement is (real_number, as bad_measurement reads
    # them): a NumPy number, a 0-dim tensor or a number spelled as text too
    counted = {}
    for k in ("eager", "replay"):
        launches = work[k]["kernel_launch_calls"]
        try:
            number = real_number(launches)
        except NotANumber:
            number = None
        if number is None or not number >= 0 or number != int(number):
            raise SettingError(f"record['work_per_step'][{k!r}]['kernel_launch_calls'] must be a "
                               f"count (a whole number, 0 or more), got {launches!r:.60}: pass "
                               f"{LAUNCH_EXAMPLE}")
        counted[k] = dict(work[k], kernel_launch_calls=int(number))
    return dict(record, work_per_step=dict(work, **counted))


def launch_cost_us(record: dict) -> float:
    """Host time per kernel launch implied by a recorded GPU eager-vs-replay result
    (:func:`launch_record`), in microseconds; a ValueError where the replay removed no launch."""
    record = launch_record(record)
    eager, replay = record["work_per_step"]["eager"], record["work_per_step"]["replay"]
    saved_ms = (real_number(record["eager_ms_per_token"])
                - real_number(record["replay_ms_per_token"]))
    removed = eager["kernel_launch_calls"] - replay["kernel_launch_calls"]
    if removed <= 0:
        raise ValueError("in this record the replay removed no kernel launch, so there is no cost "
                         "per launch to find")
    return 1e3 * saved_ms / removed


@checker(read={"record": launch_record})
def check_launch_cost_us(answer, *, record: dict) -> str:
    """Exercise: from the recorded GPU result, how many microseconds did each removed kernel launch
    cost?"""
    answer = as_number(answer)
    fix = "use the recorded GPU result (data/lesson05_gpu.json) or measure again"
    eager, replay = record["eager_ms_per_token"], record["replay_ms_per_token"]
    bad = bad_measurement({"eager_ms_per_token": eager, "replay_ms_per_token": replay}, fix)
    if bad:
        return bad
    eager, replay = real_number(eager), real_number(replay)
    if replay >= eager:
        # a replay no faster than eager saves no host time: a negative or zero cost per launch
        return (f"not checked: in this record the replay ({replay} ms per token) is "
                f"not faster than eager ({eager} ms), so the time saved is not "
                f"positive and gives no cost per launch: the measurement is not usable; {fix}")
    launches = {k: record["work_per_step"][k]["kernel_launch_calls"] for k in ("eager", "replay")}
    if launches["replay"] >= launches["eager"]:
        # no launch removed: the time saved has no launch to divide among
        return (f"not checked: in this record the replay makes {launches['replay']} kernel "
                f"launches per step, eager {launches['eager']}: the replay removed none, so there "
                f"is no cost per launch to find; {fix}")
    expected = 1e3 * (eager - replay) / (launches["eager"] - launches["replay"])
    # an answer nearer one of these than the right value is that mistake (check_number)
    mistakes = [
        # eager > replay >= 0: at least one launch
        (1e3 * eager / launches["eager"],
         "that is the whole eager step over its launches; only the time replay saves is host work: "
         "(eager ms - replay ms) per token over the launches replay removed, times 1000."),
        (expected / 1e3, "that is milliseconds: the question asks microseconds (times 1000)."),
    ]
    verdict = check_number(
        answer, expected, what="host microseconds per removed kernel launch", rel_tol=0.1,
        mistakes=mistakes,
        hint="(eager ms per token - replay ms per token) / (kernel launches per eager step - per "
             "replay), times 1000.",
    )
    return verdict

"""Checkers for lesson 03 (HuggingFace DynamicCache and StaticCache). Each returns a verdict string;
print it.

Two code exercises (a cached decode step whose position is a 0-dim tensor; an in-place reset of a
``StaticCache``), a "predict, then run" question (what ``StaticCache.crop`` does to the buffers) and
one number. Every expected value is computed live on a tiny model, with transformers' own caches and
kvlab's own loops.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch

from ..decoding import first_mismatch, greedy
from ..hf_caches import decode_static, make_static_cache
from ..sizes import kv_cache_bytes, model_sizes
from .common import (
    as_number,
    call_student,
    check_number,
    check_prediction,
    check_prompt_ids,
    checker,
    checker_model,
    choice_of,
    code_checker,
    index_dtype_problem,
    kept,
    number_text,
    settings_read,
    solutions_filled_in,
    watch_positions,
)

# The checkers' model: tiny and random, and (with its q/k norms and this seed) sensitive enough to
# RoPE positions that a position off by one changes the greedy tokens within a few steps.
CHECK_MODEL, CHECK_SEED = "tiny-qwen3", 3


def check_model():
    """The tiny model every lesson-03/04 checker runs on, with ``CHECK_LAYERS`` layers (built
    afresh: a student's code cannot spoil the next check)."""
    return checker_model(CHECK_MODEL, CHECK_SEED)


def check_prompt(length: int, seed: int = 0) -> torch.Tensor:
    """Prompt ids ``[1, length]`` in the tiny models' vocabulary, the same for the same seed."""
    return torch.randint(1, 256, (1, length), generator=torch.Generator().manual_seed(seed))


def batch_prompt(length: int) -> torch.Tensor:
    """Prompt ids ``[2, length]`` whose rows differ (row 0 is ``check_prompt(length)``): code that
    reads row 0 only, or a batch of 1 hard-coded, goes wrong on row 1."""
    return torch.cat([check_prompt(length), check_prompt(length, seed=5)])


def batch_problem(got, want: torch.Tensor, what: str) -> str | None:
    """What is wrong with ``got`` against ``want`` (``[2, n]`` tokens of :func:`batch_prompt`), in
    words after "for a batch of 2 different prompts", else None. ``what`` names ``got``."""
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        return (f"{what} {shape}, not {tuple(want.shape)}. Hint: ids are [batch, 1]: keep the "
                "batch of the ids you are handed (a batch of 1 hard-coded drops the other rows)")
    if torch.equal(got, want):
        return None
    if torch.equal(got[0], want[0]) and torch.equal(got[:, 1:], got[:1, 1:].expand_as(got[:, 1:])):
        return ("every row got row 0's tokens. Hint: take the greedy token of every row "
                "(logits[:, -1:].argmax(-1), [batch, 1]), not logits[0, -1]")
    row = int((got != want).any(-1).nonzero()[0])
    i = first_mismatch(got[row:row + 1], want[row:row + 1])
    return (f"row {row}'s token {i} is {got[row, i].item()}, not {want[row, i].item()}. Hint: "
            "every row of ids [batch, 1] is its own sequence: keep the batch in every tensor "
            "(position_ids broadcast over it) and take every row's greedy token")


def batch_positions_problem(cache, reference, written: int) -> str | None:
    """Where a row's keys in ``cache``'s first ``written`` slots differ from those of
    ``reference``, the cache kvlab's own StaticCache loop filled for the same prompt (a row fed at
    another position writes keys rotated by another angle, though its tokens may agree), in words
    after "for a batch of 2 different prompts", else None."""
    for layer, (got, want) in enumerate(zip(cache.layers, reference.layers, strict=True)):
        far = ~torch.isclose(got.keys[:, :, :written], want.keys[:, :, :written], rtol=1e-4,
                             atol=1e-5).all(dim=1).all(dim=-1)  # [batch, slots]
        if bool(far.any()):
            row, slot = (int(i) for i in far.nonzero()[0])
            return (f"row {row}'s keys at slot {slot} (layer {layer}) are not those kvlab's loop "
                    "writes, though the tokens agree here: that row was fed another position. "
                    "Hint: every row of this batch sits at the same position: position_ids "
                    "[batch, 1] all equal to position (position.expand(batch, 1) or a [1, 1] that "
                    "broadcasts), not position plus the row's index")
    return None


# the student's code failing on a batch of 2 only: said with the batch (other errors go to the door)
BATCH_ERRORS = (RuntimeError, IndexError, TypeError)


def batch_error(e: Exception) -> str:
    """The verdict for code right on batch 1 that raised ``e`` on a batch of 2."""
    said = str(e).splitlines()[0][:160] if str(e) else ""
    return ("not quite: right for batch 1, but for a batch of 2 different prompts (ids [2, 1]) "
            f"your code raised {type(e).__name__}: {said}. "
            "Hint: ids are [batch, 1]: take the batch from the ids you are handed (no batch of 1 "
            "hard-coded: torch.full_like(ids, position) for [batch, 1] positions)")


def first_token_note(got: torch.Tensor, want: torch.Tensor) -> str:
    """Where two ``[batch, n]`` token runs first differ, in words (empty if they do not)."""
    i = first_mismatch(got, want)
    if i is None:
        return ""
    if got.shape != want.shape:
        return f"you returned {tuple(got.shape)} tokens, the reference {tuple(want.shape)}"
    return f"token {i} is the first that differs: {got[0, i].item()} instead of {want[0, i].item()}"


# ------------------------------------------------------------------ a number: a StaticCache's bytes


@checker
def check_static_cache_bytes(answer, *, config, max_cache_len: int, dtype, batch: int = 1) -> str:
    """Exercise: bytes a StaticCache of ``max_cache_len`` slots holds, however few tokens were
    decoded."""
    answer = as_number(answer)
    expected = kv_cache_bytes(config, max_cache_len, dtype, batch=batch)
    sizes = model_sizes(config)
    slips = [  # (the answer a typical slip gives, what the slip was)
        (kv_cache_bytes(config, 1, dtype, batch=batch),
         "you counted one token: a StaticCache holds all max_cache_len slots from its first step, "
         "written or not"),
        (expected // 2, "K alone: V is a second buffer of the same size (the factor 2)"),
        (expected // sizes.layers, "one layer: every layer has its own keys and values"),
        (expected * sizes.heads // sizes.kv_heads,
         f"the {sizes.heads} query heads: the cache stores the {sizes.kv_heads} kv heads "
         "(grouped-query attention)"),
        (expected * 8, "bits, not bytes"),
    ]
    if batch != 1:
        slips.append((kv_cache_bytes(config, max_cache_len, dtype, batch=1),
                      f"one sequence: the batch holds {batch}"))
    for other in (torch.float32, torch.float16, torch.bfloat16):
        if other.itemsize != dtype.itemsize:  # dtype: a torch.dtype (the door reads a name)
            slips.append((kv_cache_bytes(config, max_cache_len, other, batch=batch),
                          f"{other.itemsize} bytes per element: {dtype} has {dtype.itemsize}"))
    # another unit, as check_cache_bytes names it; read to 3 digits (1.13 for 1.125 MiB)
    units = [(expected / 2**10, "KiB, not bytes: give bytes"),
             (expected / 2**20, "MiB, not bytes: give bytes"),
             (expected / 2**30, "GiB, not bytes: give bytes")]
    what = f"StaticCache bytes for max_cache_len={max_cache_len}, batch {batch}, in {dtype}"
    if isinstance(answer, int | float) and not isinstance(answer, bool) and answer != expected:
        # several slips can agree
        matched = list(dict.fromkeys(
            [why for value, why in slips if value == answer]
            + [why for value, why in units if math.isclose(answer, value, rel_tol=5e-3)]))
        if matched:
            return (f"not quite: you gave {number_text(answer)} for {what}. Hint: that is "
                    f"{' or '.join(matched)}.")
    return check_number(
        answer, expected, what=what,
        hint="it is preallocated: 2 (K and V) x layers x kv_heads x head_dim x bytes per element x "
             "max_cache_len x batch, whatever the number of tokens decoded so far.",
    )


# ---------------------------------------------------------------------- code 1: an in-place reset


def reset_in_place(cache) -> None:
    """Empty a vanilla ``StaticCache`` in place: zero every layer's ``keys``, ``values`` and
    ``cumulative_length``, writing into the tensors the layers hold (no tensor is replaced, so a
    captured graph still sees them)."""
    for layer in cache.layers:
        layer.keys.zero_()  # [batch, kv_heads, max_cache_len, head_dim], same address
        layer.values.zero_()
        layer.cumulative_length.zero_()  # 0-dim: the next write lands at slot 0


class UsedBuiltinReset(Exception):
    """The student's reset called transformers' own ``reset()``, which the exercise rebuilds."""


@contextmanager
def builtin_reset_refused(cache):
    """Inside: ``cache.reset()`` and every layer's ``reset()`` raise :class:`UsedBuiltinReset`,
    called on the object or through its class (``type(layer).reset(layer)``)."""
    def refuse(*args, **kwargs):
        raise UsedBuiltinReset

    targets = [cache, *cache.layers]
    # every class from the object's own up to the one that defines reset: a call through any
    classes = {cls for target in targets for cls in type(target).__mro__
               if "reset" in vars(cls)}
    held = {cls: vars(cls)["reset"] for cls in classes}
    for target in targets:
        target.reset = refuse  # an instance attribute hides the method
    for cls in classes:
        cls.reset = refuse
    try:
        yield
    finally:
        for cls, method in held.items():
            cls.reset = method
        for target in targets:
            target.__dict__.pop("reset", None)


def filled_cache(model, prompt_len: int = 9, new_tokens: int = 6):
    """A ``StaticCache`` after a real decode: buffers allocated (writable outside inference mode
    too), keys and values written in slots ``0 .. prompt_len + new_tokens - 2``, every counter
    there."""
    cache = make_static_cache(model, prompt_len + 2 * new_tokens)
    # a batch of 2: a reset of row 0 alone (layer.keys[0].zero_()) leaves row 1
    decode_static(model, batch_prompt(prompt_len), new_tokens, cache=cache)
    return cache


@code_checker(reset_in_place)
def check_reset_in_place(reset) -> str:
    """Write into the tensors the layers already hold (layer.keys.zero_(), ...): never assign
    layer.keys = ..."""
    model = check_model()
    cache = filled_cache(model)
    names = ("keys", "values", "cumulative_length")
    before = [{name: getattr(layer, name) for name in names} for layer in cache.layers]
    addresses = [{name: t.data_ptr() for name, t in held.items()} for held in before]
    old_position = int(cache.layers[0].cumulative_length)
    try:
        with builtin_reset_refused(cache):
            call_student(reset, cache)
    except UsedBuiltinReset:
        return ("not quite: you called transformers' own reset() (the right tool in real code). "
                "Hint: here write the in-place zeroing yourself, for every layer: keys, values and "
                "cumulative_length; afterwards compare "
                "with show_source(transformers.cache_utils.CacheLayerMixin.reset).")
    for i, (layer, held) in enumerate(zip(cache.layers, before, strict=True)):
        for name in names:
            now = getattr(layer, name, None)
            if now is not held[name] or (isinstance(now, torch.Tensor)
                                         and now.data_ptr() != addresses[i][name]):
                where = (f"now {type(now).__name__}" if not isinstance(now, torch.Tensor)
                         else f"data_ptr {hex(addresses[i][name])} -> {hex(now.data_ptr())}")
                return (f"not quite: layer {i}'s {name} is a new object ({where}). Hint: a tensor "
                        "rebound instead of written in place: a captured graph would keep reading "
                        "and writing the old one (lesson 04, "
                        f"scenario 4d). Write into it: layer.{name}.zero_().")
        if not getattr(layer, "is_initialized", True):
            return (f"not quite: layer {i} is marked uninitialized. Hint: its next update would "
                    "allocate new buffers (lazy_initialization), which rebinds every tensor a "
                    "graph captured; leave is_initialized alone.")
    counters = [int(layer.cumulative_length) for layer in cache.layers]
    left = {name: [i for i, layer in enumerate(cache.layers) if bool(getattr(layer, name).any())]
            for name in ("keys", "values")}
    # rows of the batch ([batch, kv_heads, slots, head_dim]) a reset left holding the old sequence
    rows = sorted({b for layer in cache.layers for name in ("keys", "values")
                   for b in getattr(layer, name).flatten(1).any(-1).nonzero().flatten().tolist()})
    if all(c == old_position for c in counters):
        return (f"not quite: the counters still say {counters}. Hint: counters not reset: the next "
                f"write would land at slot {old_position} (the old position), and the mask would "
                "open the old tokens' slots: "
                "layer.cumulative_length.zero_().")
    if all(counters):
        lands = ", ".join(f"{c} (no slot: a position before the first)" if c < 0 else
                          f"{c} (the old position)" if c == old_position else str(c)
                          for c in sorted(set(counters)))
        opened = (", and the mask would open the slots before it as if they held tokens"
                  if max(counters) > 0 else "")
        return (f"not quite: the counters say {counters}, not 0. Hint: the next write would land "
                f"at slot {lands} instead of slot 0{opened}: reset to zero, "
                "layer.cumulative_length.zero_().")
    if any(counters):
        stale = [i for i, c in enumerate(counters) if c]
        return (f"not quite: layers {stale} keep their counters ({[counters[i] for i in stale]}). "
                "Hint: every layer has its own cumulative_length (cache.get_seq_length() reads "
                "layer 0's only): reset each one.")
    if left["keys"] or left["values"]:
        if left["values"] and not left["keys"]:
            slip = "values forgotten (K without V)"
        elif left["keys"] and not left["values"]:
            slip = "keys forgotten (V without K)"
        elif len(rows) < cache.layers[0].keys.shape[0]:
            slip = (f"row(s) {rows} of the batch of {cache.layers[0].keys.shape[0]} were not "
                    "emptied (keys[0] is the first sequence only)")
        else:
            slip = "the buffers were not emptied"
        return (f"not quite: layers {sorted(set(left['keys']) | set(left['values']))} still hold "
                f"the old sequence. Hint: {slip}: a reset empties both buffers of every layer "
                "(layer.keys.zero_(), layer.values.zero_()).")
    prompt = torch.cat([check_prompt(7, seed=1), check_prompt(7, seed=6)])  # the cache's batch
    tokens = decode_static(model, prompt, 5, cache=cache)
    expected = decode_static(model, prompt, 5)
    if not torch.equal(tokens, expected):
        return ("not quite: a new prompt decoded into your reset cache goes wrong "
                f"({first_token_note(tokens, expected)}).")
    return ("correct: every layer's keys, values and counter are zero, at the same addresses, and "
            f"a new prompt decodes into the cache token-exact ({tokens.shape[1]} tokens). "
            "transformers' own cache.reset() does the same "
            "(CacheLayerMixin.reset): use that in real code.")


# ------------------------------------------------------------ code 2: a step with a tensor position


def decode_step(model, cache, ids, position):
    """One cached decode step: ``ids`` ``[batch, 1]`` sits at ``position``, a 0-dim long tensor (the
    number of tokens the cache holds). Feeds it at that position, advances ``position`` by one in
    place and returns the greedy next ids ``[batch, 1]``."""
    # [batch, 1]: a view of the tensor, never an int
    positions = position.reshape(1, 1).expand(ids.shape[0], 1)
    logits = model(ids, cache=cache, position_ids=positions).logits  # [batch, 1, vocab]
    position.add_(1)  # in place: the caller (and a captured graph) holds this very tensor
    return greedy(logits)  # [batch, 1]


def host_read_in(step) -> str | None:
    """What kvlab's capture (emulated) says when it records one call of ``step(ids)``, if it refuses
    a host read."""
    from ..graphs import CaptureError, capture

    ids = torch.ones(1, 1, dtype=torch.long)
    try:
        capture(step, ids, warmup=0, emulate=True)
    except CaptureError as e:
        if "host synchronization" in str(e):
            # "...during capture: Tensor.item() reads ... . A captured graph ..."
            return str(e).split("during capture: ", 1)[-1].split(". A captured graph", 1)[0][:160]
        raise
    return None


@code_checker(decode_step)
def check_decode_step(step, *, prompt_len: int = 9, new_tokens: int = 10) -> str:
    """Feed ids with position_ids=position.reshape(1, 1), advance it with position.add_(1), return
    greedy(logits)."""
    model = check_model()
    return kept(model, lambda: decode_step_verdict(step, model, prompt_len, new_tokens))


def decode_step_verdict(step, model, prompt_len: int, new_tokens: int) -> str:
    """``check_decode_step``'s run on ``model``."""
    prompt = check_prompt(prompt_len)
    # kvlab's own cached loop, positions from the cache
    expected = decode_static(model, prompt, new_tokens)
    cache = make_static_cache(model, prompt_len + new_tokens)
    with torch.inference_mode():
        ids = greedy(model(prompt, cache=cache).logits)  # the prefill: [1, 1]
        position = torch.tensor(prompt_len)  # 0-dim: the position of ids
        out, calls, from_held, used = [ids], [], [], []
        with watch_positions(model, position, from_held, used) as seen:
            for i in range(1, new_tokens):
                start = len(seen)
                # the step advances position in place: its contract
                ids = call_student(step, model, cache, ids, position, writes_inputs=True)
                calls.append(seen[start:])
                if (not isinstance(ids, torch.Tensor) or tuple(ids.shape) != (1, 1)
                    or index_dtype_problem(ids, "token ids")):
                    got = tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__
                    if isinstance(ids, torch.Tensor) and got == (1, 1):
                        return (f"not quite: step {i} returned {ids.dtype}: "
                                f"{index_dtype_problem(ids, 'token ids')}")
                    return (f"not quite: step {i} returned {got}. Hint: return the next token ids "
                            "as [batch, 1] integers: greedy(logits), i.e. logits[:, "
                            "-1:].argmax(-1).")
                out.append(ids)
    for i, made in enumerate(calls, start=1):
        if len(made) != 1:
            return (f"not quite: step {i} called the model {len(made)} times. Hint: one forward "
                    "per step; every call writes the cache and moves its counter.")
    fed = [made[0] for made in calls]  # position_ids per step: a list of ints, or None
    want = [prompt_len + i - 1 for i in range(1, new_tokens)]
    tokens = torch.cat(out, dim=1)
    note = first_token_note(tokens, expected)
    note = f" ({note})" if note else " (the tokens happen to agree here, the positions do not)"
    if any(f is None for f in fed):
        # say what the model did instead, as it did it
        did = used[next(i for i, f in enumerate(fed) if f is None)]
        instead = f" ({', '.join(k + '=' for k in did.others)} given instead)" if did.others else ""
        source = ("" if did.positions is None else
                  f", so the model took its position from the cache's counter ({did.counter})"
                  if did.positions == [did.counter] * len(did.positions) else
                  f"; the model used position {did.positions}")
        return (f"not quite: you passed no position_ids{instead}{source}. Hint: pass your own: "
                "model(ids, cache=cache, position_ids=position.reshape(1, 1)).")
    got = [f[0] for f in fed]
    if got != want:
        if len(set(got)) == 1:
            return (f"not quite: every step fed position {got[0]}{note}. Hint: advance position in "
                    "place after the call: position.add_(1) (`position = position + 1` makes a "
                    "new tensor that the caller never sees).")
        shift = {g - w for g, w in zip(got, want, strict=True)}
        if len(shift) == 1:
            (d,) = shift
            by = 'one position' if abs(d) == 1 else f'{abs(d)} positions'
            why = "you advanced it before the call" if d == 1 else ("the new token sits at the "
                                                                    "count of tokens cached")
            return (f"not quite: off by {by} ({d:+d}): the first step fed {got[0]}, but the token "
                    f"after a {prompt_len}-token prompt is at position {prompt_len}{note}. Hint: "
                    f"{why}; feed position, then add 1.")
        j = next(k for k, (g, w) in enumerate(zip(got, want, strict=True)) if g != w)
        return (f"not quite: step {j + 1} fed position {got[j]}, expected {want[j]}{note}. Hint: "
                "feed position, then add 1.")
    if int(position) != prompt_len + new_tokens - 1:
        return (f"not quite: the positions fed were right, but position ends at {int(position)}, "
                f"not {prompt_len + new_tokens - 1}. Hint: the tensor itself must move "
                "(position.add_(1)): the caller, "
                "and a graph captured over it, read that tensor.")
    if not torch.equal(tokens, expected):
        return (f"not quite: {first_token_note(tokens, expected)}. Hint: feed ids at position, "
                "then greedy(logits).")
    # a position out of the order the loop fed (one skipped), on another cache whose counter says
    # the same: a step that counts on its own (a Python counter, or the position read once) feeds
    # its own number, which a graph would freeze at capture
    out_of_order = prompt_len + new_tokens + 1
    probe = make_static_cache(model, out_of_order + 2)
    with torch.inference_mode(), watch_positions(model) as fed_then:
        model(check_prompt(out_of_order, seed=2), cache=probe)
        call_student(step, model, probe, ids.clone(), torch.tensor(out_of_order),
                     writes_inputs=True)
    if fed_then[1:] != [[out_of_order]]:
        return (f"not quite: the tokens are right, but handed position {out_of_order} out of "
                f"order (the loop had reached {prompt_len + new_tokens - 1}), your step fed "
                f"{fed_then[1] if len(fed_then) == 2 else fed_then[1:]}. Hint: it keeps its own "
                "count (a Python counter, or position read once): a graph freezes such a number at "
                "capture. Build position_ids from the tensor you are handed at every call: "
                "position.reshape(1, 1).")
    # the same step, recorded by kvlab's capture (emulated): a read of position on the host is
    # refused there
    spare = make_static_cache(model, prompt_len + 4)
    with torch.inference_mode():
        model(prompt, cache=spare)
        read = host_read_in(lambda t: call_student(step, model, spare, t, torch.tensor(prompt_len),
                                                    writes_inputs=True))
    if read is not None:
        return (f"not quite: the tokens are right, but you read position on the host ({read}). "
                "Hint: position as a Python int: compiled code recompiles for every new value "
                "(section 2 counted it) and a CUDA graph "
                "cannot capture the read at all (lesson 04); build position_ids from the tensor: "
                "position.reshape(1, 1).")
    # the claim "from the 0-dim tensor" only where the positions fed were that tensor (a view)
    source = ("came from one 0-dim tensor advanced in place" if all(from_held) else
              "were right, though not read from the position tensor you were handed (fed from "
              "another tensor: position.reshape(1, 1) is the exercise's way)")
    problem = batch_two_steps(step, model, prompt_len)
    if problem:
        return problem
    return (f"correct: {new_tokens} tokens, token-exact against kvlab's own StaticCache loop; "
            f"positions {want[0]}..{want[-1]} {source}, and the step captures as a graph; "
            "a batch of 2 different prompts decodes row by row.")


def batch_two_steps(step, model, prompt_len: int, new_tokens: int = 4) -> str | None:
    """A verdict where ``step``, right on batch 1, goes wrong on a batch of 2 different prompts
    (ids ``[batch, 1]``), else None."""
    prompt = batch_prompt(prompt_len)
    reference = make_static_cache(model, prompt_len + new_tokens)
    expected = decode_static(model, prompt, new_tokens, cache=reference)
    cache = make_static_cache(model, prompt_len + new_tokens)
    with torch.inference_mode():
        ids = greedy(model(prompt, cache=cache).logits)  # [2, 1]
        position, out = torch.tensor(prompt_len), [ids]
        for _ in range(1, new_tokens):
            try:
                ids = call_student(step, model, cache, ids, position, writes_inputs=True)
            except BATCH_ERRORS as e:
                return batch_error(e)
            if not isinstance(ids, torch.Tensor) or tuple(ids.shape) != (2, 1):
                shape = tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__
                return (f"not quite: right for batch 1, but for a batch of 2 different prompts a "
                        f"step returned {shape}, not (2, 1). Hint: ids are [batch, 1]: return "
                        "every row's greedy token, logits[:, -1:].argmax(-1)")
            out.append(ids)
    problem = (batch_problem(torch.cat(out, dim=1), expected, "the steps made")
               or batch_positions_problem(cache, reference, prompt_len + new_tokens - 1))
    return (f"not quite: right for batch 1, but for a batch of 2 different prompts {problem}"
            if problem else None)


# ---------------------------------------------------------------- predict, then run: what crop does

CROP_CHOICES = {
    "zeroed": "crop(-k) zeroes the last k slots and moves the counter back",
    "kept-hidden": "crop(-k) only moves the counter back: the k slots keep their keys, the mask "
                   "hides them and the next writes overwrite them",
    "kept-visible": "crop(-k) moves the counter back, but attention still reads the k stale slots",
}


@torch.inference_mode()
def crop_experiment(model=None, prompt_ids=None, *, extra: int = 6, k: int = 3) -> dict:
    """Write a prompt and ``extra`` more tokens into a StaticCache, ``crop(-k)``, then feed the
    first cropped token.

    Returns the counter before and after the crop, the layer-0 key norms of the ``k`` cropped slots,
    the largest difference between that step's logits and the same step over a cache that never held
    the cropped tokens, and ``outcome``, the key of :data:`CROP_CHOICES` this shows. ``model`` and
    ``prompt_ids`` default to a tiny model.
    """
    from ..cache_view import slot_norms

    model = model if model is not None else check_model()
    prompt_ids = prompt_ids if prompt_ids is not None else check_prompt(9)
    if not 1 <= k <= extra:
        raise ValueError(f"k must be in 1..extra ({extra}), got {k}")
    slots = prompt_ids.shape[1] + extra + 2
    # [1, extra]: any ids do (the prompt again)
    more = prompt_ids.repeat(1, extra // prompt_ids.shape[1] + 1)[:, :extra]
    cache = make_static_cache(model, slots)
    model(torch.cat([prompt_ids, more], dim=1), cache=cache)  # counter = prompt + extra
    before = int(cache.get_seq_length())
    cache.crop(-k)
    after = int(cache.get_seq_length())
    # the cropped slots, as crop left them
    norms = slot_norms(cache.layers[0])[after:before].tolist()
    nxt = more[:, extra - k:extra - k + 1]  # the first cropped token, fed again: [1, 1]
    logits = model(nxt, cache=cache).logits
    clean = make_static_cache(model, slots)
    # never held the cropped tokens
    model(torch.cat([prompt_ids, more[:, :extra - k]], dim=1), cache=clean)
    diff = float((logits - model(nxt, cache=clean).logits).abs().max())
    # equal up to rounding (the two prefills had other lengths)
    same = diff <= 1e-3 * float(logits.abs().max())
    outcome = "zeroed" if not any(norms) else "kept-hidden" if same else "kept-visible"
    return {"counter before": before, "counter after": after,
            "cropped slots' key norms": [round(n, 3) for n in norms],
            "max |logit difference| vs a cache that never held them": diff, "outcome": outcome}


@settings_read
def check_crop_prediction(prediction, *, model=None, prompt_ids=None, extra: int = 6,
                          k: int = 3) -> str:
    """"Predict, then run": what does ``StaticCache.crop(-k)`` do to the buffers? ``prediction`` is
    a key of :data:`CROP_CHOICES`; the experiment runs only once a prediction is given. The verdict,
    then what it measured."""
    if prompt_ids is not None:  # checked against the model it will run on
        model = check_model() if model is None else model
        check_prompt_ids(model, prompt_ids, extra)
    what = f"what crop(-{k}) does"
    if (prediction is None and not solutions_filled_in()) or (
            prediction is not None and choice_of(prediction, CROP_CHOICES) is None):
        return check_prediction(prediction, measured=None, choices=CROP_CHOICES, what=what)
    seen = crop_experiment(model, prompt_ids, extra=extra, k=k)
    verdict = check_prediction(prediction, measured=seen["outcome"], choices=CROP_CHOICES,
                               what=what)
    return "\n".join([verdict]
                     + [f"  {key}: {value}" for key, value in seen.items() if key != "outcome"])

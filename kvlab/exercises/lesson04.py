"""Checkers for lesson 04 (graph capture and replay of a vanilla StaticCache). Each returns a
verdict string.

A "predict, then run" question (does a capture with no warm-up calls decode right?) and two code
exercises: a decode step captured once and replayed, its static input buffers refilled in place; and
one fix for two of the lesson's scenarios, warm-up advance and padding pollution (every counter put
back to the valid tokens). The expected tokens come live from kvlab's eager StaticCache loop, the
replays from ``kvlab.graphs`` (emulated on CPU, a real CUDA graph on a GPU) and the scenario from
``kvlab.failures``.
"""

from __future__ import annotations

import functools
import inspect
from contextlib import contextmanager
from types import SimpleNamespace

import torch

from ..cache_view import counters, slot_norms
from ..decoding import first_mismatch, greedy
from ..failures import bucket_len, control_rewound, decode_static_graph
from ..graphs import CapturedStep, capture
from ..hf_caches import decode_static, make_static_cache
from .common import (
    NotAttempted,
    SettingError,
    call_student,
    check_prediction,
    check_prompt_ids,
    choice_of,
    code_checker,
    index_dtype_problem,
    kept,
    plain_setting,
    settings_read,
    solutions_filled_in,
)
from .lesson03 import (
    BATCH_ERRORS,
    batch_error,
    batch_positions_problem,
    batch_problem,
    batch_prompt,
    check_model,
    check_prompt,
    first_token_note,
)

# -------------------------------------------------------------- predict, then run: no warm-up calls

NO_WARMUP_CHOICES = {
    "none": "no token differs: capturing itself runs nothing, so with no warm-up call nothing "
            "moved the counters",
    "first": "the first replayed token (step 1) already differs",
    "later": "the first replayed tokens are right, a later one differs",
}


def no_warmup_run(model=None, prompt_ids=None, new_tokens: int = 12) -> dict:
    """``strategy="static-graph"`` (``kvlab.failures.decode_static_graph``) with ``warmup=0`` beside
    the eager StaticCache loop: the graph used, the first token that differs (None: none), every
    layer's counter after the decode against prompt + tokens fed, and ``outcome``, the key of
    :data:`NO_WARMUP_CHOICES` this shows."""
    model = model if model is not None else check_model()
    prompt_ids = prompt_ids if prompt_ids is not None else check_prompt(9)
    keep: dict = {}
    tokens = decode_static_graph(model, prompt_ids, new_tokens, warmup=0, keep=keep)
    expected = decode_static(model, prompt_ids, new_tokens)
    first = first_mismatch(tokens, expected)
    graph = keep.get("graph")
    return {"graph": graph.describe() if graph is not None else "(no graph: one token)",
            "first differing token": first,
            "counters after the decode": sorted(set(counters(keep["cache"]))),
            "prompt + tokens fed": prompt_ids.shape[1] + new_tokens - 1,
            "outcome": "none" if first is None else "first" if first == 1 else "later"}


@settings_read
def check_no_warmup_prediction(prediction, *, model=None, prompt_ids=None,
                               new_tokens: int = 12) -> str:
    """"Predict, then run": the first attempt of section 2 with ``warmup=0``: which token first
    differs from the eager loop? ``prediction`` is a key of :data:`NO_WARMUP_CHOICES`; the run
    happens once a prediction is given."""
    if prompt_ids is not None:  # checked against the model it will run on
        model = check_model() if model is None else model
        check_prompt_ids(model, prompt_ids, new_tokens)
    what = "the first differing token with warmup=0"
    if (prediction is None and not solutions_filled_in()) or (
            prediction is not None and choice_of(prediction, NO_WARMUP_CHOICES) is None):
        return check_prediction(prediction, measured=None, choices=NO_WARMUP_CHOICES, what=what)
    seen = no_warmup_run(model, prompt_ids, new_tokens)
    verdict = check_prediction(prediction, measured=seen["outcome"], choices=NO_WARMUP_CHOICES,
                               what=what)
    return "\n".join([verdict]
                     + [f"  {key}: {value}" for key, value in seen.items() if key != "outcome"])


# ------------------------------------------------------------- code 1: capture once, replay, refill


def graph_decode(model, cache, first_ids, prompt_len: int, n: int) -> torch.Tensor:
    """Decode ``n`` tokens with one captured step. ``cache`` holds the prompt (``prompt_len``
    tokens), ``first_ids`` ``[batch, 1]`` is the prefill's token. The step reads the token and its
    position from two static buffers that are refilled in place before every replay. Returns
    ``[batch, n]``: ``first_ids``, then ``n - 1`` replayed tokens."""
    static_ids = first_ids.clone()  # [batch, 1]: the graph reads this address at every replay
    static_pos = torch.full_like(first_ids, prompt_len)  # [batch, 1]: the position of static_ids

    def step(ids, pos):
        return greedy(model(ids, cache=cache, position_ids=pos).logits)  # [batch, 1]

    # no warm-up call: every counter stays at prompt_len
    graph = capture(step, static_ids, static_pos, warmup=0)
    out = [first_ids]
    for _ in range(1, n):
        next_ids = graph.replay().clone()  # clone: the next replay overwrites the static output
        out.append(next_ids)
        static_ids.copy_(next_ids)  # in place: the graph reads these very tensors
        static_pos.add_(1)
    return torch.cat(out, dim=1)


@contextmanager
def watch_replays(cache):
    """Inside: every ``CapturedStep.replay()`` appends what it read and made: its graph, its static
    inputs and the cache's counters as they were just before, and its static outputs just after
    (copies)."""
    original = CapturedStep.replay
    seen: list[SimpleNamespace] = []

    def replay(self):
        inputs, before = [t.detach().clone() for t in self.static_inputs], counters(cache)
        out = original(self)
        seen.append(SimpleNamespace(graph=self, inputs=inputs, counters=before,
                                    outputs=[t.detach().clone() for t in self.static_outputs]))
        return out

    CapturedStep.replay = replay
    try:
        yield seen
    finally:
        CapturedStep.replay = original


def buffer_roles(seen, made: list, prompt_len: int) -> tuple[int, int | None]:
    """Which static input is the token buffer and which the position buffer (None: none), found by
    what they hold, in any order of capture: the token buffer is the input that agrees most often
    with the tokens fed, the position buffer the one of the others that agrees most often with
    prompt_len, prompt_len + 1, ..."""
    series = [[r.inputs[i].reshape(-1)[0].item() if r.inputs[i].numel() else None for r in seen]
              for i in range(len(seen[0].inputs))]
    want = [prompt_len + j for j in range(len(seen))]

    def agree(values, target):
        return sum(v == t for v, t in zip(values, target, strict=True))

    ids = max(range(len(series)), key=lambda i: agree(series[i], made))  # the first on a tie
    others = [i for i in range(len(series)) if i != ids]
    pos = max(others, key=lambda i: agree(series[i], want)) if others else None
    return ids, pos


def refill_problem(seen, first_ids, prompt_len: int, note: str) -> str | None:
    """What the replays read wrong, if anything: the token and, where there is one, the position
    (:func:`buffer_roles` finds which input is which)."""
    made = [first_ids.reshape(-1)[0].item()] + [r.outputs[0].reshape(-1)[0].item()
                                                for r in seen[:-1]]
    ids_at, pos_at = buffer_roles(seen, made, prompt_len)
    ids = [r.inputs[ids_at].reshape(-1)[0].item() for r in seen]
    for j, (read, fed) in enumerate(zip(ids, made, strict=True)):
        if read != fed:
            if len(set(ids)) == 1:
                return (f"not quite: every replay read token {ids[0]} ({note}). Hint: a tensor "
                        "rebound instead of written in place: `static_ids = next_ids` makes a new "
                        "name, and the replay reads the stale input; "
                        "write into the buffer: static_ids.copy_(next_ids).")
            return (f"not quite: replay {j + 1} read token {read}, but the token before it was "
                    f"{fed} ({note}). Hint: refill static_ids with the newest token before each "
                    "replay (static_ids.copy_(next_ids)).")
    if pos_at is None:
        # no position buffer: positions come from the cache's own counter, which the graph advances
        return None
    pos = [r.inputs[pos_at].reshape(-1)[0].item() for r in seen]
    want = [prompt_len + j for j in range(len(seen))]
    if pos == want:
        return None
    if len(set(pos)) == 1:
        return (f"not quite: every replay ran at position {pos[0]} ({note}). Hint: forgot to "
                "advance the position: static_pos.add_(1) after each replay, in place "
                "(`static_pos = static_pos + 1` is a new tensor the "
                "graph never reads).")
    shift = {p - w for p, w in zip(pos, want, strict=True)}
    if len(shift) == 1:
        (d,) = shift
        by = 'one position' if abs(d) == 1 else f'{abs(d)} positions'
        return (f"not quite: off by {by} ({d:+d}): the first replay ran at {pos[0]}, but the token "
                f"after a {prompt_len}-token prompt is at {prompt_len} ({note}). Hint: static_pos "
                "starts at prompt_len and "
                "moves by one after each replay.")
    j = next(k for k, (p, w) in enumerate(zip(pos, want, strict=True)) if p != w)
    return (f"not quite: replay {j + 1} ran at position {pos[j]}, expected {want[j]} ({note}). "
            "Hint: add 1 per replay.")


@code_checker(graph_decode)
def check_graph_decode(student, *, prompt_len: int = 9, n: int = 12) -> str:
    """Capture once (capture(step, static_ids, static_pos, warmup=0)); before each replay write the
    token and position INTO the buffers."""
    model = check_model()

    def run() -> str:
        # two prompt lengths and two n: a loop with either hard-coded fails one
        first = graph_decode_verdict(student, model, prompt_len, n)
        if not first.startswith("correct"):
            return first
        again = graph_decode_verdict(student, model, prompt_len + 2, n + 1)
        if not again.startswith("correct"):
            return again.replace("not quite: ", f"not quite: for a {prompt_len + 2}-token prompt "
                                 f"and n = {n + 1} (right for {prompt_len} and {n}): ", 1)
        batch = graph_decode_batch_two(student, model, prompt_len, n)
        if batch:
            return batch
        return (f"{first} Also right for a {prompt_len + 2}-token prompt and n = {n + 1}, and "
                "for a batch of 2 different prompts.")

    return kept(model, run)


def graph_decode_batch_two(student, model, prompt_len: int, n: int) -> str | None:
    """A verdict where ``student``, right on batch 1, goes wrong on a batch of 2 different prompts
    (``first_ids`` ``[2, 1]``), else None."""
    prompt = batch_prompt(prompt_len)
    reference = make_static_cache(model, prompt_len + n)
    expected = decode_static(model, prompt, n, cache=reference)
    cache = make_static_cache(model, prompt_len + n + 8)
    with torch.inference_mode():
        first = greedy(model(prompt, cache=cache).logits)  # [2, 1]
        try:
            tokens = call_student(student, model, cache, first, prompt_len, n,
                                  writes_inputs=True)
        except BATCH_ERRORS as e:
            return batch_error(e)
    problem = (batch_problem(tokens, expected, "you returned")
               or batch_positions_problem(cache, reference, prompt_len + n - 1))
    return (f"not quite: right for batch 1, but for a batch of 2 different prompts {problem}"
            if problem else None)


def graph_decode_verdict(student, model, prompt_len: int, n: int) -> str:
    """``check_graph_decode``'s run on ``model``."""
    prompt = check_prompt(prompt_len)
    expected = decode_static(model, prompt, n)  # kvlab's eager StaticCache loop
    # room for a few warm-up writes: diagnosed, not a crash
    cache = make_static_cache(model, prompt_len + n + 8)
    with torch.inference_mode():
        first = greedy(model(prompt, cache=cache).logits)  # [1, 1]
        # its value as given: a loop may write into first_ids (its token buffer)
        given = first.clone()
        with watch_replays(cache) as seen:
            # a graph loop may use first as its static input buffer
            tokens = call_student(student, model, cache, first, prompt_len, n,
                                  writes_inputs=True)
    if (not isinstance(tokens, torch.Tensor) or tuple(tokens.shape) != (1, n)
        or index_dtype_problem(tokens, "token ids")):
        got = tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__
        if isinstance(tokens, torch.Tensor) and got == (1, n):
            return f"not quite: {index_dtype_problem(tokens, 'token ids')}"
        return (f"not quite: you returned {got}. Hint: return [batch, n] token ids: first_ids, "
                "then one replayed token per step (torch.cat(out, dim=1)).")
    note = first_token_note(tokens, expected) or "the tokens happen to agree here"
    if not seen:
        return ("not quite: your function never replayed a captured graph. Hint: graph = "
                "kvlab.graphs.capture(step, static_ids, static_pos, warmup=0), then graph.replay() "
                "for every new token.")
    graphs = {id(r.graph) for r in seen}
    if len(graphs) > 1:
        return (f"not quite: you captured {len(graphs)} graphs. Hint: capture once, before the "
                "loop; each replay re-runs the same graph on whatever the static buffers hold.")
    if len(seen) != n - 1:
        return (f"not quite: {len(seen)} replays for {n} tokens. Hint: the first token comes from "
                f"the prefill (first_ids), the other {n - 1} from one replay each.")
    graph, found = seen[0].graph, seen[0].counters
    if found != [prompt_len] * len(found):
        if graph.warmup and all(c == prompt_len + graph.warmup for c in found):
            return (f"not quite: the first replay found every counter at {found[0]}, not "
                    f"{prompt_len} ({note}). Hint: a counter advanced by warm-up: capture(..., "
                    f"warmup={graph.warmup}) ran the step {graph.warmup} times "
                    "for real; use warmup=0 here (exercise 3 puts the counters back instead).")
        return (f"not quite: the first replay found the counters at {found}, not {prompt_len} "
                f"({note}). Hint: between the prefill and the first replay nothing may write the "
                "cache.")
    problem = refill_problem(seen, given, prompt_len, note)
    if problem:
        return problem
    outputs = [r.outputs[0] for r in seen]
    if not all(torch.equal(tokens[:, j + 1:j + 2], out) for j, out in enumerate(outputs)):
        if all(torch.equal(tokens[:, j:j + 1], outputs[-1]) for j in range(1, n)):
            return (f"not quite: every returned token is the last replay's ({note}). Hint: the "
                    "static output is overwritten by every replay: keep graph.replay().clone().")
        return (f"not quite: the tokens you returned are not the ones the replays made ({note}). "
                "Hint: keep each replay's output, cloned.")
    if not torch.equal(tokens, expected):
        return (f"not quite: {note}. Hint: the step must be the eager step: greedy(model(ids, "
                "cache=cache, position_ids=pos).logits).")
    return (f"correct: {n} tokens, token-exact against kvlab's eager StaticCache loop, from "
            f"{len(seen)} replays of one graph ({graph.describe()}).")


# ---------------------------------------------------------------------- code 2: fix two scenarios


def put_back(cache, valid_len: int) -> None:
    """Make every layer's counter say ``valid_len`` tokens, in place: the next write lands at slot
    ``valid_len`` and the mask hides whatever lies beyond it (a warm-up's writes, a padded prefill's
    pad tokens)."""
    for layer in cache.layers:
        layer.cumulative_length.fill_(valid_len)  # 0-dim: the very tensor a captured graph holds


class StudentRaised(Exception):
    """The student's fix raised inside a scenario (which would otherwise report it as the scenario's
    own error)."""


def fixed_scenario(name: str, student, model, prompt, n: int, warmup: int) -> tuple:
    """Run scenario ``name`` of kvlab.failures (``"warmup-advance"``: its control, with the
    student's function in place of kvlab's rewind; ``"padding-pollution"``: right after the padded
    prefill) with ``student(cache, prompt_len)`` as the fix. Returns the scenario's FailureResult
    and what the fix did."""
    from ..failures import padding_pollution

    p, names, seen = prompt.shape[1], ("keys", "values", "cumulative_length"), {}

    def fix(cache):
        held = [[getattr(layer, k) for k in names] for layer in cache.layers]
        prompt_norms = [slot_norms(layer)[:p].clone() for layer in cache.layers]
        seen["before"] = counters(cache)
        try:
            call_student(student, cache, p)
        except NotAttempted:
            raise
        except Exception as e:  # the scenario would swallow a RuntimeError as its own failure
            raise StudentRaised from e
        seen["rebound"] = [(i, k)
                           for i, (layer, old) in enumerate(zip(cache.layers, held, strict=True))
                           for k, t in zip(names, old, strict=True)
                           if getattr(layer, k, None) is not t]
        seen["after"] = counters(cache)
        seen["prompt kept"] = all(torch.equal(slot_norms(layer)[:p], old)
                                  for layer, old in zip(cache.layers, prompt_norms, strict=True))

    try:
        if name == "warmup-advance":
            result = control_rewound(model, prompt, n, warmup=warmup, fix=fix)
        else:
            result = padding_pollution(model, prompt, n, fix=fix)
    except StudentRaised as e:
        raise e.__cause__ from None
    return result, seen


def fix_problem(name: str, result, seen, prompt_len: int, warmup: int) -> str | None:
    """What is wrong with the student's fix in one scenario, in words (None: nothing)."""
    fw = result.first_wrong
    note = (f"{name}: the first differing token is {fw}, against kvlab's eager reference"
            if fw is not None
            else f"{name}: the tokens happen to agree here")
    if seen["rebound"]:
        i, k = seen["rebound"][0]
        return (f"not quite: layer {i}'s {k} is a new tensor ({note}). Hint: a tensor rebound "
                "instead of written in place: a graph keeps reading and advancing the old one "
                f"(cause 3); write into it: layer.{k}.fill_(...).")
    after, before = seen["after"], seen["before"]
    if not seen["prompt kept"]:
        emptied = " (you emptied the cache)" if not any(after) else ""
        return (f"not quite: the prompt's keys changed{emptied} ({note}). Hint: the prompt must "
                "stay: only the counters move; what lies beyond them is hidden by the mask and "
                "overwritten by the next writes.")
    if after == [prompt_len] * len(after):
        return None if not result.failed else (f"not quite: {note}. Hint: put the counters back "
                                               "and touch nothing else.")
    why = (f"a counter advanced by warm-up: the {warmup} warm-up calls each wrote the first token "
           "and added 1"
           if name == "warmup-advance" else
           "the padding counted: the padded prefill wrote and counted all "
           f"{result.extra['bucket']} rows")
    if after == before:
        return (f"not quite: every counter is still at {after[0]} ({note}). Hint: {why}; set each "
                "back, in place.")
    stale = [i for i, c in enumerate(after) if c != prompt_len]
    if stale == list(range(1, len(after))):
        return (f"not quite: only layer 0's counter is at {prompt_len}; the others say {after[1:]} "
                f"({note}). Hint: every layer has its own cumulative_length (layer0-only-rewind): "
                "move each one.")
    if len(stale) < len(after):  # some layers put back, not all: a layer count written in?
        return (f"not quite: layers {stale} of {len(after)} still say "
                f"{[after[i] for i in stale]}; the others are at {prompt_len} ({note}). Hint: "
                "every layer has its own cumulative_length (layer0-only-rewind): move each one, "
                "for layer in cache.layers (a model has config.num_hidden_layers of them).")
    return (f"not quite: the counters went from {before} to {after}, but the cache holds "
            f"{prompt_len} valid tokens ({note}). Hint: {why}; make each counter say valid_len "
            "(fill_), whatever moved it.")


def padding_unlike_warmup(check):
    """Refuse, at ``check_put_back``'s door, a ``prompt_len=`` whose padding
    (``bucket_len(prompt_len) - prompt_len``) equals ``warmup=``: both scenarios would then move
    the counters by the same amount, and a fix that subtracts a fixed amount would pass as one that
    fills each counter to valid_len. The other settings are refused by the checker's own door."""
    defaults = inspect.signature(check).parameters

    @functools.wraps(check)
    def checked(*args, **kwargs):
        prompt_len, warmup = (plain_setting(kwargs.get(k, defaults[k].default))
                              for k in ("prompt_len", "warmup"))
        if (all(type(v) is int and v >= 1 for v in (prompt_len, warmup))
                and bucket_len(prompt_len) - prompt_len == warmup):
            raise SettingError(
                f"check_put_back(prompt_len={prompt_len}, warmup={warmup}): the padded prefill "
                f"adds {warmup} padding rows (bucket_len({prompt_len}) - {prompt_len}), as many "
                f"as the {warmup} warm-up calls, so the two scenarios cannot tell 'subtract a "
                "fixed amount' from 'fill to valid_len'; choose a warmup= or prompt_len= that "
                "makes them differ")
        return check(*args, **kwargs)

    return checked


@padding_unlike_warmup
@code_checker(put_back)
def check_put_back(student, *, prompt_len: int = 9, n: int = 12, warmup: int = 2) -> str:
    """Write every layer's counter in place (layer.cumulative_length.fill_(valid_len)); never assign
    it."""
    model = check_model()
    prompt = check_prompt(prompt_len)
    runs = []
    for name in ("warmup-advance", "padding-pollution"):  # the second only once the first is fixed
        result, seen = fixed_scenario(name, student, model, prompt, n, warmup)
        problem = fix_problem(name, result, seen, prompt_len, warmup)
        if problem:
            return problem
        runs.append(f"{name} ({seen['before'][0]} -> {prompt_len})")
    # a fix that hard-codes valid_len fails at another prompt length
    other = check_prompt(prompt_len + 1)
    result, seen = fixed_scenario("warmup-advance", student, model, other, n, warmup)
    problem = fix_problem("warmup-advance", result, seen, prompt_len + 1, warmup)
    if problem:
        return problem.replace("not quite: ", f"not quite: for a {prompt_len + 1}-token prompt "
                               f"(right for {prompt_len}): ", 1)
    return (f"correct: both scenarios fixed, token-exact over {n} tokens against kvlab's eager "
            f"reference: {', '.join(runs)}. The extra slots sit beyond the counter, hidden by the "
            "mask until overwritten.")

"""HuggingFace's own caches in the course's decode loop: DynamicCache (grows), StaticCache (preallocated),
and the first, naive attempt at replaying a StaticCache decode step as a captured graph.

``decode_dynamic`` and ``decode_static`` are token-exact against ``"naive"``. ``decode_static_graph`` is the
version a user writes first (lesson 04): it is *not* exact, because the warm-up calls before capture advance
the cache's counters. Lesson 05 (``"graph-safe"``) fixes it.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, StaticCache

from .decoding import OnToken, greedy
from .graphs import ReplayError, step_runner
from .runtime import check_dtype


def make_static_cache(model, max_cache_len: int) -> StaticCache:
    """A vanilla ``StaticCache`` for ``model``; its layers allocate ``[batch, kv_heads, max_cache_len, head_dim]`` on first use."""
    if not isinstance(max_cache_len, int) or max_cache_len < 1:
        raise ValueError(f"max_cache_len must be a positive int, got {max_cache_len!r}")
    return StaticCache(config=model.config, max_cache_len=max_cache_len)


def check_room(cache, prompt_len: int, max_new_tokens: int) -> None:
    """Refuse, before any write, a decode that would not fit in a static cache (a device-side assert on a GPU)."""
    need = prompt_len + max_new_tokens - 1  # the last token is returned, never written
    limit = cache.get_max_length()
    if limit is not None and limit > 0 and need > limit:
        raise ValueError(
            f"prompt ({prompt_len}) + max_new_tokens ({max_new_tokens}) needs {need} cache slots but the cache holds "
            f"max_cache_len={limit}: make a cache with max_cache_len >= {need}"
        )


def room_guard(cache, tokens_per_step: int = 1):
    """A host-side check for ``capture(..., before_replay=...)``: raise before any layer would write past its end.

    It watches the counter tensors the layers hold *when the guard is made* (make it after the prefill, since
    ``lazy_initialization`` rebinds them, and at capture time, since those are the tensors a graph reads).
    Each check syncs once, so that an out-of-range ``index_copy_`` never reaches a GPU, where it would be a
    device-side assert that kills the process's CUDA context.
    """
    watched = [layer.cumulative_length for layer in cache.layers if getattr(layer, "is_initialized", False)]
    limit = min((layer.max_cache_len for layer in cache.layers if getattr(layer, "is_initialized", False)), default=0)

    def check() -> None:
        if not watched:
            return
        furthest = int(torch.stack([c.reshape(()) for c in watched]).max())
        if furthest + tokens_per_step > limit:
            raise ReplayError(
                f"the next write would fill cache slots {furthest}..{furthest + tokens_per_step - 1} but the cache has "
                f"{limit} (max_cache_len). On a GPU that write is a device-side assert that poisons the CUDA context; "
                "kvlab stopped it on the host. The counters are not where the code expects them: see lesson 04."
            )

    return check


def require_empty(cache) -> None:
    """Refuse a cache that already holds tokens: decoding into it would silently continue its earlier sequence."""
    held = int(cache.get_seq_length())
    if held:
        raise ValueError(
            f"this cache already holds {held} tokens of an earlier decode: decoding into it would continue that "
            "sequence, not start yours (re-running a notebook cell that reuses a cache does exactly this). Pass a "
            "fresh cache, or empty this one first: `with torch.inference_mode(): cache.reset()` (kvlab's loops made "
            "its tensors in inference mode, and only there can they be written in place)."
        )


def _prefill_and_loop(model, input_ids, max_new_tokens, cache, on_token: OnToken) -> torch.Tensor:
    """Prefill once, then feed one token per step; the cache keeps everything else."""
    logits = model(input_ids, cache=cache).logits  # [batch, prompt_len, vocab]
    next_ids = greedy(logits)  # [batch, 1]
    out = [next_ids]
    if on_token is not None:
        on_token(0, next_ids)
    for step in range(1, max_new_tokens):
        logits = model(next_ids, cache=cache).logits  # [batch, 1, vocab]: only the new token is computed
        next_ids = greedy(logits)
        out.append(next_ids)
        if on_token is not None:
            on_token(step, next_ids)
    return torch.cat(out, dim=1)  # [batch, max_new_tokens]


@torch.inference_mode()
def decode_dynamic(model, input_ids, max_new_tokens, *, on_token: OnToken = None, cache=None) -> torch.Tensor:
    """Own loop over ``transformers.DynamicCache``: each layer's keys/values grow by one token per step (torch.cat)."""
    cache = DynamicCache(config=model.config) if cache is None else cache
    require_empty(cache)
    return _prefill_and_loop(model, input_ids, max_new_tokens, cache, on_token)


@torch.inference_mode()
def decode_static(model, input_ids, max_new_tokens, *, on_token: OnToken = None, cache=None,
                  max_cache_len: int | None = None) -> torch.Tensor:
    """Own loop over ``transformers.StaticCache``: buffers of ``max_cache_len`` slots, written in place by ``index_copy_``.

    Pass ``cache`` to inspect it afterwards (it must be empty, e.g. fresh or ``cache.reset()``).
    """
    if cache is None:
        cache = make_static_cache(model, max_cache_len or input_ids.shape[1] + max_new_tokens)
    require_empty(cache)
    check_room(cache, input_ids.shape[1], max_new_tokens)
    return _prefill_and_loop(model, input_ids, max_new_tokens, cache, on_token)


def decode_step_fn(model, cache):
    """The decode step a user captures: one token in (``[batch, 1]``), the greedy next token out."""

    def step(ids):  # ids: [batch, 1]
        return greedy(model(ids, cache=cache).logits)  # [batch, 1]

    return step


@torch.inference_mode()
def decode_static_graph(model, input_ids, max_new_tokens, *, on_token: OnToken = None, cache=None,
                        max_cache_len: int | None = None, warmup: int = 3, runner: str = "graph",
                        keep: dict | None = None) -> torch.Tensor:
    """The first attempt: vanilla ``StaticCache``, eager prefill, decode step captured once and replayed.

    Written as most people write it first, and wrong: the ``warmup`` calls before capture (which CUDA wants)
    run the step for real, so every layer's ``cumulative_length`` is ``warmup`` tokens ahead when the replays
    start; positions shift and the warm-up's writes stay visible to attention. Lesson 04 shows the damage;
    lesson 05 fixes it. ``max_cache_len`` defaults to room for the warm-up's extra writes too (without it, the
    last replays would write past the end; kvlab's ``room_guard`` turns that into an error instead of a
    device-side assert). ``runner``: ``"graph"`` (a real CUDA graph on a GPU, emulated elsewhere), ``"emulated"``
    or ``"eager"`` (see ``kvlab.graphs.step_runner``). ``keep``: a dict that receives ``cache`` and ``graph``.
    """
    prompt_len = input_ids.shape[1]
    if cache is None:
        cache = make_static_cache(model, max_cache_len or prompt_len + max_new_tokens + warmup)
    require_empty(cache)
    check_room(cache, prompt_len, max_new_tokens)
    logits = model(input_ids, cache=cache).logits  # eager prefill: the cache now holds the prompt
    next_ids = greedy(logits)  # [batch, 1]
    out = [next_ids]
    if on_token is not None:
        on_token(0, next_ids)
    static_ids = next_ids.clone()  # the graph's input buffer: refilled in place before every replay
    graph = None
    if max_new_tokens > 1:
        graph = step_runner(runner, decode_step_fn(model, cache), static_ids, warmup=warmup,
                            before_replay=room_guard(cache))
    for step in range(1, max_new_tokens):
        next_ids = graph.replay().clone()  # the static output is overwritten by the next replay
        static_ids.copy_(next_ids)
        out.append(next_ids)
        if on_token is not None:
            on_token(step, next_ids)
    if keep is not None:
        keep.update(cache=cache, graph=graph)
    return torch.cat(out, dim=1)


# ---------------------------------------------------------------- the paths lesson 03 times beside its own loops


@torch.inference_mode()
def decode_generate(model, input_ids, max_new_tokens, *, cache_implementation: str = "static") -> torch.Tensor:
    """``model.generate``, greedy, at most ``max_new_tokens``: it stops at the end-of-sequence token, so its tokens
    are a prefix of the course's loops (which never stop early). With ``"static"`` on a GPU it compiles the step."""
    pad = model.generation_config.pad_token_id
    out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_new_tokens,
                         do_sample=False, cache_implementation=cache_implementation,
                         pad_token_id=pad if pad is not None else 0)
    return out[:, input_ids.shape[1]:]


@torch.inference_mode()
def decode_compiled(model, input_ids, max_new_tokens, *, on_token: OnToken = None, mode: str = "reduce-overhead",
                    compiled_step=None, cache=None) -> torch.Tensor:
    """Own loop over a StaticCache whose decode step runs through ``torch.compile(mode=..., fullgraph=True)``.

    ``compiled_step``: a ``compile_step(model, cache)`` result to reuse (compilation then happens once).
    On a GPU, ``"reduce-overhead"`` also captures CUDA graphs (torch's own, with the bookkeeping lesson 05 does by hand).
    """
    if cache is None:
        cache = make_static_cache(model, input_ids.shape[1] + max_new_tokens)
    else:
        cache.reset()
    check_room(cache, input_ids.shape[1], max_new_tokens)
    step = compiled_step or compile_step(model, cache, mode=mode)
    logits = model(input_ids, cache=cache).logits  # eager prefill
    next_ids = greedy(logits)
    out = [next_ids]
    if on_token is not None:
        on_token(0, next_ids)
    for i in range(1, max_new_tokens):
        next_ids = step(next_ids).clone()  # clone: cudagraph outputs are overwritten by the next call
        out.append(next_ids)
        if on_token is not None:
            on_token(i, next_ids)
    return torch.cat(out, dim=1)


def compile_step(model, cache, *, mode: str = "reduce-overhead"):
    """``torch.compile`` of the decode step over ``cache`` (one graph, no break allowed: ``fullgraph=True``)."""
    param = next(model.parameters())
    check_dtype(param.device, param.dtype)  # bf16 on a GPU without it (a T4): say to use float16
    return torch.compile(decode_step_fn(model, cache), mode=mode, fullgraph=True)


def time_paths(paths: dict, max_new_tokens: int, *, device, repeats: int = 2) -> list[dict]:
    """Time decode paths: ``paths[name](on_token) -> tokens``. The first call (compile, capture, lazy setup) is
    timed apart; then ``repeats`` calls give the median decode step (when the path calls ``on_token``) and the
    median end-to-end time (over the tokens actually made). Returns one JSON-ready dict per path, with the tokens
    of the last call."""
    import statistics
    import time

    from .measure import StepClock
    from .runtime import synchronize

    rows = []
    for name, run in paths.items():
        synchronize(device)
        t0 = time.perf_counter()
        run(None)
        synchronize(device)
        first = time.perf_counter() - t0
        totals, steps = [], []
        for _ in range(max(1, repeats)):
            clock = StepClock(device)
            t0 = time.perf_counter()
            tokens = run(clock)
            synchronize(device)
            totals.append(time.perf_counter() - t0)
            steps.extend(clock.times[1:])  # step 0 is the prefill
        total = statistics.median(totals)
        step = statistics.median(steps) if steps else None
        made = int(tokens.shape[1])  # generate may stop early at end-of-sequence
        rows.append({
            "path": name, "new_tokens": made, "first_call_s": first,
            "median_total_s": total, "end_to_end_tokens_per_s": made / total,
            "median_step_ms": 1e3 * step if step else None,
            "decode_tokens_per_s": 1.0 / step if step else None,
            "tokens": tokens,
        })
    return rows

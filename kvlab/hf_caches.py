"""HuggingFace's own caches in the course's decode loop (lesson 03): DynamicCache (grows),
StaticCache (preallocated), ``model.generate``, and a StaticCache step compiled by
``torch.compile(mode="reduce-overhead")``.

Every loop here is token-exact against ``"naive"``. Lesson 04's first attempt at replaying a
StaticCache step as a captured graph, which is not, lives beside lesson 04's other failures in
``kvlab.failures``.
"""

from __future__ import annotations

import weakref

import torch
from transformers import DynamicCache, StaticCache

from .decoding import OnToken, greedy
from .runtime import check_dtype, count
from .sizes import model_sizes


def make_static_cache(model, max_cache_len: int) -> StaticCache:
    """A vanilla ``StaticCache`` for ``model``; its layers allocate ``[batch, kv_heads,
    max_cache_len, head_dim]`` on first use."""
    max_cache_len = count(max_cache_len, "max_cache_len")
    return StaticCache(config=model.config, max_cache_len=max_cache_len)


def check_room(cache, prompt_len: int, max_new_tokens: int, *, config=None) -> None:
    """Refuse, before any write, a decode that would not fit in a static cache (a device-side assert
    on a GPU).

    A full-attention layer must hold every token but the last one. A sliding-window layer
    (``is_sliding``) holds ``min(max_cache_len, sliding_window)`` slots and rolls once full
    (transformers 5.24's ``StaticSlidingWindowLayer``), so it serves any length when it holds the
    whole window: it needs ``min(need, sliding_window)`` slots. The windows are read from ``config``
    (the model's); without it a sliding layer's slots are taken as its window only where they are
    known to be (``max_cache_len`` was above the window).
    """
    need = prompt_len + max_new_tokens - 1  # the last token is returned, never written
    windows = _sliding_windows(config, len(cache.layers))
    wanted = []  # per layer: (slots it holds, slots it needs, its window or None)
    for i, layer in enumerate(cache.layers):
        slots = layer.get_max_length()
        if slots is None or slots <= 0:
            continue  # a layer that grows (a DynamicCache's)
        window = windows[i] if getattr(layer, "is_sliding", False) else None
        if (
            window is None
            and getattr(layer, "is_sliding", False)
            and not getattr(layer, "is_croppable", True)
        ):
            window = slots  # max_cache_len was above the window: the layer holds exactly the window
        wanted.append((slots, need if window is None else min(need, window), window))
    short = [(slots, needs, window) for slots, needs, window in wanted if slots < needs]
    if not short:
        return
    slots, needs, window = max(short, key=lambda w: w[1])
    asked = max(needs for _, needs, _ in wanted)
    if window is None:
        raise ValueError(
            f"prompt ({prompt_len}) + max_new_tokens ({max_new_tokens}) needs {need} cache slots "
            f"but the cache holds max_cache_len={slots}: make a cache with max_cache_len >= {asked}"
        )
    raise ValueError(
        f"prompt ({prompt_len}) + max_new_tokens ({max_new_tokens}) needs {need} positions; this "
        f"model's sliding-window layers (window {window}) keep the last min(max_cache_len, "
        f"{window}) tokens and roll, so they need max_cache_len >= min({need}, {window}) = "
        f"{needs}, and this cache's sliding layers hold only {slots}: make a cache with "
        f"max_cache_len >= {asked}"
    )


def _sliding_windows(config, layers: int) -> list[int | None]:
    """Each layer's sliding window from the model's config (transformers' own reading of it), None
    where none."""
    if config is None:
        return [None] * layers
    from transformers.cache_utils import get_layer_types_and_kwargs

    _, kwargs = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
    windows = [kw.get("sliding_window") for kw in kwargs]
    return windows if len(windows) == layers else [None] * layers


def _check_cache_for(model, cache, kind=None, *, batch: int | None = None) -> None:
    """Refuse a cache that cannot belong to ``model`` before anything is written: another class than
    ``kind``, other layer counts, (layers already allocated) other kv heads, head_dim, dtype or
    device, or one held by a live GraphSafeDecoder (or bound to captured graphs)."""
    from transformers.cache_utils import Cache

    kind = kind or Cache
    if not isinstance(cache, kind):
        raise TypeError(f"cache must be a transformers {kind.__name__}, got {type(cache).__name__}")
    if getattr(cache, "frozen", False):  # a GraphSafeStaticCache whose decoder captured graphs
        raise ValueError("this cache is bound to a GraphSafeDecoder's captured graphs: a decode "
                         "here would change the sequence its next replay continues. Pass a fresh "
                         "cache (or decode with that decoder)")
    owner = getattr(cache, "owner", None)  # a live GraphSafeDecoder's cache, captured or not yet
    if owner is not None and owner() is not None:
        raise ValueError(f"this cache belongs to a live {type(owner()).__name__}: a decode here "
                         "would write into the sequence that decoder continues (its next "
                         "decode_steps would go on from this one's tokens). Pass a fresh cache, "
                         "or decode with that decoder (decoder=...)")
    sizes = model_sizes(model.config)
    name = type(cache).__name__
    if cache.layers and len(cache.layers) != sizes.layers:
        made = ("DynamicCache(config=model.config)" if isinstance(cache, DynamicCache) else
                f"{name}(config=model.config, max_cache_len=...)")
        raise ValueError(
            f"the {name} has {len(cache.layers)} layers but the model has {sizes.layers}: build "
            f"it from this model's config: {made}"
        )
    _check_layer_kinds(model.config, cache)
    param = next(model.parameters())
    for layer in cache.layers:
        keys = getattr(layer, "keys", None)
        if (
            not isinstance(keys, torch.Tensor)
            or keys.dim() != 4
            or not getattr(layer, "is_initialized", True)
        ):
            continue
        if batch is not None and keys.shape[0] != batch:
            raise ValueError(
                f"the {name}'s buffers were made for batch {keys.shape[0]}, this decode has batch "
                f"{batch}: pass a fresh {name}"
                + (" (a StaticCache allocates its buffers for the first batch it sees)"
                   if isinstance(cache, StaticCache) else "")
            )
        got = (keys.shape[1], keys.shape[-1], keys.dtype, keys.device)
        want = (sizes.kv_heads, sizes.head_dim, param.dtype, param.device)
        if got != want:
            raise ValueError(
                f"the cache holds buffers of {got[0]} kv heads, head_dim {got[1]}, {got[2]} on "
                f"{got[3]}; this model needs {want[0]}, {want[1]}, {want[2]} on {want[3]}: pass a "
                "fresh cache made for this model (and dtype)"
            )


def _check_layer_kinds(config, cache) -> None:
    """Refuse a cache built from another config whose layers keep fewer tokens than this model's
    attend to: a sliding-window layer for a full-attention one, or a narrower window. It would drop
    tokens the model still reads: wrong tokens, no error. A layer that keeps more (full attention,
    or a wider window, for a sliding layer) only holds tokens the model's mask leaves out."""
    windows = _sliding_windows(config, len(cache.layers))
    for i, (layer, want) in enumerate(zip(cache.layers, windows, strict=True)):
        if not getattr(layer, "is_sliding", False):
            continue  # a full layer (or one of another kind) keeps every token
        window = getattr(layer, "sliding_window", None)  # DynamicSlidingWindowLayer
        if window is None and not getattr(layer, "is_croppable", True):
            # StaticSlidingWindowLayer whose max_cache_len was above its window: holds the window
            # (one at most max_cache_len never rolls: check_room sees that it holds enough)
            window = getattr(layer, "max_cache_len", None)
        if window is None or want is not None and window >= want:
            continue
        uses = "full attention" if want is None else f"a sliding window of {want}"
        name = type(cache).__name__
        made = ("DynamicCache(config=model.config)" if isinstance(cache, DynamicCache) else
                f"{name}(config=model.config, max_cache_len=...)")
        raise ValueError(
            f"the {name}'s layer {i} keeps a sliding window of {window} tokens but this model's "
            f"layer {i} uses {uses}: the cache was built from another config and would drop "
            f"tokens the model attends to. Build it from this model's config: {made}"
        )


def require_empty(cache) -> None:
    """Refuse a cache that already holds tokens: decoding into it would silently continue its
    earlier sequence."""
    cached_tokens = int(cache.get_seq_length())
    if cached_tokens:
        raise ValueError(
            f"this cache already holds {cached_tokens} tokens of an earlier decode: decoding into "
            "it would continue that sequence, not start yours (re-running a notebook cell that "
            "reuses a cache does exactly this). Pass a fresh cache, or empty this one first: `with "
            "torch.inference_mode(): cache.reset()` (kvlab's loops made its tensors in inference "
            "mode, and only there can they be written in place)."
        )


def cached_loop(
    model, input_ids, max_new_tokens, cache, *, step=None, on_token: OnToken = None
) -> torch.Tensor:
    """Prefill once, then feed one token per step; the cache keeps everything else.

    ``step(ids [batch, 1]) -> next ids [batch, 1]``: the decode step (default: the model's forward
    over ``cache`` and argmax, eagerly; ``compile_step`` gives a compiled one).
    """
    step = step or decode_step_fn(model, cache)
    # [batch, prompt_len, vocab]: the prefill, eagerly
    logits = model(input_ids, cache=cache).logits
    next_ids = greedy(logits)  # [batch, 1]
    out = [next_ids]
    if on_token is not None:
        on_token(0, next_ids.clone())  # the caller's copy: the next step reads next_ids
    for i in range(1, max_new_tokens):
        # [batch, 1]: only the new token is computed (clone: a cudagraph output
        next_ids = step(next_ids).clone()
        out.append(next_ids)  # is overwritten by the next call)
        if on_token is not None:
            on_token(i, next_ids.clone())  # the caller's copy
    return torch.cat(out, dim=1)  # [batch, max_new_tokens]


@torch.inference_mode()
def decode_dynamic(
    model, input_ids, max_new_tokens, *, on_token: OnToken = None, cache=None
) -> torch.Tensor:
    """Own loop over ``transformers.DynamicCache``: each layer's keys/values grow by one token per
    step (torch.cat)."""
    cache = DynamicCache(config=model.config) if cache is None else cache
    _check_cache_for(model, cache, DynamicCache, batch=input_ids.shape[0])
    require_empty(cache)
    return cached_loop(model, input_ids, max_new_tokens, cache, on_token=on_token)


@torch.inference_mode()
def decode_static(model, input_ids, max_new_tokens, *, on_token: OnToken = None, cache=None,
                  max_cache_len: int | None = None) -> torch.Tensor:
    """Own loop over ``transformers.StaticCache``: buffers of ``max_cache_len`` slots, written in
    place by ``index_copy_``.

    Pass ``cache`` to inspect it afterwards (it must be empty, e.g. fresh or ``cache.reset()``).
    """
    if cache is None:
        cache = make_static_cache(
            model, input_ids.shape[1] + max_new_tokens if max_cache_len is None else max_cache_len
        )
    _check_cache_for(model, cache, StaticCache, batch=input_ids.shape[0])
    require_empty(cache)
    check_room(cache, input_ids.shape[1], max_new_tokens, config=model.config)
    allocate_outside_inference(model, cache, input_ids.shape[0])
    return cached_loop(model, input_ids, max_new_tokens, cache, on_token=on_token)


def allocate_outside_inference(model, cache: StaticCache, batch: int) -> None:
    """Allocate an unallocated StaticCache's buffers for ``model`` outside inference mode: made on
    first use inside it, they would be inference tensors, which ``cache.reset()`` cannot write
    outside it. Then ``cache.reset()`` works anywhere."""
    if not cache.is_initialized:
        sizes, param = model_sizes(model.config), next(model.parameters())
        with torch.inference_mode(False):
            cache.early_initialization(batch, sizes.kv_heads, sizes.head_dim, param.dtype,
                                       param.device)


def decode_step_fn(model, cache):
    """The decode step a user captures: one token in (``[batch, 1]``), the greedy next token out."""

    def step(ids):  # ids: [batch, 1]
        return greedy(model(ids, cache=cache).logits)  # [batch, 1]

    return step





class _OnTokenStreamer:
    """A ``generate`` streamer (``transformers.generation.streamers.BaseStreamer``'s two methods)
    that hands each new token to ``on_token``. generate calls ``put`` with the prompt first, then
    with each step's tokens ``[batch]``."""

    def __init__(self, on_token):
        self.on_token, self.step = on_token, -1

    def put(self, value: torch.Tensor) -> None:
        if self.step >= 0:
            self.on_token(self.step, value.reshape(-1, 1))
        self.step += 1

    def end(self) -> None:
        pass


@torch.inference_mode()
def decode_generate(model, input_ids, max_new_tokens, *, on_token: OnToken = None,
                    cache_implementation: str = "static") -> torch.Tensor:
    """``model.generate``, greedy, exactly ``max_new_tokens`` tokens (no stop at the end-of-sequence
    token, like the course's loops). With ``"static"`` on a GPU it compiles the step itself.
    ``on_token`` is fed through a streamer, which copies each step's tokens to the host (one sync
    per token)."""
    check_generation_config(model)
    pad = model.generation_config.pad_token_id
    out = model.generate(
        input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_new_tokens,
        min_new_tokens=None, do_sample=False, cache_implementation=cache_implementation,
        eos_token_id=None, pad_token_id=pad if pad is not None else 0,
        streamer=_OnTokenStreamer(on_token) if on_token is not None else None
    )
    return out[:, input_ids.shape[1]:]


# model.generation_config fields that pick no other token in decode_generate's greedy call: token
# ids (it passes its own end and pad), lengths it sets, sampling settings (do_sample=False), what it
# caches and outputs beside the tokens, and bookkeeping
_GENERATION_NEUTRAL = {
    "pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "max_length",
    "max_new_tokens", "min_length", "min_new_tokens", "do_sample", "temperature", "top_k", "top_p",
    "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff", "use_cache", "cache_implementation",
    "output_attentions", "output_hidden_states", "output_scores", "output_logits",
    "transformers_version", "_from_model_config"}


# fields that change what model.generate returns, not which tokens
_GENERATION_OUTPUT = {"return_dict_in_generate", "num_return_sequences"}


def check_generation_config(model) -> None:
    """Refuse a ``model.generation_config`` that ``model.generate`` follows to other tokens than
    greedy decoding (a repetition penalty, beams, suppressed tokens, ...) or to another output
    (``return_dict_in_generate``): every strategy returns naive's tokens."""
    from transformers import GenerationConfig

    config = getattr(model, "generation_config", None)
    if not isinstance(config, GenerationConfig):
        raise TypeError(f"model.generation_config is {type(config).__name__}, not a "
                        "GenerationConfig: model.generate needs one. Set it back: "
                        "model.generation_config = transformers.GenerationConfig()")
    neutral = GenerationConfig()._get_default_generation_params()
    picked = {k: v for k, v in config.to_diff_dict().items()
              if k not in _GENERATION_NEUTRAL and (k not in neutral or v != neutral[k])}
    if picked:
        shown = ", ".join(f"{k}={v!r}" for k, v in sorted(picked.items()))
        reset = "; ".join(f"model.generation_config.{k} = None" for k in sorted(picked))
        what = ("return another output than the new tokens, or pick other tokens than greedy "
                "decoding" if set(picked) & _GENERATION_OUTPUT else
                "pick other tokens than greedy decoding")
        raise ValueError(f"'generate-static' runs model.generate, which follows "
                         f"model.generation_config: {shown} would {what}, and kvlab's strategies "
                         f"all return naive's tokens. Set them back ({reset}), or use another "
                         "strategy")


@torch.inference_mode()
def decode_compiled(
    model,
    input_ids,
    max_new_tokens,
    *,
    on_token: OnToken = None,
    mode: str = "reduce-overhead",
    compiled_step=None,
    cache=None,
) -> torch.Tensor:
    """Own loop over a StaticCache whose decode step runs through ``torch.compile(mode=...,
    fullgraph=True)``.

    ``compiled_step``: a ``compile_step(model, cache)`` result to reuse (compilation then happens
    once), with the ``cache`` it was compiled over (emptied in place first). On a GPU,
    ``"reduce-overhead"`` also captures CUDA graphs (torch's own, with the bookkeeping lesson 05
    does by hand).
    """
    if cache is None:
        if compiled_step is not None:
            raise ValueError("pass the cache that compiled_step was compiled over: cache=...")
        cache = make_static_cache(model, input_ids.shape[1] + max_new_tokens)
    else:
        _check_cache_for(model, cache, StaticCache, batch=input_ids.shape[0])
        if compiled_step is not None:
            check_compiled_over(compiled_step, model, cache)
    import torch._dynamo

    # Module hooks among the compile's guards: torch skips them by default, and a step compiled
    # before a hook was added (by this or an earlier state: one compile cache per process) would
    # run without it
    with torch._dynamo.config.patch(skip_nnmodule_hook_guards=False, **compile_limits()):
        cache.reset()
        check_room(cache, input_ids.shape[1], max_new_tokens, config=model.config)
        allocate_outside_inference(model, cache, input_ids.shape[0])
        step = compiled_step or compile_step(model, cache, mode=mode)
        try:
            return cached_loop(model, input_ids, max_new_tokens, cache, step=step,
                               on_token=on_token)
        except _limit_hit() as e:
            raise RuntimeError(
                f"torch.compile has compiled this decode step {RECOMPILE_LIMIT} times in this "
                "process (one per model, dtype and shape), its limit: call "
                "torch.compiler.reset() (or restart the kernel), then decode again") from e


# torch's default is 8 compiles of one function per process; one per model, dtype and batch
# size in a notebook or a benchmark needs more
RECOMPILE_LIMIT = 64


def compile_limits() -> dict:
    """``torch._dynamo.config`` settings that allow ``RECOMPILE_LIMIT`` compiles of one function
    (the knob's name depends on torch's version)."""
    import torch._dynamo

    return {knob: RECOMPILE_LIMIT for knob in ("recompile_limit", "cache_size_limit")
            if hasattr(torch._dynamo.config, knob)}


def _limit_hit() -> tuple[type[BaseException], ...]:
    """The error classes torch raises when a ``fullgraph`` compile passes its limit."""
    import torch._dynamo.exc

    return tuple(getattr(torch._dynamo.exc, name) for name in (
        "FailOnRecompileLimitHit", "FailOnCacheLimitHit") if hasattr(torch._dynamo.exc, name))


def check_compiled_over(compiled_step, model, cache) -> None:
    """Refuse a ``compile_step`` result handed over with another cache or model than it was
    compiled over: its steps would read and write that cache with that model's weights, while the
    prefill fills this one. A step compiled elsewhere (not by ``compile_step``) is not checked."""
    over = getattr(compiled_step, "kvlab_compiled_over", None)
    if over is None:
        return
    was_model, was_cache = (ref() for ref in over)
    if was_cache is not cache or was_model is not model:
        whose = "cache" if was_cache is not cache else "model"
        raise ValueError(f"compiled_step was compiled over another {whose}: its steps would "
                         f"{'write that cache' if whose == 'cache' else 'read that model'} while "
                         "the prefill uses this one. Pass the cache and compiled_step of one "
                         "state (STRATEGIES[name].state(model, ...)), or neither")


def check_pair(cache, compiled_step, strategy: str) -> None:
    """Refuse a ``cache`` handed over without the step compiled over it (``strategy``'s state)."""
    if cache is not None and compiled_step is None:
        raise ValueError(f"cache= needs compiled_step=, the step compiled over that cache: pass "
                         f"both (state = kvlab.STRATEGIES[{strategy!r}].state(model, ids, n), "
                         "then **state), or neither")


def reduce_overhead_state(model, input_ids, max_new_tokens, *, max_cache_len: int | None = None,
                          dynamic: bool | None = None) -> dict:
    """What ``decode_reduce_overhead`` builds for one call: a StaticCache (``max_cache_len``, else
    prompt + new tokens) and the step compiled over it (``dynamic``: passed to ``torch.compile``;
    True: one compile for every batch size). Pass them back (``**state``) to reuse the compiled
    graphs in later calls."""
    length = input_ids.shape[1] + max_new_tokens if max_cache_len is None else max_cache_len
    cache = make_static_cache(model, length)
    return {"cache": cache, "compiled_step": compile_step(model, cache, dynamic=dynamic)}


def decode_reduce_overhead(
    model, input_ids, max_new_tokens, *, on_token: OnToken = None, cache=None, compiled_step=None,
    **settings
) -> torch.Tensor:
    """The ``"reduce-overhead"`` strategy: ``decode_compiled`` over ``cache`` with ``compiled_step``
    (else those of ``reduce_overhead_state(model, ..., **settings)``, built for this call)."""
    check_pair(cache, compiled_step, "reduce-overhead")
    if compiled_step is None:
        cache, compiled_step = reduce_overhead_state(
            model, input_ids, max_new_tokens, **settings
        ).values()
    return decode_compiled(
        model, input_ids, max_new_tokens, on_token=on_token, compiled_step=compiled_step,
        cache=cache
    )


def compile_step(model, cache, *, mode: str = "reduce-overhead", dynamic: bool | None = None):
    """``torch.compile`` of the decode step over ``cache`` (one graph, no break allowed:
    ``fullgraph=True``)."""
    param = next(model.parameters())
    check_dtype(param.device, param.dtype)  # bf16 on a GPU without it (a T4): say to use float16
    step = torch.compile(decode_step_fn(model, cache), mode=mode, fullgraph=True, dynamic=dynamic)
    step.kvlab_compiled_over = weakref.ref(model), weakref.ref(cache)  # check_compiled_over
    return step


def graph_breaks(fn, *args):
    """What ``torch._dynamo.explain`` finds when it traces ``fn(*args)``: ``.graph_count``,
    ``.graph_break_count``, ``.break_reasons``. A graph break is what ``fullgraph=True`` forbids and
    a CUDA graph cannot span."""
    torch.compiler.reset()
    return torch._dynamo.explain(fn)(*args)


class CountedCompile:
    """``torch.compile(fn, **options)`` that counts the graphs Dynamo compiles *for its own calls*:
    the first compile and every recompile (a guard that failed: a changed shape, a changed Python
    value). Call it like ``fn``; read ``compiles``. torch has no public counter for this
    (``torch._dynamo.utils.counters`` is private), so kvlab keeps the bookkeeping here.
    ``backend="eager"`` runs Dynamo alone (its guards, no inductor): cheap, and the guards, hence
    the recompiles, are the same whatever the backend.
    """

    def __init__(self, fn, **options):
        self.fn, self.options = fn, options
        self.compiled = torch.compile(fn, **options)
        self.compiles = 0
        self.calls = 0

    def __call__(self, *args, **kwargs):
        # private: read only here, behind this public class
        from torch._dynamo.utils import counters

        before = counters["stats"]["unique_graphs"]
        try:
            return self.compiled(*args, **kwargs)
        finally:
            self.compiles += counters["stats"]["unique_graphs"] - before
            self.calls += 1


def counted_compile(fn, **options) -> CountedCompile:
    """``torch.compile(fn, **options)`` whose ``.compiles`` says how many graphs were compiled for
    it (see :class:`CountedCompile`). Example: ``step = counted_compile(f, backend="eager",
    fullgraph=True)``."""
    return CountedCompile(fn, **options)

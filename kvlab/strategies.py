"""The one table of decoding strategies, and ``kvlab.decode``, the entry point that runs any of
them.

Each strategy is declared once below: its name, a one-line description, where the function that
decodes lives (``"module:function"``, imported at its first use, so ``import kvlab`` loads no
strategy's module, and no Triton; a reader or a tool follows a decode from the name), the keyword
options that function gets, the lesson that builds it, what it builds for each call unless handed it
(``builds``: a decoder with its graphs, or a cache and a compiled step), and the flags the benchmark
and its plots read. Adding a strategy means one ``Strategy(...)`` line here and a test that it is
token-exact against ``"naive"``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import import_module
from types import MappingProxyType

import torch

from .decoding import check_inputs, unpadded_ids
from .graph_decoder import GraphSafeDecoder
from .graphs import check_runner
from .runtime import count, one_call

# what a state hands over that decodes one strategy's way (a cache is any strategy's)
STATE_KEYS = ("decoder", "compiled_step", "batcher")
_DECODE_ONLY = {"on_token", "decoder", "batcher", "compiled_step", "tune"}  # what no builder takes
# Python launches every kernel / torch.compile's graphs / kvlab captures
KINDS = ("eager", "compiled", "graph")


def _resolved(where: str | Callable) -> Callable:
    """The function at ``where`` (``"module:function"``, imported now), or ``where`` itself if a
    function."""
    if callable(where):
        return where
    module, name = where.split(":")
    return getattr(import_module(module), name)


@dataclass(frozen=True)
class Strategy:
    name: str
    about: str  # one line: what this path does
    # "module:function" (or the function): function(model, ids, n, *, on_token, **options)
    decodes: str | Callable
    lesson: int  # the lesson that builds it
    kind: str  # one of KINDS
    # keywords always passed
    options: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    # accepts max_cache_len (the benchmark fixes it per run: graphs and compiles reused)
    sized: bool = False
    compiled: bool = False  # runs torch.compile (minutes on a 2-core CPU)
    cuda_only: bool = False  # without CUDA it runs uncompiled: the benchmark times it only on a GPU
    warm_full: bool = False  # the first call must be a full-length one (it compiles or captures)
    ablation: bool = False  # a path with one change: timed to show what that change moves
    # False only for lesson 04's first attempt, wrong by design (the benchmark leaves it out)
    exact: bool = True
    # decode steps one graph replay makes (their tokens reach on_token in a burst)
    steps_per_replay: int = 1
    # build(model, ids, n, **options): what function builds per call
    builds: str | Callable | None = None
    # the cache class a cache= must be, checked (hf_caches._check_cache_for) and allocated outside
    # inference mode at the door: for a function a lesson shows bare, as written first
    cache_kind: str | None = None

    @property
    def function(self) -> Callable:
        """The function that decodes (its module imported on first use)."""
        return _resolved(self.decodes)

    @property
    def build(self) -> Callable | None:
        """What builds this strategy's state for one call (``state``), or None; it checks its
        inputs as ``kvlab.decode`` does."""
        if self.builds is None:
            return None
        builder = _resolved(self.builds)

        @functools.wraps(builder)
        def build(model, input_ids, max_new_tokens, *, attention_mask=None, **kwargs):
            accepted = self.build_keywords()  # less what the strategy fixes, as state's
            accepted = accepted if accepted is None else accepted - set(self.options)
            input_ids, max_new_tokens = self.checked(model, input_ids, max_new_tokens, kwargs,
                                                     accepted, "build", attention_mask)
            return self._tagged(builder(model, input_ids, max_new_tokens, **self.options,
                                        **kwargs))

        return build

    def build_keywords(self) -> set[str] | None:
        """The keywords ``build`` takes (the strategy's ``options`` too), or None where it passes
        the rest on (it refuses what it does not take)."""
        params = list(inspect.signature(_resolved(self.builds)).parameters.values())[3:]
        if any(p.kind is p.VAR_KEYWORD for p in params):
            passed_on = self.keywords()
            return None if passed_on is None else (passed_on - _DECODE_ONLY) | set(self.options)
        return {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}

    def checked(self, model, input_ids, max_new_tokens, kwargs: dict, accepted: set[str] | None,
                what: str = "decode", attention_mask=None) -> tuple[torch.Tensor, int]:
        """The door of ``kvlab.decode``, ``state`` and ``build``: the ids (a tokenizer's output
        unpacked) and ``max_new_tokens`` as an int, else a clear error; ``accepted``: the keywords
        allowed (None: all)."""
        input_ids = unpadded_ids(input_ids, attention_mask)
        max_new_tokens = check_inputs(model, input_ids, max_new_tokens)
        unknown = [] if accepted is None else sorted(set(kwargs) - accepted)
        if unknown and what == "state" and self.builds is None:
            # nothing is built, so nothing is held: the keywords belong to each decode call
            keys = ", ".join(f"{k}=" for k in unknown)
            decodes = self.keywords() or set()
            where = (f"pass {keys} to kvlab.decode(..., strategy={self.name!r})"
                     if set(unknown) <= decodes else
                     f"strategy {self.name!r} takes "
                     + (", ".join(f"{k}=" for k in sorted(decodes)) or "no options"))
            hold = (", or hold a cache= (make one and pass it to every call)"
                    * ("cache" in decodes and set(unknown) <= decodes))
            raise TypeError(f"{self.name} builds no state to hold, so STRATEGIES[{self.name!r}]"
                            f".state takes no {keys}: {where}{hold}")
        if unknown:
            takes = ", ".join(f"{k}=" for k in sorted(accepted)) or "no options"
            who = (f"strategy {self.name!r}" if what == "decode"
                   else f"STRATEGIES[{self.name!r}].{what}")
            raise TypeError(f"{who} takes no "
                            f"{', '.join(f'{k}=' for k in unknown)}; it takes {takes}. Drop it, or "
                            "pick a strategy that takes it (kvlab.STRATEGIES)")
        _check_on_token(kwargs.get("on_token"))
        check_options(kwargs)
        for key in STATE_KEYS:
            # what a state() built is this strategy's only; a decoder built by hand decodes the
            # way its builder tagged, and an ablation's name takes its strategy's decoder (the
            # caller picked its options)
            held = kwargs.get(key)
            built_for = getattr(held, "kvlab_state_of", None)
            how = f"was built by STRATEGIES[{built_for!r}].state"
            if built_for is None:
                built_for = getattr(held, "kvlab_strategy", self.name)
                how = f"decodes the {built_for!r} way"
                if self.ablation and self.name.startswith(built_for + "/"):
                    built_for = self.name
            if built_for != self.name:
                raise ValueError(f"this {key}= {how}, and "
                                 f"would decode as {built_for!r} under the name {self.name!r}. "
                                 f"Pass strategy={built_for!r}, or build a state for "
                                 f"{self.name!r}: STRATEGIES[{self.name!r}].state(model, ...)")
        if self.cache_kind is not None and kwargs.get("cache") is not None:
            from . import hf_caches

            kind = getattr(import_module("transformers"), self.cache_kind)
            cache = kwargs["cache"]
            hf_caches._check_cache_for(model, cache, kind, batch=input_ids.shape[0])
            # the function's own checks first (as it makes them): a call refused leaves the cache
            # unallocated; one that runs finds it allocated outside inference mode, so that
            # cache.reset() works on it afterwards anywhere
            hf_caches.require_empty(cache)
            hf_caches.check_room(cache, input_ids.shape[1], max_new_tokens)
            hf_caches.allocate_outside_inference(model, cache, input_ids.shape[0])
        if kwargs.get("max_cache_len") is not None:  # once here, before a builder computes with it
            kwargs["max_cache_len"] = count(kwargs["max_cache_len"], "max_cache_len")
        return input_ids, max_new_tokens

    def keywords(self) -> set[str] | None:
        """The keywords a caller may pass: the function's own, and where it passes the rest on
        (``**settings``), its builder's; less those the strategy fixes (``options``). None where the
        builder passes the rest on too (it refuses what it does not take, by the caller's names)."""
        names: set[str] = set()
        for fn in (self.function, self.build):
            if fn is None:
                break
            params = list(inspect.signature(fn).parameters.values())[3:]  # after model, ids, n
            names |= {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
            if not any(p.kind is p.VAR_KEYWORD for p in params):
                return names - set(self.options)
        return None

    def __call__(self, model, input_ids: torch.Tensor, max_new_tokens: int,
                 **kwargs) -> torch.Tensor:
        """Decode with this strategy's function and options (no input checks: ``kvlab.decode`` makes
        them)."""
        return self.function(model, input_ids, max_new_tokens, **self.options, **kwargs)

    def state(self, model, input_ids: torch.Tensor, max_new_tokens: int, *, attention_mask=None,
              **kwargs) -> dict:
        """What ``function`` would build for one call (``build``), as the keywords that hand it
        over: decode many times with ``strategy(model, ids, n, **state)`` and it is built once
        (empty if it builds none)."""
        accepted = None if self.builds is None else self.build_keywords()
        accepted = accepted if accepted is None else accepted - set(self.options)
        input_ids, max_new_tokens = self.checked(model, input_ids, max_new_tokens, kwargs,
                                                 accepted if self.builds else set(), "state",
                                                 attention_mask)
        if self.builds is None:
            return {}
        made = _resolved(self.builds)(model, input_ids, max_new_tokens, **self.options, **kwargs)
        made = self._tagged(made)
        return {"decoder": made} if isinstance(made, GraphSafeDecoder) else made

    def _tagged(self, made):
        """``made`` (a builder's decoder or dict of state) with what decodes this strategy's way
        marked with its name: ``checked`` refuses it under another strategy's."""
        state = {"decoder": made} if isinstance(made, GraphSafeDecoder) else made
        for key in STATE_KEYS:
            if key in state:
                state[key].kvlab_state_of = self.name
        return made


def _check_on_token(on_token) -> None:
    """Refuse an ``on_token`` that cannot be called as ``on_token(k, token)``, before any work."""
    if on_token is None:
        return
    if not callable(on_token):
        raise TypeError(f"on_token must be a function on_token(k, token), got "
                        f"{type(on_token).__name__}")
    try:
        signature = inspect.signature(on_token)
    except (TypeError, ValueError):  # a builtin without one: it is called as it is
        return
    try:
        signature.bind(0, None)
    except TypeError:
        raise TypeError(f"on_token is called as on_token(k, token) (the step, then the new token "
                        f"ids [batch, 1]); {getattr(on_token, '__name__', 'it')}{signature} cannot "
                        "take those two arguments") from None


_GRAPH_SAFE_FN = "kvlab.graph_decoder:decode_graph_safe", "kvlab.graph_decoder:graph_safe_decoder"
_COMPILED_FN = ("kvlab.compiled_step:decode_graph_safe_compiled",
                "kvlab.compiled_step:compiled_decoder")
_KERNELS_FN = ("kvlab.kernels.decoder:decode_graph_safe_kernels",
               "kvlab.kernels.decoder:kernels_decoder")
_SPECULATIVE_FN = "kvlab.speculative:decode_speculative", "kvlab.speculative:speculative_decoder"
_SPECULATIVE_KERNELS_FN = ("kvlab.kernels.decoder:decode_speculative_kernels",
                          "kvlab.kernels.decoder:speculative_kernels_decoder")
_REDUCE_OVERHEAD_FN = ("kvlab.hf_caches:decode_reduce_overhead",
                       "kvlab.hf_caches:reduce_overhead_state")
_GQA_FN = ("kvlab.compiled_step:decode_reduce_overhead_gqa",
           "kvlab.compiled_step:reduce_overhead_gqa_state")


def _kernels_variant(name: str, about: str, **options) -> Strategy:
    steps = options.get("steps", 16)
    return Strategy(f"graph-safe-kernels/{name}", f"variant: graph-safe-kernels with {about}",
                    _KERNELS_FN[0], 6, "graph", MappingProxyType(options), sized=True,
                    warm_full=True, ablation=True, steps_per_replay=steps, builds=_KERNELS_FN[1])


STRATEGIES: dict[str, Strategy] = {s.name: s for s in [
    Strategy("naive", "no cache: the whole sequence recomputed at every step",
             "kvlab.decoding:decode_naive", 1, "eager"),
    Strategy("handwritten", "lesson 02's own KV cache (torch.cat per step)",
             "kvlab.handwritten:decode_handwritten", 2, "eager"),
    Strategy("dynamic", "transformers DynamicCache, own eager loop",
             "kvlab.hf_caches:decode_dynamic", 3, "eager"),
    Strategy("static", "transformers StaticCache, own eager loop", "kvlab.hf_caches:decode_static",
             3, "eager", sized=True),
    Strategy("generate-static", 'model.generate(cache_implementation="static") (compiles the step '
             "itself on a GPU)", "kvlab.hf_caches:decode_generate", 3, "compiled",
             MappingProxyType({"cache_implementation": "static"}), compiled=True, warm_full=True),
    Strategy("reduce-overhead", 'torch.compile(step, mode="reduce-overhead", fullgraph=True), '
             "StaticCache, Python loop", _REDUCE_OVERHEAD_FN[0], 3, "compiled", sized=True,
             compiled=True, warm_full=True, builds=_REDUCE_OVERHEAD_FN[1]),
    Strategy("reduce-overhead/gqa", "variant: reduce-overhead with the attention reading the "
             "cache's kv heads as they are (SDPA enable_gqa, "
             "kvlab.compiled_step.gqa_sdpa_attention) instead of transformers' repeat_kv copy of "
             "the cache under torch.compile",
             _GQA_FN[0], 3, "compiled", sized=True, compiled=True, warm_full=True, ablation=True,
             builds=_GQA_FN[1]),
    Strategy("static-graph", "vanilla StaticCache, decode step captured once and replayed: lesson "
             "04's first attempt, wrong by design", "kvlab.failures:decode_static_graph", 4,
             "graph", sized=True, exact=False, cache_kind="StaticCache"),
    Strategy("graph-safe", "GraphSafeStaticCache, eager kernels captured in one graph by kvlab",
             _GRAPH_SAFE_FN[0], 5, "graph", sized=True, warm_full=True, builds=_GRAPH_SAFE_FN[1]),
    Strategy("graph-safe-compiled", "graph-safe + fused projections, GEMV reductions, split-K "
             "Triton decode attention, step compiled (max-autotune-no-cudagraphs, coordinate "
             "descent), 16 steps per captured graph", _COMPILED_FN[0], 6, "graph", sized=True,
             compiled=True, cuda_only=True, warm_full=True, steps_per_replay=16,
             builds=_COMPILED_FN[1]),
    Strategy("graph-safe-kernels", "graph-safe cache, the step as kvlab's own Triton kernels (5 "
             "per layer: norm fused into the GEMVs or, from 2 rows, tl.dot tiles or cuBLAS as "
             "measured fastest; RoPE, cache write and attention on tensor cores in one) reading "
             "the model's own weights, 16 steps per captured graph, the prefill captured too and "
             "through the same kernels up to kvlab.kernels.decoder.KERNEL_PREFILL_MAX_ROWS prompt "
             "rows, no torch.compile (CPU: the same math in PyTorch, graph emulated)",
             _KERNELS_FN[0], 6, "graph", sized=True, warm_full=True, steps_per_replay=16,
             builds=_KERNELS_FN[1]),
    Strategy("graph-safe-compiled/1-step-graphs", "ablation: one decode step per captured graph",
             _COMPILED_FN[0], 6, "graph", MappingProxyType({"steps": 1}), sized=True, compiled=True,
             cuda_only=True, warm_full=True, ablation=True, builds=_COMPILED_FN[1]),
    _kernels_variant("1-step-graphs", "one decode step per captured graph instead of 16", steps=1),
    _kernels_variant("broadcast-attention", "attention's scores and P.V as broadcast "
                     "multiply-and-sum (no tensor cores) instead of tl.dot over each kv head's "
                     "query group padded to a 16-row tile",
                     dot_attention=False),
    _kernels_variant("row-gemv", "the GEMV kernel for every row up to "
                     "kvlab.kernels.gemv.GEMV_MAX_ROWS (each row reads the weights again) and "
                     "cuBLAS above (norm, SiLU and residual unfused) instead of the measured "
                     "dispatch (kvlab.kernels.gemv.TILE_DISPATCH: tl.dot tiles of rows where they "
                     "won)", tiles=False),
    _kernels_variant("eager-prefill", "the prefill run eagerly (every kernel launched from Python) "
                     "instead of captured at the prompt's power-of-two bucket "
                     "(kvlab.graph_decoder.prompt_bucket) and replayed", captured_prefill=False),
    _kernels_variant("max-splits", "attention split over up to kvlab.kernels.common.MAX_SPLITS "
                     "programs per (row, kv head) at every batch, their shares combined, instead "
                     "of only as many as fill the GPU once (kvlab.kernels.common.fill_splits: one "
                     "program per pair once the pairs fill the multiprocessors)",
                     fill_splits=False),
    Strategy("graph-safe-speculative", "graph-safe + prompt-lookup speculative decoding: k=4 "
             "n-gram drafts from the prompt and output, verified in one captured graph of k+1 rows",
             _SPECULATIVE_FN[0], 7, "graph", sized=True, warm_full=True, steps_per_replay=5,
             builds=_SPECULATIVE_FN[1]),
    Strategy("graph-safe-speculative/kernels", "graph-safe-speculative over kvlab's kernels: the "
             "prefill, the verify of k+1 rows (the prefill's causal attention kernel) and the "
             "plain steps as graph-safe-kernels' "
             "(kvlab.kernels.decoder.speculative_kernels_decoder)",
             _SPECULATIVE_KERNELS_FN[0], 7, "graph", sized=True, warm_full=True, steps_per_replay=5,
             builds=_SPECULATIVE_KERNELS_FN[1]),
    Strategy("paged", "paged KV cache (blocks handed out as rows grow) + continuous batching: each "
             "row a request, eager prefill, decode steps replayed from one captured graph per "
             "batch-size bucket",
             "kvlab.continuous_batching:decode_paged", 7, "graph", sized=True, warm_full=True,
             builds="kvlab.continuous_batching:paged_batcher"),
]}
assert all(s.kind in KINDS for s in STRATEGIES.values())

# What ``python -m kvlab.lab.bench`` runs by default: every exact path of lessons 01-06 but the
# ablations, in the course's order. Lesson 07's (drafts verified in bursts, a batch of requests) run
# when named, and in 07.
DEFAULT_STRATEGIES = [name for name, s in STRATEGIES.items()
                      if s.exact and not s.ablation and s.lesson <= 6]
BENCHMARKED = [name for name, s in STRATEGIES.items() if s.exact]  # what the benchmark accepts


def strategy_named(name: str | Strategy) -> Strategy:
    """The declared strategy called ``name`` (a ``Strategy`` of the table stands for its name)."""
    if isinstance(name, Strategy):
        if STRATEGIES.get(name.name) != name:
            raise ValueError(f"strategy {name.name!r} is not declared in kvlab.STRATEGIES: declare "
                             "it there (STRATEGIES[s.name] = s) and pass its name")
        name = name.name
    if not isinstance(name, str):
        raise TypeError(f"strategy= takes a name, one of {', '.join(STRATEGIES)}; got "
                        f"{type(name).__name__}")
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; choose one of {', '.join(STRATEGIES)}")
    return STRATEGIES[name]


def decode(model, input_ids: torch.Tensor, max_new_tokens: int, *,
           strategy: str | Strategy = "naive", attention_mask=None, **kwargs) -> torch.Tensor:
    """Greedy-decode ``max_new_tokens`` tokens after ``input_ids`` with the named strategy
    (``kvlab.STRATEGIES``: its name, or its ``Strategy``).

    ``input_ids``: ``[batch, prompt_len]``, or a tokenizer's output; a batch with padding (an
    ``attention_mask`` with zeros) is refused. Returns a LongTensor ``[batch, max_new_tokens]`` of
    new token ids. Every strategy but ``"static-graph"`` returns the same tokens as ``"naive"`` (in
    fp32); the course's checks assert it.
    """
    chosen = strategy_named(strategy)
    input_ids, max_new_tokens = chosen.checked(model, input_ids, max_new_tokens, kwargs,
                                               chosen.keywords(), attention_mask=attention_mask)
    cache = kwargs.get("cache")
    # a call empties or fills the cache it is handed: one call at a time (a nested call from
    # on_token or another thread's would reset it under the running one). A GraphSafeDecoder built
    # around it takes that lock itself (graph strategies with a builder)
    if (cache is None or not hasattr(cache, "__weakref__")  # none, or one the strategy refuses
            or (chosen.kind == "graph" and chosen.builds is not None)):
        return chosen(model, input_ids, max_new_tokens, **kwargs)
    with one_call(cache, RuntimeError, f"{type(cache).__name__} (cache=)", "kvlab.decode"):
        return chosen(model, input_ids, max_new_tokens, **kwargs)


# Fixed at build: a held decoder keeps them (kvlab.kernels.decoder.KERNEL_OPTIONS are the last
# three).
DECODER_SETTINGS = ("graph", "compile_mode", "prefill_bucket", "captured_prefill", "steps", "fuse",
                    "gemv", "attention", "dot_attention", "tiles", "fill_splits")


# Switches of a path's kernels or ablations: a truthy "no" or a falsy 0 would time the opposite
FLAGS = ("captured_prefill", "fuse", "gemv", "dot_attention", "tiles", "fill_splits", "tune")


def check_flags(options, flags=FLAGS, error: type[Exception] = ValueError) -> None:
    """Refuse a switch (``flags`` of ``options``) that is not True or False, with ``error`` (the
    caller's own refusal, e.g. the benchmark's ``BenchArgumentError``)."""
    for name in flags:
        if name in options and not isinstance(options[name], bool):
            raise error(f"{name} must be True or False, got {options[name]!r:.80}")


def check_options(options: dict) -> None:
    """Refuse options of which a strategy would silently use only one: a ``decoder`` brings its own
    cache, cache length and settings, and a ``cache`` its own length; and a switch (``FLAGS``) that
    is not a bool."""
    check_flags(options)
    # a capture's settings, before anything is written (lesson 04's first attempt takes them)
    if "warmup" in options:
        options["warmup"] = count(options["warmup"], "warmup", minimum=0)
    if "runner" in options:
        check_runner(options["runner"])
    if options.get("keep") is not None and not isinstance(options["keep"], dict):
        raise TypeError(f"keep must be a dict (it receives the cache and the graph), got "
                        f"{type(options['keep']).__name__}: pass keep={{}} and read it after")
    given = [name for name in ("decoder", "cache", "max_cache_len")
             if options.get(name) is not None]
    settings = [name for name in DECODER_SETTINGS if name in options]
    if "decoder" in given and settings:
        raise ValueError(f"pass decoder= or {', '.join(f'{s}=' for s in settings)}, not both: a "
                         "GraphSafeDecoder keeps the settings it was built with and captured its "
                         "graphs with them. Drop them to reuse the decoder, or drop decoder= to "
                         "build one with them")
    if "decoder" in given and "cache" in given:
        raise ValueError("pass decoder= or cache=, not both: a GraphSafeDecoder decodes into its "
                         "own cache (decoder.cache) and would ignore cache=. Drop decoder= to "
                         "decode into your cache (a decoder is built around it), or drop cache= to "
                         "reuse the decoder")
    if "decoder" in given and "max_cache_len" in given:
        raise ValueError("pass decoder= or max_cache_len=, not both: a GraphSafeDecoder keeps the "
                         "max_cache_len it was built with (decoder.max_cache_len) and would ignore "
                         "max_cache_len=. Drop max_cache_len= to reuse the decoder, or drop "
                         "decoder= for one of that length")
    if "cache" in given and "max_cache_len" in given:
        raise ValueError("pass cache= or max_cache_len=, not both: a cache keeps the length it was "
                         f"made with and max_cache_len={options['max_cache_len']} would be "
                         "ignored. Drop max_cache_len= to decode into your cache, or drop cache= "
                         "for a new cache of that length")

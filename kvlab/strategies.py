"""The one table of decoding strategies, and ``kvlab.decode``, the entry point that runs any of them.

Each strategy is declared once below: its name, a one-line description, the function that decodes (the function
itself, so a reader or a tool can follow a decode from here), the keyword options that function gets, the lesson that
builds it, what it builds for each call unless handed it (``build``: a decoder with its graphs, or a cache and a
compiled step), and the flags the benchmark and its plots read. Adding a strategy means one ``Strategy(...)`` line here and a
test that it is token-exact against ``"naive"``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import MappingProxyType

import torch

from .continuous_batching import decode_paged, paged_batcher
from .decoding import check_inputs, decode_naive, unpadded_ids
from .failures import decode_static_graph
from .graph_decoder import (
    GraphSafeDecoder,
    compiled_decoder,
    decode_graph_safe,
    decode_graph_safe_compiled,
    decode_graph_safe_kernels,
    graph_safe_decoder,
    kernels_decoder,
)
from .handwritten import decode_handwritten
from .hf_caches import (
    decode_dynamic,
    decode_generate,
    decode_reduce_overhead,
    decode_static,
    reduce_overhead_state,
)
from .kernels.step import KERNEL_OPTIONS, PREFILL_OPTIONS
from .speculative import decode_speculative, speculative_decoder

KINDS = ("eager", "compiled", "graph")  # Python launches every kernel / torch.compile (with its own graphs) / kvlab captures


@dataclass(frozen=True)
class Strategy:
    name: str
    about: str  # one line: what this path does
    function: Callable  # called as function(model, input_ids, max_new_tokens, *, on_token=None, **options)
    lesson: int  # the lesson that builds it
    kind: str  # one of KINDS
    options: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))  # keywords always passed
    sized: bool = False  # accepts max_cache_len (the benchmark fixes it per run, so graphs and compiles are reused)
    compiled: bool = False  # runs torch.compile (minutes on a 2-core CPU)
    cuda_only: bool = False  # without CUDA it runs uncompiled: the benchmark times it only on a GPU
    warm_full: bool = False  # the first call must be a full-length one (it compiles or captures)
    ablation: bool = False  # a lesson-06 path with one change: timed to show what that change moves
    exact: bool = True  # False only for lesson 04's first attempt, wrong by design (the benchmark leaves it out)
    steps_per_replay: int = 1  # decode steps one graph replay makes (their tokens reach on_token in a burst)
    build: Callable | None = None  # build(model, input_ids, max_new_tokens, **options): what function builds per call

    def __call__(self, model, input_ids: torch.Tensor, max_new_tokens: int, **kwargs) -> torch.Tensor:
        """Decode with this strategy's function and options (no input checks: ``kvlab.decode`` makes them)."""
        return self.function(model, input_ids, max_new_tokens, **self.options, **kwargs)

    def state(self, model, input_ids: torch.Tensor, max_new_tokens: int, **kwargs) -> dict:
        """What ``function`` would build for one call (``build``), as the keywords that hand it over: decode many
        times with ``strategy(model, ids, n, **state)`` and it is built once (empty for a strategy that builds none)."""
        if self.build is None:
            return {}
        made = self.build(model, input_ids, max_new_tokens, **self.options, **kwargs)
        return {"decoder": made} if isinstance(made, GraphSafeDecoder) else made


def _ablation(name: str, about: str, **options) -> Strategy:
    return Strategy(f"graph-safe-compiled/{name}", f"ablation: {about}", decode_graph_safe_compiled,
                    6, "compiled" if name == "no-graph" else "graph", MappingProxyType(options), sized=True,
                    compiled=True, cuda_only=True, warm_full=True, ablation=True,
                    steps_per_replay=options.get("steps", 16) if name != "no-graph" else 1, build=compiled_decoder)


def _kernels_variant(name: str, about: str, **options) -> Strategy:
    return Strategy(f"graph-safe-kernels/{name}", f"variant: graph-safe-kernels with {about}",
                    decode_graph_safe_kernels, 6, "graph", MappingProxyType(options), sized=True, warm_full=True,
                    ablation=True, steps_per_replay=16, build=kernels_decoder)


STRATEGIES: dict[str, Strategy] = {s.name: s for s in [
    Strategy("naive", "no cache: the whole sequence recomputed at every step", decode_naive, 1, "eager"),
    Strategy("handwritten", "lesson 02's own KV cache (torch.cat per step)", decode_handwritten, 2,
             "eager"),
    Strategy("dynamic", "transformers DynamicCache, own eager loop", decode_dynamic, 3, "eager"),
    Strategy("static", "transformers StaticCache, own eager loop", decode_static, 3, "eager",
             sized=True),
    Strategy("generate-static", 'model.generate(cache_implementation="static") (compiles the step itself on a GPU)',
             decode_generate, 3, "compiled", MappingProxyType({"cache_implementation": "static"}),
             compiled=True, warm_full=True),
    Strategy("reduce-overhead", 'torch.compile(step, mode="reduce-overhead", fullgraph=True), StaticCache, Python loop',
             decode_reduce_overhead, 3, "compiled", sized=True, compiled=True, warm_full=True,
             build=reduce_overhead_state),
    Strategy("static-graph", "vanilla StaticCache, decode step captured once and replayed: lesson 04's first attempt, "
             "wrong by design", decode_static_graph, 4, "graph", sized=True, exact=False),
    Strategy("graph-safe", "GraphSafeStaticCache, eager kernels captured in one graph by kvlab",
             decode_graph_safe, 5, "graph", sized=True, warm_full=True, build=graph_safe_decoder),
    Strategy("graph-safe-compiled", "graph-safe + fused projections, GEMV reductions, split-K Triton decode attention, "
             "step compiled (max-autotune-no-cudagraphs, coordinate descent), 16 steps per captured graph",
             decode_graph_safe_compiled, 6, "graph", sized=True, compiled=True, cuda_only=True,
             warm_full=True, steps_per_replay=16, build=compiled_decoder),
    Strategy("graph-safe-kernels", "graph-safe cache, the step as kvlab's own Triton kernels (5 per layer: norm fused "
             "into the GEMVs or, from 2 rows, tl.dot tiles or cuBLAS as measured fastest; RoPE, cache write and "
             "attention on tensor cores in one) reading the model's own weights, 16 steps per captured graph, the "
             "prefill captured too and through the same kernels up to kvlab.kernels.step.KERNEL_PREFILL_MAX_ROWS "
             "prompt rows, no torch.compile "
             "(CPU: the same math in PyTorch, graph emulated)", decode_graph_safe_kernels, 6, "graph", sized=True,
             warm_full=True, steps_per_replay=16, build=kernels_decoder),
    _ablation("sdpa-attention", "scaled_dot_product_attention (cuDNN flash attention on the GPU) instead of the Triton "
              "decode kernel", attention=True),
    _ablation("reduction-attention", "attention written as float32 reductions for inductor instead of the Triton "
              "decode kernel", attention="reduction"),
    _ablation("no-tuning", "without coordinate-descent tuning and programmatic dependent launch", tune=False),
    _ablation("1-step-graphs", "one decode step per captured graph", steps=1),
    _ablation("no-graph", "the same compiled step launched from Python, no graph", graph=False),
    _ablation("matmul", "matmul kernels instead of GEMV reductions", gemv=False),
    _kernels_variant("broadcast-attention", "attention's scores and P.V as broadcast multiply-and-sum (no tensor "
                     "cores) instead of tl.dot over each kv head's query group padded to a 16-row tile",
                     dot_attention=False),
    _kernels_variant("row-gemv", "the GEMV kernel for every row up to kvlab.kernels.gemv.GEMV_MAX_ROWS (each row reads "
                     "the weights again) and cuBLAS above (norm, SiLU and residual unfused) instead of the measured "
                     "dispatch (kvlab.kernels.gemv.TILE_DISPATCH: tl.dot tiles of rows where they won)", tiles=False),
    _kernels_variant("eager-prefill", "the prefill run eagerly (every kernel launched from Python) instead of captured "
                     "at the prompt's power-of-two bucket (kvlab.graph_decoder.prompt_bucket) and replayed",
                     captured_prefill=False),
    _kernels_variant("early-launch", "programmatic dependent launch one kernel deeper: each kernel lets the next "
                     "one start at its entry (kvlab.kernels.common.launch_next_kernel), so a kernel loads its weights while the "
                     "one before it still waits", early_launch=True),
    _kernels_variant("max-splits", "attention split over up to kvlab.kernels.common.MAX_SPLITS programs per (row, kv "
                     "head) at every batch, their shares combined, instead of only as many as fill the GPU once "
                     "(kvlab.kernels.common.fill_splits: one program per pair once the pairs fill the multiprocessors)",
                     fill_splits=False),
    _kernels_variant("wide-prefill-tiles", "the prefill attention in kvlab.kernels.attention.PREFILL_TILE's query rows "
                     "per program at every size, instead of fewer where the prompt's tiles would leave multiprocessors "
                     "idle (kvlab.kernels.attention.prefill_rows: a 64-token prompt at batch 1 runs 48 programs of 16 "
                     "rows instead of 12 of 64)", fill_prefill=False),
    _kernels_variant("memset-counters", "the down projection's split-K arrival counters zeroed for each call (a "
                     "memset per layer in the captured graph, between the gate/up and down kernels) instead of kept "
                     "in the decoder's counters, which every kernel leaves at zero", split_counters=False),
    _kernels_variant("transformers-prefill", "the prefill through the model's transformers forward (captured at the "
                     "same bucket) at every batch, instead of through the step's own kernels (kvlab.kernels.step."
                     "kernel_prefill) where the prompt's rows are at most kvlab.kernels.step.KERNEL_PREFILL_MAX_ROWS",
                     kernel_prefill=False),
    _kernels_variant("kernel-prefill", "the prefill through the step's own kernels at every batch, also above "
                     "kvlab.kernels.step.KERNEL_PREFILL_MAX_ROWS prompt rows", kernel_prefill=True),
    _kernels_variant("fused-copy", "a fused copy of every weight (q/k/v and gate/up concatenated, kvlab.fusion) that "
                     "the kernels read, instead of the model's own weights read in stacked parts "
                     "(kvlab.kernels.gemv.Stacked)", copy_weights=True),
    Strategy("graph-safe-speculative", "graph-safe + prompt-lookup speculative decoding: k=4 n-gram drafts from the "
             "prompt and output, verified in one captured graph of k+1 rows", decode_speculative, 7, "graph",
             sized=True, warm_full=True, steps_per_replay=5, build=speculative_decoder),
    Strategy("paged", "paged KV cache (blocks handed out as rows grow) + continuous batching: each row a request, "
             "eager prefill, decode steps replayed from one captured graph per batch-size bucket", decode_paged, 7,
             "graph", sized=True, warm_full=True, build=paged_batcher),
]}
assert all(s.kind in KINDS for s in STRATEGIES.values())

# What ``python -m kvlab.lab.bench`` runs by default: every exact path of lessons 01-06 but the ablations, in the
# course's order. Lesson 07's (drafts verified in bursts, a batch of requests) run when named, and in lesson 07.
DEFAULT_STRATEGIES = [name for name, s in STRATEGIES.items() if s.exact and not s.ablation and s.lesson <= 6]
BENCHMARKED = [name for name, s in STRATEGIES.items() if s.exact]  # what the benchmark accepts
GRAPH_SAFE = [name for name in DEFAULT_STRATEGIES if STRATEGIES[name].lesson >= 5]


def strategy_named(name: str) -> Strategy:
    """The declared strategy called ``name``."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; choose one of {', '.join(STRATEGIES)}")
    return STRATEGIES[name]


def decode(model, input_ids: torch.Tensor, max_new_tokens: int, *, strategy: str = "naive", attention_mask=None,
           **kwargs) -> torch.Tensor:
    """Greedy-decode ``max_new_tokens`` tokens after ``input_ids`` with the named strategy (``kvlab.STRATEGIES``).

    ``input_ids``: ``[batch, prompt_len]``, or a tokenizer's output; a batch with padding (an ``attention_mask``
    with zeros) is refused. Returns a LongTensor ``[batch, max_new_tokens]`` of new token ids. Every strategy but
    ``"static-graph"`` returns the same tokens as ``"naive"`` (in fp32); the course's checks assert it.
    """
    chosen = strategy_named(strategy)
    input_ids = unpadded_ids(input_ids, attention_mask)
    check_inputs(model, input_ids, max_new_tokens)
    check_options(kwargs)
    return chosen(model, input_ids, max_new_tokens, **kwargs)


DECODER_SETTINGS = tuple(dict.fromkeys((
    "graph", "compile_mode", "prefill_bucket", "captured_prefill", "kernel_prefill", "copy_weights", "kernel_options",
    "steps", "fuse", "gemv", "attention", *KERNEL_OPTIONS, *PREFILL_OPTIONS)))  # fixed at build


def check_options(options: dict) -> None:
    """Refuse options of which a strategy would silently use only one: a ``decoder`` brings its own cache, cache
    length and settings, and a ``cache`` its own length."""
    given = [name for name in ("decoder", "cache", "max_cache_len") if options.get(name) is not None]
    settings = [name for name in DECODER_SETTINGS if name in options]
    if "decoder" in given and settings:
        raise ValueError(f"pass decoder= or {', '.join(f'{s}=' for s in settings)}, not both: a GraphSafeDecoder keeps "
                         "the settings it was built with and captured its graphs with them. Drop them to reuse the "
                         "decoder, or drop decoder= to build one with them")
    if "decoder" in given and "cache" in given:
        raise ValueError("pass decoder= or cache=, not both: a GraphSafeDecoder decodes into its own cache "
                         "(decoder.cache) and would ignore cache=. Drop decoder= to decode into your cache (a decoder is "
                         "built around it), or drop cache= to reuse the decoder")
    if "decoder" in given and "max_cache_len" in given:
        raise ValueError("pass decoder= or max_cache_len=, not both: a GraphSafeDecoder keeps the max_cache_len it was "
                         "built with (decoder.max_cache_len) and would ignore max_cache_len=. Drop max_cache_len= to "
                         "reuse the decoder, or drop decoder= for one of that length")
    if "cache" in given and "max_cache_len" in given:
        raise ValueError(f"pass cache= or max_cache_len=, not both: a cache keeps the length it was made with and "
                         f"max_cache_len={options['max_cache_len']} would be ignored. Drop max_cache_len= to decode into "
                         "your cache, or drop cache= for a new cache of that length")

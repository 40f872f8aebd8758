"""The pieces of ``python -m kvlab.bench``: the strategies side by side, a timer, a profiler summary, the floors.

Timing rule, the same for every strategy: ``T(n)`` is the wall time of one whole ``decode`` of ``n`` new tokens
(device synchronized before and after, nothing in between: no host sync per token), ``T(1)`` the same for one
token (the prefill). The steady-state time of one decode step is ``(T(n) - T(1)) / (n - 1)``; each sequence of
the batch gets one token per step. Medians over repeats. The first call (compile, capture, autotune) is timed
apart and never enters these numbers.
"""

from __future__ import annotations

import copy
import functools
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from .decoding import decode_naive, greedy
from .measure import peak_memory_bytes, reset_peak_memory, tensor_bytes, time_call, trace
from .runtime import synchronize

RANDOM_SMOLLM2 = "smollm2-135m-random"


def build_model(name: str, device: torch.device, *, seed: int = 0):
    """The fp32 model to check with: the real SmolLM2, its shape with random weights, a tiny model, or any other name."""
    from .models import TINY_CONFIGS, load_model, random_smollm2, tiny_model

    if name == RANDOM_SMOLLM2:
        return random_smollm2(device=device, dtype=torch.float32, seed=seed)
    if name in TINY_CONFIGS:
        return tiny_model(name, seed=seed).to(device).eval()
    return load_model(name, device=device, dtype=torch.float32)[0]


def cast(model, dtype: torch.dtype):
    """The same weights in ``dtype`` (a copy; the fp32 model stays for the checks)."""
    return model if dtype == torch.float32 else copy.deepcopy(model).to(dtype)


def round16(n: int) -> int:
    return 16 * -(-n // 16)


# ------------------------------------------------------------------------------------------------ strategies
def _ro_step(model, cache, ids):
    """The decode step torch.compile(mode="reduce-overhead") sees: forward over a StaticCache, then argmax."""
    return greedy(model(ids, cache=cache).logits)  # [batch, 1]


_RO_COMPILED: dict = {}


def run_reduce_overhead(model, ids, n, *, max_cache_len: int, dynamic=None, state: dict):
    """torch.compile(mode="reduce-overhead", fullgraph=True) of the step, Python loop, one StaticCache per shape."""
    from .hf_caches import decode_compiled, make_static_cache

    if dynamic not in _RO_COMPILED:
        _RO_COMPILED[dynamic] = torch.compile(_ro_step, mode="reduce-overhead", fullgraph=True, dynamic=dynamic)
    key = ("ro-cache", id(model), ids.shape[0], max_cache_len)
    if key not in state:
        state[key] = make_static_cache(model, max_cache_len)
    cache = state[key]
    step = functools.partial(_RO_COMPILED[dynamic], model, cache)
    return decode_compiled(model, ids, n, compiled_step=step, cache=cache)


@dataclass(frozen=True)
class Strategy:
    name: str
    about: str
    compiled: bool = False  # torch.compile runs (minutes on a 2-core CPU)
    cuda_only: bool = False  # meaningless without CUDA (a compiled step captured in a real graph)
    warm_full: bool = False  # the first call must be a full-length one (it compiles or captures)
    ablation: bool = False  # graph-safe-compiled minus one change: timed to show what that change moved, not checked

    def run(self, model, ids, n, *, max_cache_len: int, state: dict, dynamic=None):
        """Greedy-decode ``n`` tokens -> ``[batch, n]``. ``max_cache_len`` is fixed per run so graphs are reused."""
        from . import fast_decode, graph_safe, handwritten, hf_caches, kernel_step

        name = self.name
        if name == "naive":
            return decode_naive(model, ids, n)
        if name == "handwritten":
            return handwritten.decode_handwritten(model, ids, n)
        if name == "dynamic":
            return hf_caches.decode_dynamic(model, ids, n)
        if name == "static":
            return hf_caches.decode_static(model, ids, n, max_cache_len=max_cache_len)
        if name == "generate-static":
            return hf_caches.decode_generate(model, ids, n, cache_implementation="static")
        if name == "reduce-overhead":
            return run_reduce_overhead(model, ids, n, max_cache_len=max_cache_len, dynamic=dynamic, state=state)
        if name == "graph-safe":
            return graph_safe.decode_graph_safe(model, ids, n, max_cache_len=max_cache_len)
        if name == "graph-safe-kernels":
            return kernel_step.decode_graph_safe_kernels(model, ids, n, max_cache_len=max_cache_len)
        variant = FAST_VARIANTS[name]
        return fast_decode.decode_graph_safe_fast(model, ids, n, max_cache_len=max_cache_len, **variant)


# The compiled graph-safe path and its ablations: each drops one of its changes (same compiled step where possible).
FAST_VARIANTS = {
    "graph-safe-compiled": {},
    "graph-safe-compiled/sdpa-attention": {"attention": True},
    "graph-safe-compiled/reduction-attention": {"attention": "reduction"},
    "graph-safe-compiled/no-tuning": {"tune": False},
    "graph-safe-compiled/1-step-graphs": {"steps": 1},
    "graph-safe-compiled/no-graph": {"graph": False},
    "graph-safe-compiled/matmul": {"gemv": False},
}

STRATEGIES = {s.name: s for s in [
    Strategy("naive", "no cache: the whole sequence recomputed at every step"),
    Strategy("handwritten", "lesson 02's own KV cache (torch.cat per step)"),
    Strategy("dynamic", "transformers DynamicCache, own eager loop"),
    Strategy("static", "transformers StaticCache, own eager loop"),
    Strategy("generate-static", 'model.generate(cache_implementation="static") (compiles the step itself)', compiled=True, warm_full=True),
    Strategy("reduce-overhead", 'torch.compile(step, mode="reduce-overhead", fullgraph=True), StaticCache, Python loop',
             compiled=True, warm_full=True),
    Strategy("graph-safe", "GraphSafeStaticCache, eager kernels captured in one graph by kvlab", warm_full=True),
    Strategy("graph-safe-compiled", "graph-safe + fused projections, GEMV reductions, split-K Triton decode attention, "
             "step compiled (max-autotune-no-cudagraphs, coordinate descent), 16 steps per captured graph",
             compiled=True, cuda_only=True, warm_full=True),
    Strategy("graph-safe-kernels", "graph-safe cache, the step as kvlab's own Triton kernels (5 per layer: norm+matmul, "
             "RoPE+cache write+attention, matmul+residual, norm+matmul, SiLU+matmul+residual), 16 steps per captured "
             "graph, no torch.compile (CPU: the same math in PyTorch, graph emulated)", warm_full=True),
    Strategy("graph-safe-compiled/sdpa-attention", "ablation: scaled_dot_product_attention (cuDNN flash attention on "
             "the GPU) instead of the Triton decode kernel", compiled=True, cuda_only=True, warm_full=True, ablation=True),
    Strategy("graph-safe-compiled/reduction-attention", "ablation: attention written as float32 reductions for inductor "
             "instead of the Triton decode kernel", compiled=True, cuda_only=True, warm_full=True, ablation=True),
    Strategy("graph-safe-compiled/no-tuning", "ablation: without coordinate-descent tuning and programmatic dependent "
             "launch", compiled=True, cuda_only=True, warm_full=True, ablation=True),
    Strategy("graph-safe-compiled/1-step-graphs", "ablation: one decode step per captured graph", compiled=True,
             cuda_only=True, warm_full=True, ablation=True),
    Strategy("graph-safe-compiled/no-graph", "ablation: the same compiled step launched from Python, no graph",
             compiled=True, cuda_only=True, warm_full=True, ablation=True),
    Strategy("graph-safe-compiled/matmul", "ablation: matmul kernels instead of GEMV reductions", compiled=True,
             cuda_only=True, warm_full=True, ablation=True),
]}
DEFAULT_STRATEGIES = ["naive", "handwritten", "dynamic", "static", "generate-static", "reduce-overhead", "graph-safe",
                      "graph-safe-compiled", "graph-safe-kernels"]
GRAPH_SAFE = [name for name, s in STRATEGIES.items() if name.startswith("graph-safe") and not s.ablation]


def git_state() -> dict:
    """The commit the code ran from and any uncommitted kvlab file. ``$KVLAB_GIT_COMMIT`` (and ``$KVLAB_GIT_DIRTY``,
    comma-separated) win when set: a copied working tree (the GPU machine) may carry a stale or no .git."""
    import os
    import subprocess

    if os.environ.get("KVLAB_GIT_COMMIT"):
        return {"commit": os.environ["KVLAB_GIT_COMMIT"],
                "uncommitted": [p for p in os.environ.get("KVLAB_GIT_DIRTY", "").split(",") if p]}
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "kvlab"], cwd=root, capture_output=True, text=True,
                               timeout=10).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "", []
    if len(commit) != 40:  # no repository, or one without commits
        return {"commit": "unknown", "uncommitted": "unknown"}
    return {"commit": commit, "uncommitted": [line[3:] for line in dirty if line.strip()]}


# ------------------------------------------------------------------------------------------------ timing
def wall(fn, device) -> float:
    """Seconds of ``fn()``, device synchronized before and after."""
    synchronize(device)
    t0 = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - t0


def time_decode(run, n: int, device, *, repeats: int) -> dict:
    """Steady-state step time from T(n) - T(1) (see the module docstring), and peak memory of the T(n) runs."""
    prefill = statistics.median(wall(lambda: run(1), device) for _ in range(max(1, repeats)))
    reset_peak_memory(device)
    total = statistics.median(wall(lambda: run(n), device) for _ in range(max(1, repeats)))
    step = (total - prefill) / max(1, n - 1)
    return {"prefill_ms": 1e3 * prefill, "total_ms": 1e3 * total, "ms_per_token": 1e3 * step,
            "peak_memory_mb": peak_memory_bytes(device) / 2**20}


def first_mismatch(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """Index of the first step where any sequence differs, None if identical. [batch, n] each."""
    if a.shape != b.shape:
        return 0
    diff = (a != b).any(dim=0).nonzero()
    return int(diff[0]) if len(diff) else None


# ------------------------------------------------------------------------------------------------ profiler
def profile_steps(run, k: int, device) -> dict:
    """Kernels (GPU) or leaf ops (CPU) per decode step and their busy time, from traces of 1 and 1 + k tokens."""
    one, many = trace(lambda: run(1), device), trace(lambda: run(1 + k), device)
    per_step = (len(many) - len(one)) / k
    busy = max(0.0, (sum(e[1] for e in many) - sum(e[1] for e in one)) / k)  # a difference: noise can push it below 0
    last = many[-max(1, round(per_step)):]  # the last step's events (one step of the last graph replay)
    t0 = last[0][0]
    top = Counter()
    for _, dur, name in last:
        top[name[:80]] += dur
    return {"kernels_per_step": per_step, "busy_ms_per_step": busy / 1e3,
            "timeline": [[round(s - t0, 2), round(d, 2)] for s, d, _ in last],
            "top_kernels": [[name, round(us, 1)] for name, us in top.most_common(8)]}


# ------------------------------------------------------------------------------------------------ floors
def copy_bandwidth_gbps(device) -> float:
    """Bytes read + written per second by a large device copy (the memory roofline we compare against)."""
    numel = 2**28 if torch.device(device).type == "cuda" else 2**24  # fp32: 1 GiB on GPU, 64 MiB on CPU
    x = torch.ones(numel, dtype=torch.float32, device=device)
    y = torch.empty_like(x)
    seconds = time_call(lambda: y.copy_(x), min_run_time=0.3, device=device).median
    return 2 * x.numel() * 4 / seconds / 1e9


def kv_bytes_per_token(config, dtype: torch.dtype) -> int:
    """Keys + values of one token across all layers: 2 x layers x kv_heads x head_dim x bytes per element."""
    text = config.get_text_config()
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    return 2 * text.num_hidden_layers * text.num_key_value_heads * head_dim * torch.finfo(dtype).bits // 8


def floor_ms(weight_bytes: int, kv_per_token: int, batch: int, context: float, gbps: float) -> float:
    """The bandwidth floor of one decode step: every weight read once, plus each sequence's cache read once."""
    return 1e3 * (weight_bytes + batch * context * kv_per_token) / (gbps * 1e9)


def model_facts(model, dtype) -> dict:
    text = model.config.get_text_config()
    return {"architecture": type(model).__name__, "layers": text.num_hidden_layers, "hidden": text.hidden_size,
            "heads": text.num_attention_heads, "kv_heads": text.num_key_value_heads, "vocab": text.vocab_size,
            "parameters": sum(p.numel() for p in model.parameters()),
            "weight_bytes": tensor_bytes(model.parameters()), "kv_bytes_per_token": kv_bytes_per_token(model.config, dtype)}

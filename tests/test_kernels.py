"""kvlab.kernels: each kernel equals its PyTorch form (or SDPA), the GEMM dispatch picks the path it
says, both attention kernels share one online softmax and combine, and decodes through the kernels
equal naive.

On CUDA the kernels run natively; on a CPU they run in Triton's interpreter
(``TRITON_INTERPRET=1``), which needs the ``triton`` package (CUDA builds of torch bring it; on a
CPU-only machine ``pip install triton``): the checks run once in a subprocess (the ``interpreted``
fixture). The tests below that fixture's checks run the PyTorch form in this process (what a CPU
without the interpreter runs).
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kvlab import fusion
from kvlab.decoding import decode_naive
from kvlab.kernels import attention, common, step
from kvlab.kernels import gemv as gemv_module
from kvlab.lab.models import random_smollm2, tiny_model

pytestmark = [pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="needs the triton package to run the kernel (CUDA builds of torch include it; on a "
           "CPU-only machine "
           "`pip install triton` runs it in Triton's CPU interpreter)",
), pytest.mark.heavy]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

CASES = {  # batch, heads, kv_heads, cache slots, head_dim, valid slots, dtype
    # group 3, padded to 4 rows in the kernel
    "smollm2-heads": (1, 9, 3, 320, 64, 200, torch.float32),
    # slots not a multiple of the block
    "ragged-slots": (2, 4, 2, 70, 16, 33, torch.float32),
    # more blocks than MAX_SPLITS: several per program
    "long-cache": (1, 9, 3, 2100, 64, 1500, torch.float32),
    # every other share of the cache is empty
    "one-valid-slot": (1, 9, 3, 320, 64, 1, torch.float32),
    "no-gqa-bf16": (2, 8, 8, 40, 32, 40, torch.bfloat16),
}


def tokens(cuda: int, cpu: int) -> int:
    """A decode's length: shorter in the CPU interpreter (seconds per token there), still ending on
    a partial multi-step call where the CUDA length does."""
    return cuda if DEVICE == "cuda" else cpu


# on CUDA every model with and without a real graph; in the CPU interpreter (about 10 s each, and
# "graph" is the emulation there) each model once and each graph setting once
# In the CPU interpreter only eagerly: its emulated capture records the kernel's PyTorch form (see
# check_kernel_step_decode), so with a graph the tokens compared would not be the kernel's
DECODES = ([(name, graph) for name in ("tiny-llama",
                                       "tiny-qwen2") for graph in (False, True)] if DEVICE == "cuda"
           else [("tiny-llama", False), ("tiny-qwen2", False)])


def check_kernel(case: str, with_mask: bool) -> None:
    b, heads, kv_heads, length, d, valid, dtype = CASES[case]
    gen = torch.Generator().manual_seed(length)
    q, k, v = (torch.randn(b, n, s, d, generator=gen).to(DEVICE, dtype)
               for n, s in ((heads, 1), (kv_heads, length), (kv_heads, length)))
    # batch broadcast
    mask = ((torch.arange(length, device=DEVICE) < valid).reshape(1, 1, 1, length) if with_mask
            else None)
    assert common.available(q) and attention.supports(q, k, v, mask)
    got = attention.decode_attention(q, k, v, mask, d**-0.5)
    expected, _ = fusion.packed_sdpa_attention(torch.nn.Module(), q, k, v, mask, scaling=d**-0.5)
    assert got.shape == expected.shape == (b, 1, heads, d)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), expected.float(), atol=tol, rtol=tol)


def greedy_decode(model, ids: torch.Tensor, n: int, next_token) -> torch.Tensor:
    """Prefill ``ids`` through ``model`` into a fresh graph-safe cache, then ``n - 1`` calls of
    ``next_token(cache, token)`` (each writes the next token into ``token [batch, 1]``) -> ``[batch,
    n]``."""
    from kvlab.graph_safe_cache import GraphSafeStaticCache

    cache = GraphSafeStaticCache(config=model.config, max_cache_len=48)
    with torch.inference_mode():
        # [b, 1, vocab]
        logits = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1).logits
        token = logits[:, -1].argmax(-1, keepdim=True)  # [b, 1]
        out = [token.clone()]
        for _ in range(n - 1):
            next_token(cache, token)
            out.append(token.clone())
    assert int(cache.cache_position) == ids.shape[1] + n - 1, "every step advances the counter once"
    return torch.cat(out, dim=1)


def counting(module, name: str, calls: list, record=lambda *a: True):
    """Replace ``module.name`` by a wrapper that appends ``record(*args)`` to ``calls``; returns the
    restorer."""
    run = getattr(module, name)
    setattr(module, name, lambda *a, **kw: calls.append(record(*a)) or run(*a, **kw))
    return lambda: setattr(module, name, run)


def check_attention_decode(name: str) -> None:
    """A decode whose attention is ``decode_attention`` (the fused copy with
    ``attention="triton"``), step by step through the model's forward: token-exact against naive."""
    model = tiny_model(name).to(DEVICE)
    fast = fusion.fused_copy(model, attention="triton")
    calls = []
    restore = counting(attention, "decode_attention", calls)

    def next_token(cache, token):
        token.copy_(fast(input_ids=token, cache=cache,
                         use_cache=True).logits[:, -1].argmax(-1, keepdim=True))

    try:
        ids = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(5)).to(DEVICE)
        assert torch.equal(greedy_decode(fast, ids, 10, next_token),
                           decode_naive(model, ids, 10)), name
    finally:
        restore()
    assert calls, "the Triton kernel never ran: the check would only have tested the fallback"


def check_decode(name: str, graph: bool) -> None:
    from kvlab.compiled_step import decode_graph_safe_compiled

    model = tiny_model(name).to(DEVICE)
    calls = []
    restore = counting(attention, "decode_attention", calls)  # count the kernel's runs
    try:
        gen = torch.Generator().manual_seed(5)
        for prompt_len in (7, 3):  # a second prompt through the same decoder (and graph)
            ids = torch.randint(0, 256, (2, prompt_len), generator=gen).to(DEVICE)
            n = tokens(12, 10)
            out = decode_graph_safe_compiled(model, ids, n, steps=4, graph=graph, compile_mode=None,
                                             attention="triton",
                                             max_cache_len=48)
            assert torch.equal(out, decode_naive(model, ids, n)), (name, prompt_len)
    finally:
        restore()
    assert calls, "the Triton kernel never ran: the check would only have tested the fallback"


def check_compiled_decode() -> None:
    """The kernel inside a torch.compile'd step (a custom op: inductor calls it as it is), several
    steps per call."""
    from kvlab.graph_decoder import GraphSafeDecoder, model_step

    model = tiny_model("tiny-llama").to(DEVICE)
    ids = torch.randint(0, 256, (1, 9), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    fast = fusion.fused_copy(model, attention="triton", gemv=True)
    compiled = torch.compile(model_step, mode="default", fullgraph=True)
    decoder = GraphSafeDecoder(fast, 32, 1, step=compiled, steps=4, graph=DEVICE == "cuda")
    with torch.inference_mode():
        n = tokens(20, 12)
        assert torch.equal(decoder.generate(ids, n), decode_naive(model, ids, n))


def reference(fn, *args, **kwargs):
    """``fn`` of kvlab.kernels run by its PyTorch form instead of its kernel."""
    available, common.available = common.available, lambda x: False
    try:
        return fn(*args, **kwargs)
    finally:
        common.available = available


# rows, N, K, the prologue and epilogue: K and N off the block sizes, so the masks are exercised
GEMVS = {
    "plain": (1, 37, 80, {}),
    "rmsnorm-bias": (3, 37, 200, {"norm": True, "bias": True}),
    "silu-mul-residual": (2, 24, 150, {"silu_mul": True, "residual": True}),
    "bf16-rmsnorm-residual": (1, 64, 576,
                              {"norm": True, "residual": True, "dtype": torch.bfloat16}),
    # parts can end on blocks of 64 too
    "three-blocks-rmsnorm-bias": (3, 192, 80, {"norm": True, "bias": True}),
}


def dtype_of(gemv_case: tuple) -> torch.dtype:
    return gemv_case[3].get("dtype", torch.float32)


def gemv_inputs(case: str, rows: int | None = None):
    """(x, weight, keyword arguments) of a GEMVS case, with ``rows`` rows instead of the case's if
    given."""
    case_rows, n, k, opts = GEMVS[case]
    rows = rows or case_rows
    dtype = opts.get("dtype", torch.float32)
    gen = torch.Generator().manual_seed(n * k)
    rand = lambda *shape: torch.randn(*shape, generator=gen).to(DEVICE, dtype)  # noqa: E731
    x = rand(rows, 2 * k if opts.get("silu_mul") else k)
    kwargs = {"bias": rand(n) if opts.get("bias") else None,
              "norm": rand(k) if opts.get("norm") else None,
              "residual": rand(rows, n) if opts.get("residual") else None,
              "silu_mul": opts.get("silu_mul", False)}
    # outputs of order 1, like a model's
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(DEVICE, dtype)
    return x, w, kwargs


# rows of the tile-kernel checks: not a tile's multiple, so the row masks are exercised
TILE_ROWS = 5


def check_gemv(case: str, tiles: bool = False) -> None:
    x, w, kwargs = gemv_inputs(case, rows=TILE_ROWS if tiles else None)
    assert gemv_module.kernel_path(x, tiles) == ("tile" if tiles else "gemv"), (
        "the check would test another path")
    got = gemv_module.gemv(x, w, **kwargs, tiles=tiles)
    expected = reference(gemv_module.gemv, x, w, **kwargs)
    tol = 1e-4 if x.dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.float(), expected.float(), atol=tol, rtol=tol)


def check_stacked_gemv(case: str, tiles: bool = False) -> None:
    """A weight (and bias) given as parts stacked along N gives exactly the outputs of the
    concatenated weight: each output is the same program's sum in the same order, its row only read
    from where the part lies. Parts of 3 and 2 (q/k/v, gate/up), cut off the block sizes; the
    PyTorch form of the parts equals the kernel's too."""
    x, w, kwargs = gemv_inputs(case, rows=TILE_ROWS if tiles else None)
    whole = gemv_module.gemv(x, w, **kwargs, tiles=tiles)
    n, k = w.shape
    tile = gemv_module._dispatch(x, tiles, (n, k))[1]
    block = tile[1] if tile else gemv_module.gemv_config(n, k)[0]  # outputs per program
    blocks = n // block
    # one part per program
    on_blocks = [(block * (blocks // 3), block * (2 * blocks // 3))] if blocks >= 3 else []
    for cuts in ((n // 2, n - n // 3), (n // 3,), *on_blocks):
        bounds = (0, *cuts, n)
        spans = list(zip(bounds, bounds[1:], strict=False))
        bias = None if kwargs["bias"] is None else tuple(kwargs["bias"][a:b].contiguous()
                                                         for a, b in spans)
        weights = tuple(w[a:b].contiguous() for a, b in spans)
        stacked = kwargs | {"bias": bias}
        assert torch.equal(gemv_module.gemv(x, weights, **stacked, tiles=tiles),
                           whole), (case, cuts)
        tol = 1e-4 if x.dtype == torch.float32 else 3e-2
        torch.testing.assert_close(reference(gemv_module.gemv, x, weights, **stacked).float(),
                                   whole.float(),
                                   atol=tol, rtol=tol)


# K shared by 3 programs: uneven shares, and with K <= 64 one of them empty
SPLIT_TILE = (16, 32, 32, 4, 3)


def split_k(check, *args) -> None:
    """``check`` with every tile launch split along K (``SPLIT_TILE``): its sums published and added
    by the last program to arrive."""
    chosen = gemv_module.tile_choice
    gemv_module.tile_choice = lambda rows, n, k: SPLIT_TILE
    try:
        check(*args)
    finally:
        gemv_module.tile_choice = chosen


def many_units(check, *args, count: int = 10_000) -> None:
    """``check`` as on a GPU of ``count`` multiprocessors (``common.multiprocessors``); by default
    more than any launch here has programs: what ``fill_splits`` and the prefill attention plan for
    a small batch on an H100 or H200."""
    saved = common.multiprocessors
    common.multiprocessors = lambda device: count
    try:
        check(*args)
    finally:
        common.multiprocessors = saved


def one_unit(check, *args) -> None:
    """``check`` as on a GPU of one multiprocessor: the prefill attention keeps ``PREFILL_TILE``'s
    widest tiles."""
    many_units(check, *args, count=1)


def check_split_counters(case: str) -> None:
    """A split tile launch counting its arrivals in given counters (``gemv(counters=...)``) gives
    exactly the outputs of one with counters made per call and leaves them at zero; counters too few
    for the launch are not touched (it makes its own)."""
    x, w, kwargs = gemv_inputs(case, rows=TILE_ROWS)
    alone = gemv_module.gemv(x, w, **kwargs, tiles=True)
    cells = -(-x.shape[0] // SPLIT_TILE[0]) * -(-w.shape[0] // SPLIT_TILE[1])
    for size in (cells, cells + 7, cells - 1):
        counters = torch.zeros(size, dtype=torch.int32, device=DEVICE)
        assert torch.equal(gemv_module.gemv(x, w, **kwargs, tiles=True, counters=counters),
                           alone), (case, size)
        assert not counters.any(), (case, size)


ATTENTIONS = {  # batch, heads, kv_heads, slots, head_dim, position (the counter), dtype
    "one-split": (1, 9, 3, 30, 64, 12, torch.float32),
    # the last program of each kv head combines
    "three-splits": (2, 4, 2, 70, 16, 33, torch.float32),
    "first-token": (1, 4, 2, 70, 16, 0, torch.float32),
    # written to the trash slot, attends to every slot
    "cache-full": (1, 4, 4, 40, 16, 40, torch.float32),
    "long-bf16": (1, 9, 3, 1100, 64, 1000, torch.bfloat16),  # several blocks per program
    # 140 (row, kv head) pairs: fill_splits gives one program each
    "many-rows": (70, 4, 2, 70, 16, 60, torch.float32),
}
# where fill_splits changes the split plan (on a GPU: many-rows)
FILL_CASES = ["three-splits", "long-bf16", "many-rows"]


# Triton's CPU interpreter multiplies bfloat16 operands of tl.dot wrongly
# (triton-lang/triton#11584), so there the tl.dot attention is checked in float32 only; on a GPU in
# both dtypes
DOT_DTYPES = (torch.float32, torch.bfloat16) if DEVICE == "cuda" else (torch.float32,)
SPLIT_COUNTER_CASES = [case for case in ("rmsnorm-bias", "silu-mul-residual")
                       if dtype_of(GEMVS[case]) in DOT_DTYPES]
BF16_DOT_SKIP = (
    "Triton's CPU interpreter multiplies bfloat16 tl.dot operands wrongly "
    "(triton-lang/triton#11584); "
    "this case runs on a CUDA GPU (python3 -m pytest tests/test_kernels.py there)")


def on_tensor_cores(case: str, dtype: torch.dtype):
    """``case``, skipped with the reason where Triton's interpreter cannot check a bfloat16
    ``tl.dot``."""
    return case if dtype in DOT_DTYPES else pytest.param(
        case, marks=pytest.mark.skip(reason=BF16_DOT_SKIP))


def check_rope_cache_attention(case: str, dot: bool = False, fill_splits: bool = False) -> None:
    b, heads, kv_heads, slots, d, position, dtype = ATTENTIONS[case]
    gen = torch.Generator().manual_seed(slots)
    rand = lambda *shape: torch.randn(*shape, generator=gen).to(DEVICE, dtype)  # noqa: E731
    qkv = rand(b, (heads + 2 * kv_heads) * d)
    # the default RoPE's
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2, device=DEVICE).float() / d))
    keys, values = rand(b, kv_heads, slots + 1, d), rand(b, kv_heads, slots + 1, d)
    pos = torch.tensor(position, device=DEVICE)
    done = torch.zeros(b * kv_heads, dtype=torch.int32, device=DEVICE)
    k2, v2 = keys.clone(), values.clone()
    got = attention.rope_cache_attention(qkv, inv_freq, 1.0, keys, values, pos, heads, d**-0.5,
                                         done, dot=dot,
                                         fill_splits=fill_splits)
    expected = reference(attention.rope_cache_attention, qkv, inv_freq, 1.0, k2, v2, pos, heads,
                         d**-0.5)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.float(), expected.float(), atol=tol, rtol=tol)
    # the new k (after RoPE) and v, at the same slot
    torch.testing.assert_close(keys, k2, atol=tol, rtol=tol)
    torch.testing.assert_close(values, v2, atol=0, rtol=0)
    assert not done.any(), "the arrival counters must be left at zero for the next call"


# batch, heads, kv_heads, slots, head_dim, prompt rows T, valid rows, start (the counter), dtype
PREFILLS = {
    # a padded prompt: 14 rows beyond it
    "smollm2-bucket": (1, 9, 3, 200, 64, 64, 50, 0, torch.float32),
    # slots before the prompt, several tiles
    "after-cached-slots": (2, 4, 2, 150, 16, 40, 33, 70, torch.float32),
    # one query head per kv head: a tile of 64 positions
    "no-gqa": (1, 8, 8, 40, 32, 8, 3, 5, torch.float32),
    "bf16": (2, 9, 3, 300, 64, 128, 100, 0, torch.bfloat16),
    # 20 of its rows have no slot
    "prompt-past-the-cache": (1, 9, 3, 90, 64, 64, 50, 60, torch.float32),
    # a prefill replayed without a reset
    "counter-past-the-cache": (2, 4, 2, 70, 16, 40, 33, 150, torch.float32),
}


def check_prefill_attention(case: str) -> None:
    """``rope_cache_prefill_attention`` equals its PyTorch form on the prompt's rows and writes the
    same keys and values; padded rows stay finite; nothing past the prompt is written. The cache's
    buffers are views into larger ones of NaN, so a read past their slots (the counter or the prompt
    past the cache's end) would show in the output. Run it under ``one_unit`` (the widest tiles) and
    ``many_units`` (the fewest rows a tile takes)."""
    b, heads, kv_heads, slots, d, t, valid, start, dtype = PREFILLS[case]
    gen = torch.Generator().manual_seed(slots + t)
    rand = lambda *shape: torch.randn(*shape, generator=gen).to(DEVICE, dtype)  # noqa: E731
    qkv = rand(b * t, (heads + 2 * kv_heads) * d)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2, device=DEVICE).float() / d))
    keys, values = (torch.full((b, kv_heads, max(slots, start + t) + 1, d), float("nan"),
                               dtype=dtype, device=DEVICE)
                    [:, :, : slots + 1].copy_(rand(b, kv_heads, slots + 1, d)) for _ in range(2))
    k2, v2 = keys.clone(), values.clone()
    pos, n = torch.tensor(start, device=DEVICE), torch.tensor(valid, device=DEVICE)
    assert common.available(qkv), (
        "the kernel does not run here: the check would test the PyTorch form against itself")
    got = attention.rope_cache_prefill_attention(qkv, inv_freq, 1.0, keys, values, pos, n, heads,
                                                 d**-0.5)
    expected = attention._reference(qkv, inv_freq, 1.0, k2, v2, pos, n, heads, d**-0.5)
    prompt = (torch.arange(t, device=DEVICE) < valid).repeat(b)  # [b T] the rows that count
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got[prompt].float(), expected[prompt].float(), atol=tol, rtol=tol)
    assert torch.isfinite(got).all(), "a padded row must stay finite"
    # the trash slot aside
    torch.testing.assert_close(keys[:, :, :slots], k2[:, :, :slots], atol=tol, rtol=tol)
    torch.testing.assert_close(values[:, :, :slots], v2[:, :, :slots], atol=0, rtol=0)
    assert int(pos) == start, "the attention leaves the counter to kernel_prefill"


def check_kernel_prefill_decode(name: str) -> None:
    """Decodes whose prefill runs through the kernels (``kernel_prefill``, the default at these few
    rows), token-exact against naive: three prompts through one decoder, padded to one bucket
    (through its graphs on CUDA, eagerly in the CPU interpreter, as ``check_kernel_step_decode``
    says why), and one unpadded prompt without a captured prefill."""
    from kvlab.kernels.decoder import decode_graph_safe_kernels, kernels_decoder

    model = tiny_model(name).to(DEVICE)
    calls = []
    restore = counting(step, "rope_cache_prefill_attention", calls,
                       record=lambda *a: common.available(a[0]))
    try:
        gen = torch.Generator().manual_seed(7)
        n, graph = tokens(7, 4), DEVICE == "cuda"
        ids = torch.randint(0, 256, (2, 16), generator=gen).to(DEVICE)
        decoder = kernels_decoder(model, ids, n, steps=3, max_cache_len=48, graph=graph)
        assert decoder.prefill_fn is not None, "the prefill runs through the kernels"
        # the bucket's longest, then shorter: padded rows in every layer
        for prompt_len in (16, 9, 13):
            ids = torch.randint(0, 256, (2, prompt_len), generator=gen).to(DEVICE)
            out = decode_graph_safe_kernels(model, ids, n, decoder=decoder)
            assert torch.equal(out, decode_naive(model, ids, n)), (name, prompt_len)
        ids = torch.randint(0, 256, (1, 11), generator=gen).to(DEVICE)
        out = decode_graph_safe_kernels(model, ids, n, max_cache_len=48, graph=graph,
                                        captured_prefill=False)
        assert torch.equal(out, decode_naive(model, ids,
                                             n)), (name, "unpadded, the model's own weights")
    finally:
        restore()
    assert any(calls), (
        "the prefill kernel never ran: the check would only have tested the PyTorch form")


HEADS = {  # rows, vocabulary, hidden, dtype
    "ragged-vocab": (2, 1000, 64, torch.float32),
    "bf16": (1, 1500, 576, torch.bfloat16),
}


def head_inputs(case: str, rows: int | None = None):
    """(x, weight, norm) of a HEADS case whose LM head has ties: the largest logit of row 0 also at
    the last index, and at index 3 when that comes first (another block)."""
    case_rows, vocab, hidden, dtype = HEADS[case]
    gen = torch.Generator().manual_seed(vocab)
    x = torch.randn(rows or case_rows, hidden, generator=gen).to(DEVICE, dtype)
    w = (torch.randn(vocab, hidden, generator=gen) / hidden**0.5).to(DEVICE, dtype)
    norm = torch.rand(hidden, generator=gen).to(DEVICE, dtype) + 0.5
    top = reference(gemv_module.gemv, x, w, norm=norm).float().argmax(-1)  # [rows]
    w[vocab - 1] = w[top[0]]
    w[3] = w[top[0]] if int(top[0]) > 3 else w[3]
    return x, w, norm


def check_greedy_head(case: str, tiles: bool = False) -> None:
    """The LM head + argmax kernels choose what argmax of the logits chooses, the FIRST index on
    ties, and advance the counter."""
    x, w, norm = head_inputs(case, rows=TILE_ROWS if tiles else None)
    assert gemv_module.kernel_path(x, tiles) == ("tile" if tiles else "gemv"), (
        "the check would test another path")
    token, position = torch.zeros(x.shape[0], 1, dtype=torch.long,
                                  device=DEVICE), torch.tensor(5, device=DEVICE)
    gemv_module.greedy_head(x, w, norm, 1e-6, token, position, tiles=tiles)
    logits = reference(gemv_module.gemv, x, w, norm=norm)
    if x.dtype == torch.float32:
        expected = logits.argmax(-1, keepdim=True)
        assert torch.equal(token, expected), (token.flatten().tolist(), expected.flatten().tolist())
    # bf16 logits summed in another order may differ by a rounding step: the choice must be a
    # maximum
    else:
        chosen, best = logits.gather(1, token).float(), logits.float().max(-1, keepdim=True).values
        assert (chosen >= best - 0.02 * best.abs()).all(), (chosen, best)
    assert int(position) == 6


class Launched(Exception):
    """Raised by the stand-in of ``_launch_gemv``: the kernel path was taken."""


def refuse_launch(*args):
    raise Launched


def check_gemm_dispatch(max_rows: int = 2) -> None:
    """With ``GEMV_MAX_ROWS = max_rows`` (set on the module, read at each call): more rows run the
    PyTorch form (equal to it, exactly: the launch is never reached), at most ``max_rows`` rows
    launch the kernel."""
    saved_rows, saved_launch = gemv_module.GEMV_MAX_ROWS, gemv_module._launch_gemv
    gemv_module.GEMV_MAX_ROWS, gemv_module._launch_gemv = max_rows, refuse_launch
    try:
        for case in GEMVS:
            x, w, kwargs = gemv_inputs(case, rows=max_rows + 1)
            assert common.available(x), "the kernels do not run here: the check would be vacuous"
            assert torch.equal(gemv_module.gemv(x, w, **kwargs),
                               reference(gemv_module.gemv, x, w, **kwargs)), case
            with pytest.raises(Launched):
                gemv_module.gemv(x[:max_rows].contiguous(), w, **kwargs | {
                    "residual": None if kwargs["residual"] is None
                    else kwargs["residual"][:max_rows].contiguous()})
        for case in HEADS:
            x, w, norm = head_inputs(case, rows=max_rows + 1)
            token, position = torch.zeros(x.shape[0], 1, dtype=torch.long,
                                          device=DEVICE), torch.tensor(5, device=DEVICE)
            expected = reference(gemv_module.greedy_head, x, w, norm, 1e-6, token.clone(),
                                 position.clone())
            assert torch.equal(gemv_module.greedy_head(x, w, norm, 1e-6, token, position),
                               expected), case
            assert int(position) == 6
            with pytest.raises(Launched):
                gemv_module.greedy_head(x[:max_rows], w, norm, 1e-6, token[:max_rows], position)
    finally:
        gemv_module.GEMV_MAX_ROWS, gemv_module._launch_gemv = saved_rows, saved_launch


def kernel_step_decode(model, ids: torch.Tensor, n: int, **options) -> torch.Tensor:
    """Prefill through the fused copy, then ``step.kernel_step(..., **options)`` for each further
    token -> ``[batch, n]``."""
    step.check_supported(model)
    fast = fusion.fused_copy(model, attention=False)
    counters = step.arrival_counters(fast, ids.shape[0], ids.device)
    out = greedy_decode(fast, ids, n,
                        lambda cache, token: step.kernel_step(fast, cache, token, counters,
                                                              **options))
    assert not counters.any(), "the arrival counters are left at zero"
    return out


def check_kernel_step(name: str, dot_attention: bool = False, tiles: bool = False) -> None:
    """The whole step through the kernels (the plain function), token-exact against naive."""
    model = tiny_model(name).to(DEVICE)
    calls = []
    restore = counting(step, "rope_cache_attention", calls,
                       record=lambda *a: common.available(a[0]))
    try:
        ids = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(6)).to(DEVICE)
        n = tokens(6, 4)
        out = kernel_step_decode(model, ids, n, dot_attention=dot_attention, tiles=tiles)
        assert torch.equal(out, decode_naive(model, ids, n)), (name, dot_attention, tiles)
    finally:
        restore()
    assert any(calls), "the kernels never ran: the check would only have tested the PyTorch form"


def check_kernel_step_decode(name: str) -> None:
    """The whole step through the kernels, token-exact against naive, on two prompts through one
    decoder: through its graphs on CUDA, eagerly in the CPU interpreter. There the emulated capture
    records the kernels' PyTorch form (it cannot see a Triton launch), so the interpreted kernels
    would run only in the warm-ups, whose results the decoder throws away, and the tokens compared
    would be the PyTorch form's (which tests/test_strategies.py checks)."""
    from kvlab.kernels.decoder import decode_graph_safe_kernels

    model = tiny_model(name).to(DEVICE)
    calls = []
    restore = counting(step, "rope_cache_attention", calls,
                       record=lambda *a: common.available(a[0]))
    try:
        gen = torch.Generator().manual_seed(6)
        for prompt_len in (7, 3):  # a second prompt through the same decoder (and graph, on CUDA)
            ids = torch.randint(0, 256, (2, prompt_len), generator=gen).to(DEVICE)
            n = tokens(7, 5)
            out = decode_graph_safe_kernels(model, ids, n, steps=3, max_cache_len=48,
                                            graph=DEVICE == "cuda")
            assert torch.equal(out, decode_naive(model, ids, n)), (name, prompt_len)
    finally:
        restore()
    assert any(calls), (
        "the kernels never ran: the check would only have tested the PyTorch reference")


def check_speculative_kernels(name: str) -> None:
    """Speculation over the kernels (``graph-safe-speculative/kernels``): the prefill, the verify of
    k + 1 rows (the prefill's causal attention kernel) and the rollback, token-exact against naive
    on a prompt that repeats itself (drafts found and some kept) and on one of random tokens;
    eagerly in the CPU interpreter (as ``check_kernel_step_decode`` says why), through its graphs on
    CUDA."""
    from kvlab.kernels.decoder import decode_speculative_kernels, speculative_kernels_decoder
    from kvlab.speculative import prompt_lookup_draft

    model = tiny_model(name).to(DEVICE)
    calls = []
    restore = counting(step, "rope_cache_prefill_attention", calls,
                       record=lambda *a: common.available(a[0]))
    try:
        n, graph = tokens(12, 5), DEVICE == "cuda"
        gen = torch.Generator().manual_seed(8)
        for _ in range(20):  # a prompt with a draft before the end, whatever this model says
            phrase = torch.randint(0, 256, (1, 5), generator=gen)
            # [1, 13]: its suffix drafts
            repeating = torch.cat([phrase, phrase, phrase[:, :3]], 1).to(DEVICE)
            # verifies without drafts make one token each, so the first draft is always reached
            history = [*repeating[0].tolist(), *decode_naive(model, repeating, n)[0].tolist()]
            if any(prompt_lookup_draft(history[:repeating.shape[1] + j], 3) for j in range(1, n)):
                break
        decoder = speculative_kernels_decoder(model, repeating, n, k=3, graph=graph)
        out = decode_speculative_kernels(model, repeating, n, decoder=decoder)
        assert torch.equal(out, decode_naive(model, repeating, n)), (name, "repeating")
        assert decoder.last_stats.drafted > 0, (
            "the lookup found no draft: the verify checked only padding")
        # the interpreter's seconds per step: tests/test_speculative.py covers batch 2 there
        if DEVICE == "cuda":
            ids = torch.randint(0, 256, (2, 7), generator=gen).to(DEVICE)
            out = decode_speculative_kernels(model, ids, n, k=2, graph=graph)
            assert torch.equal(out, decode_naive(model, ids, n)), (name, "random, batch 2")
    finally:
        restore()
    assert len(calls) > 2 and all(calls), "the verify never ran through the kernels"


ATTENTION_DECODES = ["tiny-llama", "tiny-qwen2"]  # Qwen2 has q/k/v biases
# Triton's CPU interpreter takes about 4.5 s per decode step, so there each architecture runs one of
# the two kernel-step checks: Llama the plain function, Qwen2 the decoder (several prompts, eagerly:
# 35 s)
KERNEL_STEP_DECODES = ATTENTION_DECODES if DEVICE == "cuda" else ["tiny-llama"]
DECODER_KERNEL_STEPS = ATTENTION_DECODES if DEVICE == "cuda" else ["tiny-qwen2"]
SPECULATIVE_DECODES = ATTENTION_DECODES if DEVICE == "cuda" else ["tiny-llama"]


def run_checks() -> dict[str, str]:
    """Every check, by id: "ok" or the error (what the interpreter subprocess reports)."""
    checks = {f"kernel-{case}-mask{m}": (check_kernel, case,
                                         m) for case in CASES for m in (True, False)}
    checks |= {f"attention-decode-{name}": (check_attention_decode,
                                            name) for name in ATTENTION_DECODES}
    checks |= {f"gemv-{case}": (check_gemv, case) for case in GEMVS}
    checks |= {f"tile-{case}": (check_gemv, case,
                                True) for case in GEMVS if dtype_of(GEMVS[case]) in DOT_DTYPES}
    checks |= {f"greedy-head-{case}-tiles": (check_greedy_head, case, True) for case in HEADS
               if HEADS[case][-1] in DOT_DTYPES}
    checks |= {f"tile-split-{case}": (split_k, check_gemv, case, True) for case in GEMVS
               if dtype_of(GEMVS[case]) in DOT_DTYPES}
    checks |= {f"greedy-head-{case}-tiles-split": (split_k, check_greedy_head, case,
                                                   True) for case in HEADS
               if HEADS[case][-1] in DOT_DTYPES}
    checks |= {f"tile-split-counters-{case}": (split_k, check_split_counters,
                                               case) for case in SPLIT_COUNTER_CASES}
    checks |= {f"kernel-step-{name}-tiles-split": (split_k, check_kernel_step, name, False, True)
               for name in KERNEL_STEP_DECODES}
    checks["gemm-dispatch"] = (check_gemm_dispatch,)
    checks |= {f"stacked-gemv-{case}": (check_stacked_gemv, case) for case in GEMVS}
    checks |= {f"stacked-tile-{case}": (check_stacked_gemv, case, True) for case in GEMVS
               if dtype_of(GEMVS[case]) in DOT_DTYPES}
    checks |= {f"rope-cache-attention-{case}": (check_rope_cache_attention,
                                                case) for case in ATTENTIONS}
    checks |= {f"rope-cache-attention-{case}-dot": (check_rope_cache_attention, case,
                                                    True) for case in ATTENTIONS
               if ATTENTIONS[case][-1] in DOT_DTYPES}
    checks |= {f"rope-cache-attention-{case}-fill": (check_rope_cache_attention, case, False, True)
               for case in FILL_CASES}
    checks |= {f"greedy-head-{case}": (check_greedy_head, case) for case in HEADS}
    checks |= {f"prefill-attention-{case}": (one_unit, check_prefill_attention,
                                             case) for case in PREFILLS
               if PREFILLS[case][-1] in DOT_DTYPES}
    checks |= {f"prefill-attention-{case}-fill": (many_units, check_prefill_attention,
                                                  case) for case in PREFILLS
               if PREFILLS[case][-1] in DOT_DTYPES}
    checks |= {f"kernel-prefill-{name}": (check_kernel_prefill_decode,
                                          name) for name in ATTENTION_DECODES}
    checks |= {f"kernel-step-{name}": (check_kernel_step, name) for name in KERNEL_STEP_DECODES}
    checks |= {f"kernel-step-{name}-dot": (check_kernel_step, name,
                                           True) for name in KERNEL_STEP_DECODES}
    checks |= {f"kernel-step-{name}-tiles": (check_kernel_step, name, False,
                                             True) for name in KERNEL_STEP_DECODES}
    checks |= {f"decode-{name}-graph{g}": (check_decode, name, g) for name, g in DECODES}
    checks["compiled-decode"] = (check_compiled_decode,)
    checks |= {f"kernel-step-decode-{name}": (check_kernel_step_decode,
                                              name) for name in DECODER_KERNEL_STEPS}
    checks |= {f"speculative-kernels-{name}": (check_speculative_kernels,
                                               name) for name in SPECULATIVE_DECODES}
    results = {}
    for key, (fn, *args) in checks.items():
        try:
            fn(*args)
            results[key] = "ok"
        except Exception as err:  # reported per check by the parent test
            results[key] = f"{type(err).__name__}: {err}"[:2000]
    return results


@pytest.fixture(scope="module")
def interpreted():
    """None on CUDA (checks run in this process); on CPU, the results of all checks run once in a
    subprocess under ``TRITON_INTERPRET=1`` (Triton reads it when it is first imported, so it cannot
    be switched on here)."""
    if DEVICE == "cuda":
        return None
    env = os.environ | {"TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True,
                          timeout=600,
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def outcome(interpreted, key: str, fn, *args) -> None:
    if interpreted is None:
        fn(*args)
    else:
        assert interpreted[key] == "ok", interpreted[key]


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("with_mask", [True, False])
def test_kernel_matches_sdpa(interpreted, case, with_mask):
    outcome(interpreted, f"kernel-{case}-mask{with_mask}", check_kernel, case, with_mask)


@pytest.mark.parametrize("name", ATTENTION_DECODES)
def test_decode_with_the_attention_kernel_is_token_exact(interpreted, name):
    outcome(interpreted, f"attention-decode-{name}", check_attention_decode, name)


@pytest.mark.parametrize(("name", "graph"), DECODES)
def test_decode_with_the_kernel_is_token_exact(interpreted, name, graph):
    outcome(interpreted, f"decode-{name}-graph{graph}", check_decode, name, graph)


def test_compiled_step_with_the_kernel_is_token_exact(interpreted):
    outcome(interpreted, "compiled-decode", check_compiled_decode)


@pytest.mark.parametrize("case", list(GEMVS))
def test_gemv_kernel_matches_reference(interpreted, case):
    outcome(interpreted, f"gemv-{case}", check_gemv, case)


def test_gemm_dispatch_above_gemv_max_rows(interpreted):
    outcome(interpreted, "gemm-dispatch", check_gemm_dispatch)


@pytest.mark.parametrize("case", list(ATTENTIONS))
def test_rope_cache_attention_kernel_matches_reference(interpreted, case):
    outcome(interpreted, f"rope-cache-attention-{case}", check_rope_cache_attention, case)


@pytest.mark.parametrize(
    "case", [on_tensor_cores(case, ATTENTIONS[case][-1]) for case in ATTENTIONS])
def test_rope_cache_attention_on_tensor_cores_matches_reference(interpreted, case):
    outcome(interpreted, f"rope-cache-attention-{case}-dot", check_rope_cache_attention, case, True)


@pytest.mark.parametrize("case", FILL_CASES)
def test_rope_cache_attention_filling_the_gpu_once_matches_reference(interpreted, case):
    """``fill_splits=True``: fewer programs per (row, kv head), each walking more blocks of the
    cache; in the interpreter, where two cores stand in for the multiprocessors, every case runs one
    program per pair."""
    outcome(interpreted, f"rope-cache-attention-{case}-fill", check_rope_cache_attention, case,
            False, True)


def test_fill_splits_gives_each_multiprocessor_one_program():
    """One program per pair from as many pairs as multiprocessors (a CPU's cores where the kernels
    are interpreted), enough programs per pair for one wave below."""
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    for device in devices:
        units = (torch.cuda.get_device_properties(device).multi_processor_count
                 if device.type == "cuda" else os.cpu_count())
        assert [common.fill_splits(p, device) for p in (units, 2 * units, 1)] == [1, 1, units], (
            device)
        if units > 1:
            assert common.fill_splits(units - 1, device) == 2, device


@pytest.mark.parametrize("case", list(HEADS))
def test_greedy_head_kernels_match_argmax(interpreted, case):
    outcome(interpreted, f"greedy-head-{case}", check_greedy_head, case)


@pytest.mark.parametrize("name", KERNEL_STEP_DECODES)
def test_kernel_step_through_the_kernels_is_token_exact(interpreted, name):
    outcome(interpreted, f"kernel-step-{name}", check_kernel_step, name)


@pytest.mark.parametrize("name", KERNEL_STEP_DECODES)
def test_kernel_step_with_attention_on_tensor_cores_is_token_exact(interpreted, name):
    outcome(interpreted, f"kernel-step-{name}-dot", check_kernel_step, name, True)


@pytest.mark.parametrize("name", KERNEL_STEP_DECODES)
def test_kernel_step_with_tiled_matmuls_is_token_exact(interpreted, name):
    outcome(interpreted, f"kernel-step-{name}-tiles", check_kernel_step, name, False, True)


@pytest.mark.parametrize("case", [on_tensor_cores(case, dtype_of(GEMVS[case])) for case in GEMVS])
def test_tile_kernel_matches_reference(interpreted, case):
    outcome(interpreted, f"tile-{case}", check_gemv, case, True)


@pytest.mark.parametrize("case", [on_tensor_cores(case, HEADS[case][-1]) for case in HEADS])
def test_greedy_head_tile_kernels_match_argmax(interpreted, case):
    outcome(interpreted, f"greedy-head-{case}-tiles", check_greedy_head, case, True)


@pytest.mark.parametrize("case", [on_tensor_cores(case, dtype_of(GEMVS[case])) for case in GEMVS])
def test_split_k_tile_kernel_matches_reference(interpreted, case):
    outcome(interpreted, f"tile-split-{case}", split_k, check_gemv, case, True)


@pytest.mark.parametrize("case", SPLIT_COUNTER_CASES)
def test_split_k_tile_kernel_counts_in_given_counters_and_leaves_them_zero(interpreted, case):
    outcome(interpreted, f"tile-split-counters-{case}", split_k, check_split_counters, case)


@pytest.mark.parametrize("name", KERNEL_STEP_DECODES)
def test_kernel_step_with_every_matmul_split_shares_the_decoders_counters(interpreted, name):
    """Every tile launch split along K, counting in the step's ``counters`` beside the attention
    kernel: token-exact, and the counters left at zero (``kernel_step_decode`` asserts it)."""
    outcome(interpreted, f"kernel-step-{name}-tiles-split", split_k, check_kernel_step, name, False,
            True)


@pytest.mark.parametrize("case", [on_tensor_cores(case, HEADS[case][-1]) for case in HEADS])
def test_split_k_greedy_head_tiles_match_argmax(interpreted, case):
    outcome(interpreted, f"greedy-head-{case}-tiles-split", split_k, check_greedy_head, case, True)


def test_the_path_is_the_tile_kernel_from_two_rows_only_when_asked():
    x = torch.zeros(3, 8, device=DEVICE)
    here = "tile" if common.available(x) else "torch"
    assert gemv_module.kernel_path(x, tiles=True) == here
    assert gemv_module.kernel_path(x[:1], tiles=True) == (
        "gemv" if common.available(x) else "torch")
    big = torch.zeros(gemv_module.GEMV_MAX_ROWS + 1, 8, device=DEVICE)
    assert (gemv_module.kernel_path(big) == "torch"
            and gemv_module.kernel_path(big, tiles=True) == here)


def test_the_tile_dispatch_follows_the_swept_rows_at_or_below_the_batch(monkeypatch):
    monkeypatch.setattr(common, "available", lambda x: True)
    qkv, down, unswept = (960, 576), (576, 1536), (40, 24)
    # 4 rows' entry
    assert gemv_module.tile_choice(2, *qkv) == gemv_module.tile_choice(8, *qkv) == "gemv"
    assert gemv_module.tile_choice(32, *qkv) == gemv_module.TILE_DISPATCH[qkv][16]
    assert gemv_module.tile_choice(100, *qkv) == gemv_module.TILE_DISPATCH[qkv][64]
    assert gemv_module.tile_choice(5, *unswept) == gemv_module.tile_config(5, *unswept)
    rows = lambda n: torch.zeros(n, 8)  # noqa: E731
    assert gemv_module.kernel_path(rows(16), True, qkv) == "tile"
    # the GEMV kernel was faster at 4 rows
    assert gemv_module.kernel_path(rows(4), True, qkv) == "gemv"
    assert gemv_module.kernel_path(rows(4), True, down) == "gemv"
    # an unswept shape: tile_config's
    assert gemv_module.kernel_path(rows(64), True, (49152, 1)) == "tile"
    monkeypatch.setitem(gemv_module.TILE_DISPATCH, down, {4: "gemv", 16: "torch"})
    assert gemv_module.kernel_path(rows(64), True, down) == "torch"  # where cuBLAS was faster
    # without tiles: above GEMV_MAX_ROWS
    assert gemv_module.kernel_path(rows(64), False, qkv) == "torch"


def test_the_tile_dispatch_is_the_fastest_path_of_the_recorded_h200_sweeps():
    from kvlab.lab import bench

    table = bench.tile_sweep(bench.recorded("h200_tile_sweep"))
    fastest = {(row["N"], row["K"], rows): row["fastest"] for by_rows in table.values()
               for rows, row in by_rows.items()}
    # a fifth number: K splits
    assert all(isinstance(f, str) or len(f) in (4, 5) for f in fastest.values())
    assert {(n, k, rows): choice for (n, k), by_rows in gemv_module.TILE_DISPATCH.items()
            for rows, choice in by_rows.items()} == fastest


@pytest.mark.parametrize("case", GEMVS)
def test_a_weight_in_stacked_parts_gives_the_concatenated_weights_outputs(interpreted, case):
    outcome(interpreted, f"stacked-gemv-{case}", check_stacked_gemv, case)


@pytest.mark.parametrize("case", [on_tensor_cores(case, dtype_of(GEMVS[case])) for case in GEMVS])
def test_a_weight_in_stacked_parts_gives_the_concatenated_weights_outputs_in_tiles(
        interpreted, case):
    outcome(interpreted, f"stacked-tile-{case}", check_stacked_gemv, case, True)


@pytest.mark.parametrize("case", [on_tensor_cores(case, PREFILLS[case][-1]) for case in PREFILLS])
def test_prefill_attention_kernel_matches_reference(interpreted, case):
    outcome(interpreted, f"prefill-attention-{case}", one_unit, check_prefill_attention, case)


@pytest.mark.parametrize("case", [on_tensor_cores(case, PREFILLS[case][-1]) for case in PREFILLS])
def test_prefill_attention_in_tiles_that_fill_the_gpu_matches_reference(interpreted, case):
    """Where the GPU has more multiprocessors than the prompt has tiles: 16 query rows a program
    (the fewest a ``tl.dot`` tile takes), several programs over one prompt's positions."""
    outcome(interpreted, f"prefill-attention-{case}-fill", many_units, check_prefill_attention,
            case)


def test_prefill_rows_shrink_until_the_programs_fill_the_gpu(monkeypatch):
    """``prefill_rows``: PREFILL_TILE's rows where the launch fills the multiprocessors, halved (not
    below ``common.DOT_ROWS``) while it would not; SmolLM2's 64-token prompt on 132
    multiprocessors."""
    monkeypatch.setattr(common, "multiprocessors", lambda device: 132)
    cpu = torch.device("cpu")
    # pairs (batch x kv heads), prompt rows T, query heads per kv head padded, most rows -> rows per
    # program
    # batch 1: 3 x 16 tiles of 4 positions = 48 programs
    assert attention.prefill_rows(3, 64, 4, 64, cpu) == 16
    # batch 16: 48 x 4 tiles = 192 programs, enough
    assert attention.prefill_rows(48, 64, 4, 64, cpu) == 64
    # 24 x 4 = 96 too few; 24 x 8 = 192
    assert attention.prefill_rows(24, 64, 4, 64, cpu) == 32
    # never below a tl.dot tile, however few programs
    assert attention.prefill_rows(1, 8, 16, 64, cpu) == 16
    monkeypatch.setattr(common, "multiprocessors", lambda device: 1)
    # one program fills one unit: the widest tile
    assert attention.prefill_rows(1, 64, 4, 64, cpu) == 64


@pytest.mark.parametrize("name", ATTENTION_DECODES)
def test_prefill_through_the_kernels_is_token_exact(interpreted, name):
    outcome(interpreted, f"kernel-prefill-{name}", check_kernel_prefill_decode, name)


@pytest.mark.parametrize("name", DECODER_KERNEL_STEPS)
def test_kernel_step_decode_is_token_exact(interpreted, name):
    outcome(interpreted, f"kernel-step-decode-{name}", check_kernel_step_decode, name)


@pytest.mark.parametrize("name", SPECULATIVE_DECODES)
def test_speculation_over_the_kernels_is_token_exact(interpreted, name):
    outcome(interpreted, f"speculative-kernels-{name}", check_speculative_kernels, name)


def test_both_attention_kernels_share_one_online_softmax_and_combine():
    """The softmax arithmetic is written once, in kvlab.kernels.common: the attention kernels call
    its helpers and compute no exponential of their own (their results are checked against the
    references above)."""
    for kernel in (attention._partial_kernel, attention._rope_cache_attention_kernel,
                   attention._prefill_attention_kernel):
        assert ("attend(" in kernel.src and "softmax_start(" in kernel.src
                and "tl.exp" not in kernel.src)
    for kernel in (attention._combine_kernel, attention._rope_cache_attention_kernel):
        assert "combine_splits(" in kernel.src and "tl.exp" not in kernel.src
    for kernel in (attention._partial_kernel, attention._rope_cache_attention_kernel):
        assert "store_partial(" in kernel.src
    assert attention.attend is common.attend and attention.combine_splits is common.combine_splits


def test_gemm_dispatch_reads_gemv_max_rows_at_each_call(monkeypatch):
    """Where the kernels would run (forced here, so no interpreter is needed), more than
    ``GEMV_MAX_ROWS`` rows never reach the launch and equal the PyTorch form; fewer do reach it."""
    monkeypatch.setattr(common, "available", lambda x: True)
    check_gemm_dispatch(max_rows=1)
    check_gemm_dispatch(max_rows=3)


def test_unsupported_shapes_fall_back():
    q = torch.randn(1, 4, 3, 16)  # three query tokens: the prefill
    k = torch.randn(1, 2, 8, 16)
    assert not attention.supports(q, k, k, None)
    one = q[:, :, :1]
    assert attention.supports(one, k, k, None)
    assert attention.supports(one, k, k, torch.ones(1, 1, 1, 8, dtype=torch.bool))
    # head_dim 24
    assert not attention.supports(torch.randn(1, 4, 1, 24), torch.randn(1, 2, 8, 24),
                                  torch.randn(1, 2, 8, 24), None)
    assert not attention.supports(one, k, k, torch.zeros(1, 1, 1, 8))  # an additive float mask
    # a mask of other length
    assert not attention.supports(one, k, k, torch.ones(1, 1, 1, 7, dtype=torch.bool))
    # values laid out unlike keys
    assert not attention.supports(one, k, k.transpose(1, 2).contiguous().transpose(1, 2), None)


# ---- the decode step in its PyTorch form (what a CPU runs; the kernels are checked against it
# above) ----

@pytest.fixture
def pytorch_form(monkeypatch):
    monkeypatch.setattr(common, "available", lambda x: False)  # also under TRITON_INTERPRET


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-mistral"])
def test_kernel_step_in_pytorch_form_is_token_exact(pytorch_form, name):
    model = tiny_model(name)
    gen = torch.Generator().manual_seed(3)
    for prompt_len, n in [(9, 14), (20, 5)]:
        ids = torch.randint(0, 256, (2, prompt_len), generator=gen)
        assert torch.equal(kernel_step_decode(model, ids, n),
                           decode_naive(model, ids, n)), (name, prompt_len)


def test_arrival_counters_hold_the_attentions_and_the_split_matmuls_of_every_batch_row():
    """One per (row, kv head) for attention, and enough for a split tile launch over the hidden
    size: tiles of at least 16 rows times blocks of at least 16 outputs."""
    for name in ("tiny-llama", "smollm2"):
        model = tiny_model("tiny-llama") if name == "tiny-llama" else random_smollm2(layers=1)
        config = model.config
        for batch in (1, 3, 64):
            done = step.arrival_counters(model, batch, "cpu")
            assert done.dtype == torch.int32 and not done.any(), (name, batch)
            assert done.numel() >= batch * config.num_key_value_heads, (name, batch)
            assert done.numel() >= -(-batch // 16) * -(-config.hidden_size // 16), (name, batch)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-mistral"])
@pytest.mark.parametrize("graph", [False, True])
def test_kernel_step_is_token_exact(pytorch_form, name, graph):
    from kvlab.kernels.decoder import decode_graph_safe_kernels

    model = tiny_model(name)
    gen = torch.Generator().manual_seed(3)
    # several prompts through one decoder (and its graphs)
    for prompt_len, n in [(9, 14), (4, 14), (20, 5)]:
        ids = torch.randint(0, 256, (2, prompt_len), generator=gen)
        out = decode_graph_safe_kernels(model, ids, n, steps=4, graph=graph, max_cache_len=32)
        assert torch.equal(out, decode_naive(model, ids, n)), (name, prompt_len)


def test_the_step_advances_the_cache_counter_once(pytorch_form):
    from kvlab.kernels.decoder import kernels_decoder

    model = tiny_model("tiny-llama")
    ids = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(4))
    decoder = kernels_decoder(model, ids, 5, max_cache_len=32, steps=2, graph=False)
    decoder.generate(ids, 5)  # prefill (6 tokens) + 4 decode steps
    assert int(decoder.cache.cache_position) == 6 + 4


def test_the_captured_prefill_serves_every_prompt_of_its_bucket_and_refuses_a_longer_one(
        pytorch_form):
    from kvlab.graph_decoder import GraphSafeError, prompt_bucket
    from kvlab.kernels.decoder import decode_graph_safe_kernels, kernels_decoder

    assert [prompt_bucket(n, 64) for n in (1, 2, 3, 5, 8, 9, 33, 64)] == [1, 2, 4, 8, 8, 16, 64, 64]
    assert prompt_bucket(40, 48) == 48  # capped at the cache
    model = tiny_model("tiny-llama")
    gen = torch.Generator().manual_seed(6)
    ids = torch.randint(0, 256, (2, 5), generator=gen)
    decoder = kernels_decoder(model, ids, 9, steps=4, max_cache_len=32, captured_prefill=True)
    assert decoder.prefill_bucket == 8
    for prompt_len in (5, 8, 6):  # one captured prefill for each length of the bucket
        ids = torch.randint(0, 256, (2, prompt_len), generator=gen)
        out = decode_graph_safe_kernels(model, ids, 9, decoder=decoder)
        assert torch.equal(out, decode_naive(model, ids, 9)), prompt_len
    assert decoder.prefill_graph is not None and "prefill graph" in decoder.describe()
    with pytest.raises(GraphSafeError, match="longer than prefill_bucket=8"):
        decoder.generate(torch.randint(0, 256, (2, 9), generator=gen), 3)


def test_kernels_decoder_reads_the_models_weights_and_prefills_through_the_kernels_up_to_the_measured_rows(  # noqa: E501
        pytorch_form, monkeypatch):
    """The strategy's defaults: no fused copy (the decoder runs the caller's model), and the prefill
    through the kernels while batch x bucket is at most KERNEL_PREFILL_MAX_ROWS, the model's forward
    above; either way exact."""
    from kvlab.kernels import decoder as kernels

    model = tiny_model("tiny-llama")
    gen = torch.Generator().manual_seed(9)
    monkeypatch.setattr(kernels, "KERNEL_PREFILL_MAX_ROWS", 16)
    # buckets of 8
    for batch, prompt_len, captured, through_kernels in ((2, 5, True, True), (3, 5, True, False),
                                                         # unpadded
                                                         (3, 5, False, True), (4, 5, False, False)):
        ids = torch.randint(0, 256, (batch, prompt_len), generator=gen)
        decoder = kernels.kernels_decoder(model, ids, 6, steps=2, max_cache_len=16,
                                          captured_prefill=captured)
        assert decoder.model is model and (decoder.prefill_fn is not None) is through_kernels, (
            batch, captured)
        assert torch.equal(decoder.generate(ids, 6), decode_naive(model, ids, 6)), (batch, captured)


def test_the_kernel_options_reach_the_attention_and_others_are_refused(pytorch_form, monkeypatch):
    from kvlab.kernels.decoder import KERNEL_OPTIONS, kernels_decoder
    from kvlab.strategies import DECODER_SETTINGS

    model = tiny_model("tiny-llama")
    ids = torch.randint(0, 256, (1, 4), generator=torch.Generator().manual_seed(8))
    seen = []
    real = step.rope_cache_attention
    monkeypatch.setattr(step, "rope_cache_attention",
                        lambda *a, dot=False, **kw: seen.append(dot) or real(*a, dot=dot, **kw))
    decoder = kernels_decoder(model, ids, 3, steps=1, max_cache_len=16, graph=False,
                              dot_attention=True)
    assert torch.equal(decoder.generate(ids, 3), decode_naive(model, ids, 3))
    # two steps, every layer
    assert seen and all(seen) and len(seen) == 2 * model.config.num_hidden_layers
    with pytest.raises(TypeError, match="blocks"):
        kernels_decoder(model, ids, 3, blocks=4)
    # a held decoder refuses them at kvlab.decode's door
    assert set(KERNEL_OPTIONS) <= set(DECODER_SETTINGS)


@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-gemma", "tiny-phi3"])
def test_other_layers_are_refused_with_what_to_do(name):
    with pytest.raises(ValueError, match="Use the 'graph-safe' strategy .* fuse=False"):
        step.check_supported(tiny_model(name))


@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-gemma", "tiny-phi3"])
def test_the_decoder_refuses_other_layers_with_what_to_do(name):
    from kvlab.kernels.decoder import kernels_decoder, speculative_kernels_decoder

    for build in (kernels_decoder, speculative_kernels_decoder):
        with pytest.raises(ValueError, match="Use the 'graph-safe' strategy"):
            build(tiny_model(name), torch.tensor([[1, 2, 3]]), 4)


def test_an_unregistered_attention_is_refused_with_what_is_supported():
    from kvlab.kernels.decoder import kernels_decoder

    model = tiny_model("tiny-llama")
    model.set_attn_implementation("eager")
    with pytest.raises(ValueError,
                       match=r"attention implementation is 'eager'.*kvlab checks 'sdpa'"
                             r".*set_attn_implementation"):
        kernels_decoder(model, torch.tensor([[1, 2, 3]]), 4)


def test_a_config_that_disagrees_with_the_modules_is_refused():
    import kvlab

    model = tiny_model("tiny-llama")
    model.config.num_hidden_layers = 1
    with pytest.raises(ValueError,
                       match=r"num_hidden_layers is 1 but the model has 2 decoder layers.*= 2"):
        kvlab.decode(model, torch.tensor([[1, 2, 3]]), 4, strategy="graph-safe-kernels")


def test_a_length_dependent_rope_is_refused():
    model = tiny_model("tiny-llama")
    model.model.rotary_emb.rope_type = "dynamic"
    with pytest.raises(ValueError, match="dynamic"):
        step.check_supported(model)


def test_kernels_refuse_layouts_they_would_misread():
    x = torch.randn(4, 2).t()  # rows of stride 1 element apart: not contiguous rows
    with pytest.raises(ValueError, match="contiguous rows"):
        common.require_dense_rows(x=x)
    common.require_dense_rows(x=x.contiguous(), residual=None)  # accepted


if __name__ == "__main__":  # the interpreter subprocess of the `interpreted` fixture
    print(json.dumps(run_checks()))

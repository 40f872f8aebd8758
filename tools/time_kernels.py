"""Time kvlab.kernels on a GPU at SmolLM2-135M's shapes (bf16), and profile one whole
graph-safe-kernels step.

    python tools/time_kernels.py [--out sweep.json] [--parts decode-attention,gemv,attention,step]

Each kernel configuration runs 30 times inside one CUDA graph (as in the decode step: the gaps
between kernels count); the figure is µs per call, the median of 20 replays. The parts:

- ``decode-attention``: ``kvlab.kernels.attention.decode_attention`` (the split-K kernel of
  graph-safe-compiled) against SDPA (cuDNN flash attention, what
  ``graph-safe-compiled/sdpa-attention`` uses) at ``common.BLOCK_L`` and
  ``attention.ATTENTION_WARPS`` values; a cache of 320 slots of which 192 are valid (the benchmark's
  64-token prompt + 256 new tokens, on average).
- ``gemv``: block sizes and warps of ``gemv`` / ``greedy_head`` per projection (sets
  ``gemv.GEMV_CONFIGS``).
- ``attention``: ``common.MAX_SPLITS``, ``common.BLOCK_L`` and ``ATTENTION_WARPS`` of
  ``rope_cache_attention``.
- ``step``: one graph-safe-kernels decode with the fastest configurations, and the kernels of one of
  its steps, in order, from torch.profiler, at each batch of ``--step-rows``.
- ``first-token``: where the time to the first token goes at batch 1 (a 64-token prompt), for the
  prefill through the model's transformers forward and through the kernels (``kernel_prefill``): the
  wall time of ``decoder.prefill`` and of ``decoder.generate(ids, 1)`` (in a row, and right after a
  whole decode as the benchmark times T(1)), of its host-side pieces (``read_addresses``,
  ``check_inputs``, ``cache.reset``), of one replay of the captured prefill on the GPU (CUDA
  events), and its kernels from torch.profiler.
- ``tiles``: ``gemv.tile_kernel``'s configuration (with ``--tile-splits``, split-K too) per
  projection at 2 to 64 rows, beside the GEMV kernel and cuBLAS (``graph-safe-kernels`` from 2 rows;
  sets nothing: ``gemv.TILE_DISPATCH`` takes the result by hand, and a test checks it against
  ``data/h200_tile_sweep.json``).
- ``dot-attention``: ``rope_cache_attention`` with broadcasts against ``tl.dot`` (``dot=True``) over
  splits and block sizes (``graph-safe-kernels``' attention;
  ``graph-safe-kernels/broadcast-attention`` the other).
"""

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import kvlab
from kvlab import fusion
from kvlab.kernels import attention, common, gemv
from kvlab.lab.bench import git_state
from kvlab.lab.measure import profile
from kvlab.lab.models import random_smollm2
from kvlab.strategies import STRATEGIES

SHAPES = {  # name: N, K, what the kernel does before and after the matmul
    "qkv (norm)": (960, 576, {"norm": True}),
    "o_proj (+residual)": (576, 576, {"residual": True}),
    "gate_up (norm)": (3072, 576, {"norm": True}),
    "down (silu*up, +residual)": (576, 1536, {"silu_mul": True, "residual": True}),
    "lm_head (norm)": (49152, 576, {"norm": True}),
}
HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64  # SmolLM2-135M's attention


def per_call_us(fn, calls: int = 30, replays: int = 20) -> float:
    """µs per call of ``fn``: ``calls`` calls captured in one CUDA graph, the median of ``replays``
    replays."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


def sweep_decode_attention(results: dict, save) -> None:
    b, slots, valid, d = 1, 320, 192, HEAD_DIM
    q = torch.randn(b, HEADS, 1, d, device="cuda", dtype=torch.bfloat16)
    k, v = (
        torch.randn(b, KV_HEADS, slots, d, device="cuda", dtype=torch.bfloat16) for _ in range(2)
    )
    mask = (torch.arange(slots, device="cuda") < valid).reshape(1, 1, 1, slots)
    module = torch.nn.Module()
    sdpa = per_call_us(lambda: fusion.decode_attention(module, q, k, v, mask, scaling=d**-0.5))
    print(
        f"decode attention slots={slots} valid={valid}: sdpa, GQA packed: {sdpa:6.2f} us/call",
        flush=True,
    )
    default = (common.BLOCK_L, attention.ATTENTION_WARPS)
    timings = []
    for block, warps in itertools.product((16, 32, 64, 128), (1, 2, 4, 8)):
        common.BLOCK_L, attention.ATTENTION_WARPS = block, warps
        timings.append(
            (
                per_call_us(lambda: attention.decode_attention(q, k, v, mask, d**-0.5)),
                (block, warps),
            )
        )
        print(
            f"   triton BLOCK_L={block:3} warps={warps}: {timings[-1][0]:6.2f} us/call", flush=True
        )
    common.BLOCK_L, attention.ATTENTION_WARPS = default
    timings.sort()
    results["decode_attention"] = {
        "slots": slots,
        "valid": valid,
        "sdpa_us": sdpa,
        "best (block_l, warps)": timings[0][1],
        "best_us": timings[0][0],
        "all": timings,
    }
    save()


def sweep_gemv(results: dict, save) -> None:
    dev, dt = "cuda", torch.bfloat16
    for name, (n, k, opts) in SHAPES.items():
        x = torch.randn(1, 2 * k if opts.get("silu_mul") else k, device=dev, dtype=dt)
        w = torch.randn(n, k, device=dev, dtype=dt) / k**0.5
        kw = {"norm": torch.ones(k, device=dev, dtype=dt) if opts.get("norm") else None,
              "residual": torch.zeros(1, n, device=dev, dtype=dt) if opts.get("residual") else None,
              "silu_mul": opts.get("silu_mul", False)}
        head = n > 10000  # the LM head: timed with its argmax (greedy_head), as the step runs it
        block_ns, block_ks = (
            ((4, 8, 16, 32, 64), (128, 256, 1024)) if head else ((1, 2, 4, 8, 16), (256, 512, 1024))
        )
        token = torch.zeros(1, 1, dtype=torch.long, device=dev)
        default = gemv.gemv_config(n, k)
        timings = []
        for bn, bk, warps in itertools.product(block_ns, block_ks, (2, 4, 8)):
            if not 128 <= bn * bk <= 16384 or bk > 2 * k:
                continue
            gemv.GEMV_CONFIGS[(n, k)] = (bn, bk, warps)
            if head:
                fn = lambda x=x, w=w, kw=kw, t=token: gemv.greedy_head(x, w, kw["norm"], 1e-5, t)  # noqa: E731
            else:
                fn = lambda x=x, w=w, kw=kw: gemv.gemv(x, w, **kw)  # noqa: E731
            timings.append((per_call_us(fn), (bn, bk, warps)))
        timings.sort()
        gemv.GEMV_CONFIGS[(n, k)] = timings[0][1]
        weight_gbs = n * k * 2 / (timings[0][0] * 1e-6) / 1e9
        results["gemv"][name] = {
            "N": n,
            "K": k,
            "best": timings[0][1],
            "best_us": timings[0][0],
            "default": default,
            "default_us": next((t for t, c in timings if c == default), None),
            "top5": timings[:5],
            "weight_GBps_at_best": weight_gbs,
        }
        print(
            f"{name:28} N={n:6} K={k:5}: best {timings[0][1]} {timings[0][0]:6.2f} us "
            f"({weight_gbs:6.0f} GB/s); top5 {[(round(t, 2), c) for t, c in timings[:5]]}",
            flush=True,
        )
        save()


def sweep_attention(results: dict, save) -> None:
    dev, dt = "cuda", torch.bfloat16
    b, slots, position, d = 1, 320, 192, HEAD_DIM
    qkv = torch.randn(b, (HEADS + 2 * KV_HEADS) * d, device=dev, dtype=dt)
    inv_freq = 1.0 / (100000 ** (torch.arange(0, d, 2, device=dev).float() / d))
    keys, values = (torch.randn(b, KV_HEADS, slots + 1, d, device=dev, dtype=dt) for _ in range(2))
    counters = torch.zeros(b * KV_HEADS, dtype=torch.int32, device=dev)
    pos = torch.tensor(position, device=dev)
    timings = []
    for splits, block_l, warps in itertools.product((1, 2, 4, 8, 16), (16, 32, 64), (2, 4, 8)):
        common.MAX_SPLITS, common.BLOCK_L, attention.ATTENTION_WARPS = splits, block_l, warps
        us = per_call_us(
            lambda: attention.rope_cache_attention(
                qkv, inv_freq, 1.0, keys, values, pos, HEADS, d**-0.5, counters
            )
        )
        timings.append((us, (splits, block_l, warps)))
    timings.sort()
    common.MAX_SPLITS, common.BLOCK_L, attention.ATTENTION_WARPS = timings[0][1]
    results["attention"] = {
        "slots": slots,
        "position": position,
        "best (max_splits, block_l, warps)": timings[0][1],
        "best_us": timings[0][0],
        "all": timings,
    }
    print(f"attention slots={slots} pos={position}: best {timings[0][1]} {timings[0][0]:.2f} us; "
          f"top8 {[(round(t, 2), c) for t, c in timings[:8]]}", flush=True)


STEP_ROWS = (1,)  # the batch sizes ``step`` profiles (--step-rows)


def step_profile(results: dict, save) -> None:
    for rows in STEP_ROWS:
        profile_one_step(results, rows)
        save()


def profile_one_step(results: dict, rows: int) -> None:
    model = random_smollm2(device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, 49152, (rows, 64), device="cuda")
    decoder = STRATEGIES["graph-safe-kernels"].state(model, ids, 256, max_cache_len=320)["decoder"]
    run = lambda n: kvlab.decode(model, ids, n, strategy="graph-safe-kernels", decoder=decoder)  # noqa: E731
    t0 = time.perf_counter()
    run(256)
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    times = {}
    for n in (1, 256):
        samples = []
        for _ in range(5):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            run(n)
            torch.cuda.synchronize()
            samples.append(time.perf_counter() - t0)
        times[n] = sorted(samples)[2]
    ms = 1e3 * (times[256] - times[1]) / 255
    events = profile(lambda: run(17), "cuda").kernels  # [(start us, duration us, name)]
    one = profile(lambda: run(1), "cuda").kernels
    per_step = (len(events) - len(one)) / 16
    last = events[-round(per_step):]
    key = "step" if rows == 1 else f"step@{rows}"
    results[key] = {
        "rows": rows,
        "ms_per_step": ms,
        "tokens_per_s": rows * 1e3 / ms,
        "first_call_s": first,
        "kernels_per_step": per_step,
        "busy_us": sum(e[1] for e in last),
        "kernels": [(round(s - last[0][0], 2), round(d, 2), nm[:60]) for s, d, nm in last],
    }
    print(
        f"PDL: {common.pdl(torch.device('cuda'))}; graph-safe-kernels at {rows} rows: {ms:.3f} "
        f"ms/step = {rows * 1e3 / ms:.0f} tok/s; first call {first:.1f} s; {per_step:.1f} "
        f"kernels/step, busy {results[key]['busy_us']:.0f} us",
        flush=True,
    )
    for s, d, nm in results[key]["kernels"][:12] + results[key]["kernels"][-6:]:
        print(f"   {s:8.2f} {d:6.2f}  {nm}")
    by_name = {}
    for _, d, nm in last:
        by_name.setdefault(nm[:40], []).append(d)
    for nm, ds in sorted(by_name.items(), key=lambda kv: -sum(kv[1])):
        print(
            f"   {nm:40} x{len(ds):4}  total {sum(ds):7.1f} us  median "
            f"{sorted(ds)[len(ds) // 2]:5.2f} us"
        )


def first_token(results: dict, save) -> None:
    model = random_smollm2(device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, 49152, (1, 64), device="cuda")
    with torch.inference_mode():  # as a decoder replays its graphs
        for through_kernels in (False, True):
            first_token_pieces(results, model, ids, through_kernels)
            save()


def wall_ms(fn, repeats: int = 7) -> float:
    """The median wall time of ``fn()``, the GPU synchronized before and after, in ms."""
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        samples.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(samples)


def first_token_pieces(results: dict, model, ids: torch.Tensor, through_kernels: bool) -> None:
    from kvlab.decoding import check_inputs
    from kvlab.graph_decoder import kernels_decoder, read_addresses

    decoder = kernels_decoder(model, ids, 256, max_cache_len=320, kernel_prefill=through_kernels)
    decoder.generate(ids, 32)  # captures the prefill and the steps
    graph = decoder.prefill_graph
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    gpu = []
    for _ in range(7):
        # a replay continues from the counter: from 0 each time, as a decode's prefill does
        decoder.cache.reset()
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        gpu.append(start.elapsed_time(end))
    decoder.cache.reset()
    events = profile(graph.replay, "cuda").kernels  # [(start us, duration us, name)]
    by_name = {}
    for _, d, nm in events:
        by_name.setdefault(nm[:50], []).append(d)
    after_a_decode = []  # the benchmark's pattern: T(1) right after a whole decode
    for _ in range(7):
        after_a_decode.append(wall_ms(lambda: decoder.generate(ids, 1), repeats=1))
        decoder.generate(ids, 256)
    row = {
        "prefill_ms": wall_ms(lambda: decoder.prefill(ids)),
        "read_addresses_ms": wall_ms(lambda: read_addresses(model)),
        "check_inputs_ms": wall_ms(lambda: check_inputs(model, ids, 1)),
        "generate_1_in_a_row_ms": wall_ms(lambda: decoder.generate(ids, 1), repeats=21),
        "generate_1_after_a_decode_ms": statistics.median(after_a_decode),
        "after_a_decode_all": after_a_decode,
        "cache_reset_ms": wall_ms(decoder.cache.reset),
        "replay_gpu_ms": statistics.median(gpu),
        "kernels": len(events),
        "span_us": events[-1][0] + events[-1][1] - events[0][0],
        "by_name": {nm: (len(ds), sum(ds), statistics.median(ds)) for nm, ds in by_name.items()},
    }
    key = "kernel_prefill" if through_kernels else "transformers_prefill"
    results.setdefault("first_token", {})[key] = row
    print(
        f"{key}: decoder.prefill {row['prefill_ms']:.3f} ms; generate(ids, 1) "
        f"{row['generate_1_in_a_row_ms']:.3f} ms in a row, "
        f"{row['generate_1_after_a_decode_ms']:.3f} ms after a decode; one replay "
        f"{row['replay_gpu_ms']:.3f} ms on the GPU ({row['kernels']} kernels, span "
        f"{row['span_us']:.0f} us); host: read_addresses {row['read_addresses_ms']:.3f} ms, "
        f"check_inputs {row['check_inputs_ms']:.3f} ms, cache.reset {row['cache_reset_ms']:.3f} ms",
        flush=True,
    )
    for nm, (count, total, median) in sorted(row["by_name"].items(), key=lambda kv: -kv[1][1])[:8]:
        print(f"   {nm:50} x{count:4}  total {total:7.1f} us  median {median:5.2f} us")


# the parts below take it from here (a CPU smoke run under TRITON_INTERPRET=1 sets "cpu")
DEVICE = "cuda"
TILE_ROWS = (2, 4, 8, 16, 32, 64)  # the benchmark's batch sizes above 1 (--tile-rows)
# the projections swept (--tile-shapes qkv,down: by the first word of their names)
TILE_SHAPES = list(SHAPES)
TILE_GRID = {
    "rows per program": (16, 32, 64),
    "outputs per program": (32, 64, 128),
    "K per step": (32, 64, 128),
    # tile_kernel's configurations swept (GRID_FLAGS narrow it)
    "warps": (4, 8),
    "K splits": (1,),
}
GRID_FLAGS = {"tile_m": "rows per program", "tile_n": "outputs per program", "tile_k": "K per step",
              # --tile-m 16,32 ... -> TILE_GRID's entry
              "tile_warps": "warps", "tile_splits": "K splits"}


def sweep_tiles(results: dict, save, time_fn=None) -> None:
    """``gemv.tile_kernel``'s (rows per program, outputs per program, K per step, warps) per
    projection and batch, against the GEMV kernel (one weight read per row) and the PyTorch form
    (cuBLAS, norm and SiLU unfused)."""
    time_fn = time_fn or per_call_us
    dt = torch.bfloat16
    default_choice = gemv.tile_choice
    for name in TILE_SHAPES:
        n, k, opts = SHAPES[name]
        head = n > 10000
        w = torch.randn(n, k, device=DEVICE, dtype=dt) / k**0.5
        for rows in TILE_ROWS:
            x = torch.randn(rows, 2 * k if opts.get("silu_mul") else k, device=DEVICE, dtype=dt)
            kw = {
                "norm": torch.ones(k, device=DEVICE, dtype=dt) if opts.get("norm") else None,
                "residual": torch.zeros(rows, n, device=DEVICE, dtype=dt)
                if opts.get("residual")
                else None,
                "silu_mul": opts.get("silu_mul", False),
            }
            token = torch.zeros(rows, 1, dtype=torch.long, device=DEVICE)

            def call(tiles, max_rows=gemv.GEMV_MAX_ROWS, x=x, w=w, kw=kw, token=token, head=head):
                saved, gemv.GEMV_MAX_ROWS = gemv.GEMV_MAX_ROWS, max_rows
                try:
                    if head:
                        return gemv.greedy_head(x, w, kw["norm"], 1e-5, token, tiles=tiles)
                    return gemv.gemv(x, w, **kw, tiles=tiles)
                finally:
                    gemv.GEMV_MAX_ROWS = saved

            baseline = {"gemv kernel": time_fn(lambda rows=rows: call(False, max_rows=rows)),
                        "pytorch (cuBLAS)": time_fn(lambda: call(False, max_rows=0))}
            timings = []
            for bm, bn, bk, warps, splits in itertools.product(*TILE_GRID.values()):
                if bm > max(16, common.triton.next_power_of_2(rows)) or (splits - 1) * bk >= k:
                    continue  # rows a smaller tile holds; a split with no share of K
                config = (bm, bn, bk, warps) if splits == 1 else (bm, bn, bk, warps, splits)
                gemv.tile_choice = lambda r, n_, k_, c=config: c
                try:
                    timings.append((time_fn(lambda: call(True)), config))
                # the tiles need more shared memory than a GPU has
                except common.triton.runtime.errors.OutOfResources:
                    torch.cuda.synchronize()
                finally:
                    gemv.tile_choice = default_choice
            timings.sort()
            default = default_choice(rows, n, k)
            entry = {
                "rows": rows,
                "N": n,
                "K": k,
                "best": timings[0][1],
                "best_us": timings[0][0],
                "default": default,
                "default_us": next((t for t, c in timings if c == default), None),
                **baseline,
                "top5": timings[:5],
            }
            results.setdefault("tiles", {}).setdefault(name, []).append(entry)
            print(
                f"{name:28} rows={rows:3}: tile best {timings[0][1]} {timings[0][0]:7.2f} us, "
                f"default {entry['default_us']} | gemv kernel {baseline['gemv kernel']:7.2f} | "
                f"cuBLAS {baseline['pytorch (cuBLAS)']:7.2f}",
                flush=True,
            )
            save()


def sweep_dot_attention(results: dict, save, time_fn=None) -> None:
    """``rope_cache_attention`` with scores and P.V as broadcasts (``dot=False``) and as ``tl.dot``
    (``dot=True``), at ``common.MAX_SPLITS`` and block values (``common.BLOCK_L``,
    ``common.DOT_BLOCK_L``), for caches of 320 and 2,048 slots."""
    time_fn = time_fn or per_call_us
    dt, d = torch.bfloat16, HEAD_DIM
    inv_freq = 1.0 / (100000 ** (torch.arange(0, d, 2, device=DEVICE).float() / d))
    saved = common.MAX_SPLITS, common.BLOCK_L, common.DOT_BLOCK_L
    for rows, slots, position in ((1, 320, 192), (1, 2048, 1500), (16, 320, 192)):
        qkv = torch.randn(rows, (HEADS + 2 * KV_HEADS) * d, device=DEVICE, dtype=dt)
        keys, values = (
            torch.randn(rows, KV_HEADS, slots + 1, d, device=DEVICE, dtype=dt) for _ in range(2)
        )
        counters = torch.zeros(rows * KV_HEADS, dtype=torch.int32, device=DEVICE)
        pos = torch.tensor(position, device=DEVICE)
        timings = []
        for dot, splits, block_l in itertools.product((False, True), (4, 8, 16, 32), (32, 64, 128)):
            common.MAX_SPLITS, common.BLOCK_L, common.DOT_BLOCK_L = splits, block_l, block_l
            try:
                us = time_fn(
                    lambda dot=dot, a=(qkv, inv_freq, 1.0, keys, values, pos, HEADS, d**-0.5,
                                       counters): attention.rope_cache_attention(*a, dot=dot)
                )
            finally:
                common.MAX_SPLITS, common.BLOCK_L, common.DOT_BLOCK_L = saved
            timings.append((us, (dot, splits, block_l)))
        timings.sort()
        best = {dot: next(t for t in timings if t[1][0] is dot) for dot in (False, True)}
        results.setdefault("dot_attention", []).append(
            {
                "rows": rows,
                "slots": slots,
                "position": position,
                "best_broadcast": best[False],
                "best_dot": best[True],
                "all": timings,
            }
        )
        print(
            f"attention rows={rows} slots={slots} pos={position}: broadcast best "
            f"{best[False][1][1:]} {best[False][0]:.2f} us, tl.dot best {best[True][1][1:]} "
            f"{best[True][0]:.2f} us",
            flush=True,
        )
        save()


PARTS = {
    "decode-attention": sweep_decode_attention,
    "gemv": sweep_gemv,
    "attention": sweep_attention,
    "step": step_profile,
    "tiles": sweep_tiles,
    "dot-attention": sweep_dot_attention,
    "first-token": first_token,
}


def main() -> None:
    global TILE_ROWS, STEP_ROWS
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument(
        "--parts", default="gemv,attention,step", help=f"comma-separated, of {', '.join(PARTS)}"
    )
    p.add_argument(
        "--step-rows", default=None, help=f"step: batch sizes to profile (default {STEP_ROWS})"
    )
    p.add_argument("--tile-rows", default=None, help=f"tiles: batch sizes (default {TILE_ROWS})")
    p.add_argument(
        "--tile-shapes",
        default=None,
        help=f"tiles: comma list of projections (default all: {', '.join(SHAPES)})",
    )
    for flag, key in GRID_FLAGS.items():
        p.add_argument(
            f"--{flag.replace('_', '-')}",
            default=None,
            help=f"tiles: {key} (default {TILE_GRID[key]})",
        )
    args = p.parse_args()
    ints = lambda text: tuple(int(v) for v in text.split(","))  # noqa: E731
    if args.step_rows:
        STEP_ROWS = ints(args.step_rows)
    if args.tile_rows:
        TILE_ROWS = ints(args.tile_rows)
    if args.tile_shapes:
        TILE_SHAPES[:] = [name for name in SHAPES if name.split()[0] in args.tile_shapes.split(",")]
    for flag, key in GRID_FLAGS.items():
        if getattr(args, flag):
            TILE_GRID[key] = ints(getattr(args, flag))
    results = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "command": " ".join(sys.argv),
        "git": git_state(),
        "tile_rows": TILE_ROWS,
        "tile_grid": TILE_GRID,
        "tile_shapes": TILE_SHAPES,
        "gemv": {},
    }

    def save():
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=1))

    for part in args.parts.split(","):
        PARTS[part](results, save)
        save()
    print("GEMV_CONFIGS =", dict(gemv.GEMV_CONFIGS))


if __name__ == "__main__":
    main()

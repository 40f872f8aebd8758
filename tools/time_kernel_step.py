"""Time kvlab.kernel_step's kernels on a GPU at SmolLM2-135M's shapes (bf16), and profile one whole step.

    python tools/time_kernel_step.py [--out sweep.json]

Each kernel configuration runs 30 times inside one CUDA graph (as in the decode step: the gaps between kernels
count); the figure is µs per call, the median of 20 replays. Then one graph-safe-kernels decode with the
fastest configurations, and the kernels of one of its steps, in order, from torch.profiler.
"""

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from time_decode_kernel import per_call_us  # noqa: E402

from kvlab import kernel_step  # noqa: E402
from kvlab.measure import trace  # noqa: E402
from kvlab.models import random_smollm2  # noqa: E402

SHAPES = {  # name: N, K, what the kernel does before and after the matmul
    "qkv (norm)": (960, 576, {"norm": True}),
    "o_proj (+residual)": (576, 576, {"residual": True}),
    "gate_up (norm)": (3072, 576, {"norm": True}),
    "down (silu*up, +residual)": (576, 1536, {"silu_mul": True, "residual": True}),
    "lm_head (norm)": (49152, 576, {"norm": True}),
}


def sweep_gemv(results: dict, save) -> None:
    dev, dt = "cuda", torch.bfloat16
    for name, (n, k, opts) in SHAPES.items():
        x = torch.randn(1, 2 * k if opts.get("silu_mul") else k, device=dev, dtype=dt)
        w = torch.randn(n, k, device=dev, dtype=dt) / k**0.5
        kw = {"norm": torch.ones(k, device=dev, dtype=dt) if opts.get("norm") else None,
              "residual": torch.zeros(1, n, device=dev, dtype=dt) if opts.get("residual") else None,
              "silu_mul": opts.get("silu_mul", False)}
        head = n > 10000  # the LM head: timed with its argmax (greedy_head), as the step runs it
        block_ns, block_ks = ((4, 8, 16, 32, 64), (128, 256, 1024)) if head else ((1, 2, 4, 8, 16), (256, 512, 1024))
        token = torch.zeros(1, 1, dtype=torch.long, device=dev)
        default = kernel_step.gemv_config(n, k)
        timings = []
        for bn, bk, warps in itertools.product(block_ns, block_ks, (2, 4, 8)):
            if not 128 <= bn * bk <= 16384 or bk > 2 * k:
                continue
            kernel_step.GEMV_CONFIGS[(n, k)] = (bn, bk, warps)
            if head:
                fn = lambda x=x, w=w, kw=kw, t=token: kernel_step.greedy_head(x, w, kw["norm"], 1e-5, t)  # noqa: E731
            else:
                fn = lambda x=x, w=w, kw=kw: kernel_step.gemv(x, w, **kw)  # noqa: E731
            timings.append((per_call_us(fn), (bn, bk, warps)))
        timings.sort()
        kernel_step.GEMV_CONFIGS[(n, k)] = timings[0][1]
        weight_gbs = n * k * 2 / (timings[0][0] * 1e-6) / 1e9
        results["gemv"][name] = {"N": n, "K": k, "best": timings[0][1], "best_us": timings[0][0],
                                 "default": default, "default_us": next((t for t, c in timings if c == default), None),
                                 "top5": timings[:5], "weight_GBps_at_best": weight_gbs}
        print(f"{name:28} N={n:6} K={k:5}: best {timings[0][1]} {timings[0][0]:6.2f} us ({weight_gbs:6.0f} GB/s); "
              f"top5 {[(round(t, 2), c) for t, c in timings[:5]]}", flush=True)
        save()


def sweep_attention(results: dict, save) -> None:
    dev, dt = "cuda", torch.bfloat16
    b, heads, kv_heads, slots, d = 1, 9, 3, 320, 64
    qkv = torch.randn(b, (heads + 2 * kv_heads) * d, device=dev, dtype=dt)
    inv_freq = 1.0 / (100000 ** (torch.arange(0, d, 2, device=dev).float() / d))
    keys, values = (torch.randn(b, kv_heads, slots + 1, d, device=dev, dtype=dt) for _ in range(2))
    done = torch.zeros(b * kv_heads, dtype=torch.int32, device=dev)
    timings = []
    for position in (192,):
        pos = torch.tensor(position, device=dev)
        for splits, block_l, warps in itertools.product((1, 2, 4, 8, 16), (16, 32, 64), (2, 4, 8)):
            kernel_step.MAX_SPLITS, kernel_step.BLOCK_L, kernel_step.ATTENTION_WARPS = splits, block_l, warps
            us = per_call_us(lambda pos=pos: kernel_step.rope_cache_attention(qkv, inv_freq, 1.0, keys, values, pos,
                                                                              heads, 0.125, done))
            timings.append((us, (splits, block_l, warps)))
    timings.sort()
    kernel_step.MAX_SPLITS, kernel_step.BLOCK_L, kernel_step.ATTENTION_WARPS = timings[0][1]
    results["attention"] = {"slots": slots, "position": 192, "best (max_splits, block_l, warps)": timings[0][1],
                            "best_us": timings[0][0], "all": timings}
    print(f"attention slots={slots} pos=192: best {timings[0][1]} {timings[0][0]:.2f} us; "
          f"top8 {[(round(t, 2), c) for t, c in timings[:8]]}", flush=True)


def step_profile(results: dict, save) -> None:
    model = random_smollm2(device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, 49152, (1, 64), device="cuda")
    run = lambda n: kernel_step.decode_graph_safe_kernels(model, ids, n, max_cache_len=320)  # noqa: E731
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
    events = trace(lambda: run(17), "cuda")
    one = trace(lambda: run(1), "cuda")
    per_step = (len(events) - len(one)) / 16
    last = events[-round(per_step):]
    results["step"] = {"ms_per_token": ms, "tokens_per_s": 1e3 / ms, "first_call_s": first, "kernels_per_step": per_step,
                       "busy_us": sum(e[1] for e in last), "kernels": [(round(s - last[0][0], 2), round(d, 2), nm[:60])
                                                                       for s, d, nm in last]}
    print(f"PDL: {kernel_step.pdl(torch.device('cuda'))}; graph-safe-kernels: {ms:.3f} ms/token = {1e3 / ms:.0f} tok/s; first call {first:.1f} s; "
          f"{per_step:.1f} kernels/step, busy {results['step']['busy_us']:.0f} us", flush=True)
    for s, d, nm in results["step"]["kernels"][:12] + results["step"]["kernels"][-6:]:
        print(f"   {s:8.2f} {d:6.2f}  {nm}")
    by_name = {}
    for _, d, nm in last:
        by_name.setdefault(nm[:40], []).append(d)
    for nm, ds in sorted(by_name.items(), key=lambda kv: -sum(kv[1])):
        print(f"   {nm:40} x{len(ds):4}  total {sum(ds):7.1f} us  median {sorted(ds)[len(ds) // 2]:5.2f} us")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--parts", default="gemv,attention,step")
    args = p.parse_args()
    results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "gemv": {}}
    def save():
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=1))

    for part in args.parts.split(","):
        {"gemv": sweep_gemv, "attention": sweep_attention, "step": step_profile}[part](results, save)
        save()
    print("GEMV_CONFIGS =", {k: v for k, v in kernel_step.GEMV_CONFIGS.items()})


if __name__ == "__main__":
    main()

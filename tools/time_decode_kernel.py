"""Time one layer's decode attention on a GPU, the way the fast path runs it: 30 calls captured in one CUDA graph.

    python tools/time_decode_kernel.py > data/decode_kernel_h200.txt

SmolLM2-135M's attention shape (9 heads, 3 kv heads, head_dim 64), bf16, a cache of 320 slots of which 192 are
valid (the average of the benchmark's 64-token prompt + 256 new tokens). Compares SDPA (cuDNN flash attention,
what ``graph-safe-compiled/sdpa-attention`` uses) with ``kvlab.decode_kernel`` at several block sizes and warp
counts, and prints µs per call (graph replay, median of 20 replays of 30 calls; the inter-kernel gaps count).
Its sweep has not been run on a GPU: the fastest path's attention moved into ``kvlab.kernel_step`` (swept by
``tools/time_kernel_step.py``, which reuses ``per_call_us`` from here) before device time was spent on it.
"""

import itertools
import statistics

import torch

from kvlab import decode_kernel, fusion


def per_call_us(fn, calls: int = 30, replays: int = 20) -> float:
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


def main() -> None:
    torch.manual_seed(0)
    b, heads, kv_heads, slots, valid, d = 1, 9, 3, 320, 192, 64
    q = torch.randn(b, heads, 1, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, kv_heads, slots, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    mask = (torch.arange(slots, device="cuda") < valid).reshape(1, 1, 1, slots)
    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__} | b={b} heads={heads} kv_heads={kv_heads} "
          f"slots={slots} valid={valid} head_dim={d} bf16")
    module = torch.nn.Module()
    sdpa = per_call_us(lambda: fusion.decode_attention(module, q, k, v, mask, scaling=d**-0.5))
    print(f"sdpa (cuDNN flash on H100/H200), GQA packed: {sdpa:6.2f} us/call")
    default = (decode_kernel.BLOCK_L, decode_kernel.NUM_WARPS)
    for block, w_partial, w_combine in itertools.product((16, 32, 64, 128), (1, 2, 4, 8), (1, 4)):
        decode_kernel.BLOCK_L, decode_kernel.NUM_WARPS = block, (w_partial, w_combine)
        us = per_call_us(lambda: decode_kernel.decode_attention(q, k, v, mask, d**-0.5))
        print(f"triton BLOCK_L={block:3} warps partial={w_partial} combine={w_combine}: {us:6.2f} us/call")
    decode_kernel.BLOCK_L, decode_kernel.NUM_WARPS = default


if __name__ == "__main__":
    main()

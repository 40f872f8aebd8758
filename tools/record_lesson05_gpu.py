"""Record lesson 05's GPU results into a JSON file (run on a CUDA machine; the notebook reads the file).

    python tools/record_lesson05_gpu.py data/lesson05_gpu.json

The real SmolLM2 weights are not on the GPU machine, so the model is ``kvlab.models.random_smollm2``: the same
shapes (hence the same kernels and timings), random weights (so meaningless text). Recorded: eager vs replay of
the graph-safe decode step (bf16 and fp32), kernel launches and GPU busy time per step, memory, token-exactness
against "naive" for 200 new tokens on several prompts through one graph, and the stale-counter reference that
``lazy_initialization`` leaves behind on CUDA.
"""

from __future__ import annotations

import json
import sys
import time

import torch
from transformers import StaticCache

import kvlab
from kvlab.graph_safe import GraphSafeDecoder, eager_vs_replay
from kvlab.models import random_smollm2


def first_difference(a: torch.Tensor, b: torch.Tensor):
    bad = (a != b).any(dim=0).nonzero()
    return int(bad[0, 0]) if len(bad) else None


def main(path: str) -> None:
    if not torch.cuda.is_available():
        sys.exit("this script records GPU results: run it on a CUDA machine")
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 49152, (1, n), generator=gen).cuda() for n in (64, 16, 37)]
    record = {"model": "random weights in SmolLM2-135M's shape (kvlab.models.random_smollm2): real weights are not on the GPU machine"}
    for dtype in (torch.bfloat16, torch.float32):
        model = random_smollm2(device="cuda", dtype=dtype)
        name = str(dtype).replace("torch.", "")
        record[f"eager_vs_replay_{name}"] = eager_vs_replay(model, prompts[0], steps=64, rounds=7)
        print(name, {k: v for k, v in record[f"eager_vs_replay_{name}"].items() if k not in ("env",)}, flush=True)
    # fp32: several prompts through ONE captured graph, 200 new tokens each, against the naive loop
    decoder = GraphSafeDecoder(model, 512)
    runs = []
    for ids in prompts:
        t0 = time.perf_counter()
        want = kvlab.decode(model, ids, 200, strategy="naive")
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        got = decoder.generate(ids, 200)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        static = kvlab.decode(model, ids, 200, strategy="static")
        runs.append({"prompt_len": ids.shape[1], "new_tokens": 200, "equal_to_naive": bool(torch.equal(got, want)),
                     "first_difference_vs_naive": first_difference(got, want),
                     "equal_to_eager_static": bool(torch.equal(got, static)),
                     "naive_seconds": t1 - t0, "graph_safe_seconds": t2 - t1})
    record["token_exact_fp32"] = {"graph": decoder.step_graph.describe(), "replays": decoder.step_graph.replays, "runs": runs}
    print(record["token_exact_fp32"], flush=True)
    # why cache_position is looked up on each access: on CUDA, lazy_initialization rebinds the counter
    cache = StaticCache(config=model.config, max_cache_len=64)
    early = cache.layers[0].cumulative_length
    with torch.inference_mode():
        model(prompts[1][:, :10], cache=cache)
    live = cache.layers[0].cumulative_length
    record["stale_reference"] = {"same_tensor": early is live, "early_value": int(early), "early_device": str(early.device),
                                 "live_value": int(live), "live_device": str(live.device)}
    record["env"] = kvlab.environment("cuda")
    with open(path, "w") as f:
        json.dump(record, f, indent=1, default=str)
    print("wrote", path)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "data/lesson05_gpu.json")

"""Record lesson 05's GPU results into a JSON file (run on a CUDA machine; the notebook reads the
file).

    python tools/record_lesson05_gpu.py data/lesson05_gpu.json

The real SmolLM2 weights are not on the GPU machine, so the model is
``kvlab.lab.models.random_smollm2``: the same shapes (hence the same kernels and timings), random
weights (so meaningless text). Recorded, each section saved as soon as it is done: eager vs replay
of the graph-safe decode step (fp32 and bf16), kernel launches and GPU busy time per step, memory;
token-exactness against "naive" for 200 new tokens on several prompts through one graph; the stale
counter reference that ``lazy_initialization`` leaves behind on CUDA.
"""

from __future__ import annotations

import json
import sys
import time

import torch
from transformers import StaticCache

import kvlab
from kvlab.decoding import first_mismatch
from kvlab.graph_decoder import GraphSafeDecoder
from kvlab.lab.measure import eager_vs_replay
from kvlab.lab.models import random_smollm2


def main(path: str) -> None:
    if not torch.cuda.is_available():
        sys.exit("this script records GPU results: run it on a CUDA machine")
    record = {
        "model": "random weights in SmolLM2-135M's shape (kvlab.lab.models.random_smollm2): "
        "real weights are not on the GPU machine",
        "env": kvlab.environment("cuda"),
    }

    def save(section: str, value) -> None:
        record[section] = value
        with open(path, "w") as f:
            json.dump(record, f, indent=1, default=str)
        print(section, "->", json.dumps(value, default=str)[:600], flush=True)

    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 49152, (1, n), generator=gen).cuda() for n in (64, 16, 37)]
    model = random_smollm2(device="cuda", dtype=torch.float32)

    # why cache_position is looked up on each access: on CUDA, lazy_initialization rebinds the
    # counter
    cache = StaticCache(config=model.config, max_cache_len=64)
    early = cache.layers[0].cumulative_length
    with torch.inference_mode():
        model(prompts[1][:, :10], cache=cache)
    live = cache.layers[0].cumulative_length
    save(
        "stale_reference",
        {
            "same_tensor": early is live,
            "early_value": int(early),
            "early_device": str(early.device),
            "live_value": int(live),
            "live_device": str(live.device),
        },
    )

    save("eager_vs_replay_float32", eager_vs_replay(model, prompts[0], steps=32, rounds=5))

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
        runs.append(
            {
                "prompt_len": ids.shape[1],
                "new_tokens": 200,
                "equal_to_naive": bool(torch.equal(got, want)),
                "first_difference_vs_naive": first_mismatch(got, want),
                "naive_seconds": t1 - t0,
                "graph_safe_seconds": t2 - t1,
            }
        )
        save(
            "token_exact_fp32",
            {
                "graph": decoder.step_graph.describe(),
                "replays": decoder.step_graph.replays,
                "runs": runs,
            },
        )

    model.to(torch.bfloat16)
    save("eager_vs_replay_bfloat16", eager_vs_replay(model, prompts[0], steps=32, rounds=5))
    print("wrote", path)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "data/lesson05_gpu.json")

"""Record lesson 07's GPU results on the real SmolLM2-135M-Instruct (run on a CUDA machine; the
notebook reads it).

    python tools/record_lesson07_gpu.py data/lesson07_gpu.json

Acceptance is only meaningful on real text (random weights loop, and lookup then looks good), so
this script refuses to run without the real model. Recorded in float32 (the tokens are checked
against ``"naive"``), each section saved as soon as it is done, with the functions lesson 07 runs
live (``kvlab.lab.serving``): speculative decoding over the model's forward and over lesson 06's
kernels step, each against the one-token decoder of the same step, on the grounded and open-ended
prompts; a sweep of draft lengths on the copy prompt; and the paged cache serving requests of
mixed lengths as they arrive. The kernels pair is left out, with the reason recorded, only where
the kernels refuse the model; on a GPU without kvlab's Triton kernels (compute capability below
8.0) their PyTorch form runs, and the record says which form ran.
"""

from __future__ import annotations

import json
import sys
import time

import torch

import kvlab
from kvlab.lab import serving
from kvlab.lab.bench import git_state
from kvlab.lab.notebook import course_model

KERNELS = "graph-safe-speculative/kernels"  # speculation over lesson 06's kernels step


def speculation_pairs(model) -> tuple[dict[str, str], dict[str, str], str]:
    """``serving.PAIRS``, less the kernels pair (with the reason) where the kernels refuse the
    model; and the form the kernels run in on this GPU."""
    from kvlab.kernels.common import available
    from kvlab.kernels.step import check_supported

    form = ("Triton" if available(torch.empty(0, device="cuda"))
            else "PyTorch form (kvlab's Triton kernels need compute capability 8.0 and Triton)")
    try:
        check_supported(model)
    except ValueError as refused:
        pairs = {s: b for s, b in serving.PAIRS.items() if s != KERNELS}
        return pairs, {KERNELS: str(refused)}, form
    return dict(serving.PAIRS), {}, form


def main(path: str) -> None:
    if not torch.cuda.is_available():
        sys.exit("this script records GPU results: run it on a CUDA machine")
    course = course_model("cuda")
    if course.random:
        sys.exit("acceptance needs real text: bring the real model "
                 "(../shared/device/model-parts.sh) and unset KVLAB_RANDOM_WEIGHTS")
    record = {"command": " ".join(["python", *sys.argv]), "model": course.label,
              "env": kvlab.environment("cuda"), "git": git_state()}
    start = time.perf_counter()

    def save(section: str, value) -> None:
        record[section] = value
        with open(path, "w") as f:
            json.dump(record, f, indent=1, default=str)
        print(f"{section} ({time.perf_counter() - start:.0f} s) ->",
              json.dumps(value, default=str)[:400], flush=True)

    prompts = {name: course.encode(question) for name, question in serving.PROMPTS.items()}
    pairs, skipped, form = speculation_pairs(course.model)
    speculation = serving.speculation_runs(course.model, prompts, 128, pairs=pairs, rounds=5)
    save("speculation", speculation | {"kernels": form, "skipped": skipped})
    save("k_sweep", serving.k_sweep(course.model, prompts["copy the passage"], 128, rounds=5))
    requests = serving.arriving_requests(32, course.model.config.vocab_size, device="cuda")
    save("paged", serving.paged_runs(course.model, requests, max_batch=8))
    print("wrote", path)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "data/lesson07_gpu.json")

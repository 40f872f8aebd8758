"""Record lesson 07's GPU results on the real SmolLM2-135M-Instruct (run on a CUDA machine; the notebook reads it).

    python tools/record_lesson07_gpu.py data/lesson07_gpu.json

Acceptance is only meaningful on real text (random weights loop, and lookup then looks good), so this script refuses
to run without the real model. Recorded in float32 (the tokens are checked against ``"naive"``), each section saved as
soon as it is done, with the functions lesson 07 runs live (``kvlab.lab.serving``): speculative decoding against
the one-token decoders on the grounded and open-ended prompts, a sweep of draft lengths on the copy prompt, and the
paged cache serving requests of mixed lengths as they arrive.
"""

from __future__ import annotations

import json
import sys

import torch

import kvlab
from kvlab.lab import serving
from kvlab.lab.bench import git_state
from kvlab.lab.notebook import course_model


def main(path: str) -> None:
    if not torch.cuda.is_available():
        sys.exit("this script records GPU results: run it on a CUDA machine")
    course = course_model("cuda")
    if course.random:
        sys.exit("acceptance needs real text: bring the real model (../shared/device/model-parts.sh) and unset "
                 "KVLAB_RANDOM_WEIGHTS")
    record = {"command": " ".join(["python", *sys.argv]), "model": course.label, "env": kvlab.environment("cuda"),
              "git": git_state()}

    def save(section: str, value) -> None:
        record[section] = value
        with open(path, "w") as f:
            json.dump(record, f, indent=1, default=str)
        print(section, "->", json.dumps(value, default=str)[:400], flush=True)

    prompts = {name: course.encode(question) for name, question in serving.PROMPTS.items()}
    save("speculation", serving.speculation_runs(course.model, prompts, 128, rounds=5))
    save("k_sweep", serving.k_sweep(course.model, prompts["copy the passage"], 128, rounds=5))
    requests = serving.arriving_requests(32, course.model.config.vocab_size, device="cuda")
    save("paged", serving.paged_runs(course.model, requests, max_batch=8))
    print("wrote", path)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "data/lesson07_gpu.json")

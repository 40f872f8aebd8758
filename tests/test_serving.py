"""kvlab.lab.serving: lesson 07's measurements on a tiny model (every path token-exact, the records
complete)."""

import torch

from kvlab.lab import serving
from kvlab.lab.models import tiny_model


def looping_prompt(n: int = 24) -> torch.Tensor:
    return torch.tensor([[5, 6, 7, 8, 9] * (n // 5) + [5, 6]])


def test_speculation_runs_compare_each_speculative_step_with_its_base_exactly():
    """Both pairs (over the model's forward; over the kernels step, its PyTorch form on a CPU),
    every path token-exact, the drafts' counts what the decoder did; a record of one pair holds only
    it."""
    model = tiny_model("tiny-llama")
    prompts = {"loop": looping_prompt(),
               "random": torch.randint(3, 200, (1, 9), generator=torch.Generator().manual_seed(1))}
    record = serving.speculation_runs(model, prompts, 12, k=3, rounds=1, device="cpu")
    assert record["k"] == 3 and record["max_cache_len"] == looping_prompt().shape[1] + 12 + 2
    assert (record["pairs"] == serving.PAIRS
            and [r["prompt"] for r in record["runs"]] == list(prompts))
    paths = {*serving.PAIRS, *serving.PAIRS.values()}
    assert paths == {"graph-safe", "graph-safe-kernels", "graph-safe-speculative",
                     "graph-safe-speculative/kernels"}
    for run in record["runs"]:
        assert set(run["exact"]) == paths and all(run["exact"].values()), run["exact"]
        assert set(run["seconds"]) == paths and all(s > 0 for s in run["seconds"].values())
        for speculative, base in serving.PAIRS.items():
            assert run["speedup"][speculative] == run["seconds"][base] / run["seconds"][speculative]
            assert run["tokens_per_s"][speculative] == 12 / run["seconds"][speculative]
        assert 1 <= run["tokens_per_verify"] <= 4 and run["verify_steps"] >= 11 / 4
        assert run["accepted"] <= run["drafted"] and len(run["tokens"]) == 12
    loop = record["runs"][0]
    assert loop["accepted"] > 0 and loop["tokens_per_verify"] > 1  # the loop's drafts are kept
    one = serving.speculation_runs(model, {"loop": looping_prompt()}, 6, k=2, rounds=1,
                                   pairs={"graph-safe-speculative": "graph-safe"}, device="cpu")
    assert one["pairs"] == {"graph-safe-speculative": "graph-safe"}
    assert set(one["runs"][0]["seconds"]) == {"graph-safe", "graph-safe-speculative"}
    assert all(one["runs"][0]["exact"].values()) and set(one["runs"][0]["speedup"]) == {
        "graph-safe-speculative"}


def test_k_sweep_rows_are_exact_and_timed():
    model = tiny_model("tiny-llama")
    record = serving.k_sweep(model, looping_prompt(), 10, ks=(1, 3), rounds=1, device="cpu")
    assert [r["k"] for r in record["rows"]] == [1, 3] and all(r["exact"] for r in record["rows"])
    assert all(1 <= r["tokens_per_verify"] <= r["k"] + 1 and r["speedup"] > 0
               for r in record["rows"])


def test_paged_runs_serve_every_request_exactly_and_hold_less_than_a_static_cache():
    model = tiny_model("tiny-llama")
    # the tiny model is on the CPU, on a GPU machine too
    requests = serving.arriving_requests(5, model.config.vocab_size, prompt_lens=(3, 20),
                                         new_tokens=(2, 9), every=1, device="cpu")
    assert (len({r.prompt.shape[0] for r in requests}) > 1
            and [r.arrival for r in requests] == [0, 1, 2, 3, 4])
    record = serving.paged_runs(model, requests, max_batch=3, block_size=4, device="cpu")
    assert record["exact"] == [True] * 5
    assert set(record["seconds"]) == {"paged, graphs", "paged, eager", "one at a time (graph-safe)"}
    assert max(step["rows"] for step in record["timeline"]) <= 3 and record["buckets_captured"]
    assert all(step["paged_bytes"] <= record["static_bytes"] for step in record["timeline"])
    assert record["per_request"]["paged"] <= record["per_request"]["static"]


def test_arriving_requests_and_paged_runs_check_their_settings_at_the_door():
    import numpy as np
    import pytest

    for kwargs, says in [({"count": 0}, "count must be an int >= 1, got 0"),
                         ({"every": -1}, "every must be an int >= 0, got -1"),
                         ({"vocab_size": 2.5}, "vocab_size must be an int >= 1"),
                         ({"prompt_lens": (9, 3)},
                          r"prompt_lens must be an inclusive range \(low, high\)"),
                         ({"new_tokens": (0, 4)}, "new_tokens must be an inclusive range"),
                         ({"new_tokens": 4}, "new_tokens must be an inclusive range")]:
        with pytest.raises(ValueError, match=says):
            serving.arriving_requests(**{"count": 2, "vocab_size": 50, **kwargs})
    made = serving.arriving_requests(np.int64(2), np.int64(50), prompt_lens=(3, 4),
                                     new_tokens=(2, 3), every=1, device="cpu")  # the model's
    assert [r.arrival for r in made] == [0, 1]
    model = tiny_model("tiny-llama")
    with pytest.raises(TypeError, match="paged_runs takes a non-empty list of Requests"):
        serving.paged_runs(model, [], device="cpu")
    with pytest.raises(ValueError, match="block_size must be an int >= 1, got 0"):
        serving.paged_runs(model, made, block_size=0, device="cpu")

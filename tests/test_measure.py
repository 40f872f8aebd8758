"""kvlab.lab.measure: per-step timing, warm-up apart, memory, and the record every measurement
carries."""

import json
import statistics
import time
from collections import Counter

import pytest
import torch
from transformers import DynamicCache

import kvlab
from kvlab.lab import measure
from kvlab.lab.models import tiny_model
from kvlab.sizes import tensor_bytes


@pytest.fixture(scope="module")
def model():
    return tiny_model("tiny-qwen3")


def test_time_strategy_per_step(model):
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    run = measure.time_strategy(model, ids, 6, strategy="naive", repeats=2, per_step=True)
    assert (run.label, run.new_tokens, run.batch) == ("naive", 6, 2)
    assert torch.equal(run.tokens, kvlab.decode(model, ids, 6))
    assert len(run.step_seconds) == 6 and all(s > 0 for s in run.step_seconds)
    # the CPU's process peak only grows: it is no path's own peak, so none is recorded
    assert run.warmup_seconds > 0 and run.peak_memory_bytes is None
    # the one rule: (T(n) - T(1)) / (n - 1), T from the clocked runs
    assert run.seconds_per_step == pytest.approx((run.total_seconds - run.prefill_seconds) / 5)
    assert run.total_seconds >= run.prefill_seconds > 0
    assert run.tokens_per_s == pytest.approx(2 / run.seconds_per_step)  # the whole batch
    assert run.end_to_end_tokens_per_s == pytest.approx(12 / run.total_seconds)
    assert run.env["hardware"] == kvlab.hardware(ids.device)
    record = run.record()
    json.dumps(record)
    assert record["ms_per_token"] == pytest.approx(run.ms_per_token)


def test_time_decode_subtracts_the_prefill_and_keeps_the_warmup_apart():
    calls = []

    def run(n, on_token):
        calls.append((n, on_token))
        time.sleep(0.002 * n)  # a decode that takes longer for more tokens
        return torch.zeros(3, n, dtype=torch.long)

    timing = measure.time_decode(run, 5, "cpu", repeats=2, warmup_tokens=4, label="x")
    # no clock: no sync per token
    assert [n for n, _ in calls] == [4, 1, 1, 5, 1, 5] and all(t is None for _, t in calls)
    # warm-up (4), the one-token call's own untimed first use, then T(1) and T(5) in turns, twice
    # each
    assert timing.step_seconds is None and timing.batch == 3 and timing.new_tokens == 5
    assert timing.ms_per_token == pytest.approx(
        1e3 * (timing.total_seconds - timing.prefill_seconds) / 4)
    # each repeat is kept, in the order run, and the record shows them beside their medians
    assert len(timing.prefill_runs) == len(timing.total_runs) == 2
    assert timing.prefill_seconds == pytest.approx(statistics.median(timing.prefill_runs))
    assert timing.total_seconds == pytest.approx(statistics.median(timing.total_runs))
    # 2 ms vs 10 ms sleeps
    assert all(t1 < tn for t1, tn in zip(timing.prefill_runs, timing.total_runs, strict=True))
    record = timing.record()
    assert record["prefill_ms_runs"] == pytest.approx([1e3 * t for t in timing.prefill_runs])
    assert record["total_ms_runs"] == pytest.approx([1e3 * t for t in timing.total_runs])


def test_numpy_counts_are_counts():
    import numpy as np

    def run(n, on_token):  # a step of 20 ms: T(3) - T(1) stands above any clock
        time.sleep(0.02 * n)
        return torch.zeros(1, n, dtype=torch.long)

    timing = measure.time_decode(run, np.int64(3), "cpu", repeats=np.int64(1))
    assert timing.new_tokens == 3 and isinstance(timing.new_tokens, int)
    assert set(measure.time_interleaved({"a": lambda: None}, rounds=np.int32(2))) == {"a"}


def test_time_decode_refuses_what_it_cannot_time(model):
    with pytest.raises(ValueError, match="new_tokens must be an int >= 2"):
        measure.time_decode(lambda n, t: torch.zeros(1, n), 1, "cpu")
    with pytest.raises(ValueError, match="repeats must be an int >= 1, got 0"):
        measure.time_decode(lambda n, t: torch.zeros(1, n), 3, "cpu", repeats=0)
    for bad in (2.5, "3", True):
        with pytest.raises(ValueError, match="new_tokens must be an int >= 2"):
            measure.time_decode(lambda n, t: torch.zeros(1, n), bad, "cpu")
    with pytest.raises(ValueError, match="rounds must be an int >= 1, got 2.5"):
        measure.time_interleaved({"a": lambda: None}, rounds=2.5)
    with pytest.raises(ValueError, match="fns must be a non-empty dict"):
        measure.time_interleaved([lambda: None])
    # a run that never calls the clock has no per-step times
    with pytest.raises(ValueError, match="on_token"):
        measure.time_decode(lambda n, t: torch.zeros(1, n), 3, "cpu", per_step=True)
    with pytest.raises(ValueError, match="unknown strategy"):
        measure.time_strategy(model, torch.tensor([[1, 2, 3]]), 2, strategy="nope")


def test_step_clock():
    from kvlab.decoding import StepClock  # its home: the per-token clock of a decode

    clock = StepClock("cpu")
    for step in range(3):
        clock(step, torch.tensor([[1]]))
    assert len(clock.times) == 3 and all(t >= 0 for t in clock.times)


def test_profile_counts_cpu_ops():
    seen = measure.profile(lambda: torch.ones(4) + torch.ones(4), "cpu")
    names = [name for _, _, name in seen.kernels]
    assert "aten::add" in names and seen.busy_seconds >= 0 and seen.host_calls["aten::add"] >= 1
    with pytest.raises(ValueError, match="GPU kernel time"):
        measure.busy_seconds(lambda: None, "cpu")


def test_process_and_peak_memory():
    before = measure.process_peak_rss_bytes()
    big = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
    after = measure.process_peak_rss_bytes()
    assert before > 0 and after >= before
    measure.reset_peak_memory("cpu")  # a no-op on CPU, must not fail
    assert measure.peak_memory_bytes("cpu") >= after
    del big


def test_tensor_bytes_counts_each_storage_once():
    a = torch.zeros(10, 4)  # 160 bytes
    b = torch.zeros(3, dtype=torch.float16)  # 6 bytes
    assert tensor_bytes([a]) == 160
    assert tensor_bytes([a, a[2:5], a.view(40), b, None, "x"]) == 166


def test_cache_bytes_matches_the_kv_formula(model):
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(torch.tensor([[1, 2, 3, 4, 5]]), cache=cache)
    cfg = model.config
    # keys+values, fp32
    per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4
    assert measure.cache_bytes(cache) == 5 * per_token


def test_time_call():
    calls = []
    m = measure.time_call(lambda: calls.append(1), label="append", min_run_time=0.05, device="cpu")
    assert m.median > 0 and m.label == "append"
    assert len(calls) > 1  # the warm-up plus the timed runs


def test_a_step_time_that_comes_out_negative_is_refused():
    """T(n) <= T(1) (a busy machine): refused with what to do, never recorded as a negative or zero
    step time."""
    def run(n, on_token):
        time.sleep(0.02 if n == 1 else 0.0)  # the 1-token decode is the slow one
        return torch.zeros(1, n, dtype=torch.long)

    with pytest.raises(measure.TimingError, match="is not above T\\(1\\)"):
        measure.time_decode(run, 4, "cpu", repeats=1)


def test_time_decode_refuses_a_run_of_the_wrong_length_and_per_step_over_multi_step_graphs(model):
    def short(n, on_token):
        time.sleep(0.002 * n)
        return torch.zeros(1, 2, dtype=torch.long)  # asked for n tokens, made 2

    with pytest.raises(measure.TimingError, match="returned tokens of shape \\(1, 2\\)"):
        measure.time_decode(short, 8, "cpu", repeats=1)
    with pytest.raises(ValueError, match="steps per graph"):
        measure.time_strategy(model, torch.tensor([[1, 2, 3]]), 4, strategy="graph-safe-kernels",
                              per_step=True)
    with pytest.raises(ValueError, match="k must be an int >= 1"):
        measure.profile_steps(lambda n: None, 0, "cpu")
    from transformers import BatchEncoding

    ids = torch.tensor([[1, 2, 3]])
    run = measure.time_strategy(model, BatchEncoding({"input_ids": ids,
                                                      "attention_mask": torch.ones_like(ids)}), 3,
                                repeats=1)
    assert run.new_tokens == 3


def test_profile_steps_leaves_a_new_lengths_set_up_out_of_the_step():
    seen = set()

    def step_only(n):  # the same work per decode step, with no set-up
        x = torch.zeros(4)
        for _ in range(n - 1):
            x = x + 1
        return x

    # the first call at each length also does set-up first (as a capture or a compile would)
    def run(n):
        if n not in seen:
            seen.add(n)
            for _ in range(40):
                torch.ones(2).mul_(3)
        return step_only(n)

    run(1)  # as after time_decode: one-token calls already ran, the length 1 + k did not
    expected = measure.profile_steps(step_only, 2, "cpu")["kernels_per_step"]
    assert expected > 0 and measure.profile_steps(run, 2, "cpu")["kernels_per_step"] == expected


@pytest.mark.parametrize("cache_class", ["StaticCache", "GraphSafeStaticCache"])
def test_step_op_counts_equal_a_make_fx_trace(model, cache_class):
    """What step_op_counts' docstring and lesson 05 say: the counts of a make_fx trace of the step,
    op by op."""
    import transformers
    from torch.fx.experimental.proxy_tensor import make_fx

    from kvlab.graph_safe_cache import GraphSafeStaticCache

    cls = GraphSafeStaticCache if cache_class == "GraphSafeStaticCache" else getattr(
        transformers, cache_class)
    cache = cls(config=model.config, max_cache_len=16)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.inference_mode():
        model(ids, cache=cache)
    counted = measure.step_op_counts(model, cache, ids[:, -1:])
    # the trace runs the step for real: it advances the cache, which is then thrown away
    with torch.inference_mode():
        traced = make_fx(lambda t: model(input_ids=t, cache=cache).logits,
                         tracing_mode="real")(ids[:, -1:])
    names = [n.target.__name__.split(".")[0] for n in traced.graph.nodes
             if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)]
    assert counted and counted == Counter(name for name in names if name not in measure.VIEW_OPS)


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def test_allocated_by_counts_the_allocators_blocks_on_cuda_and_nothing_elsewhere(device):
    # 4 MiB of float32
    made, grew, asked = measure.allocated_by(lambda: torch.empty(1024, 1024, device=device),
                                             device)
    assert made.shape == (1024, 1024)
    assert grew == asked == (4 * 2**20 if device == "cuda" else None)
    if device == "cuda":  # 1 MiB + 8 bytes: rounded up to the 512-byte granule
        _, grew, asked = measure.allocated_by(lambda: torch.empty(2**20 + 8, dtype=torch.uint8,
                                                                  device=device), device)
        assert asked == 2**20 + 8 and grew >= 2**20 + 512


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="cuBLAS workspaces exist only on a CUDA GPU: run the suite "
                           "there (python3 tools/gpu_check.py --parts tests)")
def test_free_unreferenced_drops_the_cublas_workspace_a_capture_stream_left():
    """A matmul on a stream of its own (as every capture's warm-up runs) leaves a cuBLAS workspace
    allocated; the benchmark frees it between strategies, or the next strategy's peak would count
    it."""
    device = torch.device("cuda")
    measure.free_unreferenced(device)
    before = torch.cuda.memory_allocated(device)
    a = torch.randn(64, 64, device=device)
    side = torch.cuda.Stream(device)
    with torch.cuda.stream(side):
        a = a @ a
    torch.cuda.synchronize(device)
    a = None
    left = torch.cuda.memory_allocated(device) - before
    assert left > 0, "no workspace left behind: the mechanism this test guards against is gone"
    measure.free_unreferenced(device)
    assert torch.cuda.memory_allocated(device) == before, (
        left, torch.cuda.memory_allocated(device) - before)

"""kvlab.measure: per-step timing, warm-up apart, memory, and the record every measurement carries."""

import json
import statistics

import pytest
import torch
from transformers import DynamicCache

import kvlab
from kvlab import measure
from kvlab.models import tiny_model


@pytest.fixture(scope="module")
def model():
    return tiny_model("tiny-qwen3")


def test_measure_decode(model):
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    run = measure.measure_decode(model, ids, 6, strategy="naive", repeats=2)
    assert (run.strategy, run.prompt_len, run.new_tokens, run.batch) == ("naive", 4, 6, 2)
    assert torch.equal(run.tokens, kvlab.decode(model, ids, 6))
    assert len(run.step_seconds) == 6 and all(s > 0 for s in run.step_seconds)
    assert run.warmup_seconds > 0 and run.peak_memory_bytes > 0
    assert run.prefill_seconds == run.step_seconds[0]
    assert run.median_step_seconds == statistics.median(run.step_seconds[1:])
    assert run.tokens_per_s == pytest.approx(1 / run.median_step_seconds)
    assert run.env["hardware"] == kvlab.hardware(ids.device)
    record = run.summary()
    json.dumps(record)
    assert "tokens" not in record and record["hardware"] == run.env["hardware"]
    assert record["median_ms_per_token"] == pytest.approx(1e3 * run.median_step_seconds)


def test_measure_decode_forwards_kwargs_and_clamps_repeats(model):
    ids = torch.tensor([[1, 2, 3]])
    run = measure.measure_decode(model, ids, 1, repeats=0)  # one step: its median is the step itself
    assert len(run.step_seconds) == 1 and run.median_step_seconds == run.step_seconds[0]
    with pytest.raises(ValueError, match="unknown strategy"):
        measure.measure_decode(model, ids, 2, strategy="nope")


def test_step_clock():
    clock = measure.StepClock("cpu")
    for step in range(3):
        clock(step, torch.tensor([[1]]))
    assert len(clock.times) == 3 and all(t >= 0 for t in clock.times)
    clock.reset()
    assert clock.times == []


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
    assert measure.tensor_bytes([a]) == 160
    assert measure.tensor_bytes([a, a[2:5], a.view(40), b, None, "x"]) == 166


def test_cache_bytes_matches_the_kv_formula(model):
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(torch.tensor([[1, 2, 3, 4, 5]]), cache=cache)
    cfg = model.config
    per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4  # keys+values, fp32
    assert measure.cache_bytes(cache) == 5 * per_token


def test_time_call():
    calls = []
    m = measure.time_call(lambda: calls.append(1), label="append", min_run_time=0.05, device="cpu")
    assert m.median > 0 and m.label == "append"
    assert len(calls) > 1  # the warm-up plus the timed runs

"""kvlab.failures: each lesson-04 scenario really fails, the emulation fails exactly like eager code
(state failures) or unlike it (frozen failures), and on a GPU a real CUDA graph gives the
emulation's tokens.

Scenarios: padding-pollution, warmup-advance, cache-recreated, reset-out-of-range,
reset-rebinds-counter, frozen-position, host-counter-drift, layer0-only-rewind, and the control
(control-rewound), which must not fail.
"""

import pytest
import torch

from kvlab import failures as F
from kvlab.lab.models import tiny_model

CUDA = torch.cuda.is_available()
N = 24
NAMES = list(F.SCENARIOS)


@pytest.fixture(scope="module")
def setup(prompt):
    # tiny-qwen3: small, and sensitive enough to RoPE positions that every scenario shows within N
    # tokens
    model = tiny_model("tiny-qwen3")
    a, b = prompt(11), prompt(7, seed=1)
    slots = F.slots_for(11, N)
    return model, a, b, {"a": F.reference(model, a, N, slots=slots),
                         "b": F.reference(model, b, N, slots=slots)}


def run(setup, name, runner, **kw):
    model, a, b, refs = setup
    two = F.SCENARIOS.get(name, {}).get("needs_next", False)
    return F.run(name, model, a, N, next_ids=b if two else None, ref=refs["b" if two else "a"],
                 runner=runner, **kw)


def test_reference_is_the_naive_loop(setup):
    from kvlab.strategies import decode

    model, a, _, refs = setup
    assert torch.equal(refs["a"].tokens, decode(model, a, N, strategy="naive"))


@pytest.mark.parametrize("name", NAMES)
def test_each_scenario_really_fails_when_replayed(setup, name):
    result = run(setup, name, "graph")
    assert result.failed, (
        f"{name} did not fail: if a new transformers fixed it, lesson 04 must say so")
    assert result.runner.startswith("EMULATED")  # the tiny model lives on the CPU here
    assert result.heatmap(0).shape[1] == result.expected_heatmap(0).shape[1]


@pytest.mark.parametrize("name", NAMES)
def test_emulation_matches_the_eager_behaviour_it_stands_for(setup, name):
    graph, eager = run(setup, name, "emulated"), run(setup, name, "eager")
    if F.SCENARIOS[name]["frozen"]:
        # eager Python re-reads the new cache / counter / int: right; only the replayed graph is
        # wrong
        assert eager.first_wrong is None and graph.failed
    else:
        # the same calls made eagerly do the same damage: the emulation adds nothing and hides
        # nothing
        assert torch.equal(graph.tokens, eager.tokens) and graph.first_wrong == eager.first_wrong
        assert (graph.error is None) == (eager.error is None)


@pytest.mark.parametrize("runner", ["graph", "emulated", "eager"])
def test_control_is_token_exact(setup, runner):
    result = run(setup, F.CONTROL, runner)
    assert result.first_wrong is None and not result.failed and result.error is None


def test_padding_writes_and_counts_the_padding(setup):
    # id 0 is this model's padding_idx: zero keys
    result = run(setup, "padding-pollution", "graph", pad_id=32)
    bucket = result.extra["bucket"]
    assert result.recorder.counters[0] == [bucket] * len(result.recorder.counters[0])
    assert int((result.heatmap(0)[0] > 0).sum()) == bucket  # prompt and padding rows all written


def test_warmup_leaves_three_copies_ahead(setup):
    result = run(setup, "warmup-advance", "graph")
    assert result.recorder.counters[0][0] == 11  # after the prefill
    assert result.recorder.counters[1][0] == 11 + F.WARMUP + 1  # after the first replay: 3 ahead


def test_layer0_only_rewind_desynchronises_layers(setup):
    result = run(setup, "layer0-only-rewind", "graph")
    first = result.recorder.counters[0]
    assert first[0] == 11 and all(c == 11 + F.WARMUP for c in first[1:])


def test_reset_out_of_range_is_a_plain_error_on_cpu_without_the_guard(setup):
    model, a, b, refs = setup
    result = F.reset_out_of_range(model, a, N, next_ids=b, ref=refs["b"], guard=False)
    assert result.error and ("out of bounds" in result.error or "out of range" in result.error)
    layers = model.config.num_hidden_layers
    assert result.extra["counters_after_reset"] == [refs["b"].slots] * layers
    guarded = F.reset_out_of_range(model, a, N, next_ids=b, ref=refs["b"])
    assert "device-side assert" in guarded.error


def test_report_and_texts(setup):
    from kvlab.lab.models import ByteTokenizer

    result = run(setup, "warmup-advance", "graph")
    text = result.report(ByteTokenizer().decode)
    assert "first wrong token at step" in text and "expected:" in text
    got, want = result.texts(ByteTokenizer().decode)
    assert got != want


def test_bad_calls_are_refused(setup):
    model, a, b, refs = setup
    with pytest.raises(ValueError, match="unknown scenario"):
        F.run("nope", model, a, N)
    with pytest.raises(ValueError, match="second prompt"):
        F.run("cache-recreated", model, a, N)
    with pytest.raises(ValueError, match="another run"):
        F.warmup_advance(model, a, N, ref=refs["b"])
    with pytest.raises(ValueError, match="bucket"):
        F.padding_pollution(model, a, N, bucket=8)


def test_non_integer_ids_are_refused_at_the_door(setup):
    model, a, b, _ = setup
    with pytest.raises(ValueError, match=r"LongTensor .* input_ids\.long\(\)"):
        F.run("warmup-advance", model, a.float(), 4)
    with pytest.raises(ValueError, match="LongTensor"):
        F.run("cache-recreated", model, a, 4, next_ids=b.float())
    with pytest.raises(TypeError, match="Unpack it first"):
        F.run("warmup-advance", (model, None), a, 4)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU: run on Colab/GPU machine")
@pytest.mark.parametrize("name", NAMES + [F.CONTROL])
def test_real_cuda_graph_gives_the_emulations_tokens(name, prompt):
    model = tiny_model("tiny-qwen3").cuda()
    a, b = prompt(11, device="cuda"), prompt(7, seed=1, device="cuda")
    two = F.SCENARIOS.get(name, {}).get("needs_next", False)
    slots = F.slots_for(11, N)
    ref = F.reference(model, b if two else a, N, slots=slots)
    real = F.run(name, model, a, N, next_ids=b if two else None, ref=ref, runner="graph")
    emulated = F.run(name, model, a, N, next_ids=b if two else None, ref=ref, runner="emulated")
    assert real.runner.startswith("real CUDA graph") and emulated.runner.startswith("EMULATED")
    assert torch.equal(real.tokens, emulated.tokens), name
    assert (real.first_wrong == emulated.first_wrong
            and (real.error is None) == (emulated.error is None))


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU: run on Colab/GPU machine")
def test_a_run_stopped_before_any_token_compares_across_devices(prompt):
    model = tiny_model("tiny-qwen3").cuda()
    result = F.reset_out_of_range(model, prompt(11, device="cuda"), 4,
                                  next_ids=prompt(7, seed=1, device="cuda"))
    assert result.first_wrong == 0 and result.failed


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU: run on Colab/GPU machine")
def test_unguarded_out_of_range_is_refused_on_a_gpu(prompt):
    model = tiny_model("tiny-qwen3").cuda()
    with pytest.raises(ValueError, match="device-side assert"):
        F.reset_out_of_range(model, prompt(11, device="cuda"), 4,
                             next_ids=prompt(7, seed=1, device="cuda"), guard=False)


def test_host_counter_drift_sees_its_new_key_and_the_warmup_copies(setup):
    model, a, _, _ = setup
    drift, correct = F.watch_drift(model, a, steps=3)
    p = a.shape[1]
    for step, (d, c) in enumerate(zip(drift, correct, strict=True), start=1):
        assert d.rope == c.rope == [p + step - 1]  # RoPE: the host counter is right
        assert d.written == [p + F.WARMUP + step - 1] and c.written == [p + step - 1]
        # the mask follows layer 0's counter, not position_ids
        assert d.query_offset == p + F.WARMUP + step - 1
        assert d.written[0] in d.visible  # the new key IS visible
        # 3 more slots than correct
        assert d.extra_visible(c) == list(range(p + step, p + step + F.WARMUP))
    assert set(range(p, p + F.WARMUP)) <= set(drift[0].visible)  # the warm-up's copies are read


@pytest.mark.parametrize("name", NAMES)
def test_compiled_runner_fails_exactly_where_eager_code_fails(setup, name):
    torch.compiler.reset()
    compiled, eager = run(setup, name, "compiled"), run(setup, name, "eager")
    assert torch.equal(compiled.tokens, eager.tokens) and compiled.first_wrong == eager.first_wrong
    assert compiled.runner.startswith("COMPILED")

"""Round 14 (bench, measure, serving, paged cache, models): bad input refused at the door with a
message, and results that were silently lost or compared wrongly."""

import json
import os

import numpy as np
import pytest
import torch

import kvlab
from kvlab.handwritten import HandwrittenCache
from kvlab.lab import bench

KW = dict(prompt_len=4, new_tokens=16, check_tokens=0, repeats=3, profile_k=0, progress=False)


@pytest.fixture(scope="module")
def model():
    return kvlab.tiny_model("tiny-llama")


# ----------------------------------------------------------------------------------------- bench
def test_load_reads_the_record_write_wrote(tmp_path):
    """load("run.2") read run.json (with_suffix replaced ".2"), another run's record, and load("o/")
    looked for o.json while write wrote o/bench.json."""
    first = {"settings": {"model": "m"}, "results": [], "skipped": [],
             "env": {}, "command": "a"}
    second = first | {"command": "b"}
    bench.write(first, tmp_path / "run")
    bench.write(second, tmp_path / "run.2")
    assert bench.load(tmp_path / "run.2")["command"] == "b"
    assert bench.load(tmp_path / "run")["command"] == "a"
    bench.write(second, f"{tmp_path}/o/")
    assert bench.load(f"{tmp_path}/o/")["command"] == "b"


def test_out_suffix_in_capitals_is_the_record_suffix(tmp_path):
    """--out x.JSON wrote x.JSON.json: the suffix was replaced only in lower case."""
    json_path, csv_path = bench.out_paths(tmp_path / "x.JSON")
    assert (json_path.name, csv_path.name) == ("x.json", "x.csv")


@pytest.mark.parametrize("field,value", [("strategies", ["naive", "static", "naive"]),
                                         ("batches", [1, 2, np.int64(1)])])
def test_run_bench_refuses_a_name_given_twice(field, value):
    """run_bench timed a duplicate strategy or batch twice (x_naive of one row against the other),
    and merge kept one of the two: the command line refuses it, run_bench did not."""
    with pytest.raises(bench.BenchArgumentError, match="given twice: name each once"):
        bench.run_bench("tiny-llama", **({"strategies": ["naive"]} | {field: value}), **KW)


def test_run_bench_takes_one_batch_size_as_an_int():
    """batches=2 raised "'int' object is not iterable" from list()."""
    record = bench.run_bench("tiny-llama", strategies=["naive"], batches=2, **KW)
    assert record["settings"]["batches"] == [2] and record["results"][0]["batch"] == 2


@pytest.mark.parametrize("setting", [dict(quick="false"), dict(check_compiled="no"),
                                     dict(progress=np.True_)])
def test_run_bench_refuses_a_switch_that_is_not_a_bool(setting):
    """quick="false" ran in quick mode and check_compiled="no" still checked: a non-empty string is
    truthy."""
    with pytest.raises(bench.BenchArgumentError, match="must be True or False"):
        bench.run_bench("tiny-llama", strategies=["naive"], **(KW | setting))


@pytest.mark.parametrize("setting,match", [
    (dict(time_budget="ten"), "not a number of seconds"),
    (dict(time_budget=-1.0), "finite number of seconds"),
    (dict(dtype=torch.int64), "not a floating-point dtype"),
    (dict(device="meta"), "hold no values"),
    (dict(seed=-1), "seed"),
    (dict(seed=1.5), "seed"),
])
def test_run_bench_refuses_bad_settings_before_any_timing(setting, match, monkeypatch):
    """time_budget="10" failed after the first strategy was timed, dtype=torch.int64 deep in
    nn.Module.to, device="meta" skipped every row with ".item() on meta tensors"."""
    monkeypatch.setattr(bench, "build_model", lambda *a, **k: pytest.fail("built a model"))
    with pytest.raises(bench.BenchArgumentError, match=match):
        bench.run_bench("tiny-llama", strategies=["naive"], **(KW | setting))


def test_run_bench_reads_numpy_seed_and_text_budget():
    """seed=np.int64(3) failed in torch.manual_seed ("an integer is required") and
    time_budget="10" with a TypeError after the first strategy."""
    record = bench.run_bench("tiny-llama", strategies=["naive", "static"], seed=np.int64(3),
                             time_budget="10", **KW)
    assert record["settings"]["seed"] == 3 and type(record["settings"]["seed"]) is int
    assert record["settings"]["time_budget"] == 10.0
    assert json.dumps(record["settings"])


@pytest.mark.parametrize("name", ["TINY-llama", "Tiny-Llama", "SmolLM2-135M-random"])
def test_a_model_name_in_the_wrong_case_is_refused_before_any_network(name, monkeypatch):
    """--model TINY-llama went to the hub as an id: names are case-sensitive."""
    monkeypatch.setattr(bench, "build_model", lambda *a, **k: pytest.fail("built a model"))
    with pytest.raises(bench.BenchArgumentError, match="case-sensitive: did you mean"):
        bench.run_bench(name, strategies=["naive"], **KW)
    with pytest.raises(SystemExit):
        bench.parse_args(["--model", name])


def test_merge_of_nothing_says_what_it_takes():
    """merge() raised IndexError."""
    with pytest.raises(ValueError, match="merge takes the records"):
        bench.merge()


def test_merge_drops_a_skip_that_a_later_part_timed():
    """merge kept "skipped" entries of (strategy, batch) pairs that a later part has a result
    for: the merged record said both."""
    def part(results, skipped, command):
        return {"env": {"hardware": "X"}, "command": command, "git": {}, "seconds": 1.0,
                "traces": {}, "complete": not skipped, "skipped": skipped,
                "settings": {"model": "m", "batches": [1], "strategies": ["naive", "static"]},
                "results": results}
    first = part([{"strategy": "naive", "batch": 1, "tokens_per_s": 1.0}],
                 [{"strategy": "static", "batch": 1, "reason": "time budget spent"}], "a")
    second = part([{"strategy": "static", "batch": 1, "tokens_per_s": 2.0}], [], "b")
    merged = bench.merge(first, second)
    assert merged["complete"] and merged["skipped"] == []


def test_default_record_names_never_collide(tmp_path):
    """Two runs started in the same second without --out wrote the same out/bench-<time>.json: one
    run's results were lost."""
    stem = tmp_path / "out" / "bench-20260101-000000"
    names = [bench.new_stem(stem) for _ in range(3)]
    assert len(set(names)) == 3
    assert all(bench.out_paths(n)[0].exists() for n in names)


def test_main_default_out_does_not_overwrite_a_run_of_the_same_second(tmp_path, monkeypatch):
    """main's default --out was out/bench-<time>: a second run in the same second replaced the
    first's record."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(bench.time, "strftime", lambda *a: "20260101-000000")
    args = ["--model", "tiny-llama", "--strategies", "naive", "--prompt-len", "4",
            "--new-tokens", "16", "--check-tokens", "0", "--repeats", "3", "--profile-steps", "0",
            "--device", "cpu"]
    bench.main(args + ["--seed", "1"])
    bench.main(args + ["--seed", "2"])
    seeds = sorted(json.loads(p.read_text())["settings"]["seed"]
                   for p in (tmp_path / "out").glob("*.json"))
    assert seeds == [1, 2]


def test_main_leaves_no_empty_record_behind_a_refused_setting(tmp_path, monkeypatch):
    """The reserved default record is removed when run_bench refuses the settings."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(bench, "run_bench", lambda *a, **k: (_ for _ in ()).throw(
        bench.BenchArgumentError("refused")))
    with pytest.raises(SystemExit):
        bench.main(["--model", "tiny-llama"])
    assert not list((tmp_path / "out").glob("*.json"))
    assert os.path.isdir(tmp_path / "out")


# --------------------------------------------------------------------------------------- serving
def test_speculation_runs_refuses_more_check_tokens_than_it_makes(model):
    """check_tokens=10 with new_tokens=6 compared 6-token outputs with a 10-token reference: every
    path was marked inexact."""
    from kvlab.lab import serving

    ids = torch.randint(1, 256, (1, 8))
    with pytest.raises(ValueError, match=r"check_tokens \(10\) is above new_tokens \(6\)"):
        serving.speculation_runs(model, {"p": ids}, 6, rounds=1, check_tokens=10,
                                 pairs={"graph-safe-speculative": "graph-safe"})


@pytest.mark.parametrize("call,match", [
    (lambda S, m, ids: S.k_sweep(m, ids, 6, ks=(), rounds=1), "ks must be draft lengths"),
    (lambda S, m, ids: S.k_sweep(m, ids, 6, ks=(2, 2), rounds=1), "each given once"),
    (lambda S, m, ids: S.speculation_runs(m, {}, 6, rounds=1), "non-empty dict"),
    (lambda S, m, ids: S.speculation_runs(m, {"p": ids}, 6, pairs={}), "pairs must be"),
])
def test_serving_refuses_empty_sweeps(model, call, match):
    """k_sweep(ks=()) and speculation_runs(m, {}) raised "max() arg is an empty sequence"."""
    from kvlab.lab import serving

    with pytest.raises(ValueError, match=match):
        call(serving, model, torch.randint(1, 256, (1, 8)))


# --------------------------------------------------------------------------------------- measure
@pytest.mark.parametrize("make_cache", [
    lambda m: __import__("transformers").StaticCache(config=m.config, max_cache_len=16),
    lambda m: __import__("transformers").DynamicCache(config=m.config),
    lambda m: HandwrittenCache(),
])
def test_time_strategy_empties_a_cache_it_is_handed_before_every_run(model, make_cache):
    """time_strategy(..., cache=StaticCache(...)) failed after its own warm-up ("this cache
    already holds 11 tokens"): every timed run continued the last one's cache."""
    from kvlab.lab import measure

    name = "handwritten" if isinstance(make_cache(model), HandwrittenCache) else None
    cache = make_cache(model)
    strategy = name or ("static" if "Static" in type(cache).__name__ else "dynamic")
    ids = torch.randint(1, 256, (1, 8))
    timing = measure.time_strategy(model, ids, 4, strategy=strategy, repeats=1, cache=cache)
    assert torch.equal(timing.tokens, kvlab.decode(model, ids, 4, strategy="naive"))


def test_time_strategy_takes_a_strategy_object(model):
    """time_strategy(strategy=kvlab.STRATEGIES["naive"]) raised "unhashable type:
    mappingproxy" (the Strategy was a dict key), though kvlab.decode takes it."""
    from kvlab.lab import measure

    timing = measure.time_strategy(model, torch.randint(1, 256, (1, 8)), 4,
                                   strategy=kvlab.STRATEGIES["naive"], repeats=1)
    assert timing.label == "naive"


def test_profile_steps_of_a_run_that_does_nothing_says_so():
    """profile_steps(lambda n: None, 2, "cpu") raised IndexError."""
    from kvlab.lab import measure

    with pytest.raises(ValueError, match="ran no operation"):
        measure.profile_steps(lambda n: None, 2, "cpu")


@pytest.mark.parametrize("per_step", [False, True])
def test_time_decode_of_a_run_returning_a_list_says_so(per_step):
    """time_decode(lambda n, t: [[0] * n], 4, "cpu") raised "'list' object has no attribute
    'dim'"."""
    from kvlab.lab import measure

    with pytest.raises(measure.TimingError, match="returned a list, not a tensor"):
        measure.time_decode(lambda n, t: [[0] * n], 4, "cpu", repeats=1, per_step=per_step)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_time_interleaved_on_cuda_without_a_gpu_says_so():
    """time_interleaved(..., device="cuda") on a CPU-only machine raised "AssertionError: Torch not
    compiled with CUDA" from the synchronize."""
    from kvlab.lab import measure

    with pytest.raises(RuntimeError, match="sees no CUDA GPU"):
        measure.time_interleaved({"a": lambda: None}, device="cuda")


@pytest.mark.parametrize("make_cache", [
    lambda m: __import__("transformers").StaticCache(config=m.config, max_cache_len=16),
    lambda m: __import__("transformers").DynamicCache(config=m.config),
    lambda m: HandwrittenCache(),
])
def test_step_op_counts_of_any_cache_leaves_it_as_it_was(model, make_cache):
    """step_op_counts on a fresh StaticCache raised "'NoneType' object has no attribute 'clone'",
    on a DynamicCache "no attribute 'cumulative_length'"."""
    from kvlab.lab import measure

    cache = make_cache(model)
    token = torch.ones(1, 1, dtype=torch.long)
    ops = measure.step_op_counts(model, cache, token)
    assert ops and sum(ops.values()) > 0
    assert cache.get_seq_length() == 0
    # filled: the step leaves the tokens it found, and the same ops again
    with torch.inference_mode():
        model(input_ids=torch.ones(1, 3, dtype=torch.long), cache=cache)
    assert measure.step_op_counts(model, cache, token) and cache.get_seq_length() == 3


def test_eager_vs_replay_refuses_a_list_of_ids(model):
    """eager_vs_replay(m, [[1, 2, 3]]) raised "'list' object has no attribute 'device'"."""
    from kvlab.lab import measure

    with pytest.raises((TypeError, ValueError), match="tensor"):
        measure.eager_vs_replay(model, [[1, 2, 3]])


# ----------------------------------------------------------------------------------- paged cache
@pytest.mark.parametrize("args,match", [(([3, 5], -1, 1, 4), "start"),
                                        (([3], 0, 6, 4), "past the 1 block"),
                                        (([3], 2, 1, 4), "below start")])
def test_slots_of_refuses_positions_the_blocks_do_not_hold(args, match):
    """slots_of([3, 5], -1, 1, 4) returned [23, 12] (a negative position indexed the blocks from
    the end), and slots_of([3], 0, 6, 4) raised IndexError."""
    from kvlab import paged_cache

    with pytest.raises(ValueError, match=match):
        paged_cache.slots_of(*args)


def test_blocks_for_refuses_a_block_size_of_zero():
    """blocks_for(5, 0) raised ZeroDivisionError."""
    from kvlab import paged_cache

    with pytest.raises(ValueError, match="block_size"):
        paged_cache.blocks_for(5, 0)


def test_paged_cache_takes_dtype_names(model):
    """bytes_per_token(cfg, "bfloat16") and PagedKVCache(..., dtype="bfloat16") raised TypeError;
    the rest of kvlab reads dtype names."""
    from kvlab import paged_cache

    assert (paged_cache.bytes_per_token(model.config, "bfloat16")
            == paged_cache.bytes_per_token(model.config, torch.bfloat16))
    cache = paged_cache.PagedKVCache(model.config, num_blocks=2, block_size=4,
                                     max_blocks_per_request=2, dtype="bf16")
    assert cache.layers[0].keys.dtype == torch.bfloat16


# ---------------------------------------------------------------------------------------- models
def test_byte_tokenizer_takes_a_list_of_strings():
    """ByteTokenizer()(["ab", "cd"]) raised "'list' object has no attribute 'encode'"."""
    from kvlab.lab.models import ByteTokenizer

    tok = ByteTokenizer()
    out = tok(["ab", "cd"])
    assert out["input_ids"].tolist() == [list(b"ab"), list(b"cd")]
    padded = tok(["a", "bcd"], padding=True)
    assert padded["attention_mask"].tolist() == [[0, 0, 1], [1, 1, 1]]
    assert tok.batch_decode(padded["input_ids"][:, -1:]) == ["a", "d"]
    with pytest.raises(ValueError, match="padding=True"):
        tok(["a", "bcd"])


def test_byte_tokenizer_decodes_what_kvlab_decode_returns(model):
    """ByteTokenizer().decode(kvlab.decode(m, ids, 3)), a [1, n] tensor, raised "only one element
    tensors can be converted"; there was no batch_decode."""
    from kvlab.lab.models import ByteTokenizer

    tok = ByteTokenizer()
    tokens = kvlab.decode(model, tok("hello")["input_ids"], 3)
    text = bytes(tokens[0].tolist()).decode("utf-8", errors="replace")
    assert tok.decode(tokens) == text == tok.batch_decode(tokens)[0]
    with pytest.raises(ValueError, match="batch_decode"):
        tok.decode(torch.zeros(2, 3, dtype=torch.long))


@pytest.mark.parametrize("kw,match", [(dict(seed=1.5), "seed must be an int"),
                                      (dict(dtype=torch.int32), "cannot hold")])
def test_random_smollm2_refuses_what_tiny_model_refuses(kw, match):
    """random_smollm2(seed=1.5) was silently accepted and dtype=torch.int32 failed in torch."""
    from kvlab.lab.models import random_smollm2

    with pytest.raises(ValueError, match=match):
        random_smollm2(layers=1, device="cpu", **kw)

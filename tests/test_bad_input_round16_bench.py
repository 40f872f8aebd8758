"""Probe round 15 (hostile user), bench, measure and lesson 07's sweeps: a str or float where a
count goes, a list where a tensor or the records go, None where an object goes, and names that
are not what the entry takes, came back as raw TypeErrors, KeyErrors and AttributeErrors."""

import pytest
import torch

import kvlab
from kvlab.lab import bench, measure, serving
from kvlab.strategies import BENCHMARKED, STRATEGIES, check_flags

KW = dict(prompt_len=4, new_tokens=16, check_tokens=0, repeats=3, profile_k=0, progress=False,
          device="cpu", dtype="float32")
PAIR = {"graph-safe-speculative": "graph-safe"}


@pytest.fixture(scope="module")
def model():
    return kvlab.tiny_model("tiny-llama")


@pytest.fixture(scope="module")
def ids():
    return torch.randint(1, 256, (1, 8), generator=torch.Generator().manual_seed(0))


# --------------------------------------------------------------------------------------- serving
@pytest.mark.parametrize("k", ["4", 2.0])
def test_speculation_runs_refuses_a_draft_length_that_is_not_an_int(model, ids, k):
    """k="4" raised "unsupported operand type(s) for +: 'int' and 'str'" and k=2.0 a message
    about max_cache_len, a setting the caller never gave."""
    with pytest.raises(ValueError, match=r"^k must be an int >= 1"):
        serving.speculation_runs(model, {"p": ids}, 6, rounds=1, k=k, pairs=PAIR)


@pytest.mark.parametrize("pairs,match", [
    ({"nope": "graph-safe"}, "pairs key 'nope' is not a speculative strategy"),
    ({"graph-safe": "naive"}, "pairs key 'graph-safe' is not a speculative strategy"),
    ({"graph-safe-speculative": "naive"}, "base of 'graph-safe-speculative' 'naive' is not a "),
    ({"graph-safe-speculative": "graph-safe-speculative/kernels"}, "is not a one-token base"),
])
def test_speculation_runs_refuses_pairs_it_cannot_run_with_the_names_it_takes(model, ids, pairs,
                                                                             match):
    """An unknown name raised KeyError 'nope', and a base strategy named as the speculative one a
    TypeError about naive's state taking no max_cache_len=."""
    with pytest.raises(ValueError, match=match) as refused:
        serving.speculation_runs(model, {"p": ids}, 6, rounds=1, pairs=pairs)
    names = serving.SPECULATIVE_NAMES if "key" in match else serving.BASE_NAMES
    assert f"choose one of {', '.join(names)}" in str(refused.value)


def test_speculation_runs_takes_a_strategy_entry_as_a_base(model, ids):
    """The pairs accept a kvlab.STRATEGIES entry where they accept its name, as kvlab.decode."""
    run = serving.speculation_runs(model, {"p": ids}, 6, rounds=1, k=2,
                                   pairs={"graph-safe-speculative": STRATEGIES["graph-safe"]})
    assert run["pairs"] == PAIR and all(run["runs"][0]["exact"].values())


@pytest.mark.parametrize("call,match", [
    (lambda m, ids: serving.k_sweep(m, ids, "6", ks=(2,), rounds=1),
     r"^new_tokens must be an int >= 1, got '6'"),
    (lambda m, ids: serving.k_sweep(m, ids.tolist(), 6, ks=(2,), rounds=1),
     r"got a Python list of lists\. Make a tensor: torch\.tensor\(ids\)"),
    (lambda m, ids: serving.k_sweep(m, ids.repeat(2, 1), 6, ks=(2,), rounds=1),
     r"ids must be one prompt's ids \[1, prompt_len\], got batch 2"),
    (lambda m, ids: serving.speculation_runs(m, {"p": ids.repeat(2, 1)}, 6, rounds=1),
     r"prompts\['p'\] must be one prompt's ids \[1, prompt_len\], got batch 2"),
])
def test_k_sweep_checks_its_prompt_and_count_as_kvlab_decode(model, ids, call, match):
    """k_sweep(new_tokens="6") raised "unsupported operand type(s) for +", a list of ids
    "'list' object has no attribute 'shape'", and a batch of 2 a GraphSafeError from deep inside;
    kvlab.decode refuses a list with what to do, so k_sweep does the same."""
    with pytest.raises(ValueError, match=match):
        call(model, ids)


# --------------------------------------------------------------------------------------- measure
def test_cache_bytes_of_what_is_not_a_cache_says_what_to_pass(model):
    """cache_bytes(None) raised "'NoneType' object has no attribute 'layers'"."""
    from kvlab.graph_decoder import GraphSafeDecoder

    with pytest.raises(ValueError, match=r"cache must be a KV cache with \.layers .* got None$"):
        measure.cache_bytes(None)
    decoder = GraphSafeDecoder(model, 16)
    with pytest.raises(ValueError, match=r"got GraphSafeDecoder; pass its \.cache"):
        measure.cache_bytes(decoder)
    assert measure.cache_bytes(decoder.cache) == sum(
        t.numel() * t.element_size() for layer in decoder.cache.layers
        for t in (layer.keys, layer.values) if t is not None)


# ----------------------------------------------------------------------------------------- bench
@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """Two parts of one sweep, written to a and b."""
    folder = tmp_path_factory.mktemp("parts")
    made = [bench.run_bench("tiny-llama", strategies=["naive"], out=folder / name, **KW)
            for name in ("a", "b")]
    return folder, made


def test_merge_takes_paths_and_a_list_of_records(records):
    """merge(path, path) raised "string indices must be integers" and merge([a, b]) "list
    indices must be integers or slices", though merge's parts are what load and run_bench give."""
    folder, (a, b) = records
    want = bench.merge(a, b)
    for got in (bench.merge(folder / "a", str(folder / "b")), bench.merge([a, b]),
                bench.merge((folder / "a.json", b))):
        assert got["results"] == want["results"] and got["parts"] == want["parts"]


@pytest.mark.parametrize("part,match", [
    (3, r"merge part 1 is int 3, not a benchmark record"),
    ({"results": []}, r"merge part 1 is a dict without env, settings"),
    ("no/such/run", r"merge part 1: no record could be read from 'no/such/run'"),
])
def test_merge_refuses_what_is_not_a_record(records, part, match):
    """merge(a, 3) raised "'int' object is not subscriptable" and a dict without env KeyError."""
    with pytest.raises(ValueError, match=match):
        bench.merge(records[1][0], part)


def test_merge_keeps_one_skip_of_a_strategy_skipped_in_two_parts(records):
    """A strategy skipped in both parts (no part timed it) was listed twice in the merged
    record's skipped."""
    a, b = records[1]
    skip = {"strategy": "graph-safe-compiled", "batch": 1, "reason": "needs CUDA"}
    merged = bench.merge(a | {"skipped": [skip]}, b | {"skipped": [skip]})
    assert merged["skipped"] == [skip | {"part": 1}]


def test_run_bench_takes_strategy_entries(records):
    """strategies=[kvlab.STRATEGIES["naive"]] was refused as an unknown strategy, though
    kvlab.decode and time_strategy take the entry for its name."""
    for given in ([STRATEGIES["naive"]], STRATEGIES["naive"]):
        record = bench.run_bench("tiny-llama", strategies=given, **KW)
        assert record["settings"]["strategies"] == ["naive"]
        assert [r["strategy"] for r in record["results"]] == ["naive"]


@pytest.mark.parametrize("given", ["all", ["all"]])
def test_run_bench_reads_all_as_the_command_line_does(given):
    """strategies=["all"] was refused as an unknown strategy 'all' (and "all" alone too), though
    --strategies all runs every strategy the benchmark times."""
    record = bench.run_bench("tiny-llama", strategies=given, time_budget=0, **KW)
    assert record["settings"]["strategies"] == BENCHMARKED
    assert record["results"][0]["strategy"] == BENCHMARKED[0]


def test_check_flags_refuses_with_the_callers_error():
    """The benchmark copied check_flags' rule (a switch is True or False) in lines of its own to
    raise BenchArgumentError; check_flags now takes the switches and the error to raise."""
    with pytest.raises(bench.BenchArgumentError, match="quick must be True or False, got 'no'"):
        check_flags({"quick": "no"}, ("quick",), bench.BenchArgumentError)
    with pytest.raises(bench.BenchArgumentError, match="progress must be True or False"):
        bench.run_bench("tiny-llama", strategies=["naive"], **(KW | {"progress": 0}))

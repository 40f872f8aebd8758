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
    (3, r"merge part 1 is int 3, not a record of kvlab\.lab\.bench\.run_bench: .*or the path"),
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


# ------------------------------------------------- the same families elsewhere in kvlab.lab
def test_time_strategy_checks_its_ids_and_count_as_kvlab_decode(model, ids):
    """A list of ids raised "'list' object has no attribute 'device'" (kvlab.decode says "Make a
    tensor"), and new_tokens="4" was named max_new_tokens for a graph strategy only."""
    with pytest.raises(ValueError, match=r"got a Python list of lists\. Make a tensor"):
        measure.time_strategy(model, ids.tolist(), 4, repeats=1)
    for strategy in ("naive", "graph-safe"):
        with pytest.raises(ValueError, match=r"^new_tokens must be an int >= 2"):
            measure.time_strategy(model, ids, "4", strategy=strategy, repeats=1)


@pytest.mark.parametrize("per_step", ["no", 1])
def test_timing_refuses_a_per_step_switch_that_is_not_a_bool(model, ids, per_step):
    """per_step="no" is truthy: it timed per step (or refused a graph strategy for per-step
    timing the caller had turned off)."""
    with pytest.raises(ValueError, match="per_step must be True or False"):
        measure.time_strategy(model, ids, 4, strategy="graph-safe", per_step=per_step)
    with pytest.raises(ValueError, match="per_step must be True or False"):
        measure.time_decode(lambda n, on_token: kvlab.decode(model, ids, n), 4, "cpu",
                            per_step=per_step)


def test_time_decodes_refuses_what_is_not_a_dict_of_runs(model, ids):
    """time_decodes([run]) raised "'list' object has no attribute 'items'", and a None run
    "'NoneType' object is not callable" after the other runs' warm-ups."""
    def run(n, on_token):
        return kvlab.decode(model, ids, n)

    with pytest.raises(ValueError, match=r"runs must be a non-empty dict of label -> run"):
        measure.time_decodes([run], 4, "cpu")
    with pytest.raises(TypeError, match=r"runs\['b'\] must be a function"):
        measure.time_decodes({"a": run, "b": None}, 4, "cpu")


@pytest.mark.parametrize("call", [
    lambda: measure.time_call(None), lambda: measure.allocated_by(None, "cpu"),
    lambda: measure.profile(None, "cpu"),
])
def test_timers_refuse_none_for_the_function(call):
    """time_call(None) and the other timers raised "'NoneType' object is not callable" (after a
    device sync or a profiler start). wall and profile_steps, shown in lesson 06, stay plain: their
    None fails as Python says, at the call."""
    with pytest.raises(TypeError, match=r"must be a function, called as .*pass the function"):
        call()


@pytest.mark.parametrize("call", [
    lambda: measure.memory_held(None), lambda: measure.free_unreferenced(None),
    lambda: measure.peak_memory_bytes(None), lambda: measure.reset_peak_memory(None),
    lambda: measure.wall(lambda: None, None),
])
def test_memory_helpers_read_device_none_as_the_default_device(call):
    """memory_held(None) raised "device() received an invalid combination of arguments"; every
    device= of kvlab reads None as the default device (pick_device)."""
    call()


@pytest.mark.parametrize("call", [
    lambda: measure.memory_held("gpu"), lambda: measure.copy_bandwidth_gbps(3.0),
])
def test_memory_helpers_refuse_what_is_not_a_device(call):
    """memory_held("gpu") raised torch's "Expected one of cpu, cuda, ... device type" list."""
    with pytest.raises(ValueError, match="device must be 'cpu', 'cuda' or 'cuda:N'"):
        call()


@pytest.mark.parametrize("call,match", [
    (lambda: bench.format_table(None), r"^record is None \(kvlab\.lab\.bench\.recorded gives"),
    (lambda: bench.write(None, "unused"), r"^record is None"),
    (lambda: bench.load(None), r"^a record's path must be a str or pathlib\.Path"),
    (lambda: bench.out_paths(3), r"^a record's path must be a str"),
    (lambda: bench.run_bench("tiny-llama", out=3), r"^--out a record's path must be a str"),
])
def test_bench_refuses_none_for_a_record_or_its_path(call, match):
    """format_table(None) and write(None, out) raised "'NoneType' object is not subscriptable",
    load(None) "expected str, bytes or os.PathLike object", run_bench(out=3) the same."""
    with pytest.raises(ValueError, match=match):
        call()


def test_bench_takes_a_records_path_where_it_takes_the_record(records):
    """format_table(path) raised "string indices must be integers"; a record's path stands for
    it, as in merge."""
    folder, (a, _) = records
    assert bench.format_table(folder / "a") == bench.format_table(a)


@pytest.mark.parametrize("call,match", [
    (lambda P, rec: P.rows(rec, "1"), r"^batch must be a positive int, got '1'"),
    (lambda P, rec: P.plot_floor(rec, batch=1.0), r"^batch must be a positive int, got 1\.0"),
    (lambda P, rec: P.plot_strategies(rec, batch=2), r"no result at batch 2 to plot; its "
                                                     r"results are at batch 1$"),
    (lambda P, rec: P.plot_memory(None), r"^record is None"),
    (lambda P, rec: P.plot_strategies(), r"takes one or more benchmark records"),
])
def test_plots_of_a_record_refuse_a_batch_or_record_they_cannot_draw(records, call, match):
    """rows(record, "1") silently gave no rows (and plot_strategies "max() arg is an empty
    sequence"), a batch the record never timed the same, and plot_memory(None) (bench.recorded's
    answer for a missing file) "'NoneType' object is not subscriptable"."""
    from kvlab.lab import plots

    with pytest.raises(ValueError, match=match):
        call(plots, records[1][0])


@pytest.mark.parametrize("call,match", [
    (lambda P: P.plot_speculation(None), r"^record 0 is None \(kvlab\.lab\.bench\.recorded"),
    (lambda P: P.plot_k_sweep({"env": {}}), r"^record 0 is a dict without rows, not a record of "
                                            r"kvlab\.lab\.serving\.k_sweep"),
    (lambda P: P.plot_paged([]), r"^record 0 is list \[\], not a record of .*paged_runs"),
    (lambda P: P.plot_k_sweep(), r"^give one or more kvlab\.lab\.serving\.k_sweep records"),
    (lambda P: P.plot_tile_sweep(None), r"^record is None .* not a record of tools/time_kernels"),
])
def test_plots_of_lesson_07_and_tile_records_refuse_what_is_not_one(call, match):
    """plot_speculation(None) (bench.recorded's answer for a missing file), plot_k_sweep of
    another dict, plot_paged([]) and plot_tile_sweep(None) raised "'NoneType' object is not
    subscriptable", KeyError or TypeError; plot_k_sweep() an IndexError."""
    from kvlab.lab import plots

    with pytest.raises(ValueError, match=match):
        call(plots)


def test_cast_reads_a_dtype_name_and_refuses_what_is_not_a_model(model):
    """cast(model, "bf16") raised "Invalid device string: 'bf16'" (the name went to model.to as a
    device), and cast(None, dtype) returned None."""
    from kvlab.lab.models import cast

    assert next(cast(model, "bf16").parameters()).dtype == torch.bfloat16
    assert next(model.parameters()).dtype == torch.float32  # a copy: the model is kept
    with pytest.raises(TypeError, match=r"model must be a transformers model"):
        cast(None, torch.float32)


@pytest.mark.parametrize("call,match", [
    (lambda N: N.show_diff(None, kvlab.decode), r"^old must be a module, class or function"),
    (lambda N: N.show_diff(kvlab.decode, kvlab.decode, context="1"),
     r"^context must be a non-negative int, got '1'"),
    (lambda N: N.show_source(kvlab.decode, None), r"^objects\[1\] must be a module, class"),
    (lambda N: N.show_doc(None), r"^obj must be a module, class or function"),
])
def test_notebook_show_helpers_refuse_what_has_no_source(call, match):
    """show_diff(None, f) and show_source(None) raised inspect's TypeError, context="1" "unsupported
    operand type(s) for -", show_doc(None) "'NoneType' object has no attribute '__name__'"."""
    pytest.importorskip("IPython")
    from kvlab.lab import notebook

    with pytest.raises(ValueError, match=match):
        call(notebook)

"""Round 14 (bench, measure, serving, paged cache, models): bad input refused at the door with a
message, and results that were silently lost or compared wrongly."""

import json
import os

import numpy as np
import pytest
import torch

import kvlab
from kvlab.lab import bench

KW = dict(prompt_len=4, new_tokens=3, check_tokens=0, repeats=1, profile_k=0, progress=False)


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
            "--new-tokens", "3", "--check-tokens", "0", "--repeats", "1", "--profile-steps", "0",
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

"""Probe round 16 (hostile user), the lab's plots and bench: a str read letter by letter, names
a record lacks drawn as nothing, fewer titles than records, arrays and tensors a heatmap could not
draw, paths refused where a record is taken, and strategy lists the command line takes refused by
run_bench."""

import matplotlib
import numpy as np
import pytest
import torch

from kvlab.lab import bench, plots

matplotlib.use("Agg")

KW = dict(prompt_len=4, new_tokens=3, check_tokens=0, repeats=1, profile_k=0, progress=False,
          device="cpu", dtype="float32")
ENV = {"hardware": "CPU", "torch": torch.__version__, "transformers": "x"}
TILES = bench.DATA / "h200_tile_sweep.json"


@pytest.fixture(scope="module")
def record(tmp_path_factory):
    """naive and static at batch 1 and 2, no profiler timelines (profile_k=0), written to out."""
    out = tmp_path_factory.mktemp("rec") / "sweep"
    return bench.run_bench("tiny-llama", strategies=["naive", "static"], batches=[1, 2], out=out,
                           **KW)


@pytest.fixture(autouse=True)
def _close():
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


def _lines(fig) -> list[str]:
    """The strategies drawn: each line's label without its token note (its X marks unlabelled)."""
    return [line.get_label().split(" (not ")[0] for line in fig.axes[0].lines
            if not line.get_label().startswith("_")]


# ------------------------------------------------------------------------------ S3: strategies=
def test_batch_sweep_reads_one_str_as_one_name(record):
    """strategies="naive" was read letter by letter ("n", "a", ...) and drew no line at all."""
    assert _lines(plots.plot_batch_sweep(record, strategies="naive")) == ["naive"]
    assert _lines(plots.plot_batch_sweep(record, strategies="static, naive")) == ["static", "naive"]


@pytest.mark.parametrize("strategies,match", [
    (["Naive"], r"no result for 'Naive' \(names are case-sensitive: did you mean 'naive'\?\); "
                r"it has naive, static$"),
    (["paged"], r"no result for 'paged'; it has naive, static$"),
    ([], r"no strategy named; it has naive, static"),
])
def test_batch_sweep_refuses_a_name_the_record_lacks(record, strategies, match):
    """["Naive"] and a strategy the record did not time silently drew an empty plot."""
    with pytest.raises(ValueError, match=match):
        plots.plot_batch_sweep(record, strategies=strategies)


# ------------------------------------------------------------------------------ R4: timelines
def test_timelines_of_a_record_without_traces_say_how_to_make_them(record):
    """A record made with profile_k=0 (--profile-steps 0) raised KeyError 'naive@1'."""
    with pytest.raises(ValueError, match=r"no profiler timelines.*--profile-steps 16"):
        plots.plot_timelines(record, ["naive"])


def test_timelines_read_names_as_every_plot_does():
    """plot_timelines(rec, "naive") raised KeyError 'n@1', and an unknown name KeyError
    'nope@1'."""
    traced = bench.recorded("h200_batch1")
    fig = plots.plot_timelines(traced, "naive")
    assert [t.get_text().split(":")[0] for t in fig.axes[0].texts] == ["naive"]
    with pytest.raises(ValueError, match=r"no result for 'nope'; it has "):
        plots.plot_timelines(traced, ["naive", "nope"])
    untraced = sorted({r["strategy"] for r in traced["results"]}
                      - {k.split("@")[0] for k in traced["traces"]})
    if untraced:  # a strategy timed but not traced is refused by name, not a KeyError
        with pytest.raises(ValueError, match=rf"no timeline of {untraced[0]} at batch 1"):
            plots.plot_timelines(traced, untraced[0])


# ------------------------------------------------------------------------------ R5: titles
def _k_sweep():
    return {"env": ENV, "rows": [{"k": k, "tokens_per_verify": 1.0 + k / 2, "speedup": 1.1}
                                 for k in (1, 2)]}


def _speculation():
    return {"env": ENV, "k": 2, "runs": [{
        "prompt": "p", "tokens_per_s": {"graph-safe": 10.0, "graph-safe-speculative": 20.0},
        "acceptance_rate": 0.5, "tokens_per_verify": 1.5, "new_tokens": 6}]}


@pytest.mark.parametrize("plot,make", [
    (plots.plot_strategies, None), (plots.plot_speculation, _speculation),
    (plots.plot_k_sweep, _k_sweep)])
def test_titles_are_checked_against_the_records(record, plot, make):
    """Fewer titles than records raised IndexError, and one str for two records was read letter
    by letter (titles="ab": "a" and "b")."""
    made = record if make is None else make()
    for titles in (["a"], "ab", ["a", "b", "c"]):
        with pytest.raises(ValueError, match=r"^titles: \d given for 2 record\(s\): give one"):
            plot(made, made, titles=titles)
    plot(made, made, titles=["a", "b"])
    plot(made, titles="one title")


# ------------------------------------------------------------------------------ R6: heatmaps
@pytest.mark.parametrize("matrix", [
    np.arange(12.0).reshape(3, 4), torch.ones(3, 4, requires_grad=True),
    torch.ones(3, 4, dtype=torch.bfloat16), torch.ones(3, 4, dtype=torch.float16),
    [[0.0, 1.0], [2.0, 3.0]]], ids=["numpy", "grad", "bf16", "fp16", "lists"])
def test_heatmaps_draw_arrays_grad_tensors_and_half_precision(matrix):
    """A NumPy matrix raised "no attribute 'numel'", a tensor with grad "Can't call numpy()", and
    bf16 "unsupported ScalarType BFloat16"."""
    fig, axes = plots.plot_cache_heatmaps({"a": matrix}, title="t")
    drawn = axes[0].images[0].get_array()
    want = (matrix.detach().float().numpy() if isinstance(matrix, torch.Tensor)
            else np.asarray(matrix, dtype=np.float32))
    assert np.array_equal(np.asarray(drawn), want)


@pytest.mark.parametrize("panels,match", [
    ({}, r"^panels is an empty dict: give a dict of label"),
    ({"a": torch.zeros(0, 4)}, r"^panel 'a' has shape \(0, 4\): give a \[steps, slots\] matrix "
                              r"of key norms, not empty"),
    ({"a": torch.zeros(4)}, r"^panel 'a' has shape \(4,\)"),
    ([torch.ones(2, 2)], r"^panels is list: give a dict"),
])
def test_heatmaps_refuse_empty_input_clearly(panels, match):
    """{} raised matplotlib's "Number of columns must be a positive integer", an empty matrix
    "max() arg is an empty sequence"."""
    with pytest.raises(ValueError, match=match):
        plots.plot_cache_heatmaps(panels, title="t")


def test_memory_per_step_refuses_an_empty_dict():
    """plot_memory_per_step({}) drew an empty plot (and a legend warning)."""
    with pytest.raises(ValueError, match=r"^series is an empty dict"):
        plots.plot_memory_per_step({}, title="t")


@pytest.mark.parametrize("values,match", [
    ([], r"^series 'a' has shape \(0,\): give a list of bytes per step, not empty"),
    (None, r"^series 'a' holds object values"),
    ([[1, 2], [3, 4]], r"^series 'a' has shape \(2, 2\)"),
])
def test_memory_per_step_refuses_a_line_it_cannot_draw(values, match):
    """An empty list drew nothing silently, None raised "object of type 'NoneType' has no len()"
    and a matrix a TypeError about list / int."""
    with pytest.raises(ValueError, match=match):
        plots.plot_memory_per_step({"a": values}, title="t")


def test_memory_per_step_draws_tensors_of_bytes():
    """A bf16 tensor of bytes per step is drawn as its values in KiB."""
    fig, ax = plots.plot_memory_per_step({"a": torch.tensor([1024, 2048], dtype=torch.bfloat16)},
                                         title="t")
    assert list(ax.lines[0].get_ydata()) == [1.0, 2.0]


# ------------------------------------------------------------------------------ Q3: paths
def test_tile_sweep_plot_and_table_take_a_path():
    """plot_tile_sweep(path) was refused ("record is str ..."), though the bench plots and
    check_tile_prediction take paths."""
    if not TILES.is_file():
        pytest.skip("data/h200_tile_sweep.json is not here")
    fig = plots.plot_tile_sweep(str(TILES))
    assert len(fig.axes) == len(bench.tile_sweep(bench.recorded("h200_tile_sweep")))
    assert bench.tile_sweep(TILES) == bench.tile_sweep(bench.recorded("h200_tile_sweep"))


def test_serving_plots_take_a_path(tmp_path):
    """plot_k_sweep(path) was refused as "record 0 is str", though the bench plots take paths."""
    import json

    path = tmp_path / "ks.json"
    path.write_text(json.dumps(_k_sweep()))
    assert len(plots.plot_k_sweep(str(path)).axes) == 2
    with pytest.raises(ValueError, match=r"^record 0: no record could be read from"):
        plots.plot_k_sweep(str(tmp_path / "nope"))


# ------------------------------------------------------------------------------ Q4: run_bench
def test_run_bench_reads_strategies_as_the_command_line_does():
    """strategies="naive,static" was refused as unknown ['naive,static'] though --strategies takes
    comma lists, and [" naive"] as unknown (spaces are not part of a name)."""
    for given in ("naive,static", "naive, static", [" naive", "static "]):
        assert bench.check_settings(4, 3, [1], given, 0, 1, 0) == (4, 3, [1], 0, 1, 0)
        assert bench.strategy_names(given) == ["naive", "static"]
    assert bench.parse_args(["--strategies", "naive, static"]).strategies == ["naive", "static"]


@pytest.mark.parametrize("strategies,match", [
    (["Naive"], r"'Naive' \(names are case-sensitive: did you mean 'naive'\?\)"),
    ("ALL", r"'ALL' \(names are case-sensitive: did you mean 'all'\?\)"),
])
def test_run_bench_says_what_differs_in_a_strategy_name(strategies, match):
    """A name that differs only in case was refused without saying so."""
    with pytest.raises(bench.BenchArgumentError, match=match):
        bench.check_settings(4, 3, [1], strategies, 0, 1, 0)


def test_run_bench_refuses_an_int_device_naming_the_device():
    """device=0 was refused as "got 0" without saying what to give; measure.time_interleaved
    refuses an int device too (round 15), so run_bench refuses it, naming "cuda:0"."""
    with pytest.raises(bench.BenchArgumentError, match=r"^device 0: give a device by name, e\.g\. "
                                                       r"'cuda:0'"):
        bench.run_bench("tiny-llama", **(KW | {"device": 0}))


@pytest.mark.parametrize("name,match", [
    (" tiny-llama", r"names are exact \(no spaces around them\): did you mean 'tiny-llama'"),
    ("TINY-llama", r"names are case-sensitive: did you mean 'tiny-llama'"),
])
def test_model_names_say_what_differs(name, match):
    """" tiny-llama" was refused as "model names are case-sensitive", though the difference is a
    space."""
    with pytest.raises(bench.BenchArgumentError, match=match):
        bench.run_bench(name, **KW)


# ------------------------------------------------------------------------------ Q8: merge
def test_merge_takes_a_generator_of_parts(record):
    """merge(a generator of records) was refused as "merge part 0 is generator"."""
    merged = bench.merge(r for r in [record, record])
    assert merged["results"] == bench.merge([record, record])["results"]
    assert len(merged["parts"]) == 2


# ------------------------------------------------------------------------------ the same families
def test_run_bench_reads_a_str_of_batch_sizes_as_the_command_line_does():
    """batches="1,2" was refused as "got ['1,2']" though --batch takes comma lists."""
    assert bench.check_settings(4, 3, "1, 2", "naive", 0, 1, 0)[2] == [1, 2]
    assert bench.parse_args(["--batch", "1,2"]).batch == [1, 2]
    with pytest.raises(bench.BenchArgumentError, match=r"^batches '1;2': give a batch size or a"):
        bench.check_settings(4, 3, "1;2", "naive", 0, 1, 0)


@pytest.mark.parametrize("batches,strategies,match", [
    ({1: "a"}, "naive", r"^batches \{1: 'a'\} is a dict: give a list"),
    ([1], {"naive": 1}, r"^strategies \{'naive': 1\} is a dict: give a list"),
    ([1], ["all", "naive"], r"'all' \(it stands alone: give it as the only name\)"),
])
def test_run_bench_refuses_a_dict_and_says_all_stands_alone(batches, strategies, match):
    """batches={1: "a"} was read as its keys, silently, and ["all", "naive"] refused as an unknown
    strategy 'all' without saying why."""
    with pytest.raises(bench.BenchArgumentError, match=match):
        bench.check_settings(4, 3, batches, strategies, 0, 1, 0)


def test_recorded_takes_a_json_name_and_refuses_what_is_no_name():
    """recorded("h200_batch1.json") gave None (it looked for .json.json), recorded(None) None, and
    a path was looked up inside data/."""
    if bench.recorded("h200_batch1") is None:
        pytest.skip("data/h200_batch1.json is not here")
    assert bench.recorded("h200_batch1.json") == bench.recorded("h200_batch1")
    for name in (None, "", str(bench.DATA / "h200_batch1")):
        with pytest.raises(ValueError, match=r"^recorded takes the name of a record in data/"):
            bench.recorded(name)


def test_plot_helpers_refuse_what_they_cannot_draw_with_their_own_words():
    """plots.kind("nope") raised KeyError 'nope', and figure(ncols=0) matplotlib's "Number of
    columns must be a positive integer"."""
    with pytest.raises(ValueError, match=r"unknown strategy 'nope'; choose one of naive"):
        plots.kind("nope")
    with pytest.raises(ValueError, match=r"^ncols must be a positive int"):
        plots.figure("t", "x", "y", ncols=0)

"""Round 18 (lab): merge takes a sweep's single-batch rerun, the lesson 07 plots mark paths not
shown token-exact, and the lab's doors refuse NaN rows, models for configs, non-bool switches,
head counts that are none and runs of the wrong signature."""

import copy
import json
import math
import time
from pathlib import Path

import matplotlib
import pytest
import torch

from kvlab import sizes
from kvlab.lab import bench, measure, plots
from kvlab.lab.models import tiny_model

matplotlib.use("Agg")

KW = dict(prompt_len=8, new_tokens=6, repeats=1, profile_k=0, check_tokens=4, progress=False)
LESSON07 = Path(__file__).resolve().parents[1] / "data" / "lesson07_gpu.json"


@pytest.fixture(scope="module")
def sweep():
    return bench.run_bench("tiny-llama", batches=(1, 2), strategies=["naive", "static"], **KW)


# ------------------------------------------------------------------------------------ 1: merge
def test_merge_takes_a_single_batch_rerun_of_a_sweep(sweep):
    """A sweep (reduce-overhead compiled for several batch sizes) and a single-batch rerun were
    refused as reduce_overhead_dynamic differing, though neither held a reduce-overhead row, and
    the message asked for a setting no one can set."""
    rerun = bench.run_bench("tiny-llama", batches=(1,), strategies=["graph-safe"], **KW)
    assert sweep["settings"]["reduce_overhead_dynamic"] != rerun["settings"][
        "reduce_overhead_dynamic"]
    merged = bench.merge(sweep, rerun)
    want = {(r["strategy"], r["batch"]) for r in sweep["results"] + rerun["results"]}
    assert {(r["strategy"], r["batch"]) for r in merged["results"]} == want
    assert merged["settings"]["batches"] == [1, 2]


def _part(rows, **settings):
    """A record of ``rows`` ((strategy, batch) each), its settings those of run_bench's
    defaults but ``settings``."""
    return {"env": {"hardware": "X"}, "command": "c", "git": {}, "seconds": 1.0, "traces": {},
            "complete": True, "skipped": [],
            "settings": {"model": "m", "prompt_len": 8, "new_tokens": 6, "dtype": "float32",
                         "check_dtype": "float32", "check_tokens": 4, "repeats": 3, "seed": 0,
                         "reduce_overhead_dynamic": None,
                         "batches": sorted({b for _, b in rows}),
                         "strategies": list(dict.fromkeys(n for n, _ in rows))} | settings,
            "results": [{"strategy": n, "batch": b, "tokens_per_s": 10.0, "exact": True}
                        for n, b in rows]}


def test_merge_keeps_reduce_overhead_s_compile_on_its_rows():
    """reduce-overhead compiled for a sweep (dynamic shapes) in one part and for one batch size in
    another could not be merged at all; each row now keeps how it was compiled."""
    a = _part([("reduce-overhead", 1), ("reduce-overhead", 2)], reduce_overhead_dynamic=True)
    b = _part([("reduce-overhead", 4)])
    merged = bench.merge(a, b)
    got = {r["batch"]: r["reduce_overhead_dynamic"] for r in merged["results"]}
    assert got == {1: True, 2: True, 4: None}
    assert merged["settings"]["reduce_overhead_dynamic"] == "per row"
    # b's row replaces a's only one: the table is one compile
    b = _part([("reduce-overhead", 2), ("reduce-overhead", 1)])
    assert bench.merge(a, b)["settings"]["reduce_overhead_dynamic"] is None


def test_merge_compares_repeats_only_where_both_parts_timed_repeated_paths():
    """repeats only sets the repeats of warm_full paths, yet a naive-only part with another
    --repeats was refused; where both parts hold such paths the message names the flag, not
    "the first one's settings"."""
    naive = _part([("naive", 1)], repeats=1)
    graph = _part([("graph-safe", 1)])
    assert not bench.STRATEGIES["naive"].warm_full and bench.STRATEGIES["graph-safe"].warm_full
    assert bench.merge(naive, graph)["settings"]["repeats"] == 3  # the repeated path's
    with pytest.raises(ValueError, match=r"repeats differ.*--repeats") as e:
        bench.merge(_part([("graph-safe", 2)], repeats=1), graph)
    assert "first one's settings" not in str(e.value)


# ---------------------------------------------------------------------- 2: lesson 07's plots
def _lesson07(key):
    return copy.deepcopy(json.loads(LESSON07.read_text())[key])


def test_plot_speculation_marks_paths_not_shown_token_exact():
    """A path whose tokens failed the check was drawn like an exact one."""
    record = _lesson07("speculation")
    runs = record["runs"]
    path = next(iter(runs[0]["tokens_per_s"]))
    runs[0]["exact"][path] = False
    fig = plots.plot_speculation(record)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert f"{path} (not token-exact on {runs[0]['prompt']})" in labels, labels
    hatched = [p for p in fig.axes[0].patches if p.get_hatch()]
    assert len(hatched) == 1
    for run in runs:  # an older record: no check
        del run["exact"]
    fig = plots.plot_speculation(record)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert all("(not checked on" in label for label in labels), labels
    matplotlib.pyplot.close("all")


def test_plot_k_sweep_marks_rows_not_shown_token_exact():
    """A draft length whose tokens failed the check was drawn like an exact one."""
    record = _lesson07("k_sweep")
    row = record["rows"][1]
    row["exact"] = False
    fig = plots.plot_k_sweep(record)
    for ax in fig.axes:
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert any(label.endswith(f"(not token-exact at k {row['k']})") for label in labels)
        crosses = [line for line in ax.get_lines() if line.get_marker() == "X"]
        assert [list(line.get_xdata()) for line in crosses] == [[row["k"]]]
    matplotlib.pyplot.close("all")


# ------------------------------------------------------------------------------------ 3: doors
def test_plots_refuse_a_row_with_a_nan_and_name_it(sweep):
    """A row with tokens_per_s NaN failed inside matplotlib ("Axis limits cannot be NaN")."""
    record = copy.deepcopy(sweep)
    row = record["results"][1]
    row["tokens_per_s"] = math.nan
    with pytest.raises(ValueError, match=rf"results\[1\] \({row['strategy']} at batch "
                                         rf"{row['batch']}\)\['tokens_per_s'\] is nan"):
        plots.plot_strategies(record, batch=row["batch"])
    k = _lesson07("k_sweep")
    k["rows"][0]["speedup"] = math.inf
    with pytest.raises(ValueError, match=r"rows\[0\]\['speedup'\] is inf"):
        plots.plot_k_sweep(k)


@pytest.fixture(scope="module")
def model():
    return tiny_model("tiny-llama")


@pytest.mark.parametrize("call", [
    lambda c: sizes.model_sizes(c), lambda c: sizes.flops_breakdown(c, 2),
    lambda c: sizes.forward_flops(c, 2), lambda c: sizes.decode_step_flops(c, 2, 2, cached=True),
    lambda c: sizes.llama_parameter_count(c), lambda c: sizes.kv_bytes_per_token(c, torch.float16),
    lambda c: sizes.kv_cache_bytes(c, 4, torch.float16)])
def test_sizes_refuse_a_model_given_for_its_config(model, call):
    """A model given for its config raised AttributeError."""
    call(model.config)
    with pytest.raises(ValueError, match=r"pass model\.config"):
        call(model)


def test_sizes_switches_must_be_bools(model):
    """cached="no" counted as cached=True (and causal="no" as causal=True)."""
    with pytest.raises(ValueError, match="cached must be True or False"):
        sizes.decode_step_flops(model.config, 5, 3, cached="no")
    with pytest.raises(ValueError, match="causal must be True or False"):
        sizes.flops_breakdown(model.config, 5, causal="no")


@pytest.mark.parametrize("field, value", [("num_key_value_heads", 0), ("head_dim", 0)])
def test_sizes_refuse_head_counts_that_are_none(model, field, value):
    """num_key_value_heads=0 was read as multi-head attention (and head_dim=0 as the default)."""
    config = copy.deepcopy(model.config)
    setattr(config, field, value)
    with pytest.raises(ValueError, match=rf"{field} must be a positive int"):
        sizes.kv_bytes_per_token(config, torch.float16)


def test_timed_runs_must_take_n_and_on_token():
    """time_decode(lambda: None, ...) raised TypeError "takes 0 positional arguments but 2 were
    given" from inside the timer."""
    for call in (lambda run: measure.time_decode(run, 3, "cpu"),
                 lambda run: measure.time_decodes({"a": run}, 3, "cpu")):
        for run in (lambda: None, lambda n: None, lambda n, *, on_token=None: None):
            with pytest.raises(TypeError, match=r"run.*cannot take 2 positional argument"):
                call(run)

    def run(n, on_token=None, extra=1):  # more parameters, with defaults: taken
        time.sleep(0.01 * n)
        return torch.zeros(1, n)

    assert measure.time_decode(run, 3, "cpu", repeats=1).new_tokens == 3

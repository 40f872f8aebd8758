"""Round 17 (lab): every recorded number is what it says; plots mark rows not shown token-exact."""

import copy

import matplotlib
import pytest
import torch

from kvlab.continuous_batching import ContinuousBatcher
from kvlab.graph_decoder import GraphSafeDecoder
from kvlab.lab import bench, plots, serving
from kvlab.lab.models import tiny_model

matplotlib.use("Agg")


def _paged_record(monkeypatch, broken: str):
    """paged_runs with one way broken after the capturing serve: it makes zeros."""
    model = tiny_model("tiny-llama")
    requests = serving.arriving_requests(3, model.config.vocab_size, prompt_lens=(4, 8),
                                         new_tokens=(4, 6), every=1, device="cpu")
    monkeypatch.undo()  # the real serve and generate, wrapped below
    serve, generate = ContinuousBatcher.serve, GraphSafeDecoder.generate
    calls = {"graph": 0}

    def zeros_serve(self, reqs, **kw):
        out = serve(self, reqs, **kw)
        calls["graph"] += self.use_graph
        if broken == ("graphs" if self.use_graph else "eager") and (calls["graph"] > 1
                                                                 or not self.use_graph):
            out.tokens = [torch.zeros_like(t) for t in out.tokens]
        return out

    def zeros_generate(self, ids, n, **kw):
        made = generate(self, ids, n, **kw)
        return torch.zeros_like(made) if broken == "single" else made

    monkeypatch.setattr(ContinuousBatcher, "serve", zeros_serve)
    monkeypatch.setattr(GraphSafeDecoder, "generate", zeros_generate)
    return serving.paged_runs(model, requests, max_batch=2, block_size=4, device="cpu")


def test_paged_runs_checks_every_way_it_times(monkeypatch):
    """paged_runs checked only the first, capturing graph serve: a timed graph serve, the eager
    serve or the one-at-a-time decoder that made zeros was recorded exact with its tokens/s."""
    for broken, way in (("graphs", "paged, graphs"), ("eager", "paged, eager"),
                        ("single", "one at a time (graph-safe)")):
        record = _paged_record(monkeypatch, broken)
        assert record["exact"] == [False] * 3, (broken, record["exact"])
        assert not any(record["exact_by_way"][way]), (broken, record["exact_by_way"])
        assert all(all(v) for w, v in record["exact_by_way"].items() if w != way)
        fig = plots.plot_paged(record)
        labels = [t.get_text() for t in fig.axes[2].get_yticklabels()]
        assert f"{way} (not token-exact)" in labels, labels
        matplotlib.pyplot.close(fig)


@pytest.fixture(scope="module")
def bench_record():
    return bench.run_bench("tiny-llama", strategies=["naive", "static"], batches=(1, 2),
                           prompt_len=4, new_tokens=6, check_tokens=6, repeats=1, profile_k=0,
                           progress=False, device="cpu", dtype="float32")


def _doubted(record, strategy: str, exact) -> dict:
    record = copy.deepcopy(record)
    for row in record["results"]:
        if row["strategy"] == strategy:
            row["exact"] = exact
    return record


@pytest.mark.parametrize("exact, note", [(False, "not token-exact"), (None, "not checked")])
def test_plots_mark_rows_not_shown_token_exact(bench_record, exact, note):
    """plot_strategies, plot_floor, plot_memory and plot_batch_sweep drew a row with exact=False
    (or no token check) like every other row: a wrong path's speed stood unmarked."""
    assert all(r["exact"] is True for r in bench_record["results"])
    record = _doubted(bench_record, "static", exact)
    on_cuda = copy.deepcopy(record)  # plot_memory draws a path's peak measured on CUDA only
    on_cuda["env"]["device"] = "cuda"
    for row in on_cuda["results"]:
        row["peak_memory_mb"] = 100.0
    for plot in (plots.plot_strategies, plots.plot_floor, plots.plot_memory):
        fig = plot(on_cuda, batch=1)
        labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
        assert labels == ["naive", f"static ({note})"], (plot.__name__, labels)
        hatches = [bar.get_hatch() for bar in fig.axes[0].patches]
        assert not hatches[0] and hatches[1], (plot.__name__, hatches)
        matplotlib.pyplot.close(fig)
    fig = plots.plot_batch_sweep(record)
    labels = [line.get_label() for line in fig.axes[0].get_lines()
              if not line.get_label().startswith("_")]
    assert labels == ["naive", f"static ({note} at batch 1, 2)"], labels
    matplotlib.pyplot.close(fig)


def test_cpu_peak_memory_is_not_recorded_as_each_paths(bench_record):
    """On the CPU each row's peak_memory_mb was the process's peak so far (ru_maxrss only grows),
    the largest seen before it, and plot_memory drew it as "Peak memory of each path"."""
    assert all(r["peak_memory_mb"] is None for r in bench_record["results"])
    older = copy.deepcopy(bench_record)  # a CPU record made before: its numbers are no path's
    for row in older["results"]:
        row["peak_memory_mb"] = 550.0
    for record in (bench_record, older):
        fig = plots.plot_memory(record)
        assert not fig.axes[0].patches
        notes = [t.get_text() for t in fig.axes[0].texts]
        assert any("measured on CUDA only" in t and "naive, static" in t for t in notes), notes
        matplotlib.pyplot.close(fig)

"""Round 17 (lab): every recorded number is what it says; plots mark rows not shown token-exact."""

import matplotlib
import torch

from kvlab.continuous_batching import ContinuousBatcher
from kvlab.graph_decoder import GraphSafeDecoder
from kvlab.lab import plots, serving
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

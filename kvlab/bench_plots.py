"""Plots of ``kvlab.bench`` records (lesson 06): strategies side by side, the bandwidth floor, profiler timelines,
tokens/s against batch size, peak memory per strategy. Every figure is stamped with the hardware its numbers were measured on."""

from __future__ import annotations

from .plotting import figure
from .strategies import DEFAULT_STRATEGIES, STRATEGIES

KIND_COLORS = {"eager": "tab:gray", "compiled": "tab:orange", "graph": "tab:blue"}


def kind(strategy: str) -> str:
    """eager (Python launches every kernel), compiled (torch.compile, incl. its own graphs), graph (kvlab captures)."""
    return STRATEGIES[strategy].kind


ORDER = DEFAULT_STRATEGIES  # the course's order: naive first, the fastest graph-safe path last


def rows(record: dict, batch: int = 1) -> list[dict]:
    """The results at one batch size, in the course's order (naive first, the fastest graph-safe path last)."""
    data = [r for r in record["results"] if r["batch"] == batch]
    rank = {name: i for i, name in enumerate(ORDER)}
    return sorted(data, key=lambda r: (rank.get(r["strategy"].split("/")[0], len(ORDER)), r["strategy"]))


def _label(record: dict) -> str:
    env = record["env"]
    return f"{env['hardware']}, {record['settings']['dtype']}"


def plot_strategies(*records, batch: int = 1, titles=None):
    """Tokens/s of every strategy (log scale), one panel per record; skipped strategies are listed, not drawn."""
    fig, axes = figure("Decode speed, every path of the course", "tokens / s (log scale)", "", env=records[0]["env"],
                       ncols=len(records), figsize=(6.5 * len(records), 4.2))
    axes = axes if len(records) > 1 else [axes]
    for i, (ax, record) in enumerate(zip(axes, records, strict=True)):
        data = rows(record, batch)
        names = [r["strategy"] for r in data]
        ax.barh(names, [r["tokens_per_s"] for r in data], color=[KIND_COLORS[kind(n)] for n in names])
        for y, r in enumerate(data):
            ax.text(r["tokens_per_s"], y, f" {r['tokens_per_s']:,.1f}" if r["tokens_per_s"] < 100 else f" {r['tokens_per_s']:,.0f}",
                    va="center", fontsize=8)
        ax.set_xscale("log")
        ax.set_xlim(right=max(r["tokens_per_s"] for r in data) * 4)
        ax.invert_yaxis()
        ax.set_title((titles[i] if titles else "") + f"\n{_label(record)}, batch {batch}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_floor(record: dict, batch: int = 1):
    """Each path's time per step against the bandwidth floor (weights + KV cache read once per step)."""
    data = rows(record, batch)
    fig, ax = figure("Where each path sits against the memory-bandwidth floor", "ms per decode step (log scale)", "",
                     env=record["env"])
    names = [r["strategy"] for r in data]
    ax.barh(names, [r["ms_per_token"] for r in data], color=[KIND_COLORS[kind(n)] for n in names])
    floor = data[0]["floor_ms_per_token"]
    ax.axvline(floor, color="tab:red", linestyle="--")
    for y, r in enumerate(data):
        ax.text(r["ms_per_token"], y, f" {r['x_floor']:.0f}x floor", va="center", fontsize=8)
    ax.set_xscale("log")
    ax.set_xlim(floor / 2, max(r["ms_per_token"] for r in data) * 6)
    ax.invert_yaxis()
    ax.set_title(f"{_label(record)}; red: floor {floor:.3f} ms at {record['copy_bandwidth_gbps']:,.0f} GB/s", fontsize=10)
    fig.tight_layout()
    return fig


def plot_timelines(record: dict, strategies, batch: int = 1):
    """One decode step's kernels (GPU) or ops (CPU) on a time axis: the white between bars is the device idling."""
    fig, ax = figure("One decode step under the profiler", "time from the step's first kernel (ms)", "",
                     env=record["env"], figsize=(9, 1.2 + 0.8 * len(strategies)))
    for y, name in enumerate(strategies):
        trace = record["traces"][f"{name}@{batch}"]["timeline"]  # [[start µs, duration µs], ...]
        ax.broken_barh([(s / 1e3, max(d, 0.5) / 1e3) for s, d in trace], (y - 0.35, 0.7), color=KIND_COLORS[kind(name)])
        row = next(r for r in rows(record, batch) if r["strategy"] == name)
        ax.text(0, y + 0.45, f"{name}: {row['ms_per_token']:.2f} ms/step, busy {row['busy_ms_per_step']:.2f} ms, "
                f"{row['kernels_per_step']:.0f} ops, idle {row['idle_fraction']:.0%}", fontsize=8)
    ax.set_yticks([])
    ax.set_ylim(-0.6, len(strategies) - 0.1)
    ax.invert_yaxis()
    ax.set_title(_label(record), fontsize=10)
    fig.tight_layout()
    return fig


def plot_batch_sweep(record: dict, strategies=None):
    """Tokens/s (all sequences) against batch size, one line per strategy."""
    strategies = strategies or list(dict.fromkeys(r["strategy"] for r in record["results"]))
    fig, ax = figure("Tokens/s against batch size", "batch size", "tokens / s (log scale)", env=record["env"])
    for name in strategies:
        data = sorted((r["batch"], r["tokens_per_s"]) for r in record["results"] if r["strategy"] == name)
        if data:
            ax.plot(*zip(*data, strict=True), marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.legend()
    ax.set_title(f"{_label(record)}, {record['settings']['new_tokens']} new tokens", fontsize=10)
    fig.tight_layout()
    return fig


def plot_memory(record: dict, batch: int = 1):
    """Peak device memory of every strategy's timed run (``peak_memory_mb``), with the model's weight bytes marked."""
    data = rows(record, batch)
    fig, ax = figure("Peak memory of each path", "peak memory (MB)", "", env=record["env"])
    names = [r["strategy"] for r in data]
    ax.barh(names, [r["peak_memory_mb"] for r in data], color=[KIND_COLORS[kind(n)] for n in names])
    for y, r in enumerate(data):
        ax.text(r["peak_memory_mb"], y, f" {r['peak_memory_mb']:,.0f}", va="center", fontsize=8)
    weights_mb = record["model"]["weight_bytes"] / 2**20
    ax.axvline(weights_mb, color="tab:red", linestyle="--")
    ax.set_xlim(0, max(r["peak_memory_mb"] for r in data) * 1.2)
    ax.invert_yaxis()
    ax.set_title(f"{_label(record)}, batch {batch}; red: the weights, {weights_mb:,.0f} MB", fontsize=10)
    fig.tight_layout()
    return fig

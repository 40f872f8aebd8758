"""Every plot of the course, in one look, each stamped with the hardware it was measured on: the
styled ``figure``, lesson 03's cache heatmaps and memory lines, and lesson 06's plots of
``kvlab.lab.bench`` records (strategies side by side, the bandwidth floor, profiler timelines,
tokens/s against batch size, peak memory per strategy, the tile sweep of the matmul kernels)."""

from __future__ import annotations

import math
import numbers

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.ticker import FormatStrFormatter, LogLocator

from ..runtime import count
from ..strategies import DEFAULT_STRATEGIES, strategy_named

STYLE = {
    "figure.figsize": (7.0, 4.0),
    "figure.dpi": 100,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.titlesize": 12,
    "axes.titleweight": "bold",
    "legend.frameon": False,
    "lines.linewidth": 2.0,
    "lines.markersize": 5,
}


def figure(title: str, xlabel: str, ylabel: str, *, env: dict | None = None, ncols: int = 1,
           figsize=None):
    """A styled figure with one or more axes; ``env`` (from ``kvlab.runtime.environment``) stamps
    the hardware."""
    ncols = count(ncols, "ncols", minimum=1)
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(1, ncols, figsize=figsize or (
            STYLE["figure.figsize"][0] * (1 if ncols == 1 else 0.75 * ncols), 4.0))
        axes_list = [axes] if ncols == 1 else list(axes)
        for ax in axes_list:
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(True, alpha=0.3)
            for side in ("top", "right"):
                ax.spines[side].set_visible(False)
        fig.suptitle(title, fontweight="bold")
        if env is not None:
            stamp = f"{env['hardware']} | torch {env['torch']} | transformers {env['transformers']}"
            if env.get("quick_mode"):
                stamp += " | quick mode (shortened)"
            fig.text(0.99, 0.005, stamp, ha="right", va="bottom", fontsize=7, color="0.4")
        fig.tight_layout(rect=(0, 0.03, 1, 1))
        # the first figure may load a backend (Jupyter's inline) that turns it on
        interactive = plt.isinteractive()
    # rc_context would reset it, and later figures would then never be shown
    plt.interactive(interactive)
    return fig, axes


def plot_cache_heatmaps(panels: dict, *, title: str, env=None, frontier=None,
                        max_slots: int | None = None):
    """Heatmaps side by side: for each ``label -> [steps, slots]`` matrix, which slot held how much
    key, step by step.

    ``frontier``: a list of ints, per step the number of slots a correct cache has filled: drawn as
    a line, so writes right of it (padding, warm-up copies) and holes left of it stand out.
    """
    panels = {label: _matrix(m, label) for label, m in _series(panels, "panels").items()}
    max_slots = None if max_slots is None else count(max_slots, "max_slots", minimum=1)
    fig, axes = figure(title, "cache slot", "decode step", env=env, ncols=len(panels),
                       figsize=(5.0 * len(panels), 4.0))
    axes = [axes] if len(panels) == 1 else axes
    finite = [m[np.isfinite(m)] for m in panels.values()]
    vmax = max((float(m.max()) for m in finite if m.size), default=0.0) or 1.0
    for ax, (label, matrix) in zip(axes, panels.items(), strict=True):
        shown = matrix[:, :max_slots] if max_slots else matrix
        im = ax.imshow(shown, aspect="auto", origin="lower", cmap="magma", vmin=0,
                       vmax=vmax, interpolation="nearest")
        ax.set_title(label, fontsize=10)
        ax.grid(False)
        if frontier is not None:
            steps = range(len(frontier))
            ax.step([f - 0.5 for f in frontier], list(steps), where="mid", color="cyan", lw=1.2,
                    label="end of valid tokens (correct run)")
            ax.legend(loc="upper left", fontsize=7, labelcolor="white")
    fig.colorbar(im, ax=axes, shrink=0.8, label="key norm (0 = empty)")
    return fig, axes


def _series(given, what: str) -> dict:
    """``given``, a dict of label -> what to draw, one entry at least; else a ValueError naming
    ``what``."""
    if not isinstance(given, dict) or not given:
        kind = "an empty dict" if isinstance(given, dict) else f"{type(given).__name__}"
        raise ValueError(f"{what} is {kind}: give a dict of label -> what to draw, one entry at "
                         "least")
    return given


def _numbers(value, what: str, ndim: int, wants: str) -> np.ndarray:
    """``value`` as float64 NumPy to draw: a tensor (any device, with grad, bf16/fp16: detached
    and cast), a NumPy array or (nested) lists; empty, not ``ndim``-D or not real numbers is a
    ValueError naming ``what`` and what it ``wants``."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        value = value if value.is_complex() else value.double()
    try:
        array = np.asarray(value)
    except (TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"{what} is no {wants} of numbers ({e})") from None
    if array.dtype.kind not in "biuf":
        raise ValueError(f"{what} holds {array.dtype} values: give real numbers ({wants})")
    if array.ndim != ndim or array.size == 0:
        raise ValueError(f"{what} has shape {tuple(array.shape)}: give {wants}, not empty")
    return array.astype(np.float64)


def _matrix(value, label) -> np.ndarray:
    """A heatmap's ``[steps, slots]`` matrix as float32 NumPy to draw (``_numbers``)."""
    return _numbers(value, f"panel {label!r}", 2,
                    "a [steps, slots] matrix of key norms").astype(np.float32)


def plot_memory_per_step(series: dict, *, title: str, env=None):
    """Lines of cache bytes per decode step, one per label (e.g. DynamicCache vs StaticCache)."""
    series = _series(series, "series")
    series = {label: _numbers(values, f"series {label!r}", 1, "a list of bytes per step")
              for label, values in series.items()}
    fig, ax = figure(title, "decode step", "KV cache (KiB)", env=env)
    for label, values in series.items():
        ax.plot(range(len(values)), values / 1024, label=label)
    ax.legend()
    return fig, ax

def as_record(given, what: str = "record", needs: tuple = ()) -> dict:
    """``kvlab.lab.bench.as_record`` of what a plot reads (``needs``: keys beyond env, settings and
    results; imported at the first plot of a record)."""
    from .bench import as_record as record

    given = record(given, what, needs=("env", "settings", "results", *needs))
    for i, row in enumerate(given["results"]):
        name = (f" ({row.get('strategy')} at batch {row.get('batch')})" if isinstance(row, dict)
                else "")
        finite(row, f"{what}'s results[{i}]{name}")
    return given


def finite(value, where: str) -> None:
    """A ValueError naming ``where`` (and the key in it) where ``value`` holds a NaN or infinite
    number. Rule: every plot reads its record's rows through this (matplotlib refuses NaN axis
    limits, and a NaN bar is no measurement)."""
    if isinstance(value, dict):
        for key, v in value.items():
            finite(v, f"{where}[{key!r}]")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            finite(v, f"{where}[{i}]")
    elif (isinstance(value, numbers.Real) and not isinstance(value, bool)
          and not math.isfinite(value)):
        raise ValueError(f"{where} is {value!r}: a plot draws finite numbers only; rerun the run "
                         "that measured it, or leave that row out of the record")


def strategies_of(record: dict, strategies=None, what: str = "strategies") -> list[str]:
    """A plot's ``strategies=``, read as ``run_bench`` reads it (``kvlab.lab.bench.name_list``: one
    str is one name, or a comma list): None or "all" for every strategy in the record, in its
    order; a name the record has no result for is a ValueError listing the ones it has."""
    from .bench import given_twice, name_list, unknown_names

    have = list(dict.fromkeys(r["strategy"] for r in record["results"]))
    if strategies is None:
        return have
    try:
        names = name_list(strategies)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what}: {e}") from None
    if names == ["all"]:
        return have
    unknown = unknown_names(names, have)
    if not names or unknown:
        wrong = ("the record has no result for " + ", ".join(unknown) if unknown
                 else "no strategy named")
        raise ValueError(f"{what}: {wrong}; it has "
                         f"{', '.join(have) or '(none: nothing was timed)'}")
    twice = given_twice(names, "strategy")
    if twice:
        raise ValueError(f"{what}: {twice}")
    return names


def titles_for(titles, records: list) -> list:
    """``titles=`` checked against the records once: None (no titles), one str for one record, or
    one title per record; else a ValueError saying how many to give."""
    if titles is None:
        return [None] * len(records)
    given = [titles] if isinstance(titles, str) else titles
    try:
        given = list(given)
    except TypeError:
        raise ValueError(f"titles must be a str or a list of them, got "
                         f"{type(titles).__name__}") from None
    if len(given) != len(records):
        raise ValueError(f"titles: {len(given)} given for {len(records)} record(s): give one title "
                         "per record (or none)")
    return [None if t is None else str(t) for t in given]


KIND_COLORS = {"eager": "tab:gray", "compiled": "tab:orange", "graph": "tab:blue"}


def kind(strategy: str) -> str:
    """eager (Python launches every kernel), compiled (torch.compile, incl. its own graphs), graph
    (kvlab captures)."""
    return strategy_named(strategy).kind


ORDER = DEFAULT_STRATEGIES  # the course's order: naive first, the fastest graph-safe path last


def rows(record: dict, batch: int = 1) -> list[dict]:
    """The results at one batch size, in the course's order (naive first, the fastest graph-safe
    path last). ``record``: a benchmark record or its path (``kvlab.lab.bench.as_record``)."""
    record, batch = as_record(record), count(batch, "batch")
    data = [r for r in record["results"] if r["batch"] == batch]
    rank = {name: i for i, name in enumerate(ORDER)}
    return sorted(data, key=lambda r: (rank.get(r["strategy"].split("/")[0], len(ORDER)),
                                       r["strategy"]))


def _plotted(record: dict, batch) -> list[dict]:
    """``rows`` of a record to plot: refused where there are none (a batch it did not time)."""
    batch = count(batch, "batch")
    data = rows(record, batch)
    if not data:
        timed = sorted({r["batch"] for r in as_record(record)["results"]})
        raise ValueError(f"the record has no result at batch {batch!r} to plot; its results are "
                         f"at batch {', '.join(map(str, timed)) or '(none: nothing was timed)'}")
    return data


def token_note(exact) -> str:
    """A drawn row's token check, for its label: "" where it was token-exact. Rule: every plot of
    timed rows marks a row not shown exact (hatched, grey, labelled), never draws it plainly."""
    if exact is None:
        return " (not checked)"
    return "" if exact is True or (isinstance(exact, np.bool_) and exact) else " (not token-exact)"


def _marked(bars, exacts) -> None:
    """Hatch and grey the bars whose rows were not shown token-exact (``token_note``)."""
    for bar, exact in zip(bars, exacts, strict=True):
        if token_note(exact):
            bar.set_facecolor("0.85")
            bar.set_edgecolor("0.35")
            bar.set_hatch("//")


def _names(data: list[dict]) -> list[str]:
    """Bar labels of bench rows: each strategy with its ``token_note``."""
    return [r["strategy"] + token_note(r.get("exact")) for r in data]


def _noted(label: str, exacts, at: str) -> str:
    """``label`` with each ``token_note`` of ``exacts`` (``[(where, exact)]``) and where it holds,
    e.g. "static (not checked at batch 1, 2)"."""
    notes = [(where, token_note(exact)) for where, exact in exacts]
    return label + "".join(f"{note[:-1]} {at} {', '.join(str(w) for w, n in notes if n == note)})"
                           for note in sorted({n for _, n in notes if n}))


def _checked_line(ax, label: str, points, at: str) -> None:
    """A line through ``points`` (``[(x, y, exact)]``, sorted by x) marking those not shown
    token-exact (``token_note``): an X each, the line dashed, and ``_noted``'s label (``at``: what
    x is, e.g. "at batch")."""
    points = sorted(points, key=lambda p: p[0])
    marked = [(x, y) for x, y, exact in points if token_note(exact)]
    ax.plot([x for x, _, _ in points], [y for _, y, _ in points], marker="o",
            label=_noted(label, [(x, exact) for x, _, exact in points], at),
            linestyle="--" if marked else "-")
    if marked:
        ax.plot(*zip(*marked, strict=True), linestyle="", marker="X", markersize=11, color="0.3")


def _label(record: dict) -> str:
    env = record["env"]
    return f"{env['hardware']}, {record['settings']['dtype']}"


def plot_strategies(*records, batch: int = 1, titles=None):
    """Tokens/s of every strategy (log scale), one panel per record; skipped strategies are listed,
    not drawn."""
    if not records:
        raise ValueError("plot_strategies takes one or more benchmark records (or their paths)")
    records = [as_record(r, f"record {i}") for i, r in enumerate(records)]
    titles = titles_for(titles, records)
    fig, axes = figure("Decode speed, every path of the course", "tokens / s (log scale)", "",
                       env=records[0]["env"], ncols=len(records),
                       figsize=(6.5 * len(records), 4.2))
    axes = axes if len(records) > 1 else [axes]
    for i, (ax, record) in enumerate(zip(axes, records, strict=True)):
        data = _plotted(record, batch)
        names = [r["strategy"] for r in data]
        _marked(ax.barh(_names(data), [r["tokens_per_s"] for r in data],
                        color=[KIND_COLORS[kind(n)] for n in names]),
                [r.get("exact") for r in data])
        for y, r in enumerate(data):
            ax.text(r["tokens_per_s"], y,
                    f" {r['tokens_per_s']:,.1f}" if r["tokens_per_s"] < 100
                    else f" {r['tokens_per_s']:,.0f}",
                    va="center", fontsize=8)
        ax.set_xscale("log")
        ax.set_xlim(right=max(r["tokens_per_s"] for r in data) * 4)
        ax.invert_yaxis()
        ax.set_title((titles[i] or "") + f"\n{_label(record)}, batch {batch}",
                     fontsize=10)
    fig.tight_layout()
    return fig


def plot_floor(record: dict, batch: int = 1):
    """Each path's time per step against the bandwidth floor (weights + KV cache read once per
    step)."""
    record = as_record(record, needs=("copy_bandwidth_gbps",))
    data = _plotted(record, batch)
    fig, ax = figure("Where each path sits against the memory-bandwidth floor",
                     "ms per decode step (log scale)", "", env=record["env"])
    names = [r["strategy"] for r in data]
    _marked(ax.barh(_names(data), [r["ms_per_token"] for r in data],
                    color=[KIND_COLORS[kind(n)] for n in names]), [r.get("exact") for r in data])
    floor = data[0]["floor_ms_per_token"]
    ax.axvline(floor, color="tab:red", linestyle="--")
    for y, r in enumerate(data):
        ax.text(r["ms_per_token"], y, f" {r['x_floor']:.0f}x floor", va="center", fontsize=8)
    ax.set_xscale("log")
    ax.set_xlim(floor / 2, max(r["ms_per_token"] for r in data) * 6)
    ax.invert_yaxis()
    ax.set_title(f"{_label(record)}; red: floor {floor:.3f} ms at "
                 f"{record['copy_bandwidth_gbps']:,.0f} GB/s", fontsize=10)
    fig.tight_layout()
    return fig


def plot_timelines(record: dict, strategies=None, batch: int = 1):
    """One decode step's kernels (GPU) or ops (CPU) on a time axis: the white between bars is the
    device idling. ``strategies``: as ``strategies_of`` reads them (None: every one the record
    traced at ``batch``)."""
    record = as_record(record)
    batch = count(batch, "batch")
    data = {r["strategy"]: r for r in _plotted(record, batch)}
    traces = record.get("traces") or {}
    traced = [n for n in data if f"{n}@{batch}" in traces]
    if not traces:
        raise ValueError("the record holds no profiler timelines: its run traced no step "
                         f"(profile_steps {record['settings'].get('profile_steps')!r}); rerun "
                         "with profile_k=16 (--profile-steps 16) to trace 16 decode steps")
    strategies = traced if strategies is None else strategies_of(record, strategies)
    untraced = [n for n in strategies if n not in traced]
    if untraced or not strategies:
        raise ValueError(f"the record holds no timeline of {', '.join(untraced) or 'any strategy'}"
                         f" at batch {batch}; it traced {', '.join(traced) or 'none there'}")
    fig, ax = figure("One decode step under the profiler", "time from the step's first kernel (ms)",
                     "", env=record["env"], figsize=(9, 1.2 + 0.8 * len(strategies)))
    for y, name in enumerate(strategies):
        trace = record["traces"][f"{name}@{batch}"]["timeline"]  # [[start µs, duration µs], ...]
        ax.broken_barh([(s / 1e3, max(d, 0.5) / 1e3) for s, d in trace], (y - 0.35, 0.7),
                       color=KIND_COLORS[kind(name)])
        row = data[name]
        ax.text(0, y + 0.45, f"{name}{token_note(row.get('exact'))}: "
                f"{row['ms_per_token']:.2f} ms/step, "
                f"busy {row['busy_ms_per_step']:.2f} ms, "
                f"{row['kernels_per_step']:.0f} ops, idle {row['idle_fraction']:.0%}", fontsize=8)
    ax.set_yticks([])
    ax.set_ylim(-0.6, len(strategies) - 0.1)
    ax.invert_yaxis()
    ax.set_title(_label(record), fontsize=10)
    fig.tight_layout()
    return fig


def plot_batch_sweep(record: dict, strategies=None):
    """Tokens/s (all sequences) against batch size, one line per strategy (``strategies``: as
    ``strategies_of`` reads them; None: all the record has)."""
    record = as_record(record)
    strategies = strategies_of(record, strategies)
    fig, ax = figure("Tokens/s against batch size", "batch size", "tokens / s (log scale)",
                     env=record["env"])
    for name in strategies:
        points = [(r["batch"], r["tokens_per_s"], r.get("exact")) for r in record["results"]
                  if r["strategy"] == name]
        if points:
            _checked_line(ax, name, points, "at batch")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.legend()
    ax.set_title(f"{_label(record)}, {record['settings']['new_tokens']} new tokens", fontsize=10)
    fig.tight_layout()
    return fig


def plot_tile_sweep(record: dict):
    """µs per call against batch size for each projection of a tile-sweep record
    (``kvlab.lab.bench.tile_sweep``): the GEMV kernel, the PyTorch form (cuBLAS, fusions unfused)
    and ``tile_kernel``'s best configuration. ``record``: or the path of its .json."""
    from .bench import tile_record, tile_sweep

    record = tile_record(record)
    table = tile_sweep(record)
    sweep = record["sweeps"][0]
    env = {"hardware": sweep["gpu"], "torch": sweep["torch"], "transformers": "(not used)"}
    fig, axes = figure("One projection, three kernels, as the batch grows", "batch size (rows)",
                       "µs per call", env=env, ncols=len(table), figsize=(3.0 * len(table), 3.6))
    for ax, (name, by_rows) in zip(axes, table.items(), strict=True):
        sizes = sorted(by_rows)
        for key, label, color in (("gemv", "GEMV kernel (a weight read per row)", "tab:blue"),
                                  ("torch", "cuBLAS + unfused norm/SiLU/residual", "tab:gray"),
                                  ("tile", "tile kernel, best configuration", "tab:orange")):
            ax.plot(sizes, [by_rows[b][key] for b in sizes], marker="o", color=color, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sizes, [str(b) for b in sizes])
        ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
        ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(FormatStrFormatter(""))
        ax.set_title(name, fontsize=10)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=3, fontsize=8)
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    return fig


def plot_memory(record: dict, batch: int = 1):
    """Peak device memory of every strategy's timed run (``peak_memory_mb``), with the model's
    weight bytes marked. Peak memory per path is measured on CUDA only: a row without it (a CPU
    run) is named, not drawn."""
    record = as_record(record, needs=("model",))
    data = _plotted(record, batch)
    on_cuda = str(record["env"].get("device", "")).startswith("cuda")  # a CPU peak is no path's
    drawn = [r for r in data if on_cuda and r.get("peak_memory_mb") is not None]
    fig, ax = figure("Peak memory of each path", "peak memory (MB)", "", env=record["env"])
    names = [r["strategy"] for r in drawn]
    _marked(ax.barh(_names(drawn), [r["peak_memory_mb"] for r in drawn],
                    color=[KIND_COLORS[kind(n)] for n in names]), [r.get("exact") for r in drawn])
    for y, r in enumerate(drawn):
        ax.text(r["peak_memory_mb"], y, f" {r['peak_memory_mb']:,.0f}", va="center", fontsize=8)
    weights_mb = record["model"]["weight_bytes"] / 2**20
    ax.axvline(weights_mb, color="tab:red", linestyle="--")
    ax.set_xlim(0, max([weights_mb] + [r["peak_memory_mb"] for r in drawn]) * 1.2)
    ax.invert_yaxis()
    unmeasured = [r["strategy"] for r in data if r not in drawn]
    if unmeasured:
        ax.text(0.5, 0.5, "peak memory per path is measured on CUDA only\n(not measured here: "
                + ", ".join(unmeasured) + ")", transform=ax.transAxes, ha="center",
                va="center", fontsize=9, wrap=True)
    ax.set_title(f"{_label(record)}, batch {batch}; red: the weights, {weights_mb:,.0f} MB",
                 fontsize=10)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------ lesson 07 (kvlab.lab.serving records)

def _serving(records: tuple, made_by: str, needs: tuple) -> list[dict]:
    """``records`` of ``kvlab.lab.serving.<made_by>`` (at least one), each holding the keys
    ``needs`` a plot reads, else a ValueError naming the one that is not."""
    from .bench import loaded, record_of

    if not records:
        raise ValueError(f"give one or more kvlab.lab.serving.{made_by} records to plot")
    made = f"kvlab.lab.serving.{made_by}"
    records = [record_of(loaded(r, f"record {i}", f"give what {made} returned"), made,
                         ("env", *needs), f"record {i}", " or the path of its .json")
               for i, r in enumerate(records)]
    for i, record in enumerate(records):
        for key in needs:
            finite(record[key], f"record {i}'s {key}")
    return records


def _where(record: dict) -> str:
    return f"{record['env']['hardware']}" + (f", {record['dtype']}" if "dtype" in record else "")


def plot_speculation(*records, titles=None):
    """Tokens/s of each path on each prompt (``serving.speculation_runs`` records), one panel per
    record, the speculative decoder's acceptance rate and tokens per verify written above its
    bar."""
    records = _serving(records, "speculation_runs", ("runs", "k"))
    titles = titles_for(titles, records)
    fig, axes = figure("Speculative decoding against one token per step", "prompt",
                       "tokens / s (whole decode)", env=records[0]["env"], ncols=len(records),
                       figsize=(6.5 * len(records), 4.4))
    axes = axes if len(records) > 1 else [axes]
    for i, (ax, record) in enumerate(zip(axes, records, strict=True)):
        runs = record["runs"]
        paths = list(runs[0]["tokens_per_s"])
        width = 0.8 / len(paths)
        for j, path in enumerate(paths):
            xs = [x + (j - (len(paths) - 1) / 2) * width for x in range(len(runs))]
            exacts = [(r.get("exact") or {}).get(path) for r in runs]  # older records: none
            _marked(ax.bar(xs, [r["tokens_per_s"][path] for r in runs], width,
                           label=_noted(path, zip([r["prompt"] for r in runs], exacts,
                                                  strict=True), "on")), exacts)
            if path == "graph-safe-speculative":
                for x, r in zip(xs, runs, strict=True):
                    ax.text(x, r["tokens_per_s"][path],
                            f"{r['acceptance_rate']:.0%}\n{r['tokens_per_verify']:.1f}/verify",
                            ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(runs)), [r["prompt"] for r in runs], fontsize=8)
        ax.set_ylim(top=max(v for r in runs for v in r["tokens_per_s"].values()) * 1.25)
        ax.legend(fontsize=8)
        ax.set_title((titles[i] + "\n" if titles[i] else "")
                     + f"{_where(record)}, k = {record['k']}, {runs[0]['new_tokens']} new tokens",
                     fontsize=10)
    fig.tight_layout()
    return fig


def plot_k_sweep(*records, titles=None):
    """Against the draft length k (``serving.k_sweep`` records): tokens per verify step (left) and
    the speedup over graph-safe (right), one line per record."""
    records = _serving(records, "k_sweep", ("rows",))
    titles = titles_for(titles, records)
    fig, (left, right) = figure("How many drafts per verify step?", "drafts per verify step (k)",
                                "tokens per verify step", env=records[0]["env"], ncols=2)
    for i, record in enumerate(records):
        ks = [r["k"] for r in record["rows"]]
        label = titles[i] or _where(record)
        for ax, key in ((left, "tokens_per_verify"), (right, "speedup")):
            _checked_line(ax, label, [(r["k"], r[key], r.get("exact")) for r in record["rows"]],
                          "at k")
    left.plot(ks, [k + 1 for k in ks], linestyle=":", color="0.5", label="every draft kept (k + 1)")
    right.axhline(1, color="0.5", linestyle=":")
    right.set_ylabel("speedup over graph-safe (x)")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_paged(record: dict, title: str = ""):
    """A ``serving.paged_runs`` record: the paged cache's bytes step by step against a static cache
    (left, with the rows running), each request's bytes paged against a static row (middle),
    tokens/s of each way to serve (right)."""
    (record,) = _serving((record,), "paged_runs", ("timeline", "static_bytes", "max_batch",
                                                    "per_request", "tokens_per_s"))
    fig, (mem, per, speed) = figure("A paged cache under arriving requests"
                                    + (f" ({title})" if title else ""),
                                    "scheduler step", "KV cache (MiB)", env=record["env"], ncols=3,
                                    figsize=(16, 4.4))
    steps = [s["step"] for s in record["timeline"]]
    mem.plot(steps, [s["paged_bytes"] / 2**20 for s in record["timeline"]],
             label="paged: blocks handed out")
    mem.axhline(record["static_bytes"] / 2**20, color="tab:red", linestyle="--",
                label=f"static: {record['max_batch']} rows x the longest request")
    rows = mem.twinx()
    rows.step(steps, [s["rows"] for s in record["timeline"]], color="0.6", where="post",
              linewidth=1)
    rows.set_ylabel("requests running", color="0.4")
    mem.legend(fontsize=8, loc="upper left")
    static_row = record["static_bytes"] / record["max_batch"]
    index = range(len(record["per_request"]["per_request"]))
    per.bar(index, [b / 2**20 for b in record["per_request"]["per_request"]],
            label="paged (its blocks)")
    per.axhline(static_row / 2**20, color="tab:red", linestyle="--",
                label="a static row (the longest request)")
    per.set_xlabel("request")
    per.set_ylabel("KV cache held (MiB)")
    per.legend(fontsize=8)
    ways = list(record["tokens_per_s"])
    by_way = record.get("exact_by_way") or {}  # older records checked no timed run: not checked
    exacts = [all(by_way[w]) if w in by_way else None for w in ways]
    bars = speed.barh([w + token_note(e) for w, e in zip(ways, exacts, strict=True)],
                      [record["tokens_per_s"][w] for w in ways],
                      color=["tab:blue", "tab:gray", "tab:green"][: len(ways)])
    _marked(bars, exacts)
    for y, w in enumerate(ways):
        speed.text(record["tokens_per_s"][w], y, f" {record['tokens_per_s'][w]:,.0f}",
                   va="center", fontsize=8)
    speed.set_xlabel("tokens / s, all requests")
    speed.set_ylabel("")
    speed.set_xlim(right=max(record["tokens_per_s"].values()) * 1.3)
    speed.invert_yaxis()
    fig.tight_layout()
    return fig

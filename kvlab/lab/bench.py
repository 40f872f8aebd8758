"""``python -m kvlab.lab.bench``: every decode path of the course on the same model, prompt and
machine, in one process.

For each batch size and strategy: a token check, a warm-up (compile, capture, autotune: timed
apart), then the steady-state time per decode step (``kvlab.lab.measure.time_decode``:
``(T(n) - T(1)) / (n - 1)``, no host sync per token), the time to the first token (``prefill_ms``:
T(1), the prompt's forward and its argmax), tokens/s, peak memory, kernels and GPU busy time per
step from ``torch.profiler``, the bandwidth floor (weights + KV cache read once per step, over a
measured copy bandwidth), and ratios to ``naive`` and to the
``torch.compile(mode="reduce-overhead")`` path. Results go to ``--out``.json and .csv with the
environment and the exact command, rewritten (atomically: a temporary file, then a rename) after
every strategy; a write that fails does not stop the run: every row stays in memory, the write is
tried again after the next strategy, and at the end a failed write is reported (the record then goes
to a file in the temporary folder) with exit status 1.

Why the check runs in float32 and the timing in bfloat16: greedy decoding picks the largest logit,
and two correct implementations that add the same numbers in a different order (a fused matmul,
another kernel, a cache instead of a recompute) round differently. In bfloat16 (8 bits of mantissa)
that moves logits by about 1e-2, enough to flip a near-tie within a few dozen tokens, so "same
tokens" would not tell a correct cache from a broken one. In float32 the same reorderings move
logits by about 1e-6 and ties that close are rare, while a real bug (a wrong position, a stale slot)
changes the tokens at once. So every strategy is first run on an fp32 copy of the same weights and
compared token by token with ``"naive"``; then the bf16 model is timed.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import numbers
import os
import shlex
import stat
import subprocess
import sys
import time
from pathlib import Path

import torch

from ..decoding import decode_naive, first_mismatch
from ..hf_caches import compile_limits
from ..runtime import as_dtype, count, cpu_name, environment, pick_device, pick_dtype, quick_mode
from ..sizes import floor_ms, model_facts
from ..strategies import (
    BENCHMARKED,
    DEFAULT_STRATEGIES,
    STRATEGIES,
    Strategy,
    check_flags,
    strategy_named,
)
from .measure import copy_bandwidth_gbps, free_unreferenced, profile_steps, time_decode
from .models import (
    DEFAULT_MODEL,
    RANDOM_SMOLLM2,
    TINY_CONFIGS,
    ModelUnavailableError,
    build_model,
    cast,
)

# max_cache_len = prompt + new tokens rounded up: one cache length per run, graphs reused
CACHE_ROUNDING = 16
TABLE = ["strategy", "batch", "ms_per_token", "tokens_per_s", "x_naive", "x_reduce_overhead",
         "prefill_ms", "compile_or_capture_s", "peak_memory_mb", "exact", "kernels_per_step",
         "busy_ms_per_step", "x_floor"]


def git_state() -> dict:
    """The commit the code ran from and any uncommitted kvlab file. ``$KVLAB_GIT_COMMIT`` (and
    ``$KVLAB_GIT_DIRTY``, comma-separated) win when set: a copied working tree (the GPU machine) may
    carry a stale or no .git."""
    if os.environ.get("KVLAB_GIT_COMMIT"):
        return {"commit": os.environ["KVLAB_GIT_COMMIT"],
                "uncommitted": [p for p in os.environ.get("KVLAB_GIT_DIRTY", "").split(",") if p]}
    root = Path(__file__).resolve().parents[2]  # the repository: kvlab/lab/bench.py
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                                text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "kvlab"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "", []
    if len(commit) != 40:  # no repository, or one without commits
        return {"commit": "unknown", "uncommitted": "unknown"}
    return {"commit": commit, "uncommitted": [line[3:] for line in dirty if line.strip()]}


class BenchArgumentError(ValueError):
    """A setting the benchmark refuses before doing any work; the message says what to change."""


class BenchWriteError(OSError):
    """The run finished but its record could not be written to ``out``: ``record`` holds every row
    measured."""

    def __init__(self, message: str, record: dict):
        super().__init__(message)
        self.record = record


def _read_int(value, least: int) -> int | None:
    """``value`` as a Python int >= ``least`` (``count``: a NumPy or 0-dim tensor int too), else
    None."""
    try:
        return count(value, "value", minimum=least)
    except ValueError:
        return None


def _as_list(items) -> list:
    """``items`` as a list: one name or number (a str, an int) stands for a list of itself; a dict
    is refused (its keys would be read silently)."""
    if isinstance(items, dict):
        raise ValueError(f"{items!r:.60} is a dict: give a list (or one item)")
    if (isinstance(items, str) or not hasattr(items, "__iter__")
            or getattr(items, "ndim", None) == 0):  # a 0-dim tensor or NumPy array: one number
        return [items]
    return list(items)


def batch_list(batches) -> list:
    """``batches`` as a list, read alike by ``run_bench`` and ``--batch``: one str is a comma list
    of sizes (``"1,2,4"``); one number stands for a list of itself."""
    if isinstance(batches, str):
        try:
            return [int(b) for b in batches.split(",")]
        except ValueError:
            raise ValueError(f"{batches!r}: give a batch size or a comma list such as "
                             "1,2,4") from None
    return _as_list(batches)


def name_list(names) -> list:
    """``names`` (of strategies) as a list, read alike by ``run_bench`` and every plot: one str is a
    comma list, as ``--strategies`` reads it (``"naive"``, ``"naive,static"``); spaces around a
    name are dropped; a ``kvlab.STRATEGIES`` entry stands for its name; one entry for a list of
    itself."""
    if isinstance(names, str):
        return [n.strip() for n in names.split(",") if n.strip()]
    return [strategy_named(n).name if isinstance(n, Strategy)
            else n.strip() if isinstance(n, str) else n for n in _as_list(names)]


def strategy_names(strategies) -> list[str]:
    """``strategies`` as names (``name_list``), ``"all"`` (alone, as the command line's
    ``--strategies all``) standing for every strategy the benchmark times (``BENCHMARKED``)."""
    names = name_list(strategies)
    return list(BENCHMARKED) if names == ["all"] else names


def unknown_names(names: list, known, quote: bool = True, like=None) -> list[str]:
    """Each of ``names`` not in ``known`` (quoted with ``quote``), with what differs where it
    matches a name of ``like`` (default ``known``) but for case or spaces (``near``)."""
    like = known if like is None else like
    return [(repr(name) if quote else str(name))
            + (" (it stands alone: give it as the only name)" if name in like
               else near(name, like))
            for name in names if name not in known]


def near(name, known) -> str:
    """What differs between ``name`` and the known name it matches but for case or spaces
    (``" (names are case-sensitive: did you mean 'naive'?)"``), else "". Names are exact."""
    if not isinstance(name, str | Path):
        return ""
    text = str(name)
    for right in known:
        if text == right or text.strip().lower() != right.lower():
            continue
        differ = [what for what, same in (("case-sensitive", text.strip() == right),
                                          ("exact (no spaces around them)", text == text.strip()))
                  if not same]
        return f" (names are {' and '.join(differ)}: did you mean {right!r}?)"
    return ""


def check_settings(prompt_len, new_tokens, batches, strategies, check_tokens, repeats, profile_k,
                   out=None) -> tuple:
    """Refuse impossible settings up front: a negative count would otherwise record checks that
    never ran, a name given twice would be timed in two rows of one key, and an ``out`` that
    cannot be written would lose every measurement after the first strategy's timing. Returns
    ``(prompt_len, new_tokens, batches, check_tokens, repeats, profile_k)`` as Python ints (the
    record is JSON)."""
    try:
        batches = batch_list(batches)
    except ValueError as e:  # a str that is no list of sizes, a dict
        raise BenchArgumentError(f"batches {e}") from None
    try:
        strategies = strategy_names(strategies)
    except ValueError as e:  # an entry not declared in kvlab.STRATEGIES, a dict
        raise BenchArgumentError(f"strategies {e}") from None
    counts = []
    for name, value, least in (("prompt_len", prompt_len, 1), ("check_tokens", check_tokens, 0),
                               ("repeats", repeats, 1), ("profile_steps", profile_k, 0)):
        counts.append(_read_int(value, least))
        if counts[-1] is None:
            raise BenchArgumentError(f"{name} must be an int >= {least}, got {value!r}")
    prompt_len, check_tokens, repeats, profile_k = counts
    if check_tokens == 1:
        raise BenchArgumentError(f"check_tokens must be 0 (no check) or >= 2, got {check_tokens!r}:"
                                 " one token is the prefill's argmax, no decode step is checked")
    asked, new_tokens = new_tokens, _read_int(new_tokens, 2)
    if new_tokens is None:
        raise BenchArgumentError(f"new_tokens must be >= 2, got {asked!r}: "
                                 "the step time is (T(n) - T(1)) / (n - 1)")
    read = [_read_int(b, 1) for b in batches]
    if not batches or None in read:
        raise BenchArgumentError(f"batch sizes must be ints >= 1, got {list(batches)!r}")
    twice = given_twice(read, "batch size") or given_twice(strategies, "strategy")
    if twice:
        raise BenchArgumentError(twice)
    if not strategies:
        raise BenchArgumentError(f"no strategy given; choose from {', '.join(BENCHMARKED)}")
    unknown = unknown_names(strategies, BENCHMARKED, like=("all", *BENCHMARKED))
    if unknown:
        raise BenchArgumentError(f"unknown strategies {', '.join(unknown)}; "
                                 f"choose from all, {', '.join(BENCHMARKED)}")
    if out is not None:
        check_writable(out)
    return prompt_len, new_tokens, read, check_tokens, repeats, profile_k


def _special(mode: int) -> str | None:
    """What a file of ``mode`` is when it is not a regular file, a folder or a link, else None."""
    for test, kind in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return (None if stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)
            else "an unknown kind of file")


def check_target(out) -> None:
    """Refuse an ``out`` that names a device, pipe or socket (``/dev/null``): ``out`` is the stem of
    two regular files, and ``/dev/null.json`` is not what was named. The name is followed through
    links (``/dev/stdout``); the .json and .csv are not (``write`` replaces a link there)."""
    try:
        paths = out_paths(out)
    except ValueError as e:
        raise BenchArgumentError(f"--out {e}") from None
    checks = [(Path(out), os.stat)] + [(path, os.lstat) for path in paths]
    for path, look in checks:
        try:
            kind = _special(look(path).st_mode)
        except OSError:  # nothing there (or unreadable: check_writable says so)
            continue
        if kind is not None:
            json_path, csv_path = out_paths(out)
            raise BenchArgumentError(f"--out {str(out)!r}: {path} is {kind}, not a file or "
                                     f"folder; --out names the stem of two files ({json_path} "
                                     f"and {csv_path}): give a path in a folder you can write to, "
                                     "e.g. --out out/mybench")


def check_writable(out) -> None:
    """Refuse an ``out`` whose .json or .csv cannot be written, by writing there: the folder is made
    (as ``write`` makes it), an existing file is opened for appending (its content kept), a new one
    is tried as a temporary file. A device or pipe is refused first (``check_target``)."""
    import tempfile

    check_target(out)
    for path in out_paths(out):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.is_dir():
                raise IsADirectoryError(f"{path} is a folder")
            if path.exists():
                with open(path, "a"):
                    pass
            else:
                with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.",
                                                 suffix=".probe"):
                    pass
        except OSError as e:
            raise BenchArgumentError(f"--out {str(out)!r}: {path} cannot be written "
                                     f"({e.strerror or e}), so the results would be lost after "
                                     "the timing: give a path in a folder you can write "
                                     "to, e.g. --out out/mybench") from None


def _secs(seconds: float) -> str:
    """Seconds as the table prints numbers: 0.001 stays 0.001, never 0."""
    return f"{seconds:.3g}" if abs(seconds) < 100 else f"{seconds:.0f}"


def skip_reason(strategy, device, quick: bool, elapsed: float, budget: float | None) -> str | None:
    if budget is not None and elapsed > budget:
        return f"time budget spent ({_secs(elapsed)} s > --time-budget {_secs(budget)} s)"
    if strategy.cuda_only and device.type != "cuda":
        return ("needs CUDA: kvlab captures the compiled step in a real CUDA graph; on CPU there "
                "is no graph to capture it into (see graph-safe, emulated)")
    if strategy.compiled and device.type != "cuda" and quick:
        return ("torch.compile on a 2-core CPU takes minutes; quick mode skips it (run without "
                "--quick to include it)")
    return None


def run_bench(model: str = RANDOM_SMOLLM2, *, prompt_len: int = 64, new_tokens: int = 256,
              batches=(1,), strategies=None, dtype=None, check_tokens: int = 32,
              check_compiled: bool = True, repeats: int = 3, profile_k: int = 16,
              time_budget: float | None = None, device=None, seed: int = 0, quick: bool = False,
              progress: bool = True, command: str | None = None, out=None) -> dict:
    """Run the benchmark and return its record (what ``--out`` stores). Arguments mirror the command
    line.

    ``out``: also write the record there after every strategy, so a run stopped early keeps what it
    measured. A write that fails is tried again after the next strategy; if the last one fails,
    ``BenchWriteError`` is raised once every strategy has run, holding the record.

    ``time_budget``: seconds from the start after which the remaining strategies are skipped; the
    first one that can run is timed whatever the budget, so no run is left empty by it.
    """
    from tqdm.auto import tqdm

    started = time.perf_counter()
    strategies = DEFAULT_STRATEGIES if strategies is None else strategies
    prompt_len, new_tokens, batches, check_tokens, repeats, profile_k = check_settings(
        prompt_len, new_tokens, batches, strategies, check_tokens, repeats, profile_k, out)
    strategies = strategy_names(strategies)  # names, as check_settings read them
    # the command line's rules, before any model is built or timed
    switches = {"check_compiled": check_compiled, "quick": quick, "progress": progress}
    check_flags(switches, switches, BenchArgumentError)
    try:
        check_model_name(model)
    except ValueError as e:
        raise BenchArgumentError(f"--model {e}") from None
    try:
        seed = count(seed, "seed", minimum=0)
        if seed > SEED_MAX:
            raise ValueError(f"seed must be at most 2**63 - 1, got {seed}")
        time_budget = None if time_budget is None else seconds(time_budget, "time_budget")
        device = bench_device(device)
        dtype = pick_dtype(device, None if dtype is None else timed_dtype(dtype))
    except (ValueError, RuntimeError) as e:
        raise BenchArgumentError(str(e)) from None
    # fp32 + bf16 + batch sizes: more than the default 8, for every compiled path of the run
    for knob, limit in compile_limits().items():
        setattr(torch._dynamo.config, knob, limit)
    env = environment(device) | {
        "cpu": cpu_name(),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        # the mode this run used (--quick or KVLAB_QUICK, read by main), as settings["quick"]
        "quick_mode": bool(quick)}
    try:
        check_model = build_model(model, device, seed=seed)
    except ValueError as e:  # an unknown name: a setting, refused before any timing
        raise BenchArgumentError(f"--model {model!r}: {e}") from None
    limit = getattr(check_model.config.get_text_config(), "max_position_embeddings", None)
    if limit is not None and prompt_len + max(new_tokens, check_tokens) > limit:
        longest = (f"new_tokens ({new_tokens})" if new_tokens >= check_tokens
                   else f"check_tokens ({check_tokens}, the fp32 check's tokens)")
        raise BenchArgumentError(
            f"prompt_len ({prompt_len}) + {longest} passes {model}'s position limit "
            f"(max_position_embeddings = {limit}): shorten one of them")
    timed_model = cast(check_model, dtype)
    facts = model_facts(timed_model, dtype)
    gbps = copy_bandwidth_gbps(device)
    # one compile of reduce-overhead for all batch sizes
    dynamic = True if len(batches) > 1 else None
    results, skipped, traces = [], [], {}
    record = {
        "kvlab_bench": 1, "command": command or "kvlab.lab.bench.run_bench(...)", "env": env,
        "git": git_state(),
        "settings": {"model": model, "prompt_len": prompt_len, "new_tokens": new_tokens,
                     "batches": list(batches), "strategies": strategies,
                     "dtype": str(dtype).removeprefix("torch."), "check_dtype": "float32",
                     "check_tokens": check_tokens, "check_compiled": check_compiled,
                     "repeats": repeats, "profile_steps": profile_k, "seed": seed, "quick": quick,
                     "reduce_overhead_dynamic": dynamic, "time_budget": time_budget},
        "model": facts, "copy_bandwidth_gbps": gbps, "results": results, "skipped": skipped,
        "traces": traces,
    }

    write_failed: list[str] = []  # the last write's error; empty once a write succeeds

    def finish(finished: bool) -> dict:
        add_ratios(results)
        done = {(r["strategy"], r["batch"]) for r in results}
        # finished: the loop ran to its end; complete: every (strategy, batch) asked for has a
        # result
        record.update(seconds=time.perf_counter() - started, finished=finished,
                      complete=all((name, b) in done for name in strategies for b in batches))
        if out is not None:
            try:
                write(record, out)
                write_failed.clear()
            except OSError as e:  # the rows stay in memory; the next strategy's write tries again
                write_failed[:] = [f"{type(e).__name__}: {e}"]
                bar.write(f"  could not write {out!r} ({write_failed[0]}): the results are kept in "
                          "memory and written again after the next strategy")
        return record

    bar = tqdm(total=len(batches) * len(strategies), desc="kvlab.lab.bench", disable=not progress)
    for batch in batches:
        gen = torch.Generator().manual_seed(seed)
        # [batch, prompt_len]
        ids = torch.randint(0, facts["vocab"], (batch, prompt_len), generator=gen).to(device)
        length, check_length = (CACHE_ROUNDING * -(-(prompt_len + n) // CACHE_ROUNDING)
                                for n in (new_tokens, check_tokens))
        reference = decode_naive(check_model, ids, check_tokens) if check_tokens else None
        for name in strategies:
            strategy = STRATEGIES[name]
            bar.set_postfix_str(f"batch {batch}: {name}")
            # the budget skips nothing before the first result: a run never times nothing for it
            reason = skip_reason(strategy, device, quick, time.perf_counter() - started,
                                 time_budget if results else None)
            if reason:
                skipped.append({"strategy": name, "batch": batch, "reason": reason})
                bar.update()
                continue
            row = {"strategy": name, "batch": batch, "about": strategy.about,
                   "prompt_len": prompt_len, "new_tokens": new_tokens,
                   "dtype": str(dtype).removeprefix("torch."), "max_cache_len": length}
            try:
                # a compile each: the path it varies is checked
                if strategy.ablation and strategy.compiled:
                    row.update(exact=None, first_mismatch=None,
                               check="ablation: timed only (graph-safe-compiled is checked)")
                elif check_tokens and (check_compiled or not strategy.compiled):
                    t0 = time.perf_counter()
                    state = prepared(strategy, check_model, ids, check_tokens, check_length,
                                     dynamic)
                    tokens = strategy(check_model, ids, check_tokens, **state)
                    # the check's decoder or compiled step (float32) goes before the timed one is
                    # built
                    state = None
                    # a compiled step sits in reference cycles: refcounts alone keep it
                    free_unreferenced(device)
                    mismatch = first_mismatch(tokens, reference)
                    row.update(exact=mismatch is None, first_mismatch=mismatch,
                               check_s=time.perf_counter() - t0,
                               check=f"float32, {check_tokens} tokens vs naive")
                else:
                    why = "--check-tokens 0" if not check_tokens else "--no-check-compiled"
                    row.update(exact=None, first_mismatch=None,
                               check=f"not checked in this run ({why})")

                # built once, used by every call
                kw = prepared(strategy, timed_model, ids, new_tokens, length, dynamic)

                def run(n, on_token=None, strategy=strategy, ids=ids, kw=kw):
                    return strategy(timed_model, ids, n, on_token=on_token, **kw)

                timing = time_decode(run, new_tokens, device,
                                     repeats=repeats if strategy.warm_full else 1,
                                     warmup_tokens=(None if strategy.warm_full
                                                    else min(new_tokens, 4)),
                                     label=name)
                row.update(timing.record(),
                           compile_or_capture_s=max(0.0, timing.warmup_seconds
                                                    - timing.total_seconds)
                           if strategy.warm_full else 0.0)
                if profile_k:
                    prof = profile_steps(run, profile_k, device)
                    traces[f"{name}@{batch}"] = {"timeline": prof.pop("timeline"),
                                                 "top_kernels": prof.pop("top_kernels")}
                    row.update(prof, idle_fraction=max(0.0, 1 - prof["busy_ms_per_step"]
                                                       / timing.ms_per_token))
                # average tokens in the cache during the decode
                context = prompt_len + (new_tokens - 1) / 2
                row["floor_ms_per_token"] = floor_ms(facts["weight_bytes"],
                                                     facts["kv_bytes_per_token"], batch, context,
                                                     gbps)
                row["x_floor"] = timing.ms_per_token / row["floor_ms_per_token"]
                results.append(row)
                bar.write(f"  batch {batch:>3} {name:<36} {timing.ms_per_token:9.3f} ms/token "
                          f"{row['tokens_per_s']:10.1f} tok/s  exact={row['exact']}")
            except Exception as err:  # one failing strategy must not lose the others' results
                skipped.append({"strategy": name, "batch": batch,
                                "reason": f"error: {type(err).__name__}: {err}"[:600]})
                bar.write(f"  batch {batch:>3} {name:<36} FAILED: {type(err).__name__}: "
                          f"{str(err)[:200]}")
            # Free this strategy's decoder, graphs and pools before the next one is built: its peak
            # memory is its own.
            state = kw = run = None
            free_unreferenced(device)
            bar.update()
            finish(finished=False)
    bar.close()
    finish(finished=True)
    if write_failed:
        raise BenchWriteError(f"the results could not be written to {str(out)!r} "
                              f"({write_failed[0]})", record)
    return record


def options(strategy, max_cache_len: int, dynamic: bool | None) -> dict:
    """The keywords the benchmark gives ``strategy``: a fixed ``max_cache_len`` where it takes one,
    and reduce-overhead's ``dynamic`` for a sweep of batch sizes."""
    kw = {"max_cache_len": max_cache_len} if strategy.sized else {}
    if strategy.name == "reduce-overhead":
        kw["dynamic"] = dynamic
    return kw


def prepared(strategy, model, ids, new_tokens: int, max_cache_len: int,
             dynamic: bool | None) -> dict:
    """The keywords for every call of ``strategy`` in one run: ``options``, or where the strategy
    builds a decoder or a compiled step, that built once (``Strategy.state``), so its graphs and
    compiles serve every timed call."""
    kw = options(strategy, max_cache_len, dynamic)
    return strategy.state(model, ids, new_tokens, **kw) if strategy.build else kw


def add_ratios(results: list[dict]) -> None:
    """x_naive and x_reduce_overhead: tokens/s over those of naive / reduce-overhead at the same
    batch size."""
    for row in results:
        base = {r["strategy"]: r["tokens_per_s"] for r in results if r["batch"] == row["batch"]}
        row["x_naive"] = row["tokens_per_s"] / base["naive"] if "naive" in base else None
        row["x_reduce_overhead"] = (row["tokens_per_s"] / base["reduce-overhead"]
                                    if "reduce-overhead" in base else None)


def out_paths(out: str | Path) -> tuple[Path, Path]:
    """``out``.json and ``out``.csv: the suffixes are added to the name as given (``run.1`` ->
    ``run.1.json``), a ``.json``/``.csv`` ending is replaced, and a folder (an existing one, or a
    name ending in "/") gets ``bench.*``. ``load`` reads what ``write`` wrote through it."""
    if not isinstance(out, str | os.PathLike) or not str(out).strip():
        raise ValueError("a record's path must be a str or pathlib.Path (the stem of its .json "
                         f"and .csv), got {type(out).__name__} {out!r:.60}")
    text = str(out)
    path = Path(out)
    if text.endswith(("/", "\\")) or path.is_dir():
        path = path / "bench"
    if path.suffix.lower() in (".json", ".csv"):
        path = path.with_suffix("")
    return path.parent / (path.name + ".json"), path.parent / (path.name + ".csv")


def new_stem(stem: str | Path) -> str:
    """``stem``, or ``stem-2``, ``stem-3``, ... : the first whose .json no run has taken. The .json
    is created empty, exclusively (``O_EXCL``), so two runs started in the same second never get
    one name; ``write`` replaces it."""
    Path(stem).parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 10_000):
        name = str(stem) if n == 1 else f"{stem}-{n}"
        try:
            os.close(os.open(out_paths(name)[0], os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
        except FileExistsError:
            continue
        return name
    raise OSError(f"{stem}: 10,000 records of that name already exist: give --out")


def write(record: dict, out: str | Path) -> tuple[Path, Path]:
    """``out``.json (everything) and ``out``.csv (one row per result, with environment and command),
    each written atomically: a temporary file in the same folder, then ``os.replace`` (a reader
    never sees half a file, a failed write leaves the last one whole; a symlink at the path is
    replaced, not followed). The folder is made again if it went away."""
    import io

    record = as_record(record, needs=("env", "command", "settings", "results", "skipped"))
    json_path, csv_path = out_paths(out)
    extra = {f"env_{k}": v for k, v in record["env"].items()} | {
        "command": record["command"], "model": record["settings"]["model"]}
    rows = [r | extra for r in record["results"]] + [r | extra for r in record["skipped"]]
    table = io.StringIO(newline="")
    writer = csv.DictWriter(table, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
    writer.writeheader()
    writer.writerows(rows)
    for path, text in ((json_path, json.dumps(record, indent=1, default=str)),
                       (csv_path, table.getvalue())):
        write_atomically(path, text)
    return json_path, csv_path


def write_atomically(path: Path, text: str) -> None:
    """``text`` into ``path`` through a temporary file beside it and ``os.replace``."""
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", newline="") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        # mkstemp makes it private; a record is as readable as any file here
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _warm_full(row: dict) -> bool:
    strategy = STRATEGIES.get(row["strategy"])
    return strategy is None or strategy.warm_full  # an unknown name: counted as one


# the settings that make two parts' rows one table, each with the rows it matters to: two parts
# that both hold such rows must agree on it
MERGED_ALIKE = {"prompt_len": None, "new_tokens": None, "dtype": None, "seed": None,
                "check_dtype": lambda row: row.get("exact") is not None,
                "check_tokens": lambda row: row.get("exact") is not None,
                "repeats": _warm_full}  # the timed repeats of warm_full strategies only
# how a user sets each: run_bench's argument of its name, and the command line's flag
MERGED_SET_BY = {"prompt_len": "--prompt-len", "new_tokens": "--new-tokens", "dtype": "--dtype",
                 "seed": "--seed", "check_tokens": "--check-tokens", "repeats": "--repeats"}
# settings of one strategy's rows only, which parts may differ in: kept on each such row
MERGED_PER_ROW = {"reduce_overhead_dynamic": "reduce-overhead"}


def merged_settings(records: list[dict], rows: dict) -> dict:
    """The settings of the merged table's ``rows`` (``{(strategy, batch): row with part}``) that
    ``MERGED_ALIKE`` and ``MERGED_PER_ROW`` name, each from the parts holding rows it matters to
    (the first part's where none does). Two such parts that differ on an alike one are a
    ValueError; a per-row one goes onto its rows, and is ``"per row"`` where parts differ."""
    def value(part: int, key: str):
        return records[part]["settings"].get(key)

    holders = {key: sorted({row["part"] for row in rows.values() if matters is None
                            or matters(row)}) for key, matters in MERGED_ALIKE.items()}
    differ = [k for k, parts in holders.items() if len({value(i, k) for i in parts}) > 1]
    if differ:  # rows measured otherwise are not one table: x_naive would compare them
        a = holders[differ[0]][0]
        b = next(i for i in holders[differ[0]] if value(i, differ[0]) != value(a, differ[0]))
        differ = [k for k in differ if value(a, k) != value(b, k)]
        was, now = (", ".join(f"{k}={value(i, k)!r}" for k in differ) for i in (a, b))
        how = [f"{k} ({MERGED_SET_BY[k]})" for k in differ if k in MERGED_SET_BY]
        fix = [f"rerun the part measured otherwise (part {b}) with part {a}'s {', '.join(how)}"
               ] if how else []
        if "check_dtype" in differ:
            fix.append("check_dtype is kvlab's own: rerun every part with one version of kvlab")
        raise ValueError(f"merge records measured alike: {', '.join(differ)} differ ({was} in "
                         f"part {a}, {now} in part {b}); {'; '.join(fix)}")
    settings = {k: value(parts[0] if parts else 0, k) for k, parts in holders.items()}
    for key, strategy in MERGED_PER_ROW.items():
        held = [row for row in rows.values() if row["strategy"] == strategy]
        for row in held:
            row[key] = value(row["part"], key)
        values = {row[key] for row in held}
        settings[key] = (value(0, key) if not values
                         else values.pop() if len(values) == 1 else "per row")
    return settings


# what merge reads of each part
RECORD_KEYS = ("env", "settings", "results", "skipped", "traces", "command", "git", "seconds",
               "complete")


def as_record(given, what: str = "record", needs=RECORD_KEYS) -> dict:
    """``given``, a benchmark record (``run_bench``'s, ``load``'s), or the path ``write`` wrote one
    to (read by ``load``), as the record; else a ValueError naming ``what`` and what to give.
    ``needs``: the keys the caller reads."""
    given = loaded(given, what, "give the --out of a run (or its .json)")
    return record_of(given, "kvlab.lab.bench.run_bench", needs, what,
                     " or the path it was written to")


def loaded(given, what: str, give: str):
    """``given`` read by ``load`` where it is a path (a str or Path), else ``given`` itself; a file
    that cannot be read is a ValueError naming ``what`` and what to ``give`` instead."""
    if not isinstance(given, str | os.PathLike):
        return given
    try:
        return load(given)
    except (OSError, ValueError) as e:
        raise ValueError(f"{what}: no record could be read from {str(given)!r:.120} "
                         f"({type(e).__name__}: {e}); {give}") from None


def record_of(given, made_by: str, needs, what: str = "record", also: str = "") -> dict:
    """``given`` where it is a record of ``made_by`` (a dict holding the keys ``needs`` the caller
    reads), else a ValueError naming ``what`` and what to give (``also``: another form taken)."""
    missing = [key for key in needs if key not in given] if isinstance(given, dict) else None
    if missing is None or missing:
        kind = (f"a dict without {', '.join(missing)}" if missing
                else "None (kvlab.lab.bench.recorded gives None where data/ lacks the file)"
                if given is None else f"{type(given).__name__} {given!r:.60}")
        raise ValueError(f"{what} is {kind}, not a record of {made_by}: give what it returned "
                         f"(or kvlab.lab.bench.recorded's copy of one){also}")
    return given


def merge(*records) -> dict:
    """One record from runs of the same model on the same hardware (a sweep recorded in parts, e.g.
    when a time limit cut the first): results and skips in order, a later part's row (or skip)
    replacing an earlier one of the same strategy and batch. Each row gets ``part`` (its index in
    ``parts``, which keeps every part's command, git state, settings and time); ``complete`` says
    whether every (strategy, batch) of all parts' settings has a result. The parts: records, or
    the paths they were written to (``--out``), given one by one or as one iterable (a list, a
    generator)."""
    if (len(records) == 1 and hasattr(records[0], "__iter__")  # merge([a, b]), merge(generator)
            and not isinstance(records[0], str | bytes | os.PathLike | dict)):
        records = tuple(records[0])
    if not records:
        raise ValueError("merge takes the records to merge, e.g. merge(load(a), load(b)) or "
                         "merge(a_path, b_path)")
    records = [as_record(r, f"merge part {i}") for i, r in enumerate(records)]
    first = records[0]
    for r in records[1:]:
        if (r["env"].get("hardware") != first["env"].get("hardware")
                or r["settings"]["model"] != first["settings"]["model"]):
            raise ValueError("merge records of one model on one machine: hardware or model differ")
    rows: dict = {}
    for i, r in enumerate(records):
        for row in r["results"]:
            rows[(row["strategy"], row["batch"])] = row | {"part": i}
    settings = merged_settings(records, rows)
    wanted = {(name, b) for r in records for name in r["settings"]["strategies"]
              for b in r["settings"]["batches"]}
    merged = dict(first) | {
        "command": " && ".join(r["command"] for r in records),
        "parts": [{"command": r["command"], "git": r["git"], "settings": r["settings"],
                   "seconds": r["seconds"], "complete": r["complete"]} for r in records],
        "results": list(rows.values()),
        # a skip stays only where no part has a result for its (strategy, batch); one per pair,
        # the latest part's
        "skipped": list({(s["strategy"], s["batch"]): s | {"part": i}
                         for i, r in enumerate(records) for s in r["skipped"]
                         if (s["strategy"], s["batch"]) not in rows}.values()),
        "traces": {k: v for r in records for k, v in r["traces"].items()},
        "seconds": sum(r["seconds"] for r in records),
        "complete": wanted <= set(rows),
    }
    merged["settings"] = dict(first["settings"]) | settings | {
        "batches": sorted({b for r in records for b in r["settings"]["batches"]}),
        "strategies": list(dict.fromkeys(n for r in records for n in r["settings"]["strategies"]))}
    add_ratios(merged["results"])
    return merged


def load(path: str | Path) -> dict:
    """The record ``write(record, path)`` wrote: its .json (``out_paths``)."""
    return json.loads(out_paths(path)[0].read_text())


DATA = Path(__file__).resolve().parents[2] / "data"  # the course's recorded results


def recorded(name: str) -> dict | None:
    """A record the course keeps in ``data/`` (e.g. ``"h200_batch1"``, or ``"h200_batch1.json"``),
    or None if that file is not there. A name is no path: a path is read with ``load``."""
    if not isinstance(name, str) or not name.strip() or any(c in name for c in "/\\"):
        raise ValueError(f"recorded takes the name of a record in data/, e.g. 'h200_batch1', got "
                         f"{name!r:.80}; read a record at a path with kvlab.lab.bench.load(path)")
    path = DATA / f"{name.strip().removesuffix('.json')}.json"
    return load(path) if path.is_file() else None


def tile_record(given, what: str = "record") -> dict:
    """``given``, a tile-sweep record or the path of its .json (read by ``loaded``), as the record;
    else a ValueError naming ``what`` and what to give."""
    given = loaded(given, what, "give the .json tools/time_kernels.py --parts tiles wrote, e.g. "
                   "data/h200_tile_sweep.json")
    return record_of(given, "tools/time_kernels.py --parts tiles", ("sweeps",), what,
                     " or the path of its .json")


def tile_sweep(record: dict) -> dict:
    """A tile-sweep record (``data/h200_tile_sweep.json``, ``tools/time_kernels.py --parts tiles``)
    per projection and batch: µs per call of the GEMV kernel (``"gemv"``), of the PyTorch form
    (``"torch"``: cuBLAS, with the norm, SiLU and residual as kernels of their own) and of
    ``tile_kernel``'s best configuration over all its sweeps (``"tile"``, ``"tile_config"``), and
    the fastest of the three (``"fastest"``, as ``kvlab.kernels.gemv.TILE_DISPATCH`` holds it:
    ``"gemv"``, ``"torch"`` or the configuration; ``"path"``: which of the three, by name) ->
    ``{projection: {rows: {...}}}``. The GEMV and PyTorch times are those of the first sweep that
    timed the shape. ``record``: or the path of its .json (``tile_record``)."""
    record = tile_record(record)
    table = {}
    for sweep in record["sweeps"]:
        for name, entries in sweep["tiles"].items():
            for e in entries:
                row = table.setdefault(name, {}).setdefault(e["rows"], {
                    "N": e["N"], "K": e["K"], "gemv": e["gemv kernel"],
                    "torch": e["pytorch (cuBLAS)"],
                    "tile": float("inf"), "tile_config": None})
                if e["best_us"] < row["tile"]:
                    row["tile"], row["tile_config"] = e["best_us"], tuple(e["best"])
    for by_rows in table.values():
        for row in by_rows.values():
            row["fastest"] = min((row["tile"], row["tile_config"]), (row["gemv"], "gemv"),
                                 (row["torch"], "torch"), key=lambda t: t[0])[1]
            row["path"] = row["fastest"] if isinstance(row["fastest"], str) else "tile"
    return table


def format_table(record: dict) -> str:
    """The record's results as a table, one line per skip after it (``record``: or its path)."""
    record = as_record(record, needs=("results", "skipped"))

    def cell(v):
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
        return "-" if v is None else str(v)

    lines = [" | ".join(TABLE)]
    lines += [" | ".join(cell(r.get(k)) for k in TABLE) for r in record["results"]]
    lines += [f"skipped {s['strategy']} (batch {s['batch']}): {s['reason']}"
              for s in record["skipped"]]
    return "\n".join(lines)


def _count(least: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"{value} is below the smallest allowed value, "
                                             f"{least}")
        return value

    parse.__name__ = f"int >= {least}"
    return parse


def _check_tokens(text: str) -> int:
    # 0: no check (recorded as such); one token is the prefill's argmax: no decode step checked
    value = _count(0)(text)
    if value == 1:
        raise argparse.ArgumentTypeError("1 checks no decode step (one token is the prefill's "
                                         "argmax): give 0 (no check) or >= 2")
    return value


_check_tokens.__name__ = "0 or an int >= 2"


def _batches(text: str) -> list[int]:
    try:
        sizes = batch_list(text)  # run_bench's reader of batches=
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if any(b < 1 for b in sizes):
        raise argparse.ArgumentTypeError(f"{text!r}: batch sizes must be >= 1")
    _once(text, sizes, "batch size")
    return sizes


def given_twice(names: list, what: str) -> str | None:
    """What is wrong with a list that names one item twice (it would be timed twice, in two rows of
    one key, and ``merge`` would keep one of them), else None."""
    twice = sorted({str(n) for n in names if names.count(n) > 1})
    return f"{what} {', '.join(twice)} given twice: name each once" if twice else None


def _once(text: str, names: list, what: str) -> None:
    """The command line's refusal of a list that names one item twice (``given_twice``)."""
    twice = given_twice(names, what)
    if twice:
        raise argparse.ArgumentTypeError(f"{text!r}: {twice}")


def _strategies(text: str) -> list[str]:
    names = strategy_names(text)  # run_bench's reader of strategies=
    unknown = unknown_names(names, BENCHMARKED, quote=False, like=("all", *BENCHMARKED))
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"{'unknown: ' + ', '.join(unknown) if unknown else 'no strategy named'}; "
            f"known: all, {', '.join(BENCHMARKED)}")
    _once(text, names, "strategy")
    return names


# --dtype: what every strategy runs (kvlab.kernels.step.KERNEL_DTYPES; float64 would skip them)
TIMED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


SEED_MAX = 2**63 - 1  # --seed's largest value


def timed_dtype(value) -> torch.dtype:
    """``value`` (a torch dtype or a name) as a dtype the benchmark times, else a ValueError."""
    dtype = as_dtype(value)
    if dtype not in TIMED_DTYPES:
        what = ("a dtype the benchmark times" if dtype.is_floating_point
                else "a floating-point dtype")
        raise ValueError(f"{str(value)!r} is not {what}: use bfloat16, float16 or float32")
    return dtype


def seconds(value, name: str | None = None) -> float:
    """``value`` (a number, or its text) as a finite number of seconds >= 0, else a ValueError
    (naming ``name``)."""
    try:  # a bool is no number of seconds
        number = None if isinstance(value, bool) or "bool" in type(value).__name__ else float(value)
    except (TypeError, ValueError, RuntimeError):
        number = None
    where = f"{name} " if name else ""
    if number is None:
        raise ValueError(f"{where}{value!r:.80} is not a number of seconds")
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{where}{value!r:.80}: give a finite number of seconds >= 0")
    return number


def bench_device(value) -> torch.device:
    """``value`` (None: CUDA when present) as a device the benchmark decodes on, else a
    ValueError (or pick_device's RuntimeError for a GPU that is not there)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):  # pick_device's rule
        raise ValueError(f"device {value!r}: give a device by name, e.g. 'cuda:{value}' (or "
                         f"torch.device('cuda', {value})), 'cuda' or 'cpu'; an int is no device "
                         "here, as in kvlab.lab.measure")
    device = pick_device(value)
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"{str(value)!r}: the benchmark decodes on cpu, cuda or cuda:N "
                         f"({device.type!r} tensors hold no values to decode or time); give one "
                         "of those")
    return device


def check_model_name(name) -> None:
    """Refuse a name that is not a string, and one that differs from a course model's name only in
    case or spaces around it (``"TINY-llama"``, ``" tiny-llama"``): names are exact, and it would
    go to the hub as an id. Each message starts with the name and says what differs."""
    if not isinstance(name, str | Path) or not str(name).strip():
        raise ValueError(f"{name!r:.80}: not a model name: give a name, a hub id or a folder")
    known = [*TINY_CONFIGS, RANDOM_SMOLLM2, DEFAULT_MODEL]
    text = str(name)
    differs = near(text, known)
    if differs:  # it would go to the hub as an id
        raise ValueError(f"{text!r}: not a model name{differs}")
    if text.startswith("tiny-") and text not in TINY_CONFIGS:
        raise ValueError(f"{text!r}: no tiny model of that name; choose one of "
                         f"{', '.join(sorted(TINY_CONFIGS))}")


def _argument(rule):
    """A command-line parser of ``rule``'s value: its ValueError (or RuntimeError) becomes
    argparse's error, first line only."""
    def parse(text: str):
        try:
            return rule(text)
        except (RuntimeError, ValueError) as e:
            raise argparse.ArgumentTypeError(str(e).splitlines()[0]) from None

    parse.__name__ = rule.__name__.strip("_")
    return parse


_dtype = _argument(timed_dtype)
_seconds = _argument(seconds)
_device = _argument(bench_device)


def _bounded(least: int, most: int):
    base = _count(least)

    def parse(text: str) -> int:
        value = base(text)
        if value > most:
            raise argparse.ArgumentTypeError(f"{value} is above the largest allowed value, {most}")
        return value

    parse.__name__ = f"int in [{least}, {most}]"
    return parse


def _model(text: str) -> str:
    try:
        check_model_name(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _out(text: str) -> str:
    for folder in out_paths(text)[0].parents:
        if folder.exists():
            if not folder.is_dir():
                raise argparse.ArgumentTypeError(f"{text!r}: {folder} is a file, not a folder")
            break
    try:
        check_target(text)
    except BenchArgumentError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--out ")) from None
    return text


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m kvlab.lab.bench",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=_model, default=RANDOM_SMOLLM2,
                   help=f"{RANDOM_SMOLLM2} (default, no download), smollm2-135m, tiny-llama, ...")
    p.add_argument("--prompt-len", type=_count(1), default=None,
                   help="prompt tokens (default 64; quick: 16)")
    p.add_argument("--new-tokens", type=_count(2), default=None,
                   help="new tokens per decode (default 256; quick: 16)")
    p.add_argument("--batch", type=_batches, default=[1],
                   help="batch size, or a comma list for a sweep, e.g. 1,2,4,8,16,32,64")
    p.add_argument("--strategies", type=_strategies, default=list(DEFAULT_STRATEGIES),
                   help=f"comma list or 'all'; known: {', '.join(BENCHMARKED)}")
    p.add_argument("--dtype", type=_dtype, default=None,
                   help="timing dtype (default bfloat16 on CUDA, float32 on CPU); checks run in "
                        "float32")
    p.add_argument("--check-tokens", type=_check_tokens, default=None,
                   help="tokens of the fp32 check against naive (default 32; quick: 8; 0: no "
                        "check)")
    p.add_argument("--no-check-compiled", action="store_true",
                   help="skip the fp32 check of compiled strategies (saves their fp32 compile)")
    p.add_argument("--repeats", type=_count(1), default=3,
                   help="timed repeats of compiled/graph strategies (default 3, quick mode too)")
    p.add_argument("--profile-steps", type=_count(0), default=None,
                   help="decode steps traced by torch.profiler (default 16; quick: 2; 0: none)")
    p.add_argument("--time-budget", type=_seconds, default=None,
                   help="seconds after which remaining strategies are skipped (the first "
                        "one that can run is always timed)")
    p.add_argument("--device", type=_device, default=None,
                   help="cpu, cuda or cuda:N (default: cuda when there is a GPU)")
    p.add_argument("--seed", type=_bounded(0, SEED_MAX), default=0)
    p.add_argument("--quick", action="store_true",
                   help="short run (also KVLAB_QUICK=1); skips torch.compile on CPU")
    p.add_argument("--out", type=_out, default=None,
                   help="stem of the two files written, <stem>.json and <stem>.csv (a folder: "
                        "bench.json and bench.csv in it; default out/bench-<time>)")
    args = p.parse_args(argv)
    args.error = p.error
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    quick = args.quick or quick_mode()
    pick = lambda value, full, short: (  # noqa: E731
        value if value is not None else (short if quick else full))
    command = "python -m kvlab.lab.bench " + shlex.join(sys.argv[1:] if argv is None else argv)
    try:
        out = args.out or new_stem(f"out/bench-{time.strftime('%Y%m%d-%H%M%S')}")
    except OSError as e:
        args.error(f"cannot make a record in out/ ({e}): give --out in a folder you can write to")
    try:
        record = run_bench(
            args.model, prompt_len=pick(args.prompt_len, 64, 16),
            new_tokens=pick(args.new_tokens, 256, 16),
            batches=args.batch, strategies=args.strategies, dtype=args.dtype,
            check_tokens=pick(args.check_tokens, 32, 8), check_compiled=not args.no_check_compiled,
            repeats=args.repeats, profile_k=pick(args.profile_steps, 16, 2),
            time_budget=args.time_budget,
            device=args.device, seed=args.seed, quick=quick, command=command, out=out,
        )
    except (BenchArgumentError, ModelUnavailableError) as e:  # raised before any timing
        if args.out is None:  # the empty record new_stem reserved
            with contextlib.suppress(OSError):
                out_paths(out)[0].unlink()
        args.error(str(e))
    # every strategy ran; the record is whole in memory: keep it somewhere
    except BenchWriteError as e:
        print(format_table(e.record))
        import tempfile

        fallback = Path(tempfile.gettempdir()) / f"kvlab-bench-{time.strftime('%Y%m%d-%H%M%S')}"
        try:
            fallback = new_stem(fallback)
            json_path, csv_path = write(e.record, fallback)
            kept = f"the record was written to {json_path} and {csv_path} instead"
        except OSError as again:
            kept = f"nor to {fallback} ({again}); the table above is all that is left"
        print(f"error: {e}; {kept}", file=sys.stderr)
        raise SystemExit(1) from None
    except BaseException:  # an interrupt or a crash before the first write: no empty record left
        if args.out is None:
            with contextlib.suppress(OSError):
                if out_paths(out)[0].stat().st_size == 0:
                    out_paths(out)[0].unlink()
        raise
    json_path, csv_path = out_paths(out)
    print(format_table(record))
    print(f"wrote {json_path} and {csv_path} ({record['env']['hardware']}, "
          f"{record['seconds']:.0f} s)")
    if not record["results"]:
        print("error: no strategy was timed: each one was skipped or failed (the reasons are "
              "above)", file=sys.stderr)
        raise SystemExit(1)
    return record


if __name__ == "__main__":
    main()

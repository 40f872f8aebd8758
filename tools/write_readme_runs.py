"""Write README.md's table of recorded notebook runs (between its ``notebook-runs`` markers) from the JSON record.

    python tools/write_readme_runs.py                                      # from data/notebook_runs.json
    python tools/write_readme_runs.py --runs data/notebook_runs_gpu.json   # from another record
    python tools/write_readme_runs.py --check                              # write nothing; exit 1 if it would change

The record is what ``tools/run_notebooks.py`` writes (its ``--out``'s STEM.json; a STEM without .json is read
as STEM.json). The table has one column per hardware
(CPUs first) and one row per notebook, full-size runs only (``quick`` false): passed or failed, the wall time, the
memory peak (GPU if recorded, else RSS) and the model. Under it: which commits and dates the rows ran at, and whether
each machine's rows are current: their ``code_hash`` of ``kvlab/`` and ``notebooks/`` against this checkout's when
the table is written (``code_hash.status_sentence``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:  # tools/, also when this file is loaded by its path
    sys.path.append(str(Path(__file__).resolve().parent))
import code_hash  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
README_START, README_END = "<!-- notebook-runs:start -->", "<!-- notebook-runs:end -->"


def readme_table(rows: list[dict], now: dict | None = None) -> str:
    """The README's table of recorded runs: one column per hardware, full-size runs only, and whether each column
    is current against ``now`` (default: this checkout's hashes)."""
    full = [r for r in rows if not r.get("quick")]
    hardware = sorted({r["hardware"] for r in full}, key=lambda h: (not h.startswith("CPU"), h))
    by = {(r["notebook"], r["hardware"]): r for r in full}

    def cell(r):
        if r is None:
            return "not recorded"
        memory = (f"GPU peak {r['cuda_max_allocated_mb'] / 1024:.1f} GB" if r.get("cuda_max_allocated_mb") is not None
                  else f"RSS peak {r['peak_rss_mb'] / 1024:.1f} GB" if r.get("peak_rss_mb") is not None else "memory unknown")
        return f"{'passed' if r['passed'] else 'FAILED'}, {r['wall_s']:.0f} s, {memory}, {r['model']} model"

    lines = ["| notebook | " + " | ".join(hardware) + " |", "| --- |" + " --- |" * len(hardware)]
    for nb in sorted({r["notebook"] for r in full}):
        lines.append(f"| `{nb.removesuffix('.ipynb')}` | " + " | ".join(cell(by.get((nb, h))) for h in hardware) + " |")
    made = {h: sorted({f"{(r.get('commit') or '?')[:7]} ({(r.get('date') or '?')[:10]})" for r in full if r["hardware"] == h})
            for h in hardware}
    lines.append("")
    lines.append("Recorded by `python tools/run_notebooks.py` at full size, read from `data/notebook_runs.json`; code: " +
                 "; ".join(f"{h} at {', '.join(m)}" for h, m in made.items()) + ".")
    lines.append("")
    lines.append(code_hash.status_sentence(full, hardware, code_hash.tree_hashes(ROOT) if now is None else now))
    return "\n".join(lines)


def refresh_readme(readme: Path, rows: list[dict], *, write: bool = True) -> bool:
    """Rewrite the block between the README's markers (``write=False``: only compare); True if it changed."""
    text = readme.read_text()
    start, end = text.index(README_START) + len(README_START), text.index(README_END)
    new = text[:start] + "\n" + readme_table(rows) + "\n" + text[end:]
    if write:
        readme.write_text(new)
    return new != text


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=Path, default=ROOT / "data" / "notebook_runs.json",
                   help="the recorded runs, tools/run_notebooks.py's STEM.json (default data/notebook_runs.json)")
    p.add_argument("--readme", type=Path, default=ROOT / "README.md", help="the README to write (default README.md)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if the table differs from what it writes")
    args = p.parse_args(argv)
    rows = json.loads(args.runs.with_suffix(".json").read_text())["runs"]
    changed = refresh_readme(args.readme, rows, write=not args.check)
    if args.check:
        if changed:
            print(f"{args.readme}: the table of runs differs from {args.runs.with_suffix('.json')}; "
                  "refresh with: python tools/write_readme_runs.py")
        return int(changed)
    print(args.readme.name, "updated" if changed else "already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""tools/write_readme_runs.py: the README's lessons table is what the tool writes from the
notebooks and the record, every lesson has a full-size run on a CPU and an H200, rows of older code
are marked, and no hash is written."""

import json
import re
from pathlib import Path

from tool_module import load_tool

ROOT = Path(__file__).resolve().parent.parent
NOW = {"kvlab": "k" * 64, "notebooks": "n" * 64, "tests": "t" * 64}


def _tool():
    return load_tool("write_readme_runs")


def _notebook(folder: Path, name: str, title: str) -> None:
    cells = [
        {"cell_type": "markdown", "metadata": {}, "source": ["[![Open In Colab](x)](y)"]},
        {
            "cell_type": "markdown",
            "metadata": {},
            "source": [f"# {name[:2]} · {title}\n", "\n", "text"],
        },
    ]
    (folder / name).write_text(json.dumps({"cells": cells}), encoding="utf-8")


def test_the_table_picks_current_rows_marks_older_code_and_names_no_hash(tmp_path):
    tool = _tool()
    _notebook(tmp_path, "00_a.ipynb", "Setup: the machine")
    _notebook(tmp_path, "01_b.ipynb", "Naive decoding")
    base = {
        "passed": True,
        "quick": False,
        "model": "real",
        "commit": "abc1234def",
        "date": "2026-12-01T10:00:00",
    }
    same, old = {**NOW, "combined": "c"}, {**NOW, "kvlab": "old", "combined": "d"}
    rows = [
        {
            **base,
            "notebook": "00_a.ipynb",
            "hardware": "CPU: x",
            "device": "cpu",
            "wall_s": 60.0,
            "code_hash": same,
        },
        {
            **base,
            "notebook": "00_a.ipynb",
            "hardware": "CPU: y",
            "device": "cpu",
            "wall_s": 90.0,
            "code_hash": same,
        },
        {
            **base,
            "notebook": "00_a.ipynb",
            "hardware": "CPU: z",
            "device": "cpu",
            "wall_s": 999.0,
            "code_hash": old,
        },
        {
            **base,
            "notebook": "00_a.ipynb",
            "hardware": "CPU: x",
            "device": "cpu",
            "wall_s": 5.0,
            "quick": True,
            "code_hash": same,
        },
        {
            **base,
            "notebook": "00_a.ipynb",
            "hardware": "NVIDIA H100 80GB HBM3",
            "device": "cuda",
            "wall_s": 30.0,
            "date": "2026-12-02",
            "code_hash": old,
        },
        {
            **base,
            "notebook": "00_a.ipynb",
            "hardware": "NVIDIA H200",
            "device": "cuda",
            "wall_s": 12.0,
            "date": "2026-12-01",
            "code_hash": old,
        },
        {
            **base,
            "notebook": "01_b.ipynb",
            "hardware": "CPU: x",
            "device": "cpu",
            "wall_s": 120.0,
            "passed": False,
            "code_hash": same,
        },
    ]
    table = tool.readme_table(rows, now=NOW, notebooks=tmp_path)
    lines = table.splitlines()
    assert lines[0].startswith(
        "| notebook | CPU"
    )  # tools/gpu_check.py's test edits this header to make it stale
    # CPU: the slowest current run (the older, slower row is not taken);
    # GPU: the newest run, named, marked older
    assert lines[2] == "| `00_a` | 1.5 | 0.5 (H100), older code | Setup: the machine |"
    assert (
        lines[3] == "| `01_b` | not recorded | not recorded | Naive decoding |"
    )  # a failed run is no minutes
    assert "abc1234" not in table and "kkkkkkk" not in table
    assert '"older code"' in table
    assert "older code" not in tool.readme_table(rows[:2], now=NOW, notebooks=tmp_path)


def test_the_committed_readme_shows_the_committed_record():
    tool = _tool()
    assert tool.main(["--check"]) == 0, "run `python tools/write_readme_runs.py --write`"
    rows = json.loads((ROOT / "data" / "notebook_runs.json").read_text())["runs"]
    lessons = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    for machine in ("CPU", "H200"):
        done = {
            r["notebook"]
            for r in rows
            if machine in r["hardware"] and r["model"] == "real" and not r["quick"] and r["passed"]
        }
        assert set(lessons) <= done, (
            f"{machine}: re-record with tools/run_notebooks.py; missing {set(lessons) - done}"
        )
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index(tool.README_START) : readme.index(tool.README_END)]
    rows_shown = [line for line in block.splitlines() if line.startswith("| `")]
    assert [re.match(r"\| `([^`]+)`", line).group(1) for line in rows_shown] == [
        n.removesuffix(".ipynb") for n in lessons
    ]
    assert all(
        re.match(r"\| `[^`]+` \| \d+\.\d", line) for line in rows_shown
    )  # every lesson: CPU minutes


def test_check_fails_on_a_stale_table_and_write_fixes_it(tmp_path):
    tool = _tool()
    runs = ROOT / "data" / "notebook_runs.json"
    readme = tmp_path / "README.md"
    readme.write_text(
        f"# Title\n\nbefore\n{tool.README_START}\n| stale |\n{tool.README_END}\nafter\n"
    )
    args = ["--runs", str(runs), "--readme", str(readme)]
    assert tool.main([*args, "--check"]) == 1 and "stale" in readme.read_text()
    assert tool.main([*args, "--write"]) == 0
    text = readme.read_text()
    assert text.startswith(
        f"# Title\n\nbefore\n{tool.README_START}\n| notebook |"
    ) and text.endswith(f"{tool.README_END}\nafter\n")
    assert tool.main([*args, "--check"]) == 0
    assert (
        tool.refresh_readme(readme, json.loads(runs.read_text())["runs"]) is False
    )  # a second run changes nothing

"""tools/write_readme_runs.py: the README's table of runs says whether each machine's rows are current, and the
committed README shows the committed record: every lesson run at full size on a CPU and an H200, a failed run shown as
FAILED."""

import json
from pathlib import Path

from tool_module import load_tool

ROOT = Path(__file__).resolve().parent.parent


def _tool():
    return load_tool("write_readme_runs")


def test_the_readme_table_says_whether_each_machine_is_current():
    tool = _tool()
    now = {"kvlab": "k" * 64, "notebooks": "n" * 64, "tests": "t" * 64}
    same = {**now, "combined": "c" * 64}
    base = {"passed": True, "wall_s": 10.0, "peak_rss_mb": 1024.0, "cuda_max_allocated_mb": None, "model": "real",
            "quick": False, "commit": "abc1234", "date": "2026-12-01T10:00:00+00:00"}
    rows = [{**base, "notebook": "00_a.ipynb", "hardware": "CPU: x", "code_hash": same},
            {**base, "notebook": "01_b.ipynb", "hardware": "CPU: x", "code_hash": {**same, "tests": "t2"}},  # not a lesson's
            {**base, "notebook": "00_a.ipynb", "hardware": "NVIDIA H200", "date": "2026-12-02T09:00:00+00:00",
             "code_hash": {**same, "kvlab": "old", "notebooks": "old"}},
            {**base, "notebook": "01_b.ipynb", "hardware": "NVIDIA H200"},  # recorded before rows had a code hash
            {**base, "notebook": "00_a.ipynb", "hardware": "NVIDIA A100", "code_hash": {**same, "notebooks": "old"}},
            {**base, "notebook": "01_b.ipynb", "hardware": "NVIDIA A100", "code_hash": {**same, "notebooks": "old"}}]
    status = tool.readme_table(rows, now=now).splitlines()[-1]
    assert "CPU: x: current (code hash kvlab/ kkkkkkk, notebooks/ nnnnnnn);" in status
    assert ("NVIDIA H200: 00: kvlab/, notebooks/ changed since these runs (rows of 2026-12-02); 01: code hash not "
            "recorded (rows of 2026-12-01)") in status
    assert "NVIDIA A100: notebooks/ changed since these runs (rows of 2026-12-01);" in status
    assert "current" not in status.split("NVIDIA A100:")[1]


def test_record_has_every_lesson_at_full_size_on_a_cpu_and_an_h200_and_the_readme_shows_each_result():
    tool = _tool()
    rows = json.loads((ROOT / "data" / "notebook_runs.json").read_text())["runs"]
    lessons = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index(tool.README_START) + len(tool.README_START):readme.index(tool.README_END)]
    assert block.strip() == tool.readme_table(rows), "run `python tools/write_readme_runs.py`"
    for machine in ("CPU", "H200"):
        done = {r["notebook"]: r["passed"] for r in rows if machine in r["hardware"] and r["model"] == "real"
                and not r["quick"]}
        assert set(done) == set(lessons), f"{machine}: re-record with tools/run_notebooks.py; missing {set(lessons) - set(done)}"
        table = block.strip().splitlines()
        at = [machine in heading for heading in table[0].split(" | ")].index(True)
        column = [line.split(" | ")[at] for line in table[2:2 + len(lessons)]]
        for lesson, cell in zip(lessons, column, strict=True):  # the table is in lesson order
            assert cell.startswith("passed" if done[lesson] else "FAILED"), (machine, lesson, cell)


def test_refresh_rewrites_only_the_block_between_the_markers(tmp_path):
    tool = _tool()
    rows = json.loads((ROOT / "data" / "notebook_runs.json").read_text())["runs"]
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\nbefore\n{tool.README_START}\n| stale |\n{tool.README_END}\nafter\n")
    assert tool.refresh_readme(readme, rows) is True
    assert readme.read_text() == (f"# Title\n\nbefore\n{tool.README_START}\n{tool.readme_table(rows)}\n"
                                  f"{tool.README_END}\nafter\n")
    assert tool.refresh_readme(readme, rows) is False  # a second run changes nothing

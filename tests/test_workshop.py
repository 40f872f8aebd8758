"""tools/write_workshop_schedule.py: INSTRUCTORS.md's schedule block matches the recorded runs and the notebooks, and the tool's
reading time, optional sections, exercise count and breaks do what its docstring says (on tiny fake notebooks)."""

import importlib.util
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("write_workshop_schedule", ROOT / "tools" / "write_workshop_schedule.py")
workshop = importlib.util.module_from_spec(_spec)
sys.modules["write_workshop_schedule"] = workshop  # dataclasses look their module up while the class is made
_spec.loader.exec_module(workshop)


def md(text: str, *tags: str) -> dict:
    return {"cell_type": "markdown", "metadata": {"tags": list(tags)}, "source": text}


def code(text: str, *tags: str) -> dict:
    return {"cell_type": "code", "metadata": {"tags": list(tags)}, "source": text, "outputs": [], "execution_count": None}


def runs() -> list[dict]:
    return json.loads(workshop.RUNS.read_text(encoding="utf-8"))["runs"]


def test_the_committed_guide_matches_the_data():
    assert workshop.main(["--check"]) == 0, "INSTRUCTORS.md's workshop block is stale: run python tools/write_workshop_schedule.py --write"


def test_check_fails_on_a_stale_block_and_write_fixes_it(tmp_path):
    guide = tmp_path / "GUIDE.md"
    guide.write_text(f"# Guide\n\nbefore\n{workshop.START}\n| stale | table |\n{workshop.END}\nafter\n", encoding="utf-8")
    assert workshop.main(["--check", "--guide", str(guide)]) == 1
    assert workshop.main(["--write", "--guide", str(guide)]) == 0
    text = guide.read_text(encoding="utf-8")
    assert "stale" not in text and text.startswith("# Guide\n\nbefore\n") and text.endswith(f"{workshop.END}\nafter\n")
    assert workshop.main(["--check", "--guide", str(guide)]) == 0


def test_reading_time_and_an_optional_section_on_a_fake_notebook():
    notebook = {"cells": [
        md("badge words that are not read", "colab-badge"),  # tools/write_colab_cells.py's cells are left out
        md("# 9 · Title\none two three"),  # 3 + 3 words
        code("import os\n\nprint(os.getcwd())\n", "colab-setup"),
        md("## 1 · Core\nalpha beta gamma delta"),  # 3 + 4 words
        code("a = 1\n\nb = 2\n"),  # 2 lines (blank lines do not count)
        md("## 3 · Something (optional)\n" + "word " * 40),  # optional: 4 + 40 words
        md("### 3a · Deeper, still optional\n" + "word " * 10 + "\n**Exercise 1.** do it"),  # optional: 5 + 10 + 4
        code("c = 3\nd = 4\ne = 5"),  # optional: 3 lines
        md("## 4 · Back\nback to core\n**Exercise 2.** more\n**3.** numbered"),  # 3 + 3 + 3 + 2 words, 2 exercises
        code("f = 6", "exercise"),  # exercise 3's checker: 1 line, not another exercise
    ]}
    text = workshop.analyse(notebook)
    assert (text.words, text.code_lines, text.exercises) == (24, 3, 2)
    assert (text.optional_words, text.optional_code_lines, text.optional_exercises) == (63, 3, 1)
    assert text.optional_sections == ["3 · Something (optional)"]
    assert abs(text.reading_minutes - (24 / workshop.WORDS_PER_MINUTE + 3 / workshop.CODE_LINES_PER_MINUTE)) < 1e-12
    assert text.exercise_minutes == 2 * workshop.EXERCISE_MINUTES
    assert abs(text.optional_minutes - workshop.minutes(63, 3, 1)) < 1e-12


def test_optional_mid_cell_by_tag_and_not_inside_a_code_fence():
    notebook = {"cells": [
        md("## 1 · Core\nkept\n```\n## not a heading (optional)\n```\n## 2 · Later (optional)\nskipped words"),
        code("x = 1"),  # inside section 2: optional
        md("# 3 · A higher level ends it\nkept again"),
        md("no heading, tagged: only this cell", "optional"),
        code("y = 2"),  # after the tagged cell: core again
        md("## 4 · Tagged from its heading on\nskipped", "optional"),
        md("### 4a · still inside\nskipped"),
        md("## 5 · Same level ends it\nkept"),
    ]}
    text = workshop.analyse(notebook)
    # core: "1 · Core" 3 + "kept" 1 + the fence's 3 lines (7 words) + "3 · A higher level ends it" 7 + "kept again" 2
    #       + "5 · Same level ends it" 6 + "kept" 1
    assert (text.words, text.code_lines) == (27, 1)
    # optional: "2 · Later (optional)" 4 + "skipped words" 2 + the tagged cell 6 + "4 · Tagged from its heading on" 7
    #           + "skipped" 1 + "4a · still inside" 4 + "skipped" 1
    assert (text.optional_words, text.optional_code_lines) == (25, 1)
    assert text.optional_sections == ["2 · Later (optional)", "4 · Tagged from its heading on"]


def test_breaks_fall_at_the_boundary_nearest_to_every_hour():
    rows = [workshop.Row("core", f"l{i}", reading=t) for i, t in enumerate([50, 20, 40, 30])]
    plan = [r.label for r in workshop.with_breaks(rows)]
    # 50 | 70 is as far past the hour as 50 is short of it: the break comes first; 20 + 40 = 60: break after
    assert plan == ["l0", "break", "l1", "l2", "break", "l3"]
    assert [r.label for r in workshop.with_breaks(rows[:1])] == ["l0"]  # never a break after the last lesson


def test_the_schedule_sums_are_the_sums_of_its_rows():
    texts = workshop.lesson_texts(workshop.NOTEBOOKS)
    plan = workshop.schedule(texts, runs())
    core = plan["core"]
    assert [r.label for r in core if r.label != "break"] == [texts[k][0].removesuffix(".ipynb") for k in workshop.CORE]
    for r in core:
        assert r.total == (workshop.BREAK_MINUTES if r.label == "break" else r.run + r.reading + r.exercises)
    table = workshop.schedule_table(plan, runs())
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines() if line.startswith("| core |")]
    *rows, total = cells
    assert len(rows) == len(core) and total[1] == "**core path total**"
    assert int(total[5].strip("*")) == sum(int(r[5]) for r in rows) == sum(r.total for r in core)
    for column in (2, 3, 4):  # run, reading, exercises: the total row sums the lesson rows
        assert int(total[column]) == sum(int(r[column]) for r in rows if r[1] != "break")
    said = workshop.verdict(plan)
    found = re.search(r"with every exercise done in the room it takes (\d+) minutes", said, re.I)
    assert found and int(found.group(1)) == sum(r.total for r in core)
    # the room plan: the same lessons without exercises, its own breaks
    lessons = [r for r in core if r.label != "break"]
    room = workshop.with_breaks([workshop.Row(r.part, r.label, run=r.run, reading=r.reading) for r in lessons])
    found = re.search(r"as homework, takes (\d+) minutes", said)
    assert found and int(found.group(1)) == sum(r.total for r in room) < sum(r.total for r in core)


def test_run_times_are_read_from_the_recorded_runs():
    rows = [{"notebook": "01_x.ipynb", "hardware": "CPU: laptop", "device": "cpu", "passed": True, "quick": False, "wall_s": 61.0},
            {"notebook": "01_x.ipynb", "hardware": "CPU: slower", "device": "cpu", "passed": True, "quick": False, "wall_s": 130.0},
            {"notebook": "01_x.ipynb", "hardware": "CPU: quick run", "device": "cpu", "passed": True, "quick": True, "wall_s": 999.0},
            {"notebook": "01_x.ipynb", "hardware": "CPU: failed", "device": "cpu", "passed": False, "quick": False, "wall_s": 500.0},
            {"notebook": "01_x.ipynb", "hardware": "NVIDIA H200", "device": "cuda", "passed": True, "quick": False, "wall_s": 30.0}]
    assert workshop.run_seconds(rows, "01_x.ipynb", "cpu") == 130.0  # the slowest passed full-size CPU run
    assert workshop.run_seconds(rows, "01_x.ipynb", "gpu") == 30.0
    row = workshop.lesson_row("core", "01_x.ipynb", workshop.Text(), rows)
    assert (row.run, row.gpu_run, row.recorded) == (3, 1, True)  # minutes, rounded up
    assert workshop.lesson_row("core", "02_y.ipynb", workshop.Text(), rows).recorded is False


def test_an_exercises_section_counts_as_exercises_not_reading():
    words = " ".join(["word"] * 180)  # one minute of reading at 180 words per minute
    nb = {"cells": [md(f"## Lesson part\n{words}"), md(f"## Exercises\n{words}\n\n**Exercise 1.** do it"),
                    code("def f():\n    raise NotImplementedError\nprint(check(f))", "exercise"),
                    md("## Summary\nshort")]}
    text = workshop.analyse(nb)
    assert text.exercises == 1
    assert text.words == len(f"Lesson part {words} Summary short".split())  # the Exercises text is not reading
    assert text.code_lines == 0
    assert text.sections["## Exercises"][0] > 180  # still listed under its heading by --sections


def test_the_run_table_says_whether_each_machine_is_current():
    now = {"kvlab": "k" * 64, "notebooks": "n" * 64, "tests": "t" * 64}
    texts = {"00": ("00_a.ipynb", workshop.Text())}
    row = {"notebook": "00_a.ipynb", "passed": True, "quick": False, "wall_s": 30.0, "date": "2026-12-01T10:00:00+00:00"}
    rows = [{**row, "hardware": "CPU: laptop", "device": "cpu", "code_hash": {**now, "combined": "c"}},
            {**row, "hardware": "NVIDIA H200", "device": "cuda", "code_hash": {**now, "kvlab": "old", "combined": "d"}},
            {**row, "hardware": "NVIDIA A100", "device": "cuda"}]
    status = workshop.run_table(texts, rows, now=now).splitlines()[-1]
    assert "CPU: laptop: current (code hash kvlab/ kkkkkkk, notebooks/ nnnnnnn)" in status
    assert "NVIDIA H200: kvlab/ changed since these runs (rows of 2026-12-01)" in status
    assert "NVIDIA A100: code hash not recorded (rows of 2026-12-01)" in status

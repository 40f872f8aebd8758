"""tools/check_lessons.py: passes a lesson within every budget of issue 49 item 4, and fails (exit
1, the broken budget named) on each one broken, on small notebooks written into a temporary
folder."""

import json

import pytest
from tool_module import load_tool

checker = load_tool("check_lessons")
# a function of the package the checker reads with inspect.getsource
SHOWN = "show_source(notebook.lesson_setup)"


def md(text: str) -> dict:
    return {"cell_type": "markdown", "metadata": {}, "source": text}


def code(text: str, *tags: str) -> dict:
    return {"cell_type": "code", "metadata": {"tags": list(tags)}, "source": text, "outputs": [],
            "execution_count": None}


def good_cells() -> list[dict]:
    return [
        md("# 01 · A lesson\n\nWhat you will learn: a loop."),
        code("from kvlab.lab import notebook\nfrom kvlab.lab.notebook import show_source"),
        md("## 1 · The loop\n\nRead the set-up, as exercise 2 will ask."),
        code(SHOWN),
        md("### Exercise 1 · Write it\n\nWrite the loop."),
        code("def f():\n    raise NotImplementedError\n", "exercise"),
        md("### Exercise 2 · Predict, then run\n\n"
           "Like exercise 1, and lesson 04's exercise 3, but predicted."),
        code("prediction = None", "exercise"),
        code("print(prediction)", "exercise"),  # the checker of the same exercise, tagged too
        md("## Summary\n\nA loop."),
    ]


def write(folder, cells_by_name: dict[str, list[dict]], rows: list[dict] | None = None):
    folder.mkdir(exist_ok=True)
    for name, cells in cells_by_name.items():
        nb = {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
        (folder / name).write_text(json.dumps(nb), encoding="utf-8")
    if rows is None:
        rows = [row(name, 60.0) for name in cells_by_name]
    runs = folder / "runs.json"
    runs.write_text(json.dumps({"runs": rows}), encoding="utf-8")
    return ["--runs", str(runs), str(folder)]


def row(name: str, seconds: float, *, passed: bool = True, quick: bool = False,
        hardware: str = "CPU: a test",
        date: str = "2026-12-01T00:00:00+00:00") -> dict:
    return {"notebook": name, "passed": passed, "wall_s": seconds, "quick": quick,
            "hardware": hardware,
            "device": "cpu" if hardware.startswith("CPU") else "cuda", "date": date, "error": None}


def run(args, capsys) -> tuple[int, str]:
    code_ = checker.main(args)
    return code_, capsys.readouterr().out


def test_a_lesson_within_every_budget_passes(tmp_path, capsys):
    status, out = run(write(tmp_path / "nb", {"01_a.ipynb": good_cells()}), capsys)
    assert status == 0, out
    assert "every budget holds" in out and "01_a.ipynb" in out
    printed = checker.check(tmp_path / "nb", tmp_path / "nb" / "runs.json")[0][0].printed
    lesson = json.loads((tmp_path / "nb" / "01_a.ipynb").read_text())
    assert printed == {"1 · The loop": checker.workshop.printed_source(lesson)[3]}
    assert printed["1 · The loop"] > 5


def broken(status: int, out: str, expected: str) -> None:
    assert status == 1, out
    assert expected in out.split("broken budgets:")[-1], out


def test_too_many_words_in_a_lesson(tmp_path, capsys):
    # 1,000 words: over lesson 00's 900, not others'
    many = [md(" ".join(["word"] * 200)) for _ in range(5)]
    status, out = run(write(tmp_path / "a", {"00_a.ipynb": good_cells() + many}), capsys)
    broken(status, out, "00_a.ipynb: prose: 1,")
    status, out = run(write(tmp_path / "b", {"01_a.ipynb": good_cells() + many}), capsys)
    assert status == 0, out
    status, out = run(write(tmp_path / "c", {"01_a.ipynb": good_cells() + many * 3}), capsys)
    broken(status, out, "budget 2,500")


def test_too_many_words_in_all_lessons(tmp_path, capsys):
    # 2,400 words each: within a lesson's budget
    prose = [md(" ".join(["word"] * 240)) for _ in range(10)]
    lessons = {f"0{i}_a.ipynb": good_cells() + prose for i in range(1, 7)}
    status, out = run(write(tmp_path / "nb", lessons), capsys)
    broken(status, out, "all lessons: 14,")
    assert "words of prose, budget 14,000" in out


def test_a_markdown_cell_over_250_words(tmp_path, capsys):
    cells = good_cells() + [md(" ".join(["word"] * 251))]
    status, out = run(write(tmp_path / "nb", {"01_a.ipynb": cells}), capsys)
    broken(status, out, f"markdown cells over 250 words: cell {len(cells) - 1} (251 words)")


def test_too_much_printed_source_in_a_section(tmp_path, capsys):
    cells = good_cells()
    cells.insert(4, md("### A subsection: still section 1"))
    cells.insert(5, code(f"{SHOWN}\n{SHOWN}\n{SHOWN}"))
    status, out = run(write(tmp_path / "nb", {"01_a.ipynb": cells}), capsys)
    broken(status, out, "printed source: ")
    assert "lines in section '1 · The loop', budget 40" in out


def test_a_show_source_it_cannot_resolve(tmp_path, capsys):
    cells = good_cells() + [code("show_source(no_such_function)")]
    status, out = run(write(tmp_path / "nb", {"01_a.ipynb": cells}), capsys)
    broken(status, out, "printed source not found")


@pytest.mark.parametrize("change, expected", [
    (lambda c: c[4].update(source="### Exercise 3 · Write it"),
     "numbered [3, 2] in reading order, expected [1, 2]"),
    (lambda c: c[4].update(source="**Exercise 2 (write the code).** Write it."), "numbered [2, 2]"),
    (lambda c: c[4].update(source="### Write it"),
     "cell 5 is an exercise with no '### Exercise N' heading"),
    (lambda c: c[2].update(source="## 1 · The loop\n\nAs exercise 4 asks."), "cell 2: exercise 4"),
    (lambda c: c[3].update(source=f"{SHOWN}  # see exercise 7"), "cell 3: exercise 7"),
], ids=["out of order", "bold, repeated", "unnumbered", "a mention in prose", "a mention in code"])
def test_exercises_out_of_reading_order_or_unknown(tmp_path, capsys, change, expected):
    cells = good_cells()
    change(cells)
    status, out = run(write(tmp_path / "nb", {"01_a.ipynb": cells}), capsys)
    broken(status, out, expected)


@pytest.mark.parametrize("text, expected", [
    ("Done in the room, after the timings.", "in the room"),
    ("The record in data/attempts/ says so.", "data/attempts"),
    ("the GPU machine has no network", "the GPU machine"),
    ("a CI test compiles both", "CI"),
    ("fixed in aac3d7a", "commit aac3d7a"),
    ("# from 7ed78f2c1b: the old step", "commit 7ed78f2c1b"),
])
def test_bookkeeping_in_a_cell(tmp_path, capsys, text, expected):
    for cell in (md(text), code(text)):
        cells = good_cells() + [cell]
        status, out = run(write(tmp_path / cell["cell_type"], {"01_a.ipynb": cells}), capsys)
        broken(status, out, f"bookkeeping in cell {len(cells) - 1}: {expected}")


def test_words_that_look_like_bookkeeping_but_are_not(tmp_path, capsys):
    cells = good_cells() + [
        md("Civic CIDR 1e10000 deadbeef 12345678 #1f77b4 decided, facade, a cache.")]
    status, out = run(write(tmp_path / "nb", {"01_a.ipynb": cells}), capsys)
    assert status == 0, out


@pytest.mark.parametrize("rows, expected", [
    ([row("01_a.ipynb", 121.0)], "run time: 121 s at full size on CPU: a test, budget 120 s"),
    ([row("01_a.ipynb", 60.0, passed=False)], "the latest full-size CPU run failed"),
    ([], "no full-size CPU row"),
    ([row("01_a.ipynb", 60.0, quick=True), row("01_a.ipynb", 60.0, hardware="NVIDIA H200")],
     "no full-size CPU row"),
    ([row("01_a.ipynb", 60.0, date="2026-12-01T00:00:00+00:00"),
      row("01_a.ipynb", 130.0, date="2026-12-02T00:00:00+00:00")], "run time: 130 s"),
], ids=["too slow", "failed", "no row", "only quick and GPU rows", "the latest row counts"])
def test_the_latest_full_size_cpu_run(tmp_path, capsys, rows, expected):
    status, out = run(write(tmp_path / "nb", {"01_a.ipynb": good_cells()}, rows), capsys)
    broken(status, out, expected)
    if not rows or expected == "no full-size CPU row":
        assert "no row" in out.split("broken budgets:")[0]


def test_an_older_slow_row_does_not_count(tmp_path, capsys):
    rows = [row("01_a.ipynb", 300.0, date="2026-12-01T00:00:00+00:00"),
            row("01_a.ipynb", 90.0, date="2026-12-02T00:00:00+00:00")]
    status, out = run(write(tmp_path / "nb", {"01_a.ipynb": good_cells()}, rows), capsys)
    assert status == 0, out
    assert "90 s / 120 s" in out


def test_an_empty_folder_fails(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    status, out = run(["--runs", str(tmp_path / "none.json"), str(tmp_path / "empty")], capsys)
    broken(status, out, "no lessons")


def test_course_notebooks_meet_budgets(capsys):
    """The course's own lessons, against data/notebook_runs.json's latest full-size CPU rows."""
    status, out = run([], capsys)
    assert status == 0, out

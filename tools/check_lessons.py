"""Check the lessons against the course's budgets (issue 49 item 4) and print what each one spends.

    python tools/check_lessons.py                  # notebooks/, runs from data/notebook_runs.json
    python tools/check_lessons.py FOLDER --runs R  # another folder of NN_*.ipynb, another runs file

Per lesson (every ``NN_*.ipynb`` of the folder; the Colab badge and set-up cells are machinery and
left out):

- **prose**: the words (``len(text.split())``) of its markdown cells, at most ``WORDS["00"]`` for
  lesson 00 and ``WORDS_DEFAULT`` for the others; all lessons together at most ``WORDS_TOTAL``.
- **long cells**: no markdown cell over ``CELL_WORDS`` words.
- **printed source**: the non-blank lines that the ``show_source``/``show_diff`` calls of a section
  display (``inspect.getsource`` of their targets, from the kvlab of this checkout, found as
  ``tools/write_workshop_schedule.py`` finds them), at most ``SECTION_PRINTED_LINES`` a section. A
  section runs from a ``#`` or ``##`` heading to the next one; deeper headings belong to their
  section.
- **exercises**: each exercise (a heading or a bold line starting "Exercise N", or a code cell
  tagged ``exercise`` with none before it) numbered 1, 2, ... n in reading order, and every other
  mention of "exercise N" in the lesson naming one of them (a mention of another lesson's, "lesson
  04's exercise 3", is left alone).
- **bookkeeping**: no commit hash (7 to 40 hex digits, letters and digits mixed) and none of
  ``BOOKKEEPING`` in any cell.
- **run time**: the latest full-size (not quick) CPU row of the notebook in the runs file, passed
  and at most ``RUN_SECONDS`` seconds; "no row" where there is none (a broken budget too: every
  lesson needs its row).

Prints a table, one row per lesson, then each broken budget on a line of its own; exits 1 when any
is broken.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "tools"):  # kvlab of this checkout; tools/ for the workshop tool
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))
import write_workshop_schedule as workshop  # noqa: E402

NOTEBOOKS = ROOT / "notebooks"
RUNS = ROOT / "data" / "notebook_runs.json"

WORDS = {"00": 900}  # a lesson's prose, where it differs from WORDS_DEFAULT
WORDS_DEFAULT = 2_500
WORDS_TOTAL = 14_000
CELL_WORDS = 250
SECTION_PRINTED_LINES = 40
RUN_SECONDS = 120
BOOKKEEPING = ("data/attempts", "in the room", "the GPU machine", "before the bench moved")
CI = re.compile(r"\bCI\b")  # case-sensitive: "CI", not "ci" inside a word
COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
FLOAT = re.compile(r"^\d+e\d+$")  # 1e10000 is a number, not a commit
DEFINITION = re.compile(r"^\s*(?:#{1,6}\s+|\*\*)\s*Exercise\s+(\d+)\b", re.IGNORECASE)
MENTION = re.compile(r"\bexercises?\s+(\d+)\b", re.IGNORECASE)
# just before a mention
OTHER_LESSON = re.compile(r"lesson\s+\d+'s\s+$|lesson\s+\d+\W*$", re.IGNORECASE)
# just after a mention
OTHER_LESSON_AFTER = re.compile(r"^\s*(?:of|in)\s+lesson\s+\d+", re.IGNORECASE)


@dataclass
class Report:
    """One lesson's spending and its broken budgets."""

    name: str
    words: int = 0
    long_cells: list[str] = field(default_factory=list)  # "cell i (w words)"
    printed: dict[str, int] = field(default_factory=dict)  # section title -> printed source lines
    exercises: list[int] = field(default_factory=list)  # the numbers, in reading order
    run: str = "no row"
    problems: list[str] = field(default_factory=list)

    @property
    def lesson(self) -> str:
        return self.name[:2]


def source(cell: dict) -> str:
    text = cell.get("source", "")
    return "".join(text) if isinstance(text, list) else text


def lesson_cells(notebook: dict) -> list[tuple[int, dict]]:
    """``(index, cell)`` of every cell but the Colab machinery; the index counts all cells, as
    Jupyter shows them."""
    return [
        (i, c)
        for i, c in enumerate(notebook.get("cells", []))
        if not set(c.get("metadata", {}).get("tags", []) or []) & workshop.SKIPPED_TAGS
    ]


def headings(text: str):
    """``(level, title)`` of each markdown heading of ``text``, fenced code left out."""
    fenced = False
    for line in text.splitlines():
        if workshop.FENCE.match(line):
            fenced = not fenced
        match = None if fenced else workshop.HEADING.match(line)
        if match:
            yield len(match.group(1)), match.group(2)


def check_prose(report: Report, cells: list[tuple[int, dict]]) -> None:
    budget = WORDS.get(report.lesson, WORDS_DEFAULT)
    for index, cell in cells:
        if cell.get("cell_type") == "markdown":
            words = len(source(cell).split())
            report.words += words
            if words > CELL_WORDS:
                report.long_cells.append(f"cell {index} ({words} words)")
    if report.words > budget:
        report.problems.append(f"prose: {report.words:,} words, budget {budget:,}")
    if report.long_cells:
        report.problems.append(
            f"markdown cells over {CELL_WORDS} words: {', '.join(report.long_cells)}"
        )


def check_printed(report: Report, notebook: dict, cells: list[tuple[int, dict]]) -> None:
    try:
        shown = workshop.printed_source(notebook, report.name)
    except workshop.UnresolvedSource as e:
        report.problems += [f"printed source not found: {p}" for p in e.problems]
        return
    section = "(before the first section)"
    for index, cell in cells:
        if cell.get("cell_type") == "markdown":
            for level, title in headings(source(cell)):
                if level <= 2:
                    section = title
        elif shown.get(index):
            report.printed[section] = report.printed.get(section, 0) + shown[index]
    for title, lines in report.printed.items():
        if lines > SECTION_PRINTED_LINES:
            report.problems.append(
                f"printed source: {lines} lines in section {title!r}, budget "
                f"{SECTION_PRINTED_LINES}"
            )


def mentions(text: str):
    """``(offset, N)`` of the mentions of "exercise N" in ``text`` that name this lesson's
    exercises."""
    for match in MENTION.finditer(text):
        before, after = (
            text[max(0, match.start() - 20) : match.start()],
            text[match.end() : match.end() + 20],
        )
        if not (OTHER_LESSON.search(before) or OTHER_LESSON_AFTER.match(after)):
            yield match.start(1), int(match.group(1))


def check_exercises(report: Report, cells: list[tuple[int, dict]]) -> None:
    pending = False  # an exercise was defined since the last tagged exercise cell
    # the previous cell was a tagged exercise cell (its checker may follow, tagged too)
    after_exercise_cell = False
    referred: list[tuple[int, int]] = []  # (cell, number) of every other mention
    for index, cell in cells:
        markdown = cell.get("cell_type") == "markdown"
        for line in source(cell).splitlines():
            definition = DEFINITION.match(line) if markdown else None
            if definition:
                report.exercises.append(int(definition.group(1)))
                pending = True
            referred += [
                (index, n)
                for offset, n in mentions(line)
                if not (definition and offset == definition.start(1))
            ]
        tagged = not markdown and "exercise" in (cell.get("metadata", {}).get("tags", []) or [])
        if tagged and not pending and not after_exercise_cell:
            report.problems.append(
                f"exercises: cell {index} is an exercise with no '### Exercise N' heading before it"
            )
        if tagged:
            pending = False
        after_exercise_cell = tagged
    expected = list(range(1, len(report.exercises) + 1))
    if report.exercises != expected:
        report.problems.append(
            f"exercises: numbered {report.exercises} in reading order, expected {expected}"
        )
    wrong = [f"cell {i}: exercise {n}" for i, n in referred if n not in set(report.exercises)]
    if wrong:
        report.problems.append(
            f"exercises: mentions of exercises this lesson does not have: {', '.join(wrong)}"
        )


def check_bookkeeping(report: Report, cells: list[tuple[int, dict]]) -> None:
    for index, cell in cells:
        text = source(cell)
        found = [word for word in BOOKKEEPING if word.lower() in text.lower()]
        found += ["CI"] if CI.search(text) else []
        found += [f"commit {h}" for h in COMMIT.findall(text) if not FLOAT.match(h)]
        if found:
            report.problems.append(f"bookkeeping in cell {index}: {', '.join(found)}")


def latest_cpu_row(rows: list[dict], notebook: str) -> dict | None:
    """The latest full-size CPU row of ``notebook`` (by its date), passed or not."""
    mine = [
        r
        for r in rows
        if r.get("notebook") == notebook
        and not r.get("quick")
        and workshop.hardware_kind(r) == "cpu"
    ]
    return max(mine, key=lambda r: str(r.get("date") or ""), default=None)


def check_run(report: Report, rows: list[dict]) -> None:
    row = latest_cpu_row(rows, report.name)
    if row is None:
        report.problems.append(
            "run time: no full-size CPU row in the runs file (tools/run_notebooks.py NN)"
        )
        return
    seconds = row.get("wall_s")
    report.run = (
        "failed"
        if not row.get("passed")
        else "no time"
        if seconds is None
        else f"{float(seconds):.0f} s"
    )
    if not row.get("passed"):
        report.problems.append(
            f"run time: the latest full-size CPU run failed ({row.get('error')})"
        )
    elif seconds is None or float(seconds) > RUN_SECONDS:
        report.problems.append(
            f"run time: {report.run} at full size on {row.get('hardware')}, budget {RUN_SECONDS} s"
        )


def check_lesson(path: Path, rows: list[dict]) -> Report:
    notebook = json.loads(path.read_text(encoding="utf-8"))
    report, cells = Report(path.name), lesson_cells(notebook)
    check_prose(report, cells)
    check_printed(report, notebook, cells)
    check_exercises(report, cells)
    check_bookkeeping(report, cells)
    check_run(report, rows)
    return report


def table(reports: list[Report]) -> str:
    header = (
        "lesson",
        "prose words",
        "cells > 250",
        "most printed/section",
        "exercises",
        "CPU run",
        "ok",
    )
    lines = []
    for r in reports:
        budget = WORDS.get(r.lesson, WORDS_DEFAULT)
        most = max(r.printed.values(), default=0)
        lines.append(
            (
                r.name,
                f"{r.words:,} / {budget:,}",
                str(len(r.long_cells)),
                f"{most} / {SECTION_PRINTED_LINES}",
                ",".join(map(str, r.exercises)) or "-",
                f"{r.run} / {RUN_SECONDS} s",
                "yes" if not r.problems else "NO",
            )
        )
    total = sum(r.words for r in reports)
    lines.append(
        (
            "total",
            f"{total:,} / {WORDS_TOTAL:,}",
            "",
            "",
            "",
            "",
            "yes" if total <= WORDS_TOTAL else "NO",
        )
    )
    widths = [max(len(row[i]) for row in [header, *lines]) for i in range(len(header))]
    fmt = lambda row: "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()  # noqa: E731
    return "\n".join([fmt(header), fmt(tuple("-" * w for w in widths)), *map(fmt, lines)])


def check(folder: Path, runs: Path) -> tuple[list[Report], list[str]]:
    """Every lesson's report, and every broken budget as a line (the total's included)."""
    rows = json.loads(runs.read_text(encoding="utf-8"))["runs"] if runs.exists() else []
    reports = [check_lesson(p, rows) for p in sorted(folder.glob("[0-9][0-9]_*.ipynb"))]
    problems = [f"{r.name}: {p}" for r in reports for p in r.problems]
    total = sum(r.words for r in reports)
    if total > WORDS_TOTAL:
        problems.append(f"all lessons: {total:,} words of prose, budget {WORDS_TOTAL:,}")
    if not reports:
        problems.append(f"no lessons (NN_*.ipynb) in {folder}")
    return reports, problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "folder", nargs="?", type=Path, default=NOTEBOOKS, help="the lessons (default notebooks/)"
    )
    p.add_argument(
        "--runs",
        type=Path,
        default=RUNS,
        help="the recorded runs (default data/notebook_runs.json)",
    )
    args = p.parse_args(argv)
    reports, problems = check(args.folder, args.runs)
    print(table(reports))
    print()
    print(
        "\n".join(["broken budgets:", *(f"  {p}" for p in problems)])
        if problems
        else "every budget holds"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

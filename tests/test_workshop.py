"""tools/write_workshop_schedule.py: INSTRUCTORS.md's schedule block matches the recorded runs and
the notebooks, and the tool's reading time, printed source, optional sections, exercises (in the
room and homework), slack, breaks and verdict do what its docstring says (on tiny fake
notebooks)."""

import inspect
import json
import re
from pathlib import Path

import pytest
from tool_module import load_tool

ROOT = Path(__file__).resolve().parent.parent
workshop = load_tool("write_workshop_schedule")


def md(text: str, *tags: str) -> dict:
    return {"cell_type": "markdown", "metadata": {"tags": list(tags)}, "source": text}


def code(text: str, *tags: str) -> dict:
    return {
        "cell_type": "code",
        "metadata": {"tags": list(tags)},
        "source": text,
        "outputs": [],
        "execution_count": None,
    }


def runs() -> list[dict]:
    return json.loads(workshop.RUNS.read_text(encoding="utf-8"))["runs"]


def test_the_committed_guide_matches_the_data():
    assert workshop.main(["--check"]) == 0, (
        "INSTRUCTORS.md's workshop block is stale: run python tools/write_workshop_schedule.py "
        "--write"
    )


def test_check_fails_on_a_stale_block_and_write_fixes_it(tmp_path):
    guide = tmp_path / "GUIDE.md"
    guide.write_text(
        f"# Guide\n\nbefore\n{workshop.START}\n| stale | table |\n{workshop.END}\nafter\n",
        encoding="utf-8",
    )
    assert workshop.main(["--check", "--guide", str(guide)]) == 1
    assert workshop.main(["--write", "--guide", str(guide)]) == 0
    text = guide.read_text(encoding="utf-8")
    assert (
        "stale" not in text
        and text.startswith("# Guide\n\nbefore\n")
        and text.endswith(f"{workshop.END}\nafter\n")
    )
    assert workshop.main(["--check", "--guide", str(guide)]) == 0


def test_reading_time_and_an_optional_section_on_a_fake_notebook():
    notebook = {
        "cells": [
            md(
                "badge words that are not read", "colab-badge"
            ),  # tools/write_colab_cells.py's cells are left out
            md("# 9 · Title\none two three"),  # 3 + 3 words
            code("import os\n\nprint(os.getcwd())\n", "colab-setup"),
            md("## 1 · Core\nalpha beta gamma delta"),  # 3 + 4 words
            code("a = 1\n\nb = 2\n"),  # 2 lines (blank lines do not count)
            md("## 3 · Something (optional)\n" + "word " * 40),  # optional: 4 + 40 words
            md(
                "### 3a · Deeper, still optional\n" + "word " * 10 + "\n**Exercise 1.** do it"
            ),  # optional: 5 + 10 + 4
            code("c = 3\nd = 4\ne = 5"),  # optional: 3 lines
            md(
                "## 4 · Back\nback to core\n**Exercise 2.** more\n**3.** numbered"
            ),  # 3 + 3 + 3 + 2 words, 2 exercises
            code("f = 6", "exercise"),  # exercise 3's checker: 1 line, not another exercise
        ]
    }
    text = workshop.analyse(notebook)
    assert (text.words, text.code_lines, text.room_exercises, text.homework_exercises) == (
        24,
        3,
        2,
        0,
    )
    assert (text.optional_words, text.optional_code_lines, text.optional_exercises) == (63, 3, 1)
    assert text.optional_sections == ["3 · Something (optional)"]
    assert (
        abs(
            text.reading_minutes
            - (24 / workshop.WORDS_PER_MINUTE + 3 / workshop.CODE_LINES_PER_MINUTE)
        )
        < 1e-12
    )
    assert text.exercise_minutes == 2 * workshop.EXERCISE_MINUTES
    assert abs(text.optional_minutes - workshop.minutes(63, 3, 1)) < 1e-12


def test_optional_mid_cell_by_tag_and_not_inside_a_code_fence():
    notebook = {
        "cells": [
            md(
                "## 1 · Core\nkept\n```\n## not a heading (optional)\n```\n## 2 · Later "
                "(optional)\nskipped words"
            ),
            code("x = 1"),  # inside section 2: optional
            md("# 3 · A higher level ends it\nkept again"),
            md("no heading, tagged: only this cell", "optional"),
            code("y = 2"),  # after the tagged cell: core again
            md("## 4 · Tagged from its heading on\nskipped", "optional"),
            md("### 4a · still inside\nskipped"),
            md("## 5 · Same level ends it\nkept"),
        ]
    }
    text = workshop.analyse(notebook)
    # core: "1 · Core" 3 + "kept" 1 + the fence's 3 lines (7 words) + "3 · A higher level ends it" 7
    # + "kept again" 2
    #       + "5 · Same level ends it" 6 + "kept" 1
    assert (text.words, text.code_lines) == (27, 1)
    # optional: "2 · Later (optional)" 4 + "skipped words" 2 + the tagged cell 6 + "4 · Tagged from
    # its heading on" 7
    #           + "skipped" 1 + "4a · still inside" 4 + "skipped" 1
    assert (text.optional_words, text.optional_code_lines) == (25, 1)
    assert text.optional_sections == ["2 · Later (optional)", "4 · Tagged from its heading on"]


def test_breaks_fall_at_the_boundary_nearest_to_every_hour():
    rows = [workshop.Row("core", f"l{i}", reading=t) for i, t in enumerate([50, 20, 40, 30])]
    plan = [r.label for r in workshop.with_breaks(rows)]
    # 50 | 70 is as far past the hour as 50 is short of it: the break comes first; 20 + 40 = 60:
    # break after
    assert plan == ["l0", "break", "l1", "l2", "break", "l3"]
    assert [r.label for r in workshop.with_breaks(rows[:1])] == [
        "l0"
    ]  # never a break after the last lesson


def test_the_schedule_sums_are_the_sums_of_its_rows():
    texts = workshop.lesson_texts(workshop.NOTEBOOKS)
    plan = workshop.schedule(texts, runs())
    core = plan["core"]
    assert [r.label for r in core if r.lesson] == [
        texts[k][0].removesuffix(".ipynb") for k in workshop.CORE
    ]
    assert [r.label for r in core].count("slack") == 1 and core[
        -1
    ].label == "slack"  # the slack, once, at the end
    for r in core:
        fixed = {"break": workshop.BREAK_MINUTES, "slack": workshop.SLACK_MINUTES}
        assert r.total == (
            fixed[r.label] if not r.lesson else r.run + r.reading + r.printed + r.exercises
        )
    table = workshop.schedule_table(plan, runs())
    cells = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in table.splitlines()
        if line.startswith("| core |")
    ]
    *rows, total = cells
    assert len(rows) == len(core) and total[1] == "**core path total**"
    assert int(total[6].strip("*")) == sum(int(r[6]) for r in rows) == sum(r.total for r in core)
    for column in (
        2,
        3,
        4,
        5,
        7,
        8,
    ):  # run, reading, printed, in-room, homework, optional: sums of the lesson rows
        assert int(total[column]) == sum(
            int(r[column]) for r in rows if r[1] not in ("break", "slack")
        )
    lessons = [r for r in core if r.lesson]
    said = workshop.verdict(plan)
    found = re.search(
        r"the core path \(lessons 01-05\) takes (\d+) minutes on the recorded CPU, "
        r"(?:exactly 180|(\d+) (over|under) 180)",
        said,
    )
    assert found and int(found.group(1)) == sum(r.total for r in core)
    if found.group(2):
        assert int(found.group(2)) == abs(sum(r.total for r in core) - workshop.WORKSHOP_MINUTES)
        assert (found.group(3) == "over") == (
            sum(r.total for r in core) > workshop.WORKSHOP_MINUTES
        )
    parts = re.search(
        r"Its minutes: run time (\d+), reading (\d+) \((\d+) of it printed source\), in-class "
        r"exercises "
        r"(\d+) \((\d+) exercises?\), (\d+) breaks? (\d+), slack (\d+)\.",
        said,
    )
    assert parts
    run, reading, printed, room, room_count, breaks, break_minutes, slack = map(int, parts.groups())
    assert run == sum(r.run for r in lessons) and printed == sum(r.printed for r in lessons)
    assert reading == sum(r.reading + r.printed for r in lessons)
    assert (room, room_count) == (
        sum(r.exercises for r in lessons),
        sum(r.room_count for r in lessons),
    )
    assert (
        breaks == sum(1 for r in core if r.label == "break")
        and break_minutes == breaks * workshop.BREAK_MINUTES
    )
    assert slack == workshop.SLACK_MINUTES
    assert run + reading + room + break_minutes + slack == int(found.group(1))
    without = [r.label for r in lessons if r.room_count == 0]
    for label in without:
        assert f"`{label}`" in said.split("**")[1]
    fits = sum(r.total for r in core) <= workshop.WORKSHOP_MINUTES and not without
    assert said.startswith("**The plan fits:" if fits else "**The plan does not fit:")
    for r in lessons:
        if r.homework_count:
            assert (
                f"{r.label[:2]} {r.homework_count} exercise" in said
                and f"({r.homework} minutes)" in said
            )
    assert (
        "as homework, takes" not in said and "every exercise done in the room" not in said
    )  # the old framing


def test_every_heading_led_exercise_of_the_course_counts_once():
    for name, text in workshop.lesson_texts(workshop.NOTEBOOKS).values():
        for title, (_, _, exercises, _) in text.sections.items():
            if workshop.EXERCISE_HEADING.match(title.lstrip("# ")):
                assert exercises == 1, (name, title)


def test_run_times_are_read_from_the_recorded_runs():
    rows = [
        {
            "notebook": "01_x.ipynb",
            "hardware": "CPU: laptop",
            "device": "cpu",
            "passed": True,
            "quick": False,
            "wall_s": 61.0,
        },
        {
            "notebook": "01_x.ipynb",
            "hardware": "CPU: slower",
            "device": "cpu",
            "passed": True,
            "quick": False,
            "wall_s": 130.0,
        },
        {
            "notebook": "01_x.ipynb",
            "hardware": "CPU: quick run",
            "device": "cpu",
            "passed": True,
            "quick": True,
            "wall_s": 999.0,
        },
        {
            "notebook": "01_x.ipynb",
            "hardware": "CPU: failed",
            "device": "cpu",
            "passed": False,
            "quick": False,
            "wall_s": 500.0,
        },
        {
            "notebook": "01_x.ipynb",
            "hardware": "NVIDIA H200",
            "device": "cuda",
            "passed": True,
            "quick": False,
            "wall_s": 30.0,
        },
    ]
    assert (
        workshop.run_seconds(rows, "01_x.ipynb", "cpu") == 130.0
    )  # the slowest passed full-size CPU run
    assert workshop.run_seconds(rows, "01_x.ipynb", "gpu") == 30.0
    row = workshop.lesson_row("core", "01_x.ipynb", workshop.Text(), rows)
    assert (row.run, row.gpu_run, row.recorded) == (3, 1, True)  # minutes, rounded up
    assert workshop.lesson_row("core", "02_y.ipynb", workshop.Text(), rows).recorded is False


def test_an_exercises_section_counts_as_exercises_not_reading():
    words = " ".join(["word"] * 180)  # one minute of reading at 180 words per minute
    nb = {
        "cells": [
            md(f"## Lesson part\n{words}"),
            md(f"## Exercises\n{words}\n\n**Exercise 1.** do it"),
            code("def f():\n    raise NotImplementedError\nprint(check(f))", "exercise"),
            md("## Summary\nshort"),
        ]
    }
    text = workshop.analyse(nb)
    assert (text.homework_exercises, text.room_exercises, text.optional_exercises) == (
        1,
        0,
        0,
    )  # homework
    assert (
        text.homework_minutes == workshop.WRITE_MINUTES and text.exercise_minutes == 0
    )  # a stub: code to write
    assert text.words == len(
        f"Lesson part {words} Summary short".split()
    )  # the Exercises text is not reading
    assert text.code_lines == 0
    assert text.sections["## Exercises"][0] > 180  # still listed under its heading by --sections


def test_the_run_table_marks_older_code_and_names_no_hash():
    now = {"kvlab": "k" * 64, "notebooks": "n" * 64, "tests": "t" * 64}
    texts = {"00": ("00_a.ipynb", workshop.Text())}
    row = {
        "notebook": "00_a.ipynb",
        "passed": True,
        "quick": False,
        "wall_s": 30.0,
        "date": "2026-12-01T10:00:00+00:00",
        "commit": "abc1234def5678",
    }
    rows = [
        {**row, "hardware": "CPU: laptop", "device": "cpu", "code_hash": {**now, "combined": "c"}},
        {
            **row,
            "hardware": "NVIDIA H200",
            "device": "cuda",
            "code_hash": {**now, "kvlab": "old", "combined": "d"},
        },
        {**row, "hardware": "NVIDIA A100", "device": "cuda"},
    ]
    table = workshop.run_table(texts, rows, now=now)
    line = next(x for x in table.splitlines() if x.startswith("| `00_a`"))
    assert (
        line
        == "| `00_a` | 30 s (0.5 min) | 30 s (0.5 min), older code | 30 s (0.5 min), older code |"
    )  # A100, H200
    assert "abc1234" not in table and "kkkkkkk" not in table and "2026-12-01" in table
    assert '"older code": that run\'s lesson code has changed since.' in table
    current = workshop.run_table(texts, rows[:1], now=now)
    assert "older code" not in current


def test_an_exercise_is_estimated_by_its_note_its_checker_or_its_kind(monkeypatch):
    monkeypatch.setattr(workshop, "EXERCISE_ESTIMATES", {"check_loop": 30})
    nb = {
        "cells": [
            md("## 1 · Body"),
            md("### Exercise 1 · The loop"),
            code(
                "def loop():\n    raise NotImplementedError\nprint(lesson09.check_loop(loop))",
                "exercise",
            ),
            md("### Exercise 2 · A stub not in the table"),
            code("def f():\n    raise NotImplementedError\nprint(lesson09.check_f(f))", "exercise"),
            md("### Exercise 3 · A guess"),
            code("prediction = None\nprint(lesson09.check_guess(prediction))", "exercise"),
            md("### Exercise 4 · A long one, noted (40 min)"),
            code(
                "def g():\n    raise NotImplementedError\nprint(lesson09.check_loop(g))", "exercise"
            ),
        ]
    }
    text = workshop.analyse(nb)
    assert [(e.checker, e.estimate) for e in text.exercises] == [
        ("check_loop", (30, "the tool's table")),
        ("check_f", (workshop.WRITE_MINUTES, "code to write")),
        ("check_guess", (workshop.EXERCISE_MINUTES, "a prediction or a question")),
        ("check_loop", (40, "its heading")),
    ]
    assert text.room_exercises == 4
    assert text.exercise_minutes == 30 + workshop.WRITE_MINUTES + workshop.EXERCISE_MINUTES + 40
    table = workshop.exercise_table({"09": ("09_x.ipynb", text)})
    assert (
        "| 09 | Exercise 1 · The loop | `check_loop` | in class | 30 | the tool's table |" in table
    )


def test_every_checker_in_the_table_is_a_checker_of_the_course():
    from kvlab import exercises

    pattern = re.compile(r"^(?:def (check_\w+)|(check_\w+)\s*=)", re.MULTILINE)
    names = {
        a or b
        for path in Path(exercises.__file__).parent.glob("lesson*.py")
        for a, b in pattern.findall(path.read_text(encoding="utf-8"))
    }
    used = {
        e.checker
        for _, text in workshop.lesson_texts(workshop.NOTEBOOKS).values()
        for e in text.exercises
    }
    stale = set(workshop.EXERCISE_ESTIMATES) - names - used
    assert not stale, f"EXERCISE_ESTIMATES names checkers the course no longer has: {sorted(stale)}"


def test_the_block_is_readable_no_line_over_300_and_prose_wrapped():
    block = workshop.render(workshop.lesson_texts(workshop.NOTEBOOKS), runs())
    for line in block.splitlines():
        assert len(line) <= 300, line[:80]
        if not line.startswith("|"):
            assert len(line) <= workshop.WRAP, line[:80]
    optional = [line for line in block.splitlines() if line.startswith("- **")]
    plan = workshop.schedule(workshop.lesson_texts(workshop.NOTEBOOKS), runs())
    assert len(optional) == sum(
        1 for part in plan.values() for r in part if r.lesson and r.optional_sections
    )
    assert (
        workshop.wrapped("- " + "word " * 100).splitlines()[1].startswith("  word")
    )  # a list item continues


# ------------------------------------------------------------------------------------- the source
# lessons print


def nonblank(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.strip())


def test_printed_source_counts_the_lines_show_source_displays():
    from kvlab.lab.measure import cache_bytes

    imports = code(
        "from kvlab.lab.notebook import show_source\nfrom kvlab.lab.measure import cache_bytes"
    )
    shown = workshop.analyse(
        {"cells": [md("## 1 · Core"), imports, code("show_source(cache_bytes)")]}
    )
    plain = workshop.analyse(
        {"cells": [md("## 1 · Core"), imports, code("print(cache_bytes)")]}
    )  # the same one line
    n = nonblank(inspect.getsource(cache_bytes))
    assert n > 0
    assert (
        shown.sections["## 1 · Core"][1] == plain.sections["## 1 · Core"][1] + n
    )  # --sections' code lines
    assert shown.sections["## 1 · Core"][3] == n and plain.sections["## 1 · Core"][3] == 0
    assert (shown.printed_lines, shown.code_lines) == (
        n,
        plain.code_lines,
    )  # its own column, not the cells' code
    assert abs(shown.printed_minutes - n / workshop.CODE_LINES_PER_MINUTE) < 1e-12
    row = workshop.lesson_row("core", "01_x.ipynb", shown, [])
    assert (
        row.printed == workshop.up(n / workshop.CODE_LINES_PER_MINUTE)
        and row.total == row.reading + row.printed
    )
    # in an optional section: left out with it
    optional = workshop.analyse(
        {"cells": [md("## 2 · Deep (optional)"), imports, code("show_source(cache_bytes)")]}
    )
    assert (optional.printed_lines, optional.optional_printed_lines) == (0, n)
    assert (
        abs(optional.optional_minutes - workshop.minutes(4, 2 + 1 + n, 0)) < 1e-12
    )  # the heading's 4 words


def test_show_diff_counts_the_lines_of_the_diff_it_displays(monkeypatch):
    import IPython.display

    from kvlab import decoding, handwritten
    from kvlab.lab import notebook

    displayed = []
    monkeypatch.setattr(IPython.display, "display", lambda obj: displayed.append(obj.data))
    imports = code(
        "from kvlab import decoding, handwritten\nfrom kvlab.lab.notebook import show_diff"
    )
    for call, kwargs in (
        ("show_diff(decoding.decode_naive, handwritten.decode_handwritten)", {}),
        (
            "show_diff(decoding.decode_naive, handwritten.decode_handwritten, context=3)",
            {"context": 3},
        ),
    ):
        displayed.clear()
        notebook.show_diff(decoding.decode_naive, handwritten.decode_handwritten, **kwargs)
        assert workshop.printed_source({"cells": [imports, code(call)]}) == {
            1: nonblank(displayed[0])
        }
    both = nonblank(inspect.getsource(decoding.decode_naive)) + nonblank(
        inspect.getsource(handwritten.decode_handwritten)
    )
    assert (
        workshop.printed_source({"cells": [imports, code(call)]})[1] != both
    )  # the diff, not both sources


def test_a_def_or_class_of_the_notebook_is_counted_from_its_own_source():
    nb = {
        "cells": [
            code("from kvlab.lab.notebook import show_source"),
            code(
                "def helper(x):\n\n    return x + 1\n\n\nclass Box:\n    size = 1\n\n    def "
                "grow(self):\n        return 2\n"
            ),
            code("show_source(helper)\nshow_source(Box.grow)\nshow_source(Box)"),
        ]
    }
    assert workshop.printed_source(nb) == {2: 2 + 2 + 4}


def test_a_display_inside_the_notebooks_own_function_is_counted_at_each_call():
    from kvlab import failures
    from kvlab.lab.measure import cache_bytes

    n = nonblank(inspect.getsource(cache_bytes))
    nb = {
        "cells": [
            md("## 1 · Where it is defined"),
            code(
                "from kvlab.lab.notebook import show_source\nfrom kvlab.lab.measure import "
                "cache_bytes\n\n"
                "def explain():\n    show_source(cache_bytes)\n"
            ),
            md("## 2 · Where it runs"),
            code("explain()\nexplain()"),
        ]
    }
    text = workshop.analyse(nb)
    assert (
        text.sections["## 1 · Where it is defined"][3] == 0
        and text.sections["## 2 · Where it runs"][3] == 2 * n
    )
    # lesson 04's show(result): the scenario that made result, through RUNTIME_SHOWN
    scenario = {
        "cells": [
            code("from kvlab import failures\nfrom kvlab.lab.notebook import show_source"),
            code(
                "def show(result):\n    spec = failures.SCENARIOS.get(result.name, "
                "failures.CONTROL_SPEC)\n"
                '    show_source(spec["fn"])\n'
            ),
            code('pad = failures.run("padding-pollution", model, qa, N)\nshow(pad)'),
            code("control = failures.run(failures.CONTROL, model, qa, N)\nshow(control)"),
        ]
    }
    assert workshop.printed_source(scenario) == {
        2: nonblank(inspect.getsource(failures.padding_pollution)),
        3: nonblank(inspect.getsource(failures.control_rewound)),
    }


def test_an_unresolved_argument_is_an_error_naming_the_lesson_cell_and_expression(tmp_path, capsys):
    cells = [
        md("## 1 · Core"),
        code("from kvlab.lab.notebook import show_source\nthing = make_thing()"),
        code("show_source(thing.method)"),
    ]
    with pytest.raises(workshop.UnresolvedSource) as raised:
        workshop.analyse({"cells": cells}, "01_x")
    assert len(raised.value.problems) == 1 and "01_x cell 2" in raised.value.problems[0]
    assert "thing.method" in raised.value.problems[0]
    local = [
        code("from kvlab.lab.notebook import show_source\n\ndef f(obj):\n    show_source(obj)\n"),
        code("f(len)"),
    ]
    with pytest.raises(
        workshop.UnresolvedSource, match=r"02_y cell 1 \(in f, defined in cell 0\).*local to f\(\)"
    ):
        workshop.analyse({"cells": local}, "02_y")
    (tmp_path / "01_x.ipynb").write_text(json.dumps({"cells": cells}), encoding="utf-8")
    assert workshop.main(["--notebooks-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "01_x cell 2" in err and "show_source(thing.method)" in err


# ------------------------------------------------------------------------------ in the room,
# homework, optional


def test_exercises_in_the_room_as_homework_and_optional():
    nb = {
        "cells": [
            md(
                "## 1 · Body\ntext\n\n**Exercise 1 · Predict, then run** (before the answer)"
            ),  # in the room
            code("prediction = None", "exercise"),  # its checker
            md(
                "### Exercise 2 · The whole loop, by hand\nWrite it."
            ),  # in the room, led by its heading
            code(
                "def loop():\n    raise NotImplementedError", "exercise"
            ),  # its checker: the exercise counts once
            md("## 2 · Deep (optional)\n**Exercise 3.** optional"),  # optional
            md("## Exercises\n**Exercise 4.** homework\n\n**5.** numbered homework"),  # homework
            code("answer = None", "exercise"),  # exercise 5's checker
        ]
    }
    text = workshop.analyse(nb)
    assert (text.room_exercises, text.homework_exercises, text.optional_exercises) == (2, 2, 1)
    assert text.sections["### Exercise 2 · The whole loop, by hand"][2] == 1
    assert text.parts == {
        "## 1 · Body": "core",
        "### Exercise 2 · The whole loop, by hand": "core",
        "## 2 · Deep (optional)": "optional",
        "## Exercises": "homework",
    }
    # each at its own estimate: a prediction, then a stub to fill in (no checker named: by kind)
    assert [(e.part, e.stub, e.minutes) for e in text.exercises] == [
        ("core", False, workshop.EXERCISE_MINUTES),
        ("core", True, workshop.WRITE_MINUTES),
        ("optional", False, workshop.EXERCISE_MINUTES),
        ("homework", False, workshop.EXERCISE_MINUTES),
        ("homework", False, workshop.EXERCISE_MINUTES),
    ]
    row = workshop.lesson_row("core", "05_x.ipynb", text, [])
    assert (row.exercises, row.room_count) == (
        workshop.EXERCISE_MINUTES + workshop.WRITE_MINUTES,
        2,
    )
    assert (row.homework, row.homework_count) == (2 * workshop.EXERCISE_MINUTES, 2)
    assert row.total == row.reading + row.printed + row.exercises  # homework and optional left out


def fake_texts(room: dict[str, int]) -> dict:
    """Lessons 00-07 with 30 minutes of reading each, ``room[lesson]`` in-class exercises, one
    homework exercise."""
    texts = {}
    for lesson in (*workshop.PRE_WORK, *workshop.CORE, *workshop.SEPARATE):
        text = workshop.Text(
            words=30 * workshop.WORDS_PER_MINUTE,
            room_exercises=room.get(lesson, 0),
            homework_exercises=1,
        )
        texts[lesson] = (f"{lesson}_l.ipynb", text)
    return texts


def test_the_slack_is_counted_once_in_the_core_path():
    plan = workshop.schedule(fake_texts({k: 1 for k in workshop.CORE}), [])
    core = plan["core"]
    assert [r.label for r in core].count("slack") == 1 and core[-1].label == "slack"
    lessons = [r for r in core if r.lesson]
    breaks = [r for r in core if r.label == "break"]
    assert sum(r.total for r in core) == (
        sum(r.total for r in lessons)
        + len(breaks) * workshop.BREAK_MINUTES
        + workshop.SLACK_MINUTES
    )
    assert sum(r.gpu_total for r in core) == sum(
        r.total for r in core
    )  # no runs recorded: 0 on both
    assert all(r.label != "slack" for r in plan["pre-work"] + plan["separate session"])
    assert workshop.with_breaks(lessons) == core[:-1]  # the slack does not move a break


def test_the_verdict_names_a_core_lesson_without_an_in_room_exercise():
    # 5 lessons of 35 minutes, 2 breaks, 15 of slack: 210 minutes, over 180
    over = workshop.verdict(workshop.schedule(fake_texts({k: 1 for k in workshop.CORE}), []))
    assert over.startswith(
        "**The plan does not fit: the core path (lessons 01-05) takes 210 minutes on the recorded "
        "CPU, 30 over 180, and every core lesson has an in-class exercise.**"
    )
    assert (
        "Its minutes: run time 0, reading 150 (0 of it printed source), in-class exercises 25 (5 "
        "exercises), "
        "2 breaks 20, slack 15."
    ) in over
    assert (
        "Homework, the exercises of the lessons' Exercises sections, left out of class (25 "
        "minutes): "
        "01 1 exercise (5 minutes); 02 1 exercise (5 minutes)"
    ) in over
    assert "Pre-work (lesson 00): 30 minutes, and 5 of homework (1 exercise)." in over
    # lessons 01 and 03 without one: 200 minutes, still over, and both named
    lacking = workshop.verdict(workshop.schedule(fake_texts({"02": 1, "04": 1, "05": 1}), []))
    assert lacking.startswith(
        "**The plan does not fit: the core path (lessons 01-05) takes 200 minutes on the recorded "
        "CPU, 20 over 180, and `01_l`, `03_l` have no in-class exercise.**"
    )
    # a total that fits does not make the plan fit while a lesson has no in-class exercise
    short = fake_texts({k: 1 for k in workshop.CORE if k != "04"})
    for lesson in workshop.CORE:
        short[lesson][1].words = 20 * workshop.WORDS_PER_MINUTE
    said = workshop.verdict(workshop.schedule(short, []))
    total = sum(r.total for r in workshop.schedule(short, [])["core"])
    assert total <= workshop.WORKSHOP_MINUTES
    assert said.startswith(
        f"**The plan does not fit: the core path (lessons 01-05) takes {total} minutes on the "
        f"recorded CPU, {workshop.WORKSHOP_MINUTES - total} under 180, but `04_l` has no in-class "
        "exercise.**"
    )
    short["04"][1].room_exercises = 1
    assert workshop.verdict(workshop.schedule(short, [])).startswith(
        "**The plan fits: the core path"
    )


def test_an_alias_of_a_package_name_is_followed():
    from kvlab import handwritten

    nb = {
        "cells": [
            code("from kvlab import handwritten\nfrom kvlab.lab.notebook import show_source"),
            code(
                "cache_class = "
                "handwritten.HandwrittenCache\nshow_source(cache_class.get_seq_length)"
            ),
        ]
    }
    lines = nonblank(inspect.getsource(handwritten.HandwrittenCache.get_seq_length))
    assert workshop.printed_source(nb) == {1: lines}


def test_printed_source_is_kept_on_disk_and_read_back_instead_of_imported(tmp_path, monkeypatch):
    """Counting printed source imports kvlab and transformers (~10 s a call); the checks that run
    this tool in a subprocess read the count back from $KVLAB_CACHE instead."""
    folder = tmp_path / "notebooks"
    folder.mkdir()
    notebook = {"cells": [code("import kvlab\nfrom kvlab.lab.notebook import show_source"),
                          code("show_source(kvlab.decode)")]}
    (folder / "00_x.ipynb").write_text(json.dumps(notebook), encoding="utf-8")
    monkeypatch.setenv("KVLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(workshop, "_TEXTS", {})
    counted = workshop.lesson_texts(folder)["00"][1]
    assert len(list((tmp_path / "cache" / "printed_source").glob("*.json"))) == 1
    assert workshop.printed_source(notebook)[1] > 0

    def never(*args, **kwargs):
        raise AssertionError("counted again")

    monkeypatch.setattr(workshop, "_TEXTS", {})
    monkeypatch.setattr(workshop, "printed_source", never)
    assert workshop.lesson_texts(folder)["00"][1] == counted


def test_the_printed_source_kept_on_disk_is_keyed_by_what_it_depends_on(tmp_path, monkeypatch):
    package = tmp_path / "kvlab"
    package.mkdir()
    (package / "__init__.py").write_text("def decode(): pass\n")
    spec = type("Spec", (), {"submodule_search_locations": [str(package)]})()
    monkeypatch.setattr(workshop.importlib.util, "find_spec", lambda name: spec)
    keys = [workshop._printed_source_key("notebook")]
    (package / "__init__.py").write_text("def decode():\n    return 1\n")
    keys.append(workshop._printed_source_key("notebook"))
    keys.append(workshop._printed_source_key("another notebook"))
    version = workshop.importlib.metadata.version
    monkeypatch.setattr(workshop.importlib.metadata, "version",
                        lambda name: "0.0" if name == "transformers" else version(name))
    keys.append(workshop._printed_source_key("another notebook"))
    assert len(set(keys)) == 4, keys
    monkeypatch.setattr(workshop.importlib.util, "find_spec", lambda name: None)
    assert workshop._printed_source_key("notebook") is None

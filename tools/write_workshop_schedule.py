"""Plan a workshop from the course itself: minutes per lesson from the recorded runs and the
notebooks' own text.

    python tools/write_workshop_schedule.py              # print the run-time table and the schedule
    python tools/write_workshop_schedule.py --write      # rewrite INSTRUCTORS.md's workshop block
    python tools/write_workshop_schedule.py --check      # exit 1 if the block is stale
    python tools/write_workshop_schedule.py --sections   # minutes per section of every lesson

Per lesson (a notebook of notebooks/, named by its two-digit prefix):

- **run time**: ``wall_s`` of the passed, full-size (``quick`` false) rows of
  ``data/notebook_runs.json``, the file ``tools/run_notebooks.py`` writes. A row is a CPU row when
  its hardware starts with "CPU" (or its device is "cpu"), a GPU row when its hardware names NVIDIA
  or H200 (or its device is "cuda"). The schedule uses the slowest recorded CPU run of each lesson:
  a workshop runs on laptops. A run time is kept whole: a notebook runs end to end.
- **reading**: the words of the markdown cells at ``WORDS_PER_MINUTE`` plus the non-blank lines of
  the code cells at ``CODE_LINES_PER_MINUTE``. The Colab badge and set-up cells (tagged by
  ``tools/write_colab_cells.py``) are left out: they are machinery, not lesson. Other output
  (printed tables, plots, the docstrings ``show_doc`` displays) is not counted, so reading stays a
  lower bound.
- **printed source**: the package code a lesson displays with ``kvlab.lab.notebook.show_source``
  (``inspect.getsource`` of each argument) and ``show_diff`` (a unified diff of two functions'
  sources) is read too, though it is not in the notebook's text: the non-blank lines each call
  displays count as code lines at ``CODE_LINES_PER_MINUTE``, in the section (optional or not) of the
  cell that makes the call. For ``show_diff`` the lines counted are those of the diff as
  ``show_diff`` builds it (``difflib.unified_diff`` with the call's ``context``, by default the one
  ``show_diff``'s signature gives; the ``---``/``+++``/``@@`` lines included), not both sources
  whole. To know what a call displays, each notebook's code cells are parsed with ``ast`` and walked
  in order: every top-level ``import`` and ``from ... import`` is executed in a fresh namespace of
  that notebook (so kvlab and transformers are imported), and a top-level alias (``name =
  module.Attribute``, a dotted name) is evaluated there, and each argument expression
  (``ast.unparse``) is evaluated there when its cell is reached. An argument that is not found so, a
  name the notebook defines itself, is looked up among the notebook's own top-level
  ``def``/``class`` nodes (``Name`` or ``Name.attribute``), and the lines of that node counted. A
  call inside a function the notebook defines displays only when that function is called: it is
  counted at every call of the function in the notebook, in the calling cell's section; an argument
  that names the function's own local values is looked up in ``RUNTIME_SHOWN`` (lesson 04's
  ``show(result)``, which displays the source of the scenario that made ``result``). Anything still
  unresolved is an error: the tool names the lesson, the cell (its 0-based index in the notebook)
  and the expression, and exits 1, rather than counting 0. The counts are kept on disk
  (``_counted_printed_source``) by what they depend on: the notebook's text, this tool, kvlab's
  source and the installed transformers and torch.
- **exercises**: each at its own estimate (``Exercise.estimate``): a "(N min)" note in its heading
  or bold line, else ``EXERCISE_ESTIMATES`` keyed by the checker its code cell calls
  (``lessonNN.check_NAME``: robust to renumbered lessons and exercises), else ``WRITE_MINUTES`` for
  a stub to fill in and ``EXERCISE_MINUTES`` for a prediction, a number or a question. An exercise
  is a markdown line that starts with ``**Exercise`` (lessons 00-02 write "**Exercise 1.**", lesson
  05 "**Exercise 1 · Predict, then run**") or with a bold number ``**1.**`` (lessons 03-06 write
  their Exercises sections so), a heading whose title starts with "Exercise" and a number ("###
  Exercise 4 · The whole loop, by hand"), or a cell tagged "exercise" that holds no such line (a
  code cell so tagged right after a counted exercise is taken as its checker, not a new exercise, so
  a heading-led exercise and its tagged code cell count once). Where an exercise is decides who does
  it:
  - **homework**: an exercise in a lesson's "Exercises" section (a heading whose title ends with
    "Exercises", until the next heading of the same or a higher level). The section's words and
    code are part of its exercises' minutes, not of reading, and the homework is left out of
    class's total, listed per lesson apart.
  - **in class**: an exercise anywhere else (the lesson body) that is not in an optional section.
    Its minutes are part of the lesson's total; its text is also counted as reading (where it ends
    is not marked), so the total is on the safe side.
- **optional sections**: a heading line that ends with "(optional)", or a cell tagged "optional"
  (from its first heading on, or the whole cell), starts an optional section; it lasts until the
  next heading of the same or a higher level (fewer ``#``). Reading, printed source and exercises
  inside it are left out of the core path and shown apart.

Every column is rounded up to whole minutes, and a lesson's total is the sum of its rounded columns
(run, reading, printed source, in-class exercises), so the schedule's sums are the sums of the
numbers it shows.

The workshop: lesson 00 is pre-work, lessons 01-05 are the core path, with a ``BREAK_MINUTES`` break
at the lesson boundary where the time since the last break comes nearest to ``BREAK_EVERY_MINUTES``,
and ``SLACK_MINUTES`` of slack once at its end, kept for the instructor and set-up problems; lesson
06 is a session of its own. The core path's total is run time + reading (markdown, code and printed
source) + in-class exercises + breaks + slack, and the plan fits only when that total is at most
``WORKSHOP_MINUTES`` and every core lesson has at least one exercise done in class. The block
written into INSTRUCTORS.md holds the run-time table (with whether each machine's rows are current:
their ``code_hash`` against this checkout's, ``tools/code_hash.py``), the schedule and the verdict:
the core path's minutes, whether and by how much it fits ``WORKSHOP_MINUTES``, the core lessons
without an in-class exercise, the GPU variant and the homework left out; then the optional sections
as a list per lesson and every exercise with its minutes. Its prose is wrapped at ``WRAP``
characters (no line of the guide over 300). Every number in it is read from the data and the
notebooks, never typed.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import hashlib
import importlib.metadata
import importlib.util
import inspect
import json
import math
import os
import re
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

# tools/, also when this file is loaded by its path
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.append(str(Path(__file__).resolve().parent))
import code_hash  # noqa: E402
import write_readme_runs  # noqa: E402  (is_current, OLDER: the README marks older code so too)

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
RUNS = ROOT / "data" / "notebook_runs.json"
GUIDE = ROOT / "INSTRUCTORS.md"
START, END = "<!-- workshop:start -->", "<!-- workshop:end -->"

# An assumption, not a measurement of this course: Brysbaert's meta-analysis of reading rates ("How
# many words do we read per minute?", Journal of Memory and Language 109, 2019) puts silent reading
# of English non-fiction by adults at about 238 words per minute; technical prose thick with code
# names, numbers and formulas is read more slowly, and we take 180, about three quarters of it.
WORDS_PER_MINUTE = 180
# An assumption: a student reads a line of a lesson's code (its own cells' or the source they print)
# in about 6 seconds: 600 lines an hour, a little above the few hundred lines an hour that
# code-review studies (SmartBear's study of reviews at Cisco, "Best Kept Secrets of Peer Code
# Review", 2006) give as the most a careful reader takes in.
CODE_LINES_PER_MINUTE = 10
# Minutes for one exercise (read it, work it out, run the checker, read its hint once), estimated
# per exercise by what it asks, keyed by its checker's name (``lessonNN.check_NAME(...)`` in its
# code cell): robust to renumbered lessons and exercises. A "(N min)" in the exercise's heading or
# bold line overrides the table; an exercise missing from both counts WRITE_MINUTES if its cell
# holds a stub to fill in (``raise NotImplementedError``), else EXERCISE_MINUTES (a prediction, a
# number or a question to think about). Estimates, not measurements: change them after a workshop.
EXERCISE_MINUTES = 5
WRITE_MINUTES = 10
EXERCISE_ESTIMATES = {
    # lesson 00
    "check_parameter_count": 10, "check_chat_ids": 10,
    # lesson 01: a loop; the FLOPs of every part of a pass
    "check_naive_decode": 10, "check_step_flops": 15,
    # lesson 02
    "check_attend": 10, "check_cache_update": 15, "check_cache_bytes": 5,
    "check_cached_positions": 5,
    # lesson 03
    "check_decode_step": 15, "check_reset_in_place": 10, "check_static_cache_bytes": 5,
    # lesson 04: a whole capture-and-replay loop; one fix for two scenarios
    "check_graph_decode": 25, "check_put_back": 15,
    # lesson 05: the whole graph-safe loop by hand, before the rules
    "check_graph_loop": 30, "check_write_positions": 10, "check_write_valid": 15,
    "check_launch_cost_us": 5,
    # lesson 06
    "check_tokens_per_s": 5, "check_step_floor_ms": 10, "check_padding_rows": 5,
    "check_norm_matmul": 15,
    # lesson 07
    "check_kept_drafts": 15, "check_draft": 15, "check_slots": 10, "check_blocks_held": 5,
}  # fmt: skip
BREAK_MINUTES = 10
BREAK_EVERY_MINUTES = 60
# A choice, not a measurement: minutes of the core path kept for the instructor and set-up problems
# (a laptop that will not start the kernel, a question that takes the class), counted once.
SLACK_MINUTES = 15
WORKSHOP_MINUTES = 180

# each of SEPARATE: a session of its own
PRE_WORK, CORE, SEPARATE = ("00",), ("01", "02", "03", "04", "05"), ("06", "07")
# tools/write_colab_cells.py's cells: not part of any lesson's reading
SKIPPED_TAGS = {"colab-badge", "colab-setup"}

HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")
EXERCISE_LINE = re.compile(r"^\s*\*\*(Exercise\b|\d+\.\*\*)")
# a heading's title: "Exercise 4 · The whole loop, by hand"
EXERCISE_HEADING = re.compile(r"^\**Exercise\s+\d")
CHECKER = re.compile(r"\blesson\w*\.(check_\w+)\s*\(")  # the checker an exercise's code cell calls
# "(20 min)" in an exercise's heading or bold line
MINUTES_NOTE = re.compile(r"\((\d+)\s*min(?:utes)?\)")
STUB = re.compile(r"raise\s+NotImplementedError")
# an IPython magic or shell line: not Python, blanked before a cell is parsed
MAGIC = re.compile(r"^\s*[%!]")
# kvlab.lab.notebook's functions that display package source
DISPLAYS = ("show_source", "show_diff")


# ------------------------------------------------------------------------- the source lessons print


class UnresolvedSource(Exception):
    """Arguments of show_source/show_diff calls whose source the tool cannot find; ``problems``
    lists each."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


def _scenario_shown(site: ast.Call, assigned: dict[str, ast.expr], namespace: dict) -> object:
    """Lesson 04's ``show(result, ...)`` displays ``failures.SCENARIOS.get(result.name,
    failures.CONTROL_SPEC)["fn"]``: the function of the scenario whose run made ``result``. The
    call's ``result`` must be a name the notebook assigns from ``failures.run(NAME, ...)``; a run's
    result carries the name it was run by, so the function shown is NAME's."""
    from kvlab import failures

    arg = site.args[0] if site.args else None
    value = assigned.get(arg.id) if isinstance(arg, ast.Name) else None
    if not (
        isinstance(value, ast.Call)
        and ast.unparse(value.func) in ("failures.run", "kvlab.failures.run")
        and value.args
    ):
        raise LookupError(
            "its first argument is not a name the notebook assigns from failures.run(NAME, ...)"
        )
    name = eval(ast.unparse(value.args[0]), namespace)  # noqa: S307 - the notebook's own expression
    return failures.SCENARIOS.get(name, failures.CONTROL_SPEC)["fn"]


# (the notebook's function, the argument expression as ast.unparse writes it) -> what the call
# displays at one call of that function: f(the call of the function, the notebook's top-level
# assignments so far, the notebook's namespace).
RUNTIME_SHOWN = {("show", "spec['fn']"): _scenario_shown}


def _nonblank(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.strip())


def _display_name(call: ast.Call) -> str | None:
    func = call.func
    name = (
        func.id
        if isinstance(func, ast.Name)
        else func.attr
        if isinstance(func, ast.Attribute)
        else None
    )
    return name if name in DISPLAYS else None


def _calls(node: ast.AST, inside: bool = False):
    """(call, whether it sits inside a def or lambda under ``node``) for every call under ``node``,
    in order."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Call):
            yield child, inside
        yield from _calls(
            child, inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        )


def _dotted(expr: ast.expr) -> list[str] | None:
    if isinstance(expr, ast.Name):
        return [expr.id]
    if isinstance(expr, ast.Attribute):
        head = _dotted(expr.value)
        return None if head is None else [*head, expr.attr]
    return None


def _local_names(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    a = function.args
    names = {
        x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, [a.vararg, a.kwarg])]
    }
    return names | {
        n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }


@dataclass
class _Notebook:
    """What resolving one notebook's displays needs: its namespace, its own defs, its assignments so
    far."""

    name: str
    namespace: dict = field(default_factory=dict)
    defs: dict = field(
        default_factory=dict
    )  # top-level def/class name -> (its cell's source lines, the node)
    assigned: dict = field(
        default_factory=dict
    )  # top-level ``name = value`` so far -> the value's expression
    displayers: dict = field(
        default_factory=dict
    )  # the notebook's functions that display -> (def cell, node)
    failed_imports: list = field(default_factory=list)
    problems: list = field(default_factory=list)

    def source(
        self, expr: ast.expr, *, function=None, site: ast.Call | None = None
    ) -> tuple[str, str]:
        """(the source text ``expr`` names, its name for a diff header); raises LookupError with the
        reason."""
        text = ast.unparse(expr)
        used = {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)}
        if function is not None and used & _local_names(function):
            resolver = RUNTIME_SHOWN.get((function.name, text))
            if resolver is None:
                raise LookupError(
                    f"it names {', '.join(sorted(used & _local_names(function)))}, local to "
                    f"{function.name}(), and RUNTIME_SHOWN has no entry for ({function.name!r}, "
                    f"{text!r})"
                )
            obj = resolver(site, self.assigned, self.namespace)
            return inspect.getsource(obj), getattr(obj, "__qualname__", text)
        try:
            obj = eval(text, self.namespace)  # noqa: S307 - the notebook's own expression, over its own imports
        except Exception as e:  # noqa: BLE001 - any failure: try the notebook's own defs next
            node = self.own_node(expr)
            if node is None:
                hint = (
                    f"; imports that failed: {'; '.join(self.failed_imports)}"
                    if self.failed_imports
                    else ""
                )
                raise LookupError(
                    f"{type(e).__name__}: {e}, and it is not a def/class of the notebook{hint}"
                ) from e
            lines, node = node
            first = min([d.lineno for d in node.decorator_list] + [node.lineno])
            return "\n".join(lines[first - 1 : node.end_lineno]), text
        try:
            return inspect.getsource(obj), getattr(obj, "__qualname__", text)
        except (TypeError, OSError) as e:
            raise LookupError(f"inspect.getsource: {e}") from e

    def own_node(self, expr: ast.expr):
        path = _dotted(expr)
        if not path or path[0] not in self.defs:
            return None
        lines, node = self.defs[path[0]]
        for part in path[1:]:
            node = next(
                (
                    n
                    for n in getattr(node, "body", [])
                    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                    and n.name == part
                ),
                None,
            )
            if node is None:
                return None
        return lines, node

    def displayed(
        self, call: ast.Call, where: str, *, function=None, site: ast.Call | None = None
    ) -> int:
        """Non-blank lines that one show_source/show_diff ``call`` displays (0, with a problem
        noted, if unknown)."""

        def problem(expr_text: str, reason: str) -> int:
            self.problems.append(
                f"{where}: {ast.unparse(call)}: cannot find the source of {expr_text} ({reason})"
            )
            return 0

        if any(isinstance(a, ast.Starred) for a in call.args):
            return problem(ast.unparse(call), "a starred argument")
        sources = []
        for arg in call.args:
            try:
                sources.append(self.source(arg, function=function, site=site))
            except Exception as e:  # noqa: BLE001 - reported, with the lesson, the cell and the expression
                return problem(ast.unparse(arg), str(e) or type(e).__name__)
        if _display_name(call) == "show_source":
            return sum(_nonblank(text) for text, _ in sources)
        if len(sources) != 2:
            return problem(ast.unparse(call), "show_diff takes two functions")
        from kvlab.lab.notebook import show_diff

        context = inspect.signature(show_diff).parameters["context"].default
        for keyword in call.keywords:
            if keyword.arg == "context":
                try:
                    context = eval(ast.unparse(keyword.value), self.namespace)  # noqa: S307
                except Exception as e:  # noqa: BLE001
                    return problem(ast.unparse(keyword.value), f"{type(e).__name__}: {e}")
        (old, old_name), (new, new_name) = sources
        return sum(
            1
            for line in difflib.unified_diff(
                old.splitlines(), new.splitlines(), old_name, new_name, lineterm="", n=context
            )
            if line.strip()
        )


def _code_trees(notebook: dict, problems: list[str], name: str):
    """(cell index, the cell's source lines, its parsed tree) for every lesson code cell (magic
    lines blanked)."""
    for index, cell in enumerate(notebook.get("cells", [])):
        if cell.get("cell_type") != "code" or _tags(cell) & SKIPPED_TAGS:
            continue
        lines = ["" if MAGIC.match(line) else line for line in _source(cell).splitlines()]
        try:
            yield index, lines, ast.parse("\n".join(lines))
        except SyntaxError as e:
            if any(d in _source(cell) for d in DISPLAYS):
                problems.append(
                    f"{name} cell {index}: the cell does not parse ({e.msg}), and it names "
                    f"{' or '.join(DISPLAYS)}"
                )


def printed_source(notebook: dict, name: str = "the notebook") -> dict[int, int]:
    """Cell index -> the non-blank lines of package source that the cell's show_source/show_diff
    calls display (module docstring: how each argument is found). Raises UnresolvedSource naming
    every argument not found."""
    nb = _Notebook(name)
    trees = list(_code_trees(notebook, nb.problems, name))
    for _, lines, tree in trees:
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                nb.defs[node.name] = (lines, node)
    shown: dict[int, int] = {}
    for index, _, tree in trees:
        where = f"{name} cell {index}"
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                try:
                    exec(
                        compile(ast.Module(body=[node], type_ignores=[]), where, "exec"),
                        nb.namespace,
                    )  # noqa: S102
                except Exception as e:  # noqa: BLE001 - only an error if a display needs the name
                    nb.failed_imports.append(f"{ast.unparse(node)} ({type(e).__name__}: {e})")
                continue
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if any(_display_name(c) for c, _ in _calls(node)):
                    nb.displayers[node.name] = (index, node)
                continue
            for call, inside in _calls(node):
                display = _display_name(call)
                if display and inside:
                    nb.problems.append(
                        f"{where}: {ast.unparse(call)}: a display inside a method or lambda, "
                        "which the tool cannot follow to its calls"
                    )
                elif display:
                    shown[index] = shown.get(index, 0) + nb.displayed(call, where)
                elif (
                    not inside and isinstance(call.func, ast.Name) and call.func.id in nb.displayers
                ):
                    def_cell, function = nb.displayers[call.func.id]
                    for inner, _ in _calls(function):
                        if _display_name(inner):
                            shown[index] = shown.get(index, 0) + nb.displayed(
                                inner,
                                f"{where} (in {function.name}, defined in cell {def_cell})",
                                function=function,
                                site=call,
                            )
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
            ):
                nb.assigned[node.targets[0].id] = node.value
                if _dotted(node.value):  # an alias, ``cache_class = handwritten.HandwrittenCache``
                    try:
                        nb.namespace[node.targets[0].id] = eval(
                            ast.unparse(node.value), nb.namespace
                        )  # noqa: S307
                    except Exception:  # noqa: BLE001, S110 - only an error if a display needs the name
                        pass
    if nb.problems:
        raise UnresolvedSource(nb.problems)
    return shown


# ------------------------------------------------------------------------------ the notebooks' text


@dataclass
class Exercise:
    """One exercise: its heading or bold line, where it is done, its checker, its minutes."""

    title: str
    part: str  # "core" (in class), "homework" or "optional"
    checker: str = ""
    stub: bool = False  # its code cell has a stub to fill in

    @property
    def minutes(self) -> int:
        return self.estimate[0]

    @property
    def estimate(self) -> tuple[int, str]:
        """(minutes, where the number comes from)."""
        note = MINUTES_NOTE.search(self.title)
        if note:
            return int(note.group(1)), "its heading"
        if self.checker in EXERCISE_ESTIMATES:
            return EXERCISE_ESTIMATES[self.checker], "the tool's table"
        return (
            (WRITE_MINUTES, "code to write")
            if self.stub
            else (EXERCISE_MINUTES, "a prediction or a question")
        )

    @property
    def name(self) -> str:
        """Its title without markdown: "Exercise 2 · The naive loop"."""
        return re.sub(r"\*+|^#+\s*", "", self.title).strip().rstrip(".")


@dataclass
class Text:
    """What a lesson asks a student to read and do: core, homework and optional apart."""

    words: int = 0
    code_lines: int = 0  # the notebook's own code cells
    printed_lines: int = 0  # the source its show_source/show_diff calls display
    room_exercises: int = (
        0  # exercises done in class: outside the Exercises section and the optional sections
    )
    homework_exercises: int = 0  # the exercises of the lesson's Exercises section
    optional_words: int = 0
    optional_code_lines: int = 0
    optional_printed_lines: int = 0
    optional_exercises: int = 0
    optional_sections: list[str] = field(
        default_factory=list
    )  # titles of the headings that start one
    # each heading ("## title", as written) -> [words, code lines (printed source included),
    # exercises, printed source lines] up to the next heading, optional or not
    sections: dict[str, list[int]] = field(default_factory=dict)
    parts: dict[str, str] = field(
        default_factory=dict
    )  # each heading -> "core", "homework" or "optional"
    exercises: list[Exercise] = field(default_factory=list)  # in reading order

    def add(
        self,
        optional: bool,
        *,
        words: int = 0,
        code_lines: int = 0,
        printed_lines: int = 0,
        exercises: int = 0,
        section: str = "",
        exercise_text: bool = False,
    ) -> None:
        counts = self.sections.setdefault(section, [0, 0, 0, 0])
        self.parts.setdefault(
            section, "optional" if optional else "homework" if exercise_text else "core"
        )
        counts[0] += words
        counts[1] += code_lines + printed_lines
        counts[2] += exercises
        counts[3] += printed_lines
        if exercise_text:  # an Exercises section's own text: inside EXERCISE_MINUTES, not reading
            words = code_lines = printed_lines = 0
        if optional:
            self.optional_words += words
            self.optional_code_lines += code_lines
            self.optional_printed_lines += printed_lines
            self.optional_exercises += exercises
        elif exercise_text:
            self.homework_exercises += exercises
        else:
            self.words += words
            self.code_lines += code_lines
            self.printed_lines += printed_lines
            self.room_exercises += exercises

    @property
    def reading_minutes(self) -> float:
        """The notebook's own text: markdown and code cells."""
        return self.words / WORDS_PER_MINUTE + self.code_lines / CODE_LINES_PER_MINUTE

    @property
    def printed_minutes(self) -> float:
        return self.printed_lines / CODE_LINES_PER_MINUTE

    def _exercise_minutes(self, part: str, count: int) -> float:
        """The listed exercises' estimates; exercises counted but not listed (a Text built by
        hand) at
        EXERCISE_MINUTES."""
        listed = [e.minutes for e in self.exercises if e.part == part]
        return sum(listed) + max(0, count - len(listed)) * EXERCISE_MINUTES

    @property
    def exercise_minutes(self) -> float:
        """The exercises done in class."""
        return self._exercise_minutes("core", self.room_exercises)

    @property
    def homework_minutes(self) -> float:
        return self._exercise_minutes("homework", self.homework_exercises)

    @property
    def optional_minutes(self) -> float:
        return minutes(
            self.optional_words, self.optional_code_lines + self.optional_printed_lines, 0
        ) + self._exercise_minutes("optional", self.optional_exercises)


def minutes(words: int, code_lines: int, exercises: int) -> float:
    """Reading and exercise minutes at the module's rates."""
    return (
        words / WORDS_PER_MINUTE + code_lines / CODE_LINES_PER_MINUTE + exercises * EXERCISE_MINUTES
    )


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _tags(cell: dict) -> set:
    return set(cell.get("metadata", {}).get("tags", []) or [])


def part(optional_level: int | None, exercises_level: int | None) -> str:
    """Where an exercise here is done: "optional", "homework" (Exercises section) or "core"."""
    return (
        "optional"
        if optional_level is not None
        else "homework"
        if exercises_level is not None
        else "core"
    )


def analyse(
    notebook: dict, name: str = "the notebook", shown: dict[int, int] | None = None
) -> Text:
    """Words, code lines, printed source and exercises of a notebook (its JSON as a dict), homework
    and optional sections apart. Raises UnresolvedSource (``name`` and the cell in each problem)
    when a display is not found. ``shown``: the notebook's printed source if already counted."""
    shown = printed_source(notebook, name) if shown is None else shown
    text = Text()
    optional_level = None  # the heading level of the optional section we are in, or None
    previous_counted = (
        False  # the previous cell counted an exercise (a tagged code cell after it is its checker)
    )
    section = "(before the first section)"
    exercises_level = None  # the heading level of the Exercises section we are in, or None
    for index, cell in enumerate(notebook.get("cells", [])):
        tags = _tags(cell)
        if tags & SKIPPED_TAGS:
            continue
        lines = _source(cell).splitlines()
        exercises_here = 0
        if cell.get("cell_type") == "markdown":
            tagged_optional = "optional" in tags
            provisional = tagged_optional and optional_level is None
            if provisional:
                optional_level = (
                    7  # until this cell's first heading sets the level, or any next heading ends it
                )
            first_heading, fenced = True, False
            for line in lines:
                if FENCE.match(line):
                    fenced = not fenced
                heading = None if fenced else HEADING.match(line)
                if heading:
                    level, title = len(heading.group(1)), heading.group(2)
                    if optional_level is not None and level <= optional_level:
                        optional_level = (
                            None  # the same or a higher level ends the optional section
                        )
                    if exercises_level is not None and level <= exercises_level:
                        exercises_level = None
                    if title.lower().endswith("exercises"):
                        exercises_level = level
                    if title.lower().endswith("(optional)") or (tagged_optional and first_heading):
                        optional_level = (
                            level if optional_level is None else min(optional_level, level)
                        )
                        text.optional_sections.append(title)
                    first_heading = False
                    section = f"{heading.group(1)} {title}"
                    n = (
                        1 if EXERCISE_HEADING.match(title) else 0
                    )  # "### Exercise 4 · ...": the heading is the exercise
                    exercises_here += n
                    if n:
                        text.exercises.append(
                            Exercise(title, part(optional_level, exercises_level))
                        )
                    text.add(
                        optional_level is not None,
                        words=len(title.split()),
                        exercises=n,
                        section=section,
                        exercise_text=exercises_level is not None,
                    )
                    continue
                n = 1 if not fenced and EXERCISE_LINE.match(line) else 0
                exercises_here += n
                if n:
                    text.exercises.append(
                        Exercise(line.strip()[:120], part(optional_level, exercises_level))
                    )
                text.add(
                    optional_level is not None,
                    words=len(line.split()),
                    exercises=n,
                    section=section,
                    exercise_text=exercises_level is not None,
                )
            if "exercise" in tags and exercises_here == 0:
                exercises_here = 1
                text.exercises.append(Exercise(section, part(optional_level, exercises_level)))
                text.add(
                    optional_level is not None,
                    exercises=1,
                    section=section,
                    exercise_text=exercises_level is not None,
                )
            if provisional and first_heading:  # a tagged cell without a heading: just this cell
                optional_level = None
        elif cell.get("cell_type") == "code":
            optional = optional_level is not None or "optional" in tags
            text.add(
                optional,
                code_lines=sum(1 for line in lines if line.strip()),
                printed_lines=shown.get(index, 0),
                section=section,
                exercise_text=exercises_level is not None,
            )
            if "exercise" in tags and not previous_counted:
                exercises_here = 1
                text.exercises.append(
                    Exercise(section, "optional" if optional else part(None, exercises_level))
                )
                text.add(
                    optional,
                    exercises=1,
                    section=section,
                    exercise_text=exercises_level is not None,
                )
            if "exercise" in tags and text.exercises and not text.exercises[-1].checker:
                checker = CHECKER.search(_source(cell))
                text.exercises[-1].checker = checker.group(1) if checker else ""
                text.exercises[-1].stub = bool(STUB.search(_source(cell)))
        previous_counted = exercises_here > 0 or (previous_counted and "exercise" in tags)
    return text


_TEXTS: dict[
    tuple[str, str], Text
] = {}  # (notebook name, sha256 of its text) -> its Text: one analysis per run


def _printed_source_key(raw: str) -> str | None:
    """What a notebook's printed source depends on: its text, this tool, the kvlab that its imports
    would load (found, not imported), the installed transformers and torch. None without kvlab."""
    spec = importlib.util.find_spec("kvlab")
    if spec is None or not spec.submodule_search_locations:
        return None
    package = Path(list(spec.submodule_search_locations)[0])
    digest = hashlib.sha256(raw.encode())
    digest.update(Path(__file__).read_bytes())
    digest.update(code_hash.folder_hash(package, package.parent).encode())
    for name in ("transformers", "torch"):
        try:
            digest.update(f"{name}={importlib.metadata.version(name)}".encode())
        except importlib.metadata.PackageNotFoundError:
            digest.update(f"{name}=none".encode())
    return digest.hexdigest()


def _counted_printed_source(raw: str, notebook: dict, name: str) -> dict[int, int]:
    """printed_source, kept on disk under ``$KVLAB_CACHE`` (else ~/.cache/kvlab) by
    ``_printed_source_key``: counting it imports kvlab and transformers (~10 s), and the checks that
    run this tool in a subprocess would pay that on every call. A cache that cannot be read or
    written is counted again."""
    key = _printed_source_key(raw)
    cache = Path(os.environ.get("KVLAB_CACHE") or Path.home() / ".cache" / "kvlab")
    path = cache / "printed_source" / f"{key}.json"
    if key is not None:
        try:
            return {int(cell): lines for cell, lines in json.loads(path.read_text()).items()}
        except (OSError, ValueError, AttributeError):
            pass
    shown = printed_source(notebook, name)
    if key is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            scratch = path.with_suffix(f".{os.getpid()}.tmp")
            scratch.write_text(json.dumps(shown))
            scratch.replace(path)
        except OSError:
            pass
    return shown


def lesson_texts(folder: Path) -> dict[str, tuple[str, Text]]:
    """Lesson id ("00".."07") -> (notebook file name, its Text), for every notebook of ``folder``.
    Raises UnresolvedSource listing the displays of every lesson whose source is not found."""
    found, problems = {}, []
    for path in sorted(folder.glob("*.ipynb")):
        lesson = path.name[:2]
        if lesson.isdigit():
            raw = path.read_text(encoding="utf-8")
            key = (path.name, hashlib.sha256(raw.encode()).hexdigest())
            if key not in _TEXTS:
                notebook = json.loads(raw)
                try:
                    shown = _counted_printed_source(raw, notebook, path.stem)
                    _TEXTS[key] = analyse(notebook, path.stem, shown)
                except UnresolvedSource as e:
                    problems += e.problems
                    continue
            found[lesson] = (path.name, _TEXTS[key])
    if problems:
        raise UnresolvedSource(problems)
    return found


# -------------------------------------------------------------------------------- the recorded runs


def hardware_kind(row: dict) -> str | None:
    hardware, device = str(row.get("hardware") or ""), row.get("device")
    if "NVIDIA" in hardware.upper() or "H200" in hardware.upper() or device == "cuda":
        return "gpu"
    if hardware.startswith("CPU") or device == "cpu":
        return "cpu"
    return None


def full_size_rows(rows: list[dict]) -> list[dict]:
    """The rows a schedule may use: full size and passed (a failed run's time is the time until it
    failed)."""
    return [
        r for r in rows if not r.get("quick") and r.get("passed") and r.get("wall_s") is not None
    ]


def run_seconds(rows: list[dict], notebook: str, kind: str) -> float | None:
    """The slowest passed full-size run of ``notebook`` on ``kind`` ("cpu" or "gpu") hardware, or
    None."""
    times = [
        float(r["wall_s"])
        for r in full_size_rows(rows)
        if r.get("notebook") == notebook and hardware_kind(r) == kind
    ]
    return max(times) if times else None


# ------------------------------------------------------------------------------------ the schedule

FIXED = {
    "break": BREAK_MINUTES,
    "slack": SLACK_MINUTES,
}  # the core path's rows that are not lessons: their minutes


@dataclass
class Row:
    part: str  # "pre-work", "core" or "separate session"
    label: str  # the notebook's stem, "break" or "slack"
    run: int = 0
    reading: int = 0  # the notebook's own markdown and code
    printed: int = 0  # the source its show_source/show_diff calls display
    exercises: int = 0  # minutes of the exercises done in class
    room_count: int = 0  # how many exercises are done in class
    homework: int = 0  # minutes of the Exercises section's exercises, left out of the total
    homework_count: int = 0
    optional: int = 0  # minutes of optional sections, left out of the total
    gpu_run: int | None = None  # the GPU run time, for the GPU variant of the total
    recorded: bool = True  # a CPU run of this lesson is recorded
    optional_sections: tuple[str, ...] = ()  # the headings that start its optional sections

    @property
    def lesson(self) -> bool:
        return self.label not in FIXED

    @property
    def total(self) -> int:
        return (
            FIXED[self.label]
            if not self.lesson
            else self.run + self.reading + self.printed + self.exercises
        )

    @property
    def gpu_total(self) -> int:
        if not self.lesson:
            return FIXED[self.label]
        return (self.gpu_run or 0) + self.reading + self.printed + self.exercises


def up(minutes: float) -> int:
    return math.ceil(
        round(minutes, 6)
    )  # round first: 2.0000000001 minutes of float error is 2, not 3


def lesson_row(part: str, name: str, text: Text, rows: list[dict]) -> Row:
    cpu, gpu = run_seconds(rows, name, "cpu"), run_seconds(rows, name, "gpu")
    return Row(
        part,
        name.removesuffix(".ipynb"),
        run=up((cpu or 0) / 60),
        reading=up(text.reading_minutes),
        printed=up(text.printed_minutes),
        exercises=up(text.exercise_minutes),
        room_count=text.room_exercises,
        homework=up(text.homework_minutes),
        homework_count=text.homework_exercises,
        optional=up(text.optional_minutes),
        gpu_run=None if gpu is None else up(gpu / 60),
        recorded=cpu is not None,
        optional_sections=tuple(text.optional_sections),
    )


def with_breaks(rows: list[Row]) -> list[Row]:
    """Lessons in order, with a break at the boundary where the time since the last break is nearest
    to BREAK_EVERY_MINUTES (a tie breaks earlier); never after the last lesson."""
    out, since = [], 0
    for i, row in enumerate(rows):
        if i and since:
            after = since + row.total
            if since >= BREAK_EVERY_MINUTES or (
                after > BREAK_EVERY_MINUTES
                and abs(since - BREAK_EVERY_MINUTES) <= abs(after - BREAK_EVERY_MINUTES)
            ):
                out.append(Row(row.part, "break"))
                since = 0
        out.append(row)
        since += row.total
    return out


def schedule(texts: dict[str, tuple[str, Text]], rows: list[dict]) -> dict[str, list[Row]]:
    """``{"pre-work": [...], "core": [... with breaks, then the slack], "separate session":
    [...]}``."""

    def part(name: str, lessons: tuple[str, ...]) -> list[Row]:
        return [lesson_row(name, texts[k][0], texts[k][1], rows) for k in lessons if k in texts]

    core = with_breaks(part("core", CORE))
    return {
        "pre-work": part("pre-work", PRE_WORK),
        "core": core + [Row("core", "slack")] if core else [],
        "separate session": part("separate session", SEPARATE),
    }


# --------------------------------------------------------------------------------------- rendering


def run_table(texts: dict[str, tuple[str, Text]], rows: list[dict], now: dict | None = None) -> str:
    """One column per recorded hardware (CPUs first), one row per lesson: seconds and minutes of
    the full-size run, marked where it ran code that has changed since (its code hash against
    ``now``, default this checkout's)."""
    now = code_hash.tree_hashes(ROOT) if now is None else now
    full = [r for r in rows if not r.get("quick")]
    hardware = sorted(
        {r["hardware"] for r in full if hardware_kind(r)},
        key=lambda h: (not h.startswith("CPU"), h),
    )
    by = {(r["notebook"], r["hardware"]): r for r in full}

    def cell(r):
        if r is None:
            return "not recorded"
        said = (
            f"{r['wall_s']:.0f} s ({r['wall_s'] / 60:.1f} min)"
            if r.get("passed")
            else f"FAILED after {r['wall_s']:.0f} s"
        )
        return (
            said if write_readme_runs.is_current(r, now) else f"{said}, {write_readme_runs.OLDER}"
        )

    lines = ["| lesson | " + " | ".join(hardware) + " |", "| --- |" + " --- |" * len(hardware)]
    for _, (name, _) in sorted(texts.items()):
        lines.append(
            f"| `{name.removesuffix('.ipynb')}` | "
            + " | ".join(cell(by.get((name, h))) for h in hardware)
            + " |"
        )
    dates = {
        h: sorted({str(r.get("date") or "?")[:10] for r in full if r["hardware"] == h})
        for h in hardware
    }
    older = any(write_readme_runs.OLDER in line for line in lines[2:])
    lines += [
        "",
        "Full-size runs (`KVLAB_QUICK=0`, one fresh kernel per notebook, model loading included), "
        "recorded by "
        "`python tools/run_notebooks.py` in `data/notebook_runs.json`, on "
        + "; ".join(f"{h} ({', '.join(d)})" for h, d in dates.items())
        + "."
        + (
            f' "{write_readme_runs.OLDER}": that run\'s lesson code has changed since.'
            if older
            else ""
        ),
    ]
    return "\n".join(lines)


def cpu_hardware(rows: list[dict]) -> list[str]:
    return sorted({r["hardware"] for r in full_size_rows(rows) if hardware_kind(r) == "cpu"})


def schedule_table(plan: dict[str, list[Row]], rows: list[dict]) -> str:
    cpus = cpu_hardware(rows) or ["no CPU recorded"]
    lines = [
        "| part | lesson | run (CPU) | reading | printed source | in-class exercises | total | "
        "homework (left out) | optional (left out) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]

    def lesson_line(r: Row) -> str:
        run = f"{r.run}" if r.recorded else "not recorded"
        return (
            f"| {r.part} | `{r.label}` | {run} | {r.reading} | {r.printed} | {r.exercises} | "
            f"{r.total} | "
            f"{r.homework} | {r.optional} |"
        )

    for name, part in plan.items():
        for r in part:
            lines.append(
                lesson_line(r) if r.lesson else f"| {r.part} | {r.label} | | | | | {r.total} | | |"
            )
        if name == "core" and part:
            lessons = [r for r in part if r.lesson]
            lines.append(
                f"| core | **core path total** | {sum(r.run for r in lessons)} | "
                f"{sum(r.reading for r in lessons)} | {sum(r.printed for r in lessons)} | "
                f"{sum(r.exercises for r in lessons)} | **{sum(r.total for r in part)}** | "
                f"{sum(r.homework for r in lessons)} | {sum(r.optional for r in lessons)} |"
            )
    lines += [
        "",
        "Minutes, each column rounded up. Run time: the slowest recorded full-size CPU run of "
        "the lesson "
        f"({', '.join(cpus)}). Reading: the notebook's markdown at {WORDS_PER_MINUTE} words per "
        "minute plus its "
        f"code cells at {CODE_LINES_PER_MINUTE} lines per minute. Printed source: the lines of "
        "package code its "
        f"`show_source` and `show_diff` calls display, at {CODE_LINES_PER_MINUTE} lines per "
        "minute. In-class "
        "exercises: those of the lesson body, outside its Exercises section and its optional "
        "sections, each at "
        "its own estimate (the exercises table below). Homework: the exercises of the lesson's "
        "Exercises "
        f"section (their text included), left out of the total. Breaks: "
        f"{BREAK_MINUTES} minutes at the lesson boundary nearest to every {BREAK_EVERY_MINUTES} "
        "minutes. "
        f"Slack: {SLACK_MINUTES} minutes once, kept for the instructor and set-up problems. "
        "The rates are assumptions, stated and sourced in `tools/write_workshop_schedule.py`.",
    ]
    return "\n".join(lines)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def verdict(plan: dict[str, list[Row]]) -> str:
    core = plan["core"]
    lessons = [r for r in core if r.lesson]
    total, gpu_total = sum(r.total for r in core), sum(r.gpu_total for r in core)
    breaks = sum(1 for r in core if r.label == "break")
    slack = sum(r.total for r in core if r.label == "slack")
    run, reading, printed = (
        sum(r.run for r in lessons),
        sum(r.reading for r in lessons),
        sum(r.printed for r in lessons),
    )
    exercises, room_count = sum(r.exercises for r in lessons), sum(r.room_count for r in lessons)
    without = [r.label for r in lessons if r.room_count == 0]
    fits_time, fits = total <= WORKSHOP_MINUTES, total <= WORKSHOP_MINUTES and not without
    margin = (
        f"exactly {WORKSHOP_MINUTES}"
        if total == WORKSHOP_MINUTES
        else f"{WORKSHOP_MINUTES - total} under {WORKSHOP_MINUTES}"
        if fits_time
        else f"{total - WORKSHOP_MINUTES} over {WORKSHOP_MINUTES}"
    )
    lacking = (
        f"{', '.join(f'`{label}`' for label in without)} "
        f"{'has' if len(without) == 1 else 'have'} no in-class exercise"
    )
    words = (
        f"**The plan {'fits' if fits else 'does not fit'}: the core path (lessons 01-05) takes "
        f"{total} minutes "
        f"on the recorded CPU, {margin}"
        + (
            ", and every core lesson has an in-class exercise.**"
            if not without
            else f"{', but' if fits_time else ', and'} {lacking}.**"
        )
    )
    words += (
        f" Its minutes: run time {run}, reading {reading + printed} ({printed} of it printed "
        "source), "
        f"in-class exercises {exercises} ({_plural(room_count, 'exercise')}), "
        f"{_plural(breaks, 'break')} {breaks * BREAK_MINUTES}, slack {slack}."
    )
    words += f" With the recorded GPU run times instead it takes {gpu_total} minutes."
    optional = sum(r.optional for r in lessons)
    marked = sum(len(r.optional_sections) for r in lessons)
    words += (
        f" {_plural(marked, 'section')} of lessons 01-05 {'is' if marked == 1 else 'are'} marked "
        "optional and "
        f"left out of these totals ({optional} minutes; listed below)."
        if marked
        else " No section of lessons 01-05 is marked optional yet."
    )
    homework = [
        f"{r.label[:2]} {_plural(r.homework_count, 'exercise')} ({r.homework} minutes)"
        for r in lessons
        if r.homework_count
    ]
    words += (
        f" Homework, the exercises of the lessons' Exercises sections, left out of class "
        f"({sum(r.homework for r in lessons)} minutes): {'; '.join(homework)}."
        if homework
        else " No core lesson sets homework exercises."
    )
    missing = [r.label for r in lessons if not r.recorded]
    if missing:
        words += (
            f" No passed full-size CPU run is recorded for {', '.join(missing)}: "
            "their run time counts 0."
        )
    sessions = [(plan["pre-work"], "Pre-work (lesson 00)")] + [
        ([r], f"Lesson {r.label[:2]} on its own") for r in plan["separate session"]
    ]
    for rows, said in sessions:
        if rows:
            count, homework_minutes = (
                sum(r.homework_count for r in rows),
                sum(r.homework for r in rows),
            )
            words += f" {said}: {sum(r.total for r in rows)} minutes" + (
                f", and {homework_minutes} of homework ({_plural(count, 'exercise')})."
                if count
                else "."
            )
    return words


def optional_list(plan: dict[str, list[Row]]) -> str:
    """The optional sections of every lesson, a list item per lesson with its minutes."""
    rows = [r for part in plan.values() for r in part if r.lesson and r.optional_sections]
    items = [
        f"- **{r.label[:2]}** ({r.optional} min): "
        + "; ".join(f'"{t}"' for t in r.optional_sections)
        for r in rows
    ]
    return (
        "\n".join(["Optional sections, left out of the totals (homework reading):", "", *items])
        if items
        else ""
    )


def exercise_table(texts: dict[str, tuple[str, Text]]) -> str:
    """Every exercise of every lesson: where it is done, its minutes, where the estimate is from."""
    lines = [
        "| lesson | exercise | checker | done | minutes | estimate |",
        "| --- | --- | --- | --- | ---: | --- |",
    ]
    done = {"core": "in class", "homework": "homework", "optional": "optional"}
    for _, (name, text) in sorted(texts.items()):
        for e in text.exercises:
            minutes_, source = e.estimate
            checker = f"`{e.checker}`" if e.checker else ""
            lines.append(
                f"| {name[:2]} | {_short(e.name)} | {checker} | {done[e.part]} | {minutes_} | "
                f"{source} |"
            )
    return "\n".join(lines)


def _short(title: str, width: int = 48) -> str:
    """A title cut to ``width`` characters at a word, for a table cell (``|`` escaped)."""
    title = title.replace("|", "\\|")
    return title if len(title) <= width else title[:width].rsplit(" ", 1)[0] + " ..."


WRAP = 116  # the generated block's prose is wrapped (markdown joins the lines); tables are not


def wrapped(block: str) -> str:
    """Every prose line of ``block`` wrapped at WRAP characters; a list item continues indented."""
    out = []
    for line in block.split("\n"):
        if len(line) <= WRAP or line.startswith("|"):
            out.append(line)
        else:
            indent = "  " if line.startswith("- ") else ""
            out += textwrap.wrap(
                line, WRAP, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False
            )
    return "\n".join(out)


def section_table(texts: dict[str, tuple[str, Text]]) -> str:
    """Minutes of reading and exercises under every heading of every lesson (up to the next
    heading): where to cut."""
    lines = [
        "| lesson | part | heading | words | code lines | of them printed source | exercises | "
        "minutes |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for _, (name, text) in sorted(texts.items()):
        for title, (words, code, exercises, printed) in text.sections.items():
            lines.append(
                f"| `{name.removesuffix('.ipynb')}` | {text.parts.get(title, 'core')} | {title} | "
                f"{words} | "
                f"{code} | {printed} | {exercises} | {minutes(words, code, exercises):.1f} |"
            )
    return "\n".join(lines)


def render(texts: dict[str, tuple[str, Text]], rows: list[dict]) -> str:
    """The block between the markers (without them)."""
    plan = schedule(texts, rows)
    return wrapped(
        "\n".join(
            [
                "",
                "#### Run time per lesson",
                "",
                run_table(texts, rows),
                "",
                "#### The schedule",
                "",
                schedule_table(plan, rows),
                "",
                verdict(plan),
                "",
                optional_list(plan),
                "",
                "#### The exercises and their minutes",
                "",
                exercise_table(texts),
                "",
                f"Estimates by what each exercise asks: the tool's table `EXERCISE_ESTIMATES` "
                f'(by checker), a "(N min)" note in the exercise\'s heading, else {WRITE_MINUTES} '
                f"minutes for code to write and {EXERCISE_MINUTES} for a prediction or a question.",
                "",
            ]
        )
    )


def refreshed(guide_text: str, block: str) -> str:
    if START not in guide_text or END not in guide_text:
        raise SystemExit(
            f"no {START} ... {END} block in the guide: add the two markers where the schedule goes"
        )
    start, end = guide_text.index(START) + len(START), guide_text.index(END)
    return guide_text[:start] + block + guide_text[end:]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--write",
        action="store_true",
        help="rewrite the guide's block between the workshop markers",
    )
    group.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if the block differs from --write's",
    )
    group.add_argument(
        "--sections",
        action="store_true",
        help="print the minutes of every lesson's sections instead",
    )
    p.add_argument(
        "--runs",
        type=Path,
        default=RUNS,
        help="the recorded runs (default data/notebook_runs.json)",
    )
    p.add_argument(
        "--notebooks-dir", type=Path, default=NOTEBOOKS, help="the lessons (default notebooks/)"
    )
    p.add_argument(
        "--guide",
        type=Path,
        default=GUIDE,
        help="the guide to write or check (default INSTRUCTORS.md)",
    )
    args = p.parse_args(argv)
    rows = json.loads(args.runs.read_text(encoding="utf-8"))["runs"]
    try:
        texts = lesson_texts(args.notebooks_dir)
    except UnresolvedSource as e:
        print(
            "cannot count the source these lessons print (show_source/show_diff), so no schedule:",
            file=sys.stderr,
        )
        for problem in e.problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    if not texts:
        raise SystemExit(f"no lesson notebook (NN_name.ipynb) in {args.notebooks_dir}")
    if args.sections:
        print(section_table(texts))
        return 0
    block = render(texts, rows)
    if not (args.write or args.check):
        print(block.strip())
        return 0
    old = args.guide.read_text(encoding="utf-8")
    new = refreshed(old, block)
    if args.check:
        if new != old:
            print(
                f"{args.guide}: the workshop block differs from what "
                "tools/write_workshop_schedule.py writes "
                "(a notebook or data/notebook_runs.json changed); refresh with: python "
                "tools/write_workshop_schedule.py --write"
            )
            return 1
        return 0
    args.guide.write_text(new, encoding="utf-8")
    print(f"{args.guide}", "updated" if new != old else "already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())

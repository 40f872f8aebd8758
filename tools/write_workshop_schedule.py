"""Plan a workshop from the course itself: minutes per lesson from the recorded runs and the notebooks' own text.

    python tools/write_workshop_schedule.py              # print the run-time table and the schedule
    python tools/write_workshop_schedule.py --write      # rewrite INSTRUCTORS.md's block between the workshop markers
    python tools/write_workshop_schedule.py --check      # write nothing; exit 1 if that block differs from what --write writes
    python tools/write_workshop_schedule.py --sections   # minutes of reading and exercises per section of every lesson (what to cut)

Per lesson (a notebook of notebooks/, named by its two-digit prefix):

- **run time**: ``wall_s`` of the passed, full-size (``quick`` false) rows of ``data/notebook_runs.json``, the file
  ``tools/run_notebooks.py`` writes. A row is a CPU row when its hardware starts with "CPU" (or its device is
  "cpu"), a GPU row when its hardware names NVIDIA or H200 (or its device is "cuda"). The schedule uses the slowest
  recorded CPU run of each lesson: a workshop runs on laptops. A run time is kept whole: a notebook runs end to end.
- **reading**: the words of the markdown cells at ``WORDS_PER_MINUTE`` plus the non-blank lines of the code cells at
  ``CODE_LINES_PER_MINUTE``. The Colab badge and set-up cells (tagged by ``tools/write_colab_cells.py``) are left out:
  they are machinery, not lesson. Output (printed tables, the package source that ``show_source`` displays) is not
  counted, so reading is a lower bound where a lesson shows a lot of source.
- **exercises**: ``EXERCISE_MINUTES`` each. An exercise is a markdown line that starts with ``**Exercise`` (lessons
  00-02 write "**Exercise 1.**") or with a bold number ``**1.**`` (lessons 03-06 write their exercises so), or a
  cell tagged "exercise" that holds no such line (a code cell so tagged right after a counted exercise is taken as
  its checker, not a new exercise). The words and code of a lesson's "Exercises" section (a heading whose title
  ends with "Exercises") are part of its exercises' minutes, not of its reading, so setting the exercises as
  homework takes all of them out of the room.
- **optional sections**: a heading line that ends with "(optional)", or a cell tagged "optional" (from its first
  heading on, or the whole cell), starts an optional section; it lasts until the next heading of the same or a
  higher level (fewer ``#``). Reading and exercises inside it are left out of the core path and shown apart.

Every column is rounded up to whole minutes, and a lesson's total is the sum of its rounded columns, so the
schedule's sums are the sums of the numbers it shows.

The workshop: lesson 00 is pre-work, lessons 01-05 are the core path, with a ``BREAK_MINUTES`` break at the lesson
boundary where the time since the last break comes nearest to ``BREAK_EVERY_MINUTES``; lesson 06 is a session of its
own. The block written into INSTRUCTORS.md holds the run-time table (with whether each machine's rows are current:
their ``code_hash`` against this checkout's, ``tools/code_hash.py``), the schedule and whether the core path fits
``WORKSHOP_MINUTES``; every number in it is read from the data and the notebooks, never typed.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:  # tools/, also when this file is loaded by its path
    sys.path.append(str(Path(__file__).resolve().parent))
import code_hash  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
RUNS = ROOT / "data" / "notebook_runs.json"
GUIDE = ROOT / "INSTRUCTORS.md"
START, END = "<!-- workshop:start -->", "<!-- workshop:end -->"

# An assumption, not a measurement of this course: Brysbaert's meta-analysis of reading rates ("How many words do we
# read per minute?", Journal of Memory and Language 109, 2019) puts silent reading of English non-fiction by adults
# at about 238 words per minute; technical prose thick with code names, numbers and formulas is read more slowly, and
# we take 180, about three quarters of it.
WORDS_PER_MINUTE = 180
# An assumption: a student reads a line of a lesson's code in about 6 seconds before running the cell: 600 lines an
# hour, a little above the few hundred lines an hour that code-review studies (SmartBear's study of reviews at Cisco,
# "Best Kept Secrets of Peer Code Review", 2006) give as the most a careful reader takes in.
CODE_LINES_PER_MINUTE = 10
# An assumption: minutes for one exercise (read it, work it out, run the checker, read its hint once).
EXERCISE_MINUTES = 5
BREAK_MINUTES = 10
BREAK_EVERY_MINUTES = 60
WORKSHOP_MINUTES = 180

PRE_WORK, CORE, SEPARATE = ("00",), ("01", "02", "03", "04", "05"), ("06",)
SKIPPED_TAGS = {"colab-badge", "colab-setup"}  # tools/write_colab_cells.py's cells: not part of any lesson's reading

HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")
EXERCISE_LINE = re.compile(r"^\s*\*\*(Exercise\b|\d+\.\*\*)")


# ------------------------------------------------------------------------------------------- the notebooks' text

@dataclass
class Text:
    """What a lesson asks a student to read and do, core and optional apart."""

    words: int = 0
    code_lines: int = 0
    exercises: int = 0
    optional_words: int = 0
    optional_code_lines: int = 0
    optional_exercises: int = 0
    optional_sections: list[str] = field(default_factory=list)  # titles of the headings that start one
    # each heading ("## title", as written) -> [words, code lines, exercises] up to the next heading, optional or not
    sections: dict[str, list[int]] = field(default_factory=dict)

    def add(self, optional: bool, *, words: int = 0, code_lines: int = 0, exercises: int = 0, section: str = "",
            exercise_text: bool = False) -> None:
        counts = self.sections.setdefault(section, [0, 0, 0])
        counts[0], counts[1], counts[2] = counts[0] + words, counts[1] + code_lines, counts[2] + exercises
        if exercise_text:  # an Exercises section's own text: inside EXERCISE_MINUTES, not reading
            words = code_lines = 0
        if optional:
            self.optional_words += words
            self.optional_code_lines += code_lines
            self.optional_exercises += exercises
        else:
            self.words += words
            self.code_lines += code_lines
            self.exercises += exercises

    @property
    def reading_minutes(self) -> float:
        return self.words / WORDS_PER_MINUTE + self.code_lines / CODE_LINES_PER_MINUTE

    @property
    def exercise_minutes(self) -> float:
        return self.exercises * EXERCISE_MINUTES

    @property
    def optional_minutes(self) -> float:
        return minutes(self.optional_words, self.optional_code_lines, self.optional_exercises)


def minutes(words: int, code_lines: int, exercises: int) -> float:
    """Reading and exercise minutes at the module's rates."""
    return words / WORDS_PER_MINUTE + code_lines / CODE_LINES_PER_MINUTE + exercises * EXERCISE_MINUTES


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _tags(cell: dict) -> set:
    return set(cell.get("metadata", {}).get("tags", []) or [])


def analyse(notebook: dict) -> Text:
    """Words, code lines and exercises of a notebook (its JSON as a dict), optional sections apart."""
    text = Text()
    optional_level = None  # the heading level of the optional section we are in, or None
    previous_counted = False  # the previous cell counted an exercise (a tagged code cell after it is its checker)
    section = "(before the first section)"
    exercises_level = None  # the heading level of the Exercises section we are in, or None
    for cell in notebook.get("cells", []):
        tags = _tags(cell)
        if tags & SKIPPED_TAGS:
            continue
        lines = _source(cell).splitlines()
        exercises_here = 0
        if cell.get("cell_type") == "markdown":
            tagged_optional = "optional" in tags
            provisional = tagged_optional and optional_level is None
            if provisional:
                optional_level = 7  # until this cell's first heading sets the level, or any next heading ends it
            first_heading, fenced = True, False
            for line in lines:
                if FENCE.match(line):
                    fenced = not fenced
                heading = None if fenced else HEADING.match(line)
                if heading:
                    level, title = len(heading.group(1)), heading.group(2)
                    if optional_level is not None and level <= optional_level:
                        optional_level = None  # the same or a higher level ends the optional section
                    if exercises_level is not None and level <= exercises_level:
                        exercises_level = None
                    if title.lower().endswith("exercises"):
                        exercises_level = level
                    if title.lower().endswith("(optional)") or (tagged_optional and first_heading):
                        optional_level = level if optional_level is None else min(optional_level, level)
                        text.optional_sections.append(title)
                    first_heading = False
                    section = f"{heading.group(1)} {title}"
                    text.add(optional_level is not None, words=len(title.split()), section=section,
                             exercise_text=exercises_level is not None)
                    continue
                n = 1 if not fenced and EXERCISE_LINE.match(line) else 0
                exercises_here += n
                text.add(optional_level is not None, words=len(line.split()), exercises=n, section=section,
                         exercise_text=exercises_level is not None)
            if "exercise" in tags and exercises_here == 0:
                exercises_here = 1
                text.add(optional_level is not None, exercises=1, section=section)
            if provisional and first_heading:  # a tagged cell without a heading: just this cell
                optional_level = None
        elif cell.get("cell_type") == "code":
            optional = optional_level is not None or "optional" in tags
            text.add(optional, code_lines=sum(1 for line in lines if line.strip()), section=section,
                     exercise_text=exercises_level is not None)
            if "exercise" in tags and not previous_counted:
                exercises_here = 1
                text.add(optional, exercises=1, section=section)
        previous_counted = exercises_here > 0 or (previous_counted and "exercise" in tags)
    return text


def lesson_texts(folder: Path) -> dict[str, tuple[str, Text]]:
    """Lesson id ("00".."06") -> (notebook file name, its Text), for every notebook of ``folder``."""
    found = {}
    for path in sorted(folder.glob("*.ipynb")):
        lesson = path.name[:2]
        if lesson.isdigit():
            found[lesson] = (path.name, analyse(json.loads(path.read_text(encoding="utf-8"))))
    return found


# --------------------------------------------------------------------------------------------- the recorded runs

def hardware_kind(row: dict) -> str | None:
    hardware, device = str(row.get("hardware") or ""), row.get("device")
    if "NVIDIA" in hardware.upper() or "H200" in hardware.upper() or device == "cuda":
        return "gpu"
    if hardware.startswith("CPU") or device == "cpu":
        return "cpu"
    return None


def full_size_rows(rows: list[dict]) -> list[dict]:
    """The rows a schedule may use: full size and passed (a failed run's time is the time until it failed)."""
    return [r for r in rows if not r.get("quick") and r.get("passed") and r.get("wall_s") is not None]


def run_seconds(rows: list[dict], notebook: str, kind: str) -> float | None:
    """The slowest passed full-size run of ``notebook`` on ``kind`` ("cpu" or "gpu") hardware, or None."""
    times = [float(r["wall_s"]) for r in full_size_rows(rows) if r.get("notebook") == notebook and hardware_kind(r) == kind]
    return max(times) if times else None


# ---------------------------------------------------------------------------------------------------- the schedule

@dataclass
class Row:
    part: str  # "pre-work", "core" or "separate session"
    label: str  # the notebook's stem, or "break"
    run: int = 0
    reading: int = 0
    exercises: int = 0
    optional: int = 0  # minutes of optional sections, left out of the total
    gpu_run: int | None = None  # the GPU run time, for the GPU variant of the total
    recorded: bool = True  # a CPU run of this lesson is recorded
    optional_sections: tuple[str, ...] = ()  # the headings that start its optional sections

    @property
    def total(self) -> int:
        return BREAK_MINUTES if self.label == "break" else self.run + self.reading + self.exercises

    @property
    def gpu_total(self) -> int:
        if self.label == "break":
            return BREAK_MINUTES
        return (self.gpu_run or 0) + self.reading + self.exercises


def up(minutes: float) -> int:
    return math.ceil(round(minutes, 6))  # round first: 2.0000000001 minutes of float error is 2, not 3


def lesson_row(part: str, name: str, text: Text, rows: list[dict]) -> Row:
    cpu, gpu = run_seconds(rows, name, "cpu"), run_seconds(rows, name, "gpu")
    return Row(part, name.removesuffix(".ipynb"), run=up((cpu or 0) / 60), reading=up(text.reading_minutes),
               exercises=up(text.exercise_minutes), optional=up(text.optional_minutes),
               gpu_run=None if gpu is None else up(gpu / 60), recorded=cpu is not None,
               optional_sections=tuple(text.optional_sections))


def with_breaks(rows: list[Row]) -> list[Row]:
    """Lessons in order, with a break at the boundary where the time since the last break is nearest to
    BREAK_EVERY_MINUTES (a tie breaks earlier); never after the last lesson."""
    out, since = [], 0
    for i, row in enumerate(rows):
        if i and since:
            after = since + row.total
            if since >= BREAK_EVERY_MINUTES or (after > BREAK_EVERY_MINUTES and
                                                 abs(since - BREAK_EVERY_MINUTES) <= abs(after - BREAK_EVERY_MINUTES)):
                out.append(Row(row.part, "break"))
                since = 0
        out.append(row)
        since += row.total
    return out


def schedule(texts: dict[str, tuple[str, Text]], rows: list[dict]) -> dict[str, list[Row]]:
    """``{"pre-work": [...], "core": [... with breaks], "separate session": [...]}``."""
    def part(name: str, lessons: tuple[str, ...]) -> list[Row]:
        return [lesson_row(name, texts[k][0], texts[k][1], rows) for k in lessons if k in texts]

    return {"pre-work": part("pre-work", PRE_WORK), "core": with_breaks(part("core", CORE)),
            "separate session": part("separate session", SEPARATE)}


# ------------------------------------------------------------------------------------------------------ rendering

def run_table(texts: dict[str, tuple[str, Text]], rows: list[dict], now: dict | None = None) -> str:
    """One column per recorded hardware (CPUs first), one row per lesson: seconds and minutes of the full-size run;
    then whether each column is current against ``now`` (default: this checkout's hashes)."""
    full = [r for r in rows if not r.get("quick")]
    hardware = sorted({r["hardware"] for r in full if hardware_kind(r)}, key=lambda h: (not h.startswith("CPU"), h))
    by = {(r["notebook"], r["hardware"]): r for r in full}

    def cell(r):
        if r is None:
            return "not recorded"
        if not r.get("passed"):
            return f"FAILED after {r['wall_s']:.0f} s"
        return f"{r['wall_s']:.0f} s ({r['wall_s'] / 60:.1f} min)"

    lines = ["| lesson | " + " | ".join(hardware) + " |", "| --- |" + " --- |" * len(hardware)]
    for _, (name, _) in sorted(texts.items()):
        lines.append(f"| `{name.removesuffix('.ipynb')}` | " + " | ".join(cell(by.get((name, h))) for h in hardware) + " |")
    made = {h: sorted({f"{(r.get('commit') or '?')[:7]} ({(r.get('date') or '?')[:10]})" for r in full
                       if r["hardware"] == h}) for h in hardware}
    lines += ["", "Full-size runs (`KVLAB_QUICK=0`, one fresh kernel per notebook, model loading included) recorded by "
              "`python tools/run_notebooks.py` in `data/notebook_runs.json`; code: "
              + "; ".join(f"{h} at {', '.join(m)}" for h, m in made.items()) + "."]
    lines += ["", code_hash.status_sentence(full, hardware, code_hash.tree_hashes(ROOT) if now is None else now)]
    return "\n".join(lines)


def cpu_hardware(rows: list[dict]) -> list[str]:
    return sorted({r["hardware"] for r in full_size_rows(rows) if hardware_kind(r) == "cpu"})


def schedule_table(plan: dict[str, list[Row]], rows: list[dict]) -> str:
    cpus = cpu_hardware(rows) or ["no CPU recorded"]
    lines = ["| part | lesson | run (CPU) | reading | exercises | total | optional (left out) |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]

    def lesson_line(r: Row) -> str:
        run = f"{r.run}" if r.recorded else "not recorded"
        return f"| {r.part} | `{r.label}` | {run} | {r.reading} | {r.exercises} | {r.total} | {r.optional} |"

    for name, part in plan.items():
        for r in part:
            lines.append(f"| {r.part} | break | | | | {r.total} | |" if r.label == "break" else lesson_line(r))
        if name == "core":
            lessons = [r for r in part if r.label != "break"]
            lines.append(f"| core | **core path total** | {sum(r.run for r in lessons)} | "
                         f"{sum(r.reading for r in lessons)} | {sum(r.exercises for r in lessons)} | "
                         f"**{sum(r.total for r in part)}** | {sum(r.optional for r in lessons)} |")
    lines += ["", f"Minutes, each column rounded up. Run time: the slowest recorded full-size CPU run of the lesson "
              f"({', '.join(cpus)}). Reading: markdown at {WORDS_PER_MINUTE} words per minute plus code at "
              f"{CODE_LINES_PER_MINUTE} lines per minute. Exercises: {EXERCISE_MINUTES} minutes each. Breaks: "
              f"{BREAK_MINUTES} minutes at the lesson boundary nearest to every {BREAK_EVERY_MINUTES} minutes. "
              "The rates are assumptions, stated and sourced in `tools/write_workshop_schedule.py`."]
    return "\n".join(lines)


def verdict(plan: dict[str, list[Row]]) -> str:
    core = plan["core"]
    total, gpu_total = sum(r.total for r in core), sum(r.gpu_total for r in core)
    lessons = [r for r in core if r.label != "break"]
    breaks, optional = len(core) - len(lessons), sum(r.optional for r in lessons)
    missing = [r.label for r in lessons if not r.recorded]
    # The room plan: run time and reading, the exercises (their text included) set as homework; the schedule's
    # total column adds them back, for a workshop that does them in the room.
    homework = with_breaks([Row(r.part, r.label, run=r.run, reading=r.reading) for r in lessons])
    short, short_breaks = sum(r.total for r in homework), sum(1 for r in homework if r.label == "break")
    fits = short <= WORKSHOP_MINUTES
    words = (f"**The core path (lessons 01-05), run time and reading with the exercises set as homework, takes {short} "
             f"minutes on the recorded CPU, {short_breaks} break{'' if short_breaks == 1 else 's'} included: it "
             + (f"fits {WORKSHOP_MINUTES} minutes, with {WORKSHOP_MINUTES - short} to spare.**" if fits else
                f"does not fit {WORKSHOP_MINUTES} minutes: {short - WORKSHOP_MINUTES} minutes over.**"))
    gpu_short = sum(BREAK_MINUTES if r.label == "break" else (r.gpu_run or 0) + r.reading
                    for r in with_breaks([Row(r.part, r.label, run=r.run, reading=r.reading, gpu_run=r.gpu_run)
                                          for r in lessons]))
    words += f" With the recorded GPU run times instead it takes {gpu_short} minutes."
    words += (f" With every exercise done in the room it takes {total} minutes ({breaks} break{'' if breaks == 1 else 's'}"
              f"; {gpu_total} with the GPU run times).")
    marked = [f'{r.label[:2]} "{title}"' for r in lessons for title in r.optional_sections]
    words += (f" Marked optional in lessons 01-05, and left out of these totals ({optional} minutes): {'; '.join(marked)}."
              if marked else " No section of lessons 01-05 is marked optional yet.")
    if missing:
        words += f" No passed full-size CPU run is recorded for {', '.join(missing)}: their run time counts 0."
    pre, separate = plan["pre-work"], plan["separate session"]
    if pre:
        words += f" Pre-work (lesson 00): {sum(r.total for r in pre)} minutes."
    if separate:
        words += f" Lesson 06 on its own: {sum(r.total for r in separate)} minutes."
    return words


def section_table(texts: dict[str, tuple[str, Text]]) -> str:
    """Minutes of reading and exercises under every heading of every lesson (up to the next heading): where to cut."""
    lines = ["| lesson | heading | words | code lines | exercises | minutes |", "| --- | --- | ---: | ---: | ---: | ---: |"]
    for _, (name, text) in sorted(texts.items()):
        for title, (words, code, exercises) in text.sections.items():
            lines.append(f"| `{name.removesuffix('.ipynb')}` | {title} | {words} | {code} | {exercises} | "
                         f"{minutes(words, code, exercises):.1f} |")
    return "\n".join(lines)


def render(texts: dict[str, tuple[str, Text]], rows: list[dict]) -> str:
    """The block between the markers (without them)."""
    plan = schedule(texts, rows)
    return "\n".join(["", "#### Run time per lesson", "", run_table(texts, rows), "",
                      "#### The schedule", "", schedule_table(plan, rows), "", verdict(plan), ""])


def refreshed(guide_text: str, block: str) -> str:
    if START not in guide_text or END not in guide_text:
        raise SystemExit(f"no {START} ... {END} block in the guide: add the two markers where the schedule goes")
    start, end = guide_text.index(START) + len(START), guide_text.index(END)
    return guide_text[:start] + block + guide_text[end:]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = p.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help="rewrite the guide's block between the workshop markers")
    group.add_argument("--check", action="store_true", help="write nothing; exit 1 if the block differs from --write's")
    group.add_argument("--sections", action="store_true", help="print the minutes of every lesson's sections instead")
    p.add_argument("--runs", type=Path, default=RUNS, help="the recorded runs (default data/notebook_runs.json)")
    p.add_argument("--notebooks-dir", type=Path, default=NOTEBOOKS, help="the lessons (default notebooks/)")
    p.add_argument("--guide", type=Path, default=GUIDE, help="the guide to write or check (default INSTRUCTORS.md)")
    args = p.parse_args(argv)
    rows = json.loads(args.runs.read_text(encoding="utf-8"))["runs"]
    texts = lesson_texts(args.notebooks_dir)
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
            print(f"{args.guide}: the workshop block differs from what tools/write_workshop_schedule.py writes "
                  "(a notebook or data/notebook_runs.json changed); refresh with: python tools/write_workshop_schedule.py --write")
            return 1
        return 0
    args.guide.write_text(new, encoding="utf-8")
    print(f"{args.guide}", "updated" if new != old else "already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())

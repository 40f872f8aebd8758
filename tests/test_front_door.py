"""The front door: README.md for a student (short, the quick start first), INSTRUCTORS.md for
a teacher (a run sheet,
a pre-flight, readable lines), MAINTAINING.md for the rest (every tool named); no commit hash and no
development-machine detail where students and teachers read."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README, GUIDE, MAINTAINING = ROOT / "README.md", ROOT / "INSTRUCTORS.md", ROOT / "MAINTAINING.md"
# a commit or code hash: 7 to 40 hex digits, at least one digit and one letter, standing alone
HASH = re.compile(
    r"(?<![0-9A-Za-z_/.-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![0-9A-Za-z_])"
)
MACHINE_WORDS = ("the GPU machine", "64 MiB", "device call", "/work/", "shared/device")
BOOKKEEPING = (
    "data/attempts",
    "in the room",
)  # the course's rule for what students and teachers read
TEST_COMMAND = "KVLAB_QUICK=1 pytest"


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def fenced_blocks(text: str) -> list[str]:
    return re.findall(r"^```[a-z]*\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


def test_the_readme_is_short_and_starts_with_the_quick_start():
    readme = lines(README)
    assert len(readme) <= 120, (
        f"README.md is {len(readme)} lines: at most 120 (move maintainer detail to MAINTAINING.md)"
    )
    first = "\n".join(readme[:30])
    assert "pip install -r requirements.txt" in first and "jupyter lab notebooks/" in first
    assert "colab.research.google.com" in first and "T4" in first and "float16" in first
    assert (
        "[INSTRUCTORS.md](INSTRUCTORS.md)" in README.read_text()
        and "[MAINTAINING.md](MAINTAINING.md)" in README.read_text()
    )


def test_the_readme_shows_the_one_test_command_that_ci_runs():
    blocks = [b.strip() for b in fenced_blocks(README.read_text(encoding="utf-8"))]
    assert [b for b in blocks if "pytest" in b] == [TEST_COMMAND], (
        "the README's one test command, alone in a fence"
    )
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "export KVLAB_QUICK=1" in ci and re.search(r"^pytest$", ci, re.MULTILINE), (
        ".ci/run must run the same"
    )


@pytest.mark.parametrize("path", [README, GUIDE], ids=lambda p: p.name)
def test_no_hash_and_no_development_machine_detail(path):
    text = path.read_text(encoding="utf-8")
    hashes = sorted(set(HASH.findall(text)))
    assert not hashes, (
        f"{path.name} names commit or code hashes {hashes}: they belong in MAINTAINING.md or data/"
    )
    found = [w for w in MACHINE_WORDS if w.lower() in text.lower()]
    assert not found, (
        f"{path.name} names development-machine detail {found}: move it to MAINTAINING.md"
    )
    found = [w for w in BOOKKEEPING if w.lower() in text.lower()] + re.findall(r"\bCI\b", text)
    assert not found, (
        f"{path.name} says {found}: bookkeeping, not for students or teachers (MAINTAINING.md)"
    )


def test_the_hash_pattern_finds_hashes_and_nothing_else():
    assert HASH.findall("ran ed22368's code, then 7ed78f2 and 13d4498a") == [
        "ed22368",
        "7ed78f2",
        "13d4498a",
    ]
    assert (
        HASH.findall(
            "134,515,008 parameters, 46080 bytes, facade, deadbeef, sm_90a, 0x1f2e3d4c, a1b2c3"
        )
        == []
    )


def test_the_guide_has_a_run_sheet_a_preflight_and_readable_lines():
    text = GUIDE.read_text(encoding="utf-8")
    headings = re.findall(r"^#+ (.*)$", text, re.MULTILINE)
    assert any(h.lower().startswith("run sheet") for h in headings), (
        "INSTRUCTORS.md: a '## Run sheets' section"
    )
    assert any(h.lower().startswith("pre-flight") for h in headings), (
        "INSTRUCTORS.md: a '## Pre-flight' section"
    )
    sheets = text[text.index("## Run sheets") :].split("\n## ", 1)[0]
    for lesson in ("01", "02", "03", "04", "05", "06", "07"):
        sheet = re.search(rf"^### {lesson} .*?(?=^### |\Z)", sheets, re.MULTILINE | re.DOTALL)
        assert sheet, f"no run sheet for lesson {lesson}"
        for part in ("**Show:**", "**Say:**", "**Ask:**", "**Exercise"):
            assert part in sheet.group(0), f"lesson {lesson}'s run sheet has no {part}"
    long = [(i + 1, len(line)) for i, line in enumerate(lines(GUIDE)) if len(line) > 300]
    assert not long, f"INSTRUCTORS.md lines over 300 characters (line, length): {long}"


def test_maintaining_names_every_tool_and_keeps_the_lead_s_placeholder():
    assert MAINTAINING.is_file(), "MAINTAINING.md is missing"
    text = MAINTAINING.read_text(encoding="utf-8")
    tools = sorted(
        p.name for p in (ROOT / "tools").iterdir() if p.is_file() and not p.name.startswith(".")
    )
    missing = [name for name in tools if f"tools/{name}" not in text]
    assert not missing, (
        f"MAINTAINING.md does not name {missing}: one line each in its table of tools"
    )
    assert "## GPU checks and a T4" in text


def test_the_run_sheets_name_checkers_the_course_has():
    from kvlab import exercises

    named = set(
        re.findall(r"`(check_\w+)`", GUIDE.read_text(encoding="utf-8").split("## The schedule")[0])
    )
    assert named
    source = "".join(
        p.read_text(encoding="utf-8") for p in Path(exercises.__file__).parent.glob("lesson*.py")
    )
    gone = sorted(
        n for n in named if not re.search(rf"^(?:def {n}\b|{n}\s*=)", source, re.MULTILINE)
    )
    assert not gone, f"INSTRUCTORS.md's run sheets name checkers that no longer exist: {gone}"

"""kvlab's comments and docstrings state rules, never measurements: no commit hashes, no timings or
bandwidths measured on a machine (those live in data/, with the hardware that gave them). Sizes
(KiB, MiB) are not scanned: in kvlab's comments they are computed (a tile's shared memory, a
buffer's bytes), not measured."""

import io
import re
import tokenize
from pathlib import Path

KVLAB = Path(__file__).resolve().parent.parent / "kvlab"

HASH = re.compile(r"(?<![\w./-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w-])")
TIMING = re.compile(r"\d[\d.,]*\s*(ms|µs|us|ns|GB/s|TB/s)(?![\w/])"
                    r"|\d[\d.,]*\s+s\b|\d[\d.,]*\s*x faster")  # "3 s", not "the 9s"
HARDWARE = re.compile(r"\b(H100|H200|A100|L4)\b.{0,40}\b(measured|sweep|found|faster|slower)\b"
                      r"|\b(measured|sweep|found|faster|slower)\b.{0,40}\b(H100|H200|A100|L4)\b")
RULES = {"a commit hash": HASH, "a timing": TIMING, "a measurement on named hardware": HARDWARE}


def prose(path: Path):
    """(line, text) of every comment and docstring (any string statement) of a module."""
    tokens = list(tokenize.generate_tokens(io.StringIO(path.read_text()).readline))
    for i, tok in enumerate(tokens):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
        elif tok.type == tokenize.STRING:
            before = [t for t in tokens[:i] if t.type not in (tokenize.NL, tokenize.COMMENT)]
            after = tokens[i + 1].type if i + 1 < len(tokens) else tokenize.ENDMARKER
            starts = not before or before[-1].type in (tokenize.NEWLINE, tokenize.INDENT,
                                                       tokenize.DEDENT)
            if starts and after in (tokenize.NEWLINE, tokenize.ENDMARKER):
                for k, line in enumerate(tok.string.splitlines()):
                    yield tok.start[0] + k, line


def test_rule_patterns_catch_what_they_are_for():
    assert (HASH.search("see 958930d for the sweep")
            and not HASH.search("the deadbeef value 1234567"))
    assert TIMING.search("3.9 against 5.2 ms") and TIMING.search("at 700 GB/s")
    assert TIMING.search("6.95 µs at 4 splits") and not TIMING.search("16 rows, 2 warps")
    assert TIMING.search("took 3 s") and not TIMING.search("then 0s (never read)")
    assert HARDWARE.search("where the H200 sweep found it fastest")


def test_no_measurements_or_hashes_in_kvlab_comments_and_docstrings():
    found = []
    for path in sorted(KVLAB.rglob("*.py")):
        for line, text in prose(path):
            for what, pattern in RULES.items():
                if pattern.search(text):
                    found.append(f"{path.relative_to(KVLAB.parent)}:{line}: {what}: {text.strip()}")
    assert not found, (
        "comments and docstrings state rules; move each measurement to data/README.md:\n"
                       + "\n".join(found))

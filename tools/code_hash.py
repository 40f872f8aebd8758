"""Content hashes of the course's code folders, without git, and whether recorded rows still match
them.

A folder's hash is the sha256 of its files' relative paths (posix, relative to the folder) and
contents, in sorted order. Left out, as git leaves them out: ``__pycache__``, ``*.pyc``,
``.ipynb_checkpoints``, ``.pytest_cache`` and ``.git`` always, and whatever the checkout's
``.gitignore`` files and ``.git/info/exclude`` ignore (the subset of gitignore's syntax: ``#``
comments, ``!`` negation, ``*``, ``?``, ``**``, ``[...]``, a trailing ``/`` for folders, a leading
or inner ``/`` to anchor a pattern to its file's folder). So a copy of the working tree without
``.git`` (the GPU machine's) hashes as the checkout does. ``combined`` hashes the folders' names and
hashes together.

Used by tools/run_notebooks.py (each row's ``code_hash``), tools/write_readme_runs.py (the README's
table) and tools/gpu_check.py, and read by tools/write_workshop_schedule.py.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

FOLDERS = ("kvlab", "notebooks", "tests")
# what a lesson's run executes: its rows are current when these match
LESSON_FOLDERS = ("kvlab", "notebooks")
ALWAYS_SKIPPED_DIRS = {"__pycache__", ".ipynb_checkpoints", ".pytest_cache", ".git"}
ALWAYS_SKIPPED_SUFFIXES = (".pyc",)
SHORT = 7  # hex digits shown of a hash


def _glob_regex(glob: str) -> str:
    out, i = "", 0
    while i < len(glob):
        if glob.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif glob.startswith("**", i):
            out, i = out + ".*", i + 2
        elif glob[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif glob[i] == "?":
            out, i = out + "[^/]", i + 1
        elif glob[i] == "[" and "]" in glob[i + 2 :]:
            end = glob.index("]", i + 2)
            body = glob[i + 1 : end]
            out, i = (
                out
                + "["
                + ("^" + body[1:] if body.startswith("!") else body).replace("\\", "\\\\")
                + "]",
                end + 1,
            )
        elif glob[i] == "\\" and i + 1 < len(glob):
            out, i = out + re.escape(glob[i + 1]), i + 2
        else:
            out, i = out + re.escape(glob[i]), i + 1
    return out


def parse_ignore(text: str, base: str = "") -> list[tuple]:
    """Rules of one ignore file whose folder is ``base`` (posix, relative to the checkout; "" for
    its root)."""
    rules = []
    for line in text.splitlines():
        line = line.rstrip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:] if negate else line
        dir_only = pattern.endswith("/")
        pattern = pattern.rstrip("/")
        anchored = "/" in pattern
        pattern = pattern.lstrip("/")
        if pattern:
            rules.append(
                (re.compile(_glob_regex(pattern) + r"\Z"), negate, dir_only, anchored, base)
            )
    return rules


def is_ignored(rel: str, is_dir: bool, rules: list[tuple]) -> bool:
    """Whether ``rel`` (posix, relative to the checkout) is ignored by ``rules``: the last rule that
    matches decides."""
    ignored = False
    for regex, negate, dir_only, anchored, base in rules:
        if dir_only and not is_dir:
            continue
        if base:
            if not rel.startswith(base + "/"):
                continue
            sub = rel[len(base) + 1 :]
        else:
            sub = rel
        if regex.match(sub if anchored else sub.rsplit("/", 1)[-1]):
            ignored = not negate
    return ignored


def _read_rules(folder: Path, base: str) -> list[tuple]:
    path = folder / ".gitignore"
    return (
        parse_ignore(path.read_text(encoding="utf-8", errors="replace"), base)
        if path.is_file()
        else []
    )


def folder_files(folder: Path, root: Path | None = None) -> list[str]:
    """Sorted posix paths, relative to ``folder``, of the files its hash covers. The ignore files of
    ``root`` (the checkout holding ``folder``; default its parent) and of the folders between
    apply."""
    folder = Path(folder).resolve()
    root = folder.parent if root is None else Path(root).resolve()
    try:
        inside = folder.relative_to(root).as_posix()
    except ValueError:  # not in the checkout: only the folder's own ignore files
        root, inside = folder, ""
    exclude = root / ".git" / "info" / "exclude"
    rules = (
        parse_ignore(exclude.read_text(encoding="utf-8", errors="replace"))
        if exclude.is_file()
        else []
    )
    rules += _read_rules(root, "")
    parts = inside.split("/") if inside else []
    for depth in range(1, len(parts) + 1):
        rules += _read_rules(root.joinpath(*parts[:depth]), "/".join(parts[:depth]))
    files = []
    for here, dirs, names in os.walk(folder):
        here_path = Path(here)
        rel_here = here_path.relative_to(root).as_posix()
        rel_here = "" if rel_here == "." else rel_here
        if here_path != folder:
            rules = rules + _read_rules(here_path, rel_here)
        dirs[:] = sorted(
            d
            for d in dirs
            if d not in ALWAYS_SKIPPED_DIRS
            and not is_ignored(f"{rel_here}/{d}".lstrip("/"), True, rules)
        )
        for name in names:
            rel = f"{rel_here}/{name}".lstrip("/")
            if name.endswith(ALWAYS_SKIPPED_SUFFIXES) or is_ignored(rel, False, rules):
                continue
            files.append((here_path / name).relative_to(folder).as_posix())
    return sorted(files)


def folder_hash(folder: Path, root: Path | None = None) -> str:
    """sha256 (hex) of ``folder``'s files: each relative path, a NUL, the sha256 of its bytes."""
    folder = Path(folder)
    digest = hashlib.sha256()
    for rel in folder_files(folder, root):
        digest.update(rel.encode() + b"\0" + hashlib.sha256((folder / rel).read_bytes()).digest())
    return digest.hexdigest()


def combined(hashes: dict, folders=FOLDERS) -> str:
    """One sha256 (hex) over ``folders``' names and hashes."""
    return hashlib.sha256(
        "".join(f"{name}:{hashes[name]}\n" for name in folders).encode()
    ).hexdigest()


def tree_hashes(root: Path, folders=FOLDERS, paths: dict | None = None) -> dict:
    """``{folder: hash, ..., "combined": hash}`` of ``root``'s ``folders``; ``paths`` maps a folder
    to another path to hash under its name (a notebooks folder elsewhere)."""
    root = Path(root)
    hashes = {
        name: folder_hash(Path((paths or {}).get(name, root / name)), root) for name in folders
    }
    return {**hashes, "combined": combined(hashes, folders)}


def changed_folders(recorded: dict | None, now: dict, folders=FOLDERS) -> list[str]:
    """The folders whose recorded hash differs from ``now``'s (all of them when nothing was
    recorded)."""
    recorded = recorded if isinstance(recorded, dict) else {}
    return [name for name in folders if recorded.get(name) != now.get(name)]


def named(folders) -> str:
    return ", ".join(f"{name}/" for name in folders)


def _lessons(rows: list[dict]) -> str:
    names = sorted(str(r.get("notebook") or "?") for r in rows)
    return ", ".join(n[:2] if n[:2].isdigit() else n.removesuffix(".ipynb") for n in names)


def _dates(rows: list[dict]) -> str:
    return ", ".join(sorted({str(r.get("date") or "?")[:10] for r in rows}))


def rows_status(rows: list[dict], now: dict, folders=LESSON_FOLDERS) -> str:
    """Whether ``rows`` (one machine's) are current: each row's ``code_hash`` against ``now`` over
    ``folders``. "current (code hash ...)", "kvlab/ changed since these runs (rows of DATE)", or
    "code hash not recorded (rows of DATE)"; a mix names the lessons of each."""
    current, changed, unrecorded = [], {}, []
    for r in rows:
        recorded = r.get("code_hash")
        if not isinstance(recorded, dict) or not all(recorded.get(f) for f in folders):
            unrecorded.append(r)
            continue
        diff = tuple(changed_folders(recorded, now, folders))
        if diff:
            changed.setdefault(diff, []).append(r)
        else:
            current.append(r)
    groups = len(changed) + bool(current) + bool(unrecorded)
    said = []
    if current:
        code = ", ".join(f"{name}/ {now[name][:SHORT]}" for name in folders)
        said.append(f"{_lessons(current) + ' ' if groups > 1 else ''}current (code hash {code})")
    for diff, group in sorted(changed.items()):
        said.append(
            f"{_lessons(group) + ': ' if groups > 1 else ''}{named(diff)} changed since these runs "
            f"(rows of {_dates(group)})"
        )
    if unrecorded:
        said.append(
            f"{_lessons(unrecorded) + ': ' if groups > 1 else ''}code hash not recorded (rows of "
            f"{_dates(unrecorded)})"
        )
    return "; ".join(said) if said else "no rows"


def status_sentence(rows: list[dict], hardware: list[str], now: dict) -> str:
    """One sentence for a table with a column per machine: each machine's ``rows_status``."""
    per_machine = "; ".join(
        f"{h}: {rows_status([r for r in rows if r.get('hardware') == h], now)}" for h in hardware
    )
    folders = " and ".join(f"`{name}/`" for name in LESSON_FOLDERS)
    return (
        f"Whether each column is current (its rows' code hash of {folders} against this "
        "checkout's when this "
        f"was generated, `tools/code_hash.py`): {per_machine}."
    )

"""The lessons' code uses only public names: no attribute, import or getattr of a name with one
leading underscore.

A notebook is what a student copies from. A private name (``obj._step``, ``from torch._dynamo import
...``, ``import kvlab._x``) may change or vanish in any release, so the lessons name what the
package (and torch, transformers) make public; dunders such as ``__name__`` are public by convention
and allowed. The check parses every code cell with ``ast``, IPython magics and shell lines
(``%...``, ``!...``) left out, and names the notebook, the cell and the name it found. Two more
checks keep the lessons on ``kvlab.lab.notebook``: source is shown one way (``show_source``, never
``Code(inspect.getsource(...))``) and the course model loaded one way (``lesson_setup``,
``course_model``; lesson 00, which teaches loading, may call ``load_model``); and set-up is shared,
not copied: no two notebooks hold the same code cell (the generated Colab cell aside).
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
# a private name can hide in a string too
NAME_FUNCTIONS = ("getattr", "setattr", "hasattr", "delattr")


def private(name: str) -> bool:
    """One leading underscore and not a dunder: ``_x`` and ``__x`` are private, ``__x__`` is not."""
    return name.startswith("_") and not (
        name.startswith("__") and name.endswith("__") and len(name) > 4)


def cell_code(source: str) -> str:
    """The cell as Python: a cell magic (``%%time``) drops the whole cell, line magics and shell
    lines are blanked (kept as empty lines, so line numbers stay the cell's own)."""
    if source.lstrip().startswith("%%"):
        return ""
    return "\n".join(
        "" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


def private_names(source: str) -> list[tuple[int, str]]:
    """``(line, what)`` for every private name the code reaches for."""
    found = []
    for node in ast.walk(ast.parse(cell_code(source))):
        if isinstance(node, ast.Attribute) and private(node.attr):
            found.append((node.lineno, f"attribute .{node.attr}"))
        elif isinstance(node, ast.Import):
            found += [(node.lineno,
                       f"import {a.name}") for a in node.names if any(
                           map(private, a.name.split(".")))]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if any(map(private, module.split("."))):
                found.append((node.lineno, f"from {module} import ..."))
            found += [(node.lineno,
                       f"from {module} import {a.name}") for a in node.names if private(a.name)]
        elif (isinstance(node, ast.Call) and isinstance(node.func,
                                                        ast.Name) and node.func.id in NAME_FUNCTIONS
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str) and private(node.args[1].value)):
            found.append((node.lineno, f"{node.func.id}(..., {node.args[1].value!r})"))
    return found


def code_cells(path: Path) -> list[tuple[int, str]]:
    """``(cell index, source)`` of every code cell; the index counts all cells, as Jupyter shows
    them."""
    cells = json.loads(path.read_text())["cells"]
    return [(i, "".join(c["source"])) for i, c in enumerate(cells) if c["cell_type"] == "code"]


def violations(path: Path) -> list[str]:
    problems = []
    for index, source in code_cells(path):
        try:
            names = private_names(source)
        except SyntaxError as e:
            problems.append(f"{path.name} cell {index}: does not parse ({e.msg}, line {e.lineno})")
            continue
        problems += [f"{path.name} cell {index}, line {line}: private name, {what}" for line,
                     what in names]
    return problems


def test_there_are_lessons_to_check():
    assert len(NOTEBOOKS) >= 7, NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_code_uses_only_public_names(path):
    problems = violations(path)
    assert not problems, (
        "a lesson reaches for private names (use the public ones):\n" + "\n".join(problems))


def test_the_check_catches_a_private_attribute_and_imports(tmp_path):
    fake = tmp_path / "99_fake.ipynb"
    cells = [
        {"cell_type": "markdown", "metadata": {}, "source": ["obj._private in prose is fine"]},
        {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
         "source": ["%matplotlib inline\n", "!ls\n", "x = obj.__class__.__name__\n",
                    "y = obj._private\n"]},
        {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
         "source": ["from kvlab.graphs import _Recorder\n", "import kvlab._hidden\n",
                    "from torch._dynamo import explain\n",
                    "z = getattr(obj, '_step')\n", "w = obj.__dunder__ + obj.__mangled"]},
        {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
         "source": ["%%time\n", "a._b\n"]},
    ]
    fake.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4,
                                "nbformat_minor": 5}))
    assert violations(fake) == [
        "99_fake.ipynb cell 1, line 4: private name, attribute ._private",
        "99_fake.ipynb cell 2, line 1: private name, from kvlab.graphs import _Recorder",
        "99_fake.ipynb cell 2, line 2: private name, import kvlab._hidden",
        "99_fake.ipynb cell 2, line 3: private name, from torch._dynamo import ...",
        "99_fake.ipynb cell 2, line 4: private name, getattr(..., '_step')",
        "99_fake.ipynb cell 2, line 5: private name, attribute .__mangled",
    ]
    with pytest.raises(AssertionError, match="cell 1, line 4: private name, attribute ._private"):
        test_notebook_code_uses_only_public_names(fake)


ONE_WAY = {  # what a lesson calls instead of doing it by hand
    "getsource": "kvlab.lab.notebook.show_source (or show_diff, show_doc)",
    "Code": "kvlab.lab.notebook.show_source (or show_diff)",
    "load_model": "kvlab.lab.notebook.lesson_setup or course_model for the course model, "
                  "kvlab.tiny_model for a tiny one "
                  "(lesson 00, whose subject is loading, may call it)",
}


def called_names(source: str) -> list[tuple[int, str]]:
    """``(line, name)`` of every call ``name(...)`` or ``something.name(...)``."""
    calls = []
    for node in ast.walk(ast.parse(cell_code(source))):
        if isinstance(node, ast.Call):
            func = node.func
            name = (func.attr if isinstance(func, ast.Attribute)
                    else func.id if isinstance(func, ast.Name) else None)
            if name:
                calls.append((node.lineno, name))
    return calls


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_shows_source_and_loads_the_model_one_way(path):
    allowed = {"load_model"} if path.name.startswith("00_") else set()
    problems = [f"{path.name} cell {index}, line {line}: {name}(...): use {ONE_WAY[name]}"
                for index, source in code_cells(path) for line, name in called_names(source)
                if name in ONE_WAY and name not in allowed]
    assert not problems, "\n".join(problems)


def test_no_code_cell_is_copied_between_notebooks():
    """Set-up shared by several lessons lives in ``kvlab.lab.notebook`` (``lesson_setup``), not in
    copied cells. The first code cell of each notebook is the Colab cell that
    ``tools/write_colab_cells.py`` writes: the same by design."""
    seen: dict[str, str] = {}
    copies = []
    for path in NOTEBOOKS:
        for index, source in code_cells(path)[1:]:
            key = source.strip()
            if not key:
                continue
            if key in seen and not seen[key].startswith(path.name):
                copies.append(f"{path.name} cell {index} is a copy of {seen[key]}")
            seen.setdefault(key, f"{path.name} cell {index}")
    assert not copies, "\n".join(copies)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_stored_clean_with_a_unique_id_per_cell(path):
    """nbformat 4.5 wants an id on every cell (Jupyter warns, and will refuse, without one: a cell
    inserted by a script gets none); lessons are stored without outputs."""
    nb = json.loads(path.read_text())
    ids = [cell.get("id") for cell in nb["cells"]]
    assert (nb["nbformat"], nb["nbformat_minor"]) >= (4, 5), path.name
    missing = [i for i, cell_id in enumerate(ids) if not (
        cell_id and re.fullmatch(r"[a-zA-Z0-9-_]{1,64}", cell_id))]
    assert not missing, (f"{path.name}: cells {missing} have no valid id "
                         "(give each a unique one, e.g. uuid4().hex[:8])")
    assert len(set(ids)) == len(ids), f"{path.name}: duplicate cell ids"
    dirty = [i for i, cell in enumerate(nb["cells"]) if cell["cell_type"] == "code"
             and (cell.get("outputs") or cell.get("execution_count") is not None)]
    assert not dirty, f"{path.name}: cells {dirty} carry outputs: clear them before committing"

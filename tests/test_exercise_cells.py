"""Every lesson has code-writing exercises and a "predict, then run" question, in cells tagged
``exercise``, whose stubs are unattempted as stored (a solution is never printed by default)."""

import ast
import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def exercise_cells(path: Path) -> list[str]:
    cells = json.loads(path.read_text())["cells"]
    return ["".join(c["source"]) for c in cells
            if c["cell_type"] == "code" and "exercise" in c.get("metadata", {}).get("tags", [])]


def stubs(source: str) -> list[str]:
    """Names of functions (or methods) in ``source`` whose body raises NotImplementedError: the
    student's stubs."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef):
            for sub in ast.walk(node):
                if isinstance(sub, ast.Raise) and "NotImplementedError" in ast.unparse(
                    sub.exc or sub):
                    found.append(node.name)
                    break
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_each_lesson_has_two_code_exercises_and_a_prediction(path):
    cells = exercise_cells(path)
    code = [c for c in cells if stubs(c)]
    assert len(code) >= 2, (f"{path.name}: {len(code)} tagged code-writing exercises "
                            "(a stub raising NotImplementedError)")
    for c in code:
        assert ".check_" in c, f"{path.name}: an exercise stub with no checker call:\n{c[:300]}"
    assert any("check_prediction" in c or "predict" in c.lower() for c in cells), \
        f"{path.name}: no tagged 'predict, then run' question"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_solution_is_printed_by_default(path):
    for c in exercise_cells(path):
        for line in c.splitlines():
            if "show_solution()" in line:
                assert line.lstrip().startswith("#"), (
                    f"{path.name}: a solution shown by default: {line.strip()}")


def test_a_lesson_as_shipped_runs_to_the_end_and_says_not_attempted(monkeypatch):
    """Lesson 00 as a student gets it (no ``KVLAB_SOLUTIONS``, quick mode), in a fresh kernel: every
    cell runs, and each code-writing exercise answers "not attempted". (nbmake and the browser test
    run every lesson with the solutions filled in; this is the one run of the stubs as stored.)"""
    import nbformat
    from nbclient import NotebookClient

    from kvlab.exercises.common import SOLUTIONS_ENV

    monkeypatch.delenv(SOLUTIONS_ENV, raising=False)
    monkeypatch.setenv("KVLAB_QUICK", "1")
    path = NOTEBOOKS[0]
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    exercises = [c for c in nb.cells if c.cell_type == "code" and "exercise" in c.metadata.get(
        "tags", [])
                 and stubs(c.source)]
    assert len(exercises) >= 2, path.name
    for cell in exercises:
        said = "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")
        assert "not attempted" in said, (
            f"{path.name}: an unattempted exercise said {said[:300]!r}:\n{cell.source[:200]}")

"""The Colab path: every notebook's badge and set-up cell exactly as ``tools/write_colab_cells.py``
writes them, the set-up cell inert outside Colab, and a simulated Colab: a fresh virtual environment
holding torch and an older transformers (Colab has 5.15.0), a stub ``google.colab``, and the set-up
cell installing the course from a clone of this repository. The simulation clones the committed HEAD
(CI runs in a fresh clone): commit before running it."""

import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
from tool_module import load_tool

import kvlab

ROOT = Path(__file__).resolve().parent.parent
colab_cells = load_tool("write_colab_cells")
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
REPOSITORY = colab_cells.repository_url()


def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def setup_cell(path: Path) -> str:
    """The source of a notebook's Colab set-up cell (what the tests run)."""
    found = [c for c in cells(path) if colab_cells.SETUP_TAG in c["metadata"].get("tags", [])]
    assert len(found) == 1, (f"{path.name}: no cell tagged {colab_cells.SETUP_TAG!r}: run python "
                             f"tools/write_colab_cells.py {path}")
    return "".join(found[0]["source"])


def a_notebook_with_the_cells() -> Path:
    for path in NOTEBOOKS:
        if any(colab_cells.SETUP_TAG in c["metadata"].get("tags", []) for c in cells(path)):
            return path
    pytest.fail("no notebook has a Colab set-up cell: run python tools/write_colab_cells.py")


# ------------------------------------------------------------------------------------------- the
# cells, as written
def test_the_repository_url_is_in_pyproject():
    assert REPOSITORY.startswith("https://github.com/") and REPOSITORY.count("/") == 4


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_has_the_colab_badge_and_setup_cells(path):
    """Cell 0 the badge, the first code cell the set-up cell, both exactly as the tool writes them
    (no outputs)."""
    fix = f"run: python tools/write_colab_cells.py {path.relative_to(ROOT)}"
    nb = cells(path)
    assert colab_cells.BADGE_TAG in nb[0]["metadata"].get("tags", []), (
        f"cell 0 is not the Colab badge; {fix}")
    assert "".join(nb[0]["source"]) == colab_cells.badge(REPOSITORY, path.name), fix
    first_code = next(c for c in nb if c["cell_type"] == "code")
    assert colab_cells.SETUP_TAG in first_code["metadata"].get("tags", []), (
        f"the first code cell is not Colab's; {fix}")
    assert "".join(first_code["source"]) == colab_cells.setup_source(REPOSITORY), fix
    assert first_code["outputs"] == [] and first_code["execution_count"] is None
    assert path.read_text(encoding="utf-8") == colab_cells.render_notebook(path, REPOSITORY), fix


def test_the_readme_badge_opens_lesson_00():
    readme = ROOT / "README.md"
    assert readme.read_text(encoding="utf-8") == colab_cells.render_readme(readme, REPOSITORY), \
        "run: python tools/write_colab_cells.py"
    assert colab_cells.colab_url(REPOSITORY, "00_setup.ipynb") in readme.read_text(encoding="utf-8")


def test_the_tool_changes_nothing_the_second_time(tmp_path):
    for path in NOTEBOOKS:
        copy = tmp_path / path.name
        copy.write_text(colab_cells.render_notebook(path, REPOSITORY), encoding="utf-8")
        once = copy.read_text(encoding="utf-8")
        assert colab_cells.render_notebook(copy, REPOSITORY) == once, path.name
        assert sum(c["metadata"].get("tags", []) == [colab_cells.SETUP_TAG]
                   for c in cells(copy)) == 1


def test_check_mode_reports_a_stale_notebook(tmp_path, capsys, monkeypatch):
    stale = tmp_path / "notebooks" / "99_stale.ipynb"
    stale.parent.mkdir()
    stale.write_text(json.dumps({"cells": [{"cell_type": "markdown", "id": "t", "metadata": {},
                                            "source": ["# 99"]}],
                                 "metadata": {}, "nbformat": 4, "nbformat_minor": 5},
                                indent=1) + "\n")
    readme = tmp_path / "README.md"
    readme.write_text(colab_cells.render_readme(ROOT / "README.md", REPOSITORY))
    monkeypatch.setattr(colab_cells, "README", readme)
    before = stale.read_text()
    assert colab_cells.main(["--check", str(stale)]) == 1
    assert stale.read_text() == before and "99_stale.ipynb" in capsys.readouterr().out
    assert colab_cells.main([str(stale)]) == 0
    assert colab_cells.main(["--check", str(stale)]) == 0
    assert [c["id"] for c in cells(stale)] == [colab_cells.BADGE_TAG, "t", colab_cells.SETUP_TAG]


# --------------------------------------------------------------------------------------- the cell
# outside Colab
def _forbid(*args, **kwargs):
    raise AssertionError(f"the set-up cell started a process outside Colab: {args}")


def test_the_setup_cell_does_nothing_outside_colab(monkeypatch, capsys):
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    for name in ("run", "Popen", "call", "check_call", "check_output"):
        monkeypatch.setattr(subprocess, name, _forbid)
    cwd, path = os.getcwd(), list(sys.path)
    namespace = {"__name__": "__main__"}
    exec(compile(setup_cell(a_notebook_with_the_cells()), "colab-setup", "exec"), namespace)
    assert capsys.readouterr() == ("", "")
    assert os.getcwd() == cwd and sys.path == path
    # modules only
    assert set(namespace) - {"__builtins__", "__name__"} == {"os", "runpy", "subprocess", "sys"}


def test_the_setup_cell_is_six_lines_and_its_logic_is_one_file():
    source = setup_cell(a_notebook_with_the_cells())
    assert len(source.splitlines()) <= 6, source
    assert ("kvlab/lab/colab_setup.py" in source
            and (ROOT / "kvlab" / "lab" / "colab_setup.py").is_file())


# ----------------------------------------------------- the cell on a faked Colab, pip and git faked
# (fast, here)
@pytest.fixture
def fake_colab(monkeypatch, tmp_path):
    """google.colab imported, a course folder at $KVLAB_COLAB_HOME, subprocess.run recording what it
    is asked."""
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    # A fresh Colab kernel has not imported transformers (this test process has); the summary is
    # tested elsewhere (test_gpu_rules.py) and would import it again.
    monkeypatch.delitem(sys.modules, "transformers", raising=False)
    monkeypatch.setattr(kvlab.runtime, "runtime_summary", lambda device=None: "<runtime summary>")
    monkeypatch.setattr(sys, "path", list(sys.path))
    # restored afterwards: the cell changes into the clone's notebooks folder
    monkeypatch.chdir(tmp_path)
    home = tmp_path / "content" / "kvlab"
    monkeypatch.setenv("KVLAB_COLAB_HOME", str(home))
    monkeypatch.setenv("KVLAB_COLAB_SOURCE", "https://example.invalid/kvlab")
    calls = []

    def run(command, **kwargs):
        constraints = None
        if "--constraint" in command:
            constraints = Path(command[command.index("--constraint") + 1]).read_text()
        calls.append((command, constraints))
        if command[:2] == ["git", "clone"]:
            if "fail" in os.environ.get("KVLAB_TEST_CLONE", ""):
                return subprocess.CompletedProcess(command, 128, "", "fatal: repository not found")
            (home / "kvlab" / "lab").mkdir(parents=True)
            (home / "notebooks").mkdir()
            # what the cell and colab_setup.py read
            for name in ("kvlab/lab/colab_setup.py", "pyproject.toml"):
                (home / name).write_text((ROOT / name).read_text())
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(subprocess, "run", run)
    return home, calls


def test_on_colab_the_cell_clones_installs_with_constraints_and_reports(fake_colab, capsys):
    home, calls = fake_colab
    exec(compile(setup_cell(a_notebook_with_the_cells()), "colab-setup", "exec"),
         {"__name__": "__main__"})
    (clone, _), (pip, constraints) = calls
    assert clone == ["git", "clone", "--quiet", "--depth", "1", "https://example.invalid/kvlab",
                     str(home)]
    assert pip == [sys.executable, "-m", "pip", "install", "--constraint", pip[5], "--editable",
                   str(home)]
    assert not Path(pip[5]).exists()  # the constraints file is removed after pip
    kept = dict(line.split("==") for line in constraints.splitlines())
    # pip may not replace Colab's torch...
    assert kept["torch"] == importlib.metadata.version("torch")
    # ...nor its widgets and jupyter
    for name in ("ipywidgets", "jupyter-core", "ipykernel", "triton"):
        if importlib.util.find_spec(name.replace("-", "_")) is not None:
            assert kept[name] == importlib.metadata.version(name), name
    assert not {"transformers", "kvlab", "numpy"} & set(kept)  # transformers is upgraded to the pin
    assert os.getcwd() == str(home / "notebooks") and sys.path[0] == str(home)
    out = capsys.readouterr().out
    assert "installing the course from https://example.invalid/kvlab into this Colab session" in out
    # a student on Colab is told that this is expected
    assert "downloads the model again (93 MB)" in out
    assert (f"torch {importlib.metadata.version('torch')} and ipywidgets" in out
            and "<runtime summary>" in out)


def test_on_colab_a_kernel_that_imported_transformers_is_told_to_restart(
        fake_colab, monkeypatch, capsys):
    old = types.ModuleType("transformers")
    old.__version__ = "5.15.0"  # Colab's, imported before the cell
    monkeypatch.setitem(sys.modules, "transformers", old)
    exec(compile(setup_cell(a_notebook_with_the_cells()), "colab-setup", "exec"),
         {"__name__": "__main__"})
    out = capsys.readouterr().out
    assert "transformers 5.15.0 was imported" in out and "Runtime > Restart session" in out
    assert "<runtime summary>" not in out


def test_on_colab_the_pinned_transformers_already_imported_needs_no_restart(
        fake_colab, monkeypatch, capsys):
    pinned = types.ModuleType("transformers")
    # a second run of the cell, after a lesson imported it
    pinned.__version__ = kvlab.PINNED_TRANSFORMERS
    monkeypatch.setitem(sys.modules, "transformers", pinned)
    exec(compile(setup_cell(a_notebook_with_the_cells()), "colab-setup", "exec"),
         {"__name__": "__main__"})
    out = capsys.readouterr().out
    assert "Restart" not in out and "<runtime summary>" in out


@pytest.mark.parametrize("torch_version", ["2.14.0+cu128", "2.5.1"])
def test_on_colab_a_torch_outside_the_range_is_refused_before_pip(fake_colab, monkeypatch,
                                                                  torch_version):
    home, calls = fake_colab
    version = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: torch_version if name == "torch" else version(name))
    real = importlib.metadata.distributions

    def distributions():
        for dist in real():
            if (dist.name or "").lower() == "torch":
                fake = types.SimpleNamespace(name="torch", version=torch_version)
                yield fake
            else:
                yield dist

    monkeypatch.setattr(importlib.metadata, "distributions", distributions)
    wanted = ",".join(kvlab.TORCH_RANGE)
    with pytest.raises(RuntimeError,
                       match=rf"torch {re.escape(torch_version)}, outside "
                             rf".*torch{re.escape(wanted)}.*Restart"):
        exec(compile(setup_cell(a_notebook_with_the_cells()), "colab-setup", "exec"),
             {"__name__": "__main__"})
    assert [c[0][:2] for c in calls] == [["git", "clone"]]  # pip never ran


def test_on_colab_a_second_run_does_not_clone_again(fake_colab):
    home, calls = fake_colab
    source = setup_cell(a_notebook_with_the_cells())
    for _ in range(2):
        exec(compile(source, "colab-setup", "exec"), {"__name__": "__main__"})
    assert [c[0][:2] for c in calls] == [["git", "clone"], [sys.executable, "-m"],
                                         [sys.executable, "-m"]]
    assert sys.path.count(str(home)) == 1


def test_on_colab_a_failed_clone_says_what_to_do(fake_colab, monkeypatch):
    monkeypatch.setenv("KVLAB_TEST_CLONE", "fail")
    with pytest.raises(RuntimeError,
                       match="could not clone https://example.invalid/kvlab .fatal: repository not "
                             "found.*KVLAB_COLAB_SOURCE"):
        exec(compile(setup_cell(a_notebook_with_the_cells()), "colab-setup", "exec"),
             {"__name__": "__main__"})


def test_on_colab_a_failed_pip_shows_pips_reasons(fake_colab, monkeypatch, capsys):
    home, calls = fake_colab
    fake_run = subprocess.run

    def run(command, **kwargs):
        if "pip" in command:
            calls.append((command, None))
            return subprocess.CompletedProcess(command, 1, "Collecting transformers==5.24.0\n",
                                               "ERROR: ResolutionImpossible: torch==9.9 conflicts "
                                               "with kvlab\n")
        return fake_run(command, **kwargs)

    monkeypatch.setattr(subprocess, "run", run)
    with pytest.raises(RuntimeError,
                       match="pip could not install the course .* pip's reasons are above"):
        exec(compile(setup_cell(a_notebook_with_the_cells()), "colab-setup", "exec"),
             {"__name__": "__main__"})
    assert "torch==9.9 conflicts with kvlab" in capsys.readouterr().out


# ------------------------------------------------------------------- Colab simulated in a fresh
# environment (slow)
DRIVER = textwrap.dedent('''\
    """Run as Colab would: google.colab imported at start-up, then the notebook's set-up cell."""
    import contextlib, importlib.metadata, importlib.util, io, json, os, sys

    import google.colab  # the stub; Colab's kernel imports the real one before any cell

    def torch_state():
        origin = importlib.util.find_spec("torch").origin
        stat = os.stat(origin)
        return {"version": importlib.metadata.version("torch"), "file": origin,
                "inode": stat.st_ino, "mtime_ns": stat.st_mtime_ns}

    before = {"torch": torch_state(), "transformers": importlib.metadata.version("transformers"),
              "ipywidgets": importlib.util.find_spec("ipywidgets") is not None}
    assert "torch" not in sys.modules and "transformers" not in sys.modules
    exec(compile(open(sys.argv[1]).read(), "colab-setup", "exec"), {"__name__": "__main__"})

    import kvlab  # in the same process, as the next cell of the notebook does
    import torch
    import transformers

    after = {"torch": torch_state(), "torch_imported": torch.__version__,
             "transformers": transformers.__version__,
             "kvlab": kvlab.__file__, "cwd": os.getcwd(), "pinned": kvlab.PINNED_TRANSFORMERS,
             "ipywidgets": importlib.util.find_spec("ipywidgets") is not None}
    assert after["transformers"] == "5.24.0" == after["pinned"], after
    assert (after["torch"] == before["torch"]
            and after["torch_imported"] == before["torch"]["version"]), (before, after)
    second = io.StringIO()  # the cell run again, as the next notebook of the session does
    with contextlib.redirect_stdout(second):
        exec(compile(open(sys.argv[1]).read(), "colab-setup", "exec"), {"__name__": "__main__"})
    after["second_run"] = second.getvalue()
    print("RESULT " + json.dumps({"before": before, "after": after}))
''')


def _git_head() -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=60)
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _run(command, *, env, timeout=900):
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{command} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done.stdout


@pytest.mark.skipif(_git_head() is None,
                    reason="needs this repository's .git (it clones the committed HEAD)")
@pytest.mark.heavy
def test_colab_install_in_a_fresh_environment(tmp_path):
    """About a minute with pip's cache warm: most of it is installing the course's dependencies."""
    head = _git_head()
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    # PIP_COMPILE=false: no .pyc for every installed file (half this test's time on 2 cores);
    # Python compiles what the cell imports
    env |= {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_COMPILE": "false",
            "KVLAB_COLAB_SOURCE": ROOT.as_uri(),
            "KVLAB_COLAB_HOME": str(tmp_path / "content" / "kvlab")}
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = str(venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python"))
    # Colab before the cell: its torch (any in the course's range) and an older transformers,
    # nothing of the course. The torch is this interpreter's, linked in outside the venv's
    # site-packages as Colab's sits in dist-packages (installing a second copy of torch took most of
    # this test's time): pip sees it installed, as on Colab.
    site = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                env=env).strip()
    torch_dist = importlib.metadata.distribution("torch")
    preinstalled = tmp_path / "preinstalled"
    preinstalled.mkdir()
    # torch, functorch, torchgen, dist-info
    for top in {Path(str(f)).parts[0] for f in torch_dist.files} - {".."}:
        (preinstalled / top).symlink_to(Path(torch_dist.locate_file(top)))
    (Path(site) / "colab-preinstalled.pth").write_text(f"{preinstalled}\n")
    torch_needs = [r for r in torch_dist.requires or [] if "extra ==" not in r]
    _run([python, "-m", "pip", "install", "--quiet", "--no-compile", *torch_needs,
          "transformers==5.15.0"], env=env)
    stub = Path(site) / "google" / "colab"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text(
        '"""A stand-in for Colab\'s google.colab: the set-up cell only asks whether it is '
        'imported."""\n')
    cell = tmp_path / "colab_setup.py"
    shown = subprocess.run(["git", "-C", str(ROOT), "show",
                            f"{head}:notebooks/{a_notebook_with_the_cells().name}"],
                           capture_output=True, text=True, check=True).stdout
    found = [c for c in json.loads(shown)["cells"] if colab_cells.SETUP_TAG in c["metadata"].get(
        "tags", [])]
    assert found, "the committed notebooks have no Colab set-up cell: commit them first"
    cell.write_text("".join(found[0]["source"]))
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    out = _run([python, str(driver), str(cell)], env=env)
    result = json.loads(out.split("RESULT ", 1)[1])
    before, after = result["before"], result["after"]
    assert before["transformers"] == "5.15.0" and after["transformers"] == kvlab.PINNED_TRANSFORMERS
    # same version, same files: pip did not reinstall torch
    assert after["torch"] == before["torch"]
    home = tmp_path / "content" / "kvlab"
    assert Path(after["kvlab"]).resolve() == (home / "kvlab" / "__init__.py").resolve()
    assert Path(after["cwd"]).resolve() == (home / "notebooks").resolve()
    assert not after["ipywidgets"]  # the course itself pulls in no widgets (Colab keeps its own)
    cloned = subprocess.run(["git", "-C", str(home), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    # this repository's HEAD (a commit made meanwhile is HEAD by then)
    assert cloned in (head, _git_head())
    assert f"installing the course from {ROOT.as_uri()}" in out and "dtype: float32" in out
    assert ("installed already in this session" in after["second_run"]
            and "Restart" not in after["second_run"])
    assert "dtype: float32" in after["second_run"]

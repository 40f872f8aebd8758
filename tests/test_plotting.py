"""kvlab.lab.plots: one style, axes labelled, every plot stamped with the hardware it was measured
on."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from kvlab.lab import plots  # noqa: E402
from kvlab.runtime import environment  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def texts(fig):
    return [t.get_text() for t in fig.texts]


def test_figure_single_axes_with_stamp(monkeypatch):
    monkeypatch.setenv("KVLAB_QUICK", "0")
    env = environment("cpu")
    fig, ax = plots.figure("Per-step time", "tokens", "ms", env=env)
    assert ax.get_xlabel() == "tokens" and ax.get_ylabel() == "ms"
    assert fig._suptitle.get_text() == "Per-step time"
    stamp = [t for t in texts(fig) if env["hardware"] in t]
    assert len(stamp) == 1 and f"torch {env['torch']}" in stamp[0] and "quick mode" not in stamp[0]
    assert not ax.spines["top"].get_visible() and ax.spines["left"].get_visible()


def test_quick_mode_is_stamped(monkeypatch):
    monkeypatch.setenv("KVLAB_QUICK", "1")
    fig, _ = plots.figure("t", "x", "y", env=environment("cpu"))
    assert any("quick mode" in t for t in texts(fig))


def test_figure_without_env_has_no_stamp_and_several_axes():
    fig, axes = plots.figure("Two panels", "length", "seconds", ncols=2)
    assert len(axes) == 2 and all(ax.get_xlabel() == "length" for ax in axes)
    assert not any("torch " in t for t in texts(fig))
    assert fig.get_size_inches()[0] == pytest.approx(plots.STYLE["figure.figsize"][0] * 1.5)


def test_figure_size_override():
    fig, _ = plots.figure("t", "x", "y", figsize=(3, 2))
    assert tuple(fig.get_size_inches()) == (3, 2)

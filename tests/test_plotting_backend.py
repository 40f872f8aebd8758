"""kvlab.lab.plots.figure must not undo the interactive mode a backend turns on while the first
figure is made.

Jupyter's inline backend is loaded by the first figure, inside figure()'s rc_context, and turns
interactive mode on; if rc_context then reset it, every later figure of the notebook would silently
never be shown.
"""

import matplotlib.pyplot as plt

from kvlab.lab import plots


def test_interactive_mode_set_during_the_first_figure_survives(monkeypatch):
    real_subplots = plt.subplots

    def subplots_that_load_a_backend(*args, **kwargs):
        plt.ion()  # what matplotlib_inline does when the first figure loads it
        return real_subplots(*args, **kwargs)

    plt.ioff()
    monkeypatch.setattr(plt, "subplots", subplots_that_load_a_backend)
    try:
        fig, _ = plots.figure("t", "x", "y")
        assert plt.isinteractive()
    finally:
        plt.ioff()
        plt.close("all")


def test_non_interactive_stays_non_interactive():
    plt.ioff()
    fig, _ = plots.figure("t", "x", "y")
    plt.close(fig)
    assert not plt.isinteractive()

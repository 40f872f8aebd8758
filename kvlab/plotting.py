"""One look for every plot of the course, each stamped with the hardware it was measured on."""

from __future__ import annotations

import matplotlib.pyplot as plt

STYLE = {
    "figure.figsize": (7.0, 4.0),
    "figure.dpi": 100,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.titlesize": 12,
    "axes.titleweight": "bold",
    "legend.frameon": False,
    "lines.linewidth": 2.0,
    "lines.markersize": 5,
}


def figure(title: str, xlabel: str, ylabel: str, *, env: dict | None = None, ncols: int = 1, figsize=None):
    """A styled figure with one or more axes; ``env`` (from ``kvlab.runtime.environment``) stamps the hardware."""
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(1, ncols, figsize=figsize or (STYLE["figure.figsize"][0] * (1 if ncols == 1 else 0.75 * ncols), 4.0))
        axes_list = [axes] if ncols == 1 else list(axes)
        for ax in axes_list:
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(True, alpha=0.3)
            for side in ("top", "right"):
                ax.spines[side].set_visible(False)
        fig.suptitle(title, fontweight="bold")
        if env is not None:
            stamp = f"{env['hardware']} | torch {env['torch']} | transformers {env['transformers']}"
            if env.get("quick_mode"):
                stamp += " | quick mode (shortened)"
            fig.text(0.99, 0.005, stamp, ha="right", va="bottom", fontsize=7, color="0.4")
        fig.tight_layout(rect=(0, 0.03, 1, 1))
        interactive = plt.isinteractive()  # the first figure may load a backend (Jupyter's inline) that turns it on
    plt.interactive(interactive)  # rc_context would reset it, and later figures would then never be shown
    return fig, axes

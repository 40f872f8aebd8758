"""Looking inside a cache while it works: a StaticLayer's state, which slots hold what, and heatmaps over steps."""

from __future__ import annotations

import torch

from .plotting import figure


def describe_layer(layer) -> dict:
    """The live state of one cache layer (StaticLayer or DynamicLayer): shapes, counter, slots written, address."""
    if not getattr(layer, "is_initialized", False) or getattr(layer, "keys", None) is None:
        return {"type": type(layer).__name__, "initialized": False,
                "note": "buffers are allocated lazily, on the first update (the prefill)"}
    keys, values = layer.keys, layer.values  # [batch, kv_heads, slots, head_dim]
    counter = getattr(layer, "cumulative_length", None)
    return {
        "type": type(layer).__name__,
        "initialized": True,
        "keys.shape": tuple(keys.shape),
        "values.shape": tuple(values.shape),
        "dtype": str(keys.dtype).replace("torch.", ""),
        "device": str(keys.device),
        "cumulative_length": int(counter) if isinstance(counter, torch.Tensor) else counter,
        "counter is a tensor": isinstance(counter, torch.Tensor),
        "slots written (nonzero keys)": int((slot_norms(layer) > 0).sum()),
        "max_cache_len": getattr(layer, "max_cache_len", keys.shape[-2]),
        "keys.data_ptr": hex(keys.data_ptr()),
    }


def slot_norms(layer, batch: int = 0) -> torch.Tensor:
    """L2 norm of the stored keys of each cache slot, over heads and head_dim: ``[slots]`` (0 = never written)."""
    keys = layer.keys[batch]  # [kv_heads, slots, head_dim]
    return keys.detach().float().norm(dim=(0, 2)).cpu()


def counters(cache) -> list[int]:
    """Every layer's ``cumulative_length`` (one sync): they should all agree, and lesson 04 shows when they do not."""
    values = [layer.cumulative_length.reshape(()) for layer in cache.layers
              if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)]
    return torch.stack(values).tolist() if values else []


class CacheRecorder:
    """An ``on_token`` callback that snapshots, after every step, the per-slot key norms of some layers, every
    layer's counter, and the token. Layers are looked up in ``cache.layers`` at each call (what the model sees now).
    """

    def __init__(self, cache, layers=(0,), then=None):
        self.cache, self.layers, self.then = cache, tuple(layers), then
        self.rows: dict[int, list[torch.Tensor]] = {i: [] for i in self.layers}  # per layer, per step: [slots]
        self.counters: list[list[int]] = []  # per step: one int per layer
        self.tokens: list[torch.Tensor] = []  # per step: [batch, 1]

    def snapshot(self) -> None:
        """Record the cache as it is now, without a token (e.g. right after a reset)."""
        for i in self.layers:
            self.rows[i].append(slot_norms(self.cache.layers[i]))
        self.counters.append(counters(self.cache))

    def __call__(self, step: int, token_ids: torch.Tensor) -> None:
        self.snapshot()
        self.tokens.append(token_ids.detach().clone())
        if self.then is not None:
            self.then(step, token_ids)

    def matrix_of(self, layer: int) -> torch.Tensor:
        """``[steps, slots]`` for one recorded layer: row ``i`` is what it held after new token ``i``."""
        rows = self.rows[layer]
        return torch.stack(rows) if rows else torch.zeros(0, 0)

    @property
    def matrix(self) -> torch.Tensor:
        """``[steps, slots]`` of the first recorded layer."""
        return self.matrix_of(self.layers[0])

    @property
    def token_ids(self) -> torch.Tensor:
        """``[batch, steps]``: the tokens seen so far (also when the run stopped on an error)."""
        return torch.cat(self.tokens, dim=1) if self.tokens else torch.zeros(1, 0, dtype=torch.long)


def plot_cache_heatmaps(panels: dict, *, title: str, env=None, frontier=None, max_slots: int | None = None):
    """Heatmaps side by side: for each ``label -> [steps, slots]`` matrix, which slot held how much key, step by step.

    ``frontier``: a list of ints, per step the number of slots a correct cache has filled: drawn as a line, so
    writes right of it (padding, warm-up copies) and holes left of it stand out.
    """
    fig, axes = figure(title, "cache slot", "decode step", env=env, ncols=len(panels),
                       figsize=(5.0 * len(panels), 4.0))
    axes = [axes] if len(panels) == 1 else axes
    vmax = max(float(m.max()) for m in panels.values() if m.numel()) or 1.0
    for ax, (label, matrix) in zip(axes, panels.items(), strict=True):
        shown = matrix[:, :max_slots] if max_slots else matrix
        im = ax.imshow(shown.numpy(), aspect="auto", origin="lower", cmap="magma", vmin=0, vmax=vmax,
                       interpolation="nearest")
        ax.set_title(label, fontsize=10)
        ax.grid(False)
        if frontier is not None:
            steps = range(len(frontier))
            ax.step([f - 0.5 for f in frontier], list(steps), where="mid", color="cyan", lw=1.2,
                    label="end of valid tokens (correct run)")
            ax.legend(loc="upper left", fontsize=7, labelcolor="white")
    fig.colorbar(im, ax=axes, shrink=0.8, label="key norm (0 = empty)")
    return fig, axes


def plot_memory_per_step(series: dict, *, title: str, env=None):
    """Lines of cache bytes per decode step, one per label (e.g. DynamicCache vs StaticCache)."""
    fig, ax = figure(title, "decode step", "KV cache (KiB)", env=env)
    for label, values in series.items():
        ax.plot(range(len(values)), [v / 1024 for v in values], label=label)
    ax.legend()
    return fig, ax

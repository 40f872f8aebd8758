"""Looking inside a cache while it works: a StaticLayer's state, which slots hold what, and heatmaps
over steps."""

from __future__ import annotations

import torch

from .decoding import StepClock
from .runtime import count, pick_device


def _check_per_sequence(layer) -> None:
    """Refuse a layer whose keys are not one row per sequence ``[batch, kv_heads, slots,
    head_dim]`` (a paged pool is shared by every request)."""
    keys = getattr(layer, "keys", None)
    if isinstance(keys, torch.Tensor) and keys.dim() != 4:
        raise ValueError(f"this layer's keys are {tuple(keys.shape)}, not [batch, kv_heads, slots, "
                         "head_dim]: a paged pool [slots, kv_heads, head_dim] is shared by every "
                         "request. The cache view shows a per-sequence cache (static, dynamic, "
                         "graph-safe, hand-written); a paged request's slots are its block "
                         "table's (kvlab.paged_cache.slots_of)")


def describe_layer(layer) -> dict:
    """The live state of one cache layer (StaticLayer or DynamicLayer): shapes, counter, slots
    written, address."""
    if not getattr(layer, "is_initialized", False) or getattr(layer, "keys", None) is None:
        return {"type": type(layer).__name__, "initialized": False,
                "note": "buffers are allocated lazily, on the first update (the prefill)"}
    _check_per_sequence(layer)
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
    """L2 norm of the stored keys of each cache slot, over heads and head_dim: ``[slots]`` (0 =
    never written)."""
    _check_per_sequence(layer)
    keys = layer.keys[batch]  # [kv_heads, slots, head_dim]
    return keys.detach().float().norm(dim=(0, 2)).cpu()


def _head_norms(layer, batch: int = 0) -> torch.Tensor:
    """L2 norm of the stored key of each kv head in each cache slot, over head_dim: ``[kv_heads,
    slots]`` (0 = empty)."""
    keys = layer.keys[batch]  # [kv_heads, slots, head_dim]
    return keys.detach().float().norm(dim=-1).cpu()


def _buffer_lengths(cache) -> list[int]:
    """Every layer's buffer length in slots (0 before allocation): ``max_cache_len`` for a
    StaticCache (plus the trash slot for a graph-safe one), the tokens held for a cache grown by
    ``torch.cat``."""
    return [
        0 if getattr(layer, "keys", None) is None else int(layer.keys.shape[-2])
        for layer in cache.layers
    ]


def counters(cache) -> list[int]:
    """Every layer's ``cumulative_length`` (one sync): they should all agree, and lesson 04 shows
    when they do not."""
    values = [layer.cumulative_length.reshape(()) for layer in cache.layers
              if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)]
    return torch.stack(values).tolist() if values else []


class CacheRecorder:
    """An ``on_token`` callback that snapshots, after every step, the per-slot key norms of some
    layers (also per kv head), every layer's counter and buffer length, the token, and the wall time
    since the previous token. Layers are looked up in ``cache.layers`` at each call (what the model
    sees now).

    The time is read with ``kvlab.decoding.StepClock`` (the device synchronized) from the end of the
    previous recording to this token, so the recording itself is not counted; the first one counts
    from the recorder's creation, and any work between two tokens (a capture, a prefill) is part of
    the later one's time.
    """

    def __init__(self, cache, layers=(0,), then=None):
        self.cache, self.then = cache, then
        try:  # count reads a NumPy or 0-dim tensor int as an int; -1 (the last layer) is one too
            self.layers = tuple(count(i, "layers", minimum=-2**63) for i in layers)
        except (TypeError, ValueError):
            raise ValueError(
                f"layers must be layer indices (ints), e.g. layers=(0, 1); got {layers!r}"
            ) from None
        # a cache made from a config has its layers now (a hand-written one makes them on first use)
        if cache.layers:
            self._check_layers(allocated=False)
        # per layer, per step: [slots]
        self.rows: dict[int, list[torch.Tensor]] = {i: [] for i in self.layers}
        # per layer, per step: [kv_heads, slots]
        self.heads: dict[int, list[torch.Tensor]] = {i: [] for i in self.layers}
        # per step: one int per layer ([] for a cache without counter tensors)
        self.counters: list[list[int]] = []
        self.lengths: list[list[int]] = []  # per step: every layer's buffer length in slots
        self.tokens: list[torch.Tensor] = []  # per token: [batch, 1]
        # per step: tokens seen up to it (a bare snapshot adds none)
        self.token_counts: list[int] = []
        # per step: wall time since the previous token (None: a bare snapshot)
        self.seconds: list[float | None] = []
        self._clock = StepClock(pick_device())

    def _check_layers(self, allocated: bool = True) -> None:
        """Refuse recorded layers the cache does not have (or, with ``allocated``, whose buffers it
        has not made)."""
        n = len(self.cache.layers)
        if not self.layers:
            return
        if n == 0:
            raise ValueError(
                "the cache has no layers yet: a HandwrittenCache makes them on its first update "
                "(the prefill). Pass the recorder as on_token= to a decode, or take a snapshot "
                "after one"
            )
        missing = [i for i in self.layers if not -n <= i < n]
        if missing:
            raise ValueError(
                f"layers {missing} are not in this cache: it has {n} layers (0..{n - 1}). Record "
                f"some of them, e.g. CacheRecorder(cache, layers=(0, {n - 1}))"
            )
        for i in self.layers:
            _check_per_sequence(self.cache.layers[i])
        empty = [i for i in self.layers if getattr(self.cache.layers[i], "keys", None) is None]
        if allocated and empty:
            raise ValueError(
                f"layers {empty} of the cache hold no buffers yet: a cache allocates them on its "
                "first update (the prefill). Pass the recorder as on_token= to a decode, or take "
                "a snapshot after one"
            )

    def snapshot(self) -> None:
        """Record the cache as it is now, without a token (e.g. right after a reset)."""
        self._check_layers()
        for i in self.layers:
            self.rows[i].append(slot_norms(self.cache.layers[i]))
            self.heads[i].append(_head_norms(self.cache.layers[i]))
        self.counters.append(counters(self.cache))
        self.lengths.append(_buffer_lengths(self.cache))
        self.token_counts.append(len(self.tokens))
        self.seconds.append(None)

    def __call__(self, step: int, token_ids: torch.Tensor) -> None:
        self._clock(step, token_ids)  # synchronizes, then reads the time since the clock started
        self.tokens.append(token_ids.detach().clone())
        self.snapshot()
        self.seconds[-1] = self._clock.times[-1]
        if self.then is not None:
            self.then(step, token_ids)
        # the next token's time starts after this recording
        self._clock = StepClock(token_ids.device)

    def matrix_of(self, layer: int) -> torch.Tensor:
        """``[steps, slots]`` for one recorded layer: row ``i`` is what it held after new token
        ``i``."""
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

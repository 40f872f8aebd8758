"""A StaticCache that a captured decode graph can replay forever: the three graph-safe overrides
(lesson 05).

``GraphSafeStaticCache`` subclasses ``transformers.StaticCache`` (5.24) and changes three things
(the other failures of lesson 04 are fixed by the decoder's rules, ``kvlab.graph_decoder``):

1. ``update()`` writes only the valid window. Of a padded input of bucket length T, only the first
   ``valid_length`` tokens enter the cache (the padded rows are routed to one extra "trash" slot at
   index ``max_cache_len`` that attention never reads), and the counter advances by the valid count,
   not by T. The valid count is a device tensor, so one graph captured at bucket T serves every
   length up to T.
2. ``cache_position`` is one live counter: all layers share ONE 0-dim tensor as
   ``cumulative_length``; the property looks it up on each access (``lazy_initialization`` would
   rebind a cached reference), and the model's RoPE positions, its causal mask, every layer's write
   and the decode loop all read it. Write positions are computed once per forward (first layer) and
   the counter advances once (last layer).
3. ``reset()`` is in place: the buffers (trash slot included) and the one counter are zeroed, no
   tensor is reallocated or rebound. 5.24's own ``StaticCache.reset()`` (``CacheLayerMixin.reset``
   per layer) already does the same in place; the override zeroes the shared counter once instead of
   once per layer and drops the write positions of a forward. Lesson 05 shows the two give the same
   tokens, addresses and contents.

The decoder that captures and replays a step over this cache is
``kvlab.graph_decoder.GraphSafeDecoder``.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager

import numpy as np
import torch
from transformers import StaticCache
from transformers.cache_utils import StaticLayer, get_layer_types_and_kwargs

from .runtime import count


class GraphSafeError(RuntimeError):
    """A graph-safe cache or decoder refused an operation that would corrupt its tensors; the
    message says what to do."""


def capturing() -> bool:
    """True while a step is being captured or traced (CUDA stream capture, torch.compile, or any
    dispatch mode: make_fx, the emulated capture, ``kvlab.lab.measure.step_op_counts``):
    no host synchronization is allowed then, so host-side checks are skipped (they run before
    capture)."""
    from torch.fx.experimental.proxy_tensor import get_proxy_mode
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    if (torch.compiler.is_compiling() or get_proxy_mode() is not None
            or _get_current_dispatch_mode_stack()):
        return True
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class GraphSafeLayer(StaticLayer):
    """A StaticLayer with one extra trash slot and the cache's shared counter as
    ``cumulative_length``.

    ``keys``/``values``: ``[batch, kv_heads, max_cache_len + 1, head_dim]``; slot ``max_cache_len``
    is the trash slot (padded rows land there); ``update`` of the cache returns the visible
    ``[..., :max_cache_len, :]`` view.
    """

    def __init__(self, max_cache_len: int, owner: GraphSafeStaticCache):
        super().__init__(max_cache_len=max_cache_len)
        self._owner = weakref.ref(owner)
        self.cumulative_length = owner._counter  # one tensor for all layers (override 2)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        owner = self._owner()
        if owner.frozen:
            raise GraphSafeError(
                "this cache is bound to a captured graph: allocating its buffers again would leave "
                "the graph writing into the old ones. Use cache.reset() (in place) for a new "
                "prompt, or build a new GraphSafeDecoder."
            )
        if capturing():
            raise GraphSafeError(
                "the cache is not initialized yet and a step is being captured: its buffers would "
                "be allocated inside the graph. Run one eager forward first (the prefill) or call "
                "cache.early_initialization(...)."
            )
        self.device = key_states.device
        self.batch_size, self.num_heads = key_states.shape[:2]
        self.k_head_dim, self.v_head_dim = key_states.shape[-1], value_states.shape[-1]
        slots = self.max_cache_len + 1  # + the trash slot
        # ordinary tensors: reset() and replays work in and out of inference mode
        with torch.inference_mode(False):
            # [batch, kv_heads, max_cache_len + 1, head_dim]
            self.keys = torch.zeros((self.batch_size, self.num_heads, slots, self.k_head_dim),
                                    dtype=key_states.dtype, device=self.device)
            self.values = torch.zeros((self.batch_size, self.num_heads, slots, self.v_head_dim),
                                      dtype=value_states.dtype, device=self.device)
        # moves the ONE counter (once) and rebinds every layer to it
        owner.share_counter(self.device)
        torch._dynamo.mark_static_address(self.keys)
        torch._dynamo.mark_static_address(self.values)
        self.is_initialized = True
        # the buffers were sized from the keys: do the values fit them?
        self.check_input(key_states, value_states)

    def offload(self):
        raise GraphSafeError("a graph-safe cache cannot be offloaded: a captured graph reads its "
                             "buffers by address")

    def check_input(self, key_states: torch.Tensor,
                    value_states: torch.Tensor | None = None) -> None:
        """Refuse, before any write, what index_copy_ would reject cryptically or a graph would read
        wrongly: keys (and values) of another batch, kv heads, head_dim, dtype or device, or keys
        and values of other lengths."""
        for what, states, head_dim, buffer in (
                ("keys", key_states, self.k_head_dim, self.keys),
                ("values", value_states, self.v_head_dim, self.values)):
            if states is None:
                continue
            want = (self.batch_size, self.num_heads, head_dim)
            got = ((states.shape[0], states.shape[1], states.shape[-1]) if states.dim() == 4
                   else tuple(states.shape))
            if (states.dim() != 4 or got != want or states.dtype != buffer.dtype
                    or states.device != buffer.device):
                raise GraphSafeError(
                    f"the cache was built for batch {want[0]}, {want[1]} kv heads, head_dim "
                    f"{want[2]}, {buffer.dtype} on {buffer.device}, but got {what} of shape "
                    f"{tuple(states.shape)}, {states.dtype} on {states.device}. Build a new cache "
                    "(or GraphSafeDecoder) for this batch size / dtype / device."
                )
        if value_states is not None and value_states.shape[-2] != key_states.shape[-2]:
            raise GraphSafeError(f"keys hold {key_states.shape[-2]} tokens but values "
                                 f"{value_states.shape[-2]}: a layer writes one key and one value "
                                 "per token")


class GraphSafeStaticCache(StaticCache):
    """``transformers.StaticCache`` with the three graph-safe overrides (see the module docstring).

    Only full-attention layers are supported (Llama, Qwen2/3, Mistral without sliding window, Gemma,
    Phi3, ...). Batch size > 1 works when all rows have the same length (one counter per cache, as
    in StaticLayer).
    """

    def __init__(self, config, max_cache_len: int, *, check_room: bool = True, **kwargs):
        max_cache_len = count(max_cache_len, "max_cache_len")
        layer_types, _ = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
        others = sorted(set(layer_types) - {"full_attention"})
        if others:
            raise ValueError(
                "GraphSafeStaticCache supports full-attention layers only; this config also has "
                f"{others}. Use a model without sliding-window/linear layers (e.g. Mistral with "
                "sliding_window=None)."
            )
        with torch.inference_mode(False):
            self._counter = torch.tensor(0, dtype=torch.long)  # THE position counter (override 2)
        # device tensor while a padded input runs (override 1)
        self.valid_length: torch.Tensor | None = None
        self._positions: torch.Tensor | None = None  # write positions of the current forward
        self.frozen = False  # True once a graph captured this cache's buffers
        # eager forwards read the counter and refuse to overflow (one host sync each)
        self._check_room = check_room
        layers = [GraphSafeLayer(max_cache_len, self) for _ in layer_types]
        # Cache.__init__: skip StaticCache's layer dispatch
        super(StaticCache, self).__init__(layers=layers, **kwargs)
        self.max_cache_len = max_cache_len

    # ---- override 2: one live counter ------------------------------------------------------------
    @property
    def cache_position(self) -> torch.Tensor:
        """The number of tokens in the cache = the position of the next token: a 0-dim device
        tensor.

        Looked up on each access (never cached: ``lazy_initialization`` moves the counter to the
        device once, which rebinds it), and the same tensor object every layer holds as
        ``cumulative_length``.
        """
        counter = self.layers[0].cumulative_length
        if any(layer.cumulative_length is not counter for layer in self.layers):
            raise GraphSafeError(
                "the layers no longer share one counter: some layer's cumulative_length was "
                "rebound to a new tensor (a captured graph keeps the old one). Never assign "
                "cumulative_length; use cache.reset() or set_position()."
            )
        return counter

    def share_counter(self, device: torch.device) -> None:
        """Move THE counter to ``device`` (once) and point every layer's ``cumulative_length`` at
        it: called by a layer's ``lazy_initialization``, which in a vanilla StaticLayer would give
        each layer a counter of its own."""
        if self._counter.device != device:
            with torch.inference_mode(False):
                self._counter = self._counter.to(device)
            torch._dynamo.mark_static_address(self._counter)
        for layer in self.layers:
            layer.cumulative_length = self._counter

    def set_position(self, position: int | torch.Tensor) -> None:
        """Put the counter at ``position`` with an in-place write (the tensor a graph captured stays
        the same)."""
        if isinstance(position, np.integer):
            position = int(position)
        if isinstance(position, bool) or not isinstance(position, int | torch.Tensor):
            raise TypeError("position must be an int or a 0-dim integer tensor, got "
                            f"{type(position).__name__}")
        if isinstance(position, torch.Tensor):
            if (position.numel() != 1 or position.dtype.is_floating_point
                    or position.dtype == torch.bool):
                raise ValueError(f"position must be a 0-dim integer tensor, got {position.dtype} "
                                 f"of shape {tuple(position.shape)}")
            # eager: one host read; inside a capture the tensor is refilled before each replay
            if not capturing():
                self.set_position(int(position))  # checks the range
                return
            self.cache_position.copy_(position)
        else:
            if not 0 <= position <= self.max_cache_len:
                raise ValueError(f"position must be in [0, {self.max_cache_len}] (max_cache_len), "
                                 f"got {position}")
            self.cache_position.fill_(position)

    # ---- override 1: write only the valid window -------------------------------------------------
    @contextmanager
    def valid_window(self, valid_length: torch.Tensor):
        """Context manager: inside it, of each input of length T only the first ``valid_length``
        tokens count.

        ``valid_length`` is a 0-dim long device tensor; refill it in place (``.fill_(n)``) between
        replays.
        """
        if (not isinstance(valid_length, torch.Tensor) or valid_length.numel() != 1
                or valid_length.dtype.is_floating_point or valid_length.dtype == torch.bool):
            raise GraphSafeError("valid_length must be a 0-dim integer tensor, got "
                                 f"{valid_length!r}")
        self.valid_length = valid_length
        try:
            yield self
        finally:
            self.valid_length = None

    def write_positions(self, length: int, device: torch.device) -> torch.Tensor:
        """Slots for ``length`` incoming tokens: counter + i for valid rows, the trash slot for the
        rest. [length]"""
        counter = self.cache_position
        rows = torch.arange(length, device=device)  # [T]
        positions = counter + rows  # [T]
        # never index past the buffer, even if the host check was bypassed
        keep = positions < self.max_cache_len
        if self.valid_length is not None:
            keep = keep & (rows < self.valid_length)
        return torch.where(keep, positions, self.max_cache_len)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args,
               **kwargs):
        """Write the valid tokens of ``key_states``/``value_states`` [batch, kv_heads, T, head_dim];
        return the visible buffers [batch, kv_heads, max_cache_len, head_dim]."""
        self.check_update(key_states, value_states, layer_idx)
        layer = self.layers[layer_idx]
        if not layer.is_initialized:
            layer.lazy_initialization(key_states, value_states)
        length = key_states.shape[-2]  # T
        # once per forward: where the T rows go (valid ones after the counter, the rest to trash)
        if layer_idx == 0:
            self._positions = self.write_positions(length, key_states.device)  # [T]
        # keys: [batch, kv_heads, max_cache_len + 1, head_dim]
        layer.keys.index_copy_(2, self._positions, key_states)
        layer.values.index_copy_(2, self._positions, value_states)
        # once per forward: the one counter moves by the valid count
        if layer_idx == len(self.layers) - 1:
            self.cache_position.add_(length if self.valid_length is None else self.valid_length)
            self._positions = None
        return layer.keys[:, :, : self.max_cache_len], layer.values[:, :, : self.max_cache_len]

    def check_update(self, key_states: torch.Tensor, value_states: torch.Tensor,
                     layer_idx: int) -> None:
        """The door of ``update``: refuse a layer that is not the cache's, keys or values its
        buffers cannot hold, layers out of order within one forward, and (eager only, one host read)
        a write past ``max_cache_len``."""
        if not isinstance(layer_idx, int) or not 0 <= layer_idx < len(self.layers):
            raise GraphSafeError(f"layer_idx {layer_idx!r} is not a layer of this cache "
                                 f"(0..{len(self.layers) - 1}): build the cache from the model's "
                                 "config")
        # (a first update checks them once the buffers exist)
        if self.layers[layer_idx].is_initialized:
            self.layers[layer_idx].check_input(key_states, value_states)
        length = key_states.shape[-2]
        if layer_idx == 0:
            if self._check_room and not capturing():
                self._refuse_overflow(length)
        elif self._positions is None or self._positions.shape[0] != length:
            raise GraphSafeError("layer updates must come in order 0, 1, ... within one forward "
                                 "(layer 0 computes the write positions)")

    @contextmanager
    def unchecked(self):
        """Inside it, eager forwards skip the room check (its host sync): for a caller that checked
        room once for many steps, or warm-up calls whose writes past the end go to the trash slot
        and are undone."""
        saved, self._check_room = self._check_room, False
        try:
            yield self
        finally:
            self._check_room = saved

    def _refuse_overflow(self, length: int) -> None:
        """Eager only (it reads the counter on the host): refuse a write past max_cache_len before
        it happens, and a valid window outside ``[0, length]`` (the counter would move by a count of
        tokens that were not written)."""
        valid = length if self.valid_length is None else int(self.valid_length)
        if not 0 <= valid <= length:
            raise GraphSafeError(f"valid_length is {valid} for an input of {length} tokens: it "
                                 f"must be in [0, {length}]")
        used = int(self.cache_position)
        if used + valid > self.max_cache_len:
            raise GraphSafeError(
                f"the cache holds {used} of {self.max_cache_len} tokens and {valid} more do not "
                "fit: build the cache (or GraphSafeDecoder) with a larger max_cache_len, or decode "
                "fewer tokens."
            )

    # ---- override 3: reset in place --------------------------------------------------------------
    def reset(self) -> None:
        """Empty the cache in place, no tensor reallocated: one multi-tensor launch zeroes every
        layer's keys and values (not two launches per layer from Python), the counter goes to 0."""
        buffers = [t for layer in self.layers if layer.is_initialized
                   for t in (layer.keys, layer.values)]
        if buffers:
            torch._foreach_zero_(buffers)
        self.cache_position.zero_()
        self._positions = None

    # ---- what a captured graph depends on --------------------------------------------------------
    def fingerprint(self) -> tuple:
        """The addresses a captured graph reads: every buffer and the counter."""
        return tuple(layer.cumulative_length.data_ptr() for layer in self.layers) + tuple(
            t.data_ptr() if t is not None else None
            for layer in self.layers for t in (layer.keys, layer.values)
        )

    def early_initialization(self, *args, **kwargs):
        if self.frozen:
            raise GraphSafeError("this cache is bound to a captured graph: its buffers cannot be "
                                 "allocated again")
        return super().early_initialization(*args, **kwargs)

"""A paged KV cache: each layer's keys and values in one pool of fixed-size blocks, shared by every
request (lesson 07).

A static cache gives every row ``max_cache_len`` slots up front, however short the request; a paged
cache (vLLM's PagedAttention bookkeeping) cuts memory into blocks of ``block_size`` slots and hands
a request a block only when it grows into one. Three small tables say where everything is:

- ``block_table [batch, max_blocks_per_request]``: row ``b``'s blocks, in order. Logical position
  ``p`` of row ``b`` lives in slot ``block_table[b, p // block_size] * block_size + p % block_size``
  of the pool.
- ``slot_mapping [batch, T]``: the pool slot each incoming token is written to. A padding row (a
  batch padded up to a captured graph's size) writes to the *trash slot*, the pool's last slot,
  which no live row ever reads: kvlab's ``GraphSafeStaticCache`` does the same with its slot
  ``max_cache_len``. vLLM instead marks such rows ``PAD_SLOT_ID = -1`` and its write kernel skips
  them; SGLang reserves slot 0 of its pool as the dummy slot.
- ``seq_lens [batch]``: each row's length once this step's tokens are written. Unlike the graph-safe
  cache's ONE counter, every request sits at its own position; the caller passes per-row
  ``position_ids`` and the 4-D mask ``paged_mask(seq_lens, T, max_len)`` builds from them.

``PagedKVCache`` is a ``transformers.Cache`` (5.24), so the model's own forward runs over it, for
any full-attention architecture (Llama, Qwen2/3, Mistral, ...): each attention layer calls
``update``, which writes the new keys/values by slot mapping and returns the row's keys/values
gathered through its block table as ``[batch, kv_heads, max_len, head_dim]`` (a real PagedAttention
kernel reads the blocks in place instead of gathering them; the gather keeps the model's own
attention code). ``BlockAllocator`` is the host-side free list. ``kvlab.continuous_batching``
schedules requests over both and decodes them with captured graphs.
"""

from __future__ import annotations

from collections import deque
from contextlib import contextmanager

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, get_layer_types_and_kwargs

from .runtime import as_dtype, count


class PagedCacheError(RuntimeError):
    """The paged cache or its allocator refused an operation; the message says what to do."""


class OutOfBlocksError(PagedCacheError):
    """The pool has fewer free blocks than asked for."""


# ------------------------------------------------------------------------------------ the host side

class BlockAllocator:
    """The free list of a pool of ``num_blocks`` blocks (host side, plain Python: no tensor,
    no device sync).

    ``allocate(n)`` hands out ``n`` free blocks (lowest ids first, so a test can predict them),
    ``free(blocks)`` gives them back, and a freed block is handed out again. Asking for more than
    are free raises ``OutOfBlocksError`` before anything is taken.
    """

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks = count(num_blocks, "num_blocks")
        self._free = deque(range(num_blocks))
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return len(self._used)

    def allocate(self, n: int = 1) -> list[int]:
        n = count(n, "allocate takes a number of blocks: n", minimum=0)
        if n > len(self._free):
            raise OutOfBlocksError(
                f"asked for {n} block(s) but only {len(self._free)} of {self.num_blocks} are free: "
                "free the blocks of finished requests first, or build the pool with more blocks "
                "(num_blocks=)")
        blocks = [self._free.popleft() for _ in range(n)]
        self._used.update(blocks)
        return blocks

    def free(self, blocks) -> None:
        blocks = list(blocks)
        stray = [b for b in blocks if b not in self._used]
        if stray or len(set(blocks)) != len(blocks):
            raise PagedCacheError(f"blocks {stray or blocks} are not in use (freed twice?): free "
                                  "only what allocate gave")
        self._used.difference_update(blocks)
        self._free.extend(sorted(blocks))


def blocks_for(length: int, block_size: int) -> int:
    """The blocks that hold ``length`` tokens: ceil(length / block_size)."""
    length, block_size = count(length, "length", minimum=0), count(block_size, "block_size")
    return -(-length // block_size)


# -------------------------------------------------------------------------------- memory accounting

def bytes_per_token(config, dtype: torch.dtype | str = torch.float32) -> int:
    """Bytes one token's keys and values take in every layer: 2 x layers x kv_heads x head_dim x
    element size (``dtype``: a torch dtype or a name, ``"bfloat16"``)."""
    dtype = as_dtype(dtype)
    text = config.get_text_config(decoder=True)
    kv_heads, head_dim = _kv_shape(text)
    return (2 * text.num_hidden_layers * kv_heads * head_dim
            * torch.empty((), dtype=dtype).element_size())


def _accounting_inputs(lengths, block_size: int) -> list[int]:
    """``memory_accounting``'s door: the lengths as ints, refused if negative, and
    the block size."""
    lengths = [int(n) for n in lengths]
    if any(n < 0 for n in lengths):
        raise ValueError(f"lengths are tokens in the cache, >= 0; got {lengths}")
    count(block_size, "block_size")
    return lengths


def memory_accounting(lengths, block_size: int, token_bytes: int, batch: int | None = None) -> dict:
    """What a set of requests holds in a paged cache versus in a static cache, in bytes.

    ``lengths``: each request's tokens in the cache (prompt + generated). Paged: each request holds
    ``ceil(length / block_size)`` blocks of ``block_size * token_bytes`` bytes, so at most
    ``block_size - 1`` slots are wasted per request. Static: every one of ``batch`` rows (default:
    one per request) is sized for the longest request. Returns ``per_request`` (list of bytes),
    ``paged``, ``static`` and ``paged_fraction`` (paged / static).
    """
    lengths = _accounting_inputs(lengths, block_size)
    batch = len(lengths) if batch is None else batch
    per_request = [blocks_for(n, block_size) * block_size * token_bytes for n in lengths]
    static = batch * max(lengths, default=0) * token_bytes
    paged = sum(per_request)
    return {"per_request": per_request, "paged": paged, "static": static,
            "paged_fraction": paged / static if static else 0.0}


# ---------------------------------------------------------------------------------- the device side

def _kv_shape(text_config) -> tuple[int, int]:
    """(kv_heads, head_dim) of a text config."""
    heads = text_config.num_attention_heads
    kv_heads = getattr(text_config, "num_key_value_heads", None) or heads
    head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // heads
    return kv_heads, head_dim


def paged_mask(seq_lens: torch.Tensor, query_len: int, max_len: int) -> torch.Tensor:
    """The 4-D bool mask ``[batch, 1, T, max_len]`` of a step of ``T`` tokens per
    row (True: attend).

    Row ``b``'s ``T`` queries are its last ``T`` positions ``seq_lens[b] - T .. seq_lens[b] - 1``;
    query ``t`` sees the logical slots ``j <= seq_lens[b] - T + t``. A padding row
    (``seq_lens = 1``, ``T = 1``) sees slot 0 only, so its softmax has something to normalize (no
    NaN). Device ops only: it runs inside a captured step.
    """
    device = seq_lens.device
    # [batch, T] positions
    last = seq_lens[:, None] - query_len + torch.arange(query_len, device=device)[None, :]
    # [batch, T, max_len]
    visible = torch.arange(max_len, device=device)[None, None, :] <= last[:, :, None]
    return visible[:, None]


def model_mask(mask: torch.Tensor, model) -> torch.Tensor:
    """``mask`` as the model's attention takes it: bool for SDPA, else an additive float mask (0
    / dtype min)."""
    if model.config._attn_implementation == "sdpa":
        return mask
    dtype = next(model.parameters()).dtype
    return (torch.zeros((), dtype=dtype, device=mask.device)
            .masked_fill(~mask, torch.finfo(dtype).min))


class PagedLayer(CacheLayerMixin):
    """One layer's pools: ``keys``/``values`` ``[num_blocks * block_size + 1, kv_heads, head_dim]``
    (last: trash slot).

    Allocated at construction (not lazily: a captured graph reads them by address, so
    they never move).
    """

    is_sliding = False

    def __init__(self, slots: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device):
        super().__init__()
        # ordinary tensors: replays work in and out of inference mode
        with torch.inference_mode(False):
            self.keys = torch.zeros(slots, kv_heads, head_dim, dtype=dtype, device=device)
            self.values = torch.zeros(slots, kv_heads, head_dim, dtype=dtype, device=device)
        self.device, self.is_initialized = torch.device(device), True

    def lazy_initialization(self, key_states, value_states) -> None:
        raise PagedCacheError("a paged layer allocates its pools when it is built, never lazily")

    def update(self, *args, **kwargs):
        raise PagedCacheError("call PagedKVCache.update (it holds the block table and slot "
                              "mapping), not a layer's")

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        raise PagedCacheError(_NO_LENGTH)

    def get_seq_length(self) -> int:
        raise PagedCacheError(_NO_LENGTH)

    def get_max_length(self) -> int:
        return -1

    def offload(self):
        raise PagedCacheError("a paged cache cannot be offloaded: a captured graph reads its pools "
                              "by address")


_NO_LENGTH = ("a paged cache has one length per row (seq_lens), not one for the cache: pass "
             "position_ids and a 4-D attention_mask (kvlab.paged_cache.paged_mask) to the model's "
             "forward")


class PagedKVCache(Cache):
    """``num_blocks`` blocks of ``block_size`` slots per layer, read and written
    through a block table.

    ``max_blocks_per_request``: the block table's width; a row sees
    ``max_len = max_blocks_per_request * block_size`` logical slots (its gathered keys). ``update``
    works only inside ``with cache.reading(block_table, slot_mapping):``, which says, for one
    forward, where each row's blocks are and where its incoming tokens go.
    """

    def __init__(self, config, *, num_blocks: int, block_size: int, max_blocks_per_request: int,
                 dtype: torch.dtype | str = torch.float32, device="cpu"):
        dtype = as_dtype(dtype)  # a name too: "bfloat16"
        num_blocks, block_size, max_blocks_per_request = (
            count(num_blocks, "num_blocks"), count(block_size, "block_size"),
            count(max_blocks_per_request, "max_blocks_per_request"))
        text = config.get_text_config(decoder=True)
        layer_types, _ = get_layer_types_and_kwargs(text)
        others = sorted(set(layer_types) - {"full_attention"})
        if others:
            raise ValueError("PagedKVCache supports full-attention layers only; this config also "
                             f"has {others}. Use a model without sliding-window/linear layers "
                             "(e.g. Mistral with sliding_window=None)")
        self.kv_heads, self.head_dim = _kv_shape(text)
        self.num_blocks, self.block_size = num_blocks, block_size
        self.max_blocks_per_request = max_blocks_per_request
        self.max_len = max_blocks_per_request * block_size  # logical slots one row sees
        # the pool's last slot: padding rows write here, nobody reads it
        self.trash_slot = num_blocks * block_size
        super().__init__(layers=[PagedLayer(self.trash_slot + 1, self.kv_heads, self.head_dim,
                                            dtype, device)
                                 for _ in layer_types])

        # [batch, max_blocks_per_request] of the forward running now
        self._table: torch.Tensor | None = None
        self._slots: torch.Tensor | None = None  # [batch, T]
        # [batch * max_len] pool slots of each row's logical slots
        self._gather: torch.Tensor | None = None

    @property
    def block_bytes(self) -> int:
        """Bytes of one block, keys and values of every layer."""
        layer = self.layers[0]
        return (2 * len(self.layers) * self.block_size * self.kv_heads * self.head_dim
                * layer.keys.element_size())

    @contextmanager
    def reading(self, block_table: torch.Tensor, slot_mapping: torch.Tensor, *,
                check_ids: bool = True):
        """Inside: ``update`` writes incoming token ``t`` of row ``b`` to pool slot
        ``slot_mapping[b, t]`` and returns row ``b``'s blocks ``block_table[b]``, gathered. Enter it
        inside a captured step, so that the gather's index is computed from the static buffers
        at every replay.

        ``check_ids``: block ids must lie in ``0 .. num_blocks - 1`` and slots in
        ``0 .. trash_slot``, checked here with one host read of both tables' min and max (an id out
        of range would be a device-side assert on a GPU). A caller whose tables come from its own
        ``BlockAllocator`` (``ContinuousBatcher``) passes False: no host sync inside its
        captured step."""
        pool_device = self.layers[0].keys.device
        for name, t, width in (("block_table", block_table, self.max_blocks_per_request),
                               ("slot_mapping", slot_mapping, None)):
            if (not isinstance(t, torch.Tensor) or t.dim() != 2 or t.dtype != torch.long
                    or (width is not None and t.shape[1] != width)):
                raise PagedCacheError(f"{name} must be a long tensor [batch, {width or 'T'}], got "
                                      f"{t!r:.80}")
            if t.device != pool_device:
                raise PagedCacheError(f"{name} is on {t.device} but the pools are on "
                                      f"{pool_device}: move it there")
        if block_table.shape[0] != slot_mapping.shape[0]:
            raise PagedCacheError(f"block_table has {block_table.shape[0]} rows but slot_mapping "
                                  f"{slot_mapping.shape[0]}")
        if check_ids and block_table.numel() and slot_mapping.numel():
            blocks, slots = block_table.aminmax(), slot_mapping.aminmax()
            # one host read
            ranges = torch.stack([blocks.min, blocks.max, slots.min, slots.max]).tolist()
            for name, (low, high), top in (("block_table", ranges[:2], self.num_blocks - 1),
                                           ("slot_mapping", ranges[2:], self.trash_slot)):
                if low < 0 or high > top:
                    raise PagedCacheError(
                        f"{name} holds ids {low} .. {high}, but this cache's {name.split('_')[0]} "
                        f"ids run 0 .. {top} ({self.num_blocks} blocks of {self.block_size} slots, "
                        f"trash slot {self.trash_slot}): use ids from its BlockAllocator and "
                        "kvlab.paged_cache.slots_of")
        self._table, self._slots = block_table, slot_mapping
        try:
            yield self
        finally:
            self._table = self._slots = self._gather = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args,
               **kwargs):
        """Write ``key_states``/``value_states`` ``[batch, kv_heads, T, head_dim]`` by slot mapping
        (in place) and return each row's keys/values gathered through its block table,
        ``[batch, kv_heads, max_len, head_dim]``."""
        batch, heads, length, dim = key_states.shape
        if self._slots is None:
            raise PagedCacheError("update outside `with cache.reading(block_table, "
                                  "slot_mapping):`: the cache does not know where this forward's "
                                  "tokens go")
        if ((batch, length) != tuple(self._slots.shape)
                or (heads, dim) != (self.kv_heads, self.head_dim)):

            raise PagedCacheError(f"keys {tuple(key_states.shape)} do not match slot_mapping "
                                  f"{tuple(self._slots.shape)} and the pool's {self.kv_heads} kv "
                                  f"heads of head_dim {self.head_dim}")
        layer = self.layers[layer_idx]
        if (key_states.dtype, key_states.device) != (layer.keys.dtype, layer.keys.device):
            raise PagedCacheError(f"the model's keys are {key_states.dtype} on "
                                  f"{key_states.device}, the pool holds {layer.keys.dtype} on "
                                  f"{layer.keys.device}: build the PagedKVCache with the model's "
                                  "dtype= and device=")
        where = self._slots.reshape(-1)  # [batch * T] pool slots
        layer.keys.index_copy_(0, where,
                               key_states.transpose(1, 2).reshape(batch * length, heads, dim))
        layer.values.index_copy_(0, where,
                                 value_states.transpose(1, 2).reshape(batch * length, heads, dim))
        # once per forward: the pool slot of every logical slot of every row
        if layer_idx == 0 or self._gather is None:
            offsets = torch.arange(self.block_size, device=self._table.device)  # [block_size]
            # [batch * max_len]
            self._gather = (self._table[:, :, None] * self.block_size + offsets).reshape(-1)
        keys = layer.keys.index_select(0, self._gather).view(batch, self.max_len, heads, dim)
        values = layer.values.index_select(0, self._gather).view(batch, self.max_len, heads, dim)
        return keys.transpose(1, 2), values.transpose(1, 2)  # [batch, kv_heads, max_len, head_dim]

    def pool_addresses(self) -> tuple:
        """The addresses a captured graph reads: every layer's key and value pool."""
        return tuple(t.data_ptr() for layer in self.layers for t in (layer.keys, layer.values))


def _check_positions(blocks, start, stop, block_size) -> None:
    """``slots_of``'s door: 0 <= start <= stop, and positions the request's blocks hold (a negative
    position would index ``blocks`` from its end: another request's slots)."""
    start, stop = count(start, "start", minimum=0), count(stop, "stop", minimum=0)
    if stop < start:
        raise ValueError(f"stop ({stop}) is below start ({start}): positions start .. stop - 1")
    if stop > len(blocks) * count(block_size, "block_size"):
        raise ValueError(f"position {stop - 1} is past the {len(blocks)} block(s) of "
                         f"{block_size} slots the request holds: allocate "
                         f"blocks_for({stop}, {block_size}) blocks first")


def slots_of(blocks: list[int], start: int, stop: int, block_size: int) -> list[int]:
    """Pool slots of logical positions ``start .. stop - 1`` of a request holding
    ``blocks`` (host side)."""
    _check_positions(blocks, start, stop, block_size)
    return [blocks[p // block_size] * block_size + p % block_size for p in range(start, stop)]


def table_row(blocks: list[int], width: int) -> list[int]:
    """A block-table row: the request's blocks, then 0s (never read: the mask hides slots
    past its length)."""
    if len(blocks) > width:
        raise PagedCacheError(f"a request holds {len(blocks)} blocks but a block-table row has "
                              f"{width}: build the cache with a larger max_blocks_per_request")
    return list(blocks) + [0] * (width - len(blocks))


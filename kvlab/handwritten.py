"""A KV cache written from scratch, plugged into a HuggingFace model, and the decode loop that uses
it.

The HF model (transformers 5.24) asks its ``cache=`` argument only four things:

- ``update(key_states, value_states, layer_idx)``: every attention layer hands over the keys and
  values of the tokens it was just fed and gets back those of all tokens so far, which it attends
  over;
- ``get_seq_length()``: how many tokens are cached; the model numbers the new positions from there;
- ``get_query_offset(layer_idx)`` and ``get_mask_sizes(query_length, layer_idx)``: where the queries
  start and how long the keys are, so that ``masking_utils`` builds a causal mask of the right
  shape.

``HandwrittenCache`` answers exactly those. Its storage grows with ``torch.cat``: simple, but every
step copies the whole cache into a new tensor (``bytes_copied`` counts it), the cost lesson 03
removes.
"""

from __future__ import annotations

import torch

from .decoding import OnToken, greedy
from .sizes import kv_bytes_per_token


def _check_states(key_states, value_states, keys=None) -> None:
    """Refuse K/V that cannot belong together (or to what ``keys`` already holds) before anything is
    written."""
    if not (isinstance(key_states, torch.Tensor) and isinstance(value_states, torch.Tensor)
            and key_states.dim() == 4 and value_states.dim() == 4):
        raise ValueError("keys and values must be tensors [batch, kv_heads, new_tokens, head_dim]")
    if key_states.shape[:3] != value_states.shape[:3] or key_states.dtype != value_states.dtype:
        raise ValueError(
            f"keys {tuple(key_states.shape)} {key_states.dtype} and values "
            f"{tuple(value_states.shape)} {value_states.dtype} must share batch, kv heads, token "
            "count and dtype"
        )
    if keys is not None and (
        key_states.shape[0] != keys.shape[0]
        or key_states.shape[1] != keys.shape[1]
        or key_states.shape[3] != keys.shape[3]
        or key_states.dtype != keys.dtype
        or key_states.device != keys.device
    ):
        raise ValueError(
            f"new keys {tuple(key_states.shape)} {key_states.dtype} on {key_states.device} do not "
            f"fit the cached {tuple(keys.shape)} {keys.dtype} on {keys.device} (batch, kv heads, "
            "head_dim, dtype and device must stay the same): use a fresh HandwrittenCache for "
            "another batch, model or dtype"
        )


class HandwrittenLayer:
    """One decoder layer's keys and values, grown by concatenation along the sequence axis."""

    def __init__(self):
        self.keys: torch.Tensor | None = None  # [batch, kv_heads, seq, head_dim]
        self.values: torch.Tensor | None = None  # [batch, kv_heads, seq, head_dim]
        self.bytes_copied = 0  # bytes written by torch.cat into this layer, summed over all updates

    @property
    def seq_len(self) -> int:
        return 0 if self.keys is None else self.keys.shape[-2]

    def append(
        self, key_states: torch.Tensor, value_states: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new tokens' K and V ``[batch, kv_heads, new, head_dim]``; return all of them so
        far."""
        _check_states(key_states, value_states, self.keys)
        if self.keys is None:  # first call: start from an empty sequence of the right shape
            batch, kv_heads, _, head_dim = key_states.shape
            # [batch, kv_heads, 0, head_dim]
            self.keys = key_states.new_empty(batch, kv_heads, 0, head_dim)
            self.values = value_states.new_empty(batch, kv_heads, 0, value_states.shape[-1])
        # torch.cat allocates a new [batch, kv_heads, seq + new, head_dim] tensor and copies old AND
        # new into it
        self.keys = torch.cat([self.keys, key_states], dim=-2)
        self.values = torch.cat([self.values, value_states], dim=-2)
        self.bytes_copied += self.keys.nbytes + self.values.nbytes
        return self.keys, self.values


class HandwrittenCache:
    """A KV cache from scratch: a list of ``HandwrittenLayer``, one per decoder layer, made on first
    use.

    Pass it as ``model(input_ids, cache=cache)``; the model calls the four methods below.
    """

    # masking_utils asks this; a cache whose tensors change shape every step cannot live in a
    # compiled graph.
    is_compileable = False

    def __init__(self):
        self.layers: list[HandwrittenLayer] = []

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        """Called by attention layer ``layer_idx`` with this step's K/V; returns K/V of all tokens
        so far."""
        if not isinstance(layer_idx, int) or isinstance(layer_idx, bool) or layer_idx < 0:
            raise ValueError(
                f"layer_idx must be an int >= 0 (the attention layer's index), got {layer_idx!r}"
            )
        while len(self.layers) <= layer_idx:
            self.layers.append(HandwrittenLayer())
        return self.layers[layer_idx].append(key_states, value_states)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Tokens cached so far. The model gives the tokens it is fed positions ``seq_length,
        seq_length+1, ...``."""
        return self.layers[layer_idx].seq_len if layer_idx < len(self.layers) else 0

    def get_query_offset(self, layer_idx: int = 0) -> int:
        """Position of the first query of this forward pass: right after the cached tokens."""
        return self.get_seq_length(layer_idx)

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        """``(kv_length, kv_offset)``: after this pass's update the keys cover cached + new tokens,
        from position 0."""
        return self.get_seq_length(layer_idx) + query_length, 0

    @property
    def bytes_copied(self) -> int:
        """Bytes ``torch.cat`` has written, all layers, all steps (each step rewrites the whole
        cache)."""
        return sum(layer.bytes_copied for layer in self.layers)


def cat_bytes_copied(config, prompt_len: int, new_tokens: int, dtype, *, batch: int = 1) -> int:
    """Bytes ``HandwrittenCache`` copies while ``decode_handwritten`` makes ``new_tokens`` tokens.

    Step ``i`` leaves ``prompt_len + i`` tokens cached and its cat rewrites all of them, so the
    total is ``bytes_per_token x batch x (n*p + n*(n-1)/2)``: quadratic in the number of new tokens.
    """
    p, n = prompt_len, new_tokens
    for name, value in (("prompt_len", p), ("new_tokens", n), ("batch", batch)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    return kv_bytes_per_token(config, dtype) * batch * (n * p + n * (n - 1) // 2)


def check_cache(cache):
    """``cache``, refused unless an empty ``HandwrittenCache`` (``decode_handwritten``'s door)."""
    if not isinstance(cache, HandwrittenCache):
        raise ValueError(f"cache must be a HandwrittenCache, got {type(cache).__name__}: pass a "
                         "fresh HandwrittenCache() (or none). A transformers cache is "
                         "strategy='dynamic' or 'static'")
    if cache.get_seq_length() != 0:
        raise ValueError(f"this HandwrittenCache already holds {cache.get_seq_length()} tokens and "
                         "would continue the old sequence: pass a fresh HandwrittenCache()")
    return cache


@torch.inference_mode()
def decode_handwritten(
    model, input_ids: torch.Tensor, max_new_tokens: int, *, on_token: OnToken = None, cache:
    HandwrittenCache | None = None
) -> torch.Tensor:
    """Greedy decode with a ``HandwrittenCache``: the prompt once, then only the newest token each
    step.

    Pass your own empty ``cache`` to inspect it afterwards (bytes held, bytes copied).
    """
    cache = HandwrittenCache() if cache is None else check_cache(cache)
    seq = input_ids  # [batch, prompt_len]
    fed = input_ids  # what the model has not seen yet: the prompt, later only the newest token
    for step in range(max_new_tokens):
        # [batch, len(fed), vocab]: new positions only
        logits = model(fed, cache=cache, use_cache=True).logits
        next_id = greedy(logits)  # [batch, 1]
        seq = torch.cat([seq, next_id], dim=1)
        fed = next_id  # its position is cache.get_seq_length(): the positions continue
        if on_token is not None:
            on_token(step, next_id.clone())  # the caller's copy: the next step reads it
    return seq[:, input_ids.shape[1]:]

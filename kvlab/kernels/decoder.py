"""Lesson 06's kernels decoder: ``kernel_step`` (``kvlab.kernels.step``) handed to a
``GraphSafeDecoder``.

The decoder takes a step as a plain function; what the kernels' step needs beyond the model, the
cache and the token (its arrival counters, its options) is bound here with
``functools.partial``, once per decoder:

    step = partial(kernel_step, counters=arrival_counters(model, batch, device), tiles=True, ...)
    GraphSafeDecoder(model, max_cache_len, batch, step=step, steps=16, prefill=...,
                     prefill_bucket=...)

The kernels read the model's own weights (q/k/v and gate/up as stacked parts), so the decoder holds
no second copy: an in-place edit of a weight reaches the next replay, a weight replaced or moved is
refused. They never run the modules' Python, so a model with forward hooks or a patched ``forward``
is refused (``check_supported``): ``graph-safe`` runs them. The prefill is captured too, at the
prompt's power-of-two bucket, and runs through the same kernels (``kernel_prefill``) up to
``KERNEL_PREFILL_MAX_ROWS`` prompt rows, through the model's forward above.
``speculative_kernels_decoder`` gives lesson 07's speculation the same step, its verify of k + 1
rows through the prefill's kernels.
"""

from __future__ import annotations

from functools import partial

import torch

from ..decoding import OnToken
from ..graph_decoder import GraphSafeDecoder, cache_length, decoder_for, prompt_bucket
from ..runtime import count
from ..speculative import SpeculativeDecoder, decode_speculative, speculative_decoder
from .step import arrival_counters, check_supported, kernel_prefill, kernel_step, kernel_verify

KERNEL_OPTIONS = ("dot_attention", "tiles", "fill_splits")  # kernel_step's variants
# The most prompt rows (batch x padded prompt length) sent through kernel_prefill; above, the
# model's forward. Rule: the kernels' tiles are chosen for decode-sized row counts; data/README.md
# names the record that set it.
KERNEL_PREFILL_MAX_ROWS = 1024


def kernels_decoder(model, input_ids: torch.Tensor, max_new_tokens: int, *, steps: int = 16,
                    max_cache_len: int | None = None, graph: bool | str = True,
                    captured_prefill: bool = True, prefill_bucket: int | None = None,
                    dot_attention: bool = True, tiles: bool = True,
                    fill_splits: bool = True) -> GraphSafeDecoder:
    """The decoder ``decode_graph_safe_kernels`` builds for one call: ``kernel_step`` with its
    options (``KERNEL_OPTIONS``, ``kernel_step``'s docstring), ``steps`` steps per captured graph.
    ``captured_prefill``: the prefill is captured too, at ``prefill_bucket`` tokens (default
    ``prompt_bucket`` of this prompt), so the first token costs one replay instead of an eager
    prefill that launches every kernel from Python; it serves prompts up to that bucket, so build
    it for the longest prompt it will see, or give a larger ``prefill_bucket``."""
    check_supported(model)
    batch = input_ids.shape[0]
    length = cache_length(input_ids, max_new_tokens, max_cache_len)
    if prefill_bucket is not None and not captured_prefill:
        raise ValueError("prefill_bucket= is the captured prefill's length, and captured_prefill="
                         "False runs the prefill eagerly at the prompt's own length: pass one of "
                         "the two")
    on = next(model.parameters()).device  # the counters go where the kernels run, not the ids
    bucket = (None if not captured_prefill else prompt_bucket(input_ids.shape[1], length)
              if prefill_bucket is None else count(prefill_bucket, "prefill_bucket"))
    step = partial(kernel_step, counters=arrival_counters(model, batch, on),
                   dot_attention=dot_attention, tiles=tiles, fill_splits=fill_splits)
    through_kernels = batch * (bucket or input_ids.shape[1]) <= KERNEL_PREFILL_MAX_ROWS
    prefill = partial(kernel_prefill, tiles=tiles) if through_kernels else None
    decoder = GraphSafeDecoder(model, length, batch, step=step, steps=steps, prefill=prefill,
                               prefill_bucket=bucket, graph=graph)
    decoder.kvlab_strategy = "graph-safe-kernels"
    return decoder


def decode_graph_safe_kernels(model, input_ids: torch.Tensor, max_new_tokens: int, *,
                              on_token: OnToken = None, decoder: GraphSafeDecoder | None = None,
                              **settings) -> torch.Tensor:
    """The ``"graph-safe-kernels"`` strategy: ``decoder`` (else ``kernels_decoder(model, ...,
    **settings)``) generates."""
    if decoder is None:
        decoder = kernels_decoder(model, input_ids, max_new_tokens, **settings)
    return decoder_for(decoder, model).generate(input_ids, max_new_tokens, on_token=on_token)


def speculative_kernels_decoder(model, input_ids: torch.Tensor, max_new_tokens: int, *, k: int = 4,
                                max_ngram: int = 3, min_ngram: int = 1,
                                max_cache_len: int | None = None,
                                graph: bool | str | None = True,
                                prefill_bucket: int | None = None) -> SpeculativeDecoder:
    """The decoder ``decode_speculative_kernels`` builds for one call:
    ``kvlab.speculative.speculative_decoder`` (its ``settings``: ``k``, ``max_ngram``,
    ``min_ngram``, ``max_cache_len``, ``graph``, ``prefill_bucket``) over the kernels: its prefill
    ``kernel_prefill``, captured like ``kernels_decoder``'s (``prefill_bucket`` default
    ``prompt_bucket`` of this prompt), its verify ``kernel_verify`` (the prefill's kernels over
    k + 1 rows), its plain steps ``kernel_step``."""
    check_supported(model)
    batch = input_ids.shape[0]
    if prefill_bucket is None:
        if max_cache_len is None:  # speculative_decoder's default: the last verify's drafts fit
            max_cache_len = input_ids.shape[1] + max_new_tokens + k - 1
        length = cache_length(input_ids, max_new_tokens, max_cache_len)  # refuses a bad length
        prefill_bucket = prompt_bucket(input_ids.shape[1], length)
    through_kernels = batch * prefill_bucket <= KERNEL_PREFILL_MAX_ROWS
    on = next(model.parameters()).device  # the counters go where the kernels run, not the ids
    step = partial(kernel_step, counters=arrival_counters(model, batch, on))
    decoder = speculative_decoder(model, input_ids, max_new_tokens, step=step,
                                  prefill=kernel_prefill if through_kernels else None,
                                  verify=kernel_verify, k=k,
                                  max_ngram=max_ngram, min_ngram=min_ngram,
                                  max_cache_len=max_cache_len, graph=graph,
                                  prefill_bucket=prefill_bucket)
    decoder.kvlab_strategy = "graph-safe-speculative/kernels"
    return decoder


def decode_speculative_kernels(model, input_ids: torch.Tensor, max_new_tokens: int, *,
                               on_token: OnToken = None, decoder: SpeculativeDecoder | None = None,
                               **settings) -> torch.Tensor:
    """The ``"graph-safe-speculative/kernels"`` strategy: ``decoder`` (else
    ``speculative_kernels_decoder(model, ..., **settings)``) generates; ``decode_speculative``
    refuses a decoder given with settings."""
    if decoder is not None:
        return decode_speculative(model, input_ids, max_new_tokens, on_token=on_token,
                                  decoder=decoder, **settings)
    decoder = speculative_kernels_decoder(model, input_ids, max_new_tokens, **settings)
    return decoder.generate(input_ids, max_new_tokens, on_token=on_token)

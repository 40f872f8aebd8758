"""Lesson 06's compiled step: ``model_step`` over a fused copy of the model (``kvlab.fusion``),
compiled by ``torch.compile`` without its own CUDA graphs, several steps per graph kvlab captures.

``compiled_decoder`` makes what it needs and hands it to ``GraphSafeDecoder``: the fused copy (its
model), the step compiled once (``torch.compile(model_step)``, gpt-fast style: its owner compiles
it), 16 steps per graph. ``decode_graph_safe_compiled`` generates under ``inductor_options(tune)``,
read when the step compiles, at the first decode. ``decode_reduce_overhead_gqa`` is lesson 03's
``reduce-overhead`` with the attention that reads the cache's kv heads as they are (SDPA's
``enable_gqa``), where transformers' SDPA attention under Dynamo copies them with ``repeat_kv`` in
every layer at every step.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from .decoding import OnToken
from .frozen_state import python_overrides
from .fusion import fused_copy
from .graph_decoder import GraphSafeDecoder, cache_length, decoder_for, model_step
from .hf_caches import check_pair, decode_reduce_overhead, reduce_overhead_state
from .runtime import PDL, check_dtype, gpu_supports


def inductor_options(tune: bool = True, device: torch.device | str = "cuda"):
    """Inductor settings for the compiled step (gpt-fast's): coordinate-descent tuning of each
    kernel's block sizes, and programmatic dependent launch (a kernel starts while the previous one
    drains) where ``device`` has it (``runtime.PDL``) and this torch offers it. ``tune=False``:
    inductor's defaults."""
    if not tune:
        return nullcontext()
    config = torch._inductor.config
    options = {"coordinate_descent_tuning": True}
    if hasattr(config.triton, "enable_pdl") and gpu_supports(device, PDL):
        options["triton.enable_pdl"] = True
    return config.patch(options)


def _rewritten(name: str, module, *, fuse: bool, gemv: bool) -> bool | str:
    """What ``fused_copy`` loses of the module: True where it drops the module (its hooks and
    patched forward with it), "forward" where it sets the module's forward (hooks still run)."""
    part = name.rpartition(".")[2]
    if fuse and part in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"):
        return True
    if (fuse and part in ("self_attn", "mlp")) or (gemv and isinstance(module, nn.Linear)):
        return "forward"
    return False


def compiled_decoder(model, input_ids: torch.Tensor, max_new_tokens: int, *,
                     compile_mode: str | None = "max-autotune-no-cudagraphs", steps: int = 16,
                     fuse: bool = True, gemv: bool = True, attention: bool | str | None = None,
                     max_cache_len: int | None = None,
                     graph: bool | str | None = None) -> GraphSafeDecoder:
    """The decoder ``decode_graph_safe_compiled`` builds for one call: a fused copy of the model
    (``fused_copy(model, fuse=, attention=, gemv=)``; ``attention`` default "triton", and only
    with ``fuse``: unfused, the model keeps its own), ``model_step`` compiled with ``compile_mode``
    (None: not compiled), ``steps`` steps per captured graph. Its ``source`` is ``model``: an edit
    of ``model`` after the build does not reach the copy, so build a new decoder after one. A hook
    or a patched forward on a module the copy rebuilds (``_rewritten``) is refused.

    On CPU the step is neither compiled nor captured unless asked (``graph``): an inductor compile
    takes minutes on two cores, a compiled step cannot be captured by the emulation, and the
    emulated graph is no faster than eager."""
    cuda = input_ids.device.type == "cuda"
    graph = cuda if graph is None else graph
    compile_mode = compile_mode if cuda else None
    if compile_mode is not None and graph == "emulate":
        raise ValueError(f"compile_mode={compile_mode!r} with graph='emulate': the emulation "
                         "traces eager operations and cannot trace a compiled step. Pass "
                         "graph=True or graph=False")
    overrides = python_overrides(model, partial(_rewritten, fuse=fuse, gemv=gemv))
    if overrides:
        raise ValueError(f"the fused copy rebuilds {'; '.join(overrides[:3])}, and would decode "
                         "without them. Remove the hooks or the patched forward, pass fuse=False "
                         "and gemv=False, or use the 'graph-safe' strategy")
    if not fuse and attention not in (None, False):
        raise ValueError(f"attention={attention!r} picks the fused attention's kernel, and "
                         "fuse=False keeps the model's own attention: pass one of the two")
    attention = False if not fuse else "triton" if attention is None else attention
    fused = fused_copy(model, fuse=fuse, attention=attention, gemv=gemv)
    step = model_step
    if compile_mode is not None:
        param = next(model.parameters())
        # bf16 on a GPU without it (a T4): say to use float16
        check_dtype(param.device, param.dtype)
        step = torch.compile(model_step, mode=compile_mode, fullgraph=True)
    length = cache_length(input_ids, max_new_tokens, max_cache_len)
    decoder = GraphSafeDecoder(fused, length, input_ids.shape[0], step=step, steps=steps,
                               graph=graph)
    decoder.copied_from(model)  # what kvlab.decode checks a held decoder against
    decoder.kvlab_strategy = "graph-safe-compiled"
    return decoder


def decode_graph_safe_compiled(model, input_ids: torch.Tensor, max_new_tokens: int, *,
                               on_token: OnToken = None, decoder: GraphSafeDecoder | None = None,
                               tune: bool = True, **settings) -> torch.Tensor:
    """The ``"graph-safe-compiled"`` strategy: ``decoder`` (else ``compiled_decoder(model, ...,
    **settings)``) generates, under ``inductor_options(tune)`` (used where its step compiles: at its
    first decode)."""
    if decoder is None:
        decoder = compiled_decoder(model, input_ids, max_new_tokens, **settings)
    with inductor_options(tune, input_ids.device):
        return decoder_for(decoder, model).generate(input_ids, max_new_tokens, on_token=on_token)


GQA_ATTENTION = "kvlab-sdpa-gqa"


def gqa_sdpa_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                       is_causal=None, **kwargs):
    """transformers' SDPA attention with the kv heads read as they are (``enable_gqa=True``), never
    repeated. query [b, heads, q, d], key/value [b, kv_heads, L, d], mask [b, 1, q, L] or None ->
    [b, q, heads, d]."""
    q_len = query.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # as transformers' SDPA attention decides it
    causal = q_len > 1 and attention_mask is None and causal
    # a prefill into an empty static cache: only the prompt's slots
    if causal and key.shape[2] > q_len:
        key, value = key[:, :, :q_len], value[:, :, :q_len]
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                         dropout_p=dropout, scale=scaling, is_causal=causal,
                                         enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


@contextmanager
def gqa_attention(model):
    """The model's attention set to ``gqa_sdpa_attention`` (its masks as for ``"sdpa"``) for the
    block, and set back after it: the caller's model is left as it was."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(GQA_ATTENTION, gqa_sdpa_attention)
    AttentionMaskInterface.register(GQA_ATTENTION, sdpa_mask)
    before = model.config._attn_implementation
    model.set_attn_implementation(GQA_ATTENTION)
    try:
        yield model
    finally:
        model.set_attn_implementation(before)


def reduce_overhead_gqa_state(model, input_ids: torch.Tensor, max_new_tokens: int, *,
                              max_cache_len: int | None = None,
                              dynamic: bool | None = None) -> dict:
    """What ``decode_reduce_overhead_gqa`` builds for one call: ``reduce_overhead_state``'s cache
    and step."""
    with gqa_attention(model):
        return reduce_overhead_state(model, input_ids, max_new_tokens, max_cache_len=max_cache_len,
                                     dynamic=dynamic)


def decode_reduce_overhead_gqa(model, input_ids: torch.Tensor, max_new_tokens: int, *,
                               on_token: OnToken = None, cache=None, compiled_step=None,
                               **settings) -> torch.Tensor:
    """The ``"reduce-overhead/gqa"`` strategy: ``decode_reduce_overhead`` with the model's attention
    set to ``gqa_sdpa_attention`` for the call (``gqa_attention``), so the compiled step reads the
    cache's kv heads without copying them. The model's attention implementation is set back after
    the call."""
    check_pair(cache, compiled_step, "reduce-overhead/gqa")
    with gqa_attention(model):
        return decode_reduce_overhead(model, input_ids, max_new_tokens, on_token=on_token,
                                      cache=cache, compiled_step=compiled_step, **settings)

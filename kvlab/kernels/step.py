"""The decode step as kvlab's own kernels, a plain function (gpt-fast style): no torch.compile, five
kernels a layer.

What compiling leaves (``graph-safe-compiled``):
inductor fuses only what its rules allow; a norm is a reduction and so is the matmul after it, so
they are two kernels; RoPE, the cache write and the attention are more. At batch 1 every kernel is
too short to fill the GPU, so a step costs about its number of kernels. ``kernel_step`` runs, per
layer:

1. ``gemv(x, W_qkv, norm=w)``: RMSNorm fused into the q/k/v matmul (``kvlab.kernels.gemv``; from 2
   rows a ``tl.dot`` tile of rows where ``gemv.TILE_DISPATCH`` picks one).
2. ``rope_cache_attention``: RoPE, the cache write at the counter and split-K attention in one
   kernel, its scores and P.V as ``tl.dot`` (``kvlab.kernels.attention``).
3. ``gemv(attn, W_o, residual=x)``: o_proj and the residual add.
4. ``gemv(x, W_gate_up, norm=w)``: RMSNorm fused into the gate/up matmul.
5. ``gemv(gate_up, W_down, silu_mul=True, residual=x)``: SiLU(gate) * up fused into down_proj, and
   the residual.

and after the last layer ``greedy_head``: the final norm, the LM head, the greedy token and the
counter's advance. ``kernel_prefill`` runs a prompt through the same five kernels a layer (its T
rows as the matmuls' rows; the attention ``rope_cache_prefill_attention``, causal over the prompt),
then the LM head on each row's last token. Each function runs its PyTorch form where the kernels do
not (``kvlab.kernels.common.available``) and the matmuls also where the dispatch picks cuBLAS, so
the same step runs on a CPU (the reference the kernels are tested against) and at large batch
(cuBLAS).

The step has no host sync: a decoder captures it in a CUDA graph and replays it.
"""

from __future__ import annotations

import torch

from ..frozen_state import python_overrides
from ..graphs import LENGTH_DEPENDENT_ROPE
from .attention import rope_cache_attention, rope_cache_prefill_attention
from .gemv import gemv, greedy_head

# RMSNorm, rotate-half RoPE, SiLU-gated MLP, no per-head norms
_SUPPORTED = ("llama", "mistral", "qwen2")


KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_supported(model) -> None:
    """Refuse, with what to do, a model whose layer is not the one the kernels compute, or whose
    modules run Python the kernels would skip (hooks, a patched ``forward``)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    config = model.config
    has_layers = hasattr(model, "model") and hasattr(model.model, "layers")
    layers = len(model.model.layers) if has_layers else None
    if layers is not None and layers != config.num_hidden_layers:
        raise ValueError(
            f"model.config.num_hidden_layers is {config.num_hidden_layers} but the model "
            f"has {layers} decoder layers (model.model.layers): the config was changed "
            "after the model was built, and the kernels run every layer. Set it back "
            f"(model.config.num_hidden_layers = {layers}), or build a model of the layers "
            "you want from its config")
    attention = config._attn_implementation
    if attention not in ALL_ATTENTION_FUNCTIONS:  # eager: the prefill calls a registered one
        raise ValueError(
            f"the model's attention implementation is {attention!r}; 'graph-safe-kernels' "
            "runs its prefill through transformers' registered attentions, of which kvlab "
            "checks 'sdpa'. Call model.set_attn_implementation('sdpa') first (the "
            "course's default), or use the 'graph-safe' strategy, which runs eager attention "
            "too")
    dtype = next(model.parameters()).dtype
    if dtype not in KERNEL_DTYPES:  # the tiles are sized per element size (attention.PREFILL_TILE)
        runs = ", ".join(map(str, KERNEL_DTYPES))
        raise ValueError(f"the model is {dtype}; kvlab's kernels run {runs}. Convert it "
                         "(model.float()), or use the 'graph-safe' strategy, which runs any dtype")
    overrides = python_overrides(model)
    if overrides:
        raise ValueError(f"kvlab's kernels read the model's weights and never run its modules' "
                         f"Python, so they would leave out {'; '.join(overrides[:3])}. Remove "
                         "the hooks or the patched forward, or use the 'graph-safe' strategy, "
                         "which runs them")
    why, uncapturable = None, False
    if config.model_type not in _SUPPORTED:
        why = f"model_type {config.model_type!r} (supported: {', '.join(_SUPPORTED)})"
    elif getattr(config, "hidden_act", "silu") != "silu":
        why = f"hidden_act {config.hidden_act!r} (the kernel fuses SiLU)"
    elif getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        why = "a sliding window"
    elif model.model.rotary_emb.rope_type in LENGTH_DEPENDENT_ROPE:
        why = f"{model.model.rotary_emb.rope_type!r} RoPE (its frequencies change with the length)"
        uncapturable = True
    elif getattr(model.lm_head, "bias", None) is not None:
        why = "a bias in the LM head"
    else:
        attn = model.model.layers[0].self_attn
        if attn.head_dim & (attn.head_dim - 1):
            why = f"head_dim {attn.head_dim} (must be a power of two)"
    if uncapturable:  # no captured graph holds it: graph-safe refuses it too
        raise ValueError(
            f"kvlab's decode kernels compute a Llama-style layer; this model has {why}, which no "
            "captured graph can hold. Decode it with strategy='static', 'dynamic' or 'naive', or "
            "strategy='graph-safe' with graph=False (its steps run eagerly).")
    if why:
        raise ValueError(
            f"kvlab's decode kernels compute a Llama-style layer; this model has {why}. "
            "Use the 'graph-safe' strategy for it (any full-attention model); "
            "'graph-safe-compiled' fuses Llama-style projections too, so for this model "
            "call kvlab.compiled_step.decode_graph_safe_compiled(..., fuse=False).")


def arrival_counters(model, batch: int, device: torch.device | str) -> torch.Tensor:
    """The ``counters`` tensor of ``kernel_step``: int32 zeros, the arrival counters of the
    attention kernel (one per batch row and kv head) and of the matmuls split along K (one per tile
    of at least 16 rows and block of at least 16 outputs of the hidden size). The kernels run one
    after the other and each leaves them at zero."""
    config = model.config
    per_row = max(config.num_key_value_heads, -(-config.hidden_size // 16))
    return torch.zeros(batch * per_row, dtype=torch.int32, device=device)


def _stacked_projections(layer) -> tuple:
    """(q/k/v weight, its bias, gate/up weight, its bias) of a layer: a fused copy's ``qkv_proj``
    and ``gate_up_proj``, or an unfused model's q, k, v and gate, up as tuples of parts, which the
    kernels read where they are (``gemv``'s stacked weight)."""
    attn, mlp = layer.self_attn, layer.mlp
    if hasattr(attn, "qkv_proj"):
        qkv, gate_up = attn.qkv_proj, mlp.gate_up_proj
        return qkv.weight, qkv.bias, gate_up.weight, gate_up.bias
    qkv = (attn.q_proj, attn.k_proj, attn.v_proj)
    qkv_bias = tuple(p.bias for p in qkv) if attn.q_proj.bias is not None else None
    gate_up = (mlp.gate_proj, mlp.up_proj)
    gate_up_bias = tuple(p.bias for p in gate_up) if mlp.gate_proj.bias is not None else None
    return tuple(p.weight for p in qkv), qkv_bias, tuple(p.weight for p in gate_up), gate_up_bias


def kernel_step(model, cache, token: torch.Tensor, counters: torch.Tensor, *,
                dot_attention: bool = True, tiles: bool = True,
                fill_splits: bool = True) -> torch.Tensor:
    """One decode step: reads ``token`` ``[batch, 1]`` (long), writes the next token into it (in
    place), returns it.

    ``model``: a supported model (``check_supported``), or its fused copy
    ``kvlab.fusion.fused_copy(model, attention=False)`` (one ``qkv_proj`` and one ``gate_up_proj``
    per layer; ``_stacked_projections``). ``cache``: a
    ``kvlab.graph_safe_cache.GraphSafeStaticCache`` after a prefill; the step writes this token's
    key and value at its counter and advances the counter once (the step's last write).
    ``counters``: ``arrival_counters(model, batch, device)``, the counters of the attention and of
    the matmuls split along K. ``dot_attention``: attention's scores and P.V as ``tl.dot``
    (``rope_cache_attention(dot=True)``; False: as broadcast multiply-and-sum). ``tiles``: the
    matmuls of 2 rows or more through ``gemv.TILE_DISPATCH``'s choice of tile kernel, GEMV kernel or
    cuBLAS (``gemv(tiles=True)``; False: the GEMV kernel up to ``gemv.GEMV_MAX_ROWS`` rows, cuBLAS
    above). ``fill_splits``: attention split over only as many programs per (row, kv head) as fill
    the GPU once (``rope_cache_attention(fill_splits=True)``; False: up to ``common.MAX_SPLITS`` at
    every batch).
    ``kvlab.kernels.decoder.kernels_decoder`` binds ``counters`` and the options
    (``functools.partial``) and hands the step to a ``GraphSafeDecoder``. Call it in
    ``torch.inference_mode()``.
    """
    decoder, b = model.model, token.shape[0]
    heads = model.config.num_attention_heads
    rope = decoder.rotary_emb
    position = cache.cache_position  # [] the one counter: this token's position

    # RoPE, the cache write at the counter, split-K attention: [b, heads * d]
    def attention(qkv, attn, cached):
        return rope_cache_attention(qkv, rope.inv_freq, rope.attention_scaling, cached.keys,
                                    cached.values, position, heads, attn.scaling, counters,
                                    dot=dot_attention, fill_splits=fill_splits)

    x = decoder.embed_tokens(token).view(b, -1)  # [b, hidden]
    for layer, cached in zip(decoder.layers, cache.layers, strict=True):
        # [b, hidden]
        x = layer_kernels(x, layer, cached, attention, tiles=tiles, counters=counters)
    # [b, 1] the next token, in place; the counter advanced
    return greedy_head(x, model.lm_head.weight, decoder.norm.weight, decoder.norm.variance_epsilon,
                       token, position, tiles=tiles)


def layer_kernels(x: torch.Tensor, layer, cached, attention, *, tiles: bool = True,
                  counters: torch.Tensor | None = None) -> torch.Tensor:
    """One decoder layer over the rows ``x`` ``[rows, hidden]`` -> ``[rows, hidden]``: its five
    kernels, the second ``attention(qkv, layer.self_attn, cached)`` (``kernel_step``'s over the
    cache, ``_prompt_rows``' over the prompt; ``cached``: the layer's cache). ``tiles``: as
    ``kernel_step``'s; ``counters``: the matmuls' arrival counters
    (``gemv``'s)."""
    attn, mlp = layer.self_attn, layer.mlp
    norm1, norm2 = layer.input_layernorm, layer.post_attention_layernorm
    launch = {"tiles": tiles, "counters": counters}
    w_qkv, b_qkv, w_gate_up, b_gate_up = _stacked_projections(layer)
    qkv = gemv(x, w_qkv, bias=b_qkv, norm=norm1.weight, eps=norm1.variance_epsilon,
               **launch)  # [rows, (heads + 2 kv_heads) * d]
    out = attention(qkv, attn, cached)  # [rows, heads * d]
    x = gemv(out, attn.o_proj.weight, bias=attn.o_proj.bias, residual=x, **launch)  # [rows, hidden]
    gate_up = gemv(x, w_gate_up, bias=b_gate_up, norm=norm2.weight, eps=norm2.variance_epsilon,
                   **launch)  # [rows, 2 * intermediate]
    return gemv(gate_up, mlp.down_proj.weight, bias=mlp.down_proj.bias, silu_mul=True, residual=x,
                **launch)  # [rows, hidden]


def _prompt_rows(model, cache, prompt: torch.Tensor, valid: torch.Tensor,
                tiles: bool) -> torch.Tensor:
    """The layers over a prompt's rows: ``prompt`` [batch, T] at the cache's counter, of which the
    first ``valid`` (a 0-dim long tensor) count; writes their keys and values into ``cache`` (the
    rest to the trash slot), returns the last layer's output ``[batch T, hidden]``. The counter is
    left where it was. Allocates the cache's buffers first if no forward has yet
    (``cache.early_initialization``)."""
    decoder, (b, t) = model.model, prompt.shape
    heads = model.config.num_attention_heads
    rope = decoder.rotary_emb
    # the kernels write into the buffers: allocate them (eagerly, before capture)
    if not cache.is_initialized:
        head_dim = decoder.layers[0].self_attn.head_dim
        cache.early_initialization(b, model.config.num_key_value_heads, head_dim,
                                   decoder.embed_tokens.weight.dtype, prompt.device)
    position = cache.cache_position  # [] the prompt's first position

    # RoPE, the prompt's cache writes, causal attention: [b T, heads * d]
    def attention(qkv, attn, cached):
        return rope_cache_prefill_attention(qkv, rope.inv_freq, rope.attention_scaling, cached.keys,
                                            cached.values, position, valid, heads, attn.scaling)

    # [b T, hidden]: the prompt's rows are the matmuls' rows
    x = decoder.embed_tokens(prompt).view(b * t, -1)
    for layer, cached in zip(decoder.layers, cache.layers, strict=True):
        x = layer_kernels(x, layer, cached, attention, tiles=tiles)  # [b T, hidden]
    return x


def kernel_prefill(model, cache, prompt: torch.Tensor, valid: torch.Tensor, token: torch.Tensor, *,
                   tiles: bool = True) -> torch.Tensor:
    """The prefill through the step's kernels: writes the first new token into ``token`` ``[batch,
    1]``.

    ``prompt`` ``[batch, T]`` (long): a prompt padded to T tokens, of which the first ``valid`` (a
    0-dim long tensor) count; their keys and values are written into ``cache`` from its counter on,
    and the counter advances by ``valid`` (one graph captured at T serves every length up to T).
    ``model``, ``cache``, ``tiles``: as ``kernel_step``'s; the attention runs on ``tl.dot`` tiles
    (``rope_cache_prefill_attention``). Call it in ``torch.inference_mode()``.
    """
    decoder, (b, t) = model.model, prompt.shape
    x = _prompt_rows(model, cache, prompt, valid, tiles)  # [b T, hidden]
    # [b, hidden] each row's last
    last = x.view(b, t, -1).index_select(1, (valid - 1).reshape(1)).view(b, -1)
    greedy_head(last, model.lm_head.weight, decoder.norm.weight, decoder.norm.variance_epsilon,
                token, tiles=tiles)  # [b, 1] the first new token, in place
    cache.cache_position.add_(valid)  # the counter: past the prompt
    return token


def kernel_verify(model, cache, rows: torch.Tensor, verified: torch.Tensor, *,
                  tiles: bool = True) -> torch.Tensor:
    """Speculation's verify through the step's kernels: ``rows`` [batch, k + 1] (the last token,
    then k drafts) at the counter's positions, causal; writes the greedy token after each row into
    ``verified`` [batch, k + 1] and advances the counter by k + 1 (``kvlab.speculative`` rolls back
    the rejected drafts). Rows past the cache's end go to the trash slot. ``model``, ``cache``,
    ``tiles``: as ``kernel_step``'s."""
    decoder, width = model.model, rows.shape[1]
    valid = torch.full((), width, dtype=torch.long, device=rows.device)  # every row counts
    x = _prompt_rows(model, cache, rows, valid, tiles)  # [b (k + 1), hidden]
    greedy_head(x, model.lm_head.weight, decoder.norm.weight, decoder.norm.variance_epsilon,
                verified.view(-1, 1), tiles=tiles)  # [b (k + 1), 1] in place
    cache.cache_position.add_(width)
    return verified

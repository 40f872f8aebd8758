"""Fewer kernels per decode step, same arithmetic: fused projections and a single-query attention.

At batch 1 a decode step of a small model is a chain of tiny kernels, each too short to hide its own
launch; what costs time is how many there are, not the FLOPs. Two model-level changes remove kernels
without changing what is computed:

- ``fuse_projections(model)``: q/k/v become one matmul against the concatenated weight, gate/up
  another. Each output element is still one dot product of the same row and column, so the tokens
  stay the same (checked token-exact against ``"naive"`` by ``kvlab.lab.bench``).
- ``"kvlab-decode"`` attention: for one query token, the query heads that share a key/value head are
  packed as rows of one attention call (what transformers does in eager mode, but not under
  ``torch.compile``, where it copies the whole cache with ``repeat_kv`` in every layer at every
  step).
- ``"kvlab-decode-triton"`` attention (``attention="triton"``): one query token's attention as a
  hand-written split-K Triton kernel (``kvlab.kernels.attention``): many programs share the cache
  slots, two short kernels; ``graph-safe-compiled``'s attention on GPUs of compute capability 8.0
  and newer (``"kvlab-decode"`` on older ones).
- GEMV as a reduction (``gemv=True``): under ``torch.compile``, a linear layer applied to a handful
  of rows is written ``(x * W).sum(-1)``. Inductor turns that into one reduction kernel over all
  output rows at once (hundreds of thread blocks streaming the weight), with the producer of ``x``
  (SiLU*up) and the consumer (residual add) fused in; a matmul template at M=1 keeps most of the GPU
  idle. Eager code (and more rows than ``REDUCTION_MAX_ROWS``) keeps ``F.linear``.

``fused_copy(model)`` applies them to a copy, so the original stays untouched; the copy is the
caller's (a GraphSafeDecoder holds the one it decodes), and later edits to the original do not reach
it.
"""

from __future__ import annotations

import copy
import sys
import types

import torch
import torch.nn.functional as F
from torch import nn

_ATTENTION_NAME = "kvlab-decode"
_TRITON_ATTENTION_NAME = "kvlab-decode-triton"
_ATTENTIONS = {True: _ATTENTION_NAME, "triton": _TRITON_ATTENTION_NAME}


def packed_sdpa_attention(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs
):
    """SDPA where one query token's heads sharing a kv head become rows: no ``repeat_kv`` copy of
    the cache.

    query [b, heads, 1, d], key/value [b, kv_heads, L, d], mask [b, 1, 1, L] -> output [b, 1, heads,
    d].
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    b, heads, q_len, d = query.shape
    kv_heads = key.shape[1]
    if q_len != 1 or heads == kv_heads:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    # [b, kv_heads, group, d]: a group's heads as rows
    packed = query.reshape(b, kv_heads, heads // kv_heads, d)
    out = F.scaled_dot_product_attention(
        packed, key, value, attn_mask=attention_mask, scale=scaling
    )
    return out.reshape(b, heads, 1, d).transpose(1, 2), None  # [b, 1, heads, d]


def _triton_attention(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs
):
    """One query token: ``kvlab.kernels.attention``'s split-K Triton kernel, reading the cache in
    place.

    Where it cannot run (no Triton, no CUDA, a GPU older than Ampere such as a T4, the prefill,
    other shapes): ``packed_sdpa_attention``.
    """
    from .kernels import attention, common

    if not (common.available(query) and attention.supports(query, key, value, attention_mask)):
        return packed_sdpa_attention(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    return attention.decode_attention(query, key, value, attention_mask, scaling), None


def _register_decode_attention() -> None:
    """Make ``"kvlab-decode"`` and ``"kvlab-decode-triton"`` transformers attention implementations
    (their masks are built as for ``"sdpa"``)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    functions = {_ATTENTION_NAME: packed_sdpa_attention, _TRITON_ATTENTION_NAME: _triton_attention}
    for name, fn in functions.items():
        AttentionInterface.register(name, fn)
        AttentionMaskInterface.register(name, sdpa_mask)


def _fused_attention_forward(
    self, hidden_states, position_embeddings=None, attention_mask=None, cache=None, **kwargs
):
    """transformers' Llama attention forward, with one ``qkv_proj`` matmul instead of three."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    rotary = sys.modules[type(self).__module__].apply_rotary_pos_emb
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)
    # one matmul: [b, t, (h + 2 kv_h) d]
    q, k, v = self.qkv_proj(hidden_states).split(self.qkv_sizes, dim=-1)
    q, k, v = (x.view(hidden_shape).transpose(1, 2) for x in (q, k, v))  # [b, heads, t, d]
    cos, sin = position_embeddings
    q, k = rotary(q, k, cos, sin)
    if cache is not None:
        k, v = cache.update(k, v, self.layer_idx, kwargs=kwargs)
    attention = ALL_ATTENTION_FUNCTIONS[self.config._attn_implementation]
    out, weights = attention(
        self, q, k, v, attention_mask, dropout=0.0, scaling=self.scaling, **kwargs
    )
    out = self.o_proj(out.reshape(*input_shape, -1).contiguous())
    return out, weights


def _fused_mlp_forward(self, x):
    """SwiGLU with one ``gate_up_proj`` matmul instead of two."""
    gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
    return self.down_proj(self.act_fn(gate) * up)


# up to this many rows (batch x tokens), a compiled linear is written as a reduction
REDUCTION_MAX_ROWS = 8


def _gemv_linear_forward(self, x):
    """``F.linear``, except under torch.compile for few rows: ``(x * W).sum(-1)``, one fused
    reduction kernel."""
    if torch.compiler.is_compiling() and x.numel() // x.shape[-1] <= REDUCTION_MAX_ROWS:
        # [..., 1, in] * [out, in] -> sum over in -> [..., out]
        y = (x.unsqueeze(-2) * self.weight).sum(-1)
        return y if self.bias is None else y + self.bias
    return F.linear(x, self.weight, self.bias)


def use_gemv(model) -> None:
    """In place: every ``nn.Linear`` of the model (lm_head included) takes the reduction path when
    compiled."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            module.forward = types.MethodType(_gemv_linear_forward, module)


def _concat_linear(layers: list[nn.Linear]) -> nn.Linear:
    first = layers[0]
    fused = nn.Linear(
        first.in_features, sum(x.out_features for x in layers), bias=first.bias is not None
    )
    fused = fused.to(device=first.weight.device, dtype=first.weight.dtype)
    with torch.no_grad():
        fused.weight.copy_(torch.cat([x.weight for x in layers], dim=0))  # [sum(out), in]
        if first.bias is not None:
            fused.bias.copy_(torch.cat([x.bias for x in layers], dim=0))
    return fused


def fuse_projections(model):
    """In place: every attention gets ``qkv_proj``, every MLP ``gate_up_proj``; the separate ones
    are dropped.

    Supports the Llama-style layout (``q_proj``/``k_proj``/``v_proj``/``o_proj``,
    ``gate_proj``/``up_proj``/``down_proj``), i.e. Llama, Mistral, Qwen2; architectures with extra
    per-head norms (Qwen3) are refused.
    """
    decoder = model.model if hasattr(model, "model") else model
    for layer in decoder.layers:
        attn, mlp = layer.self_attn, layer.mlp
        if not all(hasattr(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")) or hasattr(
            attn, "q_norm"
        ):
            raise ValueError(
                "fuse_projections supports Llama-style attention (Llama, Mistral, Qwen2); "
                f"{type(attn).__name__} differs. Run the strategy with fuse=False."
            )
        if not all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj")):
            raise ValueError(
                f"fuse_projections needs a gate/up/down MLP; {type(mlp).__name__} has none. Use "
                "fuse=False."
            )
        parts = [attn.q_proj, attn.k_proj, attn.v_proj]
        attn.qkv_sizes = [p.out_features for p in parts]
        attn.qkv_proj = _concat_linear(parts)
        del attn.q_proj, attn.k_proj, attn.v_proj
        attn.forward = types.MethodType(_fused_attention_forward, attn)
        mlp.gate_up_proj = _concat_linear([mlp.gate_proj, mlp.up_proj])
        del mlp.gate_proj, mlp.up_proj
        mlp.forward = types.MethodType(_fused_mlp_forward, mlp)
    return model


def fused_copy(model, *, fuse: bool = True, attention: bool | str = True, gemv: bool = False):
    """A new copy of ``model`` with fused projections, a decode attention (``True``:
    ``"kvlab-decode"``, ``"triton"``: ``"kvlab-decode-triton"``) and/or GEMV reductions. A copy: it
    holds the weights as they are now (as much memory again)."""
    if attention is not False and attention not in _ATTENTIONS:
        raise ValueError(
            f"attention must be False or one of {list(_ATTENTIONS)}, got {attention!r}"
        )
    fast = copy.deepcopy(model)
    if fuse:
        fuse_projections(fast)
    if attention:
        _register_decode_attention()
        fast.config._attn_implementation = _ATTENTIONS[attention]
    if gemv:
        use_gemv(fast)
    return fast

"""Size arithmetic from a model's config: FLOPs of a forward pass, bytes of a KV cache, the
bandwidth floor of a step.

``model_sizes`` is the one reader of a config; everything else here is arithmetic on what it
returns.

**FLOPs** (lesson 01). A multiply-add is 2 FLOPs. A pass feeds ``q`` new tokens (the queries) to a
model that already holds ``past`` tokens, so each query attends to the keys before it: ``ctx = past
+ q`` keys in all. With ``h`` = hidden size, ``H`` = query heads, ``K`` = kv heads, ``d`` = head
dim, ``I`` = MLP width, ``V`` = vocabulary, ``N`` = layers, ``B`` = batch:

    projections  = N * B * q * 2*h*(H*d + 2*K*d + H*d)      # W_q, W_k, W_v in; W_o out
    attention    = N * B * 2 * 2*H*d * pairs                 # Q·K^T scores, then weights · V
    mlp          = N * B * q * 3 * 2*h*I                      # gate, up, down (SwiGLU-style)
    lm_head      = B * logits * 2*h*V                         # logits = q (HF default) or 1

``pairs`` counts the (query, key) pairs that attention computes. With ``causal=True`` only the pairs
the causal mask keeps: query ``j`` of the ``q`` sees ``past + j + 1`` keys, so ``pairs = q*past +
q*(q+1)/2``. With ``causal=False`` the full rectangle ``q * ctx``, which is what a kernel that
ignores the mask computes and what ``torch.utils.flop_counter`` reports for eager attention.

Left out, because they are O(h) per token, not O(h^2): norms, rotary embeddings, softmax, the SiLU,
residual adds, biases. The embedding lookup costs no FLOPs.

The naive loop's step ``i`` (prompt ``p``) is a pass with ``q = p + i`` and ``past = 0``: it redoes
all the work of the previous step. A cached step is a pass with ``q = 1`` and ``past = p + i - 1``.

**Cache bytes** (lesson 02). Every layer keeps one key and one value vector per kv head for every
token:

    bytes per token = 2 (K and V) x layers x kv_heads x head_dim x bytes per element

Grouped-query attention (GQA) shares each kv head among several query heads, so ``kv_heads`` (not
the number of query heads) is what the cache pays for.

**The floor** (lesson 06): a decode step reads every weight once and each sequence's cache once, so
it cannot take less than those bytes over the memory bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .runtime import as_dtype, count


@dataclass(frozen=True)
class ModelSizes:
    """The sizes of a decoder that the formulas need."""

    layers: int
    hidden: int
    heads: int  # query heads
    kv_heads: int  # = heads for plain multi-head attention, fewer with GQA
    head_dim: int
    intermediate: int  # MLP width
    vocab: int


def _positive(cfg, name: str, default=None) -> int:
    """The config's ``name``, a positive int; ``default`` where it is absent or None."""
    value = getattr(cfg, name, None)
    if value is None and default is not None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"the config's {name} must be a positive int, got {value!r}")
    return value


def model_sizes(config) -> ModelSizes:
    """The sizes of a (text) model config; ``head_dim`` and ``kv_heads`` get transformers' defaults
    when absent. Rule: every function here that takes a config reads it through this, the one
    door that refuses a model given for its config."""
    if isinstance(config, torch.nn.Module) or (hasattr(config, "config")
                                               and not hasattr(config, "num_attention_heads")):
        raise ValueError(f"config is a {type(config).__name__}, a model, not its config: pass "
                         "model.config")
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    for name in (
        "num_hidden_layers",
        "hidden_size",
        "num_attention_heads",
        "intermediate_size",
        "vocab_size",
    ):
        _positive(cfg, name)
    heads = cfg.num_attention_heads
    # absent or None: transformers' defaults; 0 is no head count
    head_dim = _positive(cfg, "head_dim", cfg.hidden_size // heads)
    kv_heads = _positive(cfg, "num_key_value_heads", heads)
    if getattr(cfg, "head_dim", None) is None and cfg.hidden_size % heads:
        raise ValueError(
            f"hidden_size {cfg.hidden_size} is not a multiple of {heads} heads and the config "
            "gives no head_dim: the head size is undefined"
        )
    if kv_heads < 1 or heads % kv_heads or head_dim < 1:
        raise ValueError(
            f"{heads} query heads cannot share {kv_heads} kv heads of head_dim {head_dim}: kv "
            "heads must be a positive divisor of the query heads"
        )
    return ModelSizes(
        layers=cfg.num_hidden_layers, hidden=cfg.hidden_size, heads=heads, kv_heads=kv_heads,
        head_dim=head_dim, intermediate=cfg.intermediate_size, vocab=cfg.vocab_size
    )


def _check_flags(**flags) -> None:
    """Refuse a switch that is not True or False (``kvlab.strategies.check_flags``, imported here:
    it imports this module's users)."""
    from .strategies import check_flags

    check_flags(flags, flags)


def _check_int(name: str, value, least: int) -> int:
    """``value`` as a Python int >= ``least`` (``count``: a NumPy or 0-dim tensor int too)."""
    return count(value, name, minimum=least)


def flops_breakdown(config, new_tokens: int, past: int = 0, *, batch: int = 1, logits: str = "all",
                    causal: bool = True) -> dict[str, int]:
    """FLOPs of one forward pass, by part: ``projections``, ``attention``, ``mlp``, ``lm_head`` (see
    module doc).

    ``new_tokens``: tokens fed in this pass (queries). ``past``: tokens already in the KV cache (0
    without one). ``logits``: ``"all"`` (HF computes logits at every fed position, the default) or
    ``"last"``.
    """
    new_tokens, past, batch = (_check_int("new_tokens", new_tokens, 1),
                               _check_int("past", past, 0), _check_int("batch", batch, 1))
    _check_flags(causal=causal)
    if logits not in ("all", "last"):
        raise ValueError(f"logits must be 'all' or 'last', got {logits!r}")
    s = model_sizes(config)
    q, h, hd = new_tokens, s.hidden, s.head_dim
    pairs = q * past + q * (q + 1) // 2 if causal else q * (past + q)
    per_layer_proj = 2 * h * (s.heads * hd + 2 * s.kv_heads * hd + s.heads * hd)  # per token
    per_layer_mlp = 3 * 2 * h * s.intermediate  # per token
    return {
        "projections": s.layers * batch * q * per_layer_proj,
        "attention": s.layers * batch * 2 * (2 * s.heads * hd) * pairs,
        "mlp": s.layers * batch * q * per_layer_mlp,
        "lm_head": batch * (q if logits == "all" else 1) * 2 * h * s.vocab,
    }


def forward_flops(config, new_tokens: int, past: int = 0, **kw) -> int:
    """Total FLOPs of one forward pass feeding ``new_tokens`` after ``past`` cached tokens (see
    module doc)."""
    return sum(flops_breakdown(config, new_tokens, past, **kw).values())


def decode_step_flops(
    config, prompt_len: int, new_tokens: int, *, cached: bool, batch: int = 1
) -> list[int]:
    """FLOPs of each of the ``new_tokens`` forward passes of a greedy decode (step 0 reads the
    prompt).

    ``cached=False``: the naive loop, step ``i`` recomputes all ``prompt_len + i`` positions.
    ``cached=True``: step 0 is the prefill, then one token per step after ``prompt_len + i - 1``
    cached ones.
    """
    prompt_len = _check_int("prompt_len", prompt_len, 1)
    new_tokens = _check_int("new_tokens", new_tokens, 1)
    _check_flags(cached=cached)
    if not cached:
        return [forward_flops(config, prompt_len + i, 0, batch=batch) for i in range(new_tokens)]
    return [forward_flops(config, prompt_len, 0, batch=batch)] + [
        forward_flops(config, 1, prompt_len + i - 1, batch=batch) for i in range(1, new_tokens)
    ]


def llama_parameter_count(config) -> int:
    """Parameters of a Llama-style decoder, from its config alone (no weights needed, e.g. a 7B
    model's).

    Per layer: W_q and W_o ``h x H*d`` each, W_k and W_v ``h x K*d`` each, the MLP's three ``h x I``
    matrices and two norm vectors of ``h``; then the embedding ``V x h``, a final norm, and an
    lm_head ``V x h`` unless ``tie_word_embeddings`` shares the embedding. Biases count where
    ``attention_bias``/``mlp_bias`` ask for them. Two families add to the Llama layer: Qwen2's
    q/k/v projections always carry a bias (its config has no setting for it), Qwen3 normalizes
    queries and keys per head (``q_norm``, ``k_norm``: one ``d`` vector each per layer).
    """
    s = model_sizes(config)
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    h, q_width, kv_width = s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim
    attention = 2 * h * q_width + 2 * h * kv_width
    if getattr(cfg, "attention_bias", False):
        attention += q_width + 2 * kv_width + h
    model_type = getattr(cfg, "model_type", "")
    if model_type == "qwen2":
        attention += q_width + 2 * kv_width  # q_proj, k_proj, v_proj biases (o_proj has none)
    if model_type == "qwen3":
        attention += 2 * s.head_dim  # q_norm and k_norm
    mlp = 3 * h * s.intermediate + (
        2 * s.intermediate + h if getattr(cfg, "mlp_bias", False) else 0
    )
    embedding = s.vocab * h
    lm_head = 0 if getattr(cfg, "tie_word_embeddings", False) else s.vocab * h
    return embedding + s.layers * (attention + mlp + 2 * h) + h + lm_head


# < 1 byte each
_PACKED = {name for name in ("float4_e2m1fn_x2", "quint4x2", "quint2x4") if hasattr(torch, name)}


def _element_bytes(dtype) -> int:
    if not isinstance(dtype, torch.dtype | str):
        raise ValueError(
            "dtype must be a torch.dtype (e.g. torch.float16, or model.dtype) or a name, got "
            f"{dtype!r}"
        )
    dtype = as_dtype(dtype)
    if str(dtype).removeprefix("torch.") in _PACKED:
        raise ValueError(
            f"{dtype} packs several elements into one byte: these formulas count whole bytes per "
            "element"
        )
    return dtype.itemsize


def kv_bytes_per_token(config, dtype) -> int:
    """``2 x layers x kv_heads x head_dim x element size``: the cache's growth per token of one
    sequence."""
    s = model_sizes(config)
    return 2 * s.layers * s.kv_heads * s.head_dim * _element_bytes(dtype)


def kv_cache_bytes(config, tokens: int, dtype, *, batch: int = 1) -> int:
    """Bytes of keys and values held for ``batch`` sequences of ``tokens`` cached tokens each."""
    tokens, batch = _check_int("tokens", tokens, 0), _check_int("batch", batch, 0)
    return batch * tokens * kv_bytes_per_token(config, dtype)


def tensor_bytes(tensors) -> int:
    """Bytes held by the distinct storages behind some tensors (views of one buffer count once)."""
    seen, total = set(), 0
    for t in tensors:
        if t is None or not isinstance(t, torch.Tensor):
            continue
        storage = t.untyped_storage()
        # meta / empty: no address
        key = (t.device, storage.data_ptr()) if storage.data_ptr() else id(storage)
        if key not in seen:
            seen.add(key)
            total += storage.nbytes() if t.device.type != "meta" else t.numel() * t.element_size()
    return total


def floor_ms(
    weight_bytes: int, kv_per_token: int, batch: int, context: float, gbps: float
) -> float:
    """The bandwidth floor of one decode step: every weight read once, plus each sequence's cache
    read once."""
    if not (gbps > 0 and batch >= 1 and weight_bytes >= 0 and kv_per_token >= 0 and context >= 0):
        raise ValueError(
            "floor_ms needs gbps > 0, batch >= 1 and non-negative bytes and context; got "
            f"gbps={gbps}, batch={batch}, weight_bytes={weight_bytes}, "
            f"kv_per_token={kv_per_token}, context={context}"
        )
    return 1e3 * (weight_bytes + batch * context * kv_per_token) / (gbps * 1e9)


def model_facts(model, dtype) -> dict:
    """A model's sizes, parameter count, weight bytes and cache bytes per token in ``dtype``
    (JSON-ready)."""
    s = model_sizes(model.config)
    return {
        "architecture": type(model).__name__,
        "layers": s.layers,
        "hidden": s.hidden,
        "heads": s.heads,
        "kv_heads": s.kv_heads,
        "vocab": s.vocab,
        "parameters": sum(p.numel() for p in model.parameters()),
        "weight_bytes": tensor_bytes(model.parameters()),
        "kv_bytes_per_token": kv_bytes_per_token(model.config, dtype),
    }

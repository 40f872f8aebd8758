"""One query token's attention over the cache as a hand-written Triton kernel (split-K "flash-decoding").

Why by hand: at batch 1 a decode step gives attention 1 query row per head. A flash-attention kernel (cuDNN,
the SDPA default on an H200) is built for tiles of 64+ query rows and spends ~9 µs per layer on 3; inductor,
given the same math as reductions, fused the softmax into the score reduction and was slower still.
This kernel instead splits the *keys* among many programs, the idea of flash-decoding
(https://crfm.stanford.edu/2023/10/12/flashdecoding.html):

1. ``_partial_kernel``, grid ``(batch x kv_heads, splits)``: each program takes the ``group`` query heads that
   share one kv head and ``BLOCK_L x ITERS`` cache slots; it computes their masked scores, and keeps a running
   max ``m``, a running sum ``l`` of ``exp(score - m)`` and the ``exp``-weighted sum of values (online softmax).
2. ``_combine_kernel``, grid ``(batch x kv_heads,)``: rescales the partial results to one common max and
   divides: ``out = sum_s exp(m_s - M) o_s / sum_s exp(m_s - M) l_s``.

Everything is accumulated in float32 whatever the cache dtype, so the float32 token check against ``"naive"``
stays meaningful. The mask is the boolean one transformers builds (True: attend). Runs on CUDA GPUs of compute
capability 8.0 and newer (Ampere: the kernels are written and checked for it), and on CPU only under Triton's
interpreter (``TRITON_INTERPRET=1``, for tests); elsewhere (a T4, a CPU) ``available`` is False and the callers run
the same math in PyTorch.
"""

from __future__ import annotations

import os

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from .runtime import TRITON_KERNELS, gpu_supports

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU wheel of torch comes without Triton
    triton = tl = None

BLOCK_L = 32  # cache slots per inner step of one program
MAX_SPLITS = 32  # programs per kv head; longer caches give each program several blocks (ITERS)
NUM_WARPS = (4, 4)  # warps per program of the partial and the combine kernel (Triton's default)
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"  # Triton reads it once, at import


def available(query: torch.Tensor) -> bool:
    """Whether kvlab's Triton kernels run on ``query``'s device: a CUDA GPU of compute capability 8.0 or newer with
    Triton (``runtime.TRITON_KERNELS``; not a T4, 7.5), or Triton's CPU interpreter (not while kvlab's CPU graph
    emulation records aten ops: it cannot see a Triton launch)."""
    if triton is None:
        return False
    if query.device.type == "cuda":
        return gpu_supports(query.device, TRITON_KERNELS)
    return INTERPRET and (torch.compiler.is_compiling() or not _get_current_dispatch_mode_stack())


def supports(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """Shapes the kernel handles: one query token, head_dim a power of two, rows contiguous, keys and values laid
    out alike, and a boolean mask ``[batch or 1, 1, 1, slots]`` (or none)."""
    d, slots = query.shape[-1], key.shape[2]
    mask_ok = mask is None or (mask.dtype == torch.bool and mask.dim() == 4 and mask.shape[1:] == (1, 1, slots)
                               and mask.shape[0] in (1, query.shape[0]))
    return (query.shape[2] == 1 and d & (d - 1) == 0 and query.stride(-1) == 1 and key.stride(-1) == 1
            and value.stride() == key.stride() and value.shape == key.shape and mask_ok)


if triton is not None:

    @triton.jit
    def _partial_kernel(Q, K, V, MASK, PO, PM, PL, stride_qb, stride_qh, stride_kb, stride_kh, stride_kl,
                        stride_mb, kv_heads, length, splits, scale,
                        GROUP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_L: tl.constexpr, ITERS: tl.constexpr,
                        D: tl.constexpr, HAS_MASK: tl.constexpr):
        bh, split = tl.program_id(0), tl.program_id(1)  # (batch, kv head), which share of the cache
        b, kvh = bh // kv_heads, bh % kv_heads
        g, d = tl.arange(0, BLOCK_G), tl.arange(0, D)
        q = tl.load(Q + b * stride_qb + (kvh * GROUP + g)[:, None] * stride_qh + d[None, :],
                    mask=(g < GROUP)[:, None], other=0.0).to(tl.float32)  # [G, D]: the heads of this kv head
        m = tl.full([BLOCK_G], float("-inf"), tl.float32)  # running max of the scores
        s_exp = tl.zeros([BLOCK_G], tl.float32)  # running sum of exp(score - m)
        acc = tl.zeros([BLOCK_G, D], tl.float32)  # running sum of exp(score - m) * value
        for i in range(ITERS):
            slot = (split * ITERS + i) * BLOCK_L + tl.arange(0, BLOCK_L)  # [L] cache slots
            keep = slot < length
            if HAS_MASK:
                keep = keep & (tl.load(MASK + b * stride_mb + slot, mask=slot < length, other=0) != 0)
            offs = b * stride_kb + kvh * stride_kh + slot[:, None] * stride_kl + d[None, :]  # [L, D]
            k = tl.load(K + offs, mask=keep[:, None], other=0.0).to(tl.float32)
            v = tl.load(V + offs, mask=keep[:, None], other=0.0).to(tl.float32)
            score = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale  # [G, L]
            score = tl.where(keep[None, :], score, float("-inf"))
            m_new = tl.maximum(m, tl.max(score, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no slot seen yet: exp(-inf - 0) = 0
            p = tl.exp(score - m_safe[:, None])  # [G, L]
            alpha = tl.exp(m - m_safe)  # rescales what was summed under the old max
            s_exp = s_exp * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)  # [G, D]
            m = m_new
        part = (bh * splits + split) * BLOCK_G + g  # [G] rows of the partial results
        tl.store(PM + part, m)
        tl.store(PL + part, s_exp)
        tl.store(PO + part[:, None] * D + d[None, :], acc)

    @triton.jit
    def _combine_kernel(PO, PM, PL, OUT, stride_ob, kv_heads, splits,
                        GROUP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr, D: tl.constexpr):
        bh = tl.program_id(0)
        b, kvh = bh // kv_heads, bh % kv_heads
        s, g, d = tl.arange(0, BLOCK_S), tl.arange(0, BLOCK_G), tl.arange(0, D)
        rows = (bh * splits + s[:, None]) * BLOCK_G + g[None, :]  # [S, G]
        used = (s < splits)[:, None]
        m = tl.load(PM + rows, mask=used, other=float("-inf"))
        s_exp = tl.load(PL + rows, mask=used, other=0.0)
        top = tl.max(m, axis=0)  # [G] the common max
        w = tl.exp(m - tl.where(top == float("-inf"), 0.0, top)[None, :])  # [S, G]; an empty share weighs 0
        o = tl.load(PO + rows[:, :, None] * D + d[None, None, :], mask=used[:, :, None], other=0.0)  # [S, G, D]
        out = tl.sum(w[:, :, None] * o, axis=0) / tl.sum(w * s_exp, axis=0)[:, None]  # [G, D]
        heads = kvh * GROUP + g
        tl.store(OUT + b * stride_ob + heads[:, None] * D + d[None, :], out.to(OUT.dtype.element_ty),
                 mask=(g < GROUP)[:, None])


@torch.library.custom_op("kvlab::decode_attention", mutates_args=())
def decode_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                     scale: float) -> torch.Tensor:
    """softmax(q.k * scale, masked) . v for one query token -> ``[batch, 1, heads, head_dim]``.

    query [b, heads, 1, d]; key/value [b, kv_heads, L, d] (the cache, read in place); mask bool [b, 1, 1, L] or None.
    A custom op: ``torch.compile`` calls it as it is, and the graph kvlab captures launches its two kernels.
    """
    b, heads, _, d = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    group = heads // kv_heads
    block_g = triton.next_power_of_2(group)
    blocks = triton.cdiv(length, BLOCK_L)
    iters = triton.cdiv(blocks, MAX_SPLITS)  # blocks per program
    splits = triton.cdiv(blocks, iters)
    partial_o = torch.empty(b * kv_heads * splits * block_g, d, dtype=torch.float32, device=query.device)
    partial_m = torch.empty(b * kv_heads * splits * block_g, dtype=torch.float32, device=query.device)
    partial_l = torch.empty_like(partial_m)
    out = torch.empty(b, 1, heads, d, dtype=query.dtype, device=query.device)  # what transformers expects back
    has_mask = mask is not None
    mask_arg = mask.expand(b, 1, 1, length)[:, 0, 0] if has_mask else partial_m  # [b, L]; unused when there is none
    _partial_kernel[(b * kv_heads, splits)](
        query, key, value, mask_arg, partial_o, partial_m, partial_l, query.stride(0), query.stride(1), key.stride(0),
        key.stride(1), key.stride(2), mask_arg.stride(0) if has_mask else 0, kv_heads, length, splits, scale,
        GROUP=group, BLOCK_G=block_g, BLOCK_L=BLOCK_L, ITERS=iters, D=d, HAS_MASK=has_mask, num_warps=NUM_WARPS[0])
    _combine_kernel[(b * kv_heads,)](
        partial_o, partial_m, partial_l, out, out.stride(0), kv_heads, splits,
        GROUP=group, BLOCK_G=block_g, BLOCK_S=triton.next_power_of_2(splits), D=d, num_warps=NUM_WARPS[1])
    return out


@decode_attention.register_fake
def _(query, key, value, mask, scale):
    b, heads, _, d = query.shape
    return query.new_empty(b, 1, heads, d)

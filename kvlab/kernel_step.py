"""The decode step as kvlab's own kernels: five hand-written Triton kernels per layer, no torch.compile.

What compiling leaves: ``graph-safe-compiled`` runs 12 kernels per layer on the H200 (``data/h200_batch1.json``),
each 1-8 µs, because inductor fuses only what its rules allow: a norm is a reduction and so is the matmul after
it, so they are two kernels; RoPE, the cache write and the attention are four more. At batch 1 every kernel is
too short to fill the GPU, so a step costs about its number of kernels. Written by hand, one layer is:

1. ``gemv(x, W_qkv, norm=w)``: RMSNorm fused into the q/k/v matmul. Every program recomputes the row's mean
   square (576 numbers, from L2): no norm kernel, no normed copy of x in memory.
2. ``rope_cache_attention``: RoPE on q and the new k (cos/sin computed in the kernel from the cache's counter),
   the new k and v written into the graph-safe cache at the counter, and split-K attention over the slots
   ``<= counter``; the last program of each kv head to finish combines the splits (an arrival counter in memory
   instead of a second kernel).
3. ``gemv(attn, W_o, residual=x)``: o_proj and the residual add.
4. ``gemv(x, W_gate_up, norm=w)``: RMSNorm fused into the gate/up matmul.
5. ``gemv(gate_up, W_down, silu_mul=True, residual=x)``: SiLU(gate) * up fused into down_proj, and the residual.

After the last layer, ``greedy_head``: the final norm and LM head GEMV keep only each program's largest logit, and
one small kernel picks the token and advances the cache's counter (the logits never reach memory). On Hopper and
later every kernel is launched with programmatic dependent launch: it starts while the previous one drains,
loads what does not depend on it (weights, the cache) and waits (``gdc_wait``) before reading its output.
On the H200 this step is 154 kernels and 0.57 ms for SmolLM2-135M at batch 1 (``data/h200_batch1.json``).

A GEMV is ``x[rows, K] @ W[N, K]^T``: each program owns ``BLOCK_N`` outputs of one row and streams their weight
rows. Between operations the values are rounded to the model's dtype where transformers' Llama code rounds
them, so the tokens stay exact in float32 (checked against ``"naive"``).

Without CUDA (and outside Triton's interpreter), and on GPUs older than Ampere (compute capability < 8.0, e.g. a
T4: ``decode_kernel.available``), each function runs the same math in PyTorch: the reference the kernels are tested
against, and what a CPU runs (with the graph capture emulated, like every graph-safe path).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import decode_kernel
from .decode_kernel import tl, triton
from .decoding import OnToken
from .fast_decode import MultiStepDecoder
from .fusion import fused_copy
from .memo import per_model
from .runtime import PDL, gpu_supports

MAX_SPLITS = 16  # attention programs per kv head (a longer cache gives each program several blocks)
BLOCK_L = 32  # cache slots per inner step of an attention program
ATTENTION_WARPS = 4
GEMV_CONFIGS: dict[tuple[int, int], tuple[int, int, int]] = {}  # (N, K) -> (BLOCK_N, BLOCK_K, warps), overrides
NO_NORM, RMS_NORM, SILU_MUL = 0, 1, 2  # the GEMV's prologue: what is done to x before the matmul


def gemv_config(n: int, k: int) -> tuple[int, int, int]:
    """(outputs per program, K per inner step, warps) for an ``[N, K]`` weight at batch 1, from a sweep on the H200
    (``python tools/time_kernel_step.py``): 8 outputs per program and the whole K of 576 in one step were within
    0.15 µs of the best for every projection of SmolLM2; the vocabulary-sized LM head wants 64 outputs and short K
    steps. ``GEMV_CONFIGS`` overrides it per shape."""
    if (n, k) in GEMV_CONFIGS:
        return GEMV_CONFIGS[n, k]
    if n > 16384:
        return 64, 128, 4
    return 8, min(1024, triton.next_power_of_2(k)), 4


def pdl(device: torch.device) -> bool:
    """Programmatic dependent launch (Hopper and later): a kernel is launched while the previous one still runs, loads
    what does not depend on it (weights, the cache), and waits (``gdc_wait``) before it reads the previous output.
    Only on compute capability 9.0 and newer (``runtime.PDL``; the capability is asked once per GPU)."""
    return not decode_kernel.INTERPRET and _HAS_GDC and gpu_supports(device, PDL)


_HAS_GDC = hasattr(getattr(getattr(tl, "extra", None), "cuda", None), "gdc_wait")  # this Triton can wait (PDL)


if triton is not None:

    @triton.jit
    def _wait_for_previous_kernel(PDL: tl.constexpr):
        if PDL:
            tl.extra.cuda.gdc_wait()  # the previous kernel's writes are visible after this
            tl.extra.cuda.gdc_launch_dependents()  # and the next kernel may start its own loads

    @triton.jit
    def _x_tile(x_row, NORM, k, K, rstd, PROLOGUE: tl.constexpr, dt: tl.constexpr):
        """x[k] after the prologue, in float32, rounded to dt where transformers rounds."""
        k_in = k < K
        if PROLOGUE == 2:  # x holds [gate | up]: SiLU(gate) * up
            gate = tl.load(x_row + k, mask=k_in, other=0.0).to(tl.float32)
            up = tl.load(x_row + K + k, mask=k_in, other=0.0).to(tl.float32)
            x = ((gate / (1.0 + tl.exp(-gate))).to(dt).to(tl.float32) * up).to(dt).to(tl.float32)
        else:
            x = tl.load(x_row + k, mask=k_in, other=0.0).to(tl.float32)
            if PROLOGUE == 1:  # weight * (x * rstd).to(dtype), as LlamaRMSNorm
                w_norm = tl.load(NORM + k, mask=k_in, other=0.0).to(tl.float32)
                x = ((x * rstd).to(dt).to(tl.float32) * w_norm).to(dt).to(tl.float32)
        return x

    @triton.jit
    def _gemv_kernel(X, W, BIAS, NORM, RES, OUT, IDX, N, K, stride_x, stride_res, stride_out, eps,
                     PROLOGUE: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, ARGMAX: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
        row, block = tl.program_id(0), tl.program_id(1)
        dt = W.dtype.element_ty  # the model's dtype: results are rounded to it where transformers rounds
        n = block * BLOCK_N + tl.arange(0, BLOCK_N)  # [N_b] this program's outputs
        n_in = n < N
        kk = tl.arange(0, BLOCK_K)
        x_row = X + row * stride_x
        w = tl.load(W + n[:, None] * K + kk[None, :], mask=n_in[:, None] & (kk < K)[None, :], other=0.0)  # [N_b, K_b]
        _wait_for_previous_kernel(PDL)  # the weights do not depend on it: their first tile is already on its way
        rstd = 0.0
        if PROLOGUE == 1:  # RMSNorm needs the row's mean square before any normed value
            squares = tl.zeros([BLOCK_K], tl.float32)
            for start in range(0, K, BLOCK_K):
                x = tl.load(x_row + start + kk, mask=start + kk < K, other=0.0).to(tl.float32)
                squares += x * x
            rstd = 1.0 / tl.sqrt(tl.sum(squares, 0) / K + eps)
        acc = w.to(tl.float32) * _x_tile(x_row, NORM, kk, K, rstd, PROLOGUE, dt)[None, :]
        for start in range(BLOCK_K, K, BLOCK_K):
            k = start + kk
            w = tl.load(W + n[:, None] * K + k[None, :], mask=n_in[:, None] & (k < K)[None, :], other=0.0)
            acc += w.to(tl.float32) * _x_tile(x_row, NORM, k, K, rstd, PROLOGUE, dt)[None, :]
        y = tl.sum(acc, 1)  # [N_b]
        if HAS_BIAS:
            y += tl.load(BIAS + n, mask=n_in, other=0.0).to(tl.float32)
        if HAS_RES:  # residual + the layer's output, both in the model's dtype
            y = y.to(dt).to(tl.float32) + tl.load(RES + row * stride_res + n, mask=n_in, other=0.0).to(tl.float32)
        if ARGMAX:  # the LM head: only this program's largest logit (as the model's dtype) and where it is
            y = tl.where(n_in, y.to(dt).to(tl.float32), float("-inf"))
            best = tl.argmax(y, 0, tie_break_left=True)
            tl.store(OUT + row * stride_out + block, tl.max(y, 0))
            tl.store(IDX + row * stride_out + block, block * BLOCK_N + best)
        else:
            tl.store(OUT + row * stride_out + n, y.to(dt), mask=n_in)

    @triton.jit
    def _argmax_kernel(VAL, IDX, TOKEN, POS, blocks, stride_val, stride_token,
                       BLOCK: tl.constexpr, ADVANCE: tl.constexpr, PDL: tl.constexpr):
        """The token: the index of the largest of the LM head's per-program maxima (the first, on ties); then
        program 0 advances the cache's counter (``ADVANCE``): the step's last write."""
        row = tl.program_id(0)
        i = tl.arange(0, BLOCK)
        _wait_for_previous_kernel(PDL)
        val = tl.load(VAL + row * stride_val + i, mask=i < blocks, other=float("-inf"))
        best = tl.argmax(val, 0, tie_break_left=True)  # the first block holding the maximum has its first index
        token = tl.load(IDX + row * stride_val + best)
        tl.store(TOKEN + row * stride_token, token.to(tl.int64))
        if ADVANCE and row == 0:
            tl.store(POS, tl.load(POS) + 1)

    @triton.jit
    def _rope(x, x_rot, cos, sin, dt: tl.constexpr):
        """x * cos + rotate_half(x) * sin, each product and the sum rounded to dt (as transformers computes it)."""
        return ((x * cos).to(dt).to(tl.float32) + (x_rot * sin).to(dt).to(tl.float32)).to(dt).to(tl.float32)

    @triton.jit
    def _attend(q, k, v, slot, keep, m, s_exp, acc, scale):
        """One block of slots into the running (online) softmax: max m, sum s_exp, weighted values acc."""
        score = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale  # [G, L]
        score = tl.where(keep[None, :], score, float("-inf"))
        m_new = tl.maximum(m, tl.max(score, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no slot seen yet: exp(-inf - 0) = 0
        p = tl.exp(score - m_safe[:, None])  # [G, L]
        alpha = tl.exp(m - m_safe)
        s_exp = s_exp * alpha + tl.sum(p, axis=1)
        v = tl.where(keep[:, None], v, 0.0)  # a slot past the counter may hold anything: weigh it 0, exactly
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)  # [G, D]
        return m_new, s_exp, acc

    @triton.jit
    def _rope_cache_attention_kernel(
            QKV, INV_FREQ, KC, VC, POS, OUT, PO, PM, PL, DONE, stride_qkv, stride_kb, stride_kh, stride_kl,
            stride_ob, kv_heads, slots, scale, rope_scale,
            HEADS: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_L: tl.constexpr,
            ITERS: tl.constexpr, SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, PDL: tl.constexpr):
        bh, split = tl.program_id(0), tl.program_id(1)  # (batch row, kv head), which share of the cache
        b, kvh = bh // kv_heads, bh % kv_heads
        dt = KC.dtype.element_ty
        g, d = tl.arange(0, BLOCK_G), tl.arange(0, D)
        cache = b * stride_kb + kvh * stride_kh
        # Before waiting for the q/k/v projection: this token's position and the first block of the cache (slots
        # written by earlier steps; the slot being written now is replaced from registers below).
        pos = tl.load(POS)  # the cache's counter: this token's position
        slot = split * ITERS * BLOCK_L + tl.arange(0, BLOCK_L)  # [L]
        offs = cache + slot[:, None] * stride_kl + d[None, :]  # [L, D]
        k = tl.load(KC + offs, mask=(slot < slots)[:, None], other=0.0).to(tl.float32)
        v = tl.load(VC + offs, mask=(slot < slots)[:, None], other=0.0).to(tl.float32)
        # RoPE's cos/sin at this position, as transformers' rotary embedding computes them (float32, then dtype).
        angle = pos.to(tl.float32) * tl.load(INV_FREQ + d % (D // 2))  # [D]: cat(freqs, freqs)
        cos = (tl.cos(angle) * rope_scale).to(dt).to(tl.float32)
        sin = (tl.sin(angle) * rope_scale).to(dt).to(tl.float32)
        d_rot = (d + D // 2) % D  # rotate_half(x) = cat(-x[D/2:], x[:D/2])
        sign = tl.where(d < D // 2, -1.0, 1.0)
        _wait_for_previous_kernel(PDL)
        row = QKV + b * stride_qkv
        heads = kvh * GROUP + g  # [G] the query heads of this kv head
        q_ptr = row + heads[:, None] * D
        g_in = (g < GROUP)[:, None]
        q = tl.load(q_ptr + d[None, :], mask=g_in, other=0.0).to(tl.float32)
        q_rot = tl.load(q_ptr + d_rot[None, :], mask=g_in, other=0.0).to(tl.float32) * sign[None, :]
        q = _rope(q, q_rot, cos[None, :], sin[None, :], dt)  # [G, D]
        k_ptr = row + (HEADS + kvh) * D
        k_new = _rope(tl.load(k_ptr + d).to(tl.float32), tl.load(k_ptr + d_rot).to(tl.float32) * sign, cos, sin, dt)
        v_new = tl.load(row + (HEADS + kv_heads + kvh) * D + d).to(tl.float32)  # [D]
        if split == 0:  # write the new k, v at the counter (the trash slot `slots` if the cache is full)
            write = tl.minimum(pos, slots)
            tl.store(KC + cache + write * stride_kl + d, k_new.to(dt))
            tl.store(VC + cache + write * stride_kl + d, v_new.to(dt))
        m = tl.full([BLOCK_G], float("-inf"), tl.float32)  # running max of the scores
        s_exp = tl.zeros([BLOCK_G], tl.float32)  # running sum of exp(score - m)
        acc = tl.zeros([BLOCK_G, D], tl.float32)  # running sum of exp(score - m) * value
        new = (slot == pos)[:, None]  # the slot being written: its values are in registers
        keep = (slot <= pos) & (slot < slots)
        m, s_exp, acc = _attend(q, tl.where(new, k_new[None, :], k), tl.where(new, v_new[None, :], v), slot, keep,
                                m, s_exp, acc, scale)
        for i in range(1, ITERS):  # further blocks of this program's share (long caches)
            slot = (split * ITERS + i) * BLOCK_L + tl.arange(0, BLOCK_L)
            keep = (slot <= pos) & (slot < slots)
            offs = cache + slot[:, None] * stride_kl + d[None, :]
            new = (slot == pos)[:, None]
            k = tl.where(new, k_new[None, :], tl.load(KC + offs, mask=keep[:, None], other=0.0).to(tl.float32))
            v = tl.where(new, v_new[None, :], tl.load(VC + offs, mask=keep[:, None], other=0.0).to(tl.float32))
            m, s_exp, acc = _attend(q, k, v, slot, keep, m, s_exp, acc, scale)
        out_ptr = OUT + b * stride_ob + heads[:, None] * D + d[None, :]  # [G, D]
        if SPLITS == 1:
            tl.store(out_ptr, (acc / s_exp[:, None]).to(dt), mask=g_in)
        else:  # publish this share; the last program of the kv head to arrive combines all shares
            part = (bh * SPLITS + split) * BLOCK_G + g  # [G]
            tl.store(PM + part, m)
            tl.store(PL + part, s_exp)
            tl.store(PO + part[:, None] * D + d[None, :], acc)
            tl.debug_barrier()  # every thread's stores are issued before the release below
            arrived = tl.atomic_add(DONE + bh, 1, sem="acq_rel")
            if arrived == SPLITS - 1:
                s = tl.arange(0, BLOCK_S)
                rows = (bh * SPLITS + s[:, None]) * BLOCK_G + g[None, :]  # [S, G]
                used = (s < SPLITS)[:, None]
                ms = tl.load(PM + rows, mask=used, other=float("-inf"), cache_modifier=".cg")
                ls = tl.load(PL + rows, mask=used, other=0.0, cache_modifier=".cg")
                top = tl.max(ms, axis=0)  # [G]
                w = tl.exp(ms - tl.where(top == float("-inf"), 0.0, top)[None, :])  # [S, G]: an empty share weighs 0
                os = tl.load(PO + rows[:, :, None] * D + d[None, None, :], mask=used[:, :, None], other=0.0,
                             cache_modifier=".cg")  # [S, G, D]
                out = tl.sum(w[:, :, None] * os, axis=0) / tl.sum(w * ls, axis=0)[:, None]
                tl.store(out_ptr, out.to(dt), mask=g_in)
                tl.store(DONE + bh, 0)  # ready for the next layer


def _use_triton(x: torch.Tensor) -> bool:
    return decode_kernel.available(x)


def _require_dense_rows(**tensors: torch.Tensor) -> None:
    """The kernels index rows with one stride and elements with none: refuse other layouts instead of reading wrong."""
    for name, t in tensors.items():
        if t is not None and t.stride(-1) != 1:
            raise ValueError(f"{name} must have contiguous rows (stride 1 in its last dimension), got strides "
                             f"{tuple(t.stride())}: pass {name}.contiguous()")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm's arithmetic: float32 statistics, rounded back to x's dtype before the weight."""
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def gemv(x: torch.Tensor, weight: torch.Tensor, *, bias: torch.Tensor | None = None, norm: torch.Tensor | None = None,
         eps: float = 1e-6, silu_mul: bool = False, residual: torch.Tensor | None = None) -> torch.Tensor:
    """``prologue(x) @ weight.T (+ bias) (+ residual)`` -> ``[rows, N]``.

    x ``[rows, K]`` (``[rows, 2K]`` = [gate | up] with ``silu_mul``); weight ``[N, K]``; ``norm``: an RMSNorm weight
    ``[K]`` applied to x first; ``residual [rows, N]`` added last.
    """
    if not _use_triton(x):
        if norm is not None:
            x = rms_norm(x, norm, eps)
        if silu_mul:
            gate, up = x.chunk(2, dim=-1)
            x = F.silu(gate) * up
        y = F.linear(x, weight, bias)
        return y if residual is None else residual + y
    out = torch.empty(x.shape[0], weight.shape[0], dtype=weight.dtype, device=x.device)
    _launch_gemv(x, weight, bias, norm, eps, silu_mul, residual, out, None)
    return out


def _launch_gemv(x, weight, bias, norm, eps, silu_mul, residual, out, index) -> None:
    """Launch ``_gemv_kernel``; with ``index``, the argmax form (per-program maxima into out/index)."""
    _require_dense_rows(x=x, residual=residual)
    if not weight.is_contiguous():
        raise ValueError("weight must be contiguous ([N, K], rows of K): pass weight.contiguous()")
    rows, (n, k) = x.shape[0], weight.shape
    block_n, block_k, warps = gemv_config(n, k)
    blocks = triton.cdiv(n, block_n)
    _gemv_kernel[(rows, blocks)](
        x, weight, bias if bias is not None else weight, norm if norm is not None else weight,
        residual if residual is not None else out, out, index if index is not None else out, n, k, x.stride(0),
        residual.stride(0) if residual is not None else 0, out.stride(0), eps,
        PROLOGUE=SILU_MUL if silu_mul else RMS_NORM if norm is not None else NO_NORM, HAS_BIAS=bias is not None,
        HAS_RES=residual is not None, ARGMAX=index is not None, BLOCK_N=block_n, BLOCK_K=block_k,
        PDL=pdl(x.device), num_warps=warps, **_launch_options(x.device))


def _launch_options(device: torch.device) -> dict:
    return {"launch_pdl": True} if pdl(device) else {}


def greedy_head(x: torch.Tensor, weight: torch.Tensor, norm: torch.Tensor, eps: float, token: torch.Tensor,
                position: torch.Tensor | None = None) -> torch.Tensor:
    """The LM head and greedy choice: ``argmax(rms_norm(x) @ weight.T)`` written into ``token [rows, 1]`` (in place;
    the logits are never stored), and ``position += 1`` when given (the cache's counter, the step's last write)."""
    if not _use_triton(x):
        token.copy_(F.linear(rms_norm(x, norm, eps), weight).argmax(dim=-1, keepdim=True))
        if position is not None:
            position.add_(1)
        return token
    rows, n = x.shape[0], weight.shape[0]
    blocks = triton.cdiv(n, gemv_config(n, weight.shape[1])[0])
    maxima = torch.empty(rows, blocks, dtype=torch.float32, device=x.device)
    where = torch.empty(rows, blocks, dtype=torch.int32, device=x.device)
    _launch_gemv(x, weight, None, norm, eps, False, None, maxima, where)
    _argmax_kernel[(rows,)](maxima, where, token, position if position is not None else token, blocks,
                            maxima.stride(0), token.stride(0), BLOCK=triton.next_power_of_2(blocks),
                            ADVANCE=position is not None, PDL=pdl(x.device), **_launch_options(x.device))
    return token


def rope_cache_attention(qkv: torch.Tensor, inv_freq: torch.Tensor, rope_scale: float, keys: torch.Tensor,
                         values: torch.Tensor, position: torch.Tensor, heads: int, scale: float,
                         done: torch.Tensor | None = None) -> torch.Tensor:
    """One decode token's attention, with RoPE and the cache write -> ``[batch, heads * head_dim]``.

    qkv ``[batch, (heads + 2 kv_heads) * d]`` (the projection's output); inv_freq ``[d / 2]`` and rope_scale: the
    model's rotary embedding (``inv_freq``, ``attention_scaling``); keys/values: a graph-safe layer's buffers
    ``[batch, kv_heads, slots + 1, d]`` (the last slot is the trash slot), written in place at ``position`` (the
    cache's counter, a 0-dim tensor); attends to the slots ``<= position``.
    ``done``: int32 zeros ``[batch * kv_heads]``, the kernel's arrival counters (it leaves them at zero).
    """
    b, kv_heads, slots, d = keys.shape[0], keys.shape[1], keys.shape[2] - 1, keys.shape[3]
    if not _use_triton(qkv):
        from transformers.models.llama.modeling_llama import rotate_half

        freqs = position.float() * inv_freq  # [d / 2], as transformers' rotary embedding
        angle = torch.cat((freqs, freqs))
        cos, sin = ((f(angle) * rope_scale).to(qkv.dtype) for f in (torch.cos, torch.sin))
        q, k, v = qkv.view(b, 1, -1, d).transpose(1, 2).split([heads, kv_heads, kv_heads], dim=1)  # [b, h, 1, d]
        q, k = (x * cos + rotate_half(x) * sin for x in (q, k))
        write = position.clamp(max=slots).reshape(1)
        keys.index_copy_(2, write, k)
        values.index_copy_(2, write, v)
        mask = (torch.arange(slots, device=qkv.device) <= position).reshape(1, 1, 1, slots)
        group = heads // kv_heads
        out = F.scaled_dot_product_attention(q, keys[:, :, :slots].repeat_interleave(group, 1),
                                             values[:, :, :slots].repeat_interleave(group, 1), attn_mask=mask,
                                             scale=scale)
        return out.reshape(b, heads * d)
    _require_dense_rows(qkv=qkv, keys=keys, values=values)
    if values.stride() != keys.stride():
        raise ValueError("keys and values must be laid out alike (the cache's buffers are)")
    group = heads // kv_heads
    block_g = triton.next_power_of_2(group)
    blocks = triton.cdiv(slots, BLOCK_L)
    iters = triton.cdiv(blocks, MAX_SPLITS)
    splits = triton.cdiv(blocks, iters)
    out = torch.empty(b, heads * d, dtype=keys.dtype, device=keys.device)
    part = b * kv_heads * splits * block_g
    partial_o = torch.empty(part, d, dtype=torch.float32, device=keys.device)
    partial_m = torch.empty(part, dtype=torch.float32, device=keys.device)
    partial_l = torch.empty_like(partial_m)
    if done is None:
        done = torch.zeros(b * kv_heads, dtype=torch.int32, device=keys.device)
    _rope_cache_attention_kernel[(b * kv_heads, splits)](
        qkv, inv_freq, keys, values, position, out, partial_o, partial_m, partial_l, done, qkv.stride(0),
        keys.stride(0), keys.stride(1), keys.stride(2), out.stride(0), kv_heads, slots, scale, rope_scale,
        HEADS=heads, GROUP=group, BLOCK_G=block_g, D=d, BLOCK_L=BLOCK_L, ITERS=iters, SPLITS=splits,
        BLOCK_S=triton.next_power_of_2(splits), PDL=pdl(keys.device), num_warps=ATTENTION_WARPS,
        **_launch_options(keys.device))
    return out


SUPPORTED = ("llama", "mistral", "qwen2")  # RMSNorm, rotate-half RoPE, SiLU-gated MLP, no per-head norms


def check_supported(model) -> None:
    """Refuse, with what to do, a model whose layer is not the one the kernels compute."""
    config = model.config
    why = None
    if config.model_type not in SUPPORTED:
        why = f"model_type {config.model_type!r} (supported: {', '.join(SUPPORTED)})"
    elif getattr(config, "hidden_act", "silu") != "silu":
        why = f"hidden_act {config.hidden_act!r} (the kernel fuses SiLU)"
    elif getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        why = "a sliding window"
    elif model.model.rotary_emb.rope_type in ("dynamic", "longrope"):
        why = f"{model.model.rotary_emb.rope_type!r} RoPE (its frequencies change with the length)"
    elif getattr(model.lm_head, "bias", None) is not None:
        why = "a bias in the LM head"
    else:
        attn = model.model.layers[0].self_attn
        if attn.head_dim & (attn.head_dim - 1):
            why = f"head_dim {attn.head_dim} (must be a power of two)"
    if why:
        raise ValueError(f"kvlab's decode kernels compute a Llama-style layer; this model has {why}. Use the "
                         "'graph-safe-compiled' or 'graph-safe' strategy for it.")


class KernelStepDecoder(MultiStepDecoder):
    """A MultiStepDecoder whose decode step is this module's kernels instead of the model's forward.

    The prefill still runs the transformers model (fused copy) into the same ``GraphSafeStaticCache``; the step
    reads the cache's counter for RoPE and the write slot, and advances it once, like the graph-safe cache does.
    """

    def __init__(self, model, max_cache_len: int, batch: int = 1, *, steps: int = 16, graph: bool = True):
        check_supported(model)
        fast = fused_copy(model, attention=False)  # one q/k/v and one gate/up weight per layer
        super().__init__(fast, max_cache_len, batch, steps=steps, graph=graph)
        kv_heads = fast.config.num_key_value_heads
        self.done = torch.zeros(batch * kv_heads, dtype=torch.int32, device=self.device)  # attention's counters
        self._run_step = self._kernel_step

    def _kernel_step(self, token: torch.Tensor) -> torch.Tensor:
        """One decode step: reads ``token`` [batch, 1], writes the next token into it, advances the counter."""
        decoder, b = self.model.model, token.shape[0]
        heads = self.model.config.num_attention_heads
        rope = decoder.rotary_emb
        position = self.cache.cache_position  # [] the one counter: this token's position
        x = decoder.embed_tokens(token).view(b, -1)  # [b, hidden]
        for layer, cached in zip(decoder.layers, self.cache.layers, strict=True):
            attn, mlp = layer.self_attn, layer.mlp
            norm1, norm2 = layer.input_layernorm, layer.post_attention_layernorm
            qkv = gemv(x, attn.qkv_proj.weight, bias=attn.qkv_proj.bias, norm=norm1.weight, eps=norm1.variance_epsilon)
            out = rope_cache_attention(qkv, rope.inv_freq, rope.attention_scaling, cached.keys, cached.values,
                                       position, heads, attn.scaling, self.done)  # [b, heads * d]
            x = gemv(out, attn.o_proj.weight, bias=attn.o_proj.bias, residual=x)
            gate_up = gemv(x, mlp.gate_up_proj.weight, bias=mlp.gate_up_proj.bias, norm=norm2.weight,
                           eps=norm2.variance_epsilon)  # [b, 2 * intermediate]
            x = gemv(gate_up, mlp.down_proj.weight, bias=mlp.down_proj.bias, silu_mul=True, residual=x)
        return greedy_head(x, self.model.lm_head.weight, decoder.norm.weight, decoder.norm.variance_epsilon, token,
                           position)  # the next token, in place; the counter advanced


def decode_graph_safe_kernels(model, input_ids: torch.Tensor, max_new_tokens: int, *, on_token: OnToken = None,
                              steps: int = 16, max_cache_len: int | None = None, graph: bool | None = None) -> torch.Tensor:
    """The ``"graph-safe-kernels"`` strategy: kvlab's kernels for the step, ``steps`` steps per captured graph.

    The decoder is kept per model and settings, so later calls replay the graphs the first one captured.
    """
    use_graph = True if graph is None else graph  # a real CUDA graph on a GPU, emulated elsewhere
    need = input_ids.shape[1] + max_new_tokens
    length = max_cache_len or 16 * -(-need // 16)
    key = (input_ids.shape[0], length, steps, use_graph, next(model.parameters()).dtype)
    decoder = per_model(model, "graph-safe-kernels", key, lambda: KernelStepDecoder(
        model, length, input_ids.shape[0], steps=steps, graph=use_graph), keep=lambda d: not d.stale())
    return decoder.generate(input_ids, max_new_tokens, on_token=on_token)

"""One query token's attention over the cache as hand-written split-K Triton kernels
("flash-decoding").

Why by hand: at batch 1 a decode step gives attention 1 query row per head. A flash-attention kernel
(cuDNN, the SDPA default on an H200) is built for tiles of many query rows; inductor, given the same
math as reductions, fused the softmax into the score reduction and was slower still (data/README.md:
"Retired variants"). These kernels instead split the *keys* among many programs, the idea of
flash-decoding (https://crfm.stanford.edu/2023/10/12/flashdecoding.html); the online softmax and the
combine of the shares are ``kvlab.kernels.common``'s, shared by both:

- ``decode_attention`` (a custom op; ``graph-safe-compiled``'s attention through ``kvlab.fusion``):
  the cache as transformers passes it, a boolean mask. ``_partial_kernel``, grid ``(batch x
  kv_heads, splits)``, attends each share; ``_combine_kernel``, grid ``(batch x kv_heads,)``,
  combines them.
- ``rope_cache_attention`` (the decode step of ``kvlab.kernels.step``): RoPE on q and the new k
  (cos/sin computed in the kernel from the cache's counter), the new k and v written into the
  graph-safe cache at the counter, and split-K attention over the slots ``<= counter``; the last
  program of each kv head to finish combines the shares (an arrival counter in memory instead of a
  second kernel). ``dot=True`` computes scores and P.V with ``tl.dot`` over the kv head's query
  group padded to a tile (``common.DOT_ROWS``): tensor cores instead of broadcasts.
- ``rope_cache_prefill_attention`` (the prefill of ``kvlab.kernels.step.kernel_prefill``): the same
  for the T rows of a prompt (padded to T; its first ``valid`` rows count). Each program takes a
  tile of the prompt's positions for the query heads of one kv head (``PREFILL_TILE``'s query rows),
  writes their keys and values into the cache, and attends causally with ``tl.dot``: to the slots
  before the prompt from the cache, to the prompt's own from q/k/v (with RoPE there), so no program
  reads a slot another one writes.

Everything is accumulated in float32 whatever the cache dtype, so the float32 token check against
``"naive"`` stays meaningful. Runs on CUDA GPUs of compute capability 8.0 and newer, and on CPU only
under Triton's interpreter (``common.available``); elsewhere the callers (``kvlab.fusion``) or
``rope_cache_attention`` itself run the same math in PyTorch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import common
from .common import tl, triton

# per program of every attention kernel: the sweep's
ATTENTION_WARPS = common.TUNING["attention_warps"]
# The prefill kernel's (query rows: prompt positions x the query heads of a kv head, padded; key
# slots per inner step) by the cache's element size. Float32 (the token check's) takes half of each:
# at 64 x 64 its kernel needs 144 KiB of shared memory, more than an sm_86/sm_89 GPU (an RTX 30xx,
# an L4) has (python tools/compile_kernels.py).
PREFILL_TILE = {2: (64, 64), 4: (32, 32)}


def prefill_rows(pairs: int, t: int, block_g: int, most: int, device: torch.device) -> int:
    """Query rows per program of the prefill attention: ``most`` (``PREFILL_TILE``'s), halved while
    the launch would give fewer programs than one wave fills (``common.multiprocessors``) and a tile
    keeps at least ``common.DOT_ROWS`` rows. A 64-token prompt at batch 1 (SmolLM2: 3 kv heads,
    groups of 3 padded to 4) then runs 48 programs of 16 rows instead of 12 of 64; from batch 16 the
    64-row tiles already fill an H100 or H200."""
    rows = most
    while rows > common.DOT_ROWS and pairs * -(
        -t // max(1, rows // block_g)
    ) < common.multiprocessors(device):
        rows //= 2
    return rows


def supports(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None
) -> bool:
    """Shapes ``decode_attention`` handles: one query token, head_dim a power of two, rows
    contiguous, keys and values laid out alike, and a boolean mask ``[batch or 1, 1, 1, slots]`` (or
    none)."""
    d, slots = query.shape[-1], key.shape[2]
    mask_ok = mask is None or (
        mask.dtype == torch.bool
        and mask.dim() == 4
        and mask.shape[1:] == (1, 1, slots)
        and mask.shape[0] in (1, query.shape[0])
    )
    return (
        query.shape[2] == 1
        and d & (d - 1) == 0
        and query.stride(-1) == 1
        and key.stride(-1) == 1
        and value.stride() == key.stride()
        and value.shape == key.shape
        and mask_ok
    )


def _split_plan(group: int, slots: int, block_l: int | None = None,
                max_splits: int | None = None) -> tuple[int, int, int]:
    """(query heads padded to a power of two, blocks per program, programs) for ``slots`` cache
    slots in blocks of ``block_l`` (default ``common.BLOCK_L``), at most ``max_splits`` programs
    (default ``common.MAX_SPLITS``)."""
    blocks = triton.cdiv(slots, block_l or common.BLOCK_L)
    iters = triton.cdiv(blocks, max_splits or common.MAX_SPLITS)
    return triton.next_power_of_2(group), iters, triton.cdiv(blocks, iters)


def _partials(
    rows: int, d: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The shares' results, float32: weighted values ``[rows, d]``, maxima ``[rows]``, sums
    ``[rows]``."""
    partial_o = torch.empty(rows, d, dtype=torch.float32, device=device)
    partial_m = torch.empty(rows, dtype=torch.float32, device=device)
    return partial_o, partial_m, torch.empty_like(partial_m)


if triton is not None:
    from .common import attend, combine_splits, softmax_start, store_partial
    from .common import wait_for_previous_kernel as wait_for_previous_kernel

    @triton.jit
    def _partial_kernel(
        Q, K, V, MASK, PO, PM, PL, stride_qb, stride_qh, stride_kb, stride_kh, stride_kl, stride_mb,
        kv_heads, length, splits, scale, GROUP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_L:
        tl.constexpr, ITERS: tl.constexpr, D: tl.constexpr, HAS_MASK: tl.constexpr
    ):
        bh, split = tl.program_id(0), tl.program_id(1)  # (batch, kv head), which share of the cache
        b, kvh = bh // kv_heads, bh % kv_heads
        g, d = tl.arange(0, BLOCK_G), tl.arange(0, D)
        q = tl.load(Q + b * stride_qb + (kvh * GROUP + g)[:, None] * stride_qh + d[None, :],
                    # [G, D]: the heads of this kv head
                    mask=(g < GROUP)[:, None], other=0.0).to(tl.float32)
        m, s_exp, acc = softmax_start(BLOCK_G, D)
        for i in range(ITERS):
            slot = (split * ITERS + i) * BLOCK_L + tl.arange(0, BLOCK_L)  # [L] cache slots
            keep = slot < length
            if HAS_MASK:
                keep = keep & (
                    tl.load(MASK + b * stride_mb + slot, mask=slot < length, other=0) != 0
                )
            # [L, D]
            offs = b * stride_kb + kvh * stride_kh + slot[:, None] * stride_kl + d[None, :]
            k = tl.load(K + offs, mask=keep[:, None], other=0.0).to(tl.float32)
            v = tl.load(V + offs, mask=keep[:, None], other=0.0).to(tl.float32)
            m, s_exp, acc = attend(
                q, k, v, keep[None, :], keep, m, s_exp, acc, scale, False, K.dtype.element_ty
            )
        store_partial(PO, PM, PL, bh, split, splits, m, s_exp, acc, BLOCK_G, D)

    @triton.jit
    def _combine_kernel(
        PO, PM, PL, OUT, stride_ob, kv_heads, splits, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
        BLOCK_S: tl.constexpr, D: tl.constexpr
    ):
        bh = tl.program_id(0)
        b, kvh = bh // kv_heads, bh % kv_heads
        g, d = tl.arange(0, BLOCK_G), tl.arange(0, D)
        out = combine_splits(PO, PM, PL, bh, splits, BLOCK_G, BLOCK_S, D)  # [G, D]
        heads = kvh * GROUP + g
        tl.store(
            OUT + b * stride_ob + heads[:, None] * D + d[None, :],
            out.to(OUT.dtype.element_ty),
            mask=(g < GROUP)[:, None],
        )

    @triton.jit
    def _rope(x, x_rot, cos, sin, dt: tl.constexpr):
        """x * cos + rotate_half(x) * sin, each product and the sum rounded to dt (as transformers
        computes it)."""
        return (
            ((x * cos).to(dt).to(tl.float32) + (x_rot * sin).to(dt).to(tl.float32))
            .to(dt)
            .to(tl.float32)
        )

    @triton.jit
    def _rope_cos_sin(position, inv_freq, rope_scale, dt: tl.constexpr):
        """RoPE's cos and sin at ``position`` (a number, or [rows, 1]) for ``inv_freq`` (``[D]``,
        cat(freqs, freqs)), as transformers' rotary embedding computes them: float32 angles, then
        rounded to dt."""
        angle = position.to(tl.float32) * inv_freq
        return (tl.cos(angle) * rope_scale).to(dt).to(tl.float32), (tl.sin(angle) * rope_scale).to(
            dt
        ).to(tl.float32)

    @triton.jit
    def _load_roped(ptr, d, d_rot, sign, cos, sin, inside, dt: tl.constexpr):
        """Head vectors at ``ptr`` ([rows, 1] pointers, ``d`` [1, D]) with RoPE applied, float32 (0
        outside)."""
        x = tl.load(ptr + d, mask=inside, other=0.0).to(tl.float32)
        x_rot = tl.load(ptr + d_rot, mask=inside, other=0.0).to(tl.float32) * sign
        return _rope(x, x_rot, cos, sin, dt)

    @triton.jit
    def _rope_cache_attention_kernel(
        QKV, INV_FREQ, KC, VC, POS, OUT, PO, PM, PL, DONE, stride_qkv, stride_kb, stride_kh,
        stride_kl, stride_ob, kv_heads, slots, scale, rope_scale, HEADS: tl.constexpr, GROUP:
        tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_L: tl.constexpr, ITERS:
        tl.constexpr, SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, PDL: tl.constexpr, DOT:
        tl.constexpr
    ):
        # (batch row, kv head), which share of the cache
        bh, split = tl.program_id(0), tl.program_id(1)
        b, kvh = bh // kv_heads, bh % kv_heads
        dt = KC.dtype.element_ty
        g, d = tl.arange(0, BLOCK_G), tl.arange(0, D)
        cache = b * stride_kb + kvh * stride_kh
        # Before waiting for the q/k/v projection: the first block of the cache (slots written by
        # earlier steps; the slot being written now is replaced from registers below) and this
        # token's position.
        slot = split * ITERS * BLOCK_L + tl.arange(0, BLOCK_L)  # [L]
        offs = cache + slot[:, None] * stride_kl + d[None, :]  # [L, D]
        k = tl.load(KC + offs, mask=(slot < slots)[:, None], other=0.0).to(tl.float32)
        v = tl.load(VC + offs, mask=(slot < slots)[:, None], other=0.0).to(tl.float32)
        pos = tl.load(POS)  # the cache's counter: this token's position
        wait_for_previous_kernel(PDL)
        cos, sin = _rope_cos_sin(pos, tl.load(INV_FREQ + d % (D // 2)), rope_scale, dt)  # [D]
        d_rot = (d + D // 2) % D  # rotate_half(x) = cat(-x[D/2:], x[:D/2])
        sign = tl.where(d < D // 2, -1.0, 1.0)
        row = QKV + b * stride_qkv
        heads = kvh * GROUP + g  # [G] the query heads of this kv head
        q_ptr = row + heads[:, None] * D
        g_in = (g < GROUP)[:, None]
        q = tl.load(q_ptr + d[None, :], mask=g_in, other=0.0).to(tl.float32)
        q_rot = tl.load(q_ptr + d_rot[None, :], mask=g_in, other=0.0).to(tl.float32) * sign[None, :]
        q = _rope(q, q_rot, cos[None, :], sin[None, :], dt)  # [G, D]
        k_ptr = row + (HEADS + kvh) * D
        k_new = _rope(
            tl.load(k_ptr + d).to(tl.float32), tl.load(k_ptr + d_rot).to(tl.float32) * sign, cos,
            sin, dt
        )
        v_new = tl.load(row + (HEADS + kv_heads + kvh) * D + d).to(tl.float32)  # [D]
        # write the new k, v at the counter (the trash slot `slots` if the cache is full)
        if split == 0:
            write = tl.minimum(pos, slots)
            tl.store(KC + cache + write * stride_kl + d, k_new.to(dt))
            tl.store(VC + cache + write * stride_kl + d, v_new.to(dt))
        m, s_exp, acc = softmax_start(BLOCK_G, D)
        new = (slot == pos)[:, None]  # the slot being written: its values are in registers
        keep = (slot <= pos) & (slot < slots)
        m, s_exp, acc = attend(
            q, tl.where(new, k_new[None, :], k), tl.where(new, v_new[None, :], v), keep[None, :],
            keep, m, s_exp, acc, scale, DOT, dt
        )
        for i in range(1, ITERS):  # further blocks of this program's share (long caches)
            slot = (split * ITERS + i) * BLOCK_L + tl.arange(0, BLOCK_L)
            keep = (slot <= pos) & (slot < slots)
            offs = cache + slot[:, None] * stride_kl + d[None, :]
            new = (slot == pos)[:, None]
            k = tl.where(
                new,
                k_new[None, :],
                tl.load(KC + offs, mask=keep[:, None], other=0.0).to(tl.float32),
            )
            v = tl.where(
                new,
                v_new[None, :],
                tl.load(VC + offs, mask=keep[:, None], other=0.0).to(tl.float32),
            )
            m, s_exp, acc = attend(q, k, v, keep[None, :], keep, m, s_exp, acc, scale, DOT, dt)
        out_ptr = OUT + b * stride_ob + heads[:, None] * D + d[None, :]  # [G, D]
        if SPLITS == 1:
            tl.store(out_ptr, (acc / s_exp[:, None]).to(dt), mask=g_in)
        else:  # publish this share; the last program of the kv head to arrive combines all shares
            store_partial(PO, PM, PL, bh, split, SPLITS, m, s_exp, acc, BLOCK_G, D)
            tl.debug_barrier()  # every thread's stores are issued before the release below
            arrived = tl.atomic_add(DONE + bh, 1, sem="acq_rel")
            if arrived == SPLITS - 1:
                out = combine_splits(PO, PM, PL, bh, SPLITS, BLOCK_G, BLOCK_S, D)
                tl.store(out_ptr, out.to(dt), mask=g_in)
                tl.store(DONE + bh, 0)  # ready for the next layer


    @triton.jit
    def _prefill_attention_kernel(
        QKV, INV_FREQ, KC, VC, POS, VALID, OUT, stride_qkv, stride_kb, stride_kh, stride_kl,
        stride_out, kv_heads, slots, T, scale, rope_scale, HEADS: tl.constexpr, GROUP: tl.constexpr,
        BLOCK_G: tl.constexpr, BLOCK_T: tl.constexpr, D: tl.constexpr, BLOCK_L: tl.constexpr, PDL:
        tl.constexpr
    ):
        # (batch row, kv head), which tile of the prompt's positions
        bh, tile = tl.program_id(0), tl.program_id(1)
        b, kvh = bh // kv_heads, bh % kv_heads
        dt = KC.dtype.element_ty
        wait_for_previous_kernel(PDL)
        # the prompt's first position; how many of its T rows count
        start, valid = tl.load(POS), tl.load(VALID)
        d = tl.arange(0, D)[None, :]  # [1, D]
        d_rot = (d + D // 2) % D  # rotate_half(x) = cat(-x[D/2:], x[:D/2])
        sign = tl.where(d < D // 2, -1.0, 1.0)
        inv_freq = tl.load(INV_FREQ + d % (D // 2))  # [1, D]
        cache = b * stride_kb + kvh * stride_kh
        # The query rows: (token t, head g of this kv head), t-major. A padded row (t >= valid)
        # attends as the last valid one does: its output is never used, but it stays finite.
        r = tl.arange(0, BLOCK_T * BLOCK_G)
        t, g = tile * BLOCK_T + r // BLOCK_G, r % BLOCK_G  # [M]
        last = tl.minimum(t, valid - 1)[:, None]  # [M, 1] the last prompt row each query row sees
        row_in = ((t < T) & (g < GROUP))[:, None]
        cos, sin = _rope_cos_sin(start + last, inv_freq, rope_scale, dt)  # [M, D]
        q_ptr = QKV + (b * T + t)[:, None] * stride_qkv + (kvh * GROUP + g)[:, None] * D  # [M, 1]
        q = _load_roped(q_ptr, d, d_rot, sign, cos, sin, row_in, dt)  # [M, D]
        # This tile's keys (with RoPE) and values into the cache at start + t, valid rows only.
        j = (tile * BLOCK_T + tl.arange(0, BLOCK_T))[:, None]  # [T_b, 1]
        new = j < valid
        cos_k, sin_k = _rope_cos_sin(start + j, inv_freq, rope_scale, dt)
        kv_row = QKV + (b * T + j) * stride_qkv
        # [T_b, D]
        k_new = _load_roped(kv_row + (HEADS + kvh) * D, d, d_rot, sign, cos_k, sin_k, new, dt)
        v_new = tl.load(kv_row + (HEADS + kv_heads + kvh) * D + d, mask=new, other=0.0)
        # the trash slot if the cache is full
        write = cache + tl.minimum(start + j, slots) * stride_kl + d
        tl.store(KC + write, k_new.to(dt), mask=new)
        tl.store(VC + write, v_new, mask=new)
        m, s_exp, acc = softmax_start(BLOCK_T * BLOCK_G, D)
        # Past the cache's end (a counter not reset, a prompt too long: no host check runs inside a
        # graph) nothing is read beyond its slots, and the prompt's rows without a slot are not
        # attended, as in the PyTorch form.
        before = tl.minimum(start, slots)
        for s0 in range(0, before, BLOCK_L):  # the slots before the prompt: from the cache
            slot = s0 + tl.arange(0, BLOCK_L)
            seen = slot < before
            offs = cache + slot[:, None] * stride_kl + d  # [L, D]
            k = tl.load(KC + offs, mask=seen[:, None], other=0.0).to(tl.float32)
            v = tl.load(VC + offs, mask=seen[:, None], other=0.0).to(tl.float32)
            m, s_exp, acc = attend(q, k, v, seen[None, :], seen, m, s_exp, acc, scale, True, dt)
        # The prompt's rows this tile sees, from q/k/v (not the cache), and only those the cache has
        # slots for.
        end = tl.minimum(tl.minimum((tile + 1) * BLOCK_T, valid), slots - start)
        # (names apart from the tile's above: a loop keeps each name's type)
        for r0 in range(0, end, BLOCK_L):
            row = r0 + tl.arange(0, BLOCK_L)  # [L] prompt rows, at slots start + row
            seen = row < end
            cos_l, sin_l = _rope_cos_sin(start + row[:, None], inv_freq, rope_scale, dt)
            kv_rows = QKV + (b * T + row)[:, None] * stride_qkv  # [L, 1]
            k = _load_roped(
                kv_rows + (HEADS + kvh) * D, d, d_rot, sign, cos_l, sin_l, seen[:, None], dt
            )  # [L, D]
            v = tl.load(
                kv_rows + (HEADS + kv_heads + kvh) * D + d, mask=seen[:, None], other=0.0
            ).to(tl.float32)
            keep = (row[None, :] <= last) & seen[None, :]  # [M, L] causal
            m, s_exp, acc = attend(q, k, v, keep, seen, m, s_exp, acc, scale, True, dt)
        out = OUT + (b * T + t)[:, None] * stride_out + (kvh * GROUP + g)[:, None] * D + d
        tl.store(out, (acc / s_exp[:, None]).to(dt), mask=row_in)


@torch.library.custom_op("kvlab::decode_attention", mutates_args=())
def decode_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, scale:
    float
) -> torch.Tensor:
    """softmax(q.k * scale, masked) . v for one query token -> ``[batch, 1, heads, head_dim]``.

    query [b, heads, 1, d]; key/value [b, kv_heads, L, d] (the cache, read in place); mask bool [b
    or 1, 1, 1, L] (True: attend, as transformers builds it) or None. A custom op: ``torch.compile``
    calls it as it is, and the graph kvlab captures launches its two kernels. Check
    ``common.available`` and ``supports`` first.
    """
    b, heads, _, d = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    group = heads // kv_heads
    block_g, iters, splits = _split_plan(group, length)
    partial_o, partial_m, partial_l = _partials(b * kv_heads * splits * block_g, d, query.device)
    # what transformers expects back
    out = torch.empty(b, 1, heads, d, dtype=query.dtype, device=query.device)
    has_mask = mask is not None
    # [b, L]; unused when there is none
    mask_arg = mask.expand(b, 1, 1, length)[:, 0, 0] if has_mask else partial_m
    _partial_kernel[(b * kv_heads, splits)](
        query, key, value, mask_arg, partial_o, partial_m, partial_l, query.stride(0),
        query.stride(1), key.stride(0), key.stride(1), key.stride(2), mask_arg.stride(0) if has_mask
        else 0, kv_heads, length, splits, scale, GROUP=group, BLOCK_G=block_g,
        BLOCK_L=common.BLOCK_L, ITERS=iters, D=d, HAS_MASK=has_mask, num_warps=ATTENTION_WARPS
    )
    _combine_kernel[(b * kv_heads,)](
        partial_o, partial_m, partial_l, out, out.stride(0), kv_heads, splits, GROUP=group,
        BLOCK_G=block_g, BLOCK_S=triton.next_power_of_2(splits), D=d, num_warps=ATTENTION_WARPS
    )
    return out


@decode_attention.register_fake
def _(query, key, value, mask, scale):
    b, heads, _, d = query.shape
    return query.new_empty(b, 1, heads, d)


def rope_cache_attention(
    qkv: torch.Tensor, inv_freq: torch.Tensor, rope_scale: float, keys: torch.Tensor, values:
    torch.Tensor, position: torch.Tensor, heads: int, scale: float, counters: torch.Tensor | None =
    None, dot: bool = False, fill_splits: bool = False
) -> torch.Tensor:
    """One decode token's attention, with RoPE and the cache write -> ``[batch, heads * head_dim]``.

    qkv ``[batch, (heads + 2 kv_heads) * d]`` (the projection's output); inv_freq ``[d / 2]`` and
    rope_scale: the model's rotary embedding (``inv_freq``, ``attention_scaling``); keys/values: a
    graph-safe layer's buffers ``[batch, kv_heads, slots + 1, d]`` (the last slot is the trash
    slot), written in place at ``position`` (the cache's counter, a 0-dim tensor); attends to the
    slots ``<= position``. ``counters``: int32 zeros ``[batch * kv_heads]``, the kernel's arrival
    counters (it leaves them at zero). ``dot``: scores and P.V as ``tl.dot`` over the group padded
    to ``common.DOT_ROWS`` rows (``common.attend``), in blocks of ``common.DOT_BLOCK_L`` slots (half
    that in float32). ``fill_splits``: each (row, kv head) split over at most ``common.fill_splits``
    programs, enough for one wave to fill the GPU, instead of ``common.MAX_SPLITS``: from as many
    pairs as multiprocessors, one program walks the whole cache and no shares are combined. Where
    ``common.available`` is False: the same math in PyTorch (the reference the kernel is tested
    against).
    """
    b, kv_heads, slots, d = keys.shape[0], keys.shape[1], keys.shape[2] - 1, keys.shape[3]
    if not common.available(qkv):
        return _reference(qkv, inv_freq, rope_scale, keys, values, position, None, heads, scale)
    _require_cache_layout(qkv, keys, values)
    group = heads // kv_heads
    block_l = common.DOT_BLOCK_L if dot else common.BLOCK_L
    # float32 (the token check's) in half the slots: a program walking several
    if dot and keys.element_size() == 4:
        # blocks of 128 (fill_splits) needs 172 KiB of shared memory, more than an sm_86/sm_89 GPU
        # has
        block_l //= 2
    most = common.fill_splits(b * kv_heads, keys.device) if fill_splits else None
    block_g, iters, splits = _split_plan(group, slots, block_l, most)
    block_g = max(block_g, common.DOT_ROWS) if dot else block_g
    out = torch.empty(b, heads * d, dtype=keys.dtype, device=keys.device)
    partial_o, partial_m, partial_l = _partials(b * kv_heads * splits * block_g, d, keys.device)
    if counters is None:
        counters = torch.zeros(b * kv_heads, dtype=torch.int32, device=keys.device)
    _rope_cache_attention_kernel[(b * kv_heads, splits)](
        qkv, inv_freq, keys, values, position, out, partial_o, partial_m, partial_l, counters,
        qkv.stride(0), keys.stride(0), keys.stride(1), keys.stride(2), out.stride(0), kv_heads,
        slots, scale, rope_scale, HEADS=heads, GROUP=group, BLOCK_G=block_g, D=d, BLOCK_L=block_l,
        ITERS=iters, SPLITS=splits, BLOCK_S=triton.next_power_of_2(splits),
        PDL=common.pdl(keys.device), DOT=dot, num_warps=ATTENTION_WARPS,
        **common.launch_options(keys.device)
    )
    return out


def _require_cache_layout(qkv: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
    """Refuse what the kernels would read wrongly: rows not contiguous, keys and values laid out
    differently."""
    common.require_dense_rows(qkv=qkv, keys=keys, values=values)
    if values.stride() != keys.stride():
        raise ValueError("keys and values must be laid out alike (the cache's buffers are)")


def _reference(
    qkv: torch.Tensor, inv_freq: torch.Tensor, rope_scale: float, keys: torch.Tensor, values:
    torch.Tensor, position: torch.Tensor, valid: torch.Tensor | None, heads: int, scale: float
) -> torch.Tensor:
    """Both kernels' math in PyTorch: qkv ``[batch * T, (heads + 2 kv_heads) * d]``, T rows per
    batch row at positions ``position + t``, of which the first ``valid`` count (None: all). Their
    keys (after RoPE) and values are written at their positions (the rest to the trash slot), and
    each row attends to the slots up to its position (a padded row: up to the last valid one) ->
    ``[batch * T, heads * d]``."""
    from transformers.models.llama.modeling_llama import rotate_half

    b, kv_heads, slots, d = keys.shape[0], keys.shape[1], keys.shape[2] - 1, keys.shape[3]
    t = torch.arange(qkv.shape[0] // b, device=qkv.device)  # [T]
    last = t if valid is None else torch.minimum(t, valid - 1)  # [T]
    # [T, d / 2], as transformers' rotary embedding
    freqs = (position + last).float()[:, None] * inv_freq
    angle = torch.cat((freqs, freqs), dim=-1)
    cos, sin = ((f(angle) * rope_scale).to(qkv.dtype) for f in (torch.cos, torch.sin))  # [T, d]
    # [b, h, T, d]
    q, k, v = qkv.view(b, len(t), -1, d).transpose(1, 2).split([heads, kv_heads, kv_heads], dim=1)
    q, k = (x * cos + rotate_half(x) * sin for x in (q, k))
    write = position + t
    if valid is not None:
        write = torch.where(t < valid, write, slots)
    write = write.clamp(max=slots)  # [T] slots, the trash slot for padded rows (and a full cache)
    keys.index_copy_(2, write, k)
    values.index_copy_(2, write, v)
    mask = torch.arange(slots, device=qkv.device) <= (position + last)[:, None]  # [T, slots]
    group = heads // kv_heads
    out = F.scaled_dot_product_attention(
        q, keys[:, :, :slots].repeat_interleave(group, 1), values[:, :,
        :slots].repeat_interleave(group, 1), attn_mask=mask, scale=scale
    )  # [b, heads, T, d]
    return out.transpose(1, 2).reshape(-1, heads * d)


def rope_cache_prefill_attention(
    qkv: torch.Tensor, inv_freq: torch.Tensor, rope_scale: float, keys: torch.Tensor, values:
    torch.Tensor, position: torch.Tensor, valid: torch.Tensor, heads: int, scale: float
) -> torch.Tensor:
    """A prompt's attention, with RoPE and the cache writes -> ``[batch * T, heads * head_dim]``.

    qkv ``[batch * T, (heads + 2 kv_heads) * d]``: the projection of a prompt padded to T tokens,
    row ``b * T + t`` at position ``position + t`` (``position``: the cache's counter, not advanced
    here); ``valid``: a 0-dim long tensor, how many of the T rows are the prompt's. Those rows' keys
    (after RoPE) and values are written into ``keys``/``values`` (a graph-safe layer's buffers
    ``[batch, kv_heads, slots + 1, d]``), and every row attends to the slots up to its own position
    (a padded row to the last valid one; its output is never used). Rows past the cache's end (a
    counter not reset before a replay) go to the trash slot and are not attended; nothing past it is
    read. Fewer query rows per program than ``PREFILL_TILE``'s where those would leave
    multiprocessors idle (``prefill_rows``). Where ``common.available`` is False: the same math in
    PyTorch.
    """
    b, kv_heads, slots, d = keys.shape[0], keys.shape[1], keys.shape[2] - 1, keys.shape[3]
    if not common.available(qkv):
        return _reference(qkv, inv_freq, rope_scale, keys, values, position, valid, heads, scale)
    _require_cache_layout(qkv, keys, values)
    group, t = heads // kv_heads, qkv.shape[0] // b
    block_g = triton.next_power_of_2(group)
    rows, block_l = PREFILL_TILE[keys.element_size()]
    rows = prefill_rows(b * kv_heads, t, block_g, rows, keys.device)
    block_t = max(1, rows // block_g)
    out = torch.empty(b * t, heads * d, dtype=keys.dtype, device=keys.device)
    _prefill_attention_kernel[(b * kv_heads, triton.cdiv(t, block_t))](
        qkv, inv_freq, keys, values, position, valid, out, qkv.stride(0), keys.stride(0),
        keys.stride(1), keys.stride(2), out.stride(0), kv_heads, slots, t, scale, rope_scale,
        HEADS=heads, GROUP=group, BLOCK_G=block_g, BLOCK_T=block_t, D=d, BLOCK_L=block_l,
        PDL=common.pdl(keys.device), num_warps=ATTENTION_WARPS, **common.launch_options(keys.device)
    )
    return out

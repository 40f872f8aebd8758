"""The decode step's matmuls as hand-written Triton GEMV kernels, with what comes before and after
them fused in.

A GEMV is ``x[rows, K] @ W[N, K]^T``: each program owns ``BLOCK_N`` outputs of one row and streams
their weight rows. What the kernel does to x first (the prologue) and to the result after:

- ``gemv(x, W, norm=w)``: RMSNorm fused into the matmul. Every program recomputes the row's mean
  square (K numbers, from L2): no norm kernel, no normed copy of x in memory.
- ``gemv(gate_up, W, silu_mul=True, residual=x)``: SiLU(gate) * up fused into the matmul, and the
  residual add.
- ``greedy_head(x, W, norm, eps, token, position)``: the final norm and LM head GEMV keep only each
  program's largest logit, and one small kernel picks the token and advances the cache's counter
  (the logits never reach memory).

Between operations the values are rounded to the model's dtype where transformers' Llama code rounds
them, so the tokens stay exact in float32 (checked against ``"naive"``). On Hopper and later every
kernel is launched with programmatic dependent launch (``common.pdl``).

GEMM dispatch: a GEMV streams the weight once per row, so with many rows a GEMM that reads it once
for all rows wins. Above ``GEMV_MAX_ROWS`` rows ``gemv`` and ``greedy_head`` run their PyTorch form
(``F.linear``: cuBLAS on a GPU, with the norm, SiLU and residual as kernels of their own), which is
also what they run where ``common.available`` is False (no CUDA outside Triton's interpreter, a GPU
older than Ampere such as a T4): the reference the kernels are tested against. With ``tiles=True``
(``kernel_path``) 2 rows or more run ``tile_kernel`` where the sweep measured it fastest
(``TILE_DISPATCH``): the same prologue and epilogue around a ``tl.dot`` over tiles of rows, so the
weights are read once per tile of rows instead of once per row.

A weight may come in parts stacked along its outputs (``gemv(x, (W_q, W_k, W_v))``): the kernels
read each part where it is, so an unfused model's q/k/v or gate/up run as one matmul without a
concatenated copy of their weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import common
from .common import tl, triton

# Above this many rows a GEMM (cuBLAS, via the PyTorch form) wins over the GEMV kernels
# (common.TUNING; data/README.md names the probe that set it). Read at each call: tests and the
# benchmark set it.
GEMV_MAX_ROWS = common.TUNING["gemv_max_rows"]
# (N, K) -> (BLOCK_N, BLOCK_K, warps), overrides
GEMV_CONFIGS: dict[tuple[int, int], tuple[int, int, int]] = {}
NO_NORM, RMS_NORM, SILU_MUL = 0, 1, 2  # the GEMV's prologue: what is done to x before the matmul


def gemv_config(n: int, k: int) -> tuple[int, int, int]:
    """(outputs per program, K per inner step, warps) for an ``[N, K]`` weight at batch 1: the
    sweep's fastest (``python tools/time_kernels.py --parts gemv``; ``common.TUNING``): few outputs
    per program and the whole K in one step for a projection, more outputs and short K steps for a
    vocabulary-sized LM head (``gemv_block_wide``). ``GEMV_CONFIGS`` overrides it per shape."""
    if (n, k) in GEMV_CONFIGS:
        return GEMV_CONFIGS[n, k]
    wide, block = common.TUNING["gemv_block_wide"], common.TUNING["gemv_block"]
    if n > wide["above_outputs"]:
        return wide["outputs"], wide["k"], wide["warps"]
    return block["outputs"], min(block["most_k"], triton.next_power_of_2(k)), block["warps"]


if triton is not None:
    from .common import wait_for_previous_kernel

    @triton.jit
    def _stacked_rows(W, W1, W2, n, first, N0, N01, K, PARTS: tl.constexpr, BY_BLOCK: tl.constexpr):
        """Pointers to rows ``n`` [N_b] of a weight ``[N, K]``: one matrix (``PARTS`` 1), or up to
        three stacked along N (rows ``[0, N0)`` in W, ``[N0, N01)`` in W1, the rest in W2), each
        read where it is. ``BY_BLOCK``: the block's outputs lie in one part, so its first output
        ``first`` picks the part for all; the compiler then still knows the rows 16-byte aligned and
        loads them as vectors (chosen per row, it does not)."""
        if PARTS == 1:
            return W + n * K
        if BY_BLOCK:  # one base pointer for the block (a scalar choice)
            base, lo = W, 0
            if first >= N0:
                base, lo = W1, N0
            if PARTS > 2 and first >= N01:
                base, lo = W2, N01
            return base + (n - lo) * K
        rows = tl.where(n < N0, W + n * K, W1 + (n - N0) * K)
        if PARTS > 2:
            rows = tl.where(n < N01, rows, W2 + (n - N01) * K)
        return rows

    @triton.jit
    def rms_normed(x, rstd, w_norm, dt: tl.constexpr):
        """weight * (x * rstd).to(dtype), as LlamaRMSNorm: float32 values rounded to dt where it
        rounds."""
        return ((x * rstd).to(dt).to(tl.float32) * w_norm).to(dt).to(tl.float32)

    @triton.jit
    def silu_times(gate, up, dt: tl.constexpr):
        """SiLU(gate) * up, as transformers' Llama MLP: float32 values rounded to dt where it
        rounds."""
        return ((gate / (1.0 + tl.exp(-gate))).to(dt).to(tl.float32) * up).to(dt).to(tl.float32)

    @triton.jit
    def _x_tile(x_row, NORM, k, K, rstd, inside, PROLOGUE: tl.constexpr, dt: tl.constexpr):
        """x[k] after the prologue, in float32, rounded to dt where transformers rounds. One row
        (``x_row`` a pointer, ``k`` [K_b], ``rstd`` a number) or a tile of rows (``x_row`` [M_b, 1],
        ``k`` [1, K_b], ``rstd`` [M_b, 1]); ``inside``: where the load is in bounds (k < K, and the
        row exists)."""
        if PROLOGUE == 2:  # x holds [gate | up]: SiLU(gate) * up
            gate = tl.load(x_row + k, mask=inside, other=0.0).to(tl.float32)
            up = tl.load(x_row + K + k, mask=inside, other=0.0).to(tl.float32)
            x = silu_times(gate, up, dt)
        else:
            x = tl.load(x_row + k, mask=inside, other=0.0).to(tl.float32)
            if PROLOGUE == 1:
                x = rms_normed(x, rstd, tl.load(NORM + k, mask=k < K, other=0.0).to(tl.float32), dt)
        return x

    @triton.jit
    def gemv_kernel(
        X, W, W1, W2, BIAS, BIAS1, BIAS2, NORM, RES, OUT, IDX, N, N0, N01, K, stride_x, stride_res,
        stride_out, eps, PROLOGUE: tl.constexpr, PARTS: tl.constexpr, BY_BLOCK: tl.constexpr,
        HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, ARGMAX: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr, PDL: tl.constexpr
    ):
        row, block = tl.program_id(0), tl.program_id(1)
        # the model's dtype: results are rounded to it where transformers rounds
        dt = W.dtype.element_ty
        n = block * BLOCK_N + tl.arange(0, BLOCK_N)  # [N_b] this program's outputs
        n_in = n < N
        kk = tl.arange(0, BLOCK_K)
        x_row = X + row * stride_x
        # [N_b, 1]
        w_rows = _stacked_rows(W, W1, W2, n, block * BLOCK_N, N0, N01, K, PARTS, BY_BLOCK)[:, None]
        # [N_b, K_b]
        w = tl.load(w_rows + kk[None, :], mask=n_in[:, None] & (kk < K)[None, :], other=0.0)
        # the weights do not depend on it: their first tile is already on its way
        wait_for_previous_kernel(PDL)
        rstd = 0.0
        if PROLOGUE == 1:  # RMSNorm needs the row's mean square before any normed value
            squares = tl.zeros([BLOCK_K], tl.float32)
            for start in range(0, K, BLOCK_K):
                x = tl.load(x_row + start + kk, mask=start + kk < K, other=0.0).to(tl.float32)
                squares += x * x
            rstd = 1.0 / tl.sqrt(tl.sum(squares, 0) / K + eps)
        acc = w.to(tl.float32) * _x_tile(x_row, NORM, kk, K, rstd, kk < K, PROLOGUE, dt)[None, :]
        for start in range(BLOCK_K, K, BLOCK_K):
            k = start + kk
            w = tl.load(w_rows + k[None, :], mask=n_in[:, None] & (k < K)[None, :], other=0.0)
            acc += w.to(tl.float32) * _x_tile(x_row, NORM, k, K, rstd, k < K, PROLOGUE, dt)[None, :]
        y = tl.sum(acc, 1)  # [N_b]
        if HAS_BIAS:
            y += tl.load(
                _stacked_rows(BIAS, BIAS1, BIAS2, n, block * BLOCK_N, N0, N01, 1, PARTS, BY_BLOCK),
                mask=n_in,
                other=0.0,
            ).to(tl.float32)
        if HAS_RES:  # residual + the layer's output, both in the model's dtype
            y = y.to(dt).to(tl.float32) + tl.load(
                RES + row * stride_res + n, mask=n_in, other=0.0
            ).to(tl.float32)
        # the LM head: only this program's largest logit (as the model's dtype) and where it is
        if ARGMAX:
            y = tl.where(n_in, y.to(dt).to(tl.float32), float("-inf"))
            best = tl.argmax(y, 0, tie_break_left=True)
            tl.store(OUT + row * stride_out + block, tl.max(y, 0))
            tl.store(IDX + row * stride_out + block, block * BLOCK_N + best)
        else:
            tl.store(OUT + row * stride_out + n, y.to(dt), mask=n_in)

    @triton.jit
    def _tile_epilogue(
        y, BIAS, BIAS1, BIAS2, N0, N01, RES, OUT, IDX, rows, r_in, n, n_in, block, stride_res,
        stride_out, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, ARGMAX: tl.constexpr, BLOCK_N:
        tl.constexpr, PARTS: tl.constexpr, BY_BLOCK: tl.constexpr, dt: tl.constexpr
    ):
        """``gemv_kernel``'s epilogue on a [rows, outputs] tile ``y`` (float32): bias, residual,
        then the store or the LM head's per-program maximum and where it is."""
        if HAS_BIAS:
            bias = tl.load(
                _stacked_rows(BIAS, BIAS1, BIAS2, n, block * BLOCK_N, N0, N01, 1, PARTS, BY_BLOCK),
                mask=n_in,
                other=0.0,
            )
            y += bias.to(tl.float32)[None, :]
        if HAS_RES:
            res = tl.load(
                RES + rows[:, None] * stride_res + n[None, :],
                mask=r_in[:, None] & n_in[None, :],
                other=0.0,
            )
            y = y.to(dt).to(tl.float32) + res.to(tl.float32)
        if ARGMAX:
            y = tl.where(n_in[None, :], y.to(dt).to(tl.float32), float("-inf"))
            best = tl.argmax(y, 1, tie_break_left=True)  # [M_b]
            tl.store(OUT + rows * stride_out + block, tl.max(y, 1), mask=r_in)
            tl.store(IDX + rows * stride_out + block, block * BLOCK_N + best, mask=r_in)
        else:
            tl.store(
                OUT + rows[:, None] * stride_out + n[None, :],
                y.to(dt),
                mask=r_in[:, None] & n_in[None, :],
            )

    @triton.jit
    def tile_kernel(
        X, W, W1, W2, BIAS, BIAS1, BIAS2, NORM, RES, OUT, IDX, PART, DONE, M, N, N0, N01, K,
        stride_x, stride_res, stride_out, eps, PROLOGUE: tl.constexpr, PARTS: tl.constexpr,
        BY_BLOCK: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, ARGMAX: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLITS: tl.constexpr,
        PDL: tl.constexpr
    ):
        """``gemv_kernel`` for a tile of ``BLOCK_M`` rows: each weight tile is read once for all of
        them and multiplied with ``tl.dot`` (tensor cores in bf16; float32 operands exactly,
        ``input_precision="ieee"``). The same prologue (``_x_tile``) and the same epilogue, on
        [rows, outputs] tiles. ``SPLITS`` > 1 (split-K): K is shared among ``SPLITS`` programs (grid
        axis 2), which publish their sums in PART; the last of them to arrive (an arrival counter in
        DONE, as the attention kernel's) adds them in split order and runs the epilogue, so the
        result does not depend on which program finishes first."""
        tile, block, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        dt = W.dtype.element_ty
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)  # [M_b] this program's rows
        r_in = rows < M
        n = block * BLOCK_N + tl.arange(0, BLOCK_N)  # [N_b] its outputs
        n_in = n < N
        k_len = tl.cdiv(K, SPLITS * BLOCK_K) * BLOCK_K  # K per split, whole steps
        k_start = split * k_len
        k_end = tl.minimum(k_start + k_len, K)
        kk = k_start + tl.arange(0, BLOCK_K)
        x_rows = X + rows[:, None] * stride_x  # [M_b, 1]
        # [N_b, 1]
        w_rows = _stacked_rows(W, W1, W2, n, block * BLOCK_N, N0, N01, K, PARTS, BY_BLOCK)[:, None]
        # [N_b, K_b]
        w = tl.load(w_rows + kk[None, :], mask=n_in[:, None] & (kk < k_end)[None, :], other=0.0)
        wait_for_previous_kernel(PDL)
        rstd = 0.0
        # the norm needs the whole row, whatever share of K this program multiplies
        if PROLOGUE == 1:
            squares = tl.zeros([BLOCK_M, BLOCK_K], tl.float32)
            for start in range(0, K, BLOCK_K):
                k = start + tl.arange(0, BLOCK_K)
                x = tl.load(
                    x_rows + k[None, :], mask=r_in[:, None] & (k < K)[None, :], other=0.0
                ).to(tl.float32)
                squares += x * x
            rstd = (1.0 / tl.sqrt(tl.sum(squares, 1) / K + eps))[:, None]  # [M_b, 1]
        x = _x_tile(
            x_rows, NORM, kk[None, :], K, rstd, r_in[:, None] & (kk < k_end)[None, :], PROLOGUE, dt
        )  # [M_b, K_b]
        acc = tl.dot(x.to(dt), tl.trans(w.to(dt)), input_precision="ieee")  # [M_b, N_b] float32
        for start in range(k_start + BLOCK_K, k_end, BLOCK_K):
            k = start + tl.arange(0, BLOCK_K)
            w = tl.load(w_rows + k[None, :], mask=n_in[:, None] & (k < k_end)[None, :], other=0.0)
            x = _x_tile(
                x_rows, NORM, k[None, :], K, rstd, r_in[:, None] & (k < k_end)[None, :], PROLOGUE,
                dt
            )
            acc += tl.dot(x.to(dt), tl.trans(w.to(dt)), input_precision="ieee")
        if SPLITS == 1:
            _tile_epilogue(
                acc, BIAS, BIAS1, BIAS2, N0, N01, RES, OUT, IDX, rows, r_in, n, n_in, block,
                stride_res, stride_out, HAS_BIAS, HAS_RES, ARGMAX, BLOCK_N, PARTS, BY_BLOCK, dt
            )
        # publish this share; the last program of the tile to arrive adds all shares and finishes
        else:
            cell = tile * tl.num_programs(1) + block
            # [M_b, N_b]
            tile_offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
            tl.store(PART + (cell * SPLITS + split) * BLOCK_M * BLOCK_N + tile_offs, acc)
            tl.debug_barrier()  # every thread's stores are issued before the release below
            arrived = tl.atomic_add(DONE + cell, 1, sem="acq_rel")
            if arrived == SPLITS - 1:
                y = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
                for s in range(SPLITS):
                    y += tl.load(
                        PART + (cell * SPLITS + s) * BLOCK_M * BLOCK_N + tile_offs,
                        cache_modifier=".cg",
                    )
                _tile_epilogue(
                    y, BIAS, BIAS1, BIAS2, N0, N01, RES, OUT, IDX, rows, r_in, n, n_in, block,
                    stride_res, stride_out, HAS_BIAS, HAS_RES, ARGMAX, BLOCK_N, PARTS, BY_BLOCK, dt
                )
                tl.store(DONE + cell, 0)  # ready for the next call

    @triton.jit
    def _argmax_kernel(VAL, IDX, TOKEN, POS, blocks, stride_val, stride_token,
                       BLOCK: tl.constexpr, ADVANCE: tl.constexpr, PDL: tl.constexpr):
        """The token: the index of the largest of the LM head's per-program maxima (the first, on
        ties); then program 0 advances the cache's counter (``ADVANCE``): the step's last write."""
        row = tl.program_id(0)
        i = tl.arange(0, BLOCK)
        wait_for_previous_kernel(PDL)
        val = tl.load(VAL + row * stride_val + i, mask=i < blocks, other=float("-inf"))
        # the first block holding the maximum has its first index
        best = tl.argmax(val, 0, tie_break_left=True)
        token = tl.load(IDX + row * stride_val + best)
        tl.store(TOKEN + row * stride_token, token.to(tl.int64))
        if ADVANCE and row == 0:
            tl.store(POS, tl.load(POS) + 1)


def uses_gemv_kernel(x: torch.Tensor) -> bool:
    """The GEMV kernels for ``x [rows, K]``: where they run and for at most ``GEMV_MAX_ROWS`` rows
    (read now)."""
    return x.shape[0] <= GEMV_MAX_ROWS and common.available(x)


# The tile path's dispatch per weight shape (N, K) and swept row count: the fastest of
# ``tile_kernel`` (a configuration: rows per program, outputs per program, K per step, warps[, K
# splits]), the GEMV kernel ("gemv") and the PyTorch form ("torch") in the sweep (common.TUNING;
# tests check it against the record). A batch takes the entry of the largest swept row count not
# above it (the smallest's below it).
TILE_DISPATCH: dict[tuple[int, int], dict[int, tuple[int, ...] | str]] = {
    tuple(int(size) for size in shape.split("x")): {
        int(rows): choice if isinstance(choice, str) else tuple(choice)
        for rows, choice in by_rows.items()
    }
    for shape, by_rows in common.TUNING["tile_dispatch"].items()
}


# The sweep chose its tiles in bfloat16. A float32 tile holds twice the bytes: a 64-row tile of the
# LM head would need more shared memory than an sm_86/sm_89 GPU (an RTX 30xx/40xx, an L4) gives one
# program (python tools/compile_kernels.py --capability 89). Fewer rows per tile change no sum: each
# output adds the same products in the same order.
_FLOAT32_TILE_ROWS = 16


def tile_choice(rows: int, n: int, k: int) -> tuple[int, ...] | str:
    """What the tile path runs for ``rows`` rows of an ``[N, K]`` weight: ``TILE_DISPATCH``'s entry
    (a ``tile_kernel`` configuration (rows per program, outputs per program, K per step, warps[, K
    splits]), ``"gemv"`` or ``"torch"``) or, for a shape not in it, ``tile_config``."""
    swept = TILE_DISPATCH.get((n, k))
    if swept is None:
        return tile_config(rows, n, k)
    return swept[max([r for r in swept if r <= rows], default=min(swept))]


def _dispatch(
    x: torch.Tensor, tiles: bool, weight_shape: tuple[int, int] | None
) -> tuple[str, tuple | None]:
    """(``kernel_path``'s answer, the ``tile_kernel`` configuration where it is ``"tile"``, else
    None)."""
    if tiles and x.shape[0] >= 2 and common.available(x):
        # no shape: an unswept one, tile_config's
        choice = tile_choice(x.shape[0], *(weight_shape or (0, 0)))
        if choice == "torch":
            return "torch", None
        # float32 (the token check's) in tiles of at most _FLOAT32_TILE_ROWS rows
        if choice != "gemv":
            return "tile", choice if x.element_size() < 4 else (
                min(choice[0], _FLOAT32_TILE_ROWS),
                *choice[1:],
            )
    return ("gemv" if uses_gemv_kernel(x) else "torch"), None


def kernel_path(
    x: torch.Tensor, tiles: bool = False, weight_shape: tuple[int, int] | None = None
) -> str:
    """Which form ``gemv`` and ``greedy_head`` run for ``x [rows, K]``: ``"tile"`` (``tile_kernel``:
    with ``tiles``, 2 rows or more, where ``tile_choice`` for ``weight_shape`` picks a
    configuration), ``"gemv"`` (``uses_gemv_kernel``) or ``"torch"`` (the PyTorch form; also where
    ``tile_choice`` picks it)."""
    return _dispatch(x, tiles, weight_shape)[0]


def tile_config(rows: int, n: int, k: int) -> tuple[int, int, int, int]:
    """(rows per program, outputs per program, K per step, warps) of ``tile_kernel`` for a shape the
    sweep did not cover: the rows padded to a ``tl.dot`` tile (16) and up to 64, 64 outputs and 64
    of K per step."""
    return min(64, max(16, triton.next_power_of_2(rows))), 64, 64, 4


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm's arithmetic: float32 statistics, rounded back to x's dtype before the
    weight."""
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


# a weight [N, K] (or bias [N]), or up to 3 parts stacked along N
Stacked = torch.Tensor | tuple[torch.Tensor, ...]


def parts(weight: Stacked | None) -> tuple[torch.Tensor, ...] | None:
    """A stacked weight's parts (a tuple of one for one tensor)."""
    return weight if weight is None or isinstance(weight, tuple) else (weight,)


def _stacked_shape(weight: Stacked) -> tuple[int, int]:
    """``[N, K]`` of a weight, its parts' outputs added up."""
    chunks = parts(weight)
    return sum(w.shape[0] for w in chunks), chunks[0].shape[1]


def gemv(
    x: torch.Tensor, weight: Stacked, *, bias: Stacked | None = None, norm: torch.Tensor | None =
    None, eps: float = 1e-6, silu_mul: bool = False, residual: torch.Tensor | None = None, tiles:
    bool = False, counters: torch.Tensor | None = None
) -> torch.Tensor:
    """``prologue(x) @ weight.T (+ bias) (+ residual)`` -> ``[rows, N]``.

    x ``[rows, K]`` (``[rows, 2K]`` = [gate | up] with ``silu_mul``); weight ``[N, K]``, or a tuple
    of up to three parts ``[N_i, K]`` stacked along N (``bias`` then in the same parts), read where
    they are; ``norm``: an RMSNorm weight ``[K]`` applied to x first; ``residual [rows, N]`` added
    last. ``tiles``: 2 rows or more run ``tile_kernel`` (``kernel_path``). ``counters``: int32 zeros
    that a tile launch split along K counts its programs' arrivals in
    (``kvlab.kernels.step.arrival_counters``; the kernel leaves them at zero); None, or fewer than
    the launch needs: zeros made for the call, a memset in a captured graph. Otherwise more than
    ``GEMV_MAX_ROWS`` rows, or no kernels here: the PyTorch form (``F.linear``).
    """
    path, tile = _dispatch(x, tiles, _stacked_shape(weight))
    if path == "torch":
        if norm is not None:
            x = rms_norm(x, norm, eps)
        if silu_mul:
            gate, up = x.chunk(2, dim=-1)
            x = F.silu(gate) * up
        if isinstance(weight, tuple):  # each part's outputs, side by side
            biases = bias or (None,) * len(weight)
            y = torch.cat([F.linear(x, w, b) for w, b in zip(weight, biases, strict=True)], dim=-1)
        else:
            y = F.linear(x, weight, bias)
        return y if residual is None else residual + y
    out = torch.empty(
        x.shape[0], _stacked_shape(weight)[0], dtype=parts(weight)[0].dtype, device=x.device
    )
    _launch_gemv(x, weight, bias, norm, eps, silu_mul, residual, out, None, tile, counters)
    return out


def _output_blocks(weight: Stacked, tile: tuple | None) -> int:
    """Programs along the outputs of a launch over ``weight [N, K]``: ``tile``'s or
    ``gemv_config``'s block."""
    n, k = _stacked_shape(weight)
    return triton.cdiv(n, tile[1] if tile is not None else gemv_config(n, k)[0])


def _launch_gemv(x, weight, bias, norm, eps, silu_mul, residual, out, index, tile=None,
                 counters=None) -> None:
    """Launch ``gemv_kernel``, or ``tile_kernel`` with ``tile`` (a ``tile_choice`` configuration);
    with ``index``, the argmax form (per-program maxima into out/index, ``_output_blocks`` of them
    per row)."""
    common.require_dense_rows(x=x, residual=residual)
    weights, biases = parts(weight), parts(bias)
    if len(weights) > 3 or any(
        not w.is_contiguous() or w.shape[1:] != weights[0].shape[1:] for w in weights
    ):
        raise ValueError(
            "weight must be contiguous ([N, K], rows of K), or at most 3 such parts of one K: pass "
            "weight.contiguous()"
        )
    if biases is not None and [b.shape[0] for b in biases] != [w.shape[0] for w in weights]:
        raise ValueError("bias must come in the weight's parts, one [N_i] per part [N_i, K]")
    rows, (n, k) = x.shape[0], _stacked_shape(weight)
    blocks = _output_blocks(weight, tile)
    # N0, N01: where parts 1 and 2 start
    ends = [sum(w.shape[0] for w in weights[: i + 1]) for i in range(2)]
    w3 = (*weights, *weights[-1:] * (3 - len(weights)))  # unused parts: any tensor
    b3 = (*biases, *biases[-1:] * (3 - len(biases))) if biases is not None else w3
    args = (x, *w3, *b3, norm if norm is not None else weights[0],
            residual if residual is not None else out, out, index if index is not None else out)
    strides = (x.stride(0), residual.stride(0) if residual is not None else 0, out.stride(0), eps)
    block_n = tile[1] if tile is not None else gemv_config(n, k)[0]
    # no block straddles two parts
    by_block = all(end % block_n == 0 for end in ends[: len(weights) - 1])
    flags = dict(
        PROLOGUE=SILU_MUL if silu_mul else RMS_NORM if norm is not None else NO_NORM,
        PARTS=len(weights), BY_BLOCK=by_block, HAS_BIAS=bias is not None, HAS_RES=residual is not
        None, ARGMAX=index is not None, PDL=common.pdl(x.device), **common.launch_options(x.device)
    )
    if tile is None:
        block_n, block_k, warps = gemv_config(n, k)
        gemv_kernel[(rows, blocks)](
            *args, n, *ends, k, *strides, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps, **flags
        )
    else:
        # a fifth number: K split among that many programs
        block_m, block_n, block_k, warps, *split = tile
        splits, tiles = (split[0] if split else 1), triton.cdiv(rows, block_m)
        part = counters_used = out  # unused unless split
        # each program's float32 sums, and one arrival counter per (tile of rows, block of outputs)
        if splits > 1:
            part = torch.empty(
                tiles * blocks * splits * block_m * block_n, dtype=torch.float32, device=x.device
            )
            cells = tiles * blocks
            counters_used = (
                counters
                if counters is not None and counters.numel() >= cells
                else torch.zeros(cells, dtype=torch.int32, device=x.device)
            )
        tile_kernel[(tiles, blocks, splits)](
            *args, part, counters_used, rows, n, *ends, k, *strides, BLOCK_M=block_m,
            BLOCK_N=block_n, BLOCK_K=block_k, SPLITS=splits, num_warps=warps, **flags
        )


def greedy_head(
    x: torch.Tensor, weight: torch.Tensor, norm: torch.Tensor, eps: float, token: torch.Tensor,
    position: torch.Tensor | None = None, tiles: bool = False
) -> torch.Tensor:
    """The LM head and greedy choice: ``argmax(rms_norm(x) @ weight.T)`` written into ``token [rows,
    1]`` (in place; the kernels never store the logits), and ``position += 1`` when given (the
    cache's counter, the step's last write). x ``[rows, hidden]``, weight ``[vocab, hidden]``, norm
    ``[hidden]``. ``tiles``: as ``gemv``'s. Otherwise more than ``GEMV_MAX_ROWS`` rows, or no
    kernels here: the PyTorch form (``F.linear`` and ``argmax``)."""
    path, tile = _dispatch(x, tiles, weight.shape)
    if path == "torch":
        token.copy_(F.linear(rms_norm(x, norm, eps), weight).argmax(dim=-1, keepdim=True))
        if position is not None:
            position.add_(1)
        return token
    rows = x.shape[0]
    blocks = _output_blocks(weight, tile)
    # [rows, blocks] per-program maxima
    maxima = torch.empty(rows, blocks, dtype=torch.float32, device=x.device)
    # [rows, blocks] and their indices
    where = torch.empty(rows, blocks, dtype=torch.int32, device=x.device)
    _launch_gemv(x, weight, None, norm, eps, False, None, maxima, where, tile)
    _argmax_kernel[(rows,)](
        maxima, where, token, position if position is not None else token, blocks, maxima.stride(0),
        token.stride(0), BLOCK=triton.next_power_of_2(blocks), ADVANCE=position is not None,
        PDL=common.pdl(x.device), **common.launch_options(x.device)
    )
    return token

"""The MLP of a decoder layer as one Triton kernel: RMSNorm, gate/up, SiLU(gate) * up, down and the
residual.

``kvlab.kernels.step`` runs the MLP as two GEMVs (``gemv(x, W_gate_up, norm=w)`` then
``gemv(gate_up, W_down, silu_mul=True, residual=x)``): two kernels, and the gate/up result goes
through memory between them. At batch 1 a kernel of the step costs about its launch in the PDL
chain, so ``fused_mlp`` does it in one:

- program ``p`` owns ``BLOCK_I`` of the intermediate size: it multiplies the normed row by those
  rows of W_gate and W_up, applies SiLU(gate) * up, and multiplies the result by the matching
  ``BLOCK_I`` columns of W_down: a float32 share ``[hidden]`` of the output (split-K over the
  intermediate size);
- the shares are added in two levels, each by the last program to arrive (an arrival counter, as in
  ``gemv.tile_kernel``'s split-K): the last of each ``GROUP`` programs adds its group's shares in
  order, the last group adds the groups' sums in order and the residual. The order of the sums is
  fixed, whichever program finishes first.

The values are rounded to the model's dtype where transformers' Llama MLP rounds them (the gate/up
outputs, SiLU, the product, the output), with the two GEMVs' own helpers (``gemv.rms_normed``,
``gemv.silu_times``), so the tokens stay exact in float32. ``BLOCK_I``, ``GROUP`` and the warps are
not swept yet (``python tools/time_kernels.py --parts mlp`` times them against the two GEMVs).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import common
from .common import tl, triton

# intermediate rows per program: 16 bfloat16 columns of W_down, one 32-byte sector per row
MLP_BLOCK_I = 16
MLP_GROUP = 8  # programs per first-level sum
MLP_WARPS = 8


def counters_per_row(intermediate: int) -> int:
    """Arrival counters ``fused_mlp`` needs per row: one per group of programs and one for the
    groups (read at each call: ``MLP_BLOCK_I`` and ``MLP_GROUP`` may be set, as
    ``tools/time_kernels.py`` does)."""
    return -(-intermediate // (MLP_BLOCK_I * MLP_GROUP)) + 1


if triton is not None:
    from .common import wait_for_previous_kernel
    from .gemv import rms_normed, silu_times

    @triton.jit
    def _add_shares(PART, first, count, h, h_in, BLOCK_H: tl.constexpr):
        """The sum, in order, of ``count`` float32 shares ``[H_b]`` from row ``first`` of PART, read
        through L2 (other programs of this kernel wrote them)."""
        total = tl.zeros([BLOCK_H], tl.float32)
        for s in range(count):
            total += tl.load(
                PART + (first + s) * BLOCK_H + h, mask=h_in, other=0.0, cache_modifier=".cg"
            )
        return total

    @triton.jit
    def mlp_kernel(
        X, WG, WU, WD, NORM, RES, OUT, PART, GPART, DONE, INTER, H, stride_x, stride_res,
        stride_out, eps, BLOCK_I: tl.constexpr, BLOCK_H: tl.constexpr, GROUP: tl.constexpr, PDL:
        tl.constexpr
    ):
        row, p = tl.program_id(0), tl.program_id(1)
        programs = tl.num_programs(1)
        groups = tl.cdiv(programs, GROUP)
        dt = WG.dtype.element_ty
        i = p * BLOCK_I + tl.arange(0, BLOCK_I)  # [I_b] this program's intermediate rows
        h = tl.arange(0, BLOCK_H)  # [H_b] the hidden size
        i_in, h_in = i < INTER, h < H
        inside = i_in[:, None] & h_in[None, :]
        w_gate = tl.load(WG + i[:, None] * H + h[None, :], mask=inside, other=0.0)  # [I_b, H_b]
        w_up = tl.load(WU + i[:, None] * H + h[None, :], mask=inside, other=0.0)
        # the weights do not depend on it: they are already on their way
        wait_for_previous_kernel(PDL)
        x = tl.load(X + row * stride_x + h, mask=h_in, other=0.0).to(tl.float32)  # [H_b]
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, 0) / H + eps)
        w_norm = tl.load(NORM + h, mask=h_in, other=0.0).to(tl.float32)
        x = rms_normed(x, rstd, w_norm, dt)
        gate = tl.sum(w_gate.to(tl.float32) * x[None, :], 1).to(dt).to(tl.float32)  # [I_b]
        up = tl.sum(w_up.to(tl.float32) * x[None, :], 1).to(dt).to(tl.float32)
        act = silu_times(gate, up, dt)  # [I_b]
        w_down = tl.load(
            WD + h[:, None] * INTER + i[None, :], mask=h_in[:, None] & i_in[None, :], other=0.0
        )  # [H_b, I_b]
        # [H_b] this program's share of the output
        share = tl.sum(w_down.to(tl.float32) * act[None, :], 1)
        tl.store(PART + (row * programs + p) * BLOCK_H + h, share)
        tl.debug_barrier()  # every thread's stores are issued before the release below
        group = p // GROUP
        first = group * GROUP
        count = tl.minimum(GROUP, programs - first)  # the last group may be smaller
        counters = DONE + row * (groups + 1)  # [groups] then one for the groups
        # the last of its group: add the group
        if tl.atomic_add(counters + group, 1, sem="acq_rel") == count - 1:
            total = _add_shares(PART, row * programs + first, count, h, h_in, BLOCK_H)
            tl.store(GPART + (row * groups + group) * BLOCK_H + h, total)
            tl.store(counters + group, 0)  # ready for the next call
            tl.debug_barrier()
            # the last group: add them all
            if tl.atomic_add(counters + groups, 1, sem="acq_rel") == groups - 1:
                y = _add_shares(GPART, row * groups, groups, h, h_in, BLOCK_H)
                y = y.to(dt).to(tl.float32) + tl.load(
                    RES + row * stride_res + h, mask=h_in, other=0.0
                ).to(tl.float32)
                tl.store(OUT + row * stride_out + h, y.to(dt), mask=h_in)
                tl.store(counters + groups, 0)


def mlp_reference(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor,
                  norm: torch.Tensor, eps: float, residual: torch.Tensor) -> torch.Tensor:
    """``fused_mlp``'s math in PyTorch, as transformers' Llama layer computes it."""
    from .gemv import rms_norm

    x = rms_norm(x, norm, eps)
    return residual + F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)


def fused_mlp(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor, norm:
    torch.Tensor, eps: float, residual: torch.Tensor, counters: torch.Tensor | None = None
) -> torch.Tensor:
    """``residual + down(SiLU(gate(n)) * up(n))`` with ``n = rms_norm(x)`` -> ``[rows, hidden]``, in
    one kernel.

    x, residual ``[rows, hidden]``; w_gate, w_up ``[intermediate, hidden]`` (views of a fused
    ``gate_up_proj``'s halves will do); w_down ``[hidden, intermediate]``; norm ``[hidden]``.
    ``counters``: int32 zeros, at least ``rows * counters_per_row(intermediate)``
    (``kvlab.kernels.step.arrival_counters``'), which the kernel leaves at zero; None: zeros made
    for the call. Each row reads the weights again: for the few rows of a GEMV. Where
    ``common.available`` is False: ``mlp_reference``.
    """
    if not common.available(x):
        return mlp_reference(x, w_gate, w_up, w_down, norm, eps, residual)
    common.require_dense_rows(x=x, residual=residual)
    (inter, hidden), rows = w_gate.shape, x.shape[0]
    if not all(w.is_contiguous() for w in (w_gate, w_up, w_down)) or w_up.shape != w_gate.shape or \
            w_down.shape != (hidden, inter):
        raise ValueError(
            "fused_mlp needs contiguous w_gate and w_up [intermediate, hidden] and w_down "
            f"[hidden, intermediate]; got {tuple(w_gate.shape)}, {tuple(w_up.shape)}, "
            f"{tuple(w_down.shape)}"
        )
    programs = triton.cdiv(inter, MLP_BLOCK_I)
    groups = triton.cdiv(programs, MLP_GROUP)
    block_h = triton.next_power_of_2(hidden)
    need = rows * counters_per_row(inter)
    if counters is None or counters.numel() < need:
        counters = torch.zeros(need, dtype=torch.int32, device=x.device)
    # each program's share
    part = torch.empty(rows * programs * block_h, dtype=torch.float32, device=x.device)
    # each group's sum
    group_part = torch.empty(rows * groups * block_h, dtype=torch.float32, device=x.device)
    out = torch.empty(rows, hidden, dtype=w_gate.dtype, device=x.device)
    mlp_kernel[(rows, programs)](
        x, w_gate, w_up, w_down, norm, residual, out, part, group_part, counters, inter, hidden,
        x.stride(0), residual.stride(0), out.stride(0), eps, BLOCK_I=MLP_BLOCK_I, BLOCK_H=block_h,
        GROUP=MLP_GROUP, PDL=common.pdl(x.device), num_warps=MLP_WARPS,
        **common.launch_options(x.device)
    )
    return out

"""What kvlab's Triton kernels share: where they run, how they are launched, and their
``@triton.jit`` helpers.

- ``available(x)``: whether the kernels run on ``x``'s device; every public function of
  ``kvlab.kernels`` asks it (through this module, so one monkeypatch of ``common.available`` forces
  the PyTorch form everywhere) and runs the same math in PyTorch where it is False.
- ``pdl(device)``, ``launch_options(device)``: programmatic dependent launch, where the GPU has it.
- ``BLOCK_L``, ``MAX_SPLITS``: the split-K layout of both attention kernels
  (``kvlab.kernels.attention``); ``DOT_ROWS``, ``DOT_BLOCK_L``: the query rows and cache slots of a
  ``tl.dot`` tile, for attention as matrix products.
- The jit helpers: ``wait_for_previous_kernel`` (PDL), the online softmax (``softmax_start``,
  ``attend``), and the split partial results (``store_partial``, ``combine_splits``), written once
  for both attention kernels.

Split-K attention: the cache slots of one (batch row, kv head) are shared among ``splits`` programs,
each taking ``ITERS`` blocks of ``BLOCK_L`` slots. Each keeps, for the ``group`` query heads of its
kv head, a running max ``m`` of the scores, a running sum ``s_exp`` of ``exp(score - m)`` and the
``exp``-weighted sum of values ``acc`` (online softmax), all in float32; the shares are then
rescaled to one common max and divided: ``out = sum_s exp(m_s - M) acc_s / sum_s exp(m_s - M)
s_exp_s``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from ..runtime import PDL, TRITON_KERNELS, gpu_supports

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU wheel of torch comes without Triton
    triton = tl = None

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"  # Triton reads it once, at import
# The sizes a sweep chose (the tile dispatch, blocks, splits, warps): one table, read once here; its
# provenance, entry by entry, is in data/README.md ("Kernel tuning").
TUNING = json.loads((Path(__file__).parent / "tuning.json").read_text())
BLOCK_L = 32  # cache slots per inner step of a broadcast attention program
# Attention programs per (batch row, kv head), at most: the sweep's fastest; a longer cache gives
# each program several blocks (ITERS). One value for both attention kernels keeps their partial
# results alike.
MAX_SPLITS = TUNING["attention_max_splits"]
# Query rows of one ``tl.dot`` tile (its least M on NVIDIA GPUs): with ``dot=True`` the GQA group of
# a kv head is padded up to it, as vLLM's and SGLang's Triton decode attention pad theirs, and
# scores and P.V run as matrix products (tensor cores in bf16/fp16) instead of broadcast
# multiply-and-sum.
DOT_ROWS = 16
# Cache slots per inner step of the tl.dot attention: the block the sweep measured fastest
# (python tools/time_kernels.py --parts dot-attention).
DOT_BLOCK_L = TUNING["dot_attention_block_slots"]
# this Triton can wait (PDL)
HAS_GDC = hasattr(getattr(getattr(tl, "extra", None), "cuda", None), "gdc_wait")


def available(x: torch.Tensor) -> bool:
    """Whether kvlab's Triton kernels run on ``x``'s device: a CUDA GPU of compute capability 8.0 or
    newer with Triton (``runtime.TRITON_KERNELS``; not a T4, 7.5), or Triton's CPU interpreter
    (``TRITON_INTERPRET=1``, for tests; not while kvlab's CPU graph emulation records aten ops: it
    cannot see a Triton launch)."""
    if triton is None:
        return False
    if x.device.type == "cuda":
        return gpu_supports(x.device, TRITON_KERNELS)
    return INTERPRET and (torch.compiler.is_compiling() or not _get_current_dispatch_mode_stack())


def pdl(device: torch.device) -> bool:
    """Programmatic dependent launch (Hopper and later): a kernel is launched while the previous one
    still runs, loads what does not depend on it (weights, the cache), and waits (``gdc_wait``)
    before it reads the previous output. Only on compute capability 9.0 and newer (``runtime.PDL``;
    the capability is asked once per GPU)."""
    return not INTERPRET and HAS_GDC and gpu_supports(device, PDL)


def multiprocessors(device: torch.device) -> int:
    """The programs one wave of a launch needs to give every unit of ``device`` one: its
    multiprocessors (132 on an H100 or H200); where the kernels run interpreted on a CPU, its cores
    stand in for them."""
    count = (
        torch.cuda.get_device_properties(device).multi_processor_count
        if device.type == "cuda"
        else os.cpu_count()
    )
    return count or 1


def fill_splits(pairs: int, device: torch.device) -> int:
    """The most programs per (batch row, kv head) that one wave of an attention launch needs to give
    every multiprocessor one (``fill_splits=True`` of ``attention.rope_cache_attention``): one from
    as many pairs as multiprocessors (132 on an H200, so from batch 44 of SmolLM2's 3 kv heads),
    more for fewer pairs."""
    return max(1, -(-multiprocessors(device) // pairs))


def launch_options(device: torch.device) -> dict:
    """Keyword arguments of a kernel launch on ``device``: ``launch_pdl`` where ``pdl(device)``."""
    return {"launch_pdl": True} if pdl(device) else {}


def require_dense_rows(**tensors: torch.Tensor | None) -> None:
    """The kernels index rows with one stride and elements with none: refuse other layouts instead
    of reading wrong."""
    for name, t in tensors.items():
        if t is not None and t.stride(-1) != 1:
            raise ValueError(
                f"{name} must have contiguous rows (stride 1 in its last dimension), got strides "
                f"{tuple(t.stride())}: pass {name}.contiguous()"
            )


if triton is not None:

    @triton.jit
    def wait_for_previous_kernel(PDL: tl.constexpr):
        """Wait until the previous kernel has finished and its writes are visible; only then may the
        next kernel start its own loads. Read nothing a kernel before this one wrote until after
        this call."""
        if PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()

    @triton.jit
    def softmax_start(BLOCK_G: tl.constexpr, D: tl.constexpr):
        """The empty online softmax of ``BLOCK_G`` query heads: (max m, sum s_exp, weighted values
        acc)."""
        m = tl.full([BLOCK_G], float("-inf"), tl.float32)  # [G] running max of the scores
        s_exp = tl.zeros([BLOCK_G], tl.float32)  # [G] running sum of exp(score - m)
        acc = tl.zeros([BLOCK_G, D], tl.float32)  # [G, D] running sum of exp(score - m) * value
        return m, s_exp, acc

    @triton.jit
    def attend(q, k, v, keep, seen, m, s_exp, acc, scale, DOT: tl.constexpr, dt: tl.constexpr):
        """One block of slots into the online softmax: q [G, D], k and v [L, D] in float32, keep [1
        or G, L] (which slots each query row sees: one mask for all rows in a decode, a causal one
        in a prefill), seen [L] (False: no row sees the slot, whatever k and v hold there) -> the
        updated (m [G], s_exp [G], acc [G, D]).

        ``DOT``: scores and P.V as ``tl.dot`` of operands in ``dt`` (the cache's dtype; G >=
        ``DOT_ROWS``), summed in float32; float32 operands multiply exactly
        (``input_precision="ieee"``, no TF32), so the float32 token check still holds. Otherwise as
        broadcasts, all in float32."""
        if DOT:
            score = tl.dot(q.to(dt), tl.trans(k.to(dt)), input_precision="ieee") * scale  # [G, L]
        else:
            score = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale  # [G, L]
        score = tl.where(keep, score, float("-inf"))
        m_new = tl.maximum(m, tl.max(score, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no slot seen yet: exp(-inf - 0) = 0
        p = tl.exp(score - m_safe[:, None])  # [G, L]
        alpha = tl.exp(m - m_safe)  # rescales what was summed under the old max
        s_exp = s_exp * alpha + tl.sum(p, axis=1)
        # a masked slot may hold anything (even inf): weigh it 0, exactly
        v = tl.where(seen[:, None], v, 0.0)
        if DOT:  # p rounded to dt, as flash attention does
            # [G, D]
            acc = acc * alpha[:, None] + tl.dot(p.to(dt), v.to(dt), input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)  # [G, D]
        return m_new, s_exp, acc

    @triton.jit
    def store_partial(
        PO, PM, PL, bh, split, splits, m, s_exp, acc, BLOCK_G: tl.constexpr, D: tl.constexpr
    ):
        """Publish share ``split`` of (batch row, kv head) ``bh``: rows ``(bh * splits + split) *
        BLOCK_G + g`` of PM, PL ``[rows]`` and PO ``[rows, D]`` (float32)."""
        g, d = tl.arange(0, BLOCK_G), tl.arange(0, D)
        part = (bh * splits + split) * BLOCK_G + g  # [G]
        tl.store(PM + part, m)
        tl.store(PL + part, s_exp)
        tl.store(PO + part[:, None] * D + d[None, :], acc)

    @triton.jit
    def combine_splits(
        PO, PM, PL, bh, splits, BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr, D: tl.constexpr
    ):
        """The attention output ``[G, D]`` (float32) of ``bh`` from its ``splits`` published shares:
        each rescaled to the common max; a share that saw no slot weighs 0. Reads through L2
        (``.cg``): the shares may have been written by other programs of the same kernel."""
        s, g, d = tl.arange(0, BLOCK_S), tl.arange(0, BLOCK_G), tl.arange(0, D)
        rows = (bh * splits + s[:, None]) * BLOCK_G + g[None, :]  # [S, G]
        used = (s < splits)[:, None]
        m = tl.load(PM + rows, mask=used, other=float("-inf"), cache_modifier=".cg")
        s_exp = tl.load(PL + rows, mask=used, other=0.0, cache_modifier=".cg")
        top = tl.max(m, axis=0)  # [G] the common max
        w = tl.exp(m - tl.where(top == float("-inf"), 0.0, top)[None, :])  # [S, G]
        o = tl.load(PO + rows[:, :, None] * D + d[None, None, :], mask=used[:, :, None], other=0.0,
                    cache_modifier=".cg")  # [S, G, D]
        return tl.sum(w[:, :, None] * o, axis=0) / tl.sum(w * s_exp, axis=0)[:, None]  # [G, D]

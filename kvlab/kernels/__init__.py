"""kvlab's hand-written Triton kernels, each with a PyTorch form of the same math where they cannot
run.

- ``common``: where the kernels run (``available``), programmatic dependent launch (``pdl``,
  ``launch_options``), the split-K layout (``BLOCK_L``, ``MAX_SPLITS``) and the shared
  ``@triton.jit`` helpers: waiting for the previous kernel, the online-softmax step and the combine
  of split-K shares.
- ``attention``: one query token's split-K attention over the cache: ``decode_attention`` (a custom
  op, the attention of ``graph-safe-compiled`` through ``kvlab.fusion``) and
  ``rope_cache_attention`` (RoPE, the cache write and attention in one kernel, for ``step``).
- ``gemv``: ``gemv`` (a matmul of a few rows with RMSNorm or SiLU*up before it and the residual
  after), ``greedy_head`` (LM head and argmax), ``rms_norm``; above ``GEMV_MAX_ROWS`` rows, cuBLAS
  through ``F.linear``.
- ``step``: ``kernel_step(model, cache, token, counters)``, the whole decode step from these
  kernels, with ``check_supported`` and ``arrival_counters``; ``kernel_prefill`` and
  ``kernel_verify`` (speculation's k + 1 rows) through the same kernels.
- ``decoder``: ``kernels_decoder`` binds the step's state (``functools.partial``) and hands it to a
  ``GraphSafeDecoder``; ``speculative_kernels_decoder`` hands it to lesson 07's
  ``SpeculativeDecoder``.

Nothing here is imported by ``import kvlab``: a kernels strategy imports this package when it runs.
"""

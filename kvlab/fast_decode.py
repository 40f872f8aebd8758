"""The compiled graph-safe decode (``"graph-safe-compiled"``): the graph-safe cache, fewer kernels, several steps per
replay. (The fastest path, ``kvlab.kernel_step``, reuses its ``MultiStepDecoder`` with hand-written kernels.)

Built on ``kvlab.graph_safe.GraphSafeDecoder`` (the cache with one shared counter, argmax inside the step,
no host sync per token). What this module adds, each measured by ``python -m kvlab.bench``:

- the model runs as ``kvlab.fusion.fused_copy(model)``: one q/k/v matmul, one gate/up matmul, linear layers
  as fused reductions, and attention as ``kvlab.decode_kernel``'s split-K Triton kernel, which reads the cache
  in place, instead of a flash-attention kernel built for many query rows (fewer, shorter kernels; on GPUs older
  than Ampere, e.g. a T4, attention stays SDPA);
- the step is compiled without cudagraphs (``compile_mode``, e.g. ``"max-autotune-no-cudagraphs"``) and
  captured by kvlab, ``steps`` decode steps in ONE graph: one replay makes ``steps`` tokens, so the host
  launches one graph per ``steps`` tokens and the GPU never waits between them;
- ``max_cache_len`` exactly what the run needs (rounded up to 16), so attention reads no slot it cannot use.

Tokens stay exact: every step is the same computation as ``"graph-safe"``; checked against ``"naive"``.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from .decoding import OnToken
from .fusion import fused_copy
from .graph_safe import GraphSafeDecoder
from .memo import per_model
from .runtime import PDL, gpu_supports


def inductor_options(tune: bool = True, device: torch.device | str = "cuda"):
    """Inductor settings for the fast step (gpt-fast's): coordinate-descent tuning of each kernel's block sizes,
    and programmatic dependent launch (a kernel starts while the previous one drains) where ``device`` has it
    (compute capability 9.0, Hopper, and newer: ``runtime.PDL``) and this torch offers it."""
    if not tune:
        return nullcontext()
    config = torch._inductor.config
    options = {"coordinate_descent_tuning": True}
    if hasattr(config.triton, "enable_pdl") and gpu_supports(device, PDL):
        options["triton.enable_pdl"] = True
    return config.patch(options)


class MultiStepDecoder(GraphSafeDecoder):
    """A GraphSafeDecoder whose graph holds ``steps`` decode steps and writes their tokens into a static buffer."""

    def __init__(self, model, max_cache_len: int, batch: int = 1, *, steps: int = 16, graph: bool = True,
                 compile_mode: str | None = None):
        if not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps must be a positive int (decode steps per captured graph), got {steps!r}")
        super().__init__(model, max_cache_len, batch, graph=graph, compile_mode=compile_mode)
        self.steps = steps
        self.chunks: dict[int, object] = {}  # number of steps -> captured graph (at most two: steps and the rest)

    def _chunk(self, n: int):
        """A function of the static token that runs ``n`` steps and returns their tokens ``[batch, n]``."""
        out = torch.zeros(self.batch, n, dtype=torch.long, device=self.device)  # static output of the graph

        def run(token: torch.Tensor) -> torch.Tensor:
            for k in range(n):
                self._run_step(token)  # writes the next token into `token`, advances the cache's one counter
                out[:, k : k + 1].copy_(token)
            return out

        return run

    def _next_tokens(self, n: int) -> torch.Tensor:
        """The next ``n`` tokens ``[batch, n]``: one replay of the n-step graph (captured on first use)."""
        if not self.use_graph:
            return self._chunk(n)(self.token)
        if n not in self.chunks:
            self.chunks[n] = self._capture(self._chunk(n), self.token)
        return self.chunks[n].replay()

    def describe(self) -> str:
        graphs = ", ".join(f"{n} steps" for n in sorted(self.chunks)) or "none yet"
        return f"MultiStepDecoder(batch={self.batch}, max_cache_len={self.max_cache_len}, compile_mode={self.compile_mode!r}, graphs: {graphs})"


def decode_graph_safe_fast(model, input_ids: torch.Tensor, max_new_tokens: int, *, on_token: OnToken = None,
                           compile_mode: str | None = "max-autotune-no-cudagraphs", steps: int = 16, fuse: bool = True,
                           gemv: bool = True, attention: bool | str = "triton", max_cache_len: int | None = None,
                           graph: bool | None = None, tune: bool = True) -> torch.Tensor:
    """The ``"graph-safe-fast"`` strategy: fused model copy, compiled step, ``steps`` steps per captured graph.

    On CPU the step is neither compiled nor captured unless asked (``compile_mode`` needs CUDA for capture;
    the emulated graph is no faster than eager there). The decoder is kept per model and settings, so later
    calls (a new prompt, the timed runs of the benchmark) replay the graphs captured by the first.
    """
    cuda = input_ids.device.type == "cuda"
    use_graph = cuda if graph is None else graph
    if not cuda:
        compile_mode = None  # CPU: an inductor compile takes minutes on 2 cores, and a compiled step cannot be captured
    fast = fused_copy(model, fuse=fuse, attention=attention if fuse else False, gemv=gemv)
    need = input_ids.shape[1] + max_new_tokens
    length = max_cache_len or 16 * -(-need // 16)
    key = (input_ids.shape[0], length, compile_mode, steps, use_graph, next(model.parameters()).dtype)
    decoder = per_model(fast, "graph-safe-compiled", key, lambda: MultiStepDecoder(
        fast, length, input_ids.shape[0], steps=steps, graph=use_graph, compile_mode=compile_mode), keep=lambda d: not d.stale())
    with inductor_options(tune, input_ids.device) if compile_mode else nullcontext():
        return decoder.generate(input_ids, max_new_tokens, on_token=on_token)

"""A StaticCache that a captured decode graph can replay forever: the three graph-safe overrides, and a decoder.

``GraphSafeStaticCache`` subclasses ``transformers.StaticCache`` (5.24) and changes three things, each fixing
one failure of lesson 04:

1. ``update()`` writes only the valid window. Of a padded input of bucket length T, only the first
   ``valid_length`` tokens enter the cache (the padded rows are routed to one extra "trash" slot at index
   ``max_cache_len`` that attention never reads), and the counter advances by the valid count, not by T.
   The valid count is a device tensor, so one graph captured at bucket T serves every length up to T.
2. ``reset()`` is in place: no buffer is reallocated or rebound, the counter is set with an in-place write
   to 0, so the causal mask (built from the counter) hides every stale slot.
3. ``cache_position`` is one live counter: all layers share ONE 0-dim tensor as ``cumulative_length``; the
   property looks it up on each access (``lazy_initialization`` would rebind a cached reference), and the
   model's RoPE positions, its causal mask, every layer's write and the decode loop all read it. Write
   positions are computed once per forward (first layer) and the counter advances once (last layer).

``GraphSafeDecoder`` prefills, captures the decode step once (``kvlab.graphs.capture``: a real CUDA graph on a
GPU, an emulation elsewhere) and replays it for any number of prompts; ``decode_graph_safe`` is the
``"graph-safe"`` strategy of ``kvlab.decode``.
"""

from __future__ import annotations

import types
import weakref
from collections import Counter
from contextlib import contextmanager

import torch
from transformers import StaticCache
from transformers.cache_utils import StaticLayer, get_layer_types_and_kwargs

from .decoding import OnToken, check_inputs, greedy
from .graphs import capture
from .memo import per_model, weights_state
from .runtime import check_dtype


class GraphSafeError(RuntimeError):
    """A graph-safe cache or decoder refused an operation that would corrupt its tensors; the message says what to do."""


def capturing() -> bool:
    """True while a step is being captured or traced (CUDA stream capture, make_fx, torch.compile):
    no host synchronization is allowed then, so host-side checks are skipped (they run before capture)."""
    from torch.fx.experimental.proxy_tensor import get_proxy_mode
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    if torch.compiler.is_compiling() or get_proxy_mode() is not None or _get_current_dispatch_mode_stack():
        return True
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class GraphSafeLayer(StaticLayer):
    """A StaticLayer with one extra trash slot and the cache's shared counter as ``cumulative_length``.

    ``keys``/``values``: ``[batch, kv_heads, max_cache_len + 1, head_dim]``; slot ``max_cache_len`` is the trash
    slot (padded rows land there); ``update`` of the cache returns the visible ``[..., :max_cache_len, :]`` view.
    """

    def __init__(self, max_cache_len: int, owner: GraphSafeStaticCache):
        super().__init__(max_cache_len=max_cache_len)
        self._owner = weakref.ref(owner)
        self.cumulative_length = owner._counter  # one tensor for all layers (override 3)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        owner = self._owner()
        if owner.frozen:
            raise GraphSafeError(
                "this cache is bound to a captured graph: allocating its buffers again would leave the graph writing "
                "into the old ones. Use cache.reset() (in place) for a new prompt, or build a new GraphSafeDecoder."
            )
        if capturing():
            raise GraphSafeError(
                "the cache is not initialized yet and a step is being captured: its buffers would be allocated inside "
                "the graph. Run one eager forward first (the prefill) or call cache.early_initialization(...)."
            )
        self.device = key_states.device
        self.batch_size, self.num_heads = key_states.shape[:2]
        self.k_head_dim, self.v_head_dim = key_states.shape[-1], value_states.shape[-1]
        slots = self.max_cache_len + 1  # + the trash slot
        with torch.inference_mode(False):  # ordinary tensors: reset() and replays work in and out of inference mode
            # [batch, kv_heads, max_cache_len + 1, head_dim]
            self.keys = torch.zeros((self.batch_size, self.num_heads, slots, self.k_head_dim), dtype=key_states.dtype, device=self.device)
            self.values = torch.zeros((self.batch_size, self.num_heads, slots, self.v_head_dim), dtype=value_states.dtype, device=self.device)
        owner._counter_on(self.device)  # moves the ONE counter (once) and rebinds every layer to it
        torch._dynamo.mark_static_address(self.keys)
        torch._dynamo.mark_static_address(self.values)
        self.is_initialized = True

    def offload(self):
        raise GraphSafeError("a graph-safe cache cannot be offloaded: a captured graph reads its buffers by address")

    def check_input(self, key_states: torch.Tensor) -> None:
        """Refuse, before any write, what index_copy_ would reject cryptically or a graph would read wrongly."""
        want = (self.batch_size, self.num_heads, self.k_head_dim)
        got = (key_states.shape[0], key_states.shape[1], key_states.shape[-1])
        if got != want or key_states.dtype != self.keys.dtype or key_states.device != self.keys.device:
            raise GraphSafeError(
                f"the cache was built for batch {want[0]}, {want[1]} kv heads, head_dim {want[2]}, {self.keys.dtype} on "
                f"{self.keys.device}, but got batch {got[0]}, {got[1]} kv heads, head_dim {got[2]}, {key_states.dtype} on "
                f"{key_states.device}. Build a new cache (or GraphSafeDecoder) for this batch size / dtype / device."
            )


class GraphSafeStaticCache(StaticCache):
    """``transformers.StaticCache`` with the three graph-safe overrides (see the module docstring).

    Only full-attention layers are supported (Llama, Qwen2/3, Mistral without sliding window, Gemma, Phi3, ...).
    Batch size > 1 works when all rows have the same length (one counter per cache, as in StaticLayer).
    """

    def __init__(self, config, max_cache_len: int, **kwargs):
        if not isinstance(max_cache_len, int) or max_cache_len < 1:
            raise ValueError(f"max_cache_len must be a positive int, got {max_cache_len!r}")
        layer_types, _ = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
        others = sorted(set(layer_types) - {"full_attention"})
        if others:
            raise ValueError(
                f"GraphSafeStaticCache supports full-attention layers only; this config also has {others}. "
                "Use a model without sliding-window/linear layers (e.g. Mistral with sliding_window=None)."
            )
        with torch.inference_mode(False):
            self._counter = torch.tensor(0, dtype=torch.long)  # THE position counter (override 3)
        self.valid_length: torch.Tensor | None = None  # device tensor while a padded input runs (override 1)
        self._positions: torch.Tensor | None = None  # write positions of the current forward
        self.frozen = False  # True once a graph captured this cache's buffers
        self.check_room = True  # eager forwards refuse to overflow (GraphSafeDecoder checks once per generate instead)
        layers = [GraphSafeLayer(max_cache_len, self) for _ in layer_types]
        super(StaticCache, self).__init__(layers=layers, **kwargs)  # Cache.__init__: skip StaticCache's layer dispatch
        self.max_cache_len = max_cache_len

    # ---- override 3: one live counter --------------------------------------------------------------
    @property
    def cache_position(self) -> torch.Tensor:
        """The number of tokens in the cache = the position of the next token: a 0-dim device tensor.

        Looked up on each access (never cached: ``lazy_initialization`` moves the counter to the device once,
        which rebinds it), and the same tensor object every layer holds as ``cumulative_length``.
        """
        counter = self.layers[0].cumulative_length
        if any(layer.cumulative_length is not counter for layer in self.layers):
            raise GraphSafeError(
                "the layers no longer share one counter: some layer's cumulative_length was rebound to a new tensor "
                "(a captured graph keeps the old one). Never assign cumulative_length; use cache.reset() or set_position()."
            )
        return counter

    def _counter_on(self, device: torch.device) -> None:
        if self._counter.device != device:
            with torch.inference_mode(False):
                self._counter = self._counter.to(device)
            torch._dynamo.mark_static_address(self._counter)
        for layer in self.layers:
            layer.cumulative_length = self._counter

    def set_position(self, position: int | torch.Tensor) -> None:
        """Put the counter at ``position`` with an in-place write (the tensor a graph captured stays the same)."""
        if isinstance(position, bool) or not isinstance(position, int | torch.Tensor):
            raise TypeError(f"position must be an int or a 0-dim integer tensor, got {type(position).__name__}")
        if isinstance(position, torch.Tensor):
            if position.numel() != 1 or position.dtype.is_floating_point or position.dtype == torch.bool:
                raise ValueError(f"position must be a 0-dim integer tensor, got {position.dtype} of shape {tuple(position.shape)}")
            if not capturing():  # eager: one host read; inside a capture the tensor is refilled before each replay
                self.set_position(int(position))  # checks the range
                return
            self.cache_position.copy_(position)
        else:
            if not 0 <= position <= self.max_cache_len:
                raise ValueError(f"position must be in [0, {self.max_cache_len}] (max_cache_len), got {position}")
            self.cache_position.fill_(position)

    # ---- override 1: write only the valid window ---------------------------------------------------
    @contextmanager
    def valid_window(self, valid_length: torch.Tensor):
        """Context manager: inside it, of each input of length T only the first ``valid_length`` tokens count.

        ``valid_length`` is a 0-dim long device tensor; refill it in place (``.fill_(n)``) between replays.
        """
        self.valid_length = valid_length
        try:
            yield self
        finally:
            self.valid_length = None

    def _write_positions(self, length: int, device: torch.device) -> torch.Tensor:
        """Slots for ``length`` incoming tokens: counter + i for valid rows, the trash slot for the rest. [length]"""
        counter = self.cache_position
        rows = torch.arange(length, device=device)  # [T]
        positions = counter + rows  # [T]
        keep = positions < self.max_cache_len  # never index past the buffer, even if the host check was bypassed
        if self.valid_length is not None:
            keep = keep & (rows < self.valid_length)
        return torch.where(keep, positions, self.max_cache_len)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Write the valid tokens of ``key_states``/``value_states`` ``[batch, kv_heads, T, head_dim]`` and return
        the visible buffers ``[batch, kv_heads, max_cache_len, head_dim]``."""
        layer = self.layers[layer_idx]
        if not layer.is_initialized:
            layer.lazy_initialization(key_states, value_states)
        layer.check_input(key_states)
        length = key_states.shape[-2]
        if layer_idx == 0:
            if self.check_room and not capturing():
                self._check_room(length)
            self._positions = self._write_positions(length, key_states.device)  # once per forward
        elif self._positions is None or self._positions.shape[0] != length:
            raise GraphSafeError("layer updates must come in order 0, 1, ... within one forward (layer 0 computes the write positions)")
        layer.keys.index_copy_(2, self._positions, key_states)
        layer.values.index_copy_(2, self._positions, value_states)
        if layer_idx == len(self.layers) - 1:
            self.cache_position.add_(length if self.valid_length is None else self.valid_length)  # once per forward
            self._positions = None
        return layer.keys[:, :, : self.max_cache_len], layer.values[:, :, : self.max_cache_len]

    def _check_room(self, length: int) -> None:
        """Eager only (it reads the counter on the host): refuse a write past max_cache_len before it happens."""
        valid = length if self.valid_length is None else int(self.valid_length)
        used = int(self.cache_position)
        if used + valid > self.max_cache_len:
            raise GraphSafeError(
                f"the cache holds {used} of {self.max_cache_len} tokens and {valid} more do not fit: build the cache "
                f"(or GraphSafeDecoder) with a larger max_cache_len, or decode fewer tokens."
            )

    # ---- override 2: reset in place ----------------------------------------------------------------
    def reset(self) -> None:
        """Empty the cache in place: zero the buffers, set the one counter to 0 (no tensor is reallocated)."""
        for layer in self.layers:
            if layer.is_initialized:
                layer.keys.zero_()
                layer.values.zero_()
        self.cache_position.zero_()
        self._positions = None

    # ---- what a captured graph depends on ----------------------------------------------------------
    def fingerprint(self) -> tuple:
        """The addresses a captured graph reads: every buffer and the counter."""
        return tuple(layer.cumulative_length.data_ptr() for layer in self.layers) + tuple(
            t.data_ptr() if t is not None else None for layer in self.layers for t in (layer.keys, layer.values)
        )

    def early_initialization(self, *args, **kwargs):
        if self.frozen:
            raise GraphSafeError("this cache is bound to a captured graph: its buffers cannot be allocated again")
        return super().early_initialization(*args, **kwargs)


class GraphSafeDecoder:
    """Prefill eagerly, capture the decode step once, replay it for any number of prompts (same cache, same graph).

    ``graph=False`` runs the same step eagerly (the baseline for timings). ``compile_mode`` (e.g.
    ``"max-autotune-no-cudagraphs"``) compiles the step with ``torch.compile`` before it is captured (CUDA only).
    ``prefill_bucket=T`` also captures the prefill, padded to T tokens: every prompt of length <= T replays the
    same prefill graph, with the valid length in a device tensor (override 1). ``emulate=True`` forces the
    CPU-style emulation of capture also on a GPU (to compare it with the real graph).
    """

    def __init__(self, model, max_cache_len: int, batch: int = 1, *, graph: bool = True, compile_mode: str | None = None,
                 prefill_bucket: int | None = None, warmup: int = 3, emulate: bool | None = None):
        param = next(model.parameters())
        if not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be a positive int, got {batch!r}")
        if compile_mode is not None and graph and (param.device.type != "cuda" or emulate):
            raise ValueError(
                f"compile_mode={compile_mode!r} with graph capture needs CUDA (the CPU emulation traces eager ops and "
                "cannot trace a compiled function). On CPU, pass graph=False to run the compiled step eagerly."
            )
        if compile_mode is not None:
            check_dtype(param.device, param.dtype)  # bf16 on a GPU without it (a T4): say to use float16
        if prefill_bucket is not None and not 1 <= prefill_bucket <= max_cache_len:
            raise ValueError(f"prefill_bucket must be in [1, max_cache_len={max_cache_len}], got {prefill_bucket}")
        self.model, self.batch, self.use_graph, self.warmup, self.emulate = model, batch, graph, warmup, emulate
        self.dtype, self.device = param.dtype, param.device
        self.compile_mode, self.prefill_bucket = compile_mode, prefill_bucket
        self.cache = GraphSafeStaticCache(config=model.config, max_cache_len=max_cache_len)
        self.cache.check_room = False  # generate() checks room once on the host: no sync per eager step
        self.token = torch.zeros(batch, 1, dtype=torch.long, device=self.device)  # static input AND output of a step
        self.step_graph = None
        self.prefill_graph = None
        if compile_mode is None:
            self._run_step = self._step
        else:  # compile the step without its inference_mode decorator (dynamo cannot enter it); callers are in inference mode
            raw = getattr(self._step, "__wrapped__", None)
            target = types.MethodType(raw, self) if raw is not None else self._step
            self._run_step = torch.compile(target, mode=compile_mode, fullgraph=True)
        if prefill_bucket is not None:
            self.prompt = torch.zeros(batch, prefill_bucket, dtype=torch.long, device=self.device)  # [batch, bucket]
            self.valid = torch.zeros((), dtype=torch.long, device=self.device)  # valid prompt length, on the device
        self._fingerprint = None  # the cache's addresses at capture
        self._weights = None  # the model's parameter and buffer addresses at capture

    @property
    def max_cache_len(self) -> int:
        return self.cache.max_cache_len

    # ---- the two steps (no host sync inside: both are captured) ------------------------------------
    @torch.inference_mode()
    def _step(self, token: torch.Tensor) -> torch.Tensor:
        """One decode step: reads ``token`` [batch, 1], writes the next token into it, in place."""
        logits = self.model(input_ids=token, cache=self.cache, use_cache=True).logits  # [batch, 1, vocab]
        token.copy_(logits[:, -1, :].argmax(dim=-1, keepdim=True))
        return token

    @torch.inference_mode()
    def _padded_prefill(self, prompt: torch.Tensor) -> torch.Tensor:
        """Prefill of a prompt padded to the bucket; only ``self.valid`` tokens count. Writes the first new token."""
        bucket, slots = prompt.shape[1], self.max_cache_len
        queries = self.cache.cache_position + torch.arange(bucket, device=prompt.device)  # [bucket] positions
        allowed = torch.arange(slots, device=prompt.device)[None, :] <= queries[:, None]  # [bucket, slots] causal
        mask = allowed[None, None].expand(prompt.shape[0], 1, bucket, slots)  # 4-D: the model uses it as given
        if self.model.config._attn_implementation != "sdpa":
            mask = torch.zeros((), dtype=self.dtype, device=prompt.device).masked_fill(~mask, torch.finfo(self.dtype).min)
        with self.cache.valid_window(self.valid):
            logits = self.model(input_ids=prompt, cache=self.cache, attention_mask=mask, use_cache=True).logits
        last = (self.valid - 1).reshape(1)  # the last VALID row, not the last padded one
        self.token.copy_(logits.index_select(1, last)[:, 0, :].argmax(dim=-1, keepdim=True))
        return self.token

    # ---- host-side checks, all before any tensor is written ----------------------------------------
    def _check(self, input_ids: torch.Tensor, max_new_tokens: int) -> None:
        check_inputs(self.model, input_ids, max_new_tokens)
        batch, prompt_len = input_ids.shape
        if batch != self.batch:
            raise GraphSafeError(f"this decoder was built (and its graph captured) for batch {self.batch}, got batch {batch}: build another GraphSafeDecoder")
        dtype = next(self.model.parameters()).dtype
        if dtype != self.dtype:
            raise GraphSafeError(f"the model is now {dtype} but the decoder was built for {self.dtype}: its graph and cache hold {self.dtype} tensors. Build a new GraphSafeDecoder.")
        need = prompt_len + max_new_tokens - 1  # the last new token is never written
        if need > self.max_cache_len:
            raise GraphSafeError(
                f"prompt ({prompt_len}) + max_new_tokens ({max_new_tokens}) - 1 = {need} tokens do not fit in "
                f"max_cache_len={self.max_cache_len}: build the decoder with max_cache_len >= {need}"
            )
        if self.prefill_bucket is not None and prompt_len > self.prefill_bucket:
            raise GraphSafeError(f"the prompt ({prompt_len} tokens) is longer than prefill_bucket={self.prefill_bucket}")
        if self._fingerprint is not None and self.cache.fingerprint() != self._fingerprint:
            raise GraphSafeError(
                "the cache's buffers were reallocated or rebound since the graph was captured: replay would write into "
                "the old buffers. Never rebind cache tensors; use cache.reset(). Build a new GraphSafeDecoder."
            )
        if self._weights is not None and weights_state(self.model) != self._weights:
            raise GraphSafeError(
                "the model's weights were replaced since the graph was captured (model.to(...), .half(), new "
                "parameters assigned): a replay would read the old tensors. Build a new GraphSafeDecoder "
                "(kvlab.decode builds one by itself)."
            )

    def stale(self) -> bool:
        """True when the captured graphs no longer read what they should: the cache or the weights were replaced."""
        return self._fingerprint is not None and (
            self.cache.fingerprint() != self._fingerprint or weights_state(self.model) != self._weights)

    def _capture(self, fn, static: torch.Tensor):
        """Capture ``fn(static)`` and undo the warm-up calls' side effects in place: counter, token, slots they wrote."""
        if not self.cache.is_initialized:
            raise GraphSafeError("capture before the cache is initialized: run a prefill (or cache.early_initialization) first")
        position, token = self.cache.cache_position.clone(), self.token.clone()
        checks, self.cache.check_room = self.cache.check_room, False  # warm-ups may run past the end: to the trash slot
        try:
            graph = capture(fn, static, warmup=self.warmup, emulate=self.emulate)
        finally:
            self.cache.check_room = checks
            self.cache.set_position(position)  # warm-ups advanced the counter: put it back, in place
            self.token.copy_(token)
            start = int(position)
            end = self.max_cache_len  # the trash slot keeps its garbage: nothing reads it
            for layer in self.cache.layers:  # and erase what they wrote past it (the mask hid it; now it is gone)
                layer.keys[:, :, start:end].zero_()
                layer.values[:, :, start:end].zero_()
        self.cache.frozen = True
        self._fingerprint, self._weights = self.cache.fingerprint(), weights_state(self.model)
        return graph

    # ---- generation --------------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Reset the cache (in place) and prefill ``input_ids``; returns the first new token ``[batch, 1]``."""
        self.cache.reset()
        if self.prefill_bucket is None:
            logits = self.model(input_ids=input_ids, cache=self.cache, use_cache=True, logits_to_keep=1).logits
            self.token.copy_(greedy(logits))
            return self.token
        self.prompt.zero_()
        self.prompt[:, : input_ids.shape[1]].copy_(input_ids)  # padded to the bucket, in place
        self.valid.fill_(input_ids.shape[1])
        if not self.use_graph:
            return self._padded_prefill(self.prompt)
        if self.prefill_graph is None:
            if not self.cache.is_initialized:
                self._padded_prefill(self.prompt)  # eager, allocates the buffers
                self.cache.reset()
            self.prefill_graph = self._capture(self._padded_prefill, self.prompt)
        self.prefill_graph.replay()
        return self.token

    steps = 1  # decode steps per replay of the step graph (kvlab.fast_decode.MultiStepDecoder: more)

    def _next_tokens(self, n: int) -> torch.Tensor:
        """The next ``n`` tokens ``[batch, n]``; here n is 1: one replay (the first call captures the step)."""
        if self.use_graph and self.step_graph is None:
            self.step_graph = self._capture(self._run_step, self.token)
        return self._replay_step()

    @torch.inference_mode()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, *, on_token: OnToken = None) -> torch.Tensor:
        """Greedy-decode ``max_new_tokens`` after ``input_ids`` [batch, prompt_len]; returns ``[batch, max_new_tokens]``."""
        self._check(input_ids, max_new_tokens)
        out = torch.empty(self.batch, max_new_tokens, dtype=torch.long, device=self.device)
        out[:, :1].copy_(self.prefill(input_ids))
        done = 1
        if on_token is not None:
            on_token(0, out[:, :1])
        while done < max_new_tokens:
            n = min(self.steps, max_new_tokens - done)
            out[:, done : done + n].copy_(self._next_tokens(n))  # replay: n new tokens, no host sync
            if on_token is not None:
                for k in range(done, done + n):
                    on_token(k, out[:, k : k + 1])
            done += n
        return out

    @torch.inference_mode()
    def step(self) -> torch.Tensor:
        """One decode step by hand, after ``prefill``: returns ``self.token`` [batch, 1].

        It reads the counter on the host first (one sync; ``generate`` checks once for all its steps instead) and
        refuses a step past ``max_cache_len``: its key and value would go to the trash slot and the token be garbage.
        """
        used = int(self.cache.cache_position)
        if used + 1 > self.cache.max_cache_len:
            raise GraphSafeError(
                f"the cache is full ({used} of {self.cache.max_cache_len} tokens): another step would decode garbage. "
                "prefill a prompt again, or build the decoder with a larger max_cache_len."
            )
        return self._replay_step()

    @torch.inference_mode()
    def _replay_step(self) -> torch.Tensor:
        if self.step_graph is not None:
            self.step_graph.replay()  # reads self.token and the cache by address, writes the next token
        else:
            self._run_step(self.token)
        return self.token

    def describe(self) -> str:
        graphs = [g.describe() for g in (self.prefill_graph, self.step_graph) if g is not None]
        how = "; ".join(graphs) if graphs else ("not captured yet" if self.use_graph else "eager (no graph)")
        compiled = f", step compiled with mode={self.compile_mode!r}" if self.compile_mode else ""
        return f"GraphSafeDecoder(batch={self.batch}, max_cache_len={self.max_cache_len}{compiled}): {how}"


# aten ops that only make a new view of existing memory: no kernel runs for them
VIEW_OPS = {"view", "_unsafe_view", "slice", "select", "t", "transpose", "unsqueeze", "squeeze", "expand", "alias",
            "permute", "reshape", "getitem", "detach"}


def step_op_counts(model, cache, token: torch.Tensor) -> Counter:
    """The operations one decode step of ``model`` over ``cache`` runs, traced with make_fx: ``{op name: count}``,
    views left out (they launch no kernel). The trace runs the step once; the cache's state is restored after it."""
    from torch.fx.experimental.proxy_tensor import make_fx

    state = [t for layer in cache.layers for t in (layer.keys, layer.values, layer.cumulative_length)]
    saved = [t.clone() for t in state]
    with torch.inference_mode():
        traced = make_fx(lambda ids: model(input_ids=ids, cache=cache).logits, tracing_mode="real")(token)
        for t, old in zip(state, saved, strict=True):
            t.copy_(old)
    names = (getattr(n.target, "__name__", str(n.target)).split(".")[0] for n in traced.graph.nodes if n.op == "call_function")
    return Counter(name for name in names if name not in VIEW_OPS)


LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchCooperativeKernel")


def cuda_launches(fn, device) -> dict:
    """Profile one call of ``fn`` on CUDA: kernel launches the host made, graph launches, kernels the GPU ran,
    and the GPU's busy time (sum of kernel times, ms)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize(device)
    events = prof.events()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    return {
        "kernel_launch_calls": sum(e.name in LAUNCH_CALLS for e in events),
        "graph_launch_calls": sum(e.name == "cudaGraphLaunch" for e in events),
        "kernels_run": len(kernels),
        "gpu_busy_ms": sum(e.device_time_total for e in kernels) / 1e3,
    }


def eager_vs_replay(model, input_ids: torch.Tensor, *, steps: int = 32, rounds: int = 5) -> dict:
    """The same graph-safe decode step run eagerly and replayed from its captured graph, timed in turns.

    Returns per-token medians (ms), the ratio, capture seconds, cache and peak memory, and the work per
    step: on CUDA the kernel launches (profiler), elsewhere the aten operations of the traced step.
    """
    from .measure import cache_bytes, peak_memory_bytes, reset_peak_memory, time_interleaved
    from .runtime import environment

    device = input_ids.device
    length = input_ids.shape[1] + steps + 8
    eager = GraphSafeDecoder(model, length, input_ids.shape[0], graph=False)
    replay = GraphSafeDecoder(model, length, input_ids.shape[0])
    cuda = device.type == "cuda"
    for decoder in (eager, replay):
        decoder.generate(input_ids, 2)  # prefill + (replay) capture; both caches now hold prompt + 1 token
    start = int(replay.cache.cache_position)

    def run(decoder, one_step):
        def fn():
            for _ in range(steps):
                one_step()
            decoder.cache.set_position(start)  # in place: the next round decodes the same positions
        return fn

    fns = {"eager": run(eager, eager._replay_step), "replay": run(replay, replay._replay_step)}
    seconds = time_interleaved(fns, rounds=rounds, device=device)
    peaks = {}
    for name, fn in fns.items():
        reset_peak_memory(device)
        fn()
        peaks[name] = peak_memory_bytes(device)
    if cuda:
        work = {"eager": cuda_launches(eager._replay_step, device), "replay": cuda_launches(replay._replay_step, device)}
        replay.cache.set_position(start)
        eager.cache.set_position(start)
    else:
        ops = sum(step_op_counts(model, replay.cache, replay.token).values())
        work = {"eager": {"aten_ops": ops}, "replay": {"aten_ops": ops}}
    eager_ms, replay_ms = (1e3 * seconds[k] / steps for k in ("eager", "replay"))
    return {
        "what": "graph-safe decode step: eager vs replay of its captured graph",
        "graph": replay.step_graph.describe(),
        "emulated": replay.step_graph.emulated,
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "prompt_len": input_ids.shape[1],
        "batch": input_ids.shape[0],
        "steps_per_round": steps,
        "rounds": rounds,
        "eager_ms_per_token": eager_ms,
        "replay_ms_per_token": replay_ms,
        "speedup": eager_ms / replay_ms,
        "capture_seconds": replay.step_graph.capture_seconds,
        "cache_bytes": cache_bytes(replay.cache),
        "peak_memory_bytes": peaks,
        "work_per_step": work,
        "env": environment(device),
    }


def decode_graph_safe(model, input_ids: torch.Tensor, max_new_tokens: int, *, on_token: OnToken = None,
                      cache: GraphSafeStaticCache | None = None, graph: bool | None = None, compile_mode: str | None = None,
                      decoder: GraphSafeDecoder | None = None, max_cache_len: int | None = None,
                      prefill_bucket: int | None = None) -> torch.Tensor:
    """The ``"graph-safe"`` strategy: prefill eagerly, capture the decode step once, replay it.

    The decoder (cache + graph) is kept per model and reused by later calls with the same batch size and
    settings, so a second prompt replays the graph captured for the first. ``graph=False``: the same step,
    eager. ``decoder``: use this GraphSafeDecoder. ``cache``: a fresh GraphSafeStaticCache to decode into
    (its max_cache_len is used; it must not be bound to another graph).
    """
    if decoder is None:
        use_graph = True if graph is None else bool(graph)
        if cache is not None:
            if not isinstance(cache, GraphSafeStaticCache):
                raise TypeError(f"cache must be a kvlab GraphSafeStaticCache, got {type(cache).__name__}: vanilla StaticCache is the 'static-graph' strategy")
            if cache.frozen:
                raise GraphSafeError("this cache is already bound to a captured graph: pass its GraphSafeDecoder as decoder=")
            decoder = GraphSafeDecoder(model, cache.max_cache_len, input_ids.shape[0], graph=use_graph,
                                       compile_mode=compile_mode, prefill_bucket=prefill_bucket)
            decoder.cache = cache
            cache.check_room = False
        else:
            need = input_ids.shape[1] + max_new_tokens
            length = max_cache_len or 256 * -(-need // 256)  # round up: nearby lengths reuse one decoder
            key = (input_ids.shape[0], use_graph, compile_mode, prefill_bucket, length, next(model.parameters()).dtype)
            decoder = per_model(model, "graph-safe", key, lambda: GraphSafeDecoder(
                model, length, input_ids.shape[0], graph=use_graph, compile_mode=compile_mode,
                prefill_bucket=prefill_bucket), keep=lambda d: not d.stale())
    return decoder.generate(input_ids, max_new_tokens, on_token=on_token)

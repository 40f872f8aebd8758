"""The graph decoder of lessons 05 and 06: prefill eagerly, capture decode steps once, replay them for every prompt.

``GraphSafeDecoder`` owns one ``GraphSafeStaticCache`` (``kvlab.graph_safe_cache``) and one static token buffer.
A decode step reads the token and the cache by address and writes the next token into the same buffer, with no
host sync; ``kvlab.graphs.capture`` records it (a real CUDA graph on a GPU, an emulation elsewhere). Its settings:

- ``steps``: decode steps per captured graph. One replay makes ``steps`` tokens, so the host launches one graph
  per ``steps`` tokens and the GPU never waits between them (``"graph-safe"``: 1, lesson 06's paths: 16).
- ``step``: what one step runs. ``"model"``: the transformers forward over the cache, then argmax (optionally
  ``torch.compile``d with ``compile_mode`` before capture). ``"kernels"``: ``kvlab.kernels.step.kernel_step``,
  kvlab's own kernels over a fused copy of the model (``kvlab.fusion``).
- ``prefill_bucket=T``: the prefill is captured too, padded to T tokens; every prompt of length <= T replays it,
  its valid length in a device tensor (the cache's valid window).
- ``kernel_prefill``: with the ``"kernels"`` step, the prefill runs through the same kernels
  (``kvlab.kernels.step.kernel_prefill``) instead of the model's forward.
- ``copy_weights``: the ``"kernels"`` step decodes a fused copy of the model (True) or the model's own weights,
  its q/k/v and gate/up read where they are (False: no second copy of the weights).

The decoder's rules, which lesson 04's failures break: the position lives in the cache's one counter tensor
(never a Python int), the counter and the token are put back in place after the capture's warm-up calls, the
cache is never rebound (its addresses are checked before every decode), and the weights a graph reads are
checked too (their addresses and shapes). ``decode_graph_safe``, ``decode_graph_safe_compiled`` and
``decode_graph_safe_kernels`` are the strategies of ``kvlab.strategies`` built on it.

The caller owns the decoder: each strategy builds one for its call (``graph_safe_decoder``, ``compiled_decoder``,
``kernels_decoder``) unless it is handed one (``decoder=``), and nothing is kept anywhere else. Whoever decodes many
times (a lesson, the benchmark) builds the decoder once and passes it, as gpt-fast compiles its step once in ``main``.
"""

from __future__ import annotations

import weakref
from contextlib import nullcontext

import torch

from .decoding import OnToken, check_inputs, check_model, greedy
from .fusion import fused_copy
from .graph_safe_cache import GraphSafeError, GraphSafeStaticCache
from .graphs import capture
from .runtime import PDL, check_dtype, gpu_supports

STEP_KINDS = ("model", "kernels")


def prefill_mask(start: torch.Tensor, batch: int, bucket: int, slots: int, device=None) -> torch.Tensor:
    """The 4-D causal mask of a padded prefill: row ``i`` (position ``start + i``) may see slots ``0..start + i``.

    ``start`` is the cache's counter (a 0-dim tensor, read inside the graph, never on the host; before the cache's
    first forward it still lives on the CPU, so ``device`` says where the mask goes, default ``start``'s). Returns a bool
    ``[batch, 1, bucket, slots]`` tensor (True: attend), which the model uses as given instead of building its own.
    Padded rows get a mask too; their outputs are never used and their keys go to the trash slot.
    """
    device = start.device if device is None else device
    queries = start + torch.arange(bucket, device=device)  # [bucket] positions (a 0-dim CPU start broadcasts)
    allowed = torch.arange(slots, device=device)[None, :] <= queries[:, None]  # [bucket, slots] causal
    return allowed[None, None].expand(batch, 1, bucket, slots)


def read_addresses(model) -> tuple:
    """Address, shape and dtype of every parameter and buffer: what a captured graph reads, by address. It walks the
    modules' own dicts: a decoder reads them before every decode, and ``model.parameters()`` (which also drops a tied
    weight's second name) takes a few times longer, time before the first token."""
    found, stack = [], [model]
    while stack:
        module = stack.pop()
        if module is None:  # a child slot set to None
            continue
        found += module._parameters.values()
        found += module._buffers.values()
        stack += module._modules.values()
    return tuple((t.data_ptr(), t.shape, t.dtype) for t in found if t is not None)


def model_step(model, cache, token: torch.Tensor) -> torch.Tensor:
    """One decode step through the model's forward: reads ``token`` [batch, 1], writes the argmax of the next one into
    it, advances the cache's counter."""
    logits = model(input_ids=token, cache=cache, use_cache=True).logits  # [batch, 1, vocab]
    token.copy_(logits[:, -1, :].argmax(dim=-1, keepdim=True))
    return token


class GraphSafeDecoder:
    """Prefill eagerly, capture ``steps`` decode steps in one graph, replay it for any number of prompts.

    ``graph=False`` runs the same steps eagerly (the baseline for timings). ``emulate=True`` forces the CPU-style
    emulation of capture also on a GPU (to compare it with the real graph). ``kernel_options``: keywords of the
    ``"kernels"`` step (``kvlab.kernels.step.KERNEL_OPTIONS``) and of its prefill (``PREFILL_OPTIONS``). ``cache``: an empty
    ``GraphSafeStaticCache`` to decode into instead of a new one. ``fused``: decode a copy of the model,
    ``kvlab.fusion.fused_copy(model, **fused)`` (the ``"kernels"`` step always does, with ``attention=False``): a
    copy made here, so later edits to ``model``'s weights do not reach it; build a new decoder after an edit.
    ``kernel_prefill``: the ``"kernels"`` step's prefill through its kernels (``kernel_options``' ``tiles``,
    ``early_launch`` and ``fill_prefill`` apply to it). ``copy_weights=False``: the ``"kernels"`` step reads ``model``'s own weights
    instead of a fused copy (``kvlab.kernels.step.stacked_projections``): no second copy in memory, and like the
    ``"model"`` step it replays with the weights as they are then (an in-place edit reaches the next decode; a
    weight replaced or moved is refused).
    """

    def __init__(self, model, max_cache_len: int, batch: int = 1, *, steps: int = 1, step: str = "model",
                 graph: bool = True, compile_mode: str | None = None, prefill_bucket: int | None = None,
                 warmup: int = 3, emulate: bool | None = None, cache: GraphSafeStaticCache | None = None,
                 fused: dict | None = None, kernel_options: dict | None = None, kernel_prefill: bool = False,
                 copy_weights: bool = True):
        check_model(model)
        param = next(model.parameters())
        for name, value in (("batch", batch), ("steps", steps)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if step not in STEP_KINDS:
            raise ValueError(f"step must be one of {STEP_KINDS}, got {step!r}")
        if compile_mode is not None and step != "model":
            raise ValueError("compile_mode compiles the model's forward; the 'kernels' step is not compiled")
        if compile_mode is not None and graph and (param.device.type != "cuda" or emulate):
            raise ValueError(
                f"compile_mode={compile_mode!r} with graph capture needs CUDA (the CPU emulation traces eager ops and "
                "cannot trace a compiled function). On CPU, pass graph=False to run the compiled step eagerly."
            )
        if compile_mode is not None:
            check_dtype(param.device, param.dtype)  # bf16 on a GPU without it (a T4): say to use float16
        if prefill_bucket is not None and (not isinstance(prefill_bucket, int) or isinstance(prefill_bucket, bool)
                                           or not 1 <= prefill_bucket <= max_cache_len):
            raise ValueError(f"prefill_bucket must be in [1, max_cache_len={max_cache_len}], got {prefill_bucket}")
        if fused is not None and step == "kernels":
            raise ValueError("the 'kernels' step makes its own fused copy (attention=False): drop fused=")
        if kernel_options:
            from .kernels.step import KERNEL_OPTIONS, PREFILL_OPTIONS

            if step != "kernels":
                raise ValueError("kernel_options sets the 'kernels' step's variant: pass step='kernels' or drop it")
            unknown = sorted(set(kernel_options) - set(KERNEL_OPTIONS) - set(PREFILL_OPTIONS))
            if unknown:
                raise ValueError(f"unknown kernel_options {unknown}; kvlab.kernels.step.kernel_step takes "
                                 f"{', '.join(KERNEL_OPTIONS)} and kernel_prefill {', '.join(PREFILL_OPTIONS)}")
        if (kernel_prefill or not copy_weights) and step != "kernels":
            raise ValueError("kernel_prefill and copy_weights set the 'kernels' step's prefill and weights: pass "
                             "step='kernels' or drop them")
        self.source = model  # what the caller gave; self.model is what runs (a fused copy, for fused= or the kernels)
        if step == "kernels":
            from .kernels.step import check_supported

            check_supported(model)
            if copy_weights:  # one q/k/v and one gate/up weight per layer, the model's own attention for a prefill
                fused = {"attention": False}
        if fused is not None:
            model = fused_copy(model, **fused)
        self.model, self.batch, self.steps, self.step_kind = model, batch, steps, step
        self.use_graph, self.warmup, self.emulate = graph, warmup, emulate
        self.dtype, self.device = param.dtype, param.device
        self.compile_mode, self.prefill_bucket = compile_mode, prefill_bucket
        self.kernel_options = dict(kernel_options or {})  # keywords of kernel_step, fixed at build
        self.kernel_prefill = kernel_prefill
        self.cache = self._own_cache(cache, max_cache_len)
        self._token = torch.zeros(batch, 1, dtype=torch.long, device=self.device)  # static input AND output of a step
        if step == "kernels":
            from .kernels.step import arrival_counters

            self.done = arrival_counters(self.model, batch, self.device)  # attention's counters, left at zero
        self.compiled_step = None  # model_step compiled (compile_mode): a plain function, so no cycle through self
        if compile_mode is not None:  # callers are in inference mode
            self.compiled_step = torch.compile(model_step, mode=compile_mode, fullgraph=True)
        if prefill_bucket is not None:
            self.prompt = torch.zeros(batch, prefill_bucket, dtype=torch.long, device=self.device)  # [batch, bucket]
        if prefill_bucket is not None or kernel_prefill:
            self.valid = torch.zeros((), dtype=torch.long, device=self.device)  # valid prompt length, on the device
        self.graphs: dict[int, object] = {}  # steps per replay -> captured graph (at most two: steps and the rest)
        self.prefill_graph = None
        self._fingerprint = None  # the cache's addresses at capture
        self._weights = None  # the model's parameter and buffer addresses at capture (read_addresses)

    def __reduce_ex__(self, protocol):
        raise TypeError("a GraphSafeDecoder cannot be pickled or copied: it holds captured graphs bound to live memory "
                        "(its cache and token buffer, read by address), which a copy would not own. Build a new "
                        "GraphSafeDecoder instead")

    @property
    def token(self) -> torch.Tensor:
        """The static token buffer ``[batch, 1]`` a step reads and writes by address (write into it, never rebind)."""
        return self._token

    @token.setter
    def token(self, value) -> None:
        raise GraphSafeError("the captured graphs read decoder.token by address: a new tensor would never be read. "
                             "Write into it instead: decoder.token.copy_(ids)")

    def _own_cache(self, cache, max_cache_len: int) -> GraphSafeStaticCache:
        if cache is None:
            cache = GraphSafeStaticCache(config=self.model.config, max_cache_len=max_cache_len)
            cache.owner = weakref.ref(self)
            return cache
        if not isinstance(cache, GraphSafeStaticCache):
            raise TypeError(f"cache must be a kvlab GraphSafeStaticCache, got {type(cache).__name__}: a vanilla "
                            "StaticCache is lesson 04's 'static-graph' strategy")
        if cache.frozen:
            raise GraphSafeError("this cache is already bound to a captured graph: use the GraphSafeDecoder that "
                                 "captured it, or a fresh cache")
        if cache.max_cache_len != max_cache_len or len(cache.layers) != self.model.config.get_text_config().num_hidden_layers:
            raise GraphSafeError(f"the cache has {len(cache.layers)} layers of {cache.max_cache_len} slots; this decoder "
                                 f"needs the model's {self.model.config.get_text_config().num_hidden_layers} layers of "
                                 f"max_cache_len={max_cache_len}: build the cache from model.config")
        if cache.is_initialized and int(cache.get_seq_length()):
            raise GraphSafeError(f"the cache already holds {int(cache.get_seq_length())} tokens: pass an empty one "
                                 "(`with torch.inference_mode(): cache.reset()`)")
        owner = getattr(cache, "owner", None)
        if owner is not None and owner() is not None:
            raise GraphSafeError("this cache already belongs to another GraphSafeDecoder: two decoders on one cache "
                                 "would each continue the other's sequence. Give each decoder a cache of its own")
        cache.owner = weakref.ref(self)
        return cache

    @property
    def max_cache_len(self) -> int:
        return self.cache.max_cache_len

    @property
    def step_graph(self):
        """The captured graph of ``steps`` decode steps (None before the first decode, or with ``graph=False``)."""
        return self.graphs.get(self.steps)

    # ---- the steps (no host sync inside: they are captured) -----------------------------------------
    def one_step(self, token: torch.Tensor) -> torch.Tensor:
        """One decode step: reads ``token`` [batch, 1], writes the next token into it, advances the cache's counter."""
        if self.step_kind == "kernels":
            from .kernels.step import KERNEL_OPTIONS, kernel_step

            options = {k: v for k, v in self.kernel_options.items() if k in KERNEL_OPTIONS}
            return kernel_step(self.model, self.cache, token, self.done, **options)
        return (self.compiled_step or model_step)(self.model, self.cache, token)

    def multi_step(self, n: int):
        """A function of the static token that runs ``n`` steps and returns their tokens ``[batch, n]``."""
        out = torch.zeros(self.batch, n, dtype=torch.long, device=self.device)  # static output of the graph

        def run(token: torch.Tensor) -> torch.Tensor:
            for k in range(n):
                self.one_step(token)
                out[:, k : k + 1].copy_(token)
            return out

        return run

    def _padded_prefill(self, prompt: torch.Tensor) -> torch.Tensor:
        """Prefill of a prompt padded to the bucket; only ``self.valid`` tokens count. Writes the first new token."""
        if self.kernel_prefill:
            from .kernels.step import PREFILL_OPTIONS, kernel_prefill

            if not self.cache.is_initialized:  # the kernels write into the buffers: allocate them (eagerly, first)
                config = self.model.config
                self.cache.early_initialization(self.batch, config.num_key_value_heads,
                                                self.model.model.layers[0].self_attn.head_dim, self.dtype, self.device)
            options = {k: v for k, v in self.kernel_options.items() if k in PREFILL_OPTIONS}
            return kernel_prefill(self.model, self.cache, prompt, self.valid, self.token, **options)
        mask = prefill_mask(self.cache.cache_position, prompt.shape[0], prompt.shape[1], self.max_cache_len,
                            prompt.device)  # [batch, 1, bucket, slots]
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
            raise GraphSafeError(f"this decoder was built (and its graph captured) for batch {self.batch}, got batch "
                                 f"{batch}: build another GraphSafeDecoder for that batch size")
        dtype = next(self.model.parameters()).dtype
        if dtype != self.dtype:
            raise GraphSafeError(f"the model is now {dtype} but the decoder was built for {self.dtype}: its graph and "
                                 f"cache hold {self.dtype} tensors. Build a new GraphSafeDecoder.")
        need = prompt_len + max_new_tokens - 1  # the last new token is never written
        if need > self.max_cache_len:
            raise GraphSafeError(
                f"prompt ({prompt_len}) + max_new_tokens ({max_new_tokens}) - 1 = {need} tokens do not fit in "
                f"max_cache_len={self.max_cache_len}: build the decoder with max_cache_len >= {need}"
            )
        if self.prefill_bucket is not None and prompt_len > self.prefill_bucket:
            raise GraphSafeError(f"the prompt ({prompt_len} tokens) is longer than prefill_bucket={self.prefill_bucket}, "
                                 "the captured prefill's length: build the decoder for the longest prompt it will "
                                 "serve (or with a larger prefill_bucket, or captured_prefill=False)")
        if self._fingerprint is not None and self.cache.fingerprint() != self._fingerprint:
            raise GraphSafeError(
                "the cache's buffers were reallocated or rebound since the graph was captured: replay would write into "
                "the old buffers. Never rebind cache tensors; use cache.reset(). Build a new GraphSafeDecoder."
            )
        if self._weights is not None and read_addresses(self.model) != self._weights:
            raise GraphSafeError(
                "the model's weights moved since this decoder captured its graphs (a parameter replaced, .to(), "
                ".double(), load_state_dict(assign=True)): a replay would read the old memory. Build a new "
                "GraphSafeDecoder."
            )

    def capture_graph(self, fn, static: torch.Tensor):
        """Capture ``fn(static)`` and undo the warm-up calls' side effects in place: counter, token, slots they wrote."""
        if not self.cache.is_initialized:
            raise GraphSafeError("capture before the cache is initialized: run a prefill (or cache.early_initialization) first")
        position, token = self.cache.cache_position.clone(), self.token.clone()
        try:
            graph = capture(fn, static, warmup=self.warmup, emulate=self.emulate)
        finally:
            self.cache.set_position(position)  # warm-ups advanced the counter: put it back, in place
            self.token.copy_(token)
            start = int(position)
            end = self.max_cache_len  # the trash slot keeps its garbage: nothing reads it
            for layer in self.cache.layers:  # and erase what they wrote past it (the mask hid it; now it is gone)
                layer.keys[:, :, start:end].zero_()
                layer.values[:, :, start:end].zero_()
        self.cache.frozen = True
        self._fingerprint = self.cache.fingerprint()
        self._weights = read_addresses(self.model)  # what the replays read
        return graph

    def next_tokens(self, n: int) -> torch.Tensor:
        """The next ``n`` (<= steps) tokens ``[batch, n]``: one replay of the n-step graph (captured on first use)."""
        if not self.use_graph:
            return self.multi_step(n)(self.token)
        if n not in self.graphs:
            self.graphs[n] = self.capture_graph(self.multi_step(n), self.token)
        return self.graphs[n].replay()

    # ---- generation --------------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Reset the cache (in place) and prefill ``input_ids``; returns the first new token ``[batch, 1]`` (a copy:
        the static buffer ``token`` is overwritten by the next step)."""
        self._check(input_ids, 1)
        with self.cache.unchecked():  # room was checked above, once
            return self._prefill(input_ids).clone()

    def _prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        self.cache.reset()
        if self.prefill_bucket is None and self.kernel_prefill:
            self.valid.fill_(input_ids.shape[1])
            return self._padded_prefill(input_ids)  # unpadded: every row is valid
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
            self.prefill_graph = self.capture_graph(self._padded_prefill, self.prompt)
        self.prefill_graph.replay()
        return self.token

    @torch.inference_mode()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, *, on_token: OnToken = None) -> torch.Tensor:
        """Greedy-decode ``max_new_tokens`` after ``input_ids`` [batch, prompt_len]; returns ``[batch, max_new_tokens]``."""
        self._check(input_ids, max_new_tokens)
        out = torch.empty(self.batch, max_new_tokens, dtype=torch.long, device=self.device)
        with self.cache.unchecked():  # room was checked above, once for every step: no host sync per step
            out[:, :1].copy_(self._prefill(input_ids))
            if on_token is not None:
                on_token(0, out[:, :1])
            done = 1
            while done < max_new_tokens:
                n = min(self.steps, max_new_tokens - done)
                out[:, done : done + n].copy_(self.next_tokens(n))  # replay: n new tokens, no host sync
                if on_token is not None:
                    for k in range(done, done + n):
                        on_token(k, out[:, k : k + 1])
                done += n
        return out

    @torch.inference_mode()
    def decode_steps(self, n: int) -> torch.Tensor:
        """``n`` more tokens ``[batch, n]`` after what the cache holds (after ``prefill``): one host read of the
        counter first, then replays with no sync. Refuses steps past ``max_cache_len``: their keys and values would
        go to the trash slot and the tokens be garbage."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"n must be a positive int, got {n!r}")
        used = int(self.cache.cache_position)
        if used + n > self.max_cache_len:
            raise GraphSafeError(
                f"the cache holds {used} of {self.max_cache_len} tokens: {n} more steps would decode garbage. "
                "prefill a prompt again, or build the decoder with a larger max_cache_len."
            )
        out = torch.empty(self.batch, n, dtype=torch.long, device=self.device)
        with self.cache.unchecked():
            done = 0
            while done < n:
                k = min(self.steps, n - done)
                out[:, done : done + k].copy_(self.next_tokens(k))
                done += k
        return out

    def step(self) -> torch.Tensor:
        """One decode step by hand, after ``prefill``: returns the new token ``[batch, 1]`` (``decode_steps(1)``)."""
        return self.decode_steps(1)

    def describe(self) -> str:
        graphs = [f"{n}-step graph: {g.describe()}" for n, g in sorted(self.graphs.items())]
        if self.prefill_graph is not None:
            graphs.insert(0, f"prefill graph: {self.prefill_graph.describe()}")
        how = "; ".join(graphs) if graphs else ("not captured yet" if self.use_graph else "eager (no graph)")
        compiled = f", step compiled with mode={self.compile_mode!r}" if self.compile_mode else ""
        return (f"GraphSafeDecoder(batch={self.batch}, max_cache_len={self.max_cache_len}, step={self.step_kind!r}, "
                f"steps={self.steps}{compiled}): {how}")


def cache_length(input_ids: torch.Tensor, max_new_tokens: int, max_cache_len: int | None = None,
                 cache: GraphSafeStaticCache | None = None) -> int:
    """The cache length of a decoder built for one call: a given ``cache``'s own, else ``max_cache_len``, else
    prompt + new tokens."""
    if cache is not None:
        return cache.max_cache_len if isinstance(cache, GraphSafeStaticCache) else max_cache_len or 1
    return input_ids.shape[1] + max_new_tokens if max_cache_len is None else max_cache_len


def graph_safe_decoder(model, input_ids: torch.Tensor, max_new_tokens: int, *, max_cache_len: int | None = None,
                       cache: GraphSafeStaticCache | None = None, **settings) -> GraphSafeDecoder:
    """The decoder ``decode_graph_safe`` builds for one call: batch and cache length from the call
    (``cache_length``), ``settings`` for ``GraphSafeDecoder``. Pass it back as ``decoder=`` to replay its graphs in
    later calls."""
    length = cache_length(input_ids, max_new_tokens, max_cache_len, cache)
    return GraphSafeDecoder(model, length, input_ids.shape[0], cache=cache, **settings)


def decode_graph_safe(model, input_ids: torch.Tensor, max_new_tokens: int, *, on_token: OnToken = None,
                      max_cache_len: int | None = None, graph: bool = True, compile_mode: str | None = None,
                      prefill_bucket: int | None = None, decoder: GraphSafeDecoder | None = None,
                      cache: GraphSafeStaticCache | None = None) -> torch.Tensor:
    """The ``"graph-safe"`` strategy: eager prefill, the decode step captured once (one step per graph), replayed.

    ``decoder``: replay this GraphSafeDecoder's graphs (its own settings). ``cache``: an empty GraphSafeStaticCache
    to decode into. Otherwise a decoder is built for this call (``graph_safe_decoder``).
    """
    if decoder is None:
        decoder = graph_safe_decoder(model, input_ids, max_new_tokens, max_cache_len=max_cache_len, cache=cache,
                                     graph=bool(graph), compile_mode=compile_mode, prefill_bucket=prefill_bucket)
    return held(decoder, model).generate(input_ids, max_new_tokens, on_token=on_token)


def held(decoder: GraphSafeDecoder, model) -> GraphSafeDecoder:
    """``decoder``, refused when it was built for another model (its graphs would decode with that one's weights)."""
    if decoder.source is not model:
        raise GraphSafeError("this decoder was built for another model: its graphs would decode with that model's "
                             "weights. Pass the decoder built for this model, or none (one is built for the call)")
    return decoder


def inductor_options(tune: bool = True, device: torch.device | str = "cuda"):
    """Inductor settings for the compiled step (gpt-fast's): coordinate-descent tuning of each kernel's block sizes,
    and programmatic dependent launch (a kernel starts while the previous one drains) where ``device`` has it
    (``runtime.PDL``) and this torch offers it."""
    if not tune:
        return nullcontext()
    config = torch._inductor.config
    options = {"coordinate_descent_tuning": True}
    if hasattr(config.triton, "enable_pdl") and gpu_supports(device, PDL):
        options["triton.enable_pdl"] = True
    return config.patch(options)


def compiled_decoder(model, input_ids: torch.Tensor, max_new_tokens: int, *,
                     compile_mode: str | None = "max-autotune-no-cudagraphs", steps: int = 16, fuse: bool = True,
                     gemv: bool = True, attention: bool | str = "triton", max_cache_len: int | None = None,
                     graph: bool | None = None, tune: bool = True) -> GraphSafeDecoder:
    """The decoder ``decode_graph_safe_compiled`` builds for one call: over a fused copy of the model
    (``kvlab.fusion``), its step compiled without cudagraphs, ``steps`` steps per captured graph. ``tune`` is used
    when the step compiles, at the first decode (``inductor_options``).

    On CPU the step is neither compiled nor captured unless asked: an inductor compile takes minutes on two
    cores, a compiled step cannot be captured by the emulation, and the emulated graph is no faster than eager.
    """
    cuda = input_ids.device.type == "cuda"
    fused = {"fuse": fuse, "attention": attention if fuse else False, "gemv": gemv}
    return graph_safe_decoder(model, input_ids, max_new_tokens, max_cache_len=max_cache_len, steps=steps,
                              graph=cuda if graph is None else graph, compile_mode=compile_mode if cuda else None,
                              fused=fused)


def decode_graph_safe_compiled(model, input_ids: torch.Tensor, max_new_tokens: int, *, on_token: OnToken = None,
                               decoder: GraphSafeDecoder | None = None, tune: bool = True, **settings) -> torch.Tensor:
    """The ``"graph-safe-compiled"`` strategy: ``decoder`` (else ``compiled_decoder(model, ..., **settings)``)
    generates, under ``inductor_options(tune)`` where its step compiles."""
    decoder = held(decoder, model) if decoder is not None else compiled_decoder(model, input_ids, max_new_tokens,
                                                                                **settings)
    with inductor_options(tune, input_ids.device) if decoder.compile_mode else nullcontext():
        return decoder.generate(input_ids, max_new_tokens, on_token=on_token)


def prompt_bucket(prompt_len: int, max_cache_len: int) -> int:
    """The padded prefill length for a prompt of ``prompt_len`` tokens: the next power of two, at most the cache.
    Prompts of lengths in (T/2, T] share the bucket T, so a few captured prefills serve every length."""
    return min(1 << (prompt_len - 1).bit_length(), max_cache_len)


def kernels_decoder(model, input_ids: torch.Tensor, max_new_tokens: int, *, steps: int = 16,
                    max_cache_len: int | None = None, graph: bool = True, captured_prefill: bool = True,
                    dot_attention: bool = True, tiles: bool = True, early_launch: bool = False,
                    fill_splits: bool = True, split_counters: bool = True, fused_mlp: bool = False,
                    kernel_prefill: bool | None = None, fill_prefill: bool = True,
                    copy_weights: bool = False) -> GraphSafeDecoder:
    """The decoder ``decode_graph_safe_kernels`` builds for one call: kvlab's kernels for the step
    (``kvlab.kernels.step``), ``steps`` steps per captured graph (a real CUDA graph on a GPU, emulated elsewhere).
    ``captured_prefill``: the prefill is captured too (``prefill_bucket``: ``prompt_bucket`` of this prompt), so the
    first token costs one replay instead of an eager forward that launches every kernel from Python; it serves
    prompts up to that bucket, so build it for the longest prompt it will see.
    ``dot_attention``, ``tiles``, ``early_launch``, ``fill_splits``, ``split_counters``, ``fused_mlp``:
    ``kvlab.kernels.step.kernel_step``'s options (attention on tensor cores; the matmuls of 2 rows or more as the
    measured dispatch picks; each kernel lets the next start at its entry; attention split over only as many
    programs as fill the GPU once; the split matmuls' arrival counters kept by the decoder, no memset per layer;
    the MLP as one kernel at batch 1).
    ``kernel_prefill``: the prefill through the same kernels (``kvlab.kernels.step.kernel_prefill``) instead of the
    model's transformers forward; None (default): where the prompt's rows (batch x bucket) are at most
    ``kvlab.kernels.step.KERNEL_PREFILL_MAX_ROWS``, the most the H200 measured them no slower at. ``fill_prefill``:
    ``kernel_prefill``'s (its attention in fewer query rows per program where its tiles would not fill the GPU).
    ``copy_weights``: decode a fused copy of the weights (``GraphSafeDecoder``'s option); False (default): the
    kernels read the model's own weights, as fast on the H200 and without a second copy in memory.
    The benchmark's ``graph-safe-kernels/...`` variants turn each default back, or add an option
    (``data/README.md`` lists the records that measure them)."""
    length = cache_length(input_ids, max_new_tokens, max_cache_len)
    bucket = prompt_bucket(input_ids.shape[1], length) if captured_prefill else None
    if kernel_prefill is None:
        from .kernels.step import KERNEL_PREFILL_MAX_ROWS

        kernel_prefill = input_ids.shape[0] * (bucket or input_ids.shape[1]) <= KERNEL_PREFILL_MAX_ROWS
    options = {"dot_attention": dot_attention, "tiles": tiles, "early_launch": early_launch, "fill_splits": fill_splits,
               "split_counters": split_counters, "fused_mlp": fused_mlp, "fill_prefill": fill_prefill}
    return graph_safe_decoder(model, input_ids, max_new_tokens, max_cache_len=length, steps=steps,
                              step="kernels", graph=graph, prefill_bucket=bucket, kernel_options=options,
                              kernel_prefill=kernel_prefill, copy_weights=copy_weights)


def decode_graph_safe_kernels(model, input_ids: torch.Tensor, max_new_tokens: int, *, on_token: OnToken = None,
                              decoder: GraphSafeDecoder | None = None, **settings) -> torch.Tensor:
    """The ``"graph-safe-kernels"`` strategy: ``decoder`` (else ``kernels_decoder(model, ..., **settings)``) generates."""
    decoder = held(decoder, model) if decoder is not None else kernels_decoder(model, input_ids, max_new_tokens,
                                                                               **settings)
    return decoder.generate(input_ids, max_new_tokens, on_token=on_token)

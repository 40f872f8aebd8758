"""The graph decoder of lessons 05 and 06: prefill, capture decode steps once, replay them for every
prompt.

``GraphSafeDecoder`` owns one ``GraphSafeStaticCache`` (``kvlab.graph_safe_cache``) and one static
token buffer. Its decode step is a plain function (gpt-fast's ``decode_one_token``), given to it:

    step(model, cache, token) -> token    # reads token [batch, 1], writes the next one into it,
                                          # in place

``model_step`` (here: the transformers forward, then argmax) is lesson 05's; lesson 06's steps live
beside the idea that owns them (``kvlab.compiled_step``: the forward compiled;
``kvlab.kernels.decoder``: kvlab's kernels). A step reads the token and the cache by address, with
no host sync; ``kvlab.graphs.capture`` records ``steps`` of them in one graph (a real CUDA graph on
a GPU, an emulation elsewhere), replayed for every ``steps`` tokens. ``prefill_bucket=T`` captures
the prefill too, padded to T tokens:

    prefill(model, cache, prompt, valid, token) -> token    # prompt [batch, T], its first
                                                            # ``valid`` count

(default ``model_prefill``: the forward with a causal mask from the counter, the cache's valid
window).

The decoder's rules, which lesson 04's failures break: the position lives in the cache's one counter
tensor (never a Python int); the counter and the token are put back in place after the capture's
warm-up calls; the cache is never rebound (its addresses are checked before every decode), and
neither are the weights a graph reads. The caller owns the decoder: a strategy builds one per call
unless handed one (``decoder=``).
"""

from __future__ import annotations

import contextlib
import weakref

import torch

from .decoding import OnToken, check_inputs, check_model, greedy
from .frozen_state import check_unchanged, frozen_state
from .graph_safe_cache import GraphSafeError, GraphSafeStaticCache
from .graphs import capture, check_capturable_rope
from .runtime import count, one_call


def prefill_mask(start: torch.Tensor, batch: int, bucket: int, slots: int,
                 device=None) -> torch.Tensor:
    """The 4-D causal mask of a padded prefill: row ``i`` (position ``start + i``) may see slots
    ``0..start + i``.

    ``start`` is the cache's counter (a 0-dim tensor, read inside the graph, never on the host;
    before the cache's first forward it still lives on the CPU, so ``device`` says where the mask
    goes, default ``start``'s). Returns a bool ``[batch, 1, bucket, slots]`` tensor (True: attend),
    which the model uses as given instead of building its own. Padded rows get a mask too; their
    outputs are never used and their keys go to the trash slot.
    """
    device = start.device if device is None else device
    # [bucket] positions (a 0-dim CPU start broadcasts)
    queries = start + torch.arange(bucket, device=device)
    # [bucket, slots] causal
    allowed = torch.arange(slots, device=device)[None, :] <= queries[:, None]
    return allowed[None, None].expand(batch, 1, bucket, slots)


def forward_mask(model, cache, rows: torch.Tensor) -> torch.Tensor:
    """``prefill_mask`` of ``rows`` [batch, width] at the counter, in the form the model's attention
    takes: bool for ``"sdpa"``, additive (0 or the dtype's min) for the others."""
    mask = prefill_mask(cache.cache_position, rows.shape[0], rows.shape[1], cache.max_cache_len,
                        rows.device)
    if model.config._attn_implementation == "sdpa":
        return mask
    dtype = model.dtype
    return (torch.zeros((), dtype=dtype, device=rows.device)
            .masked_fill(~mask, torch.finfo(dtype).min))


def read_addresses(model) -> tuple:
    """Address, shape and dtype of every parameter and buffer: what a captured graph reads, by
    address. It walks the modules' own dicts: a decoder reads them before every decode, and
    ``model.parameters()`` (which also drops a tied weight's second name) takes a few times longer,
    time before the first token."""
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
    """One decode step through the model's forward: reads ``token`` [batch, 1], writes the argmax of
    the next one into it, advances the cache's counter."""
    logits = model(input_ids=token, cache=cache, use_cache=True).logits  # [batch, 1, vocab]
    token.copy_(logits[:, -1, :].argmax(dim=-1, keepdim=True))
    return token


def model_prefill(model, cache, prompt: torch.Tensor, valid: torch.Tensor,
                  token: torch.Tensor) -> torch.Tensor:
    """A padded prefill through the model's forward: ``prompt`` [batch, T], of which the first
    ``valid`` (a 0-dim long tensor) count; writes the first new token into ``token`` [batch, 1] and
    advances the counter by ``valid`` (the cache's valid window). One graph captured at T serves
    every length up to T."""
    mask = forward_mask(model, cache, prompt)  # [batch, 1, T, slots]
    with cache.valid_window(valid):
        logits = model(input_ids=prompt, cache=cache, attention_mask=mask, use_cache=True).logits
    last = (valid - 1).reshape(1)  # the last VALID row, not the last padded one
    token.copy_(logits.index_select(1, last)[:, 0, :].argmax(dim=-1, keepdim=True))
    return token


class GraphSafeDecoder:
    """Prefill, capture ``steps`` decode steps in one graph, replay it for any number of prompts.

    ``max_cache_len``: the cache's slots, or an empty ``GraphSafeStaticCache`` to decode into (its
    own length). ``step``: the decode step, ``step(model, cache, token) -> token`` (default
    ``model_step``). ``steps``: steps per captured graph. ``prefill``: the padded prefill,
    ``prefill(model, cache, prompt, valid, token)`` (default: ``model_prefill`` when padded, the
    model's plain forward when not). ``prefill_bucket=T``: the prefill is captured too, at T tokens;
    every prompt of length <= T replays it. ``graph``: True (capture: a CUDA graph on a GPU, the
    emulation elsewhere), False (the same steps eagerly, the baseline for timings) or ``"emulate"``
    (the emulation also on a GPU, to compare it with the real graph).

    ``model`` is what the steps read, by address; ``source`` (the same model, unless a builder set
    it to the model it copied) is the one ``kvlab.decode`` checks a held decoder against.
    """

    warmup = 3  # calls of a step before its capture (their side effects are put back)
    # the strategy kvlab.decode takes this decoder under; a builder of another strategy sets its own
    kvlab_strategy = "graph-safe"

    def __init__(self, model, max_cache_len: int | GraphSafeStaticCache, batch: int = 1, *,
                 step=model_step, steps: int = 1, prefill=None, prefill_bucket: int | None = None,
                 graph: bool | str = True):
        check_model(model)
        batch, steps = count(batch, "batch"), count(steps, "steps")
        for name, fn in (("step", step), ("prefill", prefill)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} must be a function ({name}(model, cache, ...)), got "
                                f"{type(fn).__name__}")
        # a bool, not 0 or 1: graph=0 equals False yet `is not False` (use_graph) would capture
        if not (isinstance(graph, bool) or isinstance(graph, str) and graph == "emulate"):
            raise ValueError(f"graph must be True, False or 'emulate', got {graph!r}")
        if graph is not False:
            check_capturable_rope(model, "a GraphSafeDecoder (strategies 'graph-safe', "
                                  "'graph-safe-speculative')", "pass graph=False (its steps run "
                                  "eagerly)")
        cache = max_cache_len if isinstance(max_cache_len, GraphSafeStaticCache) else None
        length = cache.max_cache_len if cache is not None else max_cache_len
        if prefill_bucket is not None:  # read by count: a NumPy or 0-dim tensor int too
            try:
                bucket = count(prefill_bucket, "prefill_bucket")
            except ValueError:
                bucket = 0
            if not 1 <= bucket <= length:
                # the prefill writes prefill_bucket slots: the cache must hold them all
                fix = ("pass a cache of" if cache is not None else "pass") + (
                    f" max_cache_len >= {bucket} too, or a smaller prefill_bucket"
                    if bucket > length else " a prefill_bucket of at least 1")
                raise ValueError(f"prefill_bucket must be in [1, max_cache_len={length}] (the "
                                 "padded prefill writes prefill_bucket cache slots), got "
                                 f"{prefill_bucket!r}: {fix}")
            prefill_bucket = bucket
        param = next(model.parameters())
        self.model = self.source = model
        self.batch, self.steps, self.step_fn, self.prefill_fn = batch, steps, step, prefill
        self.use_graph, self.emulate = graph is not False, True if graph == "emulate" else None
        self.dtype, self.device = param.dtype, param.device
        self.prefill_bucket = prefill_bucket
        self.cache = self._own_cache(cache, length)
        self._cache_given = cache is not None  # the caller's: a longer one is theirs to make
        # a step's static input AND output
        self._token = torch.zeros(batch, 1, dtype=torch.long, device=self.device)
        # valid prompt length, on the device
        self.valid = torch.zeros((), dtype=torch.long, device=self.device)
        if prefill_bucket is not None:
            # [batch, T]
            self.prompt = torch.zeros(batch, prefill_bucket, dtype=torch.long, device=self.device)
        # steps per replay -> captured graph (per call two at most: steps and the rest; a held
        # decoder keeps one per remainder it has met)
        self.graphs: dict[int, object] = {}
        self.prefill_graph = None
        self._fingerprint = None  # the cache's addresses at capture
        # what the steps read: at build, again at capture
        self._frozen = frozen_state(model, versions=False)
        self._source_frozen = None  # frozen_state of the model a copy was made from (copied_from)

    def __reduce_ex__(self, protocol):
        raise TypeError("a GraphSafeDecoder cannot be pickled or copied: it holds captured graphs "
                        "bound to live memory (its cache and token buffer, read by address), which "
                        "a copy would not own. Build a new GraphSafeDecoder instead")

    @property
    def token(self) -> torch.Tensor:
        """The static token buffer ``[batch, 1]`` a step reads and writes by address (write into it,
        never rebind)."""
        return self._token

    @token.setter
    def token(self, value) -> None:
        raise GraphSafeError("the captured graphs read decoder.token by address: a new tensor "
                             "would never be read. Write into it instead: decoder.token.copy_(ids)")

    def _own_cache(self, cache, max_cache_len: int) -> GraphSafeStaticCache:
        layers = self.model.config.get_text_config().num_hidden_layers
        if cache is None:
            cache = GraphSafeStaticCache(config=self.model.config, max_cache_len=max_cache_len)
            cache.owner = weakref.ref(self)
            return cache
        owner = getattr(cache, "owner", None)
        if cache.frozen and (owner is None or owner() is None):  # kvlab.decode built and dropped it
            raise GraphSafeError("this cache is bound to the graphs of a GraphSafeDecoder that is "
                                 "gone (kvlab.decode builds one per call, then drops it), and "
                                 "reset() does not unbind it. Pass a fresh cache to each call, or "
                                 "build the decoder once: state = kvlab.STRATEGIES[strategy].state("
                                 "model, ids, n, cache=fresh_cache), then pass **state to each "
                                 "kvlab.decode(..., strategy=strategy)")
        if cache.frozen:
            raise GraphSafeError("this cache is already bound to a captured graph: use the "
                                 "GraphSafeDecoder that captured it, or a fresh cache")
        if len(cache.layers) != layers:
            raise GraphSafeError(f"the cache has {len(cache.layers)} layers; this decoder needs "
                                 f"the model's {layers} layers: build the cache from model.config")
        if cache.is_initialized and int(cache.get_seq_length()):
            raise GraphSafeError(f"the cache already holds {int(cache.get_seq_length())} tokens: "
                                 "pass an empty one (`with torch.inference_mode(): cache.reset()`)")
        if owner is not None and owner() is not None:
            raise GraphSafeError("this cache already belongs to another GraphSafeDecoder: two "
                                 "decoders on one cache would each continue the other's sequence. "
                                 "Give each decoder a cache of its own")
        cache.owner = weakref.ref(self)
        return cache

    @property
    def max_cache_len(self) -> int:
        return self.cache.max_cache_len

    @property
    def step_graph(self):
        """The captured graph of ``steps`` decode steps (None before the first decode, or with
        ``graph=False``)."""
        return self.graphs.get(self.steps)

    # ---- the steps (no host sync inside: they are captured)
    # -----------------------------------------
    def one_step(self, token: torch.Tensor) -> torch.Tensor:
        """One decode step: reads ``token`` [batch, 1], writes the next token into it, advances the
        counter."""
        return self.step_fn(self.model, self.cache, token)

    def multi_step(self, n: int):
        """A function of the static token that runs ``n`` steps and returns their tokens ``[batch,
        n]``."""
        # static output of the graph
        out = torch.zeros(self.batch, n, dtype=torch.long, device=self.device)

        def run(token: torch.Tensor) -> torch.Tensor:
            for k in range(n):
                self.one_step(token)
                out[:, k : k + 1].copy_(token)
            return out

        return run

    def padded_prefill(self, prompt: torch.Tensor) -> torch.Tensor:
        """The prefill of ``prompt`` [batch, T], of which ``self.valid`` tokens count; writes the
        first new token."""
        return (self.prefill_fn or model_prefill)(self.model, self.cache, prompt, self.valid,
                                                  self.token)

    # ---- host-side checks, all before any tensor is written
    # ----------------------------------------
    def _check(self, input_ids: torch.Tensor, max_new_tokens: int) -> int:
        """Refuse what this decoder cannot decode; returns ``max_new_tokens`` as an int."""
        max_new_tokens = check_inputs(self.model, input_ids, max_new_tokens, tokenizer_output=False)
        batch, prompt_len = input_ids.shape
        if batch != self.batch:
            raise GraphSafeError("this decoder was built (and its graph captured) for batch "
                                 f"{self.batch}, got batch {batch}: build another GraphSafeDecoder "
                                 "for that batch size")
        dtype = next(self.model.parameters()).dtype
        if dtype != self.dtype:
            raise GraphSafeError(f"the model is now {dtype} but the decoder was built for "
                                 f"{self.dtype}: its graph and cache hold {self.dtype} tensors. "
                                 "Build a new GraphSafeDecoder.")
        need = prompt_len + max_new_tokens - 1  # the last new token is never written
        if need > self.max_cache_len:
            fix = "pass a cache of" if self._cache_given else "build the decoder with"
            raise GraphSafeError(
                f"prompt ({prompt_len}) + max_new_tokens ({max_new_tokens}) - 1 = {need} tokens do "
                f"not fit in max_cache_len={self.max_cache_len}: {fix} max_cache_len >= {need}"
            )
        if self.prefill_bucket is not None and prompt_len > self.prefill_bucket:
            what = ("the captured prefill's length" if self.use_graph else
                    "the length the prefill is padded to (graph=False runs it eagerly, at that "
                    "same shape)")
            raise GraphSafeError(f"the prompt ({prompt_len} tokens) is longer than prefill_bucket="
                                 f"{self.prefill_bucket}, {what}: build the decoder for the "
                                 "longest prompt it will serve (or with a larger prefill_bucket)")
        if self._fingerprint is not None and self.cache.fingerprint() != self._fingerprint:
            raise GraphSafeError(
                "the cache's buffers were reallocated or rebound since the graph was captured: "
                "replay would write into the old buffers. Never rebind cache tensors; use "
                "cache.reset(). Build a new GraphSafeDecoder."
            )
        self._check_weights()
        return max_new_tokens

    def copied_from(self, source) -> None:
        """Say that ``self.model`` is a copy of ``source`` (a builder's fused copy):
        ``kvlab.decode`` then holds the decoder against ``source``, and any edit of ``source``, in
        place too, is refused, since the copy would not see it."""
        self.source = source
        self._source_frozen = frozen_state(source)

    def _check_weights(self) -> None:
        """Refuse a decode after anything the graphs or the copy froze moved
        (``kvlab.frozen_state``). The graphs read the model's weights by address, so an in-place
        edit of them reaches the next replay and is allowed; what this cannot see is listed in
        ``kvlab.frozen_state``."""
        if self._frozen is not None:
            check_unchanged(self._frozen, self.model, "this GraphSafeDecoder")
        if self._source_frozen is not None:
            check_unchanged(self._source_frozen, self.source, "this decoder's copy of the model")

    @contextlib.contextmanager
    def _emptied_if_stopped(self):
        """A call stopped past its checks (``on_token`` raised, an interrupt) leaves the counter
        after tokens the caller never got: empty the cache, so that ``decode_steps`` refuses rather
        than continue from there."""
        try:
            yield
        except BaseException:
            self.cache.set_position(0)
            raise

    def capture_graph(self, fn, static: torch.Tensor):
        """Capture ``fn(static)`` and undo the warm-up calls' side effects in place: counter, token,
        slots."""
        if not self.cache.is_initialized:
            raise GraphSafeError("capture before the cache is initialized: run a prefill (or "
                                 "cache.early_initialization) first")
        position, token = self.cache.cache_position.clone(), self.token.clone()
        try:
            graph = capture(fn, static, warmup=self.warmup, emulate=self.emulate)
        finally:
            # warm-ups advanced the counter: put it back, in place
            self.cache.set_position(position)
            self.token.copy_(token)
            start = int(position)
            end = self.max_cache_len  # the trash slot keeps its garbage: nothing reads it
            # and erase what they wrote past it (the mask hid it; now it is gone)
            for layer in self.cache.layers:
                layer.keys[:, :, start:end].zero_()
                layer.values[:, :, start:end].zero_()
        self.cache.frozen = True
        self._fingerprint = self.cache.fingerprint()
        self._frozen = frozen_state(self.model, versions=False)  # what the replays read
        return graph

    def next_tokens(self, n: int) -> torch.Tensor:
        """The next ``n`` (<= steps) tokens ``[batch, n]``: one replay of the n-step graph (captured
        on first use)."""
        if not self.use_graph:
            return self.multi_step(n)(self.token)
        if n not in self.graphs:
            self.graphs[n] = self.capture_graph(self.multi_step(n), self.token)
        return self.graphs[n].replay()

    # ---- generation
    # --------------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Reset the cache (in place) and prefill ``input_ids``; returns the first new token
        ``[batch, 1]`` (a copy: the static buffer ``token`` is overwritten by the next step)."""
        with one_call(self.cache, GraphSafeError, "decoder", "prefill"):
            self._check(input_ids, 1)
            with self._emptied_if_stopped(), self.cache.unchecked():  # room was checked above
                return self._prefill(input_ids).clone()

    def _prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        self.cache.reset()
        if self.prefill_bucket is None and self.prefill_fn is not None:
            self.valid.fill_(input_ids.shape[1])
            return self.padded_prefill(input_ids)  # unpadded: every row is valid
        if self.prefill_bucket is None:
            logits = self.model(input_ids=input_ids, cache=self.cache, use_cache=True,
                                logits_to_keep=1).logits
            self.token.copy_(greedy(logits))
            return self.token
        self.prompt.zero_()
        self.prompt[:, : input_ids.shape[1]].copy_(input_ids)  # padded to the bucket, in place
        self.valid.fill_(input_ids.shape[1])
        if not self.use_graph:
            return self.padded_prefill(self.prompt)
        if self.prefill_graph is None:
            if not self.cache.is_initialized:
                self.padded_prefill(self.prompt)  # eager, allocates the buffers
                self.cache.reset()
            self.prefill_graph = self.capture_graph(self.padded_prefill, self.prompt)
        self.prefill_graph.replay()
        return self.token

    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, *,
                 on_token: OnToken = None) -> torch.Tensor:
        """Greedy-decode ``max_new_tokens`` after ``input_ids`` [batch, prompt_len]; returns
        ``[batch, max_new_tokens]``. One call at a time (``on_token`` may not call it again)."""
        with one_call(self.cache, GraphSafeError, "decoder", "generate"):
            return self._generate(input_ids, max_new_tokens, on_token=on_token)

    @torch.inference_mode()
    def _generate(self, input_ids: torch.Tensor, max_new_tokens: int, *,
                  on_token: OnToken = None) -> torch.Tensor:
        max_new_tokens = self._check(input_ids, max_new_tokens)
        out = torch.empty(self.batch, max_new_tokens, dtype=torch.long, device=self.device)
        # room was checked above, once for every step: no host sync per step
        with self._emptied_if_stopped(), self.cache.unchecked():
            out[:, :1].copy_(self._prefill(input_ids))
            if on_token is not None:
                on_token(0, out[:, :1].clone())  # the caller's copy
            made = 1
            while made < max_new_tokens:
                n = min(self.steps, max_new_tokens - made)
                # replay: n new tokens, no host sync
                out[:, made : made + n].copy_(self.next_tokens(n))
                if on_token is not None:
                    for k in range(made, made + n):
                        on_token(k, out[:, k : k + 1].clone())  # the caller's copy
                made += n
        return out

    @torch.inference_mode()
    def decode_steps(self, n: int) -> torch.Tensor:
        """``n`` more tokens ``[batch, n]`` after what the cache holds (after ``prefill``): one host
        read of the counter first, then replays with no sync. Refuses steps past ``max_cache_len``:
        their keys and values would go to the trash slot and the tokens be garbage."""
        with one_call(self.cache, GraphSafeError, "decoder", "decode_steps"):
            return self._decode_steps(count(n, "n"))

    def _decode_steps(self, n: int) -> torch.Tensor:
        self._check_weights()
        used = int(self.cache.cache_position)
        if used == 0:  # the token buffer holds no prompt's next token
            raise GraphSafeError("the cache is empty: decode_steps continues a prompt, so call "
                                 "decoder.prefill(input_ids) first (or decoder.generate). A call "
                                 "that stopped early (on_token raised, an interrupt) empties it.")
        if used + n > self.max_cache_len:
            raise GraphSafeError(
                f"the cache holds {used} of {self.max_cache_len} tokens: {n} more steps would "
                "decode garbage. prefill a prompt again, or build the decoder with a larger "
                "max_cache_len."
            )
        out = torch.empty(self.batch, n, dtype=torch.long, device=self.device)
        with self._emptied_if_stopped(), self.cache.unchecked():
            made = 0
            while made < n:
                k = min(self.steps, n - made)
                out[:, made : made + k].copy_(self.next_tokens(k))
                made += k
        return out

    def step(self) -> torch.Tensor:
        """One decode step by hand, after ``prefill``: returns the new token ``[batch, 1]``
        (``decode_steps(1)``)."""
        return self.decode_steps(1)

    def describe(self) -> str:
        graphs = [f"{n}-step graph: {g.describe()}" for n, g in sorted(self.graphs.items())]
        if self.prefill_graph is not None:
            graphs.insert(0, f"prefill graph: {self.prefill_graph.describe()}")
        how = "; ".join(graphs) if graphs else ("not captured yet" if self.use_graph
                                                else "eager (no graph)")
        return (f"GraphSafeDecoder(batch={self.batch}, max_cache_len={self.max_cache_len}, "
                f"step={_function_name(self.step_fn)}, steps={self.steps}): {how}")


def _function_name(fn) -> str:
    """A step's name, as ``describe`` shows it: a partial's function; a compiled one says so."""
    inner = getattr(fn, "func", fn)  # functools.partial binds a step's extra state
    name = getattr(inner, "__name__", type(inner).__name__)
    return f"{name} (compiled)" if hasattr(inner, "_torchdynamo_orig_callable") else name


def cache_length(input_ids: torch.Tensor, max_new_tokens: int, max_cache_len: int | None = None,
                 cache: GraphSafeStaticCache | None = None) -> int | GraphSafeStaticCache:
    """The cache of a decoder built for one call, as ``GraphSafeDecoder`` takes it: a given
    ``cache``, else ``max_cache_len``, else prompt + new tokens."""
    if cache is not None:
        if not isinstance(cache, GraphSafeStaticCache):
            raise TypeError("cache must be a kvlab GraphSafeStaticCache, got "
                            f"{type(cache).__name__}: a vanilla StaticCache is lesson 04's "
                            "'static-graph' strategy")
        return cache
    return input_ids.shape[1] + max_new_tokens if max_cache_len is None else max_cache_len


def prompt_bucket(prompt_len: int, max_cache_len: int) -> int:
    """The padded prefill length for a prompt of ``prompt_len`` tokens: the next power of two, at
    most the cache. Prompts of lengths in (T/2, T] share the bucket T, so a few captured prefills
    serve every length."""
    return min(1 << (prompt_len - 1).bit_length(), max_cache_len)


def graph_safe_decoder(model, input_ids: torch.Tensor, max_new_tokens: int, *,
                       max_cache_len: int | None = None,
                       cache: GraphSafeStaticCache | None = None, graph: bool | str = True,
                       prefill_bucket: int | None = None) -> GraphSafeDecoder:
    """The decoder ``decode_graph_safe`` builds for one call: batch and cache from the call
    (``cache_length``), lesson 05's step. Pass it back as ``decoder=`` to replay its graphs in later
    calls."""
    length = cache_length(input_ids, max_new_tokens, max_cache_len, cache)
    return GraphSafeDecoder(model, length, input_ids.shape[0], graph=graph,
                            prefill_bucket=prefill_bucket)


def decode_graph_safe(model, input_ids: torch.Tensor, max_new_tokens: int, *,
                      on_token: OnToken = None,
                      decoder: GraphSafeDecoder | None = None, **settings) -> torch.Tensor:
    """The ``"graph-safe"`` strategy: eager prefill, the decode step captured once (one step per
    graph), replayed.

    ``decoder``: replay this GraphSafeDecoder's graphs (its own settings). Otherwise one is built
    for this call (``graph_safe_decoder(model, ..., **settings)``: ``max_cache_len``, ``cache``,
    ``graph``, ``prefill_bucket``).
    """
    if decoder is None:
        decoder = graph_safe_decoder(model, input_ids, max_new_tokens, **settings)
    return decoder_for(decoder, model).generate(input_ids, max_new_tokens, on_token=on_token)


def decoder_for(decoder: GraphSafeDecoder, model) -> GraphSafeDecoder:
    """``decoder``, refused when it was built for another model (its graphs would decode with that
    one's weights)."""
    if not isinstance(decoder, GraphSafeDecoder):
        raise TypeError(f"decoder= takes a GraphSafeDecoder (STRATEGIES[name].state(...)), got "
                        f"{type(decoder).__name__}")
    if decoder.source is not model:
        raise GraphSafeError("this decoder was built for another model: its graphs would decode "
                             "with that model's weights. Pass the decoder built for this model, or "
                             "none (one is built for the call)")
    return decoder

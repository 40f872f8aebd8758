"""Continuous batching over a paged KV cache, its decode steps replayed from captured graphs
(lesson 07).

A server cannot wait for a whole batch to finish before starting the next: requests arrive at any
time, with prompts of any length, and each wants its own number of tokens.
``ContinuousBatcher.serve`` runs vLLM's loop, one scheduler step at a time:

1. *join*: requests that have arrived take a free row (FIFO) if the pool can hold their longest
   length; each is prefilled on its own, eagerly (a captured prefill would need one graph per prompt
   length bucket; vLLM and SGLang capture only decode too), which writes its prompt into its blocks
   and makes its first token;
2. *decode*: every running request gets one more token in ONE replay of the graph captured for the
   smallest batch-size bucket (1, 2, 4, 8, ...) that holds them, padded up with padding rows that
   write only to the trash slot; a request that grows past its last block gets a new one first
   (``BlockAllocator``);
3. *leave*: finished requests free their blocks, and the rows behind them move up (vLLM's
   "condense"), so that the running requests always sit in rows ``0 .. n-1``.

Before each replay the static buffers are refilled in place, with ONE host-to-device copy:
``step_inputs`` ``[max_batch, 3 + max_blocks_per_request]`` holds each row's position, length after
the write (``seq_lens``), write slot (``slot_mapping``) and block-table row;
``tokens [max_batch, 1]`` is the step's input and output, so a request's next input is already in
its row (a new request's first token is copied in). The mask is computed inside the graph from
``seq_lens`` (``paged_mask``), so it needs no copy. Nothing here reads a token on the host between
steps.

Admission is conservative: a request joins only when the pool's FREE blocks hold its worst case
(prompt + new tokens) beside what the running requests may still take, so a running request never
finds the pool empty; its blocks are still handed out one at a time as it grows, which is what the
memory accounting shows. vLLM admits optimistically and preempts (recomputes or swaps out) a request
when the pool runs dry. ``serve`` frees its requests' blocks on every exit (an exception in
``on_token``, a ``KeyboardInterrupt``), so the batcher serves again afterwards. Arrival steps count
on the caller's clock: a stretch with nothing running and nobody arrived is skipped, not stepped
through. Greedy decoding only; the caller owns the batcher (its cache, buffers and graphs): nothing
is stored on the model.
"""

from __future__ import annotations

import numbers
from collections import deque
from dataclasses import dataclass, field

import torch

from .decoding import OnToken, check_inputs, check_model
from .frozen_state import check_unchanged, frozen_state
from .graphs import EagerStep, capture, check_capturable_rope
from .paged_cache import (
    BlockAllocator,
    OutOfBlocksError,
    PagedCacheError,
    PagedKVCache,
    blocks_for,
    bytes_per_token,
    model_mask,
    paged_mask,
    slots_of,
    table_row,
)
from .runtime import count, one_call


@dataclass
class Request:
    """One request: its prompt ``[prompt_len]`` (long), how many tokens it wants, and the step it
    arrives at."""

    prompt: torch.Tensor
    max_new_tokens: int
    arrival: int = 0


@dataclass
class _Running:
    """The host-side state of an admitted request (its row is its index in the running list)."""

    index: int  # position in the requests given to serve
    blocks: list[int]  # its blocks, in logical order
    length: int  # tokens in the cache
    made: int  # tokens generated so far
    wants: int  # max_new_tokens
    reserved: int  # blocks promised to it (its worst case)


@dataclass
class Served:
    """What ``serve`` returns: each request's tokens ``[max_new_tokens]`` (in the order given) and a
    per-step ``timeline`` of dicts: step, joined and left (request indices), rows, bucket,
    blocks_used, paged_bytes, lengths."""

    tokens: list[torch.Tensor]
    timeline: list[dict] = field(default_factory=list)
    static_bytes: int = 0  # a static cache of max_batch rows, each sized for the longest request


def _positive_int(name: str, value) -> int:
    """``value`` as a Python int where it is a positive integer (a NumPy or 0-d tensor one too),
    else a ValueError naming ``name``."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
        value = value.item()
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r:.80}")
    return int(value)


def _refuse_settings(settings: dict, accepted, where: str, fixed: dict | None = None) -> None:
    """Refuse keywords ``where`` does not take, by the caller's names: a TypeError listing what it
    takes; a keyword of ``fixed`` (name -> why it is set for the caller) says how to set it
    instead."""
    for name in settings:
        if fixed and name in fixed:
            raise TypeError(f"{where} sets {name}= itself ({fixed[name]}); drop {name}=")
    unknown = [name for name in settings if name not in accepted]
    if unknown:
        raise TypeError(f"{where} got unknown keyword{'s' if len(unknown) > 1 else ''} "
                        f"{', '.join(f'{n}=' for n in unknown)}; it takes "
                        f"{', '.join(f'{n}=' for n in accepted)}")


_BATCHER_SETTINGS = ("num_blocks", "block_size", "max_batch", "max_blocks_per_request", "buckets",
                    "graph", "warmup", "emulate")


def default_buckets(max_batch: int) -> list[int]:
    """Batch sizes that get a captured graph: powers of two below ``max_batch``, and
    ``max_batch``."""
    return sorted({1 << k for k in range(max_batch.bit_length())
                   if 1 << k < max_batch} | {max_batch})


class ContinuousBatcher:
    """Serve requests with continuous batching: a ``PagedKVCache`` of ``num_blocks`` blocks, rows
    for ``max_batch`` requests, one captured decode graph per bucket of ``buckets`` (captured on
    first use).

    ``max_blocks_per_request``: the block-table width (default: every block), so a request holds at
    most ``max_blocks_per_request * block_size`` tokens. ``graph=False`` runs the same step eagerly;
    ``emulate=True`` (or ``graph="emulate"``, as ``GraphSafeDecoder`` takes it) forces the CPU
    emulation of capture on a GPU too (``kvlab.graphs.capture``).
    """

    def __init__(self, model, *, num_blocks: int, block_size: int = 16, max_batch: int = 8,
                 max_blocks_per_request: int | None = None, buckets=None,
                 graph: bool | str = True,
                 warmup: int = 2, emulate: bool | None = None):
        check_model(model)
        max_batch = _positive_int("max_batch", max_batch)
        if buckets is not None:
            if isinstance(buckets, str | bytes) or not hasattr(buckets, "__iter__"):
                raise ValueError(f"buckets must be a list of batch sizes, got {buckets!r:.80}")
            buckets = [_positive_int("each of buckets", b) for b in buckets]
        buckets = default_buckets(max_batch) if buckets is None else sorted(set(buckets))
        if not buckets or buckets[-1] != max_batch:
            raise ValueError("buckets must be positive batch sizes whose largest is "
                             f"max_batch={max_batch}, got {buckets}")
        warmup = count(warmup, "warmup", minimum=0)
        if emulate is not None and not isinstance(emulate, bool):  # "no" would force emulation
            raise ValueError(f"emulate must be True, False or None, got {emulate!r:.80}")
        num_blocks, block_size = (_positive_int("num_blocks", num_blocks),
                                  _positive_int("block_size", block_size))
        if max_blocks_per_request is not None:
            max_blocks_per_request = _positive_int("max_blocks_per_request", max_blocks_per_request)
        param = next(model.parameters())
        self.model, self.device, self.dtype = model, param.device, param.dtype
        if isinstance(graph, str) and graph == "emulate":
            if emulate is False:
                raise ValueError("graph='emulate' with emulate=False: pass one of the two")
            graph, emulate = True, True
        if not isinstance(graph, bool):
            raise ValueError(f"graph must be True, False or 'emulate', got {graph!r}")
        if graph:
            check_capturable_rope(model, "a ContinuousBatcher (strategy 'paged')",
                                  "pass graph=False (its steps run eagerly)")
        self.max_batch, self.buckets, self.use_graph, self.warmup, self.emulate = (
            max_batch, buckets, graph, warmup, emulate)
        width = num_blocks if max_blocks_per_request is None else max_blocks_per_request
        self.cache = PagedKVCache(model.config, num_blocks=num_blocks, block_size=block_size,
                                  max_blocks_per_request=width, dtype=self.dtype,
                                  device=self.device)
        self.allocator = BlockAllocator(num_blocks)
        self.block_size, self.width = block_size, width
        self.sized_by_length = False  # True where paged_batcher sized it from max_cache_len=
        # the static buffers: refilled in place before every replay, never rebound
        with torch.inference_mode(False):
            # [max_batch, 1] in AND out
            self.tokens = torch.zeros(max_batch, 1, dtype=torch.long, device=self.device)
            # [max_batch, 3 + width]: position | seq_len after the write | write slot
            # | block-table row
            self.step_inputs = torch.zeros(max_batch, 3 + width, dtype=torch.long,
                                           device=self.device)
        self.graphs: dict[int, object] = {}  # bucket -> captured step
        self._pools = None  # the cache pools' addresses a captured graph reads
        # what the steps read: at build, again at capture
        self._frozen = frozen_state(model, versions=False)

    def __reduce_ex__(self, protocol):
        raise TypeError("a ContinuousBatcher cannot be pickled or copied: its captured graphs read "
                        "its cache and buffers by address. Build a new one")

    # ---- the static buffers ----------------------------------------------------------------------
    def views(self, bucket: int) -> tuple[torch.Tensor, ...]:
        """The first ``bucket`` rows of the static inputs: positions [b, 1], seq_lens [b],
        slot_mapping [b, 1], block_table [b, width] (views of ``step_inputs``: the same memory at
        every replay)."""
        rows = self.step_inputs[:bucket]
        return rows[:, 0:1], rows[:, 1], rows[:, 2:3], rows[:, 3:]

    def fill(self, running: list[_Running], bucket: int) -> None:
        """Refill the first ``bucket`` rows of ``step_inputs`` in place, in one copy: the running
        requests' rows, then padding rows (position 0, length 1, the trash slot, block 0: they read
        slot 0 and write nowhere that is read)."""
        rows = [[r.length, r.length + 1,
                 slots_of(r.blocks, r.length, r.length + 1, self.block_size)[0],
                 *table_row(r.blocks, self.width)] for r in running]
        rows += [[0, 1, self.cache.trash_slot] + [0] * self.width] * (bucket - len(running))
        self.step_inputs[:bucket].copy_(torch.tensor(rows, dtype=torch.long))

    # ---- the steps -------------------------------------------------------------------------------
    def decode_step(self, bucket: int):
        """The function captured for ``bucket`` rows: reads ``tokens[:bucket]`` and the static
        inputs, writes each row's next token into ``tokens``. Device ops only (no host sync): it is
        captured."""
        model, cache = self.model, self.cache
        positions, seq_lens, slot_mapping, block_table = self.views(bucket)

        def step(tokens: torch.Tensor) -> torch.Tensor:
            # [bucket, 1, 1, max_len]
            mask = model_mask(paged_mask(seq_lens, 1, cache.max_len), model)
            # its own allocator's ids
            with cache.reading(block_table, slot_mapping, check_ids=False):
                logits = model(input_ids=tokens, position_ids=positions, attention_mask=mask,
                               cache=cache, use_cache=True).logits  # [bucket, 1, vocab]
            tokens.copy_(logits[:, -1, :].argmax(dim=-1, keepdim=True))
            return tokens

        return step

    def graph_for(self, bucket: int):
        """The captured step of ``bucket`` rows, captured on first use. Its warm-up calls run with
        every row a padding row (they write only the trash slot), and the tokens they overwrote are
        put back."""
        if bucket in self.graphs:
            return self.graphs[bucket]
        saved = self.tokens.clone()
        self.fill([], bucket)
        fn = self.decode_step(bucket)
        if self.use_graph:
            graph = capture(fn, self.tokens[:bucket], warmup=self.warmup, emulate=self.emulate)
        else:
            graph = EagerStep(fn, self.tokens[:bucket], warmup=0)
        self.tokens.copy_(saved)
        self.graphs[bucket] = graph
        self._pools = self.cache.pool_addresses()
        self._frozen = frozen_state(self.model, versions=False)
        return graph

    def prefill(self, run: _Running, prompt: torch.Tensor) -> torch.Tensor:
        """Eager prefill of one request into its blocks (batch 1, its own block-table row and slot
        mapping); returns its first token ``[1]``."""
        length = prompt.shape[0]
        table = torch.tensor([table_row(run.blocks, self.width)], device=self.device)  # [1, width]
        # [1, P]
        slots = torch.tensor([slots_of(run.blocks, 0, length, self.block_size)], device=self.device)
        mask = model_mask(paged_mask(torch.tensor([length], device=self.device), length,
                                     self.cache.max_len), self.model)
        positions = torch.arange(length, device=self.device)[None]  # [1, P]
        with self.cache.reading(table, slots, check_ids=False):
            logits = self.model(input_ids=prompt[None], position_ids=positions, attention_mask=mask,
                                cache=self.cache,
                                use_cache=True, logits_to_keep=1).logits  # [1, 1, vocab]
        return logits[0, -1:].argmax(dim=-1)

    # ---- the scheduler ---------------------------------------------------------------------------
    def serve(self, requests: list[Request], *, on_token=None) -> Served:
        """Greedy-decode every request (see the module docstring);
        ``on_token(request_index, k, token [1])`` is called for each new token (a device tensor:
        reading it on the host syncs). Returns ``Served``. One call at a time (``on_token`` may
        not call it again)."""
        with one_call(self, PagedCacheError, "batcher", "serve"):
            return self._serve(requests, on_token=on_token)

    @torch.inference_mode()
    def _serve(self, requests: list[Request], *, on_token=None) -> Served:
        requests = self.check(requests)  # read once: on_token may change the caller's
        arrivals = [r.arrival for r in requests]
        waiting = deque(sorted(range(len(requests)), key=lambda i: (arrivals[i], i)))
        running: list[_Running] = []
        made: list[list[torch.Tensor]] = [[] for _ in requests]
        token_bytes = bytes_per_token(self.model.config, self.dtype)
        longest = max(r.prompt.shape[-1] + r.max_new_tokens - 1 for r in requests)
        served = Served(tokens=[], static_bytes=self.max_batch * longest * token_bytes)
        step = 0

        def emit(run: _Running, token: torch.Tensor) -> None:
            made[run.index].append(token)
            if on_token is not None:
                on_token(run.index, run.made, token.clone())  # the caller's copy
            run.made += 1

        try:
            while waiting or running:
                if not running and arrivals[waiting[0]] > step:
                    step = arrivals[waiting[0]]  # nothing runs until the next arrival: skip to it
                joined, left = [], []
                while waiting and arrivals[waiting[0]] <= step and len(running) < self.max_batch:
                    req = requests[waiting[0]]
                    length = req.prompt.shape[-1]
                    need = blocks_for(length + req.max_new_tokens - 1, self.block_size)
                    # blocks running requests may take
                    promised = sum(r.reserved - len(r.blocks) for r in running)
                    if need > self.allocator.num_free - promised:
                        if not running:  # nobody will free a block: waiting would never end
                            raise OutOfBlocksError(
                                f"request {waiting[0]} needs {need} blocks but only "
                                f"{self.allocator.num_free} of the pool's "
                                f"{self.allocator.num_blocks} are free and no request of this "
                                "serve holds any: blocks were taken from batcher.allocator outside "
                                "serve. Free them, or build a new ContinuousBatcher")
                        # FIFO: it waits for running requests to leave (no request overtakes it)
                        break
                    index = waiting.popleft()
                    run = _Running(index, [], length, 0, req.max_new_tokens, need)
                    running.append(run)  # from here its blocks are freed on every exit
                    run.blocks = self.allocator.allocate(blocks_for(length, self.block_size))
                    first = self.prefill(run, req.prompt.reshape(-1))  # [1]
                    self.tokens[len(running) - 1].copy_(first)  # its row's next input
                    joined.append(index)
                    emit(run, first)
                self.leave(running, left)
                bucket = None
                if running:
                    # the token written this step goes at position run.length: a new block?
                    for run in running:
                        if run.length + 1 > len(run.blocks) * self.block_size:
                            run.blocks += self.allocator.allocate(1)
                    bucket = next(b for b in self.buckets if b >= len(running))
                    graph = self.graph_for(bucket)
                    self.fill(running, bucket)
                    graph.replay()  # one token for every row, no host sync
                    new = self.tokens[: len(running), 0].clone()  # [rows]
                    for row, run in enumerate(running):
                        run.length += 1
                        emit(run, new[row : row + 1])
                    rows = len(running)
                    self.leave(running, left)
                else:
                    rows = 0
                served.timeline.append({
                    "step": step, "joined": joined, "left": left, "rows": rows, "bucket": bucket,
                    "blocks_used": self.allocator.num_used,
                    "paged_bytes": self.allocator.num_used * self.cache.block_bytes,
                    "lengths": [r.length for r in running]})
                step += 1
        finally:  # an exception or an interrupt: the unfinished requests give their blocks back
            for run in running:
                self.allocator.free(run.blocks)
        served.tokens = [torch.cat(pieces) for pieces in made]
        return served

    def leave(self, running: list[_Running], left: list[int]) -> None:
        """Drop the finished requests: free their blocks, move the rows behind them up (their next
        tokens too)."""
        keep = [row for row, run in enumerate(running) if run.made < run.wants]
        if len(keep) == len(running):
            return
        if keep:
            # condense: one gather
            self.tokens[: len(keep)] = self.tokens[torch.tensor(keep, device=self.device)]
        finished = [run for run in running if run.made >= run.wants]
        running[:] = [running[row] for row in keep]
        for run in finished:
            self.allocator.free(run.blocks)
            left.append(run.index)

    # ---- the door --------------------------------------------------------------------------------
    def check(self, requests: list[Request]) -> list[Request]:
        """Refuse, before anything runs: requests that are not ``Request``s, prompts that are not
        1-D token ids of the model's vocabulary on its device, a request longer than a block-table
        row or the whole pool, a pool that was reallocated or weights that moved since the graphs
        were captured. Returns the requests as read here (prompts copied, counts and arrival steps
        as Python ints): serve uses only these, so a request changed while it waits changes
        nothing."""
        read = read_requests(self.model, requests)
        for i, r in enumerate(read):
            # the last token is never written to the cache
            length = r.prompt.shape[0] + r.max_new_tokens - 1
            need = blocks_for(length, self.block_size)
            if length > self.cache.max_len or need > self.allocator.num_blocks:
                fix = (f"build the state with max_cache_len >= {length} (STRATEGIES['paged']"
                       ".state(..., max_cache_len=))" if self.sized_by_length else
                       "build the batcher with more blocks (num_blocks=, max_blocks_per_request=)")
                raise PagedCacheError(
                    f"request {i} needs {length} slots ({need} blocks of {self.block_size}), but a "
                    f"request may hold {self.cache.max_len} slots ({self.width} blocks) and the "
                    f"pool has {self.allocator.num_blocks} blocks: {fix} or ask for fewer tokens")
        if self._pools is not None and self._pools != self.cache.pool_addresses():
            raise PagedCacheError("the cache's pools moved since the graphs were captured: a "
                                  "replay would read the old memory. Build a new ContinuousBatcher")
        if self._frozen is not None:
            check_unchanged(self._frozen, self.model, "this ContinuousBatcher")
        return read


def read_requests(model, requests: list[Request]) -> list[Request]:
    """``requests`` as serve reads them, once: a non-empty list of ``Request``s whose prompts are
    1-D token ids of ``model``'s vocabulary on its device, with whole counts and arrival steps.
    Returns copies (prompts cloned, Python ints), so that a request changed later changes
    nothing; else a TypeError or ValueError naming the request."""
    if (not isinstance(requests, list | tuple) or not requests
            or not all(isinstance(r, Request) for r in requests)):
        raise TypeError("serve takes a non-empty list of "
                        "kvlab.continuous_batching.Request(prompt, max_new_tokens, arrival), "
                        f"got {requests!r:.80}")
    read = []
    for i, r in enumerate(requests):
        prompt = r.prompt
        if (not isinstance(prompt, torch.Tensor) or prompt.dim() != 1
                or prompt.dtype != torch.long):
            cast = (f"{prompt.dtype} (token ids held as another dtype: convert them with "
                    "prompt.long())" if isinstance(prompt, torch.Tensor) and prompt.dim() == 1
                    else tuple(getattr(prompt, 'shape', ())) or type(prompt).__name__)
            raise ValueError(f"request {i}: prompt must be a 1-D LongTensor [prompt_len], got "
                             f"{cast}")
        try:
            check_inputs(model, prompt[None], r.max_new_tokens, name="prompt")
        except ValueError as e:
            raise ValueError(f"request {i}: {e}") from None
        arrival = (r.arrival.item()
                   if isinstance(r.arrival, torch.Tensor) and r.arrival.numel() == 1
                   else r.arrival)
        if (not isinstance(arrival, numbers.Integral) or isinstance(arrival, bool)
                or arrival < 0):
            raise ValueError(f"request {i}: arrival must be a scheduler step number >= 0 (an "
                             f"int), got {r.arrival!r:.80}")
        read.append(Request(prompt.clone(), int(r.max_new_tokens), int(arrival)))
    return read


def serve(model, requests: list[Request], *, on_token=None, **settings) -> Served:
    """Build a ``ContinuousBatcher(model, **settings)`` and serve ``requests`` with it (see its
    docstring)."""
    _refuse_settings(settings, _BATCHER_SETTINGS, "serve")
    if "num_blocks" not in settings:
        raise TypeError("serve needs num_blocks=, the blocks of the batcher's pool (block_size= "
                        "tokens each): enough for the requests that run at once, e.g. "
                        "num_blocks=sum(blocks_for(len(r.prompt) + r.max_new_tokens - 1, "
                        "block_size) for r in requests)")
    return ContinuousBatcher(model, **settings).serve(requests, on_token=on_token)


# ----------------------------------------------------------------------------- the "paged" strategy

_PAGED_SETTINGS = "max_cache_len", "block_size", "graph", "warmup", "emulate", "buckets"
_PAGED_FIXED = {"num_blocks": "batch x blocks of max_cache_len: pass max_cache_len=",
                "max_batch": "the batch of input_ids",
                "max_blocks_per_request": "from max_cache_len=",
                "max_batch_size": "the batch of input_ids"}


def paged_batcher(model, input_ids: torch.Tensor, max_new_tokens: int, *,
                  max_cache_len: int | None = None, block_size: int = 16, **settings) -> dict:
    """What ``decode_paged`` builds for one call, as the keywords that hand it over
    (``{"batcher": ...}``): a batcher of ``batch`` rows whose pool holds every row at
    ``max_cache_len`` (default prompt + new tokens). ``settings``: ``graph``, ``warmup``,
    ``emulate``, ``buckets`` of ``ContinuousBatcher`` (its pool and rows are sized here, from the
    batch and ``max_cache_len``)."""
    _refuse_settings(settings, _PAGED_SETTINGS, "the paged strategy", fixed=_PAGED_FIXED)
    block_size = _positive_int("block_size", block_size)
    # slots a row writes (the last token is never written)
    written = input_ids.shape[1] + max_new_tokens - 1
    if max_cache_len is None:
        length = input_ids.shape[1] + max_new_tokens
    else:
        length = _positive_int("max_cache_len", max_cache_len)
        if length < written:
            raise ValueError(f"max_cache_len={max_cache_len} is too short for a prompt of "
                             f"{input_ids.shape[1]} tokens and {max_new_tokens} new tokens: the "
                             f"cache holds {written} of them (prompt + max_new_tokens - 1). Pass "
                             f"max_cache_len >= {written}, or none")
    width = blocks_for(length, block_size)
    batch = input_ids.shape[0]
    batcher = ContinuousBatcher(model, num_blocks=batch * width, block_size=block_size,
                                max_batch=batch, max_blocks_per_request=width, **settings)
    batcher.sized_by_length = True  # its blocks come from max_cache_len=: check() says so
    return {"batcher": batcher}


def decode_paged(model, input_ids: torch.Tensor, max_new_tokens: int, *, on_token: OnToken = None,
                 batcher: ContinuousBatcher | None = None, **settings) -> torch.Tensor:
    """The ``"paged"`` strategy: each row of ``input_ids`` is a request arriving at step 0, served
    by ``batcher`` (else ``paged_batcher(model, ..., **settings)``); returns
    ``[batch, max_new_tokens]``. ``on_token(k, [batch, 1])`` is called once every row has its token
    ``k``."""
    if batcher is None:
        # kvlab.decode's keywords named too, where paged_batcher's message would not
        _refuse_settings(settings, ("on_token", "batcher") + _PAGED_SETTINGS, "strategy 'paged'",
                         fixed=_PAGED_FIXED)
        batcher = paged_batcher(model, input_ids, max_new_tokens, **settings)["batcher"]
    elif not isinstance(batcher, ContinuousBatcher):
        raise TypeError("batcher= takes a kvlab ContinuousBatcher (from "
                        f"kvlab.STRATEGIES['paged'].state(...)), got a {type(batcher).__name__}")
    elif settings:
        raise ValueError(f"pass batcher= or {', '.join(f'{s}=' for s in settings)}, not both: a "
                         "ContinuousBatcher keeps the cache and settings it was built with")
    elif batcher.model is not model:
        raise PagedCacheError("this batcher was built for another model: its graphs would decode "
                              "with that model's weights. Pass the batcher built for this model, "
                              "or none")
    batch = input_ids.shape[0]
    if batch > batcher.max_batch:
        raise PagedCacheError(f"the batcher has {batcher.max_batch} rows, got a batch of {batch}: "
                              "build another")
    pending: dict[int, dict[int, torch.Tensor]] = {}

    def collect(index: int, k: int, token: torch.Tensor) -> None:
        column = pending.setdefault(k, {})
        column[index] = token
        if len(column) == batch:
            on_token(k, torch.stack([column[i] for i in range(batch)]))  # [batch, 1]
            del pending[k]

    served = batcher.serve([Request(row, max_new_tokens) for row in input_ids],
                           on_token=collect if on_token is not None else None)
    return torch.stack(served.tokens)

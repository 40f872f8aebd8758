"""Lesson 04's failures: every way a vanilla ``transformers.StaticCache`` goes wrong under capture
and replay.

Each scenario is a function ``fn(model, prompt_ids, max_new_tokens, *, runner="graph", ...) ->
FailureResult`` that decodes greedily the way a user would first write it, records what the cache
holds after every step, and compares the tokens with an eager StaticCache run (``reference``), which
is token-exact against the naive loop.

``runner``: ``"graph"`` (a real CUDA graph on a GPU, kvlab.graphs' emulation elsewhere),
``"emulated"`` (always the emulation), ``"eager"`` (nothing captured) or ``"compiled"``
(``torch.compile``, whose guards re-check the Python state at every call: it fails exactly where
eager code fails). Two kinds of failure:

- *state* failures (padding pollution, warm-up side effects, a reset out of range, drifting
  counters) come from what the calls did to the cache: eager code that makes the same calls fails
  the same way;
- *frozen* failures (a re-created cache, a rebound counter, a Python int) come from what capture
  froze: eager code would be right, only the replayed graph is wrong.

Every write that could land past the end of the cache is checked on the host first (``room_guard``),
so that on a GPU it raises instead of becoming a device-side assert; ``guard=False`` shows the raw
error, on CPU only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .cache_view import CacheRecorder
from .decoding import OnToken, check_inputs, greedy
from .graphs import ReplayError, step_runner
from .hf_caches import check_room, decode_static, decode_step_fn, make_static_cache, require_empty

WARMUP = 3  # the warm-up calls a user copies from the CUDA-graph docs
LAYERS = (0, 1)  # layers whose slots the recorders keep


# ---------------------------------------------------------------- the first attempt, and its guard
def room_guard(cache, tokens_per_step: int = 1):
    """A host-side check for ``capture(..., before_replay=...)``: raise before any layer would write
    past its end.

    It watches the counter tensors the layers hold *when the guard is made* (make it after the
    prefill, since ``lazy_initialization`` rebinds them, and at capture time, since those are the
    tensors a graph reads). Each check syncs once, so that an out-of-range ``index_copy_`` never
    reaches a GPU, where it would be a device-side assert that kills the process's CUDA context.
    """
    watched = [
        layer.cumulative_length for layer in cache.layers if getattr(layer, "is_initialized", False)
    ]
    limit = min(
        (layer.max_cache_len for layer in cache.layers if getattr(layer, "is_initialized", False)),
        default=0,
    )

    def check() -> None:
        if not watched:
            return
        furthest = int(torch.stack([c.reshape(()) for c in watched]).max())
        if furthest + tokens_per_step > limit:
            raise ReplayError(
                "the next write would fill cache slots "
                f"{furthest}..{furthest + tokens_per_step - 1} but the cache has {limit} "
                "(max_cache_len). On a GPU that write is a device-side assert that poisons the "
                "CUDA context; kvlab stopped it on the host. The counters are not where the code "
                "expects them: see lesson 04."
            )

    return check



@torch.inference_mode()
def decode_static_graph(model, input_ids, max_new_tokens, *, on_token: OnToken = None, cache=None,
                        max_cache_len: int | None = None, warmup: int = 3, runner: str = "graph",
                        keep: dict | None = None) -> torch.Tensor:
    """The first attempt: a vanilla ``StaticCache``, an eager prefill, the decode step captured
    once and replayed for every new token. Written as most people write it first, and wrong.

    ``max_cache_len`` defaults to room for the warm-up's writes too. ``runner``: ``"graph"``,
    ``"emulated"`` or ``"eager"`` (``kvlab.graphs.step_runner``); ``keep``: a dict that receives
    ``cache`` and ``graph``.
    """
    prompt_len = input_ids.shape[1]
    if cache is None:
        cache = make_static_cache(
            model, prompt_len + max_new_tokens + warmup if max_cache_len is None else max_cache_len
        )
    require_empty(cache)
    check_room(cache, prompt_len, max_new_tokens)
    logits = model(input_ids, cache=cache).logits  # eager prefill: the cache now holds the prompt
    next_ids = greedy(logits)  # [batch, 1]
    out = [next_ids]
    if on_token is not None:
        on_token(0, next_ids)
    static_ids = next_ids.clone()  # the graph's input buffer: refilled in place before every replay
    graph = None
    if max_new_tokens > 1:
        graph = step_runner(runner, decode_step_fn(model, cache), static_ids, warmup=warmup,
                            before_replay=room_guard(cache))
    for step in range(1, max_new_tokens):
        next_ids = graph.replay().clone()  # the static output is overwritten by the next replay
        static_ids.copy_(next_ids)
        out.append(next_ids)
        if on_token is not None:
            on_token(step, next_ids)
    if keep is not None:
        keep.update(cache=cache, graph=graph)
    return torch.cat(out, dim=1)


# ---------------------------------------------------------------- the scenarios
def bucket_len(prompt_len: int, multiple: int = 32) -> int:
    """The padded size a bucketed prefill uses: the next multiple of ``multiple`` above
    ``prompt_len`` (always some padding)."""
    return (prompt_len // multiple + 1) * multiple


def slots_for(prompt_len: int, max_new_tokens: int) -> int:
    """Cache size for the scenarios: room for two padded prompts (the emulation's capture runs the
    padded prefill once more, then undoes it), two prompts' worth of decoding and the warm-up's
    writes."""
    return 2 * bucket_len(prompt_len) + 2 * max_new_tokens + 2 * WARMUP


@dataclass
class Reference:
    """An eager StaticCache run: the correct tokens and what a correct cache holds after each
    step."""

    tokens: torch.Tensor  # [batch, max_new_tokens]
    recorder: CacheRecorder
    prompt_len: int
    slots: int


@dataclass
class FailureResult:
    """What one scenario did, beside what it should have done."""

    name: str
    title: str
    cause: str
    runner: str  # the graph's describe(): real CUDA graph, EMULATED or EAGER
    prompt_len: int
    tokens: torch.Tensor  # [batch, k], k <= max_new_tokens (fewer if it stopped on an error)
    expected: torch.Tensor  # [batch, max_new_tokens]
    recorder: CacheRecorder = field(repr=False)
    expected_recorder: CacheRecorder = field(repr=False)
    error: str | None = None
    extra: dict = field(default_factory=dict, repr=False)

    @property
    def first_wrong(self) -> int | None:
        """The first step whose token differs from the correct run (or where it stopped); None if
        all are right."""
        n = min(self.tokens.shape[1], self.expected.shape[1])
        # a run stopped early has CPU placeholders
        got, want = self.tokens[:, :n].cpu(), self.expected[:, :n].cpu()
        bad = (got != want).any(dim=0).nonzero()
        if len(bad):
            return int(bad[0, 0])
        return n if (self.error is not None or n < self.expected.shape[1]) else None

    @property
    def failed(self) -> bool:
        return self.first_wrong is not None

    def heatmap(self, layer: int = 0) -> torch.Tensor:
        """``[steps, slots]`` key norms of one layer in this run."""
        return self.recorder.matrix_of(layer)

    def expected_heatmap(self, layer: int = 0) -> torch.Tensor:
        return self.expected_recorder.matrix_of(layer)

    @property
    def frontier(self) -> list[int]:
        """Slots a correct cache has filled after each step: the prompt, then one more per token."""
        return [self.prompt_len + s for s in range(self.expected.shape[1])]

    def texts(self, text, row: int = 0) -> tuple[str, str]:
        """(what this run wrote, what the correct run wrote), as ``text(ids)`` renders them (a
        tokenizer's ``decode``, or ``kvlab.lab.notebook.Lesson.text``, which shows ids for random
        weights)."""
        return text(self.tokens[row]), text(self.expected[row])

    def report(self, text=None) -> str:
        """A few lines for a notebook: runner, verdict, first wrong token, and with ``text(ids) ->
        str`` the texts."""
        lines = [f"[{self.name}] {self.title}", f"  runner: {self.runner}"]
        fw = self.first_wrong
        if fw is None:
            lines.append(f"  all {self.expected.shape[1]} tokens correct")
        else:
            lines.append(f"  first wrong token at step {fw} of {self.expected.shape[1]}")
        if self.error:
            lines.append(f"  stopped: {self.error.splitlines()[0][:300]}")
        if text is not None:
            got, want = self.texts(text)
            lines += [
                f"  got:      {got!r}" if self.tokens.numel() else "  got:      (no tokens)",
                f"  expected: {want!r}",
            ]
            if fw is not None and fw < self.tokens.shape[1]:
                lines.append(f"  first wrong token: {text(self.tokens[0, fw:fw + 1])!r} instead of "
                             f"{text(self.expected[0, fw:fw + 1])!r}")
        return "\n".join(lines)


def reference(model, prompt_ids, max_new_tokens: int, *, slots: int | None = None) -> Reference:
    """The correct run every scenario is compared with: eager StaticCache of the same size."""
    slots = slots or slots_for(prompt_ids.shape[1], max_new_tokens)
    cache = make_static_cache(model, slots)
    rec = CacheRecorder(cache, LAYERS)
    tokens = decode_static(model, prompt_ids, max_new_tokens, cache=cache, on_token=rec)
    return Reference(tokens=tokens, recorder=rec, prompt_len=prompt_ids.shape[1], slots=slots)


def rewind(cache, n: int) -> None:
    """Take back ``n`` tokens from every layer's counter, in place (undoes the warm-up's advance;
    lesson 05 does better)."""
    for layer in cache.layers:
        layer.cumulative_length.sub_(n)


def _reference_for(model, prompt_ids, n, ref, slots_needed) -> Reference:
    if ref is None:
        return reference(model, prompt_ids, n, slots=slots_needed)
    if (
        ref.tokens.shape[1] != n
        or ref.prompt_len != prompt_ids.shape[1]
        or ref.slots < slots_needed
    ):
        raise ValueError(
            f"the reference given is for another run (prompt {ref.prompt_len}, "
            f"{ref.tokens.shape[1]} tokens, {ref.slots} slots): make it with "
            f"kvlab.failures.reference(model, prompt_ids, {n})"
        )
    return ref


def _replay_loop(graph, static_ids, first_ids, n, recorder, before=None) -> str | None:
    """Feed each token back through the graph; returns the error that stopped it, if any."""
    recorder(0, first_ids)
    static_ids.copy_(first_ids)
    try:
        for step in range(1, n):
            if before is not None:
                before(step)
            next_ids = graph.replay().clone()
            static_ids.copy_(next_ids)
            recorder(step, next_ids)
    except (ReplayError, IndexError, RuntimeError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def _result(name, ref, recorder, runner_label, error=None, **extra) -> FailureResult:
    spec = SCENARIOS.get(name) or CONTROL_SPEC
    title, cause = spec["title"], spec["cause"]
    return FailureResult(
        name=name, title=title, cause=cause, runner=runner_label, prompt_len=ref.prompt_len,
        tokens=recorder.token_ids, expected=ref.tokens, recorder=recorder,
        expected_recorder=ref.recorder, error=error, extra=extra
    )


def _prefill(model, prompt_ids, cache):
    return greedy(model(prompt_ids, cache=cache).logits)  # [batch, 1]


# ----------------------------------------------------------------------------- 1. padding pollution


@torch.inference_mode()
def padding_pollution(model, prompt_ids, max_new_tokens, *, runner="graph", ref=None, bucket=None,
                      pad_id: int = 0, fix=None) -> FailureResult:
    """The prefill captured at a padded bucket size: the padding is written into the cache and
    counted.

    ``fix(cache)``: run right after the padded prefill's replay, before decoding (lesson 04's
    exercise)."""
    p, n = prompt_ids.shape[1], max_new_tokens
    bucket = bucket or bucket_len(p)
    if bucket <= p:
        raise ValueError(
            f"bucket ({bucket}) must be longer than the prompt ({p}) for there to be padding"
        )
    ref = _reference_for(model, prompt_ids, n, ref, 2 * bucket + n)
    cache = make_static_cache(model, ref.slots)
    static_prompt = torch.full(
        (prompt_ids.shape[0], bucket), pad_id, dtype=torch.long, device=prompt_ids.device
    )
    # one buffer of `bucket` tokens: only the first p are the prompt, the rest padding
    static_prompt[:, :p] = prompt_ids

    def prefill(ids):  # ids: [batch, bucket]
        # p, the valid count, is a Python int frozen in the graph
        return greedy(model(ids, cache=cache).logits[:, :p])

    graph = step_runner(runner, prefill, static_prompt, warmup=1)
    cache.reset()  # the warm-up's writes undone in place: the graph still holds these very buffers
    rec = CacheRecorder(cache, LAYERS)
    error = None
    try:
        # writes all `bucket` rows, padding included; every counter += bucket
        first = graph.replay().clone()
        if fix is not None:
            fix(cache)
        rec(0, first)
        next_ids, guard = first, room_guard(cache)
        # eager decode: nothing else is captured, only the prefill's damage shows
        for step in range(1, n):
            guard()
            next_ids = greedy(model(next_ids, cache=cache).logits)
            rec(step, next_ids)
    except (ReplayError, IndexError, RuntimeError) as e:
        error = f"{type(e).__name__}: {e}"
    return _result("padding-pollution", ref, rec, graph.describe(), error, bucket=bucket)


# ------------------------------------------------------------------------------- 2. state at replay


@torch.inference_mode()
def warmup_advance(
    model, prompt_ids, max_new_tokens, *, runner="graph", ref=None, warmup=WARMUP
) -> FailureResult:
    """``kvlab.decode(strategy="static-graph")`` as is: the warm-up calls advanced every counter by
    ``warmup``."""
    ref = _reference_for(
        model, prompt_ids, max_new_tokens, ref, prompt_ids.shape[1] + max_new_tokens + warmup
    )
    cache = make_static_cache(model, ref.slots)
    rec, keep, error = CacheRecorder(cache, LAYERS), {}, None
    try:
        decode_static_graph(
            model, prompt_ids, max_new_tokens, cache=cache, warmup=warmup, runner=runner,
            on_token=rec, keep=keep
        )
    except (ReplayError, IndexError, RuntimeError) as e:
        error = f"{type(e).__name__}: {e}"
    label = keep["graph"].describe() if keep.get("graph") is not None else runner
    return _result("warmup-advance", ref, rec, label, error)


def _captured_decode(model, prompt_ids, max_new_tokens, ref, runner, warmup):
    """An eager prefill, then the decode step captured (its warm-up advancing every counter) ->
    (reference, cache, first token, static input ids, graph); the room guard runs before every
    replay."""
    ref = _reference_for(
        model, prompt_ids, max_new_tokens, ref, prompt_ids.shape[1] + max_new_tokens + warmup
    )
    cache = make_static_cache(model, ref.slots)
    first = _prefill(model, prompt_ids, cache)
    static_ids = first.clone()
    graph = step_runner(
        runner, decode_step_fn(model, cache), static_ids, warmup=warmup,
        before_replay=room_guard(cache)
    )
    return ref, cache, first, static_ids, graph


@torch.inference_mode()
def control_rewound(model, prompt_ids, max_new_tokens, *, runner="graph", ref=None, warmup=WARMUP,
                    fix=None) -> FailureResult:
    """Not a failure: the same capture, with every counter rewound in place after it. Proves the
    machinery right.

    ``fix(cache)``: run instead of ``rewind(cache, warmup)`` between the capture and the first
    replay (lesson 04's exercise passes the student's own)."""
    ref, cache, first, static_ids, graph = _captured_decode(
        model, prompt_ids, max_new_tokens, ref, runner, warmup
    )
    if fix is None:
        rewind(cache, warmup)
    else:
        fix(cache)
    rec = CacheRecorder(cache, LAYERS)
    error = _replay_loop(graph, static_ids, first, max_new_tokens, rec)
    return _result("control-rewound", ref, rec, graph.describe(), error)


def _first_prompt_through_graph(model, prompt_ids, steps, runner, state, warmup):
    """Prompt A, done right: eager prefill, capture, rewind, ``steps`` replays. Returns (graph,
    static_ids, tokens of A)."""
    first = _prefill(model, prompt_ids, state["cache"])
    static_ids = first.clone()

    # reads the cache through a name, as notebook code does: `model(ids, cache=cache)`
    def step(ids):
        return greedy(model(ids, cache=state["cache"]).logits)

    graph = step_runner(runner, step, static_ids, warmup=warmup)
    rewind(state["cache"], warmup)
    graph.before_replay = room_guard(state["cache"])  # watches the counters this graph captured
    rec_a = CacheRecorder(state["cache"], ())
    _replay_loop(graph, static_ids, first, steps, rec_a)
    return graph, static_ids, rec_a.token_ids


@torch.inference_mode()
def cache_recreated(
    model, prompt_ids, max_new_tokens, *, next_ids, runner="graph", ref=None, warmup=WARMUP,
    first_steps: int | None = None
) -> FailureResult:
    """A new ``StaticCache`` for the next prompt: the graph still reads and writes the first cache's
    buffers."""
    n = max_new_tokens
    first_steps = first_steps or n
    slots = slots_for(max(prompt_ids.shape[1], next_ids.shape[1]), n)
    ref = _reference_for(model, next_ids, n, ref, prompt_ids.shape[1] + first_steps + n + warmup)
    state = {"cache": make_static_cache(model, max(slots, ref.slots))}
    graph, static_ids, tokens_a = _first_prompt_through_graph(
        model, prompt_ids, first_steps, runner, state, warmup
    )
    old = state["cache"]
    # what `cache = StaticCache(...)` in a notebook does
    state["cache"] = make_static_cache(model, ref.slots)
    first = _prefill(model, next_ids, state["cache"])
    rec = CacheRecorder(state["cache"], LAYERS)
    rec_old = CacheRecorder(old, LAYERS)
    rec.then = rec_old
    error = _replay_loop(graph, static_ids, first, n, rec)
    return _result(
        "cache-recreated",
        ref,
        rec,
        graph.describe(),
        error,
        first_prompt_tokens=tokens_a,
        old_cache_recorder=rec_old,
    )


def _reset_counters_to_max(cache) -> None:
    """A reset that zeroes every layer, then sets every counter to ``max_cache_len``."""
    for layer in cache.layers:
        layer.reset()
        layer.cumulative_length.fill_(layer.max_cache_len)


@torch.inference_mode()
def reset_out_of_range(
    model, prompt_ids, max_new_tokens, *, next_ids, runner="graph", ref=None, warmup=WARMUP, guard:
    bool = True
) -> FailureResult:
    """A reset that sets every counter to ``max_cache_len``: the next write lands past the end of
    every buffer.

    ``guard=True`` stops it on the host with a clear error; ``guard=False`` lets the write happen,
    which on CPU is an ordinary IndexError and on a GPU a device-side assert that kills the CUDA
    context (so it is refused there).
    """
    if not guard and next_ids.device.type == "cuda":
        raise ValueError(
            "guard=False on a GPU would trigger a device-side assert and poison this process's "
            "CUDA context (every later CUDA call fails until a restart): run it on CPU, or keep "
            "guard=True"
        )
    ref = _reference_for(model, next_ids, max_new_tokens, ref, 0)
    state = {"cache": make_static_cache(model, ref.slots)}
    graph, static_ids, tokens_a = _first_prompt_through_graph(
        model, prompt_ids, 4, runner, state, warmup
    )
    cache = state["cache"]
    _reset_counters_to_max(cache)
    rec = CacheRecorder(cache, LAYERS)
    rec.snapshot()  # the cache as the reset left it: empty, every counter at max_cache_len
    after_reset = list(rec.counters[0])
    error = None
    try:
        if guard:
            room_guard(cache, next_ids.shape[1])()  # the host check a GPU needs
        # CPU: index_copy_ raises; GPU without the guard: device-side assert
        first = _prefill(model, next_ids, cache)
        error = _replay_loop(graph, static_ids, first, max_new_tokens, rec)
    except (ReplayError, IndexError, RuntimeError) as e:
        error = f"{type(e).__name__}: {e}"
    return _result(
        "reset-out-of-range",
        ref,
        rec,
        graph.describe(),
        error,
        first_prompt_tokens=tokens_a,
        counters_after_reset=after_reset,
    )


@torch.inference_mode()
def reset_rebinds_counter(
    model, prompt_ids, max_new_tokens, *, next_ids, runner="graph", ref=None, warmup=WARMUP,
    first_steps: int | None = None
) -> FailureResult:
    """A hand-written reset that *rebinds* the counters (``layer.cumulative_length =
    torch.zeros(...)``): eager code uses the new tensors, the graph still advances the old ones, so
    positions and writes come from the last prompt."""
    n = max_new_tokens
    first_steps = first_steps or n
    ref = _reference_for(model, next_ids, n, ref, prompt_ids.shape[1] + first_steps + n + warmup)
    state = {"cache": make_static_cache(model, ref.slots)}
    graph, static_ids, tokens_a = _first_prompt_through_graph(
        model, prompt_ids, first_steps, runner, state, warmup
    )
    cache = state["cache"]
    old_counters = [layer.cumulative_length for layer in cache.layers]
    for layer in cache.layers:  # looks like a reset; the keys/values are even zeroed in place
        layer.keys.zero_()
        layer.values.zero_()
        # a NEW tensor: the graph keeps the old
        layer.cumulative_length = torch.zeros_like(layer.cumulative_length)
    first = _prefill(model, next_ids, cache)
    rec = CacheRecorder(cache, LAYERS)
    error = _replay_loop(graph, static_ids, first, n, rec)
    return _result(
        "reset-rebinds-counter",
        ref,
        rec,
        graph.describe(),
        error,
        first_prompt_tokens=tokens_a,
        graph_counters=[int(c) for c in old_counters],
    )


# ------------------------------------------------------------------------- 3. two position trackers


@torch.inference_mode()
def frozen_position(
    model, prompt_ids, max_new_tokens, *, runner="graph", ref=None, warmup=WARMUP
) -> FailureResult:
    """Positions from a host-side Python int: correct in eager code, frozen at its capture-time
    value in the graph."""
    p, n = prompt_ids.shape[1], max_new_tokens
    ref = _reference_for(model, prompt_ids, n, ref, p + n + warmup)
    cache = make_static_cache(model, ref.slots)
    first = _prefill(model, prompt_ids, cache)
    static_ids, state = first.clone(), {"pos": p}

    def step(ids):  # ids: [batch, 1]
        # int read now
        pos = torch.full((ids.shape[0], 1), state["pos"], dtype=torch.long, device=ids.device)
        return greedy(model(ids, cache=cache, position_ids=pos).logits)

    graph = step_runner(runner, step, static_ids, warmup=warmup, before_replay=room_guard(cache))
    rewind(cache, warmup)  # the warm-up's drift taken out: only the frozen int is left to fail

    def advance(step_i):
        state["pos"] = p + step_i - 1  # the host counter is right; the graph never reads it again

    rec = CacheRecorder(cache, LAYERS)
    error = _replay_loop(graph, static_ids, first, n, rec, before=advance)
    return _result("frozen-position", ref, rec, graph.describe(), error, frozen_at=p)


@torch.inference_mode()
def host_counter_drift(
    model, prompt_ids, max_new_tokens, *, runner="graph", ref=None, warmup=WARMUP
) -> FailureResult:
    """Positions from a static tensor refilled from a host counter (the right contract), but the
    cache's counters were advanced by the warm-up. RoPE uses the host's ``p`` (right); the write
    lands at ``p + warmup`` and the mask, whose query offset is layer 0's ``cumulative_length`` (``p
    + warmup`` too), lets the query see it. What is wrong: the warm-up's ``warmup`` writes of the
    first token, at slots ``p .. p + warmup - 1``, stay below the counter, inside the mask: every
    query attends to them as extra context (``watch_drift`` shows it)."""
    p, n = prompt_ids.shape[1], max_new_tokens
    ref = _reference_for(model, prompt_ids, n, ref, p + n + warmup)
    cache = make_static_cache(model, ref.slots)
    first = _prefill(model, prompt_ids, cache)
    static_ids = first.clone()
    static_pos = torch.full((prompt_ids.shape[0], 1), p, dtype=torch.long, device=prompt_ids.device)

    def step(ids, pos):  # both read by address at every replay
        return greedy(model(ids, cache=cache, position_ids=pos).logits)

    graph = step_runner(
        runner, step, static_ids, static_pos, warmup=warmup, before_replay=room_guard(cache)
    )

    def advance(step_i):
        static_pos.fill_(p + step_i - 1)  # host counter: prompt + tokens fed so far

    rec = CacheRecorder(cache, LAYERS)
    error = _replay_loop(graph, static_ids, first, n, rec, before=advance)
    return _result("host-counter-drift", ref, rec, graph.describe(), error)


@torch.inference_mode()
def layer0_only_rewind(
    model, prompt_ids, max_new_tokens, *, runner="graph", ref=None, warmup=WARMUP
) -> FailureResult:
    """The warm-up's drift "fixed" on ``cache.get_seq_length()`` only, i.e. layer 0's counter:
    positions are right, but every other layer keeps its own ``cumulative_length`` and writes
    ``warmup`` slots ahead."""
    ref, cache, first, static_ids, graph = _captured_decode(
        model, prompt_ids, max_new_tokens, ref, runner, warmup
    )
    cache.layers[0].cumulative_length.sub_(warmup)  # what get_seq_length() reads: looks fixed
    rec = CacheRecorder(cache, LAYERS)
    error = _replay_loop(graph, static_ids, first, max_new_tokens, rec)
    return _result("layer0-only-rewind", ref, rec, graph.describe(), error)


# -------------------------------------------------------------------------------- watching one step
@dataclass
class StepView:
    """What one decode step did in a cache: the slots it wrote, the slots its query could read, its
    RoPE position."""

    written: list[int]  # slots of the watched layer whose keys changed
    visible: list[int]  # slots the causal mask lets the (last) query read
    rope: list[int]  # the position ids RoPE rotated the query and the new key by
    # cache.get_query_offset(): where the mask puts the query (layer 0's cumulative_length)
    query_offset: int
    next_ids: torch.Tensor = field(repr=False)  # [batch, 1]: the greedy token it produced

    def extra_visible(self, other: StepView) -> list[int]:
        """Slots this step's query reads that ``other``'s (the correct run's) does not."""
        return sorted(set(self.visible) - set(other.visible))


@torch.inference_mode()
def _watch_step(model, ids, cache, position_ids=None, *, layer: int = 0) -> StepView:
    """Run one eager decode step of ``ids`` ``[batch, 1]`` over ``cache`` and say what it did.

    The mask and the positions are built the way ``LlamaModel.forward`` builds them on transformers
    5.24: the positions are ``position_ids`` if given, else ``arange + cache.get_seq_length()``; the
    mask comes from ``create_causal_mask``, whose query offset is ``cache.get_query_offset()``
    (layer 0's ``cumulative_length``: ``position_ids`` do not move it). Eager on purpose: for a
    *state* failure the calls, not the capture, did the damage, so an eager step sees exactly what
    the replay sees.
    """
    from transformers.masking_utils import create_causal_mask

    from .cache_view import slot_norms

    before = slot_norms(cache.layers[layer]).clone()
    embeds = model.get_input_embeddings()(ids)
    pos = position_ids if position_ids is not None else (
        torch.arange(ids.shape[1], device=ids.device) + cache.get_seq_length()).unsqueeze(0)
    offset = int(cache.get_query_offset())
    mask = create_causal_mask(
        config=model.config, inputs_embeds=embeds, attention_mask=None, cache=cache,
        position_ids=pos
    )
    next_ids = greedy(model(ids, cache=cache, position_ids=position_ids).logits)
    written = (slot_norms(cache.layers[layer]) != before).nonzero().flatten().tolist()
    visible = (
        mask[0, 0, -1].nonzero().flatten().tolist()
        if mask is not None
        else list(range(offset + ids.shape[1]))
    )
    return StepView(
        written=written, visible=visible, rope=pos.reshape(-1).tolist(), query_offset=offset,
        next_ids=next_ids
    )


def watch_drift(
    model, prompt_ids, steps: int = 3, *, warmup: int = WARMUP, slots: int | None = None
):
    """The first ``steps`` decode steps of ``host-counter-drift``, watched (eagerly: it is a state
    failure), beside the correct run's: ``(drift_views, correct_views)``, two lists of
    :class:`StepView`.

    The drift run: eager prefill, ``warmup`` calls of the step at the host position ``p`` (what
    capture's warm-up does), then steps with ``position_ids = p + step - 1`` from the host counter.
    The correct run: no warm-up, positions from the cache.
    """
    p = prompt_ids.shape[1]
    slots = slots or slots_for(p, steps + 1)
    views = {}
    for name in ("drift", "correct"):
        cache = make_static_cache(model, slots)
        with torch.inference_mode():
            ids = _prefill(model, prompt_ids, cache)
            host = torch.full(
                (prompt_ids.shape[0], 1), p, dtype=torch.long, device=prompt_ids.device
            )
            for _ in range(warmup if name == "drift" else 0):
                model(ids, cache=cache, position_ids=host)
        views[name] = []
        for step in range(1, steps + 1):
            pos = torch.full_like(host, p + step - 1) if name == "drift" else None
            view = _watch_step(model, ids, cache, pos)
            views[name].append(view)
            ids = view.next_ids
    return views["drift"], views["correct"]


# name -> what it is; "frozen": eager code with the same calls would be right (only the graph
# fails); "needs_next": the scenario takes a second prompt (next_ids=).
SCENARIOS: dict[str, dict] = {
    "padding-pollution": dict(
        fn=padding_pollution, group=1, frozen=False, needs_next=False,
        title="prefill captured at a padded bucket size",
        cause="every row of the padded input is written and counted: the pad tokens become "
        "context"),
    "warmup-advance": dict(
        fn=warmup_advance, group=2, frozen=False, needs_next=False,
        title="warm-up calls before capture advance the counters",
        cause="3 warm-up calls wrote 3 extra copies of the first token and moved every counter "
        "3 ahead"),
    "cache-recreated": dict(
        fn=cache_recreated, group=2, frozen=True, needs_next=True,
        title="a new StaticCache for the next prompt",
        cause="the graph holds the old cache's addresses: it reads and writes the previous "
        "prompt's buffers"),
    "reset-out-of-range": dict(
        fn=reset_out_of_range, group=2, frozen=False, needs_next=True,
        title="a reset that sets every counter to max_cache_len",
        cause="the next write targets slots max_cache_len.. which do not exist"),
    "reset-rebinds-counter": dict(
        fn=reset_rebinds_counter, group=2, frozen=True, needs_next=True,
        title="a reset that rebinds cumulative_length to a new tensor",
        cause="eager prefill uses the new counters, the graph still advances the old ones"),
    "frozen-position": dict(
        fn=frozen_position, group=3, frozen=True, needs_next=False,
        title="positions from a Python int",
        cause="the int was read once, at capture: every replay uses that position"),
    "host-counter-drift": dict(
        fn=host_counter_drift, group=3, frozen=False, needs_next=False,
        title="positions from a host counter, cache counters from the warm-up",
        cause="RoPE positions are right and the new key is visible (the mask follows layer 0's "
        "counter), but the 3 warm-up writes of the first token stay inside the mask: every query "
        "reads them"),
    "layer0-only-rewind": dict(
        fn=layer0_only_rewind, group=3, frozen=False, needs_next=False,
        title="only layer 0's counter rewound",
        cause="positions follow layer 0; layers 1.. keep their own counters, 3 ahead"),
}
CONTROL = "control-rewound"
CONTROL_SPEC = dict(fn=control_rewound, group=0, frozen=False, needs_next=False,
                    title="control: the same capture with every counter rewound after it",
                    cause="nothing: the counters are where the graph expects them")


def run(name: str, model, prompt_ids, max_new_tokens, *, next_ids=None, **kwargs) -> FailureResult:
    """Run one scenario by name (``control-rewound`` too). The prompts are checked first
    (``check_inputs``)."""
    check_inputs(model, prompt_ids, max_new_tokens)
    if next_ids is not None:
        check_inputs(model, next_ids, max_new_tokens)
    if name == CONTROL:
        return control_rewound(model, prompt_ids, max_new_tokens, **kwargs)
    if name not in SCENARIOS:
        raise ValueError(
            f"unknown scenario {name!r}; choose one of {sorted(SCENARIOS) + [CONTROL]}"
        )
    spec = SCENARIOS[name]
    if spec["needs_next"]:
        if next_ids is None:
            raise ValueError(f"scenario {name!r} needs a second prompt: pass next_ids=")
        kwargs["next_ids"] = next_ids
    return spec["fn"](model, prompt_ids, max_new_tokens, **kwargs)

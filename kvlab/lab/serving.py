"""Lesson 07's measurements, shared by its notebook and ``tools/record_lesson07_gpu.py``.

``speculation_runs``: prompt-lookup speculative decoding (``kvlab.speculative``) over the model's
forward and over lesson 06's kernels step, each against the one-token graph decoder of the same
step, on the same prompts, model and machine: tokens checked against ``"naive"``, acceptance and
tokens per verify from ``SpeculativeDecoder.last_stats``, whole decodes (prefill included) timed in
turns. ``k_sweep``: the same on one prompt for several draft lengths. ``paged_runs``: requests of
mixed lengths arriving over time, served by ``kvlab.continuous_batching.ContinuousBatcher``
(graphs, and eagerly) and one at a time by lesson 05's decoder: tokens checked per request, memory
held step by step against a static cache, tokens per second of each.
"""

from __future__ import annotations

import torch

from ..continuous_batching import ContinuousBatcher, Request, read_requests
from ..decoding import check_inputs, check_model, unpadded_ids
from ..graph_decoder import GraphSafeDecoder
from ..paged_cache import blocks_for, bytes_per_token, memory_accounting
from ..runtime import environment, pick_device
from ..strategies import STRATEGIES, decode, strategy_named
from .measure import count as whole_number
from .measure import time_interleaved, wall

# Our own passage (about this course's subject), so that a grounded prompt has something to quote.
PASSAGE = (
    "A decoder makes one token per forward pass. Without a cache, every step recomputes the keys "
    "and values of the whole sequence, so the work grows with the square of its length. A "
    "key-value cache keeps them: each step computes the keys and values of the new token only, "
    "appends them, and attends over what is stored. A static cache reserves its slots once, so its "
    "tensors never move, and that is what lets a captured CUDA graph replay the same step again "
    "and again: the graph reads memory by address, and the addresses stay."
)
PROMPTS = {  # kind -> the question asked (in the model's chat template)
    "copy the passage": f"Repeat the following passage exactly, word for word.\n\n{PASSAGE}",
    "quote from the passage": f"{PASSAGE}\n\nWhich sentence of the passage says why a static "
                              "cache suits a captured CUDA graph? Quote it exactly.",
    "open-ended": "Write a short poem about the sea at night.",
}
GROUNDED = ("copy the passage", "quote from the passage")  # the output repeats the input
SPECULATIVE = "graph-safe-speculative"
# speculative strategy -> the one-token decoder of the same step, its base
PAIRS = {SPECULATIVE: "graph-safe", "graph-safe-speculative/kernels": "graph-safe-kernels"}


def _builds_with(strategy, keyword: str) -> bool:
    """Whether ``strategy``'s builder takes ``keyword`` by name (a builder passing the rest on
    does not count: its keywords are not known here)."""
    return strategy.builds is not None and keyword in (strategy.build_keywords() or ())


# a speculative path takes k drafts; a base builds a one-token decoder of a given cache length
SPECULATIVE_NAMES = [name for name, s in STRATEGIES.items() if _builds_with(s, "k")]
BASE_NAMES = [name for name, s in STRATEGIES.items()
              if s.exact and _builds_with(s, "max_cache_len") and not _builds_with(s, "k")]


def _checked_pairs(pairs) -> dict[str, str]:
    """``pairs`` (speculative strategy name -> its base, a name or a ``kvlab.STRATEGIES`` entry) as
    names, else a ValueError listing the names each side takes."""
    if not isinstance(pairs, dict) or not pairs:
        raise ValueError(f"pairs must be a non-empty dict of speculative strategy -> its base, "
                         f"e.g. kvlab.lab.serving.PAIRS; got {pairs!r:.80}")

    def named(given, names: list[str], what: str, where: str) -> str:
        try:  # a kvlab.STRATEGIES entry stands for its name
            name = strategy_named(given).name
        except (TypeError, ValueError):
            name = None
        if name not in names:
            raise ValueError(f"pairs {where} {given!r:.80} is not {what}; choose one of "
                             f"{', '.join(names)} (e.g. kvlab.lab.serving.PAIRS)")
        return name

    return {named(fast, SPECULATIVE_NAMES, "a speculative strategy", "key"):
            named(base, BASE_NAMES, "a one-token base", f"base of {fast!r:.40}")
            for fast, base in pairs.items()}


def _one_prompt(model, ids, new_tokens, name: str = "ids") -> torch.Tensor:
    """``ids`` (a tensor or a tokenizer's output) as one prompt ``[1, prompt_len]`` of the model's
    token ids, checked as ``kvlab.decode`` checks them: a run records one row's tokens and
    drafts."""
    ids = unpadded_ids(ids)
    check_inputs(model, ids, new_tokens, name=name)
    if ids.shape[0] != 1:
        raise ValueError(f"{name} must be one prompt's ids [1, prompt_len], got batch "
                         f"{ids.shape[0]}: a run records one row's tokens and drafts; pass each "
                         f"prompt alone, e.g. {name}[i:i + 1]")
    return ids


def _kept(outputs: list, run):
    """``run`` that also appends each output to ``outputs`` (kept, compared after the timing)."""
    def kept():
        outputs.append(run())
        return outputs[-1]
    return kept


def speculation_runs(model, prompts: dict[str, torch.Tensor], new_tokens: int, *,
                     pairs: dict[str, str] = PAIRS, k: int = 4, rounds: int = 3,
                     check_tokens: int | None = None, device=None) -> dict:
    """Decode each prompt (``name -> ids [1, prompt_len]``) with each speculative strategy of
    ``pairs`` (``k`` drafts) and its one-token base (``PAIRS``: over the model's forward against
    ``"graph-safe"``, over lesson 06's kernels step against ``"graph-safe-kernels"``).

    Every decoder is built once, for the longest prompt, and serves every prompt (its graphs
    replayed). Per prompt: ``exact`` (each path's first ``check_tokens`` tokens, default all,
    equal to ``"naive"``'s, and all paths equal over ``new_tokens``), ``seconds`` of a whole
    decode (prefill included) per path, medians of ``rounds`` taken in turns (every timed call's
    tokens are checked too), ``tokens_per_s``,
    ``speedup`` of each speculative path over its base, and the drafts' ``acceptance_rate``,
    ``tokens_per_verify``, ``verify_steps``, ``drafted`` and ``accepted`` (one set for every
    speculative path: the drafts follow the tokens, which are exact)."""
    device = model_device(model, device)
    if not isinstance(prompts, dict) or not prompts:
        raise ValueError("prompts must be a non-empty dict of name -> ids [1, prompt_len], got "
                         f"{prompts!r:.80}")
    pairs = _checked_pairs(pairs)
    new_tokens, k = whole_number("new_tokens", new_tokens, 1), whole_number("k", k, 1)
    prompts = {prompt: _one_prompt(model, ids, new_tokens, f"prompts[{prompt!r}]")
               for prompt, ids in prompts.items()}
    # the check compares each path's first check_tokens tokens: at most the tokens it made
    check_tokens = new_tokens if check_tokens is None else whole_number(
        "check_tokens", check_tokens, 1, f" and at most new_tokens ({new_tokens}), or None for all")
    if check_tokens > new_tokens:
        raise ValueError(f"check_tokens ({check_tokens}) is above new_tokens ({new_tokens}): "
                         "each path makes new_tokens tokens, so only that many can be checked; "
                         "give check_tokens <= new_tokens, or None for all")
    longest = max(prompts.values(), key=lambda ids: ids.shape[1])  # its prefill serves shorter
    max_cache_len = longest.shape[1] + new_tokens + k - 1  # the last verify step's k drafts fit
    built = {name: STRATEGIES[name].state(model, longest, new_tokens, max_cache_len=max_cache_len,
                                          **({"k": k} if name in pairs else {}))
             for name in [*pairs.values(), *pairs]}  # the bases, then the speculative paths
    runs = []
    for prompt, ids in prompts.items():
        made = {name: [] for name in built}  # every call's tokens, the timed ones too: all checked
        paths = {name: _kept(made[name], lambda name=name, ids=ids: decode(
                     model, ids, new_tokens, strategy=name, **built[name]))
                 for name in built}
        naive = decode(model, ids, check_tokens, strategy="naive")
        first = paths[next(iter(pairs))]()
        stats = built[next(iter(pairs))]["decoder"].last_stats
        for name in built:
            if not made[name]:
                paths[name]()
        seconds = time_interleaved(paths, rounds=rounds, device=device, collect_garbage=True)
        runs.append({
            "prompt": prompt, "prompt_len": ids.shape[1], "new_tokens": new_tokens,
            "check_tokens": check_tokens,
            "exact": {name: all(torch.equal(t[:, :check_tokens], naive) and torch.equal(t, first)
                                for t in made[name])
                      for name in built},
            "acceptance_rate": stats.acceptance_rate, "tokens_per_verify": stats.tokens_per_verify,
            "verify_steps": stats.verify_steps, "drafted": stats.drafted,
            "accepted": stats.accepted, "seconds": seconds,
            "tokens_per_s": {name: new_tokens / s for name, s in seconds.items()},
            "speedup": {name: seconds[base] / seconds[name] for name, base in pairs.items()},
            "tokens": first[0].tolist(),
        })
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    return {"pairs": dict(pairs), "k": k, "max_cache_len": max_cache_len, "runs": runs,
            "env": environment(device), "dtype": dtype}


def model_device(model, device=None) -> torch.device:
    """The device the runs time and record: the model's; a ``device`` given must be it (a record
    of CPU timings must not name a GPU)."""
    check_model(model)
    on = next(model.parameters()).device
    asked = None if device is None else pick_device(device)
    if asked is not None and asked.type == "cuda" and asked.index is None:  # "cuda": the current
        asked = torch.device("cuda", torch.cuda.current_device())
    if asked is not None and asked != on:
        raise ValueError(f"device={device!r} but the model is on {on}: the runs decode where the "
                         f"model is, and the record names that device. Pass device={str(on)!r} "
                         "or none, or move the model there first")
    return on


def k_sweep(model, ids: torch.Tensor, new_tokens: int, ks=(1, 2, 4, 8), *, rounds: int = 3,
            device=None) -> dict:
    """Speculative decoding of one prompt with each draft length of ``ks``, beside
    ``"graph-safe"`` (k = 0): tokens per verify and seconds of a whole decode (medians of
    ``rounds`` in turns), every output, the timed ones included, equal to the naive loop's."""
    device = model_device(model, device)
    new_tokens = whole_number("new_tokens", new_tokens, 1)
    ids = _one_prompt(model, ids, new_tokens)
    asked = ks
    try:  # a NumPy or 0-dim tensor int reads as an int
        ks = [whole_number("k", k, 1) for k in ks]
    except (TypeError, ValueError):
        ks = []
    if not ks or len(set(ks)) != len(ks):
        raise ValueError("ks must be draft lengths, ints >= 1 each given once, e.g. (1, 2, 4, 8); "
                         f"got {asked!r:.80}")
    cache_len = ids.shape[1] + new_tokens + max(ks) - 1
    decoders = {0: GraphSafeDecoder(model, cache_len)} | {
        k: STRATEGIES[SPECULATIVE].build(model, ids, new_tokens, k=k, max_cache_len=cache_len)
        for k in ks}
    made = {k: [] for k in decoders}  # every call's tokens, the timed ones too: all checked
    paths = {k: _kept(made[k], lambda d=d: d.generate(ids, new_tokens))
             for k, d in decoders.items()}
    want = decode(model, ids, new_tokens, strategy="naive")
    paths[0]()  # captures
    rows = []
    for k in ks:
        paths[k]()
        stats = decoders[k].last_stats
        rows.append({"k": k, "tokens_per_verify": stats.tokens_per_verify,
                     "acceptance_rate": stats.acceptance_rate})
    seconds = time_interleaved(paths, rounds=rounds, device=device, collect_garbage=True)
    for row in rows:
        row["exact"] = all(torch.equal(got, want) for got in made[0] + made[row["k"]])
        row["seconds"] = seconds[row["k"]]
        row["speedup"] = seconds[0] / seconds[row["k"]]
    return {"new_tokens": new_tokens, "prompt_len": ids.shape[1], "graph_safe_seconds": seconds[0],
            "rows": rows, "env": environment(device)}


def arriving_requests(count: int, vocab_size: int, *, prompt_lens=(8, 96), new_tokens=(8, 64),
                      every: int = 2, seed: int = 0, device=None) -> list[Request]:
    """``count`` requests with random prompts of ``prompt_lens`` tokens (inclusive range) wanting
    ``new_tokens`` (inclusive range), one arriving every ``every`` scheduler steps: mixed lengths,
    as a server sees them."""
    count, vocab_size = whole_number("count", count, 1), whole_number("vocab_size", vocab_size, 1)
    every, seed = whole_number("every", every, 0), whole_number("seed", seed, 0)
    ranges = []
    for name, pair in (("prompt_lens", prompt_lens), ("new_tokens", new_tokens)):
        if isinstance(pair, torch.Tensor) or type(pair).__module__ == "numpy":
            pair = pair.tolist()  # an array of two reads as the range
        try:  # a NumPy or 0-dim tensor int reads as an int
            low, high = (whole_number(name, v, 1) for v in pair)
        except (TypeError, ValueError):
            low = high = 0
        if not isinstance(pair, list | tuple) or not 1 <= low <= high:
            raise ValueError(f"{name} must be an inclusive range (low, high) of ints with "
                             f"1 <= low <= high, got {pair!r:.80}")
        ranges.append((low, high))
    prompt_lens, new_tokens = ranges
    gen = torch.Generator().manual_seed(seed)

    def pick(low_high):
        low, high = low_high
        return int(torch.randint(low, high + 1, (), generator=gen))

    requests = []
    for i in range(count):
        prompt = torch.randint(0, vocab_size, (pick(prompt_lens),), generator=gen)
        requests.append(Request(prompt.to(pick_device(device)), pick(new_tokens),
                                arrival=i * every))
    return requests


def _paged_runs_inputs(model, requests, max_batch, block_size) -> tuple[list[Request], int, int]:
    """``paged_runs``' door: a non-empty list of Requests, read as serve reads them, and whole
    numbers of rows and block slots."""
    if (not isinstance(requests, list | tuple) or not requests
            or not all(isinstance(r, Request) for r in requests)):
        raise TypeError("paged_runs takes a non-empty list of Requests "
                        f"(arriving_requests(...)), got {requests!r:.80}")
    return (read_requests(model, requests), whole_number("max_batch", max_batch, 1),
            whole_number("block_size", block_size, 1))


GRAPHS, ONE_AT_A_TIME = "paged, graphs", "one at a time (graph-safe)"


def _same_tokens(made, naive) -> list[bool]:
    """Per request: its tokens equal its naive decode (a missing or misshapen output is not)."""
    made = list(made)
    return [i < len(made) and isinstance(made[i], torch.Tensor)
            and torch.equal(made[i].to(want.device), want) for i, want in enumerate(naive)]


def paged_runs(model, requests: list[Request], *, max_batch: int = 8, block_size: int = 16,
               device=None) -> dict:
    """Serve ``requests`` with a ``ContinuousBatcher`` (captured graphs, then eagerly) and one at a
    time with a ``GraphSafeDecoder`` of batch 1; check every way's tokens (each timed run's, and
    the capturing serve's) against each request's own ``"naive"`` decode.

    The pool holds ``max_batch`` requests of the longest length. Returns ``exact_by_way`` (per way,
    per request), ``exact`` (per request: every way made its tokens),
    ``seconds`` and ``tokens_per_s`` of each way (the first, capturing serve is untimed),
    ``timeline`` (per scheduler step: rows running, bucket replayed, bytes the paged cache holds)
    with ``static_bytes`` (a static cache of ``max_batch`` rows sized for the longest request),
    and ``per_request`` memory (``kvlab.paged_cache.memory_accounting``)."""
    device = model_device(model, device)
    requests, max_batch, block_size = _paged_runs_inputs(model, requests, max_batch, block_size)
    lengths = [r.prompt.shape[0] + r.max_new_tokens - 1 for r in requests]  # slots each writes
    width = blocks_for(max(lengths), block_size)  # a block-table row: the longest request
    num_blocks = max_batch * width
    batchers = {graph: ContinuousBatcher(model, num_blocks=num_blocks, block_size=block_size,
                                         max_batch=max_batch, max_blocks_per_request=width,
                                         graph=graph)
                for graph in (True, False)}
    served = batchers[True].serve(requests)  # captures a graph per bucket it meets
    single = GraphSafeDecoder(model, max(lengths) + 1)
    naive = [decode(model, r.prompt[None], r.max_new_tokens, strategy="naive")[0]
             for r in requests]
    made = {}  # way -> each request's tokens from that way's timed run: every way is checked

    def serve(way, graph):
        def run():
            made[way] = batchers[graph].serve(requests).tokens
        return run

    def one_at_a_time():
        made[ONE_AT_A_TIME] = [single.generate(r.prompt[None], r.max_new_tokens)[0]
                               for r in requests]

    one_at_a_time()  # captures
    first_runs = {GRAPHS: served.tokens, ONE_AT_A_TIME: made[ONE_AT_A_TIME]}
    seconds = {GRAPHS: wall(serve(GRAPHS, True), device),
               "paged, eager": wall(serve("paged, eager", False), device),
               ONE_AT_A_TIME: wall(one_at_a_time, device)}
    exact_by_way = {way: _same_tokens(made[way], naive) for way in seconds}
    # the capturing runs' tokens too: a way that captures is exact only where both runs were
    for way, tokens in first_runs.items():
        exact_by_way[way] = [a and b for a, b in zip(exact_by_way[way], _same_tokens(tokens, naive),
                                                      strict=True)]
    exact = [all(way[i] for way in exact_by_way.values()) for i in range(len(requests))]
    total = sum(r.max_new_tokens for r in requests)
    token_bytes = bytes_per_token(model.config, next(model.parameters()).dtype)
    return {
        "requests": [{"prompt_len": r.prompt.shape[0], "new_tokens": r.max_new_tokens,
                      "arrival": r.arrival} for r in requests],
        "max_batch": max_batch, "block_size": block_size, "num_blocks": num_blocks, "exact": exact,
        "exact_by_way": exact_by_way,
        "seconds": seconds, "tokens_per_s": {way: total / s for way, s in seconds.items()},
        "timeline": [{key: step[key] for key in ("step", "rows", "bucket", "paged_bytes")}
                     for step in served.timeline],
        "static_bytes": served.static_bytes, "token_bytes": token_bytes,
        "per_request": memory_accounting(lengths, block_size, token_bytes),
        "buckets_captured": sorted(batchers[True].graphs), "env": environment(device),
    }

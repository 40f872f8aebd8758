"""Measurement: the one decode timer, the one profiler, function timers, and memory.

Every clock read is preceded by a device synchronization (``wall``), so GPU work queued
asynchronously is counted where it runs, not where it was launched.

**The decode rule**, the same for the lessons and the benchmark: ``T(n)`` is the wall time of one
whole decode of ``n`` new tokens, ``T(1)`` of one token (the prefill). One decode step takes
``(T(n) - T(1)) / (n - 1)``; each sequence of the batch gets one token per step. ``T(1)`` and
``T(n)`` are medians over repeats, timed in turns, and the first call (compile, capture, autotune,
lazy set-up) is timed apart as the warm-up; a one-token call is also made once untimed before
``T(1)`` is timed, since its own first use is slower too. With ``per_step=True`` a clock also reads
the time after every token (one device sync per token): the same rule, plus the time of each step
along the sequence, for paths that make one token per launch. A path that replays several steps per
graph hands its tokens to the clock in a burst after each replay, so its per-step times mean
nothing: ``time_strategy`` refuses ``per_step`` for strategies declared with
``steps_per_replay > 1``.
"""

from __future__ import annotations

import gc
import inspect
import resource
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.utils.benchmark as benchmark
from torch.utils._python_dispatch import TorchDispatchMode

from ..decoding import OnToken, StepClock, check_inputs, unpadded_ids
from ..graph_decoder import GraphSafeDecoder
from ..runtime import collector_paused, environment, pick_device, synchronize
from ..runtime import count as runtime_count
from ..sizes import tensor_bytes
from ..strategies import STATE_KEYS, check_flags, check_options, decode, strategy_named


def check_function(fn, name: str, called: str, takes: int = 0) -> None:
    """Refuse an ``fn`` that cannot be called (None, or a call's result given for the function),
    or whose signature cannot take the ``takes`` positional arguments it is called with, before
    any work: ``called`` is how it is called. A signature that cannot be read is let through."""
    if not callable(fn):
        raise TypeError(f"{name} must be a function, called as {called}; got "
                        f"{type(fn).__name__} {fn!r:.60}: pass the function itself (a def or a "
                        "lambda), not what it returns")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins and C callables have none
        return
    try:
        signature.bind(*range(takes))
    except TypeError:
        raise TypeError(f"{name} is called as {called}, but its signature {signature} cannot take "
                        f"{takes} positional argument(s): give a function with those parameters "
                        "(more may have defaults)") from None


def _check_runs(runs) -> None:
    """Refuse what is not a non-empty dict of label -> run, before any run is timed."""
    if not isinstance(runs, dict) or not runs:
        raise ValueError("runs must be a non-empty dict of label -> run(n, on_token) (give at "
                         f"least one run to time), got {runs!r:.80}")
    for label, run in runs.items():
        check_function(run, f"runs[{label!r}]", "run(n, on_token) -> tokens [batch, n]", 2)


def wall(fn: Callable[[], object], device) -> float:
    """Seconds of one ``fn()`` call, the device synchronized before and after."""
    synchronize(device)
    t0 = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - t0


class TimingError(ValueError):
    """A measurement that came out meaningless (a negative step time); the message says how to
    measure again."""


@dataclass
class DecodeTiming:
    """What ``time_decode`` measured (seconds; the rule is in the module docstring)."""

    label: str
    batch: int
    new_tokens: int  # tokens the timed decode made (``generate`` may stop early at end-of-sequence)
    tokens: torch.Tensor = field(repr=False)  # [batch, new_tokens] of the last timed run
    warmup_seconds: float  # the first, untimed call: compile or capture time lives here
    prefill_seconds: float  # T(1), median
    total_seconds: float  # T(n), median
    # per_step=True: median time of each step, step 0 = prefill + first token
    step_seconds: list[float] | None
    # during the T(n) runs: the CUDA allocator's peak; None on the CPU (``path_peak``)
    peak_memory_bytes: int | None
    env: dict
    prefill_runs: list[float] = field(default_factory=list)  # each repeat's T(1), in the order run
    total_runs: list[float] = field(default_factory=list)  # each repeat's T(n)

    @property
    def seconds_per_step(self) -> float:
        """``(T(n) - T(1)) / (n - 1)``: one decode step, every sequence of the batch one token
        further."""
        return (self.total_seconds - self.prefill_seconds) / max(1, self.new_tokens - 1)

    @property
    def ms_per_token(self) -> float:
        return 1e3 * self.seconds_per_step

    @property
    def tokens_per_s(self) -> float:
        """Steady-state decode rate of the whole batch (``batch`` tokens per step)."""
        return self.batch / self.seconds_per_step

    @property
    def end_to_end_tokens_per_s(self) -> float:
        """Tokens of the whole decode, prefill included, over its wall time."""
        return self.batch * self.new_tokens / self.total_seconds

    def record(self) -> dict:
        """The numbers as a JSON-ready dict (ms, MB)."""
        return {"warmup_s": self.warmup_seconds, "prefill_ms": 1e3 * self.prefill_seconds,
                "total_ms": 1e3 * self.total_seconds, "ms_per_token": self.ms_per_token,
                "tokens_per_s": self.tokens_per_s,
                "peak_memory_mb": None if self.peak_memory_bytes is None
                else self.peak_memory_bytes / 2**20,
                "prefill_ms_runs": [1e3 * t for t in self.prefill_runs],
                "total_ms_runs": [1e3 * t for t in self.total_runs]}


def count(name: str, value, least: int, why: str = "") -> int:
    """``value`` as a Python int where it is a whole number >= ``least`` (a NumPy or 0-dim tensor
    integer too: ``kvlab.runtime.count``), else a ValueError naming ``name``."""
    try:
        return runtime_count(value, name, minimum=least)
    except ValueError:
        raise ValueError(f"{name} must be an int >= {least}{why}, got {value!r:.80}") from None


def _check_timing_args(new_tokens, repeats, warmup_tokens) -> tuple[int, int, int | None]:
    """The three as Python ints, or a ValueError naming the bad one."""
    new_tokens = count("new_tokens", new_tokens, 2, " (the rule divides by n - 1)")
    repeats = count("repeats", repeats, 1)
    if warmup_tokens is not None:
        warmup_tokens = count("warmup_tokens", warmup_tokens, 1, " or None (the full length)")
    return new_tokens, repeats, warmup_tokens


def time_decode(run: Callable[[int, OnToken], torch.Tensor], new_tokens: int, device, *,
                repeats: int = 3, per_step: bool = False, warmup_tokens: int | None = None,
                label: str = "") -> DecodeTiming:
    """Time ``run(n, on_token) -> tokens [batch, n]`` by the decode rule (module docstring).

    ``warmup_tokens``: the length of the untimed first call (default ``new_tokens``; a compiled or
    captured path needs the full length to compile or capture everything the timed runs use).
    """
    check_function(run, "run", "run(n, on_token) -> tokens [batch, n]", 2)
    check_flags({"per_step": per_step}, ("per_step",))
    if not per_step:
        return time_decodes({label: run}, new_tokens, device, repeats=repeats,
                            warmup_tokens=warmup_tokens)[label]
    device = pick_device(device)  # a clear error for "cuda" without a GPU
    new_tokens, repeats, warmup_tokens = _check_timing_args(new_tokens, repeats, warmup_tokens)
    warmup = wall(lambda: run(warmup_tokens or new_tokens, None), device)
    reset_peak_memory(device)
    clocked = []
    for _ in range(repeats):
        clock = StepClock(device)
        tokens = _tokens(label, run(new_tokens, clock), new_tokens)
        clocked.append(clock.times)
    if any(len(times) != tokens.shape[1] for times in clocked):
        raise ValueError(f"{label or 'run'} called on_token {len(clocked[0])} times for "
                         f"{tokens.shape[1]} tokens: "
                         "per_step needs a run that calls on_token once per token")
    steps = [statistics.median(col) for col in zip(*clocked, strict=True)]
    prefills, totals = [times[0] for times in clocked], [sum(times) for times in clocked]
    return _timing(label, tokens, new_tokens, warmup, prefills, totals, steps,
                   peak_memory_bytes(device), device)


def time_decodes(runs: dict[str, Callable[[int, OnToken], torch.Tensor]], new_tokens: int,
                 device, *, repeats: int = 3,
                 warmup_tokens: int | None = None) -> dict[str, DecodeTiming]:
    """``time_decode`` of several paths (label -> run), timed in turns: every path's warm-up first,
    then in each of ``repeats`` rounds every path's T(1) and T(n), one path after the other, the
    garbage collector paused. A busy moment of a shared machine then slows every path alike, so
    their ratios stay honest. Returns label -> ``DecodeTiming``."""
    device = pick_device(device)  # a clear error for "cuda" without a GPU
    new_tokens, repeats, warmup_tokens = _check_timing_args(new_tokens, repeats, warmup_tokens)
    _check_runs(runs)
    warmups = {label: wall(lambda run=run: run(warmup_tokens or new_tokens, None), device)
               for label, run in runs.items()}
    for run in runs.values():
        # untimed: the one-token path has first-use set-up of its own (warm-up, not prefill)
        run(1, None)
    prefills = {label: [] for label in runs}
    totals = {label: [] for label in runs}
    tokens, peaks = {}, dict.fromkeys(runs, 0)
    with collector_paused():
        for _ in range(repeats):
            for label, run in runs.items():  # T(1) and T(n) in turns, path after path
                reset_peak_memory(device)
                prefills[label].append(wall(lambda run=run: run(1, None), device))
                synchronize(device)
                t0 = time.perf_counter()
                tokens[label] = run(new_tokens, None)
                synchronize(device)
                totals[label].append(time.perf_counter() - t0)
                peaks[label] = max(peaks[label], peak_memory_bytes(device))
    return {label: _timing(label, tokens[label], new_tokens, warmups[label], prefills[label],
                           totals[label], None, peaks[label], device) for label in runs}


def _tokens(label, tokens, new_tokens: int) -> torch.Tensor:
    """``tokens``, what ``run(new_tokens)`` returned, if a tensor [batch, new_tokens], else a
    TimingError."""
    if not isinstance(tokens, torch.Tensor):
        raise TimingError(f"{label or 'run'}({new_tokens}) returned a {type(tokens).__name__}, not "
                          f"a tensor of tokens [batch, {new_tokens}]: return the decode's tokens "
                          "as a tensor (torch.tensor(...) of a list)")
    if tokens.dim() != 2 or tokens.shape[1] != new_tokens:
        raise TimingError(f"{label or 'run'}({new_tokens}) returned tokens of shape "
                          f"{tuple(tokens.shape)}, not [batch, {new_tokens}]: the rule needs the "
                          "run to make exactly the tokens it was asked for")
    return tokens


def _timing(label, tokens, new_tokens, warmup, prefills, totals, steps, peak,
            device) -> DecodeTiming:
    """The DecodeTiming of one path (its T(1) and T(n): the medians of ``prefills`` and ``totals``,
    each repeat's), refused where the rule's number would mean nothing."""
    prefill, total = statistics.median(prefills), statistics.median(totals)
    tokens = _tokens(label, tokens, new_tokens)
    # T(n) <= T(1): the step time would be zero or negative, a number that means nothing
    if total <= prefill:
        raise TimingError(
            f"{label or 'the decode'}: T({new_tokens}) = {1e3 * total:.3f} ms is not above "
            f"T(1) = {1e3 * prefill:.3f} ms, "
            "so (T(n) - T(1)) / (n - 1) would be meaningless: the machine was busy, or n is too "
            "small for its clock. Time more tokens or more repeats, with nothing else running.")
    return DecodeTiming(label=label, batch=int(tokens.shape[0]), new_tokens=int(tokens.shape[1]),
                        tokens=tokens, warmup_seconds=warmup, prefill_seconds=prefill,
                        total_seconds=total, step_seconds=steps,
                        peak_memory_bytes=path_peak(peak, device),
                        env=environment(device), prefill_runs=list(prefills),
                        total_runs=list(totals))


def time_strategy(model, input_ids: torch.Tensor, new_tokens: int, *, strategy: str = "naive",
                  repeats: int = 3, per_step: bool = False, **kwargs) -> DecodeTiming:
    """``time_decode`` of ``kvlab.decode(model, input_ids, n, strategy=strategy, **kwargs)``
    (``input_ids``: a tensor or a tokenizer's output, as ``kvlab.decode`` takes them). What the
    strategy builds per call (a decoder and its graphs, a compiled step: ``Strategy.state``) is
    built once, here, unless ``kwargs`` hands it over; its capture or compile then falls in the
    warm-up call. A ``cache=`` handed over is emptied in place (``reset``) before every call: each
    timed decode starts from an empty cache. ``strategy``: a name or a ``kvlab.STRATEGIES``
    entry."""
    chosen = strategy_named(strategy)
    strategy = chosen.name  # the label, and what kvlab.decode is given
    check_flags({"per_step": per_step}, ("per_step",))
    if per_step and chosen.steps_per_replay > 1:
        raise ValueError(f"{strategy!r} replays {chosen.steps_per_replay} steps "
                         "per graph: its tokens reach on_token in a burst after each replay, so "
                         "per-step times would mean nothing. Time it with per_step=False (the "
                         "rule needs no per-token clock)")
    new_tokens = count("new_tokens", new_tokens, 2, " (the rule divides by n - 1)")
    input_ids = unpadded_ids(input_ids, kwargs.pop("attention_mask", None))
    check_inputs(model, input_ids, new_tokens)  # as kvlab.decode checks them, before any build
    if chosen.builds is not None and not set(STATE_KEYS) & kwargs.keys():
        check_options(kwargs)
        kwargs = chosen.state(model, input_ids, new_tokens, **kwargs)

    def run(n, on_token):
        if kwargs.get("cache") is not None:
            empty(kwargs["cache"])
        return decode(model, input_ids, n, strategy=strategy, on_token=on_token, **kwargs)

    return time_decode(run, new_tokens, input_ids.device, repeats=repeats, per_step=per_step,
                       label=strategy)


def empty(cache) -> None:
    """Empty ``cache`` in place, its tensors kept where they are: a transformers cache by its
    ``reset``, a ``HandwrittenCache`` (layers made on first use) by dropping its layers."""
    if callable(getattr(cache, "reset", None)):
        with torch.inference_mode():  # a cache filled under inference mode holds its tensors
            cache.reset()
    elif isinstance(getattr(cache, "layers", None), list):
        cache.layers.clear()
    else:
        raise ValueError(f"cache= must be a cache kvlab.decode takes (a transformers cache or a "
                         f"HandwrittenCache), got {type(cache).__name__}")


def time_call(fn, *, label: str = "", min_run_time: float = 0.5,
              device=None) -> benchmark.Measurement:
    """Time ``fn()`` with ``torch.utils.benchmark`` (warm-up and device sync included); read
    ``.median``."""
    check_function(fn, "fn", "fn()")
    if device is not None:
        synchronize(pick_device(device))
    fn()  # warm-up outside the measurement
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, label=label,
                            num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=min_run_time)


def time_interleaved(fns: dict, *, rounds: int = 5, device=None,
                     collect_garbage: bool = False) -> dict[str, float]:
    """Median seconds of each ``fn()`` of ``fns``, timed in turns, each round starting one function
    later: round 1 runs a, b, c; round 2 b, c, a; round 3 c, a, b; ...

    On a shared machine a slowdown then hits every function alike, and a disturbance that recurs at
    the same point of every round hits each function in turn, so their ratios stay honest. Each
    function runs once untimed first (warm-up); the timed rounds run with the garbage collector
    paused (``collector_paused``). ``collect_garbage``: collect after each call, outside its timed
    region, for calls whose cyclic garbage would otherwise pile up over the rounds (gigabytes for
    lesson 07's whole decodes on a CPU). Off by default: the pause it adds between calls lets a GPU
    idle, which slows the next short call (lesson 02's one-token copies).
    """
    if not isinstance(fns, dict) or not fns or not all(callable(fn) for fn in fns.values()):
        raise ValueError("fns must be a non-empty dict of name -> function to time, "
                         f"got {fns!r:.80}")
    rounds = count("rounds", rounds, 1)
    # a clear error for "cuda" without a GPU; device 0 is not "no device" (never read as the CPU)
    device = pick_device("cpu" if device is None else device)
    names = list(fns)
    times: dict[str, list[float]] = {name: [] for name in names}
    for fn in fns.values():
        fn()
    with collector_paused():
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                times[name].append(wall(fns[name], device))
                if collect_garbage:
                    # not timed; never inside a capture (the functions run replays, not captures)
                    gc.collect()
    return {name: statistics.median(ts) for name, ts in times.items()}


# ------------------------------------------------------------------------------------- the profiler
LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                "cudaLaunchCooperativeKernel")


@dataclass
class Profile:
    """What ``profile`` saw: the device's work and the host's calls."""

    # (start µs, duration µs, name): GPU kernels/copies, or CPU leaf aten ops
    kernels: list[tuple[float, float, str]]
    # CPU-side event name -> count (cudaLaunchKernel, cudaGraphLaunch, aten ops, ...)
    host_calls: Counter

    @property
    def busy_seconds(self) -> float:
        return sum(duration for _, duration, _ in self.kernels) / 1e6


def profile(fn: Callable[[], object], device) -> Profile:
    """Run ``fn()`` once under ``torch.profiler`` (device synchronized before and after): every GPU
    kernel and copy on CUDA, every leaf aten operator on a CPU."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    check_function(fn, "fn", "fn()")
    device = pick_device(device)
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    synchronize(device)
    with torch_profile(activities=activities) as prof:
        fn()
        synchronize(device)
    events = prof.events()
    if cuda:
        kernels = [(e.start_ns() / 1e3, e.duration_ns() / 1e3, e.name())
                   for e in prof.profiler.kineto_results.events()
                   if e.device_type() == torch.autograd.DeviceType.CUDA]
    else:
        kernels = [(e.time_range.start, e.time_range.elapsed_us(), e.name) for e in events
                   if e.name.startswith("aten::")
                   and not any(c.name.startswith("aten::") for c in e.cpu_children)]
    host = Counter(e.name for e in events if e.device_type == torch.autograd.DeviceType.CPU)
    return Profile(kernels=sorted(kernels), host_calls=host)


def busy_seconds(fn, device) -> float:
    """Seconds the GPU spent in the kernels and copies of one ``fn()`` call, after a warm-up call.

    Wall time minus this is time the GPU sat idle, waiting for the host to launch the next kernel.
    CUDA only: on a CPU the operators run where they are launched, so their busy time is the wall
    time.
    """
    check_function(fn, "fn", "fn()")
    if pick_device(device).type != "cuda":
        raise ValueError("busy_seconds measures GPU kernel time; on a CPU the wall time is the "
                         "busy time")
    fn()
    return profile(fn, device).busy_seconds


def launches(fn, device) -> dict:
    """One ``fn()`` on CUDA: kernel launches the host made, graph launches, kernels the GPU ran, its
    busy ms."""
    seen = profile(fn, device)
    return {"kernel_launch_calls": sum(seen.host_calls[name] for name in LAUNCH_CALLS),
            "graph_launch_calls": seen.host_calls["cudaGraphLaunch"],
            "kernels_run": len(seen.kernels),
            "gpu_busy_ms": 1e3 * seen.busy_seconds}


def profile_steps(run: Callable[[int], object], k: int, device) -> dict:
    """Kernels (GPU) or leaf ops (CPU) per decode step and their busy time, from profiles of
    ``run(1)`` and ``run(1 + k)`` (k decode steps apart, each run once unprofiled before), with the
    last step's timeline and its heaviest kernels."""
    k = count("k", k, 1, " (decode steps between the two profiles)")
    device = pick_device(device)  # a clear error for "cuda" without a GPU
    # unprofiled first: a length not run before may capture or compile (its warm-up is not a step)
    run(1), run(1 + k)
    one, many = profile(lambda: run(1), device).kernels, profile(lambda: run(1 + k), device).kernels
    if not many:
        raise ValueError(f"run({1 + k}) ran no operation under the profiler: profile_steps "
                         "profiles a decode; give run(n) that decodes n tokens")
    per_step = (len(many) - len(one)) / k
    # a difference: noise can push it below 0
    busy = max(0.0, (sum(e[1] for e in many) - sum(e[1] for e in one)) / k)
    # the last step's events (one step of the last graph replay)
    last = many[-max(1, round(per_step)):]
    t0 = last[0][0]
    top = Counter()
    for _, dur, name in last:
        top[name[:80]] += dur
    return {"kernels_per_step": per_step, "busy_ms_per_step": busy / 1e3,
            "timeline": [[round(s - t0, 2), round(d, 2)] for s, d, _ in last],
            "top_kernels": [[name, round(us, 1)] for name, us in top.most_common(8)]}


# aten ops that only make a new view of existing memory: no kernel runs for them
VIEW_OPS = {"view", "_unsafe_view", "slice", "select", "t", "transpose", "unsqueeze", "squeeze",
            "expand", "alias", "permute", "reshape", "detach"}


class _OpCounter(TorchDispatchMode):
    """Counts the aten operations dispatched under it, composite ones (``linear``, ``to``, SDPA)
    decomposed first, as ``make_fx`` traces them, so each count is of an operation that runs a
    kernel (or a view)."""

    def __init__(self):
        super().__init__()
        self.ops = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        with self:  # the decomposition's own operations are dispatched, and counted, here again
            out = func.decompose(*args, **kwargs)
        if out is not NotImplemented:
            return out
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **kwargs)


def _snapshot(cache) -> Callable[[], None]:
    """A function that puts ``cache`` back as it is now: the cache's and each layer's attributes
    (a layer made or a tensor allocated on first use is dropped again), and the contents of every
    tensor they hold, copied back in place (a captured graph keeps reading the same addresses)."""
    objects = [cache, *cache.layers]
    layers = list(cache.layers)
    attributes = [dict(vars(obj)) for obj in objects]
    saved = [{k: v.clone() for k, v in attrs.items() if isinstance(v, torch.Tensor)}
             for attrs in attributes]

    def restore() -> None:
        cache.layers[:] = layers
        for obj, attrs, tensors in zip(objects, attributes, saved, strict=True):
            for name in set(vars(obj)) - set(attrs):
                delattr(obj, name)
            for name, value in attrs.items():
                setattr(obj, name, value)
                if name in tensors:
                    value.copy_(tensors[name])

    return restore


def step_op_counts(model, cache, token: torch.Tensor) -> Counter:
    """The operations one decode step of ``model`` over ``cache`` runs: ``{op name: count}``, views
    left out (they launch no kernel). Counted by a dispatch mode with make_fx's decompositions (the
    same counts as a make_fx trace, without building its graph). The step runs once; the cache's
    state is restored after it (any cache with ``.layers``: empty or filled, static or grown)."""
    check_cache(cache)
    counter = _OpCounter()
    with torch.inference_mode():
        restore = _snapshot(cache)
        try:
            with counter:
                model(input_ids=token, cache=cache)
        finally:
            restore()
    return Counter({name: n for name, n in counter.ops.items() if name not in VIEW_OPS})


# ------------------------------------------------------------------------------------------- memory
def process_peak_rss_bytes() -> int:
    """The process's peak resident memory so far (CPU). It never goes down, so compare before and
    after."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def reset_peak_memory(device) -> None:
    device = pick_device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device) -> int:
    """CUDA: the caching allocator's peak since the last reset. CPU: the process's peak resident
    set."""
    device = pick_device(device)
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return process_peak_rss_bytes()


def path_peak(peak: int, device) -> int | None:
    """A peak recorded as one path's: CUDA's, reset before the path; None on the CPU, where the
    process peak only grows (reset_peak_memory cannot reset it), so it is no path's own."""
    return peak if pick_device(device).type == "cuda" else None


def allocated_by(make: Callable[[], object], device) -> tuple[object, int | None, int | None]:
    """``make()``, the bytes of CUDA memory it left allocated (``torch.cuda.memory_allocated``
    after minus before: whole blocks of the caching allocator) and the bytes its tensors asked for
    (``requested_bytes.all.current`` of ``torch.cuda.memory_stats``). The two differ by the
    allocator's rounding: 512-byte granules, and a block of over 1 MiB may keep a remainder of up
    to 1 MiB that it does not split off. Garbage is collected first and the collector paused
    meanwhile, so that nothing else is freed in between; None, None off CUDA."""
    check_function(make, "make", "make()")
    device = pick_device(device)
    if device.type != "cuda":
        return make(), None, None
    gc.collect()
    key = "requested_bytes.all.current"
    with collector_paused():
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device), torch.cuda.memory_stats(device)[key]
        made = make()
        torch.cuda.synchronize(device)
        return (made, torch.cuda.memory_allocated(device) - before[0],
                torch.cuda.memory_stats(device)[key] - before[1])


def check_cache(cache, name: str = "cache") -> None:
    """Refuse what is not a KV cache with ``.layers`` (None, a decoder, a tensor), saying what to
    pass."""
    if isinstance(getattr(cache, "layers", None), list):
        return
    held = (f"; pass its .cache ({name}=decoder.cache)"
            if isinstance(getattr(getattr(cache, "cache", None), "layers", None), list) else "")
    raise ValueError(f"{name} must be a KV cache with .layers (a transformers cache, a "
                     f"HandwrittenCache, a decoder's .cache), got "
                     f"{'None' if cache is None else type(cache).__name__}{held}")


def cache_bytes(cache) -> int:
    """Bytes held by the key and value tensors of any cache with ``.layers`` of
    ``.keys``/``.values``."""
    check_cache(cache)
    return tensor_bytes(t for layer in cache.layers for t in (layer.keys, layer.values))


def free_unreferenced(device) -> None:
    """Collect what only reference cycles keep (a compiled step, a decoder's graphs), drop cuBLAS's
    workspaces and hand CUDA's cached blocks back, so the next memory reading is of what is alive.
    Never call it during a capture.

    cuBLAS's workspaces: PyTorch allocates one per (cuBLAS handle, stream) through the caching
    allocator and keeps it for the life of the process. Every capture warms up on a stream of its
    own, so each decoder that ran a cuBLAS matmul left a workspace allocated behind it, and a later
    path's peak counted them as its own."""
    device = pick_device(device)
    gc.collect()
    if device.type == "cuda":
        # no public name; PyTorch's own leak check calls it the same way
        torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.empty_cache()


def memory_held(device) -> dict:
    """Memory in use now, in MB: CUDA's allocated and reserved bytes and the peak so far; on CPU the
    process's RSS."""
    device = pick_device(device)
    if device.type == "cuda":
        return {"allocated_mb": torch.cuda.memory_allocated(device) / 2**20,
                "reserved_mb": torch.cuda.memory_reserved(device) / 2**20,
                "peak_mb": torch.cuda.max_memory_allocated(device) / 2**20}
    try:  # Linux: resident pages now; elsewhere the peak stands in for it
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * resource.getpagesize()
    except OSError:
        rss = process_peak_rss_bytes()
    return {"rss_mb": rss / 2**20, "peak_rss_mb": process_peak_rss_bytes() / 2**20}


def copy_bandwidth_gbps(device) -> float:
    """Bytes read + written per second by a large device copy (the memory roofline the benchmark
    compares against)."""
    # fp32: 1 GiB on GPU, 64 MiB on CPU
    device = pick_device(device)
    numel = 2**28 if device.type == "cuda" else 2**24
    x = torch.ones(numel, dtype=torch.float32, device=device)
    y = torch.empty_like(x)
    seconds = time_call(lambda: y.copy_(x), min_run_time=0.3, device=device).median
    return 2 * x.numel() * 4 / seconds / 1e9


def eager_vs_replay(model, input_ids: torch.Tensor, *, steps: int = 32, rounds: int = 5) -> dict:
    """The same graph-safe decode step run eagerly and replayed from its captured graph, timed in
    turns.

    Returns per-token medians (ms), the ratio, capture seconds, cache and peak memory, and the work
    per step: on CUDA the kernel launches (profiler), elsewhere the aten operations of the traced
    step.
    """
    steps, rounds = count("steps", steps, 1), count("rounds", rounds, 1)
    try:  # ids [batch, prompt_len]; the decode makes 2 tokens (prefill, capture), then `steps`
        check_inputs(model, input_ids, steps + 2, tokenizer_output=False)
    except ValueError as e:
        raise ValueError(f"{e} (eager_vs_replay decodes steps + 2 tokens: give fewer steps or a "
                         "shorter prompt)") from None
    device = input_ids.device
    length = input_ids.shape[1] + steps + 8
    eager = GraphSafeDecoder(model, length, input_ids.shape[0], graph=False)
    replay = GraphSafeDecoder(model, length, input_ids.shape[0])
    for decoder in (eager, replay):
        # prefill + (replay) capture; both caches now hold prompt + 1 token
        decoder.generate(input_ids, 2)
    start = int(replay.cache.cache_position)

    def run(decoder):
        def fn():
            decoder.decode_steps(steps)  # one host read of the counter, then `steps` single steps
            decoder.cache.set_position(start)  # in place: the next round decodes the same positions
        return fn

    fns = {"eager": run(eager), "replay": run(replay)}
    seconds = time_interleaved(fns, rounds=rounds, device=device)
    peaks = {}
    for name, fn in fns.items():
        reset_peak_memory(device)
        fn()
        peaks[name] = path_peak(peak_memory_bytes(device), device)
    if device.type == "cuda":
        work = {name: launches(lambda d=d: d.decode_steps(1), device)
                for name, d in (("eager", eager), ("replay", replay))}
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

"""Measurement: per-step latency, tokens/s, warm-up kept apart, peak memory, and the environment of each number.

Every timer synchronizes the device before it reads the clock, so GPU work queued asynchronously is
counted where it runs, not where it was launched.
"""

from __future__ import annotations

import resource
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field

import torch
import torch.utils.benchmark as benchmark

from .decoding import decode
from .runtime import environment, synchronize


@dataclass
class DecodeRun:
    """What one timed decode measured. Seconds everywhere; ``step_seconds[0]`` is the prefill plus first token."""

    strategy: str
    prompt_len: int
    new_tokens: int
    batch: int
    tokens: torch.Tensor = field(repr=False)
    step_seconds: list[float]  # median over repeats, one entry per generated token
    warmup_seconds: float  # the first, untimed call: compile or capture time lives here
    peak_memory_bytes: int
    env: dict

    @property
    def prefill_seconds(self) -> float:
        return self.step_seconds[0]

    @property
    def median_step_seconds(self) -> float:
        """Median time of one decode step after the prefill."""
        return statistics.median(self.step_seconds[1:] or self.step_seconds)

    @property
    def tokens_per_s(self) -> float:
        """Steady-state decode rate, per sequence, from the median step time."""
        return 1.0 / self.median_step_seconds

    def summary(self) -> dict:
        """A flat, JSON-ready record (no tensors)."""
        d = {k: v for k, v in asdict(self).items() if k not in ("tokens", "step_seconds", "env")}
        d.update(
            median_ms_per_token=1e3 * self.median_step_seconds,
            tokens_per_s=self.tokens_per_s,
            prefill_ms=1e3 * self.prefill_seconds,
            **self.env,
        )
        return d


class StepClock:
    """An ``on_token`` callback that records, after a device sync, the wall time of every step."""

    def __init__(self, device):
        self.device = device
        self.times: list[float] = []
        self.reset()

    def reset(self) -> None:
        synchronize(self.device)
        self.times = []
        self._last = time.perf_counter()

    def __call__(self, step: int, token_ids: torch.Tensor) -> None:
        synchronize(self.device)
        now = time.perf_counter()
        self.times.append(now - self._last)
        self._last = now


def process_peak_rss_bytes() -> int:
    """The process's peak resident memory so far (CPU). It never goes down, so compare before and after."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def reset_peak_memory(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device) -> int:
    """CUDA: the caching allocator's peak since the last reset. CPU: the process's peak resident set."""
    if torch.device(device).type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return process_peak_rss_bytes()


def tensor_bytes(tensors) -> int:
    """Bytes held by the distinct storages behind some tensors (views of one buffer count once)."""
    seen, total = set(), 0
    for t in tensors:
        if t is None or not isinstance(t, torch.Tensor):
            continue
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def cache_bytes(cache) -> int:
    """Bytes held by the key and value tensors of any cache with ``.layers`` of ``.keys``/``.values``."""
    return tensor_bytes(t for layer in cache.layers for t in (layer.keys, layer.values))


def measure_decode(model, input_ids, max_new_tokens: int, *, strategy: str = "naive", repeats: int = 3, **kwargs) -> DecodeRun:
    """Decode once untimed (warm-up, compile, capture), then ``repeats`` times with a clock on every step.

    Returns the per-step medians over the repeats, the tokens of the last run, and the environment.
    """
    device = input_ids.device
    synchronize(device)
    t0 = time.perf_counter()
    decode(model, input_ids, max_new_tokens, strategy=strategy, **kwargs)
    synchronize(device)
    warmup = time.perf_counter() - t0

    reset_peak_memory(device)
    runs = []
    for _ in range(max(1, repeats)):
        clock = StepClock(device)
        tokens = decode(model, input_ids, max_new_tokens, strategy=strategy, on_token=clock, **kwargs)
        runs.append(clock.times)
    step_seconds = [statistics.median(col) for col in zip(*runs, strict=True)]
    return DecodeRun(
        strategy=strategy,
        prompt_len=input_ids.shape[1],
        new_tokens=max_new_tokens,
        batch=input_ids.shape[0],
        tokens=tokens,
        step_seconds=step_seconds,
        warmup_seconds=warmup,
        peak_memory_bytes=peak_memory_bytes(device),
        env=environment(device),
    )


def time_call(fn, *, label: str = "", min_run_time: float = 0.5, device=None) -> benchmark.Measurement:
    """Time ``fn()`` with ``torch.utils.benchmark`` (warm-up and device sync included); read ``.median``."""
    if device is not None:
        synchronize(device)
    fn()  # warm-up outside the measurement
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, label=label, num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=min_run_time)


def time_interleaved(fns: dict, *, rounds: int = 5, device=None) -> dict[str, float]:
    """Median seconds of each ``fn()`` of ``fns``, timed in turns: round 1 runs a, b, c; round 2 a, b, c; ...

    On a shared machine a slowdown then hits every function alike, so their ratios stay honest.
    Each function runs once untimed first (warm-up).
    """
    if not fns or rounds < 1:
        raise ValueError("give at least one function and rounds >= 1")
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()
    for _ in range(rounds):
        for name, fn in fns.items():
            synchronize(device or "cpu")
            t0 = time.perf_counter()
            fn()
            synchronize(device or "cpu")
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def trace(fn, device) -> list[tuple[float, float, str]]:
    """(start µs, duration µs, name) of every GPU kernel/copy (CUDA) or every leaf aten op (CPU) that ``fn()`` ran."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.device(device).type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    synchronize(device)
    with profile(activities=activities) as prof:
        fn()
        synchronize(device)
    if cuda:
        events = [(e.start_ns() / 1e3, e.duration_ns() / 1e3, e.name()) for e in prof.profiler.kineto_results.events()
                  if e.device_type() == torch.autograd.DeviceType.CUDA]
    else:
        events = [(e.time_range.start, e.time_range.elapsed_us(), e.name) for e in prof.events()
                  if e.name.startswith("aten::") and not any(c.name.startswith("aten::") for c in e.cpu_children)]
    return sorted(events)


def busy_seconds(fn, device) -> float:
    """Seconds the GPU spent in the kernels and copies of one ``fn()`` call (torch.profiler), after a warm-up call.

    Wall time minus this is time the GPU sat idle, waiting for the host to launch the next kernel. CUDA only: on a
    CPU the operators run where they are launched, so their busy time is the wall time.
    """
    if torch.device(device).type != "cuda":
        raise ValueError("busy_seconds measures GPU kernel time; on a CPU the wall time is the busy time")
    fn()
    return sum(duration for _, duration, _ in trace(fn, device)) / 1e6


def memory_held(device) -> dict:
    """Memory in use now, in MB: CUDA's allocated and reserved bytes and the peak so far; on CPU the process's RSS."""
    if torch.device(device).type == "cuda":
        return {"allocated_mb": torch.cuda.memory_allocated(device) / 2**20,
                "reserved_mb": torch.cuda.memory_reserved(device) / 2**20,
                "peak_mb": torch.cuda.max_memory_allocated(device) / 2**20}
    try:  # Linux: resident pages now; elsewhere the peak stands in for it
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * resource.getpagesize()
    except OSError:
        rss = process_peak_rss_bytes()
    return {"rss_mb": rss / 2**20, "peak_rss_mb": process_peak_rss_bytes() / 2**20}

"""Checkers for lesson 06 (benchmarks). Each returns a verdict string; print it.

The code exercises run the student's function beside the package's own (``kvlab.lab.measure``'s
decode rule, ``kvlab.sizes``' bandwidth floor, ``kvlab.kernels.gemv``) on inputs made here, and name
the typical mistake they find. The other answers come from the benchmark record the student is
looking at (recorded or live), never typed in.
"""

from __future__ import annotations

import math
import random
import statistics

import torch

from .. import sizes
from ..kernels import gemv as kernels_gemv
from ..lab.measure import DecodeTiming
from ..runtime import count
from .common import (
    FILLED_PREDICTION,
    NotANumber,
    SettingError,
    as_number,
    bad_measurement,
    call_student,
    check_number,
    check_prediction,
    checker,
    choice_of,
    code_checker,
    is_right,
    nearest_mistake,
    number_text,
    read_record,
    real_number,
    record_rows,
    settings_read,
    truth,
    within_noise,
)

# a function computes its value: rounding inside it may drop digits only where 5 or more are left
# (3 digits would hide a slip of a few tenths of a percent, e.g. int(context) in the floor)
COMPUTED_DIGITS = 5


def _right(got: float, want: float, variants: dict[str, float]) -> bool:
    """``got`` is ``want`` up to float rounding; or within 1e-6 of it, or it rounded to
    ``COMPUTED_DIGITS`` significant digits or more, and nearer it than every named wrong
    variant."""
    if within_noise(got, want):
        return True
    near = abs(got - want) <= 1e-6 * abs(want) or _rounded_from(got, want)
    mistakes = [(v, h) for h, v in variants.items()]
    return near and nearest_mistake(got, want, mistakes, rel_tol=math.inf) is None


def _rounded_from(got: float, want: float) -> bool:
    """``got`` is ``want`` rounded to ``COMPUTED_DIGITS`` significant digits or more (a float
    drops trailing zeros: 0.21490 is stored as 0.2149, still 5 digits of 0.214898)."""
    try:
        return any(float(f"{want:.{d}g}") == got for d in range(COMPUTED_DIGITS, 18))
    except (TypeError, ValueError, OverflowError):
        return False


def _first_match(got: float, want: float, variants: dict[str, float]) -> str | None:
    """The hint of the wrong variant that ``got`` is (:func:`nearest_mistake`), or of a value
    rounded to fewer than ``COMPUTED_DIGITS`` significant digits, else None."""
    mistakes = [(v, h) for h, v in variants.items()]
    if nearest_mistake(got, want, mistakes, rel_tol=math.inf) is None and is_right(got, want):
        return (f"your value is rounded ({number_text(got)}): return it as computed; rounding to "
                f"fewer than {COMPUTED_DIGITS} significant digits can hide a slip of a few tenths "
                "of a percent")
    return nearest_mistake(got, want, mistakes, rel_tol=1e-6)


# ---- 1 · tokens per second by the course's rule --------------------------------------------------

def tokens_per_s_solution(t1, tn, n: int, batch: int) -> float:
    """The course's decode rule (``kvlab.lab.measure``): T(1) and T(n) are medians over repeats, as
    ``time_decode`` takes them; ``DecodeTiming`` then makes one step ``(T(n) - T(1)) / (n - 1)`` and
    ``batch`` tokens per step."""
    timing = DecodeTiming(label="exercise", batch=batch, new_tokens=n,
                          tokens=torch.empty(batch, n, dtype=torch.long),
                          warmup_seconds=0.0, prefill_seconds=statistics.median(t1),
                          total_seconds=statistics.median(tn),
                          step_seconds=None, peak_memory_bytes=0, env={})
    return timing.tokens_per_s


# (n new tokens, batch, repeats, seed); an even count of repeats, whose median is the mean of the
# middle two, tells the median from the upper or lower one. Seeds chosen so that every wrong variant
# is the right value (up to float rounding) or over 1% from it: a rate rounded to 3 digits is read
RATE_CASES = [(16, 4, 5, 0), (64, 1, 3, 4), (9, 8, 3, 4), (12, 2, 4, 15)]


def timing_case(n: int, batch: int, repeats: int, seed: int) -> tuple[list[float], list[float]]:
    """Made-up repeats of T(1) and T(n) in seconds: a prefill, n - 1 steps, small noise, and one
    slow repeat of each (a busy machine), in another position for T(1) and T(n)."""
    rng = random.Random(seed)
    prefill, step = rng.uniform(3e-3, 8e-3), rng.uniform(0.5e-3, 3e-3)
    t1 = [prefill * rng.uniform(0.97, 1.03) for _ in range(repeats)]
    tn = [(prefill + (n - 1) * step) * rng.uniform(0.97, 1.03) for _ in range(repeats)]
    t1[0] *= 2.5
    tn[-1] *= 2.0
    return t1, tn


def _rate_variants(t1, tn, n: int, batch: int) -> dict[str, float]:
    med1, medn = statistics.median(t1), statistics.median(tn)
    return {
        "you divided by n: T(n) holds the prefill too (T(1)), so the prefill's time was counted as "
        "decoding; subtract T(1) and divide by the n - 1 steps that follow it": batch * n / medn,
        "off by one: T(n) - T(1) holds n - 1 steps (the first token comes with the prefill), so "
        "divide by n - 1, not n": batch * n / (medn - med1),
        "you took the mean of the repeats: one slow repeat (a busy machine) drags a mean along; "
        "the rule takes the median": (
            batch * (n - 1) / (statistics.fmean(tn) - statistics.fmean(t1))),
        "you took the fastest repeat (min): the rule takes the median, the typical run": (
            batch * (n - 1) / (min(tn) - min(t1))),
        "you paired repeat i of T(1) with repeat i of T(n): they are separate runs; take the "
        "median of each first": (
            statistics.median(batch * (n - 1) / (b - a) for a, b in zip(t1, tn, strict=True))),
        "you took the upper middle repeat: with an even number of repeats the median is the mean "
        "of the two middle ones (statistics.median)": (
            batch * (n - 1) / (statistics.median_high(tn) - statistics.median_high(t1))),
        "you took the lower middle repeat: with an even number of repeats the median is the mean "
        "of the two middle ones (statistics.median)": (
            batch * (n - 1) / (statistics.median_low(tn) - statistics.median_low(t1))),
        "each step makes one token for every sequence of the batch: multiply by batch": (
            (n - 1) / (medn - med1)),
        "that is seconds per step; tokens per second is batch / seconds per step": (
            (medn - med1) / (n - 1)),
        "that is milliseconds per step; tokens per second is batch / seconds per step": (
            1e3 * (medn - med1) / (n - 1)),
    }


@code_checker(tokens_per_s_solution)
def check_tokens_per_s(fn) -> str:
    """Exercise: tokens_per_s(t1, tn, n, batch) = batch / ((median T(n) - median T(1)) / (n - 1)),
    times in seconds."""
    for n, batch, repeats, seed in RATE_CASES:
        t1, tn = timing_case(n, batch, repeats, seed)
        want = tokens_per_s_solution(t1, tn, n, batch)
        case = f"n={n}, batch={batch}, {repeats} repeats"
        try:
            got = float(real_number(call_student(fn, list(t1), list(tn), n, batch), spelled=False))
        except NotANumber as e:
            return (f"not quite: for {case} your function returned no number ({e}); return tokens "
                    "per second as a float")
        variants = _rate_variants(t1, tn, n, batch)
        if not _right(got, want, variants):
            hint = _first_match(got, want, variants)
            return (f"not quite: for {case} you gave {got:,.6g} tokens/s, the rule gives "
                    f"{want:,.6g}. Hint: "
                    + (hint or "medians of T(1) and of T(n) over the repeats, then batch * (n - 1) "
                               "/ (T(n) - T(1))"))
    return (f"correct: all {len(RATE_CASES)} cases match kvlab.lab.measure's rule (medians over "
            "repeats, the prefill subtracted, n - 1 steps, batch tokens per step)")


# ---- 2 · the bandwidth floor of a decode step ----------------------------------------------------

def step_floor_ms_solution(config, weight_bytes: int, dtype, batch: int, context: float,
                           gbps: float) -> float:
    """The package's floor (``kvlab.sizes``): every weight read once per step, plus each sequence's
    cache of ``context`` tokens (``kv_bytes_per_token``: K and V of every layer and kv head), over
    the bandwidth, in milliseconds."""
    return sizes.floor_ms(weight_bytes, sizes.kv_bytes_per_token(config, dtype), batch, context,
                          gbps)


def floor_cases() -> list[tuple]:
    """(label, config, weight_bytes, dtype, batch, context, gbps): SmolLM2-135M's shape (GQA: 9
    query heads, 3 kv heads) and a tiny config whose head_dim is not hidden / heads."""
    from transformers import LlamaConfig

    from ..lab.models import SMOLLM2_SHAPE, TINY_COMMON

    smol, odd = LlamaConfig(**SMOLLM2_SHAPE), LlamaConfig(**{**TINY_COMMON, "head_dim": 24})
    return [
        ("SmolLM2-135M's shape, bfloat16, batch 64", smol, 2 * sizes.llama_parameter_count(smol),
         torch.bfloat16, 64, 400.5, 4000.0),
        ("a tiny Llama with head_dim 24, float64, batch 8", odd,
         8 * sizes.llama_parameter_count(odd), torch.float64, 8, 100.0, 50.0),
        ("SmolLM2-135M's shape, float16, batch 1", smol, 2 * sizes.llama_parameter_count(smol),
         torch.float16, 1, 95.5, 3000.0),
    ]


def _floor_variants(config, weight_bytes, dtype, batch, context, gbps) -> dict[str, float]:
    s = sizes.model_sizes(config)
    element = torch.empty((), dtype=dtype).element_size()

    def floor(*, weights=weight_bytes, kv=None, b=batch, bandwidth=gbps * 1e9, scale=1e3):
        kv = sizes.kv_bytes_per_token(config, dtype) if kv is None else kv
        return scale * (weights + b * context * kv) / bandwidth

    def kv_of(heads=s.kv_heads, head_dim=s.head_dim, layers=s.layers, each=element, k_and_v=2):
        return k_and_v * layers * heads * head_dim * each

    variants = {
        "the cache holds kv_heads heads per layer, not the query heads (grouped-query attention "
        "shares each kv head among several query heads)": floor(kv=kv_of(heads=s.heads)),
        "K without V: a cached token holds a key AND a value per kv head and layer (2 x layers x "
        "kv_heads x head_dim x bytes)": floor(kv=kv_of(k_and_v=1)),
        "a cached token is stored in every layer: multiply by the number of layers": floor(
            kv=kv_of(layers=1)),
        "use the config's head_dim (model_sizes(config).head_dim): here it is not hidden_size / "
        "heads": floor(
            kv=kv_of(head_dim=s.hidden // s.heads)),
        "every sequence of the batch has its own cache: multiply the cache term by batch": (
            floor(b=1)),
        "the weights are read once per step for the whole batch, not once per sequence": floor(
            weights=batch * weight_bytes),
        "a step also reads the cache: add batch x context x KV bytes per token": floor(kv=0),
        "GB/s means 1e9 bytes per second, not 2**30": floor(bandwidth=gbps * 2**30),
        "that is seconds; the floor is asked in milliseconds (x 1e3)": floor(scale=1.0),
        "that is microseconds; the floor is asked in milliseconds": floor(scale=1e6),
    }
    for each in (1, 2, 4, 8):
        if each != element:
            variants.setdefault(f"an element of {dtype} is {element} bytes, not {each}: read it "
                                "from the dtype (torch.empty((), dtype=dtype).element_size())",
                                floor(kv=kv_of(each=each)))
    return variants


@code_checker(step_floor_ms_solution)
def check_step_floor_ms(fn) -> str:
    """Exercise: floor ms = 1e3 x (weight_bytes + batch x context x KV bytes per token) / (gbps x
    1e9), KV from config."""
    for label, config, weight_bytes, dtype, batch, context, gbps in floor_cases():
        want = step_floor_ms_solution(config, weight_bytes, dtype, batch, context, gbps)
        try:
            got = float(real_number(call_student(fn, config, weight_bytes, dtype, batch, context,
                                                 gbps), spelled=False))
        except NotANumber as e:
            return (f"not quite: for {label} your function returned no number ({e}); return the "
                    "floor in milliseconds")
        variants = _floor_variants(config, weight_bytes, dtype, batch, context, gbps)
        if not _right(got, want, variants):
            hint = _first_match(got, want, variants)
            return (f"not quite: for {label}, context {context}, {gbps:g} GB/s you gave {got:.6g} "
                    f"ms, expected {want:.6g} ms. Hint: "
                    + (hint or "KV bytes per token = 2 x layers x kv_heads x head_dim x bytes "
                                                "per element; floor = 1e3 x (weights + batch x "
                                                "context x KV) / (gbps x 1e9)"))
    return ("correct: your floor equals kvlab.sizes.floor_ms with kv_bytes_per_token for every "
            "case (GQA, an explicit head_dim, three dtypes, batch 1 to 64)")


# ---- 3 · predict, then read: the fastest strategy of a record ------------------------------------

BROKEN_RECORD = "the record holds a broken number: record it again on a GPU"


# the keys every row of a benchmark record holds that check_fastest_prediction reads; "exact" is
# read apart: a row without it was never proven token-exact
ROW_KEYS = ("strategy", "batch", "tokens_per_s")


def bench_record(record) -> dict:
    """``check_fastest_prediction``'s ``record=`` read at the door (:func:`read_record`: a dict or
    the path of its .json), as a copy whose rows hold a plain ``strategy`` (str), ``batch`` (int:
    a NumPy or 0-dim tensor int too) and ``exact`` (True, False, or as it was where it is no bool);
    a :class:`SettingError` naming what to pass, or the row and what is wrong with it, otherwise:
    a key missing, a strategy or batch of another type, two rows of one strategy and batch."""
    record = read_record(record, has="results", kind="a benchmark record", example=FASTEST_EXAMPLE)
    rows, seen = [], {}
    for i, row in enumerate(record_rows(record, "results", ROW_KEYS, FASTEST_EXAMPLE)):
        # a batch is a count, a strategy a name: anything else cannot be looked up or sorted
        try:
            # a float of an integral value (pandas reads a column of ints so): that int
            batch = (row["batch"] if not isinstance(row["batch"], float)
                     else int(row["batch"]) if row["batch"].is_integer() else None)
            batch = None if batch is None else count(batch, "batch")
        except ValueError:
            batch = None
        if not isinstance(row["strategy"], str) or batch is None:
            raise SettingError(f"row {i} of record['results'] has strategy "
                               f"{row['strategy']!r:.40} and batch {row['batch']!r:.40}: a "
                               f"strategy is a name (str), a batch an int; pass {FASTEST_EXAMPLE}")
        # two rows of one strategy and batch: which one counts is no choice of the checker's
        if (row["strategy"], batch) in seen:
            raise SettingError(f"rows {seen[row['strategy'], batch]} and {i} of record['results'] "
                               f"are both {row['strategy']!r} at batch {batch}: one row per "
                               "strategy and batch; join parts of a sweep with "
                               "kvlab.lab.bench.merge(a, b), which keeps the later part's row")
        seen[row["strategy"], batch] = i
        exact = truth(row.get("exact"))
        rows.append(dict(row, batch=batch, exact=row.get("exact") if exact is None else exact))
    return dict(record, results=rows)


def rates_at(record: dict, batch: int) -> dict[str, object]:
    """tokens/s of every token-exact strategy of ``record`` (read by :func:`bench_record`) at
    ``batch``, in the record's order, as the record holds them (``bad_measurement`` reads them)."""
    rows = record_rows(record, "results", ROW_KEYS, FASTEST_EXAMPLE)
    rates = {r["strategy"]: r["tokens_per_s"] for r in rows if r["batch"] == batch
             and r.get("exact") is True}
    if not rates:
        batches = sorted({r["batch"] for r in rows})
        if batch in batches:  # rows there, none token-exact: every one made other tokens
            raise ValueError(f"at batch {batch} every result of the record made tokens that differ "
                             "from the reference (exact False): none can be the fastest; record "
                             "again, or pick another batch=")
        raise ValueError(f"the record has no result at batch {batch}; its batch sizes are "
                         f"{batches}: pass one of them as batch=")
    return rates


def unchecked_at(record: dict, batch: int) -> dict[str, str]:
    """The strategies of ``record`` (read by :func:`bench_record`) at ``batch`` whose tokens were
    not checked, each with why: ``exact`` None or absent (a run with --check-tokens 0 or
    --no-check-compiled, an ablation row), or not a bool (a row written by hand). Not proven
    token-exact, they never compete."""
    return {r["strategy"]: ("ran with no token check (exact is None or absent: --check-tokens 0, "
                            "--no-check-compiled or an ablation row)"
                            if r.get("exact") is None else
                            f"recorded exact={r['exact']!r:.40}, which is not a bool (True or "
                            "False), so the token check cannot be read")
            for r in record["results"] if r["batch"] == batch
            and not isinstance(r.get("exact"), bool)}


FASTEST_EXAMPLE = ("kvlab.lab.bench.recorded('h200_batch_sweep'), or the dict (or .json path) that "
                   "kvlab.lab.bench.run_bench wrote")


@settings_read
def check_fastest_prediction(prediction=None, record: dict | str | None = None, *,
                             batch: int = 64) -> str:
    """Predict, then read: which strategy of ``record`` makes the most tokens/s at ``batch``? Only
    strategies proven token-exact compete: a row whose tokens were not checked is not."""
    if record is None:
        return ("no record here: there is nothing to check a prediction against; record one with "
                "`python -m kvlab.lab.bench` on a GPU")
    record = bench_record(record)
    unchecked = unchecked_at(record, batch)
    whys = list(dict.fromkeys(unchecked.values()))
    not_proven = ("; ".join(f"{', '.join(repr(n) for n, w in unchecked.items() if w == why)} "
                            f"{why}" for why in whys)
                  + f", so {'it is' if len(unchecked) == 1 else 'they are'} not proven "
                  "token-exact and cannot count as fastest")
    if unchecked and not any(r["batch"] == batch and r.get("exact") is True
                             for r in record["results"]):
        return (f"not checked: at batch {batch} no result of this record was checked token for "
                f"token: {not_proven}. Record again with the token check on (the default "
                "--check-tokens).")
    rates = rates_at(record, batch)
    bad = bad_measurement({f"tokens_per_s of {name}": rate for name, rate in rates.items()},
                          BROKEN_RECORD)
    if bad:
        return bad
    rates = {name: real_number(rate) for name, rate in rates.items()}  # as bad_measurement read it
    top = max(rates.values())
    tied = [name for name, rate in rates.items() if rate == top]
    named = choice_of(prediction, rates) if prediction is not None else None
    fastest = named if named in tied else tied[0]  # a tie: any of the tied is right
    choices = {name: f"{rate:,.0f} tokens/s at batch {batch}" for name, rate in rates.items()}
    if prediction is not None and named is None and choice_of(prediction, unchecked) is not None:
        return (f"not checked: you predicted {choice_of(prediction, unchecked)!r}, but "
                f"{not_proven}. Of the proven strategies, {' and '.join(map(repr, tied))} "
                f"{'is' if len(tied) == 1 else 'are'} fastest ({top:,.0f} tokens/s).")
    verdict = check_prediction(prediction, measured=fastest, choices=choices,
                               what=f"the fastest strategy at batch {batch} in the record")
    if verdict.removeprefix(FILLED_PREDICTION).startswith(("correct", "not quite: you predicted")):
        if len(tied) > 1:
            verdict += f" (a tie: {', '.join(map(repr, tied))} make the same tokens/s)"
        verdict += "\n" + "\n".join(f"  {name:<20} {rate:>10,.0f} tokens/s" for name, rate in
                                    sorted(rates.items(), key=lambda item: -item[1]))
        if unchecked:
            verdict += f"\n  (left out: {not_proven})"
    return verdict


# ---- predict, then read: the fastest kernel for one projection (the tile sweep) ------------------

TILE_PATHS = {"gemv": "the GEMV kernel, one weight read per row",
              "torch": "cuBLAS, with the norm, SiLU and residual as kernels of their own",
              "tile": "the tile kernel, one weight read per tile of rows"}


TILE_EXAMPLE = "kvlab.lab.bench.recorded('h200_tile_sweep')"


def tile_table(record) -> dict:
    """``check_tile_prediction``'s ``record=`` read at the door (:func:`read_record`), as
    ``kvlab.lab.bench.tile_sweep`` reads it, by the first word of each projection's name; a
    :class:`SettingError` naming what to pass where a sweep lacks what it reads, or holds none."""
    from ..lab.bench import tile_sweep

    record = read_record(record, has="sweeps", kind="a tile-sweep record", example=TILE_EXAMPLE)
    try:
        table = {name.split()[0]: by_rows for name, by_rows in tile_sweep(record).items()}
    except (KeyError, TypeError, AttributeError, IndexError) as e:
        raise SettingError(f"record= is not a tile sweep as tools/time_kernels.py --parts tiles "
                           f"writes it ({type(e).__name__}: {e}): pass {TILE_EXAMPLE}") from None
    if not table or not all(table.values()):
        raise SettingError(f"record= holds no timed tile: pass {TILE_EXAMPLE}")
    return table


# transformers' module names of the projections the sweep joins into one
_JOINED = {"gate_proj": "gate_up", "up_proj": "gate_up", "q_proj": "qkv", "k_proj": "qkv",
           "v_proj": "qkv"}


def _projection(name, table: dict):
    """The sweep's name (a key of ``table``) for ``name`` where it is transformers' module name or
    path (``"down_proj"``, ``"model.layers.0.mlp.gate_proj"``), else ``name`` as given."""
    if not isinstance(name, str) or name in table:
        return name
    last = name.strip().casefold().rsplit(".", 1)[-1]
    spellings = (last, last.removesuffix("_proj"), f"{last}_proj", _JOINED.get(last))
    return next((s for s in spellings if s in table), name)


@settings_read
def check_tile_prediction(prediction=None, record: dict | str | None = None, *,
                          projection: str = "down", rows: int = 64) -> str:
    """Predict, then read: in the recorded tile sweep (``kvlab.lab.bench.tile_sweep``), which of
    ``TILE_PATHS`` is fastest for ``projection`` (the first word of its name) at ``rows`` rows?"""
    if record is None:
        return ("no recorded tile sweep (data/h200_tile_sweep.json) here: there is nothing to "
                "check a prediction against; record one with `python tools/time_kernels.py --parts "
                "tiles` on a GPU")
    table = tile_table(record)
    projection = _projection(projection, table)
    if projection not in table or rows not in table[projection]:
        raise ValueError(f"the sweep has projections {sorted(table)} at rows "
                         f"{sorted(next(iter(table.values())))}")
    cell = table[projection][rows]
    bad = bad_measurement({f"{path} µs": cell[path] for path in TILE_PATHS if path in cell},
                          BROKEN_RECORD)
    if bad:
        return bad
    verdict = check_prediction(prediction, measured=cell["path"], choices=TILE_PATHS,
                               what=f"the fastest kernel for {projection} at {rows} rows in the "
                                    "recorded sweep")
    if verdict.removeprefix(FILLED_PREDICTION).startswith(("correct", "not quite: you predicted")):
        verdict += (f" (GEMV kernel {cell['gemv']:.1f} µs, cuBLAS {cell['torch']:.1f} µs, best "
                    f"tile {cell['tile']:.1f} µs)")
    return verdict


# ---- 5 · padded rows of a batch bucket -----------------------------------------------------------

def bucket_for(n: int, buckets) -> int:
    """The smallest captured batch size that holds ``n`` sequences (what a serving engine pads
    to)."""
    fitting = [b for b in sorted(buckets) if b >= n]
    if not fitting:
        raise ValueError(f"{n} sequences do not fit in any bucket {sorted(buckets)}: run them "
                         "eagerly or split them")
    return fitting[0]


def _running_fits(*, running: int, buckets) -> None:
    """``check_padding_rows``'s settings together: ``running`` sequences fit in a bucket."""
    if running > max(buckets):
        raise SettingError(f"running={running} sequences fit in no bucket of buckets="
                           f"{tuple(buckets)}: give running <= {max(buckets)}, or a larger bucket")


@checker(together=_running_fits)
def check_padding_rows(answer, *, running: int = 5, buckets=(1, 2, 4, 8, 16, 32)) -> str:
    """Exercise: ``running`` sequences decode together; graphs were captured for ``buckets`` batch
    sizes. How many padded (wasted) rows does each replay compute?"""
    answer = as_number(answer)
    bucket = bucket_for(running, buckets)
    verdict = check_number(
        answer, bucket - running, what=f"the padded rows ({running} sequences in the bucket of "
                                       f"{bucket})",
        hint="the engine replays the smallest captured batch size >= the running count; the rest "
             "of its rows are padding.",
    )
    if verdict.startswith("correct"):
        verdict += (": their writes must not enter the cache, which is what override 1 (the valid "
                    "window) guarantees")
    elif verdict.startswith("not quite: you gave") and answer in (bucket, running):
        verdict = verdict.split(" Hint:")[0] + (
            f" Hint: {answer} is the "
            f"{'bucket the engine replays' if answer == bucket else 'number of real rows'}; the "
            "padded rows are the bucket's rows that no running sequence fills.")
    return verdict


# ---- 4 · the first kernel of a layer: RMSNorm + matmul -------------------------------------------

def norm_matmul_solution(x, norm_weight, weight, eps):
    """The package's own: ``kvlab.kernels.gemv.gemv`` with the norm prologue (the PyTorch form on a
    CPU)."""
    return kernels_gemv.gemv(x, weight, norm=norm_weight, eps=eps)


# rows, K, N, eps, scale of x
# the last case makes eps matter: mean(x^2) is about 0.09 there, so leaving eps out is off by far
NORM_CASES = [(1, 64, 48, 1e-6, 3.0), (3, 576, 96, 1e-5, 3.0), (2, 64, 32, 0.5, 0.3)]


def _norm_variants(x, norm_weight, weight, eps) -> dict[str, torch.Tensor]:
    ms = x.pow(2).mean(-1, keepdim=True)
    return {
        "no normalization: divide each row of x by its rms, sqrt(mean(x^2) + eps), before the "
        "matmul": (x * norm_weight) @ weight.T,
        "norm_weight left out: the normalized row is scaled by norm_weight (elementwise) before "
        "the matmul": (
            x * torch.rsqrt(ms + eps)) @ weight.T,
        "eps left out: rms = sqrt(mean(x^2) + eps), eps inside the square root": (
            x * torch.rsqrt(ms) * norm_weight) @ weight.T,
        "eps goes inside the square root: sqrt(mean(x^2) + eps), not sqrt(mean(x^2)) + eps": (
            x / (ms.sqrt() + eps) * norm_weight) @ weight.T,
        "that is a LayerNorm (mean subtracted): RMSNorm only divides by the root mean square": (
            (x - x.mean(-1, keepdim=True))
            * torch.rsqrt(x.var(-1, unbiased=False, keepdim=True) + eps) * norm_weight) @ weight.T,
        "the mean is over the last dimension (each row's K numbers), not over the rows": (
            x * torch.rsqrt(x.pow(2).mean(0, keepdim=True) + eps) * norm_weight) @ weight.T,
    }


@code_checker(norm_matmul_solution)
def check_norm_matmul(fn) -> str:
    """Exercise: norm_matmul = RMSNorm of each row of x [rows, K] (norm_weight, eps), then @
    weight.T ([N, K]) -> [rows, N]."""
    gen = torch.Generator().manual_seed(6)
    for rows, k, n, eps, scale in NORM_CASES:
        x, weight = (torch.randn(rows, k, generator=gen) * scale,
                     torch.randn(n, k, generator=gen) / k**0.5)
        norm_weight = torch.rand(k, generator=gen) + 0.5
        expected = norm_matmul_solution(x, norm_weight, weight, eps)
        got = call_student(fn, x.clone(), norm_weight.clone(), weight.clone(), eps)
        if not isinstance(got, torch.Tensor):
            return (f"not quite: norm_matmul returned a {type(got).__name__}; return a tensor "
                    "[rows, N]")
        if not got.dtype.is_floating_point:
            return (f"not quite: norm_matmul returned a {got.dtype} tensor; the result of a norm "
                    "and a matmul is a float")
        if got.device.type != "cpu" or got.shape != expected.shape:
            return (f"not quite: for x {list(x.shape)} and weight {list(weight.shape)} you "
                    f"returned shape {list(got.shape)} on {got.device}, expected "
                    f"{list(expected.shape)}. Hint: weight is [N, K]: multiply by weight.T")
        if not torch.allclose(got.double(), expected.double(), rtol=1e-4, atol=1e-5):
            if got.dtype.itemsize < x.dtype.itemsize:  # the rounding alone misses the tolerance
                return (f"not quite: norm_matmul returned {got.dtype} for {x.dtype} inputs. Hint: "
                        f"return the inputs' dtype ({x.dtype}): {got.dtype} rounds the result "
                        "past the kernel's tolerance; leave the casts out")
            hint = next((h for h, v in _norm_variants(x, norm_weight, weight, eps).items()
                         if torch.allclose(got.double(), v.double(), rtol=1e-4, atol=1e-5)), None)
            return (f"not quite: for x {list(x.shape)}, eps {eps} your result differs from the "
                    "kernel's. Hint: "
                    + (hint or "rms = sqrt(mean(x^2 over the last dim) + eps); (x / rms * "
                               "norm_weight) @ weight.T"))
    return ("correct: your norm + matmul equals kvlab.kernels.gemv.gemv(..., norm=...). In the "
            "kernel each program recomputes the row's rms itself, so the normed x never goes to "
            "memory and no separate norm kernel runs")

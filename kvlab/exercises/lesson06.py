"""Checkers for lesson 06 (benchmarks). Each returns a verdict string; print it.

Expected values come from the benchmark record the student is looking at (recorded or live), never typed in.
"""

from __future__ import annotations

from .common import NOT_ANSWERED, check_number


def _row(record: dict, strategy: str, batch: int = 1) -> dict:
    for row in record["results"]:
        if row["strategy"] == strategy and row["batch"] == batch:
            return row
    raise ValueError(f"the record has no {strategy!r} result at batch {batch}; pick one of "
                     f"{sorted({r['strategy'] for r in record['results']})}")


def floor_ms(record: dict, batch: int = 1) -> float:
    """The bandwidth floor of one decode step for ``record``: (weights + batch x average context x KV bytes) / bandwidth."""
    s, m = record["settings"], record["model"]
    context = s["prompt_len"] + (s["new_tokens"] - 1) / 2
    return 1e3 * (m["weight_bytes"] + batch * context * m["kv_bytes_per_token"]) / (record["copy_bandwidth_gbps"] * 1e9)


def check_floor(answer, record: dict, *, batch: int = 1) -> str:
    """Exercise: from the record's weight bytes, KV bytes per token, average context and copy bandwidth, the
    fastest any decode step could be, in milliseconds."""
    return check_number(
        answer, floor_ms(record, batch), what="the floor of one decode step (ms)", rel_tol=0.02,
        hint="bytes read once per step = weight_bytes + batch x (prompt_len + (new_tokens - 1) / 2) x kv_bytes_per_token; "
             "divide by copy_bandwidth_gbps x 1e9 and multiply by 1e3 for ms.",
    )


def idle_fraction(record: dict, strategy: str, batch: int = 1) -> float:
    row = _row(record, strategy, batch)
    return 1 - row["busy_ms_per_step"] / row["ms_per_token"]


def check_idle_fraction(answer, record: dict, strategy: str = "static", *, batch: int = 1) -> str:
    """Exercise: what fraction of one decode step of ``strategy`` does the device sit idle?"""
    return check_number(
        answer, round(idle_fraction(record, strategy, batch), 3), what=f"the idle fraction of a {strategy} step",
        rel_tol=0.03, hint="idle = 1 - busy_ms_per_step / ms_per_token (busy: the summed kernel time the profiler saw in one step).",
    )


def bucket_for(n: int, buckets) -> int:
    """The smallest captured batch size that holds ``n`` sequences (what a serving engine pads to)."""
    fitting = [b for b in sorted(buckets) if b >= n]
    if not fitting:
        raise ValueError(f"{n} sequences do not fit in any bucket {sorted(buckets)}: run them eagerly or split them")
    return fitting[0]


def check_padding_rows(answer, *, running: int = 5, buckets=(1, 2, 4, 8, 16, 32)) -> str:
    """Exercise: ``running`` sequences decode together; graphs were captured for ``buckets`` batch sizes. How many
    padded (wasted) rows does each replay compute?"""
    if answer is None:
        return NOT_ANSWERED
    bucket = bucket_for(running, buckets)
    verdict = check_number(
        answer, bucket - running, what=f"the padded rows ({running} sequences in the bucket of {bucket})",
        hint="the engine replays the smallest captured batch size >= the running count; the rest of its rows are padding.",
    )
    if verdict.startswith("correct"):
        verdict += ": their writes must not enter the cache, which is what override 1 (the valid window) guarantees"
    return verdict

"""Checkers for lesson 06 (benchmarks). Each returns a verdict string; print it.

Expected values come from the benchmark record the student is looking at (recorded or live), never typed in.
"""

from __future__ import annotations

from .common import NOT_ANSWERED, check_number, checker


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


@checker
def check_floor(answer, record: dict, *, batch: int = 1) -> str:
    """Exercise: from the record's weight bytes, KV bytes per token, average context and copy bandwidth, the
    fastest any decode step could be, in milliseconds."""
    return check_number(
        answer, floor_ms(record, batch), what="the floor of one decode step (ms)", rel_tol=0.001,
        hint="bytes read once per step = weight_bytes + batch x (prompt_len + (new_tokens - 1) / 2) x kv_bytes_per_token; "
             "divide by copy_bandwidth_gbps x 1e9 and multiply by 1e3 for ms.",
    )


def idle_fraction(record: dict, strategy: str, batch: int = 1) -> float:
    row = _row(record, strategy, batch)
    return 1 - row["busy_ms_per_step"] / row["ms_per_token"]


@checker
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


@checker
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


@checker
def check_norm_matmul(fn) -> str:
    """Exercise: write ``norm_matmul(x, norm_weight, weight, eps) -> [rows, N]``, what the first kernel of every layer of
    ``graph-safe-kernels`` computes: LlamaRMSNorm of x ``[rows, K]``, then ``@ weight.T`` (weight ``[N, K]``). Checked
    against ``kvlab.kernels.gemv.gemv(x, weight, norm=norm_weight, eps=eps)`` in float32 on the CPU."""
    import torch

    from ..kernels import gemv as kernels_gemv

    if fn is None:
        return NOT_ANSWERED
    gen = torch.Generator().manual_seed(6)
    for rows, k, n, eps, scale in [(1, 64, 48, 1e-6, 3.0), (3, 576, 96, 1e-5, 3.0), (2, 64, 32, 0.5, 0.3)]:
        # the last case makes eps matter: mean(x^2) is about 0.09 there, so leaving eps out is off by far
        x, weight = torch.randn(rows, k, generator=gen) * scale, torch.randn(n, k, generator=gen) / k**0.5
        norm_weight = torch.rand(k, generator=gen) + 0.5
        expected = kernels_gemv.gemv(x, weight, norm=norm_weight, eps=eps)
        try:
            got = torch.as_tensor(fn(x, norm_weight, weight, eps))
        except Exception as e:  # a student's bug: report it, never raise
            return f"not quite: norm_matmul raised {type(e).__name__}: {e}"
        if not got.dtype.is_floating_point:
            return f"not quite: norm_matmul returned a {got.dtype} tensor; the result of a norm and a matmul is a float"
        if got.shape != expected.shape or not torch.allclose(got.double(), expected.double(), rtol=1e-4, atol=1e-5):
            return (f"not quite: for x {list(x.shape)} and weight {list(weight.shape)} your result differs from the kernel's "
                    f"(shape {list(got.shape)}, expected {list(expected.shape)}). Hint: rms = sqrt(mean(x^2 over the last "
                    "dim) + eps); (x / rms * norm_weight) @ weight.T.")
    return ("correct: your norm + matmul equals kvlab.kernels.gemv.gemv(..., norm=...). In the kernel each program recomputes "
            "the row's rms itself, so the normed x never goes to memory and no separate norm kernel runs")

"""Lesson 06 checkers: right answers pass, wrong ones get a hint, None says not answered."""

import pytest

from kvlab import bench
from kvlab.exercises import lesson06
from kvlab.exercises.common import NOT_ANSWERED


@pytest.fixture(scope="module")
def record():
    rec = bench.recorded("h200_batch1")
    assert rec is not None, "data/h200_batch1.json is part of the course"
    return rec


def test_floor(record):
    right = lesson06.floor_ms(record)
    row = next(r for r in record["results"] if r["strategy"] == "naive")
    assert right == pytest.approx(row["floor_ms_per_token"])  # the same formula as the benchmark's
    assert lesson06.check_floor(None, record) == NOT_ANSWERED
    assert lesson06.check_floor(right * 1.0005, record).startswith("correct")  # rounding
    assert lesson06.check_floor(right * 1.01, record).startswith("not quite")
    m, st = record["model"], record["settings"]
    no_kv = 1e3 * m["weight_bytes"] / (record["copy_bandwidth_gbps"] * 1e9)  # the cache term left out
    full_context = 1e3 * (m["weight_bytes"] + (st["prompt_len"] + st["new_tokens"]) * m["kv_bytes_per_token"]) / (
        record["copy_bandwidth_gbps"] * 1e9)  # the whole context instead of the average
    assert lesson06.check_floor(no_kv, record).startswith("not quite")
    assert lesson06.check_floor(full_context, record).startswith("not quite")
    assert lesson06.check_floor(right * 2, record).startswith("not quite") and "Hint" in lesson06.check_floor(right * 2, record)
    assert lesson06.check_floor("fast", record).startswith("not quite")


def test_idle_fraction(record):
    right = lesson06.idle_fraction(record, "static")
    assert 0 < right < 1
    assert lesson06.check_idle_fraction(round(right, 2), record).startswith("correct")
    assert lesson06.check_idle_fraction(right / 2, record).startswith("not quite")
    assert lesson06.check_idle_fraction(None, record) == NOT_ANSWERED
    assert "no 'flash'" in lesson06.check_idle_fraction(0.5, record, "flash")  # a verdict, never a traceback


def test_padding_rows():
    assert lesson06.bucket_for(5, (1, 2, 4, 8)) == 8 and lesson06.bucket_for(8, (8, 1)) == 8
    assert lesson06.check_padding_rows(None) == NOT_ANSWERED
    assert lesson06.check_padding_rows(3).startswith("correct") and "valid window" in lesson06.check_padding_rows(3)
    assert lesson06.check_padding_rows(5).startswith("not quite")
    assert lesson06.check_padding_rows(0, running=16).startswith("correct")
    with pytest.raises(ValueError, match="do not fit"):
        lesson06.bucket_for(40, (1, 2, 4, 8, 16, 32))


def test_norm_matmul():
    import torch

    def right(x, norm_weight, weight, eps):
        return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * norm_weight) @ weight.T

    assert lesson06.check_norm_matmul(None) == NOT_ANSWERED
    assert lesson06.check_norm_matmul(right).startswith("correct")
    assert lesson06.check_norm_matmul(lambda x, nw, w, eps: (x * nw) @ w.T).startswith("not quite")  # no normalization
    assert lesson06.check_norm_matmul(lambda x, nw, w, eps: x @ w).startswith("not quite")  # wrong shapes: reported
    no_eps = lambda x, nw, w, eps: (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True)) * nw) @ w.T  # noqa: E731
    assert lesson06.check_norm_matmul(no_eps).startswith("not quite")
    assert lesson06.check_norm_matmul(lambda *a: right(*a).double()).startswith("correct")  # float64: the same values
    assert "float" in lesson06.check_norm_matmul(lambda *a: right(*a).long())

"""Round 16 of the hostile-user probe, exercise checkers: a bfloat16 tolerance that passed a wrong
attention scale, record= read inside the checked region, bench rows without a key, and
kept_drafts in uint8."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import transformers

from kvlab.exercises import lesson00, lesson01, lesson02, lesson03, lesson05, lesson06, lesson07
from kvlab.exercises.common import SettingError
from kvlab.speculative import kept_drafts

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _attention(*, scale=1.0, root=True, causal=True):
    """softmax(q * scale @ keys.T / sqrt(d)) @ values, with the root or the mask left out."""
    def attend(q, keys, values):
        T, S, d = q.shape[0], keys.shape[0], q.shape[-1]
        scores = (q * scale) @ keys.T / (math.sqrt(d) if root else 1)
        if causal:
            scores = scores.masked_fill(~torch.ones(T, S, dtype=torch.bool).tril(S - T),
                                        float("-inf"))
        return torch.softmax(scores, dim=-1) @ values
    return attend


def _sdpa(q, keys, values):
    T, S = q.shape[0], keys.shape[0]
    mask = torch.ones(T, S, dtype=torch.bool).tril(S - T)
    return F.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=mask)[0]


def _in(fn, dtype, *, via=None):
    """``fn`` on the inputs cast to ``dtype`` (or computed in ``via`` and the output cast)."""
    def attend(q, keys, values):
        work = via or dtype
        return fn(q.to(work), keys.to(work), values.to(work)).to(dtype)
    return attend


@pytest.mark.parametrize("dtype", DTYPES)
def test_attend_wrong_scale_fails_in_every_dtype(dtype):
    """In bfloat16 the tolerance was 4 epsilons, so an attention with 1/sqrt(d) off by 5% (or 10%)
    was called correct."""
    for wrong in (_attention(scale=1.05), _attention(scale=0.95), _attention(scale=1.1),
                  _attention(root=False), _attention(causal=False)):
        verdict = lesson02.check_attend(_in(wrong, dtype))
        assert verdict.startswith("not quite"), (dtype, verdict)


@pytest.mark.parametrize("dtype", DTYPES)
def test_attend_right_attention_passes_in_every_dtype(dtype):
    """A right attention, computed in the dtype or in float32 and cast, stays correct."""
    for right in (_in(_attention(), dtype), _in(_sdpa, dtype), _in(lesson02.attend, dtype),
                  _in(_attention(), dtype, via=torch.float32),
                  _in(_sdpa, dtype, via=torch.float64)):
        verdict = lesson02.check_attend(right)
        assert verdict.startswith("correct"), (dtype, verdict)


# ---- record= read at the door --------------------------------------------------------------------

LESSON05_GPU = Path(__file__).resolve().parents[1] / "data" / "lesson05_gpu.json"


def _launch_record(eager_launches=1000, replay_launches=0, **work):
    return {"eager_ms_per_token": 3.0, "replay_ms_per_token": 0.5,
            "work_per_step": {"eager": {"kernel_launch_calls": eager_launches, **work},
                              "replay": {"kernel_launch_calls": replay_launches, **work}}}


@pytest.mark.parametrize("record", [
    json.loads(LESSON05_GPU.read_text()),  # two sections: which one?
    {"eager_ms_per_token": 2.0, "replay_ms_per_token": 1.0,  # a CPU run: no launches
     "work_per_step": {"eager": {"aten_ops": 10}, "replay": {"aten_ops": 10}}},
    {"eager_ms_per_token": 2.0},  # not an eager-vs-replay record
    [1, 2, 3],
    "no/such/file.json",
    _launch_record(eager_launches="many"),
])
def test_launch_cost_refuses_a_record_it_cannot_use(record):
    """A record the checker could not use (the whole two-section file, a CPU run, another dict)
    raised inside the checker and was shown as the student's "not quite"."""
    with pytest.raises(SettingError, match="record"):
        lesson05.check_launch_cost_us(2.5, record=record)
    with pytest.raises(SettingError):  # at the door: before the answer is looked at
        lesson05.check_launch_cost_us(None, record=record)


def test_launch_cost_reads_a_path_and_a_section():
    """A path to data/lesson05_gpu.json (str or Path) raised a TypeError shown as "not quite"; a
    section of it, or a file holding one section, is read as the record."""
    data = json.loads(LESSON05_GPU.read_text())
    section = data["eager_vs_replay_bfloat16"]
    cost = lesson05.launch_cost_us(section)
    assert lesson05.check_launch_cost_us(cost, record=section).startswith("correct")
    with pytest.raises(SettingError, match="eager_vs_replay_bfloat16"):
        lesson05.check_launch_cost_us(cost, record=str(LESSON05_GPU))
    with tempfile.TemporaryDirectory() as tmp:
        one = Path(tmp) / "one.json"
        one.write_text(json.dumps({"model": "m", "eager_vs_replay_bfloat16": section}))
        for path in (one, str(one)):
            assert lesson05.check_launch_cost_us(cost, record=path).startswith("correct")


def test_launch_cost_no_launch_removed_is_not_checked():
    """A record with no kernel launch removed (or none at all) raised ValueError or
    ZeroDivisionError inside, shown as "not quite"."""
    for record in (_launch_record(0, 0), _launch_record(5, 5), _launch_record(3, 7)):
        verdict = lesson05.check_launch_cost_us(2.5, record=record)
        assert verdict.startswith("not checked") and "removed none" in verdict, verdict


# ---- bench rows: "exact" and the other keys ------------------------------------------------------

def _bench(*rows):
    return {"results": [dict(r) for r in rows]}


def test_fastest_row_without_exact_does_not_compete():
    """A bench row without an "exact" key raised a KeyError; not proven token-exact, it does not
    compete."""
    fast = {"strategy": "static", "batch": 64, "tokens_per_s": 900.0}
    slow = {"strategy": "dynamic", "batch": 64, "tokens_per_s": 100.0, "exact": True}
    verdict = lesson06.check_fastest_prediction("dynamic", _bench(fast, slow))
    assert verdict.startswith("correct") and "'static'" in verdict, verdict
    alone = lesson06.check_fastest_prediction("static", _bench(fast))
    assert alone.startswith("not checked") and "not proven token-exact" in alone, alone


@pytest.mark.parametrize("key", ["strategy", "batch", "tokens_per_s"])
def test_fastest_row_missing_a_key_is_named(key):
    """A bench row missing "strategy", "batch" or "tokens_per_s" raised a raw KeyError."""
    row = {"strategy": "static", "batch": 64, "tokens_per_s": 900.0, "exact": True}
    del row[key]
    with pytest.raises(SettingError, match=f"row 0 .*{key!r}"):
        lesson06.check_fastest_prediction("static", _bench(row))


# ---- kept_drafts: an index dtype -----------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16])
def test_kept_drafts_narrow_integer_refused(dtype):
    """A kept count returned as torch.uint8 was called correct; the count moves the position
    counter and is a long like every index the lessons use."""
    verdict = lesson07.check_kept_drafts(lambda r, v: kept_drafts(r, v).to(dtype))
    assert verdict.startswith("not quite") and str(dtype) in verdict, verdict
    assert lesson07.check_kept_drafts(
        lambda r, v: kept_drafts(r, v).to(torch.int32)).startswith("correct")


@pytest.mark.parametrize("record", [{"sweeps": []}, {"sweeps": [{"tiles": {"down": [{}]}}]},
                                    {"sweeps": [{"no tiles": 1}]}, {"sweeps": 3}])
def test_tile_prediction_record_it_cannot_read_is_refused(record):
    """A tile-sweep record without what tile_sweep reads raised a raw KeyError, TypeError or
    StopIteration."""
    with pytest.raises(SettingError, match="record="):
        lesson06.check_tile_prediction("gemv", record)


# ---- config= that kvlab.sizes cannot read --------------------------------------------------------

@pytest.mark.parametrize("config", [transformers.GPT2Config(), transformers.T5Config(),
                                    transformers.LlamaConfig(num_key_value_heads=5)])
def test_config_sizes_cannot_read_is_refused_at_the_door(config):
    """A config= that kvlab.sizes cannot read (no intermediate_size, kv heads that do not divide)
    raised inside the check and came back as "your code raised" or "could not be checked"."""
    calls = [lambda: lesson01.check_step_flops(lesson01.step_flops, config=config),
             lambda: lesson00.check_parameter_count(lesson00.llama_parameter_count,
                                                    config=config),
             lambda: lesson02.check_cache_bytes(5, config=config, tokens=3, dtype=torch.float16),
             lambda: lesson03.check_static_cache_bytes(5, config=config, max_cache_len=3,
                                                       dtype=torch.float16)]
    for call in calls:
        with pytest.raises(SettingError, match="config=: kvlab.sizes cannot read"):
            call()


@pytest.mark.parametrize("row", [{"strategy": "static", "batch": "64"},
                                 {"strategy": ["static"], "batch": 64}])
def test_fastest_row_of_wrong_types_is_named(row):
    """A bench row whose batch is text (next to int batches) or whose strategy is a list raised a
    raw TypeError (sorting mixed batches, hashing a list)."""
    good = {"strategy": "dynamic", "batch": 1, "tokens_per_s": 100.0, "exact": True}
    bad = {**row, "tokens_per_s": 900.0, "exact": True}
    with pytest.raises(SettingError, match="row 1"):
        lesson06.check_fastest_prediction("static", _bench(good, bad))


def test_padding_rows_settings_that_do_not_fit_are_refused_unanswered():
    """running= larger than every bucket was refused only once an answer was given: unanswered, the
    checker said "not answered yet" for settings it could never check."""
    with pytest.raises(SettingError, match="running=100"):
        lesson06.check_padding_rows(None, running=100)

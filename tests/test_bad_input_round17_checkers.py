"""Round 17 of the hostile-user probe, exercise checkers: a generation_config edited in place, a
cache that drops old positions, student functions that change their inputs, a NotImplementedError
raised after an earlier case passed, and answers refused or hinted wrong."""

from __future__ import annotations

import copy

import pytest
import torch

from kvlab.exercises import lesson00, lesson01, lesson02, lesson05, lesson06, lesson07
from kvlab.exercises.common import SettingError, choice_of
from kvlab.lab.bench import recorded
from kvlab.lab.models import tiny_model
from kvlab.sizes import kv_cache_bytes


def _greedy_loop(model, ids, n):
    seq = ids
    for _ in range(n):
        nxt = model(seq).logits[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], 1)
    return seq[:, ids.shape[1]:]


def test_generation_config_edited_in_place_is_named_and_put_back():
    """A decode function that set model.generation_config.do_sample/top_k in place was called
    correct and left the caller's model.generate sampling."""
    model = tiny_model("tiny-llama")
    before = model.generation_config.to_dict()

    def sampling(model, ids, n):
        model.generation_config.do_sample = True
        model.generation_config.top_k = 5
        return _greedy_loop(model, ids, n)

    verdict = lesson01.check_naive_decode(sampling, model=model)
    assert verdict.startswith("not quite: your code changed the model"), verdict
    assert "model.generation_config.do_sample" in verdict
    assert model.generation_config.to_dict() == before


def _capped_cache(cap):
    class Capped:
        """A cache that keeps only the last ``cap`` positions of each layer."""

        def __init__(self):
            self.k, self.v = {}, {}

        def update(self, k, v, layer_idx, *args, **kwargs):
            if layer_idx in self.k:
                k = torch.cat([self.k[layer_idx], k], -2)[:, :, -cap:]
                v = torch.cat([self.v[layer_idx], v], -2)[:, :, -cap:]
            self.k[layer_idx], self.v[layer_idx] = k, v
            return k, v
    return Capped


def test_cache_that_drops_old_positions_is_not_quite():
    """A cache keeping only the last 7 or 8 positions passed check_cache_update: the call-by-call
    checks never hold more than 5, and the plugged decode compared argmax tokens only."""
    for cap in (7, 8):
        verdict = lesson02.check_cache_update(_capped_cache(cap))
        assert verdict.startswith("not quite"), (cap, verdict)
        assert "update call" in verdict and "layer 0" in verdict
    assert lesson02.check_cache_update(_capped_cache(10**6)).startswith("correct")


def test_functions_that_change_their_inputs_are_not_quite():
    """Functions that wrote into their inputs (counter.add_, valid.zero_(), rows.zero_(),
    blocks.append) were called correct; the right forms of the same functions still pass."""
    def positions(counter, valid, bucket, slots):
        rows = torch.arange(bucket)
        return torch.where((rows < valid) & (counter + rows < slots), counter + rows, slots)

    def advancing(counter, valid, bucket, slots):
        out = positions(counter, valid, bucket, slots)
        counter.add_(valid)
        return out

    def zeroing(counter, valid, bucket, slots):
        out = positions(counter, valid, bucket, slots)
        valid.zero_()
        return out

    def kept(rows, verified):
        return (rows[:, 1:] == verified[:, :-1]).long().cumprod(-1).sum(-1).min()

    def kept_zeroing(rows, verified):
        out = kept(rows, verified)
        rows.zero_()
        return out

    def slots(blocks, start, stop, bs):
        return [blocks[p // bs] * bs + p % bs for p in range(start, stop)]

    def slots_appending(blocks, start, stop, bs):
        out = slots(blocks, start, stop, bs)
        blocks.append(99)
        return out

    for check, right, wrong, name in (
            (lesson05.check_write_positions, positions, advancing, "counter"),
            (lesson05.check_write_positions, positions, zeroing, "valid"),
            (lesson07.check_kept_drafts, kept, kept_zeroing, "rows"),
            (lesson07.check_slots, slots, slots_appending, "blocks")):
        assert check(right).startswith("correct"), check(right)
        verdict = check(wrong)
        assert verdict.startswith(f"not quite: your function changed its input {name} "), verdict


def test_not_implemented_after_an_earlier_answer_is_not_quite(monkeypatch):
    """A function that answered batch 1 and raised NotImplementedError for batch 2 was told "not
    attempted" (under KVLAB_SOLUTIONS=1 the reference was swapped in halfway)."""
    def batch1_only(model, ids, n):
        if ids.shape[0] > 1:
            raise NotImplementedError("batches are not supported yet")
        return _greedy_loop(model, ids, n)

    for solutions in ("0", "1"):
        monkeypatch.setenv("KVLAB_SOLUTIONS", solutions)
        verdict = lesson01.check_naive_decode(batch1_only)
        assert verdict.startswith("not quite: your code raised NotImplementedError"), verdict
        assert "batches are not supported yet" in verdict and "batch1_only(" in verdict

    class Stub:  # the stub's own raise on the first update call: still not attempted
        def update(self, k, v, layer_idx, *args, **kwargs):
            raise NotImplementedError

    monkeypatch.setenv("KVLAB_SOLUTIONS", "0")
    assert lesson02.check_cache_update(Stub).startswith("not attempted")


def test_cache_bytes_without_the_batch_gets_the_batch_hint():
    """check_cache_bytes had no "forgot the batch" mistake: an answer for one sequence got the
    generic hint."""
    config = lesson00.small_gqa_config()
    for batch in (2, 3):
        one = kv_cache_bytes(config, 100, torch.float16)
        verdict = lesson02.check_cache_bytes(one, config=config, tokens=100, dtype=torch.float16,
                                             batch=batch)
        assert verdict.startswith("not quite") and f"batch's {batch} sequences" in verdict, verdict


def test_padding_rows_buckets_as_a_set_or_range():
    """check_padding_rows refused buckets={1, 2, 4, 8} and buckets=range(1, 9) at the door."""
    for buckets in ({1, 2, 4, 8}, frozenset({8, 1, 4, 2}), range(1, 9)):
        bucket = min(b for b in buckets if b >= 5)
        verdict = lesson06.check_padding_rows(bucket - 5, running=5, buckets=buckets)
        assert verdict.startswith("correct"), (buckets, verdict)


def test_prediction_spellings_of_ratio_percent_and_thousands():
    """Right predictions spelled 4, "4", "x4" (for "4x"), 2 (for "2x"), "between 2x and 4x", 10,
    "10", 0.1 (for "10%") and "10k" (for 10000) were refused as not a choice."""
    def doubling(prediction, ratio):
        return lesson01.check_doubling_prediction(prediction, seconds=1.0, doubled_seconds=ratio)

    for prediction, ratio in ((4, 3.9), ("4", 3.9), ("x4", 3.9), (2, 2.0),
                              ("between 2x and 4x", 3.0)):
        assert doubling(prediction, ratio).startswith("correct"), (prediction, ratio)
    assert doubling(4, 2.0).startswith("not quite: you predicted '4x'")
    gqa, mha = 134_515_008, 147_786_048  # a ratio of 1.099: "10%"
    for prediction in (10, "10", 0.1):
        verdict = lesson00.check_gqa_prediction(prediction, gqa_parameters=gqa, mha_parameters=mha)
        assert verdict.startswith("correct"), (prediction, verdict)
    cache_per_token = 46080
    weights = 10_000 * cache_per_token
    assert lesson02.check_cache_vs_weights_prediction(
        "10k", weight_bytes=weights, cache_bytes_per_token=cache_per_token).startswith("correct")


def test_a_fraction_names_no_percentage_key_where_two_fit():
    """The rule that reads 0.1 as "10%" must not pick a key where 0.1 also names "0.1%"."""
    choices = {"0.1%": "a tenth of a percent", "10%": "ten percent"}
    assert choice_of(0.1, choices) is None
    assert choice_of(10, choices) == "10%" and choice_of("0.1 %", choices) == "0.1%"


def test_bench_records_with_float_batches_and_module_names_of_projections():
    """check_fastest_prediction refused rows whose batch is 64.0 (a float column from pandas), and
    check_tile_prediction refused projection="down_proj" (transformers' module name)."""
    record = copy.deepcopy(recorded("h200_batch_sweep"))
    as_ints = lesson06.check_fastest_prediction("reduce-overhead", recorded("h200_batch_sweep"))
    for row in record["results"]:
        row["batch"] = float(row["batch"])
    assert lesson06.check_fastest_prediction("reduce-overhead", record) == as_ints
    record["results"][0]["batch"] += 0.5  # not a count: still refused
    with pytest.raises(SettingError):
        lesson06.check_fastest_prediction("reduce-overhead", record)
    tiles = recorded("h200_tile_sweep")
    for name, sweep_name in (("down_proj", "down"), ("model.layers.0.mlp.gate_proj", "gate_up"),
                             ("k_proj", "qkv"), ("o_proj", "o_proj")):
        assert (lesson06.check_tile_prediction("tile", tiles, projection=name)
                == lesson06.check_tile_prediction("tile", tiles, projection=sweep_name)), name

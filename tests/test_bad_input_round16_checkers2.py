"""Round 16 of the hostile-user probe, exercise checkers (second part): code with a layer count
written in, duplicate record rows, loose spellings, non-finite ratios, outputs that are not dense
CPU tensors, record values of other types, answers any numbers.Real holds, dtype of a cache's
return, settings read at one door."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch

from kvlab.exercises import (
    lesson00,
    lesson01,
    lesson02,
    lesson03,
    lesson04,
    lesson05,
    lesson06,
    lesson07,
)
from kvlab.exercises.common import SettingError
from kvlab.sizes import kv_cache_bytes, llama_parameter_count

# ---- S1: the checkers' models have more than two layers, and every layer is checked -------------


class _TwoSlotCache:
    """A cache with storage for layers 0 and 1 only: layer 2 lands in layer 1's."""

    def __init__(self):
        self.k, self.v = {}, {}

    def update(self, k, v, i):
        i = min(i, 1)
        if i in self.k:
            self.k[i] = torch.cat([self.k[i], k], -2)
            self.v[i] = torch.cat([self.v[i], v], -2)
        else:
            self.k[i], self.v[i] = k, v
        return self.k[i], self.v[i]


def test_cache_update_with_two_layers_of_storage_fails():
    """check_cache_update called update on layers 0 and 1 only, with a 2-layer model: a cache with
    storage for two layers passed."""
    verdict = lesson02.check_cache_update(_TwoSlotCache)
    assert verdict.startswith("not quite"), verdict
    assert "layer 2" in verdict and "keep one K and one V per layer" in verdict


def test_reset_of_two_layers_fails():
    """check_reset_in_place ran on a 2-layer model: a reset looping range(2) passed."""
    def reset_two(cache):
        for i in range(2):
            layer = cache.layers[i]
            layer.keys.zero_()
            layer.values.zero_()
            layer.cumulative_length.zero_()

    verdict = lesson03.check_reset_in_place(reset_two)
    assert verdict.startswith("not quite") and "layers [2]" in verdict, verdict


def test_put_back_of_two_layers_fails():
    """check_put_back ran on a 2-layer model: a fix that fills layers 0 and 1 only passed."""
    def put_back_two(cache, valid_len):
        for i in (0, 1):
            cache.layers[i].cumulative_length.fill_(valid_len)

    verdict = lesson04.check_put_back(put_back_two)
    assert verdict.startswith("not quite") and "layers [2]" in verdict, verdict
    assert lesson04.check_put_back(lesson04.put_back).startswith("correct")


# ---- R7: a cache's returned K/V in another dtype ------------------------------------------------


class _CastCache(_TwoSlotCache):
    dtype = torch.float64

    def update(self, k, v, i):
        if i in self.k:
            self.k[i] = torch.cat([self.k[i], k.to(self.dtype)], -2)
            self.v[i] = torch.cat([self.v[i], v.to(self.dtype)], -2)
        else:
            self.k[i], self.v[i] = k.to(self.dtype), v.to(self.dtype)
        return self.k[i], self.v[i]


class _HalfCache(_CastCache):
    dtype = torch.float16


def test_cache_update_in_another_dtype_is_named():
    """A cache storing float64 passed the per-call check, then failed inside the decode with
    torch's dtype error; float16 storage got "differ from token 0" with no word of the dtype."""
    for cache in (_CastCache, _HalfCache):
        verdict = lesson02.check_cache_update(cache)
        assert verdict.startswith("not quite") and "at update call 1" in verdict, verdict
        assert str(cache.dtype) in verdict and "dtype they come in" in verdict, verdict


# ---- S2, R2/Q2: check_fastest_prediction's rows ------------------------------------------------

def _rows(**changes):
    rows = [{"strategy": "naive", "batch": 1, "tokens_per_s": 10.0, "exact": True},
            {"strategy": "static", "batch": 1, "tokens_per_s": 50.0, "exact": True},
            {"strategy": "compiled", "batch": 1, "tokens_per_s": 100.0, "exact": None}]
    return {"results": [dict(r, **changes) for r in rows]}


def test_fastest_refuses_two_rows_of_one_strategy_and_batch():
    """Two rows with the same (strategy, batch): the last won in a dict, so a 50 tok/s row was
    dropped and 'naive' was called fastest."""
    record = _rows()
    record["results"].append({"strategy": "static", "batch": 1, "tokens_per_s": 5.0,
                              "exact": True})
    with pytest.raises(SettingError, match=r"both 'static' at batch 1.*kvlab\.lab\.bench\.merge"):
        lesson06.check_fastest_prediction("naive", record, batch=1)


def test_fastest_reads_row_values_of_other_types():
    """Rows with tokens_per_s as text crashed the formatting, a NumPy batch was refused, and
    exact=np.bool_(True) was treated as unchecked."""
    right = lesson06.check_fastest_prediction("static", _rows(), batch=1)
    assert right.startswith("correct"), right
    for record in ({"results": [dict(r, tokens_per_s=str(r["tokens_per_s"]))
                                for r in _rows()["results"]]},
                   {"results": [dict(r, batch=np.int64(1)) for r in _rows()["results"]]},
                   {"results": [dict(r, exact=np.bool_(True)) for r in _rows()["results"][:2]]},
                   {"results": [dict(r, exact=torch.tensor(True))
                                for r in _rows()["results"][:2]]}):
        verdict = lesson06.check_fastest_prediction("static", record, batch=1)
        assert verdict.splitlines()[:3] == right.splitlines()[:3], verdict


def test_fastest_says_why_a_text_exact_is_unchecked():
    """A row's exact of "true" was reported as "ran with no token check"."""
    record = {"results": [dict(r, exact="true") for r in _rows()["results"][:2]]}
    verdict = lesson06.check_fastest_prediction("static", record, batch=1)
    assert verdict.startswith("not checked") and "exact='true'" in verdict, verdict
    assert "not a bool" in verdict and "ran with no token check" not in verdict, verdict


# ---- R1: a student's tensor that is not dense, or not where the inputs are ---------------------

def test_outputs_not_dense_or_elsewhere_are_named():
    """An output on "meta", a sparse or a nested tensor was reported as "your code raised ..."
    from inside the checker's comparison (check_attend; check_naive_decode moved it first)."""
    import warnings

    def nested(q, k, v):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.nested.nested_tensor([lesson02.attend(q, k, v)])

    for attend, kind in ((lambda q, k, v: lesson02.attend(q, k, v).to("meta"), "on meta"),
                         (lambda q, k, v: lesson02.attend(q, k, v).to_sparse(), "sparse"),
                         (nested, "nested")):
        verdict = lesson02.check_attend(attend)
        assert verdict.startswith("not quite: your code returned") and kind in verdict, verdict
        assert "dense (strided) tensor on the inputs' device (cpu)" in verdict, verdict
        assert "raised" not in verdict, verdict

    def naive_on_meta(model, ids, n):
        return lesson01.check_naive_decode.solution(model, ids, n).to("meta")

    verdict = lesson01.check_naive_decode(naive_on_meta)
    assert "dense (strided) tensor on the inputs' device (cpu)" in verdict, verdict


# ---- R3: answers of any numbers.Real, and ints past a float's range -----------------------------

def test_fraction_and_huge_answers_are_checked():
    """A Fraction answer crashed the number formatting ("could not be checked", or "your code
    raised" for a returned one), and 10**400 raised OverflowError."""
    config = lesson00.small_gqa_config()
    right = kv_cache_bytes(config, 100, torch.float16, batch=2)
    setting = dict(config=config, tokens=100, dtype=torch.float16, batch=2)
    for wrong in (Fraction(right, 3), 10**400, -10**400):
        verdict = lesson02.check_cache_bytes(wrong, **setting)
        assert verdict.startswith("not quite: you gave"), verdict
    assert lesson02.check_cache_bytes(Fraction(right), **setting).startswith("correct")
    assert "1.000e+400" in lesson02.check_cache_bytes(10**400, **setting)
    for count in (lambda c: Fraction(llama_parameter_count(c) * 3 + 1, 3), lambda c: 10**400):
        verdict = lesson00.check_parameter_count(count)
        assert verdict.startswith("not quite: for a config") and "raised" not in verdict, verdict
    for flops in (lambda c, n: Fraction(1, 3), lambda c, n: 10**400):
        verdict = lesson01.check_step_flops(flops)
        assert verdict.startswith("not quite: for a config") and "raised" not in verdict, verdict
    verdict = lesson01.check_doubling_prediction("4x", seconds=Fraction(1, 3),
                                                 doubled_seconds=Fraction(4, 3))
    assert verdict.startswith("correct") and "x4.00" in verdict, verdict


# ---- S4, Q8: the loose spelling reader -----------------------------------------------------------

def test_loose_spelling_keeps_the_numbers():
    """"24x" was read as "2x-4x" (the loose reader dropped the x between digits, then the hyphen):
    a spelling whose numbers are not the choice's must not match."""
    verdict = lesson01.check_doubling_prediction("24x", seconds=1, doubled_seconds=3)
    assert verdict.startswith("not quite") and "one of" in verdict, verdict
    for spelled in ("2x-4x", "2-4x", "2X\u20134X", " 2x - 4x "):
        verdict = lesson01.check_doubling_prediction(spelled, seconds=1, doubled_seconds=3)
        assert verdict.startswith("correct"), (spelled, verdict)


def test_a_choice_with_its_description_is_read():
    """"B: vanilla at bucket + steps" (a choice followed by its description) was refused; a choice
    followed by another's description must still name none."""
    right = lesson05.check_counters_prediction("B")
    assert right.startswith("correct"), right
    for spelled in ("B: vanilla at bucket + steps", "b) vanilla at bucket + steps, graph-safe at "
                    "prompt + steps."):
        assert lesson05.check_counters_prediction(spelled) == right, spelled
    verdict = lesson05.check_counters_prediction("B: both counters at prompt + steps")
    assert verdict.startswith("not quite") and "one of" in verdict, verdict


def test_a_number_in_a_numpy_array_of_text_is_read():
    """check_cached_positions(np.array('14'), ...) was refused, though choice_of reads a 0-d
    NumPy array of text."""
    assert lesson02.check_cached_positions(np.array("14"), prompt_len=5,
                                           new_tokens=10).startswith("correct")
    assert lesson02.check_cached_positions(np.array("15"), prompt_len=5,
                                           new_tokens=10).startswith("not quite: you gave 15")


def test_chat_ids_refuses_a_tokenizer_name():
    """tokenizer="HuggingFaceTB/..." (a name) was silently replaced by the stand-in tokenizer."""
    with pytest.raises(ValueError, match="tokenizer= takes a tokenizer object.*load_model"):
        lesson00.check_chat_ids(lesson00.chat_ids,
                                tokenizer="HuggingFaceTB/SmolLM2-135M-Instruct")
    assert lesson00.check_chat_ids(lesson00.chat_ids).startswith("correct")


# ---- Q7: a ratio of measurements that is no finite number ---------------------------------------

def test_a_non_finite_ratio_is_not_checked():
    """seconds=1e-300, doubled_seconds=1e300 was called correct with an infinite ratio; an int past
    a float's range raised OverflowError."""
    for verdict in (
            lesson01.check_doubling_prediction("4x", seconds=1e-300, doubled_seconds=1e300),
            lesson00.check_gqa_prediction("3x", gqa_parameters=1, mha_parameters=10**400),
            lesson02.check_cache_vs_weights_prediction(100_000, weight_bytes=1e300,
                                                       cache_bytes_per_token=1e-300)):
        assert verdict.startswith("not checked") and "not a finite number" in verdict, verdict


# ---- Q6: the prediction checkers' settings read at the one door ---------------------------------

@pytest.mark.parametrize("call, words", [
    (lambda: lesson00.check_gqa_prediction("10%", gqa_parameter=100, mha_parameters=110),
     "has no setting 'gqa_parameter'"),
    (lambda: lesson00.check_gqa_prediction("10%", gqa_parameters=100),
     "needs the setting mha_parameters="),
    (lambda: lesson01.check_doubling_prediction("4x", second=1, doubled_seconds=4),
     "has no setting 'second'"),
    (lambda: lesson02.check_cache_vs_weights_prediction(1000, weight_bytes=1e6),
     "needs the setting cache_bytes_per_token="),
    (lambda: lesson07.check_verify_prediction("B", k=4), "has no setting 'k'"),
])
def test_prediction_checkers_read_their_settings_at_the_door(call, words):
    """Four prediction checkers gave Python's bare "unexpected keyword argument" / "missing 1
    required keyword-only argument"; they now say what they take, as the other checkers do."""
    with pytest.raises(TypeError, match=words) as caught:
        call()
    assert "it takes" in str(caught.value), caught.value


# ---- Q1: a launch record's counts and times read alike ------------------------------------------

def test_launch_record_reads_counts_and_times_alike():
    """check_launch_cost_us refused kernel_launch_calls=np.int64(600) but read
    eager_ms_per_token="10.0" as text: counts and times are now read by the same reader."""
    def record(eager=10.0, launches=600):
        return {"eager_ms_per_token": eager, "replay_ms_per_token": 4.0,
                "work_per_step": {"eager": {"kernel_launch_calls": launches},
                                  "replay": {"kernel_launch_calls": 0}}}

    right = lesson05.check_launch_cost_us(10.0, record=record())
    assert right.startswith("correct"), right
    for other in (record(launches=np.int64(600)), record(launches=torch.tensor(600)),
                  record(launches=600.0), record(eager=np.float32(10.0)), record(eager="10.0"),
                  record(launches="600")):
        assert lesson05.check_launch_cost_us(10.0, record=other) == right
    assert lesson05.check_launch_cost_us(10**400, record=record()).startswith("not quite: you")
    with pytest.raises(SettingError, match="must be a count"):
        lesson05.check_launch_cost_us(10.0, record=record(launches=600.5))


# ---- Q9: check_decode_step claims only what it saw ----------------------------------------------

def test_decode_step_claims_the_position_tensor_only_when_fed():
    """A step feeding position_ids=cache.layers[0].cumulative_length was told its "positions came
    from one 0-dim tensor advanced in place"."""
    def from_counter(model, cache, ids, position):
        counter = cache.layers[0].cumulative_length.reshape(1, 1)
        logits = model(ids, cache=cache, position_ids=counter).logits
        position.add_(1)
        return logits[:, -1:].argmax(-1)

    verdict = lesson03.check_decode_step(from_counter)
    assert "came from one 0-dim tensor" not in verdict, verdict
    assert "not read from the position tensor you were handed" in verdict, verdict
    right = lesson03.check_decode_step(lesson03.decode_step)
    assert right.startswith("correct") and "came from one 0-dim tensor" in right, right


def test_graph_loop_putting_back_two_layers_fails():
    """check_graph_loop ran on a 2-layer model: a loop that puts back the counters of layers 0
    and 1 only (a layer count written in) passed."""
    import inspect

    source = inspect.getsource(lesson05.graph_loop_solution).replace(
        "for layer in cache.layers:", "for layer in cache.layers[:2]:")
    assert "cache.layers[:2]" in source
    space = dict(vars(lesson05))
    exec(compile(source, "<two layers>", "exec"), space)  # the reference, two layers written in
    verdict = lesson05.check_graph_loop(space["graph_loop_solution"])
    assert verdict.startswith("not quite") and "layers [2] of 3" in verdict, verdict
    assert lesson05.check_graph_loop(lesson05.graph_loop_solution).startswith("correct")

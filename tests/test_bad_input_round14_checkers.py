"""Probe round 14 (checkers): wrong answers called right (a loop hard-coded to the checker's n,
predictions checked against impossible measurements, token ids in a dtype that wraps) and right
answers called wrong (a dtype by name, buffers captured in another order, Qwen configs, unchecked
benchmark rows, torch's own NotImplementedError)."""

import copy

import pytest
import torch
from transformers import LlamaConfig

from kvlab.decoding import decode_naive, greedy
from kvlab.exercises import lesson00, lesson01, lesson02, lesson03, lesson04, lesson05, lesson06
from kvlab.exercises.common import NOT_ATTEMPTED
from kvlab.graphs import capture
from kvlab.lab import bench
from kvlab.lab.models import SMOLLM2_SHAPE
from kvlab.sizes import kv_cache_bytes


def _naive_six(model, prompt_ids, n):
    """The naive loop with n hard-coded to the checker's default (6)."""
    seq = prompt_ids
    for _ in range(6):
        seq = torch.cat([seq, model(seq).logits[:, -1].argmax(-1, keepdim=True)], 1)
    return seq[:, prompt_ids.shape[1]:]


def test_naive_decode_varies_n():
    """A loop hard-coded to 6 steps passed check_naive_decode "correct": every case used the same
    n."""
    assert lesson01.check_naive_decode(_naive_six).startswith("not quite")
    assert lesson01.check_naive_decode(decode_naive).startswith("correct")


def _graph_decode_fixed(prompt_len_fixed, n_fixed):
    def run(model, cache, first_ids, prompt_len, n):
        return lesson04.graph_decode(model, cache, first_ids, prompt_len_fixed, n_fixed)
    return run


def test_graph_decode_varies_prompt_len_and_n():
    """A graph decode with prompt_len and n hard-coded to the checker's defaults (9, 12) passed:
    the checker ran one prompt length and one n."""
    assert lesson04.check_graph_decode(_graph_decode_fixed(9, 12)).startswith("not quite")


def test_doubling_faster_is_not_checked():
    """A doubled run faster than the single one ("x0.50") called the prediction "2x" correct."""
    verdict = lesson01.check_doubling_prediction("2x", seconds=1.0, doubled_seconds=0.5)
    assert verdict.startswith("not checked") and "cannot" in verdict


def test_gqa_counts_swapped_are_not_checked():
    """GQA parameters above MHA parameters (swapped) called "1%" correct."""
    verdict = lesson00.check_gqa_prediction("1%", gqa_parameters=147_786_048,
                                            mha_parameters=134_515_008)
    assert verdict.startswith("not checked") and "swapped" in verdict


def _launch_record(eager, replay):
    return {"eager_ms_per_token": eager, "replay_ms_per_token": replay,
            "work_per_step": {"eager": {"kernel_launch_calls": 600},
                              "replay": {"kernel_launch_calls": 0}}}


def test_launch_cost_replay_slower_is_not_checked():
    """A replay slower than eager gave a negative launch cost, and -3.33 was called correct."""
    verdict = lesson05.check_launch_cost_us(-3.33, record=_launch_record(10.0, 12.0))
    assert verdict.startswith("not checked") and "not usable" in verdict


def test_launch_cost_nan_record_is_not_checked():
    """A record with eager_ms_per_token=nan gave "not quite: ... nan% off"."""
    verdict = lesson05.check_launch_cost_us(10.0, record=_launch_record(float("nan"), 4.0))
    assert verdict.startswith("not checked")


def test_naive_decode_uint8_ids_refused():
    """Token ids cast to uint8 (which wrap past 255) were called correct."""
    verdict = lesson01.check_naive_decode(
        lambda m, p, n: decode_naive(m, p, n).to(torch.uint8))
    assert verdict.startswith("not quite") and "uint8" in verdict


def test_write_positions_uint8_refused():
    """Slots returned as uint8 were called correct (the docstring asks for a LongTensor)."""
    def positions(counter, valid, bucket, max_cache_len):
        return lesson05.write_positions_solution(counter, valid, bucket,
                                                 max_cache_len).to(torch.uint8)
    verdict = lesson05.check_write_positions(positions)
    assert verdict.startswith("not quite") and "uint8" in verdict


def test_attend_complex_refused():
    """attend(q, k, v) + 5j was called correct: the imaginary part was dropped before comparing."""
    verdict = lesson02.check_attend(lambda q, k, v: lesson02.attend(q, k, v) + 5j)
    assert verdict.startswith("not quite") and "complex" in verdict


@pytest.mark.parametrize("dtype", ["float16", "fp16", torch.int8])
def test_static_cache_bytes_reads_any_dtype(dtype):
    """dtype="float16" (or torch.int8) gave "could not be checked (TypeError: finfo() ...)"."""
    config = LlamaConfig(**SMOLLM2_SHAPE)
    want = torch.int8 if dtype is torch.int8 else torch.float16
    right = kv_cache_bytes(config, 2048, want)
    assert lesson03.check_static_cache_bytes(right, config=config, max_cache_len=2048,
                                             dtype=dtype).startswith("correct")
    assert lesson02.check_cache_bytes(right, config=config, tokens=2048,
                                      dtype=dtype).startswith("correct")


def test_cache_bytes_refuses_what_is_no_dtype():
    """dtype=3 reached the formula and came back as a "could not be checked" verdict on the answer;
    it is now refused at the door (the caller's setting), with what to give."""
    with pytest.raises(ValueError, match="torch.dtype"):
        lesson03.check_static_cache_bytes(1, config=LlamaConfig(**SMOLLM2_SHAPE),
                                          max_cache_len=8, dtype=3)


def test_graph_decode_buffers_in_any_order():
    """A correct graph decode that captured (pos, ids) was refused: input 0 was taken as the
    token buffer."""
    def decode(model, cache, first_ids, prompt_len, n):
        ids = first_ids.clone()
        pos = torch.full_like(first_ids, prompt_len)
        graph = capture(lambda p, i: greedy(model(i, cache=cache, position_ids=p).logits), pos,
                        ids, warmup=0)
        out = [first_ids]
        for _ in range(1, n):
            nxt = graph.replay().clone()
            out.append(nxt)
            ids.copy_(nxt)
            pos.add_(1)
        return torch.cat(out, 1)
    assert lesson04.check_graph_decode(decode).startswith("correct")


def test_torch_not_implemented_is_not_not_attempted(monkeypatch):
    """torch's own NotImplementedError inside the student's code read as "not attempted", and
    under KVLAB_SOLUTIONS=1 the reference replaced the student's code and was called correct."""
    def meta(model, prompt_ids, n):
        return prompt_ids.to("meta").cpu()
    monkeypatch.setenv("KVLAB_SOLUTIONS", "1")
    verdict = lesson01.check_naive_decode(meta)
    assert verdict.startswith("not quite") and "NotImplementedError" in verdict


def test_stub_still_not_attempted(monkeypatch):
    """The stub's own raise stays "not attempted" (a guard: the fix above must not catch it; this
    one passed before the fix too)."""
    def stub(model, prompt_ids, n):
        raise NotImplementedError  # your code here
    monkeypatch.setenv("KVLAB_SOLUTIONS", "0")
    assert lesson01.check_naive_decode(stub) == NOT_ATTEMPTED


def _record_batch1():
    return copy.deepcopy(bench.recorded("h200_batch1"))


def test_fastest_unchecked_row_said_plainly():
    """A row with exact=None was dropped silently: predicting it (the truly fastest) got "not
    quite"; now the verdict says it is not proven token-exact."""
    record = _record_batch1()
    for row in record["results"]:
        if row["strategy"] == "graph-safe-kernels":
            row["exact"] = None
    verdict = lesson06.check_fastest_prediction("graph-safe-kernels", record, batch=1)
    assert verdict.startswith("not checked") and "not proven token-exact" in verdict


def test_fastest_all_unchecked_record():
    """A --check-tokens 0 record raised "no token-exact result at batch 1; its batch sizes are
    [1]", a self-contradicting error."""
    record = _record_batch1()
    for row in record["results"]:
        row["exact"] = None
    verdict = lesson06.check_fastest_prediction("naive", record, batch=1)
    assert verdict.startswith("not checked") and "--check-tokens" in verdict


def test_fastest_tie_accepts_any_tied():
    """On a tie, the right answer 'b' got "not quite ... the run shows 'a'"."""
    rows = [{"strategy": s, "batch": 64, "exact": True, "tokens_per_s": 10.0} for s in "ab"]
    for name in "ab":
        assert lesson06.check_fastest_prediction(name, {"results": rows}).startswith("correct")


def test_fastest_record_path():
    """A record's path gave "string indices must be integers"; it is read as the record."""
    record = _record_batch1()
    rates = {r["strategy"]: r["tokens_per_s"] for r in record["results"]
             if r["batch"] == 1 and r["exact"]}
    fastest = max(rates, key=rates.get)
    path = bench.DATA / "h200_batch1.json"
    assert lesson06.check_fastest_prediction(fastest, str(path), batch=1).startswith("correct")


def test_tile_prediction_with_a_bench_record():
    """A benchmark record given for the tile sweep raised KeyError 'sweeps'."""
    with pytest.raises(ValueError, match="tile-sweep record"):
        lesson06.check_tile_prediction("gemv", bench.recorded("h200_batch1"))


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-qwen3"])
def test_parameter_count_qwen_configs(name):
    """The true count of a Qwen2 (q/k/v biases) or Qwen3 (q_norm, k_norm) model was called wrong:
    the reference formula left those parts out."""
    from kvlab.lab.models import tiny_model

    model = tiny_model(name)

    def true_count(config):
        from transformers import AutoModelForCausalLM
        with torch.device("meta"):
            built = AutoModelForCausalLM.from_config(config)
        return sum(p.numel() for p in built.parameters())

    assert sum(p.numel() for p in model.parameters()) == true_count(model.config)
    verdict = lesson00.check_parameter_count(true_count, config=model.config)
    assert verdict.startswith("correct"), verdict


def test_put_back_varies_prompt_len():
    """A fix that fills every counter with the checker's default prompt_len (9) instead of
    valid_len passed: both scenarios ran one prompt length."""
    def fill_nine(cache, valid_len):
        for layer in cache.layers:
            layer.cumulative_length.fill_(9)
    assert lesson04.check_put_back(fill_nine).startswith("not quite")
    assert lesson04.check_put_back(lesson04.put_back).startswith("correct")


def test_graph_loop_varies_n():
    """A graph loop hard-coded to the checker's 6 tokens per prompt passed: one n was checked."""
    def six(model, cache, prompts, n):
        return lesson05.graph_loop_solution(model, cache, prompts, 6)
    assert lesson05.check_graph_loop(six).startswith("not quite")
    assert lesson05.check_graph_loop(lesson05.graph_loop_solution).startswith("correct")


def test_graph_loop_one_dimensional_outputs_hint():
    """Outputs [n] per prompt (right tokens, batch dimension dropped) got the hint "keep a
    clone"."""
    def flat(model, cache, prompts, n):
        return [t[0] for t in lesson05.graph_loop_solution(model, cache, prompts, n)]
    verdict = lesson05.check_graph_loop(flat)
    assert verdict.startswith("not quite") and "batch dimension" in verdict


@pytest.mark.parametrize("spelled", ["kept hidden", "Kept Hidden", "kept_hidden"])
def test_crop_prediction_spellings(spelled):
    """"kept hidden" and other spellings of "kept-hidden" were not matched to the choice."""
    from kvlab.exercises.common import choice_of
    assert choice_of(spelled, lesson03.CROP_CHOICES) == "kept-hidden"
    assert not lesson03.check_crop_prediction(spelled).startswith("not quite: the")


def test_doubling_prediction_2_4x():
    """"2-4x" was not matched to the choice "2x-4x"."""
    verdict = lesson01.check_doubling_prediction("2-4x", seconds=1.0, doubled_seconds=3.0)
    assert verdict.startswith("correct")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_norm_matmul_half_result_gets_dtype_hint(dtype):
    """A float16/bfloat16 result got a formula hint instead of a dtype hint."""
    verdict = lesson06.check_norm_matmul(
        lambda x, w, W, eps: lesson06.norm_matmul_solution(x, w, W, eps).to(dtype))
    assert verdict.startswith("not quite") and str(dtype) in verdict


def test_count_lists_as_arrays_and_tensors():
    """buckets= / lengths= given as a NumPy array or a tensor were refused."""
    np = pytest.importorskip("numpy")
    from kvlab.exercises import lesson07
    for buckets in (np.array([1, 2, 4, 8]), torch.tensor([1, 2, 4, 8])):
        assert lesson06.check_padding_rows(1, running=7, buckets=buckets).startswith("correct")
    lengths = np.array([5, 40, 130])
    right = lesson07.blocks_held([5, 40, 130], 16)
    assert lesson07.check_blocks_held(right, lengths=lengths).startswith("correct")


def test_write_positions_varies_max_cache_len():
    """Positions with max_cache_len hard-coded to 16 passed: every case used 16."""
    def sixteen(counter, valid, bucket, max_cache_len):
        return lesson05.write_positions_solution(counter, valid, bucket, 16)
    assert lesson05.check_write_positions(sixteen).startswith("not quite")


def test_write_valid_varies_max_cache_len():
    """write_valid with max_cache_len hard-coded to 16 (the trash slot at 16) passed: every case
    used 16."""
    def sixteen(keys, values, new_k, new_v, counter, valid):
        rows = torch.arange(new_k.shape[2])
        slots = torch.where((rows < valid) & (counter + rows < 16), counter + rows,
                            torch.tensor(16))
        keys.index_copy_(2, slots, new_k)
        values.index_copy_(2, slots, new_v)
        counter.add_(valid)
        return counter
    assert lesson05.check_write_valid(lesson05.write_valid_solution).startswith("correct")
    assert lesson05.check_write_valid(sixteen).startswith("not quite")


def test_reset_in_place_refuses_the_builtin_through_its_class():
    """type(layer).reset(layer), transformers' own reset called through the class, was accepted;
    cache.reset() is refused."""
    def through_class(cache):
        for layer in cache.layers:
            type(layer).reset(layer)
    verdict = lesson03.check_reset_in_place(through_class)
    assert verdict.startswith("not quite") and "reset()" in verdict
    assert lesson03.check_reset_in_place(lesson03.reset_in_place).startswith("correct")


def test_step_flops_fraction_shown():
    """A count 0.5 off printed "you count 68,672 FLOPs, the formula 68,672 (+0.0%)"."""
    verdict = lesson01.check_step_flops(lambda c, L: lesson01.step_flops(c, L) + 0.5)
    assert verdict.startswith("not quite") and ".5 FLOPs" in verdict and "+0.0%" not in verdict


def test_filled_prediction_says_so(monkeypatch):
    """Under KVLAB_SOLUTIONS=1 a missing prediction was filled in and called "correct:" with no
    note, unlike the code checkers."""
    monkeypatch.setenv("KVLAB_SOLUTIONS", "1")
    verdict = lesson01.check_doubling_prediction(None, seconds=1.0, doubled_seconds=3.0)
    assert verdict.startswith("(the measured answer, filled in by KVLAB_SOLUTIONS=1) correct")


def test_attend_varies_head_dim():
    """An attention with the scale hard-coded to 1/sqrt(8) passed: every case had head_dim 8."""
    def scale_eight(q, keys, values):
        return lesson02.attend(q * (q.shape[-1] / 8) ** 0.5, keys, values)
    assert lesson02.check_attend(scale_eight).startswith("not quite")
    assert lesson02.check_attend(lesson02.attend).startswith("correct")


def test_cache_vs_weights_swapped_is_not_checked():
    """weight_bytes and cache_bytes_per_token swapped (one token's cache heavier than all weights)
    called 100 correct ("= 0 tokens", the nearest choice): such a measurement cannot answer."""
    verdict = lesson02.check_cache_vs_weights_prediction(100, weight_bytes=9_216,
                                                         cache_bytes_per_token=269_060_000)
    assert verdict.startswith("not checked") and "swapped" in verdict


def test_decode_step_int16_ids_refused():
    """A decode step returning int16 ids (which wrap past 32767) got "your code raised
    RuntimeError" from the embedding the checker fed them to; the dtype is now named."""
    def step(model, cache, ids, position):
        return lesson03.decode_step(model, cache, ids, position).to(torch.int16)
    verdict = lesson03.check_decode_step(step)
    assert verdict.startswith("not quite") and "int16" in verdict


def test_chat_ids_uint8_refused():
    """Chat ids cast to uint8 got "your ids differ from the template's from position 0" (the
    special tokens wrapped), not that the dtype is too narrow."""
    verdict = lesson00.check_chat_ids(lambda tok, q: lesson00.chat_ids(tok, q).to(torch.uint8))
    assert verdict.startswith("not quite") and "uint8" in verdict


def test_fastest_all_wrong_tokens_said_plainly():
    """A batch whose rows all made wrong tokens (exact False) raised "no token-exact result at batch
    1; its batch sizes are [1]", naming the batch it said was missing."""
    rows = [{"strategy": s, "batch": 1, "exact": False, "tokens_per_s": 10.0} for s in "ab"]
    with pytest.raises(ValueError, match="exact False"):
        lesson06.check_fastest_prediction("a", {"results": rows}, batch=1)


def test_parameter_count_refuses_a_config_the_formula_does_not_cover():
    """A Gemma2 config (four norms per layer) had its true count called wrong against the Llama
    formula; the checker now refuses the config and says why."""
    from transformers import Gemma2Config

    from kvlab.exercises.common import SettingError
    config = Gemma2Config(vocab_size=200, hidden_size=32, intermediate_size=48,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=8)
    with pytest.raises(SettingError, match="does not cover"):
        lesson00.check_parameter_count(lesson00.llama_parameter_count, config=config)

"""Issue 48, probe round 7 (messages): what a hostile but ordinary user still got wrong after round
6's fixes: the benchmark's --out and --time-budget, and kvlab.decode's words for a float mask and
for ids that are not a tensor."""

import os

import numpy as np
import pytest
import torch
from transformers import BatchEncoding

import kvlab
from kvlab.lab import bench
from kvlab.lab.models import tiny_model

SMALL = ["--model", "tiny-llama", "--quick", "--device", "cpu", "--profile-steps", "0",
         "--check-tokens", "2", "--prompt-len", "4", "--new-tokens", "3"]


def test_bench_out_at_a_device_or_pipe_is_a_usage_error(tmp_path, capsys):
    """`--out /dev/null` wrote /dev/null.json and /dev/null.csv (the suffixes are added to the
    name): files the user never named, in /dev. A FIFO at the name, or at the .json, was treated the
    same (the probe of a FIFO .json waited forever for a reader)."""
    with pytest.raises(SystemExit) as exit_:
        bench.parse_args(["--out", "/dev/null"])
    err = capsys.readouterr().err
    assert (exit_.value.code == 2 and "/dev/null is a character device" in err
            and "--out out/mybench" in err)
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    with pytest.raises(bench.BenchArgumentError, match="pipe is a FIFO"):
        bench.check_settings(4, 3, [1], ["naive"], 2, 1, 0, out=pipe)
    os.mkfifo(tmp_path / "run.json")
    with pytest.raises(bench.BenchArgumentError, match=r"run\.json is a FIFO"):
        bench.check_settings(4, 3, [1], ["naive"], 2, 1, 0, out=tmp_path / "run")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe", "run.json"]
    # a regular file's name and a folder still pass
    bench.check_settings(4, 3, [1], ["naive"], 2, 1, 0, out=tmp_path / "kept.json")
    bench.check_settings(4, 3, [1], ["naive"], 2, 1, 0, out=tmp_path)


def test_bench_time_budget_too_small_still_times_one_strategy_and_says_so(tmp_path, capsys):
    """`--time-budget 0.001` skipped every strategy, printed 'time budget spent (2 s >
    --time-budget 0 s)' and exited 0 with an empty table."""
    record = bench.main([*SMALL, "--strategies", "naive,static", "--time-budget", "0.001",
                         "--out", str(tmp_path / "r")])
    out = capsys.readouterr().out
    assert [r["strategy"] for r in record["results"]] == ["naive"]
    assert [s["strategy"] for s in record["skipped"]] == ["static"]
    assert "--time-budget 0.001 s)" in out and "budget 0 s" not in out


def test_bench_that_times_nothing_exits_1(tmp_path, capsys):
    """A run in which every strategy was skipped (here: compiled, on the CPU in quick mode) printed
    an empty table and exited 0."""
    with pytest.raises(SystemExit) as exit_:
        bench.main([*SMALL, "--strategies", "reduce-overhead", "--out", str(tmp_path / "r")])
    captured = capsys.readouterr()
    assert exit_.value.code == 1 and "no strategy was timed" in captured.err
    assert "skipped reduce-overhead" in captured.out and (tmp_path / "r.json").exists()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_float_mask_of_ones_is_accepted(dtype, prompt):
    """`attention_mask=torch.ones_like(ids, dtype=torch.float)`, which transformers accepts, was
    refused with 'got torch.float32 values [1.0]': a message that names an allowed value as the
    fault. The same in a tokenizer's output (a bool mask was accepted already)."""
    model = tiny_model("tiny-llama")
    ids = prompt(5, batch=2)
    want = kvlab.decode(model, ids, 4)
    ones = torch.ones_like(ids, dtype=dtype)
    assert torch.equal(kvlab.decode(model, ids, 4, attention_mask=ones), want)
    assert torch.equal(kvlab.decode(model, {"input_ids": ids, "attention_mask": ones}, 4), want)
    assert torch.equal(
        kvlab.decode(model, BatchEncoding({"input_ids": ids, "attention_mask": ones}), 4), want)
    padded = ones.clone()
    padded[1, 0] = 0
    with pytest.raises(ValueError, match=r"padded rows .*\[\(1, 1\)\]"):
        kvlab.decode(model, ids, 4, attention_mask=padded)


def test_a_mask_of_other_values_names_the_allowed_and_the_wrong_ones(prompt):
    """An additive mask (0 and -inf) was refused with every value it held, 0.0 among them, as if
    each were wrong."""
    model = tiny_model("tiny-llama")
    ids = prompt(5)
    additive = torch.zeros_like(ids, dtype=torch.float)
    additive[0, 0] = float("-inf")
    with pytest.raises(ValueError, match=r"only 0 \(padding\) and 1 \(a token\).*got -inf\b"):
        kvlab.decode(model, ids, 2, attention_mask=additive)


BAD_IDS = {  # input_ids -> what the refusal says
    "list of lists": ([[1, 2, 3]], r"got a Python list of lists\. .*torch\.tensor\(ids\), or "
                                   r"tokenize with return_tensors='pt'"),
    "flat list": ([1, 2, 3],
                  r"got a Python list of ints \(one prompt\)\. .*torch\.tensor\(\[ids\]\)"),
    "tuple": (((1, 2, 3),), r"got a Python tuple of tuples\. .*torch\.tensor\(ids\)"),
    "ragged": ([[1, 2], [3]], r"got a Python list of lists of lengths \[2, 1\]\. .*one length"),
    "empty list": ([], r"got an empty Python list\. Give at least one prompt"),
    "numpy": (np.array([[1, 2, 3]]), r"got a NumPy array int64 \(1, 3\)\. .*torch\.from_numpy"),
    "1-D numpy": (np.array([1, 2, 3]), r"got a NumPy array int64 \(3,\)\. .*\.long\(\)\[None\]"),
    "list of tensors": ([torch.tensor([1, 2])], r"got a Python list of Tensors\. .*torch\.stack"),
    "text": ("hello", r"got a str \(text, .*tokenizer\(text, return_tensors='pt'\)"),
    "None": (None, r"got None\. Give the prompt's ids"),
    "tokenizer output of lists": ({"input_ids": [[1, 2, 3]], "attention_mask": [[1, 1, 1]]},
                                  r"got a Python list of lists in the tokenizer's output\. Call "
                                  r"the tokenizer with return_tensors='pt'"),
}


@pytest.mark.parametrize("bad", list(BAD_IDS))
def test_ids_that_are_not_a_tensor_are_named_with_what_to_do(bad):
    """`decode(model, [[1, 2, 3]], 5)` was refused with 'got list  ()': neither what was given
    nor how to make the LongTensor asked for. The same for a tuple, a NumPy array, a flat, ragged
    or empty list, text, None and a tokenizer's output of lists. They stay refused (the door takes
    a LongTensor or a tokenizer's output of one, nothing converted behind the caller's back)."""
    ids, says = BAD_IDS[bad]
    with pytest.raises(ValueError, match=r"input_ids must be a LongTensor .*" + says):
        kvlab.decode(tiny_model("tiny-llama"), ids, 3)

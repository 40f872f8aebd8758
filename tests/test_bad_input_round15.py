"""Issue 48, probe round 15: a checker took int32 slots that index_copy_ refuses, and bench.merge
joined parts measured under other settings into one table."""

import pytest
import torch

from kvlab.lab import bench


def test_write_positions_wants_the_long_slots_index_copy_takes():
    from kvlab.exercises import lesson05

    solution = lesson05.write_positions_solution
    verdict = lesson05.check_write_positions(lambda c, v, b, s: solution(c, v, b, s).int())
    assert verdict.startswith("not quite") and "index_copy_ takes torch.long" in verdict
    with pytest.raises(RuntimeError, match="long tensor for index"):  # why: what the cache does
        torch.zeros(1, 2, 17, 4).index_copy_(2, solution(0, 5, 8, 16).int(),
                                             torch.ones(1, 2, 8, 4))
    assert lesson05.check_write_positions(solution).startswith("correct")


def test_merge_refuses_parts_measured_under_other_settings():
    """merge kept a bf16 row at prompt length 8 beside float32 naive at 4, x_naive compared them,
    and the settings still said float32 and 4."""
    common = dict(new_tokens=16, check_tokens=2, repeats=3, profile_k=0, progress=False,
                  device="cpu")
    a = bench.run_bench("tiny-llama", strategies=["naive", "static"], dtype="float32",
                        prompt_len=4, **common)
    b = bench.run_bench("tiny-llama", strategies=["static"], dtype="bfloat16", prompt_len=8,
                        **common)
    with pytest.raises(ValueError, match=r"prompt_len, dtype differ.*rerun the part"):
        bench.merge(a, b)
    c = bench.run_bench("tiny-llama", strategies=["static"], dtype="float32", prompt_len=4,
                        **common)
    merged = bench.merge(a, c)
    assert [r["part"] for r in merged["results"]] == [0, 1]


def test_a_checkers_config_setting_that_is_a_model_is_the_callers_error():
    """config=model (not model.config) came back as "not quite: this answer could not be checked
    (AttributeError ...)", blaming the student's right answer."""
    from kvlab.exercises import lesson02
    from kvlab.lab.models import tiny_model
    from kvlab.sizes import kv_cache_bytes

    model = tiny_model("tiny-llama")
    right = kv_cache_bytes(model.config, 10, torch.float16, batch=2)
    for config, says in ((model, r"model\.config"), (model.config.to_dict(), "a model's config")):
        with pytest.raises(ValueError, match=f"config= takes a transformers config \\({says}\\)"):
            lesson02.check_cache_bytes(right, config=config, tokens=10, dtype=torch.float16,
                                       batch=2)
    assert lesson02.check_cache_bytes(right, config=model.config, tokens=10,
                                      dtype=torch.float16, batch=2).startswith("correct")


def test_run_bench_takes_one_batch_size_as_a_0_dim_tensor():
    """batches=torch.tensor(2) raised "iteration over a 0-d tensor"."""
    record = bench.run_bench("tiny-llama", strategies=["naive"], batches=torch.tensor(2),
                             prompt_len=4, new_tokens=16, check_tokens=0, repeats=3, profile_k=0,
                             progress=False)
    assert record["settings"]["batches"] == [2]


def test_an_interrupted_bench_leaves_no_empty_record(tmp_path, monkeypatch):
    """Ctrl-C before the first strategy finished left the 0-byte record the default name reserved
    (bench.load then raised JSONDecodeError)."""
    monkeypatch.chdir(tmp_path)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "run_bench", interrupted)
    with pytest.raises(KeyboardInterrupt):
        bench.main(["--model", "tiny-llama"])
    assert not list((tmp_path / "out").glob("*.json"))


def test_speculation_runs_refuses_a_batch_it_would_record_one_row_of():
    """A [2, p] prompt was taken and its second row's tokens dropped from the record."""
    from kvlab.lab import serving
    from kvlab.lab.models import tiny_model

    with pytest.raises(ValueError, match=r"ids \[1, prompt_len\]"):
        serving.speculation_runs(tiny_model("tiny-llama"), {"p": torch.randint(1, 256, (2, 8))}, 6)


def test_time_interleaved_never_reads_device_0_as_the_cpu():
    """`device or "cpu"` turned device 0 (a GPU index) into the CPU: timing without a device
    sync."""
    from kvlab.lab.measure import time_interleaved

    with pytest.raises(ValueError, match="device must be"):
        time_interleaved({"a": lambda: None}, rounds=1, device=0)
    assert set(time_interleaved({"a": lambda: None}, rounds=1)) == {"a"}

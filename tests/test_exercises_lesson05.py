"""Lesson 05's checkers: each gets its solution (correct), typical wrong answers (the specific
hint), an unattempted stub (not attempted, or the reference filled in under KVLAB_SOLUTIONS=1) and
code that raises (reported)."""

import pytest
import torch
from student_code import FILLED, STUDENT_ERROR, raises, stub

from kvlab.exercises import lesson05
from kvlab.exercises.common import NOT_ANSWERED, NOT_ATTEMPTED, SettingError


@pytest.mark.parametrize("check", [lesson05.check_write_positions, lesson05.check_write_valid,
                                   lesson05.check_graph_loop])
def test_stub_none_and_errors(check, monkeypatch):
    assert check(raises).startswith("not quite: your code raised ValueError: " + STUDENT_ERROR)
    assert check(stub).startswith(FILLED)  # the suite runs with KVLAB_SOLUTIONS=1
    monkeypatch.delenv("KVLAB_SOLUTIONS", raising=False)
    assert check(stub) == NOT_ATTEMPTED and check(None) == NOT_ATTEMPTED


# ---- predict, then run ---------------------------------------------------------------------------

def test_counters_prediction(monkeypatch):
    vanilla, safe = lesson05.padded_prefill_counters(21, 32, steps=3)
    # vanilla counts the bucket, graph-safe the valid rows
    assert (vanilla, safe) == (32 + 3, 21 + 3)
    assert lesson05.check_counters_prediction("B").startswith("correct")
    wrong = lesson05.check_counters_prediction("A")
    assert (wrong.startswith("not quite: you predicted 'A'")
            and f"vanilla {vanilla}, graph-safe {safe}" in wrong)
    assert "one of 'A', 'B', 'C', 'D'" in lesson05.check_counters_prediction("E")
    assert lesson05.check_counters_prediction("B", prompt_len=5, bucket=16,
                                              steps=0).startswith("correct")
    monkeypatch.delenv("KVLAB_SOLUTIONS", raising=False)
    unanswered = lesson05.check_counters_prediction(None)
    # nothing given away
    assert unanswered.startswith("not predicted") and str(vanilla) not in unanswered
    with pytest.raises(ValueError, match="prompt_len <= bucket"):
        lesson05.padded_prefill_counters(40, 32)


# ---- the write positions -------------------------------------------------------------------------

def right_positions(counter, valid, bucket, max_cache_len):
    rows = torch.arange(bucket)
    keep = (rows < valid) & (counter + rows < max_cache_len)
    return torch.where(keep, counter + rows, max_cache_len)


def test_write_positions():
    assert lesson05.check_write_positions(lesson05.check_write_positions.solution).startswith(
        "correct")
    # written out = the package's
    assert lesson05.check_write_positions(right_positions).startswith("correct")
    no_trash = lambda c, v, b, m: torch.arange(b) + c  # noqa: E731  (writes the padding, like vanilla)
    assert "padding-pollution" in lesson05.check_write_positions(no_trash)
    no_end_check = lambda c, v, b, m: torch.where(torch.arange(b) < v, torch.arange(b) + c, m)  # noqa: E731
    verdict = lesson05.check_write_positions(no_end_check)
    assert "counter=14" in verdict and "past the end" in verdict
    shifted = lambda c, v, b, m: right_positions(c + 1, v, b, m)  # noqa: E731
    assert "off by one" in lesson05.check_write_positions(shifted)
    last_real = lambda c, v, b, m: right_positions(c, v, b, m).clamp(max=m - 1)  # noqa: E731
    assert "slot max_cache_len - 1 is a real one" in lesson05.check_write_positions(last_real)

    def host_read(c, v, b, m):  # right eagerly, refused by a capture
        n = int(v)
        return torch.cat([right_positions(c, v, b, m)[:n], torch.full((b - n,), m)])

    assert "a captured graph refuses it" in lesson05.check_write_positions(host_read)
    assert "LongTensor" in lesson05.check_write_positions(
        lambda *case: right_positions(*case).double() + 0.7)
    assert "on the inputs' device (cpu)" in lesson05.check_write_positions(
        lambda *case: right_positions(*case).to("meta"))
    assert "shape [8]" in lesson05.check_write_positions(
        lambda c, v, b, m: right_positions(c, v, b, m)[: int(v)])


# ---- the valid-window write ----------------------------------------------------------------------

def write(keys, values, new_k, new_v, counter, valid, *, k=True, v=True, advance=None, shift=0,
          padding=False, in_place=True):
    """The write, written out, with one switch per typical mistake."""
    slots, rows = keys.shape[2] - 1, torch.arange(new_k.shape[2])
    keep = (torch.ones_like(rows, dtype=torch.bool) if padding else rows < valid) & (
        counter + rows + shift < slots)
    at = torch.where(keep, counter + rows + shift, slots)
    for do, buffer, new in ((k, keys, new_k), (v, values, new_v)):
        if do:
            buffer.index_copy_(2, at, new) if in_place else buffer.index_copy(2, at, new)
    return counter.add_(valid if advance is None else advance(new_k.shape[2]))


def test_write_valid():
    assert lesson05.check_write_valid(lesson05.check_write_valid.solution).startswith("correct")
    # written out = GraphSafeStaticCache.update
    assert lesson05.check_write_valid(write).startswith("correct")
    assert "by the padded length" in lesson05.check_write_valid(
        lambda *a: write(*a, advance=lambda t: t))
    assert "off by one position" in lesson05.check_write_valid(lambda *a: write(*a, shift=1))
    assert "K without V" in lesson05.check_write_valid(lambda *a: write(*a, v=False))
    assert "V without K" in lesson05.check_write_valid(lambda *a: write(*a, k=False))
    assert "padded rows (i >= valid) were written into real slots" in lesson05.check_write_valid(
        lambda *a: write(*a, padding=True))
    assert "nothing was written" in lesson05.check_write_valid(lambda *a: write(*a, in_place=False))

    def rebound(keys, values, *rest):
        keys.data = keys.clone()  # a new tensor behind the same Python object: data_ptr changes
        return write(keys, values, *rest)

    assert "data_ptr changed" in lesson05.check_write_valid(rebound)

    def returned_not_advanced(keys, values, new_k, new_v, counter, valid):
        write(keys, values, new_k, new_v, counter.clone(), valid)
        return counter + valid

    assert "advance it in place" in lesson05.check_write_valid(returned_not_advanced)
    assert "you returned None" in lesson05.check_write_valid(lambda *a: (write(*a), None)[1])

    def sliced(keys, values, new_k, new_v, counter, valid):  # right eagerly; int() is a host read
        c = int(counter)
        n = min(int(valid), keys.shape[2] - 1 - c)  # no row past the end
        keys[:, :, c : c + n] = new_k[:, :, :n]
        values[:, :, c : c + n] = new_v[:, :, :n]
        return counter.add_(valid)

    assert "a captured graph refuses it" in lesson05.check_write_valid(sliced)


def test_package_write_is_the_cache_update():
    keys, values, new_k, new_v = lesson05.write_inputs(1, 2, 16, 4, 8, seed=0)
    out_k, out_v, counter = lesson05.package_write(keys, values, new_k, new_v, 3, 5)
    assert counter == 8
    assert (torch.equal(out_k[:, :, 3:8], new_k[:, :, :5])
            and torch.equal(out_v[:, :, 3:8], new_v[:, :, :5]))
    assert (torch.equal(out_k[:, :, :3], keys[:, :, :3])
            and torch.equal(out_k[:, :, 8:16], keys[:, :, 8:16]))


# ---- the whole loop over a vanilla StaticCache ---------------------------------------------------

def loop(*, rewind="all", reset="in place", token="in place", positions="cache", captures="once",
         warmup=3, keep="clone", host_read=False):
    """lesson05.graph_loop_solution with one rule broken (the keyword that differs from its
    default)."""
    from transformers import StaticCache

    from kvlab.graphs import capture

    def run(model, cache, prompts, n):
        graph, outs, state = None, [], {"cache": cache, "token": None, "pos": 0}
        for k, prompt in enumerate(prompts):
            if k and reset == "new cache":
                state["cache"] = StaticCache(config=model.config,
                                             max_cache_len=cache.layers[0].max_cache_len)
            elif k and reset == "rebind counters":
                for layer in state["cache"].layers:
                    layer.keys.zero_()
                    layer.values.zero_()
                    layer.cumulative_length = torch.zeros_like(layer.cumulative_length)
            elif reset != "none":
                state["cache"].reset()
            first = model(prompt, cache=state["cache"]).logits[:, -1:].argmax(-1)
            state["pos"] = prompt.shape[1]
            if graph is None or captures == "per prompt":
                state["token"] = first.clone()

                def step(ids):
                    if host_read:
                        assert ids.item() >= 0
                    pos = None
                    if positions == "python int":
                        pos = torch.full((1, 1), state["pos"], dtype=torch.long)
                    return model(ids, cache=state["cache"],
                                 position_ids=pos).logits[:, -1:].argmax(-1)

                graph = capture(step, state["token"], warmup=warmup)
                layers = {"all": state["cache"].layers, "layer 0": state["cache"].layers[:1],
                          None: []}[rewind]
                for layer in layers:
                    layer.cumulative_length.sub_(warmup)
            state["token"].copy_(first)
            out = [first]
            for _ in range(n - 1):
                made = graph.replay()
                if token == "rebound":
                    state["token"] = made.clone()
                else:
                    state["token"].copy_(made)
                state["pos"] += 1
                out.append(made.clone() if keep == "clone" else made)
            outs.append(torch.cat(out, dim=1))
        return outs

    return run


def test_graph_loop_right():
    assert lesson05.check_graph_loop(lesson05.graph_loop_solution).startswith("correct: 3 prompts")
    assert lesson05.check_graph_loop(loop()).startswith("correct")


@pytest.mark.parametrize("broken, said", [
    (dict(rewind=None), "the 3 warm-up calls inside capture() ran the step for real"),
    (dict(rewind="layer 0"), "layer 0's counter says 9, the others 12"),
    (dict(reset="new cache"), "a forward ran on a cache other than the one you were given"),
    (dict(reset="none"), "the cache still held the previous prompt"),
    (dict(reset="rebind counters"), "a layer's counter or key/value buffer is a new tensor"),
    (dict(token="rebound"), "replay 2 of prompt 1 (9 tokens) read token"),
    (dict(positions="python int"), "frozen at capture"),
    (dict(captures="per prompt"), "you captured a second graph"),
    (dict(warmup=0), "capture(..., warmup=0)"),
    (dict(keep="static output"), "keep a clone of each token"),
    (dict(host_read=True), "your code raised CaptureError"),
])
def test_graph_loop_names_the_rule_broken(broken, said):
    verdict = lesson05.check_graph_loop(loop(**broken))
    assert verdict.startswith("not quite") and said in verdict, verdict


def test_graph_loop_leaves_the_tiny_model_as_it_was():
    # stopped by the forward hook, inside the student's loop
    lesson05.check_graph_loop(loop(reset="new cache"))
    model = lesson05._tiny()
    assert (not model._forward_pre_hooks
            and lesson05.CapturedStep.replay is lesson05.CapturedStep.__dict__["replay"])


def test_solutions_are_shown_only_on_request(capsys):
    lesson05.check_graph_loop.show_solution()
    assert "cumulative_length.sub_(3)" in capsys.readouterr().out
    lesson05.check_write_valid.show_solution()
    assert "index_copy_" in capsys.readouterr().out


# ---- the launch cost, from a record --------------------------------------------------------------

def test_launch_cost():
    record = {"eager_ms_per_token": 3.0, "replay_ms_per_token": 0.5,
              "work_per_step": {"eager": {"kernel_launch_calls": 1000},
                                "replay": {"kernel_launch_calls": 0}}}
    assert abs(lesson05.launch_cost_us(record) - 2.5) < 1e-9
    assert lesson05.check_launch_cost_us(None, record=record) == NOT_ANSWERED
    assert lesson05.check_launch_cost_us(2.5, record=record).startswith("correct")
    assert lesson05.check_launch_cost_us(2.6, record=record).startswith("correct")  # within 10 %
    # 3 ms / 1000
    assert "whole eager step over its launches" in lesson05.check_launch_cost_us(3.0, record=record)
    assert lesson05.check_launch_cost_us(25.0, record=record).startswith("not quite")
    assert lesson05.check_launch_cost_us("fast", record=record).startswith("not quite")
    import numpy as np

    assert lesson05.check_launch_cost_us(torch.tensor([2.5]), record=record).startswith("correct")
    assert lesson05.check_launch_cost_us(np.array([2.5]), record=record).startswith("correct")
    assert "whole eager step" in lesson05.check_launch_cost_us(np.array([3.0]), record=record)
    assert "not a finite number" in lesson05.check_launch_cost_us(float("inf"), record=record)
    cpu_like = {"eager_ms_per_token": 2.0, "replay_ms_per_token": 1.0,
                "work_per_step": {"eager": {"aten_ops": 10}, "replay": {"aten_ops": 10}}}
    # a CPU run counts no launches: the caller's record is refused, never "not quite"
    with pytest.raises(SettingError, match="GPU result"):
        lesson05.check_launch_cost_us(1.0, record=cpu_like)

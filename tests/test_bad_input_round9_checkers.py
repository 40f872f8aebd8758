"""Issue 48, probe round 9: the lesson checkers' door (``settings_read``). A caller's mistake (a
setting passed by position or misspelled, a count a checker cannot run with, a model in train mode
with a live dropout, prompt ids the model cannot read) came back as the student's fault, as "could
not be checked", as a raw traceback from deep inside, or as "correct"."""

import pytest
import torch

from kvlab.exercises import lesson01, lesson02, lesson03, lesson04, lesson05, lesson06, lesson07
from kvlab.lab.models import tiny_model


def test_a_model_passed_by_position_is_the_callers_error():
    """check_naive_decode(solution, m) said "not quite: your code raised TypeError:
    check_naive_decode() takes 1 positional argument but 2 were given"."""
    model = tiny_model("tiny-llama")
    with pytest.raises(TypeError, match=r"check_naive_decode\(\).*by position.*model=\.\.\."):
        lesson01.check_naive_decode(lesson01.check_naive_decode.solution, model)


def test_a_misspelled_setting_is_named():
    """check_naive_decode(..., new_token=3) said "not quite: your code raised TypeError"."""
    with pytest.raises(TypeError, match=r"no setting 'new_token'.*new_tokens="):
        lesson01.check_naive_decode(lesson01.check_naive_decode.solution, new_token=3)


def test_a_checkers_misspelled_setting_is_not_could_not_be_checked():
    """check_cache_bytes(4096, config=..., token=4, ...) said "not quite: this answer could not be
    checked (TypeError ...)"."""
    config = tiny_model("tiny-llama").config
    with pytest.raises(TypeError, match=r"check_cache_bytes\(\) has no setting 'token'.*tokens="):
        lesson02.check_cache_bytes(4096, config=config, token=4, dtype=torch.float32)
    with pytest.raises(TypeError, match=r"needs the setting tokens="):
        lesson02.check_cache_bytes(4096, config=config, dtype=torch.float32)


def test_a_model_with_live_dropout_in_train_mode_is_refused():
    """A model in train mode with attention dropout 0.5 got "not quite ... expected id [23], got
    [249]" for the reference solution itself: the dropout's random tokens blamed on the student."""
    model = tiny_model("tiny-llama")
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.5
    model.train()
    with pytest.raises(ValueError, match=r"train mode.*model\.eval\(\)"):
        lesson01.check_naive_decode(lesson01.check_naive_decode.solution, model=model)


def _never(*args, **kwargs):
    raise AssertionError("the checker ran with a setting it should have refused")


@pytest.mark.parametrize("setting, call", [
    ("n", lambda: lesson04.check_graph_decode(_never, n=1)),
    ("n", lambda: lesson04.check_graph_decode(_never, n=0)),
    ("n", lambda: lesson04.check_graph_decode(_never, n=-2)),
    ("n", lambda: lesson04.check_graph_decode(_never, n=2.0)),
    ("warmup", lambda: lesson04.check_put_back(_never, warmup=-1)),
    ("warmup", lambda: lesson04.check_put_back(_never, warmup=0)),
    ("n", lambda: lesson04.check_put_back(_never, n=0)),
    ("new_tokens", lambda: lesson03.check_decode_step(_never, new_tokens=1)),
    ("block_size", lambda: lesson07.check_blocks_held(3, block_size=0)),
    ("running", lambda: lesson06.check_padding_rows(2, running=-1)),
    ("extra", lambda: lesson03.check_crop_prediction("zeroed", extra=0)),
    ("new_tokens", lambda: lesson04.check_no_warmup_prediction("none", new_tokens=1)),
    ("bucket", lambda: lesson05.check_counters_prediction("A", bucket=0)),
    ("steps", lambda: lesson05.check_counters_prediction("A", steps=-1)),
    ("length", lambda: lesson01.check_step_flops(_never, length=0)),
    ("max_cache_len",
     lambda: lesson03.check_static_cache_bytes(1, config=None, max_cache_len=0, dtype=None)),
])
def test_a_count_the_checker_cannot_run_with_is_refused_at_the_door(setting, call):
    """n=1 blamed the student ("never replayed a captured graph"), n=0, -2 or 2.0 and warmup=-1
    reached the student's code ("not quite: your code raised"), block_size=0 was "could not be
    checked (ZeroDivisionError)", running=-1 was "correct", extra=0 blamed k, warmup=0 or
    new_tokens=1 checked nothing and called it right."""
    with pytest.raises(ValueError, match=rf"^{setting} must be"):
        call()


@pytest.mark.parametrize("check, answer", [(lesson03.check_crop_prediction, "zeroed"),
                                           (lesson04.check_no_warmup_prediction, "none")])
def test_prompt_ids_are_checked_at_the_door(check, answer):
    """prompt_ids= as a list raised a raw AttributeError, ids outside the vocabulary a raw
    IndexError from the embedding."""
    with pytest.raises(ValueError, match=r"must be a LongTensor.*torch\.tensor\(ids\)"):
        check(answer, prompt_ids=[[1, 2, 3]])
    with pytest.raises(ValueError, match=r"prompt_ids holds ids outside the model's vocabulary"):
        check(answer, prompt_ids=torch.tensor([[1, 2, 10**6]]))


@pytest.mark.parametrize("call", [
    lambda: lesson07.check_blocks_held(3, lengths=(5, -40)),
    lambda: lesson07.check_blocks_held(3, lengths=(5.5,)),
    lambda: lesson07.check_blocks_held(3, lengths=()),
    lambda: lesson06.check_padding_rows(3, buckets=(0, 4)),
    lambda: lesson06.check_padding_rows(3, buckets=()),
])
def test_a_list_of_counts_is_checked_at_the_door(call):
    """lengths=(5, -40) or (5.5,) was checked as if right ("not quite: you gave 3 ... 400.0% off"
    for a request of -40 tokens); an empty lengths or buckets, or a bucket of 0, was "could not be
    checked", blaming the answer."""
    with pytest.raises(ValueError, match=r"(lengths|buckets) must be"):
        call()


def test_more_running_sequences_than_the_largest_bucket_is_the_callers_error():
    """check_padding_rows(3, running=100) with buckets up to 32 said "not quite: this answer could
    not be checked (ValueError: 100 sequences do not fit in any bucket ...)", blaming the answer for
    the settings."""
    with pytest.raises(ValueError, match=r"running=100 sequences fit in no bucket.*running <= 32"):
        lesson06.check_padding_rows(3, running=100)

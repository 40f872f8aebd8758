"""Issue 48, probe round 5: what a hostile but ordinary user still got wrong after round 4's
fixes."""


import pytest
import torch

import kvlab
from kvlab.graph_safe_cache import GraphSafeError
from kvlab.lab.models import tiny_model
from kvlab.paged_cache import PagedCacheError

BUILT = sorted(name for name, s in kvlab.STRATEGIES.items() if s.builds is not None)
BAD_CALLS = {  # (ids of prompt(5), n, keywords) -> what the refusal says
    "float ids": (lambda ids: (ids.float(), 3, {}), r"LongTensor.*input_ids\.long\(\)"),
    "1-D ids": (lambda ids: (ids[0], 3, {}), r"LongTensor of shape \[batch, prompt_len\]"),
    "empty prompt": (lambda ids: (ids[:, :0], 3, {}), "the prompt is empty"),
    "n=0": (lambda ids: (ids, 0, {}), "max_new_tokens"),
    "n=-1": (lambda ids: (ids, -1, {}), "max_new_tokens"),
    "n=True": (lambda ids: (ids, True, {}), "max_new_tokens"),
    "n past the position limit": (lambda ids: (ids, 10**6, {}), "max_position_embeddings"),
    "ids outside the vocabulary": (lambda ids: (ids + 1000, 3, {}),
                                   "outside the model's vocabulary"),
    "unknown keyword": (lambda ids: (ids, 3, {"bogus": 1}), r"(takes no|unknown keyword) bogus="),
    "max_cache_len=0": (lambda ids: (ids, 3, {"max_cache_len": 0}),
                        "max_cache_len must be a positive"),
}


@pytest.mark.parametrize("bad", list(BAD_CALLS))
@pytest.mark.parametrize("strategy", BUILT)
def test_state_and_build_check_their_inputs_at_the_door(strategy, bad, prompt):
    """STRATEGIES[s].state(...) and .build(...) built a decoder, cache or batcher from float ids,
    1-D ids, an empty prompt, n=0/-1/True, out-of-vocabulary ids, unknown keywords (a raw TypeError
    naming the builder) and max_cache_len=0, or failed with a raw IndexError/AttributeError: now
    kvlab.decode's door refuses each."""
    model = tiny_model("tiny-llama")
    make, match = BAD_CALLS[bad]
    ids, n, kwargs = make(prompt(5))
    for call in (kvlab.STRATEGIES[strategy].state, kvlab.STRATEGIES[strategy].build):
        with pytest.raises((ValueError, TypeError), match=match):
            call(model, ids, n, **kwargs)


def test_state_refuses_a_tuple_model_and_takes_a_tokenizers_output(prompt):
    model = tiny_model("tiny-llama")
    ids = prompt(5)
    with pytest.raises(TypeError, match="Unpack it first"):
        kvlab.STRATEGIES["graph-safe-kernels"].state((model, None), ids, 3)
    with pytest.raises(ValueError, match="padded rows"):
        padded = torch.ones_like(ids).index_fill(1, torch.tensor([0]), 0)
        kvlab.STRATEGIES["graph-safe"].state(model, {"input_ids": ids, "attention_mask": padded}, 3)
    state = kvlab.STRATEGIES["graph-safe"].state(
        model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, 3)
    assert torch.equal(kvlab.decode(model, ids, 3, strategy="graph-safe", **state),
                       kvlab.decode(model, ids, 3))


@pytest.mark.parametrize("length", [0, -1, 7.0, True])
def test_a_bad_max_cache_len_of_the_kernels_is_refused_by_its_own_name(length, prompt):
    """graph-safe-kernels refused max_cache_len=0, -1, 7.0 or True with a message about
    prefill_bucket, a keyword the user never passed."""
    model = tiny_model("tiny-llama")
    with pytest.raises(ValueError, match=r"max_cache_len must be a positive int") as refused:
        kvlab.decode(model, prompt(5), 3, strategy="graph-safe-kernels", max_cache_len=length)
    assert "prefill_bucket" not in str(refused.value)


HELD = ["graph-safe", "graph-safe-speculative", "paged"]


@pytest.mark.parametrize("strategy", HELD)
def test_a_held_decoder_called_again_from_on_token_is_refused(strategy, prompt):
    """An on_token callback that decodes with the same held decoder (or batcher) reset its cache
    under the running call: the outer call returned wrong tokens with no error."""
    model = tiny_model("tiny-llama")
    ids, other = prompt(6), prompt(4, seed=1)
    state = kvlab.STRATEGIES[strategy].state(model, ids, 5, max_cache_len=24)
    want = kvlab.decode(model, ids, 5)

    def nested(k, token):
        if k == 1:
            kvlab.decode(model, other, 3, strategy=strategy, **state)

    error = PagedCacheError if strategy == "paged" else GraphSafeError
    with pytest.raises(error, match="already decoding.*on_token"):
        kvlab.decode(model, ids, 5, strategy=strategy, on_token=nested, **state)
    # usable afterwards
    assert torch.equal(kvlab.decode(model, ids, 5, strategy=strategy, **state), want)
    assert torch.equal(kvlab.decode(model, other, 3, strategy=strategy, **state),
                       kvlab.decode(model, other, 3))


@pytest.mark.parametrize("strategy", [*HELD, "reduce-overhead"])
def test_a_held_decoder_shared_by_two_threads_never_gives_wrong_tokens(strategy, prompt,
                                                                     one_waits_inside):
    """Two threads decoding at once with one held decoder (or batcher, or reduce-overhead state, as
    round 6 found) interleaved their prefills and steps on its one cache: a thread got wrong
    tokens with no error. Now the second call is refused while one runs."""
    model = tiny_model("tiny-llama")
    ids = [prompt(6), prompt(4, seed=1)]
    state = kvlab.STRATEGIES[strategy].state(model, ids[0], 5, max_cache_len=24)
    want = [kvlab.decode(model, x, 5) for x in ids]

    def decode(i, on_token):
        return kvlab.decode(model, ids[i], 5, strategy=strategy, on_token=on_token, **state)

    got = one_waits_inside(decode)
    assert torch.equal(got[0], want[0])
    refusal = RuntimeError if strategy == "reduce-overhead" else GraphSafeError | PagedCacheError
    assert isinstance(got[1], refusal) and "another thread" in str(got[1])
    assert torch.equal(kvlab.decode(model, ids[1], 5, strategy=strategy, **state), want[1])


def test_serve_without_num_blocks_says_what_to_pass(prompt):
    """kvlab.continuous_batching.serve(model, requests) without num_blocks= raised Python's
    TypeError naming ContinuousBatcher.__init__, which the caller never called."""
    from kvlab.continuous_batching import Request, blocks_for, serve

    model = tiny_model("tiny-llama")
    requests = [Request(prompt(5)[0], 4)]
    with pytest.raises(TypeError, match=r"serve needs num_blocks=") as refused:
        serve(model, requests, block_size=4)
    assert "__init__" not in str(refused.value)
    # as the message says
    served = serve(model, requests, block_size=4, num_blocks=blocks_for(5 + 4 - 1, 4))
    assert torch.equal(served.tokens[0], kvlab.decode(model, prompt(5), 4)[0])


@pytest.mark.parametrize("flags", [["--batch", "1,2,1"], ["--strategies", "naive,static,naive"]])
def test_bench_refuses_a_batch_or_strategy_named_twice(flags, capsys):
    """`--strategies naive,naive` timed naive twice (the second row a TimingError) and `--batch 1,1`
    wrote two rows of one key."""
    from kvlab.lab import bench

    with pytest.raises(SystemExit) as exit_:
        bench.parse_args(flags)
    assert exit_.value.code == 2 and "given twice" in capsys.readouterr().err


def test_bench_position_limit_names_the_check_tokens_when_they_are_the_longer(tmp_path, capsys):
    """`--prompt-len 1020 --new-tokens 2 --check-tokens 8` was refused as 'new_tokens (8)', a number
    the user never gave."""
    from kvlab.lab import bench

    with pytest.raises(SystemExit) as exit_:
        bench.main(["--model", "tiny-llama", "--prompt-len", "1020", "--new-tokens", "2",
                    "--check-tokens", "8", "--strategies", "naive", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "check_tokens (8" in err and "new_tokens (8)" not in err


@pytest.mark.parametrize("strategy", ["graph-safe-kernels", "graph-safe-speculative/kernels"])
def test_the_kernels_refuse_a_float64_model_by_its_dtype(strategy, prompt):
    """A float64 model reached the prefill attention kernel, which sizes its tiles per element size,
    and died with a raw KeyError: 8 (on a GPU, or on the CPU under TRITON_INTERPRET=1)."""
    model = tiny_model("tiny-llama").to(torch.float64)
    with pytest.raises(ValueError, match=r"the model is torch.float64.*model\.float\(\)"):
        kvlab.decode(model, prompt(6), 5, strategy=strategy)
    model.float()  # as the message says
    assert torch.equal(kvlab.decode(model, prompt(6), 5, strategy=strategy),
                       kvlab.decode(model, prompt(6), 5))

"""Issue 48, probe round 6: what a hostile but ordinary user still got wrong after round 5's
fixes."""


import pytest
import torch

import kvlab
from kvlab.lab.models import tiny_model

COMPILED = ["reduce-overhead", "reduce-overhead/gqa"]


@pytest.mark.parametrize("strategy", COMPILED)
def test_a_held_compiled_state_called_again_from_on_token_is_refused(strategy, prompt):
    """A reduce-overhead state (a StaticCache and the step compiled over it) used again from inside
    on_token reset the cache under the running call: the outer call returned wrong tokens with no
    error (round 5 guarded only GraphSafeDecoders and batchers)."""
    model = tiny_model("tiny-llama")
    ids, other = prompt(6), prompt(4, seed=1)
    state = kvlab.STRATEGIES[strategy].state(model, ids, 5, max_cache_len=24)
    want = kvlab.decode(model, ids, 5)

    def nested(k, token):
        if k == 1:
            kvlab.decode(model, other, 3, strategy=strategy, **state)

    with pytest.raises(RuntimeError, match="already decoding.*on_token"):
        kvlab.decode(model, ids, 5, strategy=strategy, on_token=nested, **state)
    # usable afterwards
    assert torch.equal(kvlab.decode(model, ids, 5, strategy=strategy, **state), want)
    assert torch.equal(kvlab.decode(model, other, 3, strategy=strategy, **state),
                       kvlab.decode(model, other, 3))


def test_a_compiled_step_with_another_states_cache_or_model_is_refused(prompt):
    """compiled_step= of one reduce-overhead state with cache= of another: the prefill filled one
    cache and the compiled steps read the other, and the tokens were wrong with no error. The same
    for a step compiled over another model."""
    model, edited = tiny_model("tiny-llama"), tiny_model("tiny-llama")
    with torch.no_grad():
        edited.lm_head.weight.mul_(-1)
    ids = prompt(6)
    build = kvlab.STRATEGIES["reduce-overhead"].state
    one, two = build(model, ids, 5), build(model, ids, 5)
    with pytest.raises(ValueError, match="compiled over another cache"):
        kvlab.decode(model, ids, 5, strategy="reduce-overhead", cache=two["cache"],
                     compiled_step=one["compiled_step"])
    with pytest.raises(ValueError, match="compiled over another model"):
        kvlab.decode(edited, ids, 5, strategy="reduce-overhead", **one)
    # one state's own pair decodes right
    assert torch.equal(kvlab.decode(model, ids, 5, strategy="reduce-overhead", **two),
                       kvlab.decode(model, ids, 5))


def test_a_hook_added_after_a_compile_is_run_by_reduce_overhead(prompt):
    """A forward hook registered after a reduce-overhead decode was skipped by every later one, held
    state or fresh: torch.compile does not guard on module hooks by default, and the step compiled
    before the hook (one compile cache per process) kept running without it: wrong tokens, no
    error."""
    model = tiny_model("tiny-llama")
    ids = prompt(6)
    state = kvlab.STRATEGIES["reduce-overhead"].state(model, ids, 5)
    kvlab.decode(model, ids, 5, strategy="reduce-overhead", **state)
    handle = model.model.layers[0].mlp.register_forward_hook(lambda module, args, out: out * 2)
    hooked = kvlab.decode(model, ids, 5)
    assert torch.equal(kvlab.decode(model, ids, 5, strategy="reduce-overhead", **state), hooked)
    assert torch.equal(kvlab.decode(model, ids, 5, strategy="reduce-overhead"), hooked)
    handle.remove()
    assert torch.equal(kvlab.decode(model, ids, 5, strategy="reduce-overhead", **state),
                       kvlab.decode(model, ids, 5))


@pytest.mark.parametrize("change", ["batch", "dtype"])
def test_a_held_compiled_state_refuses_another_batch_or_dtype_by_name(change, prompt):
    """A reduce-overhead state built for batch 1 and handed a batch of 2, or kept after
    model.half(), died inside the cache write with a raw `index_copy_(): ...` RuntimeError."""
    model = tiny_model("tiny-llama")
    state = kvlab.STRATEGIES["reduce-overhead"].state(model, prompt(6), 5)
    kvlab.decode(model, prompt(6), 5, strategy="reduce-overhead", **state)
    ids = prompt(6, batch=2) if change == "batch" else prompt(6)
    if change == "dtype":
        model.half()
    match = "made for batch 1" if change == "batch" else "torch.float32.*torch.float16"
    with pytest.raises(ValueError, match=match):
        kvlab.decode(model, ids, 5, strategy="reduce-overhead", **state)


def test_a_near_miss_is_never_called_zero_percent_off():
    """check_cache_bytes(25601) for 25,600 said "which is 0.0% off": a wrong answer that reads as
    a right one."""
    from kvlab.exercises.lesson02 import check_cache_bytes

    model = tiny_model("tiny-llama")
    right = kvlab.sizes.kv_cache_bytes(model.config, 100, torch.bfloat16)
    verdict = check_cache_bytes(right + 1, config=model.config, tokens=100, dtype=torch.bfloat16)
    assert verdict.startswith("not quite") and "0.0% off" not in verdict
    assert f"{100 / right:.2g}% off" in verdict
    wrong = check_cache_bytes(right * 2, config=model.config, tokens=100, dtype=torch.bfloat16)
    assert "100.0% off" in wrong


@pytest.mark.parametrize("spelled", ["B.", "(B)", "[b]", "'B.'"])
def test_a_choice_spelled_with_a_full_stop_or_brackets_is_read(spelled):
    """check_verify_prediction("B.") or "(B)", a right answer as a student types it, got "not
    quite: ... is one of 'A', 'B', 'C', 'D', got 'B.'"; a NumPy array of one string too."""
    import numpy as np

    from kvlab.exercises import lesson07

    right = next(c for c in "ABCD" if lesson07.check_verify_prediction(c).startswith("correct"))
    assert right == "B"  # the cases above spell it
    assert lesson07.check_verify_prediction(spelled).startswith("correct")
    assert lesson07.check_verify_prediction(np.array([spelled])).startswith("correct")
    assert lesson07.check_verify_prediction(spelled.replace("B", "A").replace("b", "a")
                                            ).startswith("not quite")


EDITABLE = ["handwritten", "dynamic", "static", "reduce-overhead"]


@pytest.mark.parametrize("strategy", EDITABLE)
def test_an_on_token_that_edits_its_token_changes_no_result(strategy, prompt):
    """on_token got the loop's own token tensor: a callback that edited it in place (token.fill_,
    token[:] = ...) changed the returned tokens, and in handwritten's loop the next step's input,
    with no error; the graph strategies and naive hand over a copy."""
    model = tiny_model("tiny-llama")
    ids = prompt(6, batch=2)
    got = kvlab.decode(model, ids, 6, strategy=strategy,
                       on_token=lambda k, token: token.fill_(7))
    assert torch.equal(got, kvlab.decode(model, ids, 6))


def test_a_serve_on_token_that_edits_its_token_changes_no_result(prompt):
    """The same for ContinuousBatcher.serve: the token handed to on_token was the one kept for the
    result."""
    from kvlab.continuous_batching import Request, serve

    model = tiny_model("tiny-llama")
    requests = [Request(prompt(5)[0], 4), Request(prompt(7, seed=1)[0], 3)]
    served = serve(model, requests, num_blocks=8, block_size=4,
                   on_token=lambda i, k, token: token.fill_(7))
    for request, tokens in zip(requests, served.tokens, strict=True):
        assert torch.equal(tokens, kvlab.decode(model, request.prompt[None],
                                                request.max_new_tokens)[0])

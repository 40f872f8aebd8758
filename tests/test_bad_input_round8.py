"""Issue 48, probe round 8: a decode by hand before any prefill, checker settings taken as the
student's fault or not checked at all, and transformers' own hooks taken for the user's."""

import pytest
import torch

import kvlab
from kvlab.graph_safe_cache import GraphSafeError
from kvlab.lab.models import tiny_model
from kvlab.paged_cache import PagedCacheError


@pytest.mark.parametrize("graph", [False, "emulate"])
def test_decode_steps_before_any_prefill_is_refused(graph, prompt):
    """decode_steps on a decoder that never prefilled returned zeros with graph=False (the capture's
    own check refused it only where a graph was captured)."""
    model = tiny_model("tiny-llama")
    ids = prompt(6)
    decoder = kvlab.STRATEGIES["graph-safe"].state(model, ids, 6, graph=graph)["decoder"]
    with pytest.raises(GraphSafeError, match=r"cache is empty.*prefill\(input_ids\) first"):
        decoder.decode_steps(3)
    first = decoder.prefill(ids)  # as the message says
    got = torch.cat([first, decoder.decode_steps(3)], dim=1)
    assert torch.equal(got, kvlab.decode(model, ids, 4))


def _zeros(model, ids, n):
    return torch.zeros(ids.shape[0], n, dtype=torch.long)


@pytest.mark.parametrize("new_tokens", [0, -2, 1.5, True])
def test_a_checker_refuses_its_own_bad_setting(new_tokens):
    """check_naive_decode(..., new_tokens=0) called a function returning nothing right ("correct:
    your loop makes the naive loop's tokens exactly"); -2 or 1.5 came back as "not quite: your code
    raised", blaming the student for the checker's setting."""
    from kvlab.exercises import lesson01, lesson02

    model = tiny_model("tiny-llama")
    with pytest.raises((ValueError, TypeError), match="new_tokens must be"):
        lesson01.check_naive_decode(_zeros, model=model, new_tokens=new_tokens)
    with pytest.raises((ValueError, TypeError), match="new_tokens must be"):
        lesson02.check_cache_update(_zeros, model=model, new_tokens=new_tokens)
    assert lesson01.check_naive_decode(_zeros, model=model, new_tokens=3).startswith("not quite")


def test_a_checker_refuses_a_load_model_pair():
    """check_naive_decode(f, model=kvlab.load_model(...)) got the (model, tokenizer) pair and said
    "not quite: your code raised AttributeError: 'tuple' object has no attribute ..."."""
    from kvlab.exercises import lesson01

    pair = (tiny_model("tiny-llama"), None)
    with pytest.raises(TypeError, match="model is a tuple.*load_model"):
        lesson01.check_naive_decode(_zeros, model=pair)


def _inspect_hidden_states(model):
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3]]), output_hidden_states=True)


HELD = ["graph-safe", "graph-safe-kernels", "graph-safe-speculative/kernels", "paged"]


@pytest.mark.parametrize("strategy", HELD)
def test_a_call_with_output_hidden_states_changes_no_strategy(strategy, prompt):
    """One model(ids, output_hidden_states=True) left transformers' output-recording hooks on every
    layer for good: every held state refused the model as changed and every kernels strategy
    refused it ("Remove the hooks"), though the hooks change no value and the user added none."""
    model = tiny_model("tiny-llama")
    ids = prompt(6)
    want = kvlab.decode(model, ids, 5)
    state = kvlab.STRATEGIES[strategy].state(model, ids, 5)
    _inspect_hidden_states(model)
    assert torch.equal(kvlab.decode(model, ids, 5, strategy=strategy, **state), want)
    assert torch.equal(kvlab.decode(model, ids, 5, strategy=strategy), want)
    # a hook of the user's is still seen
    handle = model.model.layers[0].mlp.register_forward_hook(lambda m, a, out: -out)
    try:
        with pytest.raises((GraphSafeError, ValueError, PagedCacheError)):
            kvlab.decode(model, ids, 5, strategy=strategy, **state)
    finally:
        handle.remove()


def test_gradient_checkpointings_input_hook_changes_no_kernels_decode(prompt):
    """gradient_checkpointing_enable() leaves transformers' make_inputs_require_grads hook on the
    embeddings (gradient_checkpointing_disable() keeps it): the kernels refused the model with
    "Remove the hooks", though the hook changes no value."""
    model = tiny_model("tiny-llama")
    ids = prompt(6)
    model.gradient_checkpointing_enable()
    model.gradient_checkpointing_disable()
    model.enable_input_require_grads()  # what PEFT does: the same hook, kept
    assert torch.equal(kvlab.decode(model, ids, 5, strategy="graph-safe-kernels"),
                       kvlab.decode(model, ids, 5))


def test_a_student_who_inspects_hidden_states_has_not_changed_the_model():
    """A student's decode that called the model with output_hidden_states=True was "not quite:
    your code changed the model (model.model._output_capturing_hooks_installed added; ...)"."""
    from kvlab.decoding import decode_naive
    from kvlab.exercises import lesson01

    def naive_and_curious(model, ids, n):
        model(ids, output_hidden_states=True)
        return decode_naive(model, ids, n)

    verdict = lesson01.check_naive_decode(naive_and_curious, model=tiny_model("tiny-llama"))
    assert verdict.startswith("correct"), verdict

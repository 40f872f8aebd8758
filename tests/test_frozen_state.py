"""kvlab.frozen_state: a snapshot of what a captured graph or a fused copy freezes, and the check
that names a change."""

import pytest
import torch

import kvlab
from kvlab.frozen_state import check_unchanged, frozen_state, layer_problem, unchanged
from kvlab.graph_safe_cache import GraphSafeError
from kvlab.lab.models import TINY_CONFIGS, tiny_model


def refused(model, before, says: str) -> None:
    assert not unchanged(before, model)
    with pytest.raises(GraphSafeError, match=says) as caught:
        check_unchanged(before, model, "this decoder")
    assert "Build a new one" in str(caught.value)


@pytest.mark.parametrize("edit", ["no_grad", "inference_mode", "load_state_dict"])
def test_in_place_edits_bump_the_version_the_snapshot_reads(edit):
    model = tiny_model("tiny-llama")
    weight = model.model.layers[0].mlp.down_proj.weight
    version = weight._version
    if edit == "load_state_dict":
        state = {k: v.clone() for k, v in model.state_dict().items()}
        model.load_state_dict(state)
    else:
        with torch.no_grad() if edit == "no_grad" else torch.inference_mode():
            weight.mul_(2)
    assert weight._version > version


@pytest.mark.parametrize("name", sorted(TINY_CONFIGS))
def test_decoding_changes_nothing_the_snapshot_sees(name, prompt):
    model = tiny_model(name)
    before = frozen_state(model)
    for strategy in ("naive", "handwritten", "dynamic"):
        kvlab.decode(model, prompt(5), 3, strategy=strategy)
    model.eval()
    model.train()  # train mode decodes the same tokens: not part of the snapshot
    check_unchanged(before, model, "this decoder")
    assert unchanged(before, model)


def _set_attn_eager(model):
    model.set_attn_implementation("eager")


EDITS = {
    "setting": (lambda m: setattr(m.model.norm, "variance_epsilon", 1e-3),
                r"model\.model\.norm\.variance_epsilon changed from [0-9.e-]+ to 0\.001"),
    "deleted setting": (lambda m: delattr(m.model.layers[1].self_attn, "scaling"),
                        r"model\.model\.layers\.1\.self_attn\.scaling changed from 0\.25 to "
                        r"\(absent\)"),
    "in place": (lambda m: m.model.layers[0].mlp.down_proj.weight.detach().mul_(2),
                 r"model\.model\.layers\.0\.mlp\.down_proj\.weight was edited in place"),
    "replaced": (lambda m: setattr(m.model.norm, "weight",
                                   torch.nn.Parameter(m.model.norm.weight.detach() + 1)),
                 r"model\.model\.norm\.weight was replaced by another tensor"),
    "rebound data": (lambda m: setattr(m.model.norm.weight, "data",
                                       m.model.norm.weight.detach()[:8]),
                     r"model\.model\.norm\.weight now holds other memory \(\(8,\)"),
    "dtype": (lambda m: m.to(torch.float64), r"now holds other memory .*torch\.float64"),
    "layers removed": (lambda m: setattr(m.model, "layers", m.model.layers[:1]),
                       r"2 decoder layers configured \(config\.num_hidden_layers\), 1 present"),
    "layers and config": (lambda m: (setattr(m.model, "layers", m.model.layers[:1]),
                                     setattr(m.config, "num_hidden_layers", 1)),
                          r"the model had 2 decoder layers, now 1"),
    "module swapped": (lambda m: setattr(m.model.layers[0].mlp, "act_fn", torch.nn.GELU()),
                       r"model\.model\.layers\.0\.mlp\.act_fn was replaced \(now a GELU\)"),
    "patched forward": (lambda m: setattr(m.model.layers[0].mlp, "forward", lambda x: x),
                        r"model\.model\.layers\.0\.mlp\.forward was replaced on the instance"),
    "hook": (lambda m: m.model.layers[1].register_forward_hook(lambda *a: None),
             r"model\.model\.layers\.1.s forward hooks changed \(0 before, 1 now\)"),
    "attention": (_set_attn_eager,
                  r"model\.config\._attn_implementation changed from 'sdpa' to 'eager'"),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_each_change_is_named(edit):
    model = tiny_model("tiny-llama")
    before = frozen_state(model)
    change, says = EDITS[edit]
    change(model)
    refused(model, before, says)


def test_load_state_dict_and_inference_mode_edits_are_seen():
    model = tiny_model("tiny-llama")
    before = frozen_state(model)
    with torch.inference_mode():
        model.lm_head.weight.add_(1)
    refused(model, before, r"model\.lm_head\.weight was edited in place")
    before = frozen_state(model)
    model.load_state_dict(tiny_model("tiny-llama", seed=1).state_dict())
    refused(model, before, r"model\.model\.embed_tokens\.weight was edited in place")


def test_another_model_and_a_global_hook_are_refused():
    model = tiny_model("tiny-llama")
    before = frozen_state(model)
    refused(tiny_model("tiny-llama"), before, "another model object")
    handle = torch.nn.modules.module.register_module_forward_hook(lambda *a: None)
    try:
        refused(model, before, "global forward hooks")
    finally:
        handle.remove()
    check_unchanged(before, model, "this decoder")


def test_what_it_cannot_see_is_what_its_docstring_says():
    """``.data`` has its own version counter: an edit through it is invisible (documented, not
    caught)."""
    import kvlab.frozen_state as module

    model = tiny_model("tiny-llama")
    before = frozen_state(model)
    model.model.norm.weight.data.mul_(2)
    assert unchanged(before, model)
    assert "tensor.data" in module.__doc__ and "class" in module.__doc__


def test_layer_problem_says_what_to_do():
    model = tiny_model("tiny-llama")
    assert layer_problem(model) is None
    model.model.layers = model.model.layers[:1]
    assert "model.config.num_hidden_layers = 1" in layer_problem(model)
    model.config.num_hidden_layers = 1
    assert layer_problem(model) is None
    model.model.layers = torch.nn.ModuleList([model.model.layers[0],
                                              tiny_model("tiny-llama").model.layers[1]])
    model.config.num_hidden_layers = 2
    assert layer_problem(model) is None
    # reordered: each attention writes the other's cache layer
    model.model.layers = model.model.layers[::-1]
    assert "layers[0] reads and writes cache layer 1" in layer_problem(model)

"""The caller owns the state: kvlab stores nothing on a model, so every decode follows the model as
it is now, and a decoder the caller holds refuses to replay graphs after what they froze moved."""

import gc
import weakref
from collections import Counter

import pytest
import torch

import kvlab
from kvlab.compiled_step import compiled_decoder, decode_graph_safe_compiled
from kvlab.graph_decoder import GraphSafeDecoder, GraphSafeError, decode_graph_safe, read_addresses
from kvlab.kernels.decoder import decode_graph_safe_kernels, kernels_decoder

IDS = torch.tensor([[1, 2, 3, 4, 5]])
STRATEGIES = {
    "graph-safe": decode_graph_safe,
    "graph-safe-kernels": decode_graph_safe_kernels,
    # on CPU: the fused copy, not compiled, emulated graphs
    "graph-safe-compiled": decode_graph_safe_compiled,
    "reduce-overhead": lambda m, ids, n: kvlab.decode(m, ids, n, strategy="reduce-overhead"),
}
GRAPH_SAFE = ["graph-safe", "graph-safe-kernels", "graph-safe-compiled"]


def stored(model) -> dict:
    """What an object holds in its own ``__dict__`` and in its modules', by name (what kvlab must
    not add to)."""
    return {name: set(m.__dict__) for name, m in model.named_modules()}


@pytest.mark.parametrize("name", STRATEGIES)
def test_a_decode_stores_nothing_on_the_model_and_the_model_is_freed(name):
    model = kvlab.tiny_model("tiny-llama")  # reduce-overhead compiles, on a CPU too
    before = stored(model)
    assert torch.equal(STRATEGIES[name](model, IDS, 4), kvlab.decode(model, IDS, 4))
    assert stored(model) == before
    alive = weakref.ref(model)
    del model
    gc.collect()
    assert alive() is None, (
        "something kvlab made kept the model alive after the last reference went")


@pytest.mark.parametrize("name", GRAPH_SAFE)
@pytest.mark.parametrize("edit", ["in-place", "through-data", "through-numpy", "replaced", "eps"])
def test_every_decode_follows_the_model_as_it_is_now(name, edit):
    model = kvlab.tiny_model("tiny-llama")
    STRATEGIES[name](model, IDS, 4)
    with torch.no_grad():
        if edit == "in-place":
            model.lm_head.weight.mul_(-1.0)
        elif edit == "through-data":
            model.model.embed_tokens.weight.data[IDS[0, -1]] += 5
        elif edit == "through-numpy":
            model.model.layers[0].mlp.down_proj.weight.detach().numpy()[:] *= 3.0
        elif edit == "replaced":
            model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach() * -1.0)
        else:
            model.model.layers[0].input_layernorm.variance_epsilon = 0.5
    assert torch.equal(STRATEGIES[name](model, IDS, 4), kvlab.decode(model, IDS, 4))


@pytest.mark.parametrize("name", ["graph-safe", "graph-safe-compiled"])
@pytest.mark.parametrize("change", ["hook", "patched-forward", "swapped-act", "fewer-layers"])
def test_a_changed_module_or_config_is_followed_by_the_next_decode(name, change):
    model = kvlab.tiny_model("tiny-llama")
    STRATEGIES[name](model, IDS, 4)
    layer = model.model.layers[0]
    if change == "hook":
        layer.mlp.register_forward_hook(lambda m, args, out: out * 2.0)
    elif change == "patched-forward":
        original = layer.mlp.forward
        layer.mlp.forward = lambda x: original(x) * 0.5
    elif change == "swapped-act":
        layer.mlp.act_fn = torch.nn.GELU()
    else:
        model.model.layers = model.model.layers[:1]
        model.config.num_hidden_layers = 1
    if name == "graph-safe-compiled" and change == "patched-forward":
        # the fused copy sets the MLP's forward: a patch there would be lost, so it is refused
        with pytest.raises(ValueError, match=r"rebuilds model\.model\.layers\.0\.mlp \(a patched"):
            STRATEGIES[name](model, IDS, 4)
        return
    assert torch.equal(STRATEGIES[name](model, IDS, 4), kvlab.decode(model, IDS, 4))


def test_read_addresses_lists_every_parameter_and_buffer_as_they_lie():
    """What a held decoder compares before each decode: every parameter and buffer, a tied weight
    under each of its names, a child slot set to None skipped."""
    model = kvlab.tiny_model("tiny-llama")
    model.model.register_module("unused", None)
    tensors = [*model.named_parameters(remove_duplicate=False),
               *model.named_buffers(remove_duplicate=False)]
    expected = Counter((t.data_ptr(), tuple(t.shape), str(t.dtype)) for _, t in tensors)
    got = Counter((ptr, tuple(shape), str(dtype)) for ptr, shape, dtype in read_addresses(model))
    assert got == expected and len(tensors) > 20
    # moved: another address
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    assert Counter((p, tuple(s), str(d)) for p, s, d in read_addresses(model)) != expected


def test_a_held_decoder_refuses_weights_that_moved():
    model = kvlab.tiny_model("tiny-llama")
    decoder = GraphSafeDecoder(model, 32)
    first = decoder.generate(IDS, 4)
    # replayed
    assert torch.equal(kvlab.decode(model, IDS, 4, strategy="graph-safe", decoder=decoder), first)
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    with pytest.raises(GraphSafeError,
                       match=r"model\.lm_head\.weight was replaced.*Build a new one"):
        decoder.generate(IDS, 4)


@pytest.mark.parametrize("edit", ["in-place", "replaced", "load_state_dict", "fewer-layers", "eps"])
def test_a_held_compiled_decoder_refuses_any_edit_its_copy_would_not_see(edit):
    """Its step reads a fused copy made when it was built: an edit of the original after that would
    not reach it, so the next decode through the held decoder is refused, naming the edit (issue 48,
    finding 2)."""
    model = kvlab.tiny_model("tiny-llama")
    # CPU: emulated, not compiled
    decoder = compiled_decoder(model, IDS, 4, max_cache_len=32, steps=4, graph=True)
    assert torch.equal(kvlab.decode(model, IDS, 4, strategy="graph-safe-compiled", decoder=decoder),
                       kvlab.decode(model, IDS, 4))
    with torch.no_grad():
        if edit == "in-place":
            model.lm_head.weight.mul_(-1.0)
        elif edit == "replaced":
            model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach() * -1.0)
        elif edit == "load_state_dict":
            model.load_state_dict({k: v * 2 for k, v in model.state_dict().items()})
        elif edit == "fewer-layers":
            model.model.layers = model.model.layers[:1]
            model.config.num_hidden_layers = 1
        else:
            model.model.norm.variance_epsilon = 0.5
    with pytest.raises(GraphSafeError, match="copy of the model"):
        decoder.generate(IDS, 4)
    with pytest.raises(GraphSafeError, match="copy of the model"):
        kvlab.decode(model, IDS, 4, strategy="graph-safe-compiled", decoder=decoder)
    assert torch.equal(kvlab.decode(model, IDS, 4, strategy="graph-safe-compiled"),
                       kvlab.decode(model, IDS, 4))


@pytest.mark.parametrize("name", ["graph-safe", "graph-safe-kernels", "graph-safe-speculative",
                                  "paged"])
def test_a_held_graph_refuses_a_module_setting_changed_after_capture(name):
    """A graph bakes in the plain-Python numbers its step read (an RMSNorm's epsilon): a held
    decoder refuses a decode after one changed, naming it, and a fresh decode follows the model
    (issue 48, finding 3)."""
    model = kvlab.tiny_model("tiny-llama")
    state = kvlab.STRATEGIES[name].state(model, IDS, 4)
    assert torch.equal(kvlab.decode(model, IDS, 4, strategy=name, **state),
                       kvlab.decode(model, IDS, 4))
    model.model.layers[0].input_layernorm.variance_epsilon = 0.5
    with pytest.raises(GraphSafeError,
                       match=r"input_layernorm\.variance_epsilon changed from .* to 0\.5"):
        kvlab.decode(model, IDS, 4, strategy=name, **state)
    assert torch.equal(kvlab.decode(model, IDS, 4, strategy=name), kvlab.decode(model, IDS, 4))


@pytest.mark.parametrize(("strategy", "option"), [
    ("graph-safe", {"graph": False}), ("graph-safe", {"prefill_bucket": 8}),
    ("graph-safe-kernels", {"steps": 2}),
    ("graph-safe-compiled", {"compile_mode": "default"}),
    ("graph-safe-kernels", {"fill_splits": False}),
    ("graph-safe-kernels", {"tiles": False})])
def test_a_decoder_with_settings_of_its_own_is_refused_at_the_door(strategy, option):
    model = kvlab.tiny_model("tiny-llama")
    decoder = kvlab.STRATEGIES[strategy].state(model, IDS, 4, max_cache_len=32)["decoder"]
    with pytest.raises(ValueError, match="keeps the settings it was built with"):
        kvlab.decode(model, IDS, 4, strategy=strategy, decoder=decoder, **option)


@pytest.mark.parametrize("option", [{"steps": 2}, {"compile_mode": "default"}, {"tiles": False}])
def test_another_strategys_setting_is_refused_by_name(option):
    model = kvlab.tiny_model("tiny-llama")
    decoder = GraphSafeDecoder(model, 32)
    with pytest.raises(TypeError, match=f"strategy 'graph-safe' takes no {next(iter(option))}="):
        kvlab.decode(model, IDS, 4, strategy="graph-safe", decoder=decoder, **option)


def test_timing_a_strategy_builds_its_decoder_once():
    from kvlab.lab.measure import time_strategy

    model = kvlab.tiny_model("tiny-llama")
    built = []
    original = GraphSafeDecoder.__init__

    def counting(self, *args, **kwargs):
        built.append(1)
        original(self, *args, **kwargs)

    GraphSafeDecoder.__init__ = counting
    try:
        run = time_strategy(model, IDS, 4, strategy="graph-safe", repeats=2)
    finally:
        GraphSafeDecoder.__init__ = original
    assert len(built) == 1 and torch.equal(run.tokens, kvlab.decode(model, IDS, 4))


def test_no_lesson_path_module_imports_the_lab():
    """kvlab/ is the lesson path; kvlab/lab/ is the bench behind it. Only kvlab/__init__ (which
    re-exports load_model and tiny_model) and the exercise checkers may reach into the lab."""
    import ast
    from pathlib import Path

    root = Path(kvlab.__file__).parent
    lesson_path = [
        p for p in root.rglob("*.py") if p.relative_to(root).parts[0] not in ("lab", "exercises")
                   and p.name != "__init__.py" or p.parent.name == "kernels"]
    assert {"decoding.py", "graph_decoder.py", "step.py"} <= {p.name for p in lesson_path}
    for path in lesson_path:
        package = ["kvlab", *path.relative_to(root).parts[:-1]]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                names = [".".join(base + ([node.module] if node.module else []))]
                names += [f"{names[0]}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            assert not any(n == "kvlab.lab" or n.startswith("kvlab.lab.") for n in names), (
                f"{path.relative_to(root)} imports {names[0]}: the lesson path must not import "
                "kvlab.lab")


@pytest.mark.parametrize("name", ["graph-safe", "graph-safe-kernels"])
def test_following_one_decode_enters_no_module_twice(name):
    """On every call stack of one decode, each kvlab module is one run of frames: no module calls
    down into another that calls back up into it. kvlab.graphs is left out: capture(fn) calls back
    the step it records (that is its contract), and its emulation watches every operation of that
    step."""
    import sys

    model, seen = kvlab.tiny_model("tiny-llama"), set()

    def watch(frame, event, arg):
        if event != "call" or not frame.f_globals.get("__name__", "").startswith("kvlab."):
            return
        runs = []
        while frame is not None:
            module = frame.f_globals.get("__name__", "")
            if module.startswith("kvlab.") and module != "kvlab.graphs" and (
                not runs or runs[-1] != module):
                runs.append(module)
            frame = frame.f_back
        seen.add(tuple(reversed(runs)))

    sys.setprofile(watch)
    try:
        kvlab.decode(model, IDS, 4, strategy=name)
    finally:
        sys.setprofile(None)
    assert any("kvlab.graph_safe_cache" in stack for stack in seen)  # the watch saw the decode
    again = sorted(" -> ".join(s) for s in seen if len(set(s)) < len(s))
    assert not again, f"a module entered twice on one call stack: {again[:3]}"


def test_a_kernels_decoder_without_a_copy_decodes_the_model_as_it_is_at_each_replay():
    """The kernels read the model's own weights (q/k/v and gate/up as stacked parts), so the decoder
    holds no second copy; an in-place edit reaches its next decode, a replaced weight is refused."""
    model = kvlab.tiny_model("tiny-llama")
    decoder = kernels_decoder(model, IDS, 4, max_cache_len=32, steps=4)
    own = {p.data_ptr() for p in model.parameters()}
    assert {p.data_ptr() for p in decoder.model.parameters()} <= own  # nothing copied
    assert torch.equal(decoder.generate(IDS, 4), kvlab.decode(model, IDS, 4))
    with torch.no_grad():
        model.model.layers[0].self_attn.k_proj.weight.mul_(-2.0)  # a part of the stacked q/k/v
        # past the version counter: the graph reads memory
        model.lm_head.weight.detach().numpy()[:] *= -1.0
    assert torch.equal(decoder.generate(IDS, 4), kvlab.decode(model, IDS, 4))
    model.model.layers[1].mlp.up_proj.weight = torch.nn.Parameter(
        model.model.layers[1].mlp.up_proj.weight.detach() * 2)
    with pytest.raises(GraphSafeError, match=r"up_proj\.weight was replaced"):
        decoder.generate(IDS, 4)


@pytest.mark.parametrize("option", [{"tiles": False}, {"captured_prefill": False}])
def test_the_kernels_steps_own_options_are_refused_for_the_model_step(option):
    with pytest.raises((TypeError, ValueError), match=next(iter(option))):
        kvlab.decode(kvlab.tiny_model("tiny-llama"), IDS, 4, strategy="graph-safe", **option)


@pytest.mark.parametrize("options", [{"tiles": False}, {"fill_splits": False},
                                     {"dot_attention": False, "captured_prefill": False}])
def test_kvlab_decode_takes_the_kernels_options_and_stays_token_exact(options):
    model = kvlab.tiny_model("tiny-qwen2")  # q/k/v biases: stacked too
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2]])
    assert torch.equal(kvlab.decode(model, ids, 6, strategy="graph-safe-kernels", **options),
                       kvlab.decode(model, ids, 6))
    decoder = kvlab.STRATEGIES["graph-safe-kernels"].state(model, ids, 6)["decoder"]
    with pytest.raises(ValueError, match="keeps the settings it was built with"):
        kvlab.decode(model, ids, 6, strategy="graph-safe-kernels", decoder=decoder, **options)

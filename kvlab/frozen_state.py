"""What a captured graph or a fused/compiled copy freezes of a model, and a cheap check that
none of it moved.

A graph replays the kernels it recorded: it reads every weight and buffer by address, runs the
layers that were there, and bakes in every plain-Python number a step read (an RMSNorm's
``variance_epsilon``, the attention's ``scaling``, the RoPE type). A fused copy holds the weights as
they were. Either one keeps decoding the old model after an edit, so whoever holds one takes
``before = frozen_state(model)`` when it freezes the model (for a fused copy: of the source model
and of the copy) and calls ``check_unchanged(before, model, "this decoder")`` before every decode;
it raises ``GraphSafeError`` naming what moved. ``unchanged(before, model)`` is its fast path (a
bool) and ``changes(before, model)`` the list of what moved, by name. ``layer_problem(model)`` says
what is wrong with a model whose decoder layers disagree with its config
(``kvlab.decoding.check_inputs`` refuses it).

What the snapshot holds (the check is one walk of the modules' own
``_parameters``/``_buffers``/``_modules`` dicts; it reads no tensor's data, so it never
waits for a device):

- every module, by identity and class (a submodule replaced, added or removed, or its
  ``__class__`` swapped, is seen), its instance
  ``forward`` if one was set on it (a patched forward) and its forward (pre-)hooks, plus the
  process's global forward hooks, each function by identity (a hook removed and another added, or
  a forward patched again in a re-run cell, is a change even where the count stays the same);
  transformers' own hooks that change no value (``_TRANSPARENT``) are left out;
- every parameter and buffer, by identity, address, shape, dtype, device and in-place version
  (``tensor._version``: an in-place edit under ``torch.no_grad()`` or ``torch.inference_mode()``,
  ``copy_``, ``load_state_dict`` all bump it);
- the decoder layers configured (``config.num_hidden_layers``) and present (``model.model.layers``);
- each module's public scalar attributes (numbers, NumPy's too, str, None), and the config fields a
  forward reads (``_CONFIG_READ``). ``training`` is left out: kvlab decodes the same tokens in train
  mode (a model with live dropout is refused by ``check_inputs``) and toggling ``model.eval()`` is
  common; so is ``gradient_checkpointing`` (it acts only where gradients are computed). Private
  attributes (``_name``) are left out. The snapshot holds weak references only (and the classes):
  it keeps no old weight alive.

What it cannot see: a weight edited through ``tensor.data`` (``p.data.mul_(2)``: ``.data`` has its
own version counter), through a raw ``data_ptr``, by another process or by a CUDA kernel of someone
else's; a tensor held in a plain attribute (not a parameter or buffer); a method patched on the
class (``LlamaMLP.forward = ...``) or a module-level function a forward calls; a setting held in a
container (a list or dict attribute) or in a private attribute; a config field outside
``_CONFIG_READ``; an int setting turned into the equal bool (``1`` -> ``True``); an in-place edit of
an inference tensor (a weight made under ``torch.inference_mode()`` keeps no version).
"""

from __future__ import annotations

import numbers
import weakref
from dataclasses import dataclass
from operator import itemgetter

import numpy as np
import torch

from .graph_safe_cache import GraphSafeError

# a setting: a plain number, text or None, NumPy's scalars too (np.float32 is no float)
_SCALARS = (numbers.Number, str, type(None), np.generic)
_CONFIG_READ = ("num_hidden_layers", "_attn_implementation", "sliding_window", "use_sliding_window",
               "max_window_layers", "layer_types",
               "attention_chunk_size")  # read by a forward's masks and loop
_MISSING = object()
# module settings no decode reads: kvlab decodes the same tokens in train mode, and gradient
# checkpointing acts only where gradients are computed
_UNREAD = ("training", "gradient_checkpointing")


def _decoder_layers(model) -> tuple[int, int | None]:
    """(configured, present): ``config.num_hidden_layers`` and ``len(model.model.layers)`` (None
    if not found)."""
    configured = model.config.get_text_config().num_hidden_layers
    base = getattr(model, "model", model)
    layers = getattr(base, "layers", None)
    return configured, (len(layers) if layers is not None else None)


def layer_problem(model) -> str | None:
    """What is wrong when the config and the model's decoder layers disagree (a forward runs
    ``layers[:config.num_hidden_layers]`` and a cache has one layer per configured one), or a
    layer's attention writes another position's cache layer (``self_attn.layer_idx``: a layer moved
    or copied), else None."""
    configured, present = _decoder_layers(model)
    if present is not None and present != configured:
        return (f"model.config.num_hidden_layers is {configured} but the model has {present} "
                "decoder layers (model.model.layers): a forward would run "
                f"{min(configured, present)} of them and a cache would hold {configured}; the "
                "layers or the config changed after the model was built. Set it "
                f"(model.config.num_hidden_layers = {present}), or build a model of the layers you "
                "want from its config")
    for i, layer in enumerate(getattr(getattr(model, "model", model), "layers", None) or ()):
        index = getattr(getattr(layer, "self_attn", None), "layer_idx", i)
        if index != i:
            return (f"model.model.layers[{i}] reads and writes cache layer {index} (its "
                    "self_attn.layer_idx): a layer was moved or copied from another position, and "
                    "a cache would mix two layers' keys. Set "
                    f"model.model.layers[{i}].self_attn.layer_idx = {i} (and so for each moved "
                    "layer), or build a model of the layers you want from its config")
    return None


def _ref(function):
    """A weak reference to ``function`` (equal to another while it lives; a new function at a freed
    address is not equal), or the function itself where it takes none."""
    try:
        return weakref.ref(function)
    except TypeError:
        return function


# Hooks transformers installs that change no value: the output recorder a call with
# output_hidden_states=True or output_attentions=True leaves on every layer (inactive outside such a
# call), and gradient checkpointing's input hook (it sets requires_grad)
_TRANSPARENT = {("transformers.utils.output_capturing", "output_capturing_hook"),
                ("transformers.modeling_utils", "make_inputs_require_grads")}


def transparent_hook(function) -> bool:
    """Whether ``function`` is a hook transformers installs that changes no value
    (``_TRANSPARENT``): a snapshot and the kernels leave it out."""
    where = getattr(function, "__module__", None), getattr(function, "__name__", None)
    return where in _TRANSPARENT


def _hooks(forward: dict, pre: dict) -> tuple:
    """Each forward (pre-)hook by its handle's id (never reused in a process) and function."""
    return (tuple((k, _ref(f)) for k, f in forward.items() if not transparent_hook(f)),
            tuple((k, _ref(f)) for k, f in pre.items() if not transparent_hook(f)))


def _marks(module) -> tuple | None:
    """(its instance ``forward``, its hooks), or None when it has neither."""
    d = module.__dict__
    if "forward" not in d and not d["_forward_hooks"] and not d["_forward_pre_hooks"]:
        return None
    hooks = _hooks(d["_forward_hooks"], d["_forward_pre_hooks"])
    if "forward" not in d and hooks == ((), ()):
        return None
    return (_ref(d["forward"]) if "forward" in d else None, hooks)


def _walk(model) -> tuple[list, list, tuple]:
    """Modules (depth first), their parameters and buffers (None slots dropped), and the marks of
    those with an instance ``forward`` or a forward (pre-)hook: (index, ``_marks``)."""
    modules, tensors, marks = [], [], []
    stack = [model]
    while stack:
        module = stack.pop()
        if module is None:  # a child slot set to None
            continue
        d = module.__dict__
        modules.append(module)
        tensors += d["_parameters"].values()
        tensors += d["_buffers"].values()
        stack += d["_modules"].values()
        if ("forward" in d or d["_forward_hooks"] or d["_forward_pre_hooks"]) and (
                mark := _marks(module)) is not None:
            marks.append((len(modules) - 1, mark))
    return modules, [t for t in tensors if t is not None], tuple(marks)


def _version(t: torch.Tensor) -> int:
    """``t``'s in-place version; an inference tensor (made under ``torch.inference_mode()``) keeps
    none: -1."""
    return -1 if t.is_inference() else t._version


def _signature(tensors: list, versions: bool = True) -> list:
    """(address, in-place version, shape) per tensor: a new dtype or device needs new memory, so a
    new address. Without ``versions`` the version is left out (0)."""
    return [(t.data_ptr(), _version(t) if versions else 0, t.shape) for t in tensors]


def _global_hooks() -> tuple:
    from torch.nn.modules import module as m

    return _hooks(m._global_forward_hooks, m._global_forward_pre_hooks)


def _config_settings(config) -> list:
    values = []
    for name in _CONFIG_READ:
        value = getattr(config, name, None)
        values.append(tuple(value) if isinstance(value, list) else value)
    return values


def _named_modules(model) -> dict:
    """name -> module, in the model's order (a module reachable under two names keeps both)."""
    found, stack = {}, [("", model)]
    while stack:
        name, module = stack.pop()
        if module is None:
            continue
        found[name] = module
        children = [(f"{name}.{child}" if name else child, sub)
                    for child, sub in module._modules.items()]
        stack += reversed(children)  # popped in the model's order
    return found


def _named_tensors(model) -> dict:
    found = {}
    for prefix, module in _named_modules(model).items():
        for kind in (module._parameters, module._buffers):
            for name, t in kind.items():
                if t is not None:
                    found[f"{prefix}.{name}" if prefix else name] = t
    return found


def _settings_plan(modules: list) -> list:
    """(index in the walk, names of its public scalar attributes) for each module that has any."""
    plan = []
    for i, module in enumerate(modules):
        names = tuple(k for k, v in module.__dict__.items()
                      if isinstance(v, _SCALARS) and not k.startswith("_") and k not in _UNREAD)
        if names:
            plan.append((i, itemgetter(*names)))
    return plan


def _settings(modules: list, plan: list) -> list:
    """The values of ``plan``'s settings; KeyError when one was deleted."""
    return [read(modules[i].__dict__) for i, read in plan]


@dataclass(frozen=True, eq=False)
class FrozenState:
    """What ``frozen_state(model)`` saw; compare with ``check_unchanged``. Holds weak
    references only."""

    model: weakref.ref
    config: tuple  # (configured, present) decoder layers, then the _CONFIG_READ values
    modules: tuple  # weakref per module, walk order
    classes: tuple  # type per module, walk order
    marks: tuple  # (module index, its instance forward and hooks) where it has any (``_marks``)
    tensors: tuple  # weakref per parameter and buffer, walk order
    signature: list  # (data_ptr, _version, shape) per tensor (version 0 without ``versions``)
    plan: list  # (module index, itemgetter of its setting names)
    settings: list  # their values
    hooks: tuple  # the global forward (pre-)hooks
    # by name, for messages: "modules", "tensors" (weakref, ptr, version, shape, dtype, device),
    # "settings" (value), "marks" (``_marks``)
    named: dict
    versions: bool = True  # whether an in-place edit counts as a change


def _config(model) -> tuple:
    config = model.config.get_text_config()
    layers = getattr(getattr(model, "model", model), "layers", None)
    return ((config.num_hidden_layers, None if layers is None else len(layers)),
            *_config_settings(config))


def frozen_state(model, *, versions: bool = True) -> FrozenState:
    """Snapshot what a captured graph or a fused copy of ``model`` freezes (see the
    module's docstring).

    ``versions=False``: an in-place edit of a weight is not a change. That is right for a graph that
    reads the model's own weights by address (its next replay reads the edited memory),
    wrong for a copy."""
    modules, tensors, marks = _walk(model)
    plan = _settings_plan(modules)
    named_modules = _named_modules(model)
    named = {
        "modules": {n: weakref.ref(m) for n, m in named_modules.items()},
        "tensors": {n: (weakref.ref(t), t.data_ptr(), _version(t), t.shape, t.dtype, t.device)
                    for n, t in _named_tensors(model).items()},
        "settings": {f"{n}.{k}" if n else k: v
                     for n, m in named_modules.items() for k, v in m.__dict__.items()
                     if isinstance(v, _SCALARS) and not k.startswith("_") and k not in _UNREAD},
        "marks": {n: _marks(m) for n, m in named_modules.items()},
        "classes": {n: type(m) for n, m in named_modules.items()},
    }
    return FrozenState(weakref.ref(model), _config(model), tuple(map(weakref.ref, modules)),
                       tuple(map(type, modules)), marks,
                       tuple(map(weakref.ref, tensors)), _signature(tensors, versions), plan,
                       _settings(modules, plan), _global_hooks(), named, versions)


def _same_objects(refs: tuple, objects: list) -> bool:
    return len(refs) == len(objects) and all(r() is o for r, o in zip(refs, objects, strict=True))


def unchanged(before: FrozenState, model) -> bool:
    """True when nothing ``frozen_state`` records moved since ``before`` (the fast path of
    ``check_unchanged``)."""
    if (before.model() is not model or _config(model) != before.config
            or _global_hooks() != before.hooks):

        return False
    modules, tensors, marks = _walk(model)
    if not (marks == before.marks and _same_objects(before.modules, modules)
            and tuple(map(type, modules)) == before.classes
            and _same_objects(before.tensors, tensors)
            and _signature(tensors, before.versions) == before.signature):
        return False
    try:
        return _settings(modules, before.plan) == before.settings
    except KeyError:  # a setting was deleted
        return False


def _path(name: str) -> str:
    return f"model.{name}" if name else "model"


def _fmt(value) -> str:
    return "(absent)" if value is _MISSING else repr(value)


def changes(before: FrozenState, model) -> list[str]:
    """What moved since ``before``, by name (empty when nothing ``frozen_state`` sees did)."""
    if before.model() is not model:
        return ["it is another model object than the one snapshotted"]
    found = []
    configured, present = _decoder_layers(model)
    if present is not None and present != configured:
        found.append(f"{configured} decoder layers configured (config.num_hidden_layers), "
                     f"{present} present (model.model.layers)")
    elif (configured, present) != before.config[0]:
        found.append(f"the model had {before.config[0][1]} decoder layers, now {present}")
    now_modules, was_modules = _named_modules(model), before.named["modules"]
    for name, r in was_modules.items():
        if name not in now_modules:
            found.append(f"{_path(name)} was removed")
        elif now_modules[name] is not r():
            found.append(f"{_path(name)} was replaced (now a {type(now_modules[name]).__name__})")
        elif type(now_modules[name]) is not before.named["classes"][name]:
            found.append(f"{_path(name)}'s class changed from "
                         f"{before.named['classes'][name].__name__} to "
                         f"{type(now_modules[name]).__name__}")
    found += [f"{_path(name)} was added" for name in now_modules if name not in was_modules]
    for name, module in now_modules.items():
        if name not in was_modules or module is not was_modules[name]():
            continue  # reported as a module change
        was = before.named["marks"][name]
        now = _marks(module)
        if now == was:
            continue
        none = (None, ((), ()))
        (forward, hooks), (was_forward, was_hooks) = now or none, was or none
        if forward != was_forward:
            found.append(f"{_path(name)}.forward was "
                         f"{'replaced on the instance' if forward is not None else 'restored'}")
        if hooks != was_hooks:
            found.append(f"{_path(name)}'s forward hooks changed ({sum(map(len, was_hooks))} "
                         f"before, {sum(map(len, hooks))} now)")
    if _global_hooks() != before.hooks:
        found.append("the global forward hooks changed "
                     "(torch.nn.modules.module.register_module_forward_hook)")
    now_tensors = _named_tensors(model)
    for name, (r, ptr, version, shape, dtype, device) in before.named["tensors"].items():
        t = now_tensors.get(name)
        if t is None:
            found.append(f"{_path(name)} was removed")
        elif t is not r():
            found.append(f"{_path(name)} was replaced by another tensor")
        elif (t.data_ptr(), t.shape, t.dtype, t.device) != (ptr, shape, dtype, device):
            found.append(f"{_path(name)} now holds other memory ({tuple(t.shape)} {t.dtype} on "
                         f"{t.device}, was {tuple(shape)} {dtype} on {device})")
        elif before.versions and _version(t) != version:
            found.append(f"{_path(name)} was edited in place")
    found += [f"{_path(name)} was added" for name in now_tensors
              if name not in before.named["tensors"]]
    for name, was in before.named["settings"].items():
        module_name, _, key = name.rpartition(".")
        module = now_modules.get(module_name)
        if module is None or module is not was_modules[module_name]():
            continue  # reported as a module change
        now = module.__dict__.get(key, _MISSING)
        if now != was or type(now) is not type(was):
            found.append(f"{_path(name)} changed from {_fmt(was)} to {_fmt(now)}")
    now_config = _config_settings(model.config.get_text_config())
    for name, was, now in zip(_CONFIG_READ, before.config[1:], now_config, strict=True):
        if now != was and name != "num_hidden_layers":
            found.append(f"model.config.{name} changed from {was!r} to {now!r}")
    return found


def _own_class(module) -> str | None:
    """The name of the module's class where it is not transformers' or torch's own (a subclass or a
    swapped ``__class__`` whose forward the weights alone do not say), else None."""
    where = type(module).__module__
    return None if where.startswith(("transformers.", "torch.")) else type(module).__qualname__


def python_overrides(model, rewritten=None) -> list[str]:
    """What a forward runs beyond transformers' and torch's classes: each module with an instance
    ``forward``, a class of its own or a forward (pre-)hook, by name, and the process's global
    forward hooks. A path that never runs the modules' Python (kvlab's kernels read the weights)
    or rebuilds some of them (a fused copy) would leave these out. ``rewritten(name, module)``:
    what such a copy loses of each module (False: nothing, ``"forward"``: its forward, True: the
    module and its hooks); global hooks are then left out (they run on every module)."""
    found = []
    for name, module in _named_modules(model).items():
        marks, own = _marks(module), _own_class(module)
        lost = True if rewritten is None else rewritten(name, module)
        if (marks is None and own is None) or not lost:
            continue
        forward, (hooks, pre_hooks) = marks or (None, ((), ()))
        if lost == "forward":
            hooks = pre_hooks = ()
        what = [w for w, has in (("a patched forward", forward is not None),
                                 (f"a class of its own, {own}", own),
                                 ("forward hooks", hooks), ("forward pre-hooks", pre_hooks)) if has]
        if what:
            found.append(f"{_path(name)} ({', '.join(what)})")
    if rewritten is None and any(_global_hooks()):
        found.append("global forward hooks (torch.nn.modules.module."
                     "register_module_forward_hook)")
    return found


def check_unchanged(before: FrozenState, model, what: str) -> None:
    """Raise ``GraphSafeError`` naming what moved in ``model`` since
    ``before = frozen_state(model)`` was taken when ``what`` (e.g. "this GraphSafeDecoder") froze
    it. Cheap when nothing moved: one walk of the modules."""
    if unchanged(before, model):
        return
    found = changes(before, model) or ["its parameters, buffers or settings moved"]
    shown = "; ".join(found[:5]) + (f"; and {len(found) - 5} more" if len(found) > 5 else "")
    raise GraphSafeError(f"the model changed after {what} was built: {shown}. {what} would decode "
                         "the model as it was (its graphs or copy froze it). Build a new one from "
                         "the model as it is now, or put back what was replaced or removed (an "
                         "edit in place cannot be undone: the check follows each tensor's version, "
                         "not its values)")

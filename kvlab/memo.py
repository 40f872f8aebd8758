"""What kvlab keeps per model (decoders with their caches and graphs, fused copies), held by the model itself.

A ``weakref.WeakKeyDictionary`` keyed by the model cannot hold these: its value (a decoder) refers to the model,
so the entry keeps its own key alive and the model, its caches and its CUDA graphs' memory pools are never freed.
Stored in the model's ``__dict__`` instead, the model and what was made for it form one cycle that
``gc.collect()`` frees once nothing else refers to the model.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import torch

ATTRIBUTE = "_kvlab_memo"


class PerModel(dict):
    """The memo of one model: ``(kind, key) -> object``. A copy of the model (``copy.deepcopy``, pickling) starts
    with an empty one: a decoder is bound to the model, cache and graph it was made for."""

    def __deepcopy__(self, memo):
        return PerModel()

    def __reduce__(self):
        return PerModel, ()


def per_model(model, kind: str, key: Hashable, make: Callable[[], object],
              keep: Callable[[object], bool] | None = None):
    """The object memoised for ``(kind, key)`` on ``model``, made by ``make()`` on first use, and made again when
    ``keep(obj)`` says the kept one no longer fits (a decoder whose graph reads replaced weights)."""
    store = model.__dict__.setdefault(ATTRIBUTE, PerModel())
    if (kind, key) not in store or (keep is not None and not keep(store[(kind, key)])):
        store.pop((kind, key), None)  # free the stale one (its cache and graph) before making its successor
        store[(kind, key)] = make()
    return store[(kind, key)]


def weights_state(model, *, writes: bool = False) -> tuple:
    """Address, dtype and device of every parameter and buffer (what a captured graph reads); with ``writes``,
    also each tensor's count of in-place writes (what a copy of the weights misses: load_state_dict, copy_)."""
    def version(t):
        try:
            return t._version
        except RuntimeError:  # an inference tensor keeps no count
            return None

    return tuple((t.data_ptr(), t.dtype, t.device) + ((version(t),) if writes else ())
                 for t in (*model.parameters(), *model.buffers()))


def weights_sample(model, per_tensor: int = 16) -> torch.Tensor:
    """Up to ``per_tensor`` evenly spaced values of every parameter and buffer, in one tensor: writes that bypass
    autograd's version counter (``p.data.mul_(2)``, a NumPy view of the weights) change them, and ``weights_state``
    cannot see those. A write that misses every sampled value is not seen either: after editing weights through
    ``.data``, ``kvlab.memo.forget(model)`` is the sure way."""
    tensors = [t.detach().reshape(-1) for t in (*model.parameters(), *model.buffers()) if t.numel()]
    return torch.cat([t[:: max(1, t.numel() // per_tensor)][:per_tensor].double() for t in tensors]) if tensors else torch.zeros(0)


def structure_state(model) -> tuple:
    """What a captured graph or a fused copy froze besides the weights: each module's class, an instance-level
    ``forward`` override, its hooks, and its norm epsilon. A hook added, a forward patched, a submodule swapped or an
    epsilon changed after capture would otherwise be silently ignored by the replays."""
    return tuple((name, type(m), m.__dict__.get("forward"), tuple(m._forward_hooks), tuple(m._forward_pre_hooks),
                  getattr(m, "variance_epsilon", None), getattr(m, "eps", None)) for name, m in model.named_modules())


def source_state(model) -> tuple:
    """``weights_state(writes=True)`` and ``structure_state`` of a model, and ``weights_sample`` (compare with
    ``same_source``): what a copy made from the model (a fused copy) depends on."""
    return weights_state(model, writes=True), structure_state(model), weights_sample(model)


def same_source(state: tuple, model) -> bool:
    """Whether ``model`` is still what ``source_state`` saw (the sampled values compared exactly)."""
    weights, structure, sample = state
    now = weights_sample(model)
    return (weights == weights_state(model, writes=True) and structure == structure_state(model)
            and now.shape == sample.shape and bool(torch.equal(now.to(sample.device), sample)))


def forget(model) -> None:
    """Drop everything kvlab keeps for ``model`` (its decoders, caches, graphs and fused copies)."""
    model.__dict__.pop(ATTRIBUTE, None)


def kept(model, kind: str) -> list:
    """The objects memoised on ``model`` under ``kind`` (e.g. the ``"graph-safe"`` decoders), oldest first."""
    return [obj for (k, _), obj in model.__dict__.get(ATTRIBUTE, {}).items() if k == kind]

"""What kvlab keeps per model (decoders with their caches and graphs, fused copies), held by the model itself.

A ``weakref.WeakKeyDictionary`` keyed by the model cannot hold these: its value (a decoder) refers to the model,
so the entry keeps its own key alive and the model, its caches and its CUDA graphs' memory pools are never freed.
Stored in the model's ``__dict__`` instead, the model and what was made for it form one cycle that
``gc.collect()`` frees once nothing else refers to the model.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

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


def forget(model) -> None:
    """Drop everything kvlab keeps for ``model`` (its decoders, caches, graphs and fused copies)."""
    model.__dict__.pop(ATTRIBUTE, None)


def kept(model, kind: str) -> list:
    """The objects memoised on ``model`` under ``kind`` (e.g. the ``"graph-safe"`` decoders), oldest first."""
    return [obj for (k, _), obj in model.__dict__.get(ATTRIBUTE, {}).items() if k == kind]

"""Capture a step once, replay it many times: a real CUDA graph on a GPU, the same contract emulated elsewhere.

The contract of a captured step, on every machine:

- the shapes, the Python values (ints, flags, branches taken) and the addresses of every tensor the step
  touched are frozen at capture;
- ``replay()`` re-runs the recorded tensor operations, reading the static inputs (and any other tensor the
  step read, such as a cache) *where they live*, mutating in place what the step mutated, and writing its
  results into the same static output tensors, which it returns;
- a host synchronization while capturing (``.item()``, ``bool(tensor)``, a branch on a tensor's value,
  ``nonzero``) is an error.

On CUDA, ``capture`` runs ``warmup`` calls of the step on a side stream (their side effects are real: a cache's
counters advance) and then records one call into a ``torch.cuda.CUDAGraph`` (recording runs no kernel).
Without CUDA, it runs the same warm-up calls, then traces one call with
``torch.fx.experimental.proxy_tensor.make_fx`` into a graph of aten operations; the tracing call's own side
effects are undone so that, as on CUDA, capturing itself changes nothing. Emulation gives the same tokens as a
real graph; it is not faster than eager (it still launches every operation from Python).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

# Operations that need the host to see a tensor's value (or a data-dependent shape): CUDA refuses them
# while a stream is capturing, and the emulation refuses them too.
HOST_SYNC_OPS = {
    "aten::_local_scalar_dense": "reads a tensor's value on the host (.item(), int(t), bool(t), `if t:`, t.tolist())",
    "aten::is_nonzero": "reads a tensor's truth value on the host (`if tensor:` or bool(tensor))",
    "aten::nonzero": "has an output shape that depends on the data (nonzero / boolean-mask indexing)",
    "aten::masked_select": "has an output shape that depends on the data (boolean-mask indexing)",
    "aten::_unique2": "has an output shape that depends on the data (unique)",
    "aten::unique_consecutive": "has an output shape that depends on the data (unique_consecutive)",
}

DEVICE_ASSERT_NOTE = (
    "On a GPU, an index out of range inside a kernel (for example a StaticCache write past max_cache_len) is a "
    "device-side assert: the CUDA context is poisoned, every later CUDA call in this process fails, and only "
    "restarting the Python process (Kernel > Restart) recovers. Check room on the host *before* replaying "
    "(capture(..., before_replay=...)); on CPU the same write is an ordinary IndexError/RuntimeError."
)


class CaptureError(RuntimeError):
    """The step cannot be captured as it is written (a host synchronization, a CUDA capture failure)."""


class ReplayError(RuntimeError):
    """A replay was refused or failed; the message says why and what to do."""


class _CaptureGuard(TorchDispatchMode):
    """Sits under make_fx while it traces: refuses host syncs and remembers every tensor before its first write."""

    def __init__(self):
        super().__init__()
        self.saved: list[tuple[torch.Tensor, torch.Tensor]] = []  # (tensor as written, its value before)
        self._seen: set = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name
        if name in HOST_SYNC_OPS:
            raise CaptureError(
                f"host synchronization during capture: {func} {HOST_SYNC_OPS[name]}. A captured graph cannot "
                "hand a value back to Python mid-step (CUDA refuses it with 'operation not permitted when stream is "
                "capturing'). Keep the value on the device (torch.where, index with a tensor) or move the check "
                "outside the captured function."
            )
        schema_args = func._schema.arguments
        values = list(args) + [kwargs.get(a.name) for a in schema_args[len(args):]]
        for arg, value in zip(schema_args, values, strict=False):
            if arg.alias_info is not None and arg.alias_info.is_write and isinstance(value, torch.Tensor):
                key = (value.data_ptr(), tuple(value.shape), tuple(value.stride()))
                if key not in self._seen:
                    self._seen.add(key)
                    self.saved.append((value, value.detach().clone()))
        return func(*args, **kwargs)

    def undo(self) -> None:
        """Put every tensor the traced call wrote back as it was (newest first, so overlaps end right)."""
        for tensor, before in reversed(self.saved):
            tensor.copy_(before)


def _flat_tensors(out, what: str) -> tuple[list[torch.Tensor], pytree.TreeSpec]:
    leaves, spec = pytree.tree_flatten(out)
    bad = [type(x).__name__ for x in leaves if not isinstance(x, torch.Tensor)]
    if bad:
        raise CaptureError(f"{what} must return tensors (or tuples/lists/dicts of them), got {bad}: a graph has no Python outputs")
    return leaves, spec


class CapturedStep:
    """A step captured by :func:`capture`. Call ``replay()``; read ``emulated``, ``capture_seconds``, ``describe()``."""

    def __init__(self, *, static_inputs, static_outputs, spec, emulated, capture_seconds, device, warmup,
                 graph=None, traced=None, before_replay=None, pool=None):
        self.static_inputs = static_inputs  # tensors the caller refills in place before each replay
        self.static_outputs = static_outputs  # flat list: replay writes here
        self._spec = spec
        self.emulated = emulated
        self.capture_seconds = capture_seconds
        self.device = device
        self.warmup = warmup
        self.graph = graph  # torch.cuda.CUDAGraph, or None when emulated
        self.traced = traced  # torch.fx.GraphModule, or None on CUDA
        self.before_replay = before_replay
        self.pool = pool
        self.replays = 0
        self._addresses = [(t.data_ptr(), tuple(t.shape)) for t in static_inputs]

    @property
    def outputs(self):
        """The static outputs, in the structure the step returned."""
        return pytree.tree_unflatten(self.static_outputs, self._spec)

    def describe(self) -> str:
        """One line for notebooks: which kind of graph this is, and where."""
        if self.emulated:
            where = "CPU" if self.device.type == "cpu" else str(self.device)
            n = len(self.traced.graph.nodes)
            return (f"EMULATED (no CUDA graph: make_fx trace of {n} nodes on {where}, same contract, no speedup); "
                    f"{self.warmup} warm-up call(s), captured in {self.capture_seconds:.2f} s")
        return (f"real CUDA graph on {torch.cuda.get_device_name(self.device)}; {self.warmup} warm-up call(s) on a "
                f"side stream, captured in {self.capture_seconds:.2f} s")

    __str__ = describe

    def __repr__(self) -> str:
        return f"<CapturedStep {self.describe()}>"

    def _check_inputs(self) -> None:
        for i, (t, (ptr, shape)) in enumerate(zip(self.static_inputs, self._addresses, strict=True)):
            if t.data_ptr() != ptr or tuple(t.shape) != shape:
                raise ReplayError(
                    f"static input {i} moved or changed shape since capture ({shape} -> {tuple(t.shape)}): the graph "
                    "reads the old address. Refill static inputs in place (static.copy_(new)), never rebind or resize them."
                )

    def replay(self):
        """Run the captured step again; returns the static outputs (the same tensors every time)."""
        self._check_inputs()
        if self.before_replay is not None:
            self.before_replay()  # host-side check, outside the graph: may sync and raise
        if self.emulated:
            try:
                fresh = self.traced(*self.static_inputs)
            except (IndexError, RuntimeError) as e:
                raise ReplayError(f"replay failed: {e}\n{DEVICE_ASSERT_NOTE}") from e
            for out, new in zip(self.static_outputs, pytree.tree_leaves(fresh), strict=True):
                if out.data_ptr() != new.data_ptr():
                    out.copy_(new)
        else:
            try:
                self.graph.replay()
            except RuntimeError as e:
                if "device-side assert" in str(e):
                    raise ReplayError(f"{e}\n{DEVICE_ASSERT_NOTE}") from e
                raise
        self.replays += 1
        return self.outputs


def _capture_cuda(fn, static_inputs, warmup, before_replay, device) -> CapturedStep:
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    t0 = time.perf_counter()
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn(*static_inputs)  # real calls: every side effect (counters, cache writes) happens
    torch.cuda.current_stream(device).wait_stream(side)
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            out = fn(*static_inputs)  # recorded, not run
    except RuntimeError as e:
        if "capturing" in str(e) or "capture" in str(e).lower():
            raise CaptureError(
                f"CUDA refused the capture: {e}\nUsually a host synchronization inside the step (.item(), "
                "bool(tensor), a branch on a tensor's value, a CPU tensor created from GPU data). Keep such work "
                "outside the captured function."
            ) from e
        raise
    torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t0
    leaves, spec = _flat_tensors(out, "the captured function")
    return CapturedStep(static_inputs=static_inputs, static_outputs=leaves, spec=spec, emulated=False,
                        capture_seconds=seconds, device=device, warmup=warmup, graph=graph,
                        before_replay=before_replay)


def _capture_emulated(fn, static_inputs, warmup, before_replay, device) -> CapturedStep:
    from torch.fx.experimental.proxy_tensor import make_fx

    t0 = time.perf_counter()
    for _ in range(warmup):
        fn(*static_inputs)  # real calls, as on CUDA: every side effect happens

    found = {}

    def flat_fn(*inputs):
        leaves, found["spec"] = _flat_tensors(fn(*inputs), "the captured function")
        found["meta"] = [(t.shape, t.dtype, t.device) for t in leaves]  # reading metadata records nothing
        return leaves

    guard = _CaptureGuard()
    try:
        with guard:
            traced = make_fx(flat_fn, tracing_mode="real")(*static_inputs)
    finally:
        guard.undo()  # CUDA's capture runs no kernel: undo what tracing ran, so capturing has no side effect
    # Like a CUDA graph's outputs right after capture, the static outputs exist but hold nothing yet.
    static_outputs = [torch.zeros(shape, dtype=dtype, device=dev) for shape, dtype, dev in found["meta"]]
    spec = found["spec"]
    seconds = time.perf_counter() - t0
    return CapturedStep(static_inputs=static_inputs, static_outputs=static_outputs, spec=spec, emulated=True,
                        capture_seconds=seconds, device=device, warmup=warmup, traced=traced,
                        before_replay=before_replay)


def capture(fn: Callable, *static_inputs: torch.Tensor, warmup: int = 3, emulate: bool | None = None,
            before_replay: Callable[[], None] | None = None) -> CapturedStep:
    """Capture ``fn(*static_inputs)`` once; ``.replay()`` re-runs it on whatever the static inputs hold then.

    ``warmup``: real calls made before capture (CUDA needs a few so that lazy initialisations happen outside
    the graph; their side effects are real, which is one of lesson 04's failures). ``emulate``: ``None`` picks a
    real CUDA graph when the inputs are on a CUDA device, else the emulation; ``True`` forces the emulation
    (also on a GPU, to compare the two). ``before_replay``: a host-side check run before every replay, e.g. to
    refuse a write past the end of a cache before it becomes a device-side assert.
    """
    if not static_inputs or not all(isinstance(t, torch.Tensor) for t in static_inputs):
        raise CaptureError("capture(fn, *static_inputs) needs at least one tensor input (the buffer you refill before each replay)")
    if not isinstance(warmup, int) or warmup < 0:
        raise CaptureError(f"warmup must be an int >= 0, got {warmup!r}")
    device = static_inputs[0].device
    if any(t.device != device for t in static_inputs):
        raise CaptureError(f"all static inputs must be on one device, got {sorted({str(t.device) for t in static_inputs})}")
    real = device.type == "cuda" and torch.cuda.is_available()
    if emulate is False and not real:
        raise CaptureError(f"emulate=False asks for a real CUDA graph, but the inputs are on {device}: move them to CUDA or leave emulate=None")
    if real and not emulate:
        return _capture_cuda(fn, static_inputs, warmup, before_replay, device)
    return _capture_emulated(fn, static_inputs, warmup, before_replay, device)

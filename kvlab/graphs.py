"""Capture a step once, replay it many times: a real CUDA graph on a GPU, the same contract emulated
elsewhere.

The contract of a captured step, on every machine:

- the shapes, the Python values (ints, flags, branches taken) and the addresses of every tensor the
  step touched are frozen at capture;
- ``replay()`` re-runs the recorded tensor operations, reading the static inputs (and any other
  tensor the step read, such as a cache) *where they live*, mutating in place what the step mutated,
  and writing its results into the same static output tensors, which it returns;
- a host synchronization while capturing (``.item()``, ``bool(tensor)``, a branch on a tensor's
  value, ``nonzero``) is an error.

On CUDA, ``capture`` runs ``warmup`` calls of the step on a side stream (their side effects are
real: a cache's counters advance) and then records one call into a ``torch.cuda.CUDAGraph``
(recording runs no kernel). Without CUDA, it runs the same warm-up calls, then records one call as a
list of aten operations (a ``TorchDispatchMode``, like ``make_fx`` but light): each operation with
its Python arguments frozen and its tensor arguments either the result of an earlier operation or a
tensor that existed before (a static input, a weight, a cache buffer), held by reference, so replay
reads and mutates it where it lives. The recording call's own writes are undone so that, as on CUDA,
capturing itself changes nothing. Emulation gives the same tokens as a real graph; it skips the
model's Python code at replay, but still launches every operation one by one.

One capture (its warm-up calls, recording and synchronizations) runs at a time in a process, other
threads' captures waiting for it; a CUDA capture refuses unsafe calls in its own thread only
(``thread_local``), so other threads' eager work and replays run beside it. Two things no capture
can allow in another thread: a device-wide ``torch.cuda.synchronize()`` and CUDA random numbers
(torch refuses both while any capture records). No captured step's graph is destroyed while one
records: destroying a CUDA graph during any capture invalidates that capture ("operation failed due
to a previous error during capture"). A step dropped while a capture runs, by another thread or by
the step itself, keeps its graph until the capture ends, which then frees it; Python's automatic
garbage collection is paused while a step records as well, so that a dead reference cycle holding a
graph of your own is not collected at whatever allocation triggers the collector. Lesson 04's raw
recipe (``EMULATED_CUDA.CUDAGraph``) keeps CUDA's own rule: a raw graph freed while a capture
records makes that capture fail, with the same ``CaptureError`` in the emulation.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from .runtime import collector_paused, count

# Operations that need the host to see a tensor's value (or a data-dependent shape): CUDA refuses
# them while a stream is capturing, and the emulation refuses them too.
_HOST_SYNC_OPS = {
    "aten::_local_scalar_dense": "reads a tensor's value on the host (.item(), int(t), bool(t), "
                                 "`if t:`, t.tolist())",
    "aten::is_nonzero": "reads a tensor's truth value on the host (`if tensor:` or bool(tensor))",
    "aten::nonzero": "has an output shape that depends on the data (nonzero / boolean-mask "
                     "indexing)",
    "aten::masked_select": "has an output shape that depends on the data (boolean-mask indexing)",
    "aten::_unique2": "has an output shape that depends on the data (unique)",
    "aten::unique_consecutive": "has an output shape that depends on the data (unique_consecutive)",
    "aten::bincount": "has an output shape that depends on the data (bincount: its length is the "
                      "largest value)",
    "aten::equal": "hands a comparison's result to Python as a bool (torch.equal)",
    "aten::allclose": "hands a comparison's result to Python as a bool (torch.allclose)",
}
_DATA_SHAPED = {  # operations whose output shape depends on the data only for some arguments
    "aten::repeat_interleave": "with tensor repeats has an output shape that depends on the data "
                               "(repeat_interleave)",
}

_DEVICE_ASSERT_NOTE = (
    "On a GPU, an index out of range inside a kernel (for example a StaticCache write past "
    "max_cache_len) is a device-side assert: the CUDA context is poisoned, every later CUDA call "
    "in this process fails, and only restarting the Python process (Kernel > Restart) recovers. "
    "Check room on the host *before* replaying (capture(..., before_replay=...)); on CPU the same "
    "write is an ordinary IndexError/RuntimeError."
)


class CaptureError(RuntimeError):
    """The step cannot be captured as it is written (a host synchronization, a CUDA capture
    failure)."""


class ReplayError(RuntimeError):
    """A replay was refused or failed; the message says why and what to do."""


class _Ref:
    """An argument that is the ``leaf``-th tensor output of recorded operation ``node``."""

    __slots__ = ("node", "leaf")

    def __init__(self, node: int, leaf: int):
        self.node, self.leaf = node, leaf


def _leaves(out) -> list:
    """The outputs of one aten op as a flat list (the same positions at record and at replay)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)) and not any(isinstance(y, (tuple, list)) for y in out):
        return list(out)
    return pytree.tree_leaves(out)


def _has_ref(x) -> bool:
    return type(x) is _Ref or (type(x) in (list, tuple) and any(type(y) is _Ref for y in x))


def _host_sync(what: str, why: str) -> CaptureError:
    return CaptureError(
        f"host synchronization during capture: {what} {why}. A captured graph cannot hand a value "
        "back to Python mid-step (CUDA refuses it with 'operation not permitted when stream is "
        "capturing'). Keep the value on the device (torch.where, index with a tensor) or move the "
        "check outside the captured function."
    )


# Python-level reads of a tensor's value: a capture refuses them, with the same words on CPU and GPU
_HOST_READS = {
    "item": "reads a tensor's value on the host",
    "tolist": "reads a tensor's values on the host",
    "numpy": "hands a tensor's values to NumPy",
    "__array__": "hands a tensor's values to NumPy (np.asarray, np.array)",
    "__bool__": "reads a tensor's truth value on the host (`if tensor:`, bool(tensor))",
    "__int__": "reads a tensor's value on the host (int(tensor))",
    "__float__": "reads a tensor's value on the host (float(tensor))",
    "__index__": "reads a tensor's value on the host (a tensor as a Python index or slice bound)",
}


class _Recording:
    """The capture recording now in this process: its thread, the raw emulated graphs freed while it
    records, and the graphs of captured steps dropped meanwhile, kept until it ends."""

    # one capture (warm-up to end) at a time per process; held to destroy a captured graph
    lock = threading.Lock()
    owner: int | None = None  # the thread holding the lock
    thread: int | None = None  # the thread recording now (its warm-up done)
    freed: list[str] = []
    kept: list = []


def _is_recording() -> bool:
    """Whether this thread is recording a capture right now (a real CUDA graph or the emulation)."""
    return _Recording.thread == threading.get_ident()


_FREED_DURING_CAPTURE = (
    "a raw graph was freed while this capture recorded ({what}): destroying a CUDA graph during a "
    "capture invalidates the capture (CUDA: 'operation failed due to a previous error during "
    "capture'), and the emulation refuses it the same way. kvlab's captured steps are kept until "
    "the capture ends; a raw CUDAGraph of your own is not: drop it before capturing or after, "
    "never inside the captured step, and keep it out of reference cycles (a graph in a cycle is "
    "freed whenever the garbage collector runs)."
)


@contextmanager
def _one_capture_at_a_time():
    """Hold the process's capture lock from a capture's first warm-up call to its end: another
    thread's capture (its warm-up and device synchronizations included) waits, since CUDA refuses a
    device-wide sync while any stream captures. Graphs of captured steps dropped meanwhile are
    destroyed when the lock is let go."""
    if _Recording.owner == threading.get_ident():
        raise CaptureError("capture() was called inside a step being captured: capture each step "
                           "on its own")
    with _Recording.lock:
        _Recording.owner = threading.get_ident()
        try:
            yield
        finally:
            _Recording.owner = None
            # graphs of steps dropped while this capture ran: destroyed now, safely
            _Recording.kept.clear()


@contextmanager
def _recording():
    """Mark this thread as recording (the caller holds ``_one_capture_at_a_time``), with automatic
    garbage collection paused (a dead reference cycle holding a graph must not be collected
    mid-capture); yields the list of raw emulated graphs freed meanwhile. Python values only:
    nothing else is left changed when it ends."""
    with collector_paused():
        _Recording.thread, _Recording.freed = threading.get_ident(), []
        try:
            yield _Recording.freed
        finally:
            _Recording.thread = None


@contextmanager
def _no_host_reads(device: torch.device | None = None):
    """Refuse ``_HOST_READS`` in the capturing thread while a step is captured: on a GPU each copies
    the device's data to the host, which a capture refuses (``.numpy()`` of a CUDA tensor even
    raises a TypeError of its own), and some run no aten operation, so the emulation's recorder
    cannot see them. ``device``: refuse only tensors there (a real capture: CPU tensors may still be
    read); None: every tensor (the emulation, where everything is on the CPU). Other threads, and
    every thread once the capture ends, see the methods unchanged (callers hold ``_recording``)."""
    patched = {}

    def refuse(name, why, inherited):
        def method(self, *args, **kwargs):
            if not _is_recording() or (device is not None and self.device.type != device.type):
                return inherited(self, *args, **kwargs)
            raise _host_sync(f"Tensor.{name}()", why)
        return method

    for name, why in _HOST_READS.items():
        patched[name] = torch.Tensor.__dict__.get(name)
        setattr(torch.Tensor, name, refuse(name, why, getattr(torch.Tensor, name)))
    try:
        yield
    finally:
        for name, original in patched.items():
            if original is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, original)


class _Recorder(TorchDispatchMode):
    """Records every aten operation of one call; refuses host syncs; remembers each tensor before
    its first write.

    A tensor argument is encoded as a ``_Ref`` when an earlier operation produced it, else kept as
    the tensor itself (a fixed address, as in a CUDA graph). Python values (ints, shapes, flags)
    stay as they were: frozen.
    """

    def __init__(self):
        super().__init__()
        self.nodes: list[tuple] = []  # (op, args, kwargs) with tensors encoded
        self.producer: dict[int, _Ref] = {}  # id(tensor) -> where it came from
        self.alive: list[torch.Tensor] = []  # keeps recorded tensors alive so that ids stay unique
        # (tensor as written, its value before)
        self.saved: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._seen: set = set()

    def encode(self, x):
        return self.producer.get(id(x), x) if isinstance(x, torch.Tensor) else x

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name
        if name in _HOST_SYNC_OPS:
            raise _host_sync(str(func), _HOST_SYNC_OPS[name])
        if name in _DATA_SHAPED and "Tensor" in func._overloadname:
            raise _host_sync(str(func), _DATA_SHAPED[name])
        if name in ("aten::index", "aten::index_put", "aten::index_put_",
                    "aten::_index_put_impl_") and any(
                isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
                for i in (args[1] if len(args) > 1 else ()) or ()):
            raise _host_sync(str(func), "with a boolean mask has an output shape that depends on "
                                        "the data (boolean-mask indexing); use "
                                        "torch.where(mask, x, other) instead")
        schema_args = func._schema.arguments
        values = list(args) + [kwargs.get(a.name) for a in schema_args[len(args):]]
        for arg, value in zip(schema_args, values, strict=False):
            if (arg.alias_info is not None and arg.alias_info.is_write
                    and isinstance(value, torch.Tensor)):
                key = (value.data_ptr(), tuple(value.shape), tuple(value.stride()))
                if key not in self._seen:
                    self._seen.add(key)
                    self.saved.append((value, value.detach().clone()))
        enc_args, enc_kwargs = pytree.tree_map_only(torch.Tensor, self.encode, (args, kwargs))
        out = func(*args, **kwargs)
        index = len(self.nodes)
        self.nodes.append((func, tuple(enc_args), dict(enc_kwargs)))
        for leaf_i, leaf in enumerate(_leaves(out)):
            if isinstance(leaf, torch.Tensor):
                self.producer[id(leaf)] = _Ref(index, leaf_i)
                self.alive.append(leaf)
        return out

    def undo(self) -> None:
        """Put every tensor the recorded call wrote back as it was (newest first, so overlaps end
        right)."""
        for tensor, before in reversed(self.saved):
            tensor.copy_(before)


class RecordedOps:
    """The emulated graph: a list of aten operations replayed in order, without the model's Python
    code."""

    def __init__(self, nodes, outputs):
        self.nodes = nodes
        self.outputs = outputs  # flat: a _Ref or a tensor, per output

    def __len__(self) -> int:
        return len(self.nodes)

    def __call__(self) -> list[torch.Tensor]:
        results: list[list] = []

        def decode(x):
            if type(x) is _Ref:
                return results[x.node][x.leaf]
            if type(x) in (list, tuple):
                return type(x)(decode(y) for y in x)
            return x

        for func, args, kwargs, arg_slots, kwarg_slots in self._plan:
            if arg_slots:
                args = list(args)
                for i in arg_slots:
                    args[i] = decode(args[i])
            if kwarg_slots:
                kwargs = dict(kwargs)
                for k in kwarg_slots:
                    kwargs[k] = decode(kwargs[k])
            results.append(_leaves(func(*args, **kwargs)))
        return [decode(x) for x in self.outputs]

    @property
    def _plan(self):
        """Per op: which arguments refer to earlier results (worked out once)."""
        if self.__dict__.get("_plan_cache") is None:
            self._plan_cache = [
                (func, args, kwargs, [i for i, a in enumerate(args) if _has_ref(a)],
                 [k for k, v in kwargs.items() if _has_ref(v)])
                for func, args, kwargs in self.nodes
            ]
        return self._plan_cache


def _flat_tensors(out, what: str) -> tuple[list[torch.Tensor], pytree.TreeSpec]:
    leaves, spec = pytree.tree_flatten(out)
    bad = [type(x).__name__ for x in leaves if not isinstance(x, torch.Tensor)]
    if bad:
        raise CaptureError(f"{what} must return tensors (or tuples/lists/dicts of them), got "
                           f"{bad}: a graph has no Python outputs")
    return leaves, spec


class CapturedStep:
    """A step captured by :func:`capture`. Call ``replay()``; read ``emulated``,
    ``capture_seconds``, ``describe()``."""

    def __init__(self, *, static_inputs, static_outputs, spec, emulated, capture_seconds, device,
                 warmup, graph=None, traced=None, before_replay=None, pool=None):
        self.static_inputs = static_inputs  # tensors the caller refills in place before each replay
        self.static_outputs = static_outputs  # flat list: replay writes here
        self._spec = spec
        self.emulated = emulated
        self.capture_seconds = capture_seconds
        self.device = device
        self.warmup = warmup
        self.graph = graph  # torch.cuda.CUDAGraph, or None when emulated
        self.traced = traced  # RecordedOps when emulated, else None
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
            return (f"EMULATED (no CUDA here: {len(self.traced)} recorded aten ops replayed on "
                    f"{where}, same contract); {self.warmup} warm-up call(s), captured in "
                    f"{self.capture_seconds:.2f} s")
        return (f"real CUDA graph on {torch.cuda.get_device_name(self.device)}; {self.warmup} "
                f"warm-up call(s) on a side stream, captured in {self.capture_seconds:.2f} s")

    __str__ = describe

    def __repr__(self) -> str:
        return f"<CapturedStep {self.describe()}>"

    def __del__(self):
        # Destroying a graph while any thread captures spoils that capture: destroy it under the
        # capture lock, or, while a capture holds the lock, hand it to that capture, which destroys
        # it when it ends.
        if _Recording.lock.acquire(blocking=False):
            try:
                self.graph = self.traced = None
                _Recording.kept.clear()  # any handed over just as a capture ended
            finally:
                _Recording.lock.release()
        else:
            _Recording.kept.append((self.graph, self.traced))

    def _check_inputs(self) -> None:
        for i, (t, (ptr, shape)) in enumerate(zip(self.static_inputs, self._addresses,
                                                  strict=True)):
            if t.data_ptr() != ptr or tuple(t.shape) != shape:
                raise ReplayError(
                    f"static input {i} moved or changed shape since capture ({shape} -> "
                    f"{tuple(t.shape)}): the graph reads the old address. Refill static inputs in "
                    "place (static.copy_(new)), never rebind or resize them."
                )

    def replay(self):
        """Run the captured step again; returns the static outputs (the same tensors every time)."""
        self._check_inputs()
        if self.before_replay is not None:
            self.before_replay()  # host-side check, outside the graph: may sync and raise
        if self.emulated:
            try:
                # static inputs are read where they live, like every other tensor
                fresh = self.traced()
            except (IndexError, RuntimeError) as e:
                raise ReplayError(f"replay failed: {e}\n{_DEVICE_ASSERT_NOTE}") from e
            for out, new in zip(self.static_outputs, fresh, strict=True):
                if out.data_ptr() != new.data_ptr():
                    out.copy_(new)
        else:
            try:
                self.graph.replay()
            except RuntimeError as e:
                if "device-side assert" in str(e):
                    raise ReplayError(f"{e}\n{_DEVICE_ASSERT_NOTE}") from e
                raise
        self.replays += 1
        return self.outputs


# The errors torch raises for a failed CUDA call (torch >= 2.8: AcceleratorError), as opposed to an
# exception that Python code of the step raised on purpose (kvlab's own GraphSafeError, say), which
# goes through unchanged.
_CUDA_ERRORS = (RuntimeError, getattr(torch, "AcceleratorError", RuntimeError))


# RoPE kinds whose frequencies change with the length: transformers picks them with a Python `if`
# on a tensor inside the forward, which no captured graph can hold
LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")


def check_capturable_rope(model, strategy: str, off: str) -> None:
    """Refuse, before anything is captured, a model whose RoPE cannot be captured: a 'dynamic' or
    'longrope' RoPE decides on the host, inside transformers' forward, whether the length has
    outgrown its frequencies. ``off`` says how to run the same strategy without capture."""
    kinds = {getattr(m, "rope_type", None) for m in model.modules()} & set(LENGTH_DEPENDENT_ROPE)
    if kinds:
        kind = sorted(kinds)[0]
        raise CaptureError(
            f"this model has {kind!r} RoPE (its frequencies change with the length): "
            "transformers checks the length with an `if` on a tensor inside the model's forward, "
            f"which a captured graph cannot hold, so {strategy} cannot capture it. Decode it with "
            f"strategy='static', 'dynamic' or 'naive', or {off}"
        )


def _refused(e: BaseException) -> CaptureError:
    # what a graph destroyed mid-capture leaves, among other causes
    if "previous error during capture" in str(e):
        return CaptureError(f"CUDA refused the capture: {e}\nTwo things spoil a capture this way: "
                            "a host synchronization inside the step (.item(), bool(tensor), a "
                            "branch on a tensor's value; keep such work outside the captured "
                            "function), or a graph destroyed while it recorded. If the step "
                            "syncs nothing: "
                            + _FREED_DURING_CAPTURE.format(what="CUDA does not say which"))
    return CaptureError(
        f"CUDA refused the capture: {e}\nUsually a host synchronization inside the step (.item(), "
        "bool(tensor), a branch on a tensor's value, a CPU tensor created from GPU data). Keep "
        "such work outside the captured function."
    )


def _capture_cuda(fn, static_inputs, warmup, before_replay, device) -> CapturedStep:
    with _one_capture_at_a_time():
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        t0 = time.perf_counter()
        with torch.cuda.stream(side):
            for _ in range(warmup):
                fn(*static_inputs)  # real calls: every side effect (counters, cache writes) happens
        torch.cuda.current_stream(device).wait_stream(side)
        torch.cuda.synchronize(device)
        with torch.cuda.device(device):
            # cuBLAS makes its handle at the first matmul of the process (cublasCreate), which a
            # capture refuses (CUBLAS_STATUS_NOT_INITIALIZED): with warmup=0 in a fresh process,
            # make it here, outside the capture.
            torch.cuda.current_blas_handle()
        graph = torch.cuda.CUDAGraph()
        # what the step itself raised while being captured; capture_end() failed
        raised, end_failed = None, False
        with _recording():
            try:
                # torch.cuda.graph's __exit__ restores the current stream only when capture_end()
                # succeeds; this outer context puts the caller's stream (and device) back however
                # the capture ends. thread_local: CUDA refuses unsafe calls (a sync, a cudaMalloc)
                # in this thread only, as the emulation does; under "global", another thread's eager
                # work (a decode, an .item()) fails and spoils this capture.
                with (torch.cuda.stream(torch.cuda.current_stream(device)),
                      torch.cuda.graph(graph, capture_error_mode="thread_local")):
                    try:
                        # the emulation's words for .item(), .numpy(), ...
                        with _no_host_reads(torch.device(device)):
                            out = fn(*static_inputs)  # recorded, not run
                    except BaseException as e:
                        # leave the block normally, so that the capture ends; raised below
                        raised = e
            except RuntimeError as e:
                # capture_begin() or capture_end() failed (an invalidated capture, ...)
                if raised is None:
                    if "captur" in str(e).lower():
                        raise _refused(e) from e
                    raise
                # The capture was spoilt by what the step did before
                # it raised: the step's own error says why, not this.
                end_failed = True
                if hasattr(raised, "add_note"):  # Python 3.11+
                    raised.add_note("(kvlab.graphs.capture: ending the abandoned CUDA capture then "
                                    "failed too: "
                                    f"{(str(e).strip().splitlines() or [type(e).__name__])[0]})")
        if raised is not None:
            if type(raised) in _CUDA_ERRORS and (end_failed or "captur" in str(raised).lower()):
                # a CUDA call of the step was refused (a host sync, ...)
                raise _refused(raised) from raised
            raise raised  # the step's own exception (e.g. GraphSafeError), with its traceback
        torch.cuda.synchronize(device)
        seconds = time.perf_counter() - t0
    leaves, spec = _flat_tensors(out, "the captured function")
    return CapturedStep(static_inputs=static_inputs, static_outputs=leaves, spec=spec,
                        emulated=False, capture_seconds=seconds, device=device, warmup=warmup,
                        graph=graph, before_replay=before_replay)


@contextmanager
def _libraries_see_a_capture():
    """While a CUDA stream captures, libraries skip their host-side checks: transformers'
    ``is_tracing()`` asks ``torch.cuda.is_current_stream_capturing()`` and then leaves out, e.g.,
    the mask-skipping test that reads a tensor. The emulation gives transformers the same answer, so
    it records the same operations a real capture does."""
    utils = sys.modules.get("transformers.utils.import_utils")
    if utils is None or not hasattr(utils, "is_cuda_stream_capturing"):
        yield
        return
    original = utils.is_cuda_stream_capturing
    # this thread's capture only
    utils.is_cuda_stream_capturing = lambda: _is_recording() or original()
    try:
        yield
    finally:
        utils.is_cuda_stream_capturing = original


def _capture_emulated(fn, static_inputs, warmup, before_replay, device) -> CapturedStep:
    t0 = time.perf_counter()
    recorder = _Recorder()
    with _one_capture_at_a_time():
        for _ in range(warmup):
            fn(*static_inputs)  # real calls, as on CUDA: every side effect happens
        with _recording() as freed:
            try:
                with recorder, _libraries_see_a_capture(), _no_host_reads():
                    leaves, spec = _flat_tensors(fn(*static_inputs), "the captured function")
                outputs = [recorder.encode(t) for t in leaves]
                meta = [(t.shape, t.dtype, t.device) for t in leaves]
            finally:
                # CUDA's capture runs no kernel: undo what
                # recording ran, so capturing has no side effect
                recorder.undo()
            if freed:
                raise CaptureError(_FREED_DURING_CAPTURE.format(what="; ".join(freed)))
    traced = RecordedOps(recorder.nodes, outputs)
    del recorder, leaves  # the recording call's intermediates are not needed any more
    # Like a CUDA graph's outputs right after capture,
    # the static outputs exist but hold nothing yet.
    static_outputs = [torch.zeros(shape, dtype=dtype, device=dev) for shape, dtype, dev in meta]
    seconds = time.perf_counter() - t0
    return CapturedStep(static_inputs=static_inputs, static_outputs=static_outputs, spec=spec,
                        emulated=True, capture_seconds=seconds, device=device, warmup=warmup,
                        traced=traced, before_replay=before_replay)


def capture(fn: Callable, *static_inputs: torch.Tensor, warmup: int = 3,
            emulate: bool | None = None,
            before_replay: Callable[[], None] | None = None) -> CapturedStep:
    """Capture ``fn(*static_inputs)`` once; ``.replay()`` re-runs it on whatever the static inputs
    hold then.

    ``warmup``: real calls made before capture (CUDA needs a few so that lazy initialisations happen
    outside the graph; their side effects are real, which is one of lesson 04's failures).
    ``emulate``: ``None`` picks a real CUDA graph when the inputs are on a CUDA device, else the
    emulation; ``True`` forces the emulation (also on a GPU, to compare the two). ``before_replay``:
    a host-side check run before every replay, e.g. to refuse a write past the end of a cache before
    it becomes a device-side assert.
    """
    real = _check_capture(static_inputs, warmup, emulate)  # the refusals, all in one place (below)
    device = static_inputs[0].device
    if real:
        return _capture_cuda(fn, static_inputs, warmup, before_replay, device)
    return _capture_emulated(fn, static_inputs, warmup, before_replay, device)


def _check_capture(static_inputs: tuple, warmup: int, emulate: bool | None) -> bool:
    """The door of ``capture``: at least one tensor input, all on one device, ``warmup`` an
    int >= 0, ``emulate`` a bool or None, and no ``emulate=False`` (a real CUDA graph) for inputs
    that are not on a CUDA device. Returns whether the capture is a real CUDA graph."""
    if not static_inputs or not all(isinstance(t, torch.Tensor) for t in static_inputs):
        raise CaptureError("capture(fn, *static_inputs) needs at least one tensor input (the "
                           "buffer you refill before each replay)")
    try:
        count(warmup, "warmup", minimum=0)  # a NumPy or 0-dim tensor int reads as one
    except ValueError as error:
        raise CaptureError(str(error)) from None
    if emulate is not None and not isinstance(emulate, bool):  # "no" would force the emulation
        raise CaptureError(f"emulate must be True, False or None, got {emulate!r:.80}")
    device = static_inputs[0].device
    if any(t.device != device for t in static_inputs):
        raise CaptureError("all static inputs must be on one device, got "
                           f"{sorted({str(t.device) for t in static_inputs})}")
    cuda = device.type == "cuda" and torch.cuda.is_available()
    if emulate is False and not cuda:
        raise CaptureError("emulate=False asks for a real CUDA graph, but the inputs are on "
                           f"{device}: move them to CUDA or leave emulate=None")
    return cuda and not emulate


# ----------------------------------------------------------- PyTorch's own recipe, on every machine

class _EmulatedStream:
    """A stand-in for ``torch.cuda.Stream``: without CUDA every operation runs in order, so waiting
    is a no-op."""

    def wait_stream(self, stream) -> None:
        pass


class EmulatedCUDAGraph:
    """A stand-in for ``torch.cuda.CUDAGraph`` (lesson 04's raw recipe):
    ``with EMULATED_CUDA.graph(g):`` records the block's aten operations and runs none of their
    effects on what existed before; ``g.replay()`` re-runs them and writes every tensor the block
    made (its outputs, like a real graph's memory pool) in place, at its address."""

    def __init__(self):
        self.traced: RecordedOps | None = None
        self.made: list[torch.Tensor] = []  # the block's own tensors, refilled by every replay

    def __del__(self):
        # CUDA's rule for a raw graph destroyed while a capture records
        if _Recording.thread is not None:
            _Recording.freed.append("an EMULATED_CUDA.CUDAGraph")

    def replay(self) -> None:
        if self.traced is None:
            raise ReplayError("replay() before capture: record the step first, inside "
                              "`with graph(g):`")
        for tensor, new in zip(self.made, self.traced(), strict=True):
            if tensor.data_ptr() != new.data_ptr():
                tensor.copy_(new)


@contextmanager
def _emulated_graph(g: EmulatedCUDAGraph):
    """``torch.cuda.graph(g)`` without CUDA: the block is recorded (host reads refused, as a real
    capture refuses them); what it wrote into tensors made before it is put back, and what it made
    holds zeros until the first replay, since a CUDA capture runs no kernel."""
    if not isinstance(g, EmulatedCUDAGraph):
        raise CaptureError(f"graph() takes an EMULATED_CUDA.CUDAGraph(), got {type(g).__name__}")
    recorder = _Recorder()
    with _one_capture_at_a_time(), _recording() as freed:
        try:
            with recorder, _libraries_see_a_capture(), _no_host_reads():
                yield
        finally:
            recorder.undo()
        if freed:
            raise CaptureError(_FREED_DURING_CAPTURE.format(what="; ".join(freed)))
    # tensors the block read or wrote that existed before it
    before = {id(x) for _, args, kwargs in recorder.nodes
              for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)}
    # views follow their base
    g.made = [t for t in recorder.alive if t._base is None and id(t) not in before]
    g.traced = RecordedOps(recorder.nodes, [recorder.encode(t) for t in g.made])
    for t in g.made:
        t.zero_()


class _EmulatedCUDA:
    """The five names of ``torch.cuda`` that PyTorch's CUDA-graph recipe uses, emulated without
    CUDA."""

    Stream = _EmulatedStream
    CUDAGraph = EmulatedCUDAGraph
    graph = staticmethod(_emulated_graph)

    @staticmethod
    def current_stream() -> _EmulatedStream:
        return _EmulatedStream()

    @staticmethod
    def stream(stream):
        from contextlib import nullcontext

        return nullcontext(stream)


EMULATED_CUDA = _EmulatedCUDA()


def cuda_or_emulation(device):
    """``torch.cuda`` where ``device`` is a CUDA device, else ``EMULATED_CUDA``: the recipe's
    ``Stream``, ``current_stream``, ``stream``, ``CUDAGraph`` and ``graph``, so that the same lines
    run on every machine."""
    return (torch.cuda if torch.device(device).type == "cuda" and torch.cuda.is_available()
            else EMULATED_CUDA)


def emulation_memory(step: CapturedStep, existing=()) -> dict[str, int]:
    """What an emulated step keeps alive, in bytes, by distinct storage: ``shared``, the storages of
    ``existing`` tensors (weights, a cache, the static inputs: memory that exists anyway, which the
    recorded operations read and write where it lives) and ``own``, everything else it holds
    (constants made while recording, its static outputs). A real CUDA graph instead keeps a private
    memory pool for every intermediate of the step (lesson 04 measures it with
    ``torch.cuda.memory_reserved``); the emulation allocates its intermediates afresh at each
    replay."""
    if not step.emulated:
        raise ValueError("emulation_memory reads an emulated step's recording; a real CUDA graph "
                         "keeps a memory pool instead: measure it with "
                         "torch.cuda.memory_reserved() before and after capture")
    known = {t.untyped_storage().data_ptr() for t in existing}
    storage_bytes: dict[int, int] = {}
    for _func, args, kwargs in step.traced.nodes:
        for leaf in pytree.tree_leaves((args, kwargs)):
            if isinstance(leaf, torch.Tensor):
                storage_bytes[leaf.untyped_storage().data_ptr()] = leaf.untyped_storage().nbytes()
    for t in step.static_outputs:
        storage_bytes[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    shared = sum(n for ptr, n in storage_bytes.items() if ptr in known)
    return {"shared": shared, "own": sum(storage_bytes.values()) - shared}


class EagerStep:
    """The same calls as :func:`capture` and ``replay()``, but run eagerly: the contrast lesson 04
    needs.

    ``warmup`` real calls first (like capture), then every ``replay()`` calls ``fn`` again in
    Python, so it sees whatever Python state holds *now* (rebinding a cache, a changed int). Outputs
    are copied into static tensors.
    """

    emulated = False
    capture_seconds = 0.0

    def __init__(self, fn: Callable, *static_inputs: torch.Tensor, warmup: int = 3,
                 before_replay=None):
        self.fn, self.static_inputs, self.warmup, self.before_replay = (fn, static_inputs, warmup,
                                                                        before_replay)
        for _ in range(warmup):
            fn(*static_inputs)
        self.static_outputs = None
        self.replays = 0

    def describe(self) -> str:
        return (f"EAGER (nothing captured: the step re-runs in Python at every call); "
                f"{self.warmup} warm-up call(s)")

    def replay(self):
        if self.before_replay is not None:
            self.before_replay()
        out = self.fn(*self.static_inputs)
        leaves, spec = _flat_tensors(out, "the step")
        if self.static_outputs is None:
            self.static_outputs = [t.detach().clone() for t in leaves]
        else:
            for static, new in zip(self.static_outputs, leaves, strict=True):
                static.copy_(new)
        self.replays += 1
        return pytree.tree_unflatten(self.static_outputs, spec)


class CompiledStep(EagerStep):
    """The same calls as :class:`EagerStep`, through ``torch.compile``: ``warmup`` calls of the
    compiled step (the first compiles it; their side effects are real, as eagerly), then every
    ``replay()`` calls it again.

    Nothing is frozen behind Python's back: before every call Dynamo checks the guards it recorded
    (the Python values it specialised on, the type and shape of each tensor it reads, found anew by
    name), and recompiles when one fails. ``compiles`` counts the graphs compiled
    (``kvlab.hf_caches.counted_compile``). ``options`` go to ``torch.compile``; the default,
    ``backend="eager"``, runs Dynamo alone: the guards are the same whatever the backend, and it
    compiles in seconds on a CPU. ``mode="reduce-overhead"`` on a GPU adds inductor and CUDA graphs.
    """

    def __init__(self, fn: Callable, *static_inputs: torch.Tensor, warmup: int = 3,
                 before_replay=None, **options):
        from .hf_caches import counted_compile  # hf_caches does not import this module: no cycle

        self.options = options or {"backend": "eager"}
        self.compiled = counted_compile(fn, **self.options)
        super().__init__(self.compiled, *static_inputs, warmup=warmup, before_replay=before_replay)

    @property
    def compiles(self) -> int:
        return self.compiled.compiles

    def describe(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return (f"COMPILED (torch.compile({opts}): guards re-checked at every call, "
                f"{self.compiles} graph(s) compiled); {self.warmup} warm-up call(s)")


RUNNERS = ("graph", "emulated", "eager", "compiled")  # the kinds step_runner makes


def check_runner(kind) -> None:
    """Refuse a runner kind ``step_runner`` does not make."""
    if kind not in RUNNERS:
        raise ValueError(f"unknown runner {kind!r}: choose one of {', '.join(map(repr, RUNNERS))}")


def step_runner(kind: str, fn: Callable, *static_inputs: torch.Tensor, warmup: int = 3,
                before_replay=None):
    """``kind``: ``"graph"`` (real CUDA graph where possible, else emulated), ``"emulated"`` (always
    the emulation), ``"eager"`` (no capture, :class:`EagerStep`) or ``"compiled"``
    (``torch.compile`` with Dynamo's guards, :class:`CompiledStep`). All four have ``replay()`` and
    ``describe()``."""
    if kind == "eager":
        return EagerStep(fn, *static_inputs, warmup=warmup, before_replay=before_replay)
    if kind == "compiled":
        return CompiledStep(fn, *static_inputs, warmup=warmup, before_replay=before_replay)
    check_runner(kind)
    return capture(fn, *static_inputs, warmup=warmup, emulate=True if kind == "emulated" else None,
                   before_replay=before_replay)

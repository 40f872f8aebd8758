"""kvlab.graphs: the capture/replay contract, emulated on CPU and (on a GPU) real, with the same
results."""

import gc
import threading

import pytest
import torch

from kvlab.graphs import CaptureError, ReplayError, capture

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU: run on Colab/GPU machine")

# (device, emulate): the emulation everywhere; on a GPU also the real graph and the emulation on
# CUDA tensors.
MODES = [("cpu", None)] + ([("cuda", False), ("cuda", True)] if CUDA else [])
MODE_IDS = ["cpu-emulated"] + (["cuda-real", "cuda-emulated"] if CUDA else [])


@pytest.fixture(params=MODES, ids=MODE_IDS)
def mode(request):
    return request.param


def test_emulation_is_labelled_on_cpu():
    x = torch.ones(3)
    g = capture(lambda t: t * 2, x, warmup=0)
    assert g.emulated and "EMULATED" in g.describe() and "EMULATED" in repr(g)
    assert g.capture_seconds >= 0


def test_replay_reads_inputs_by_address_and_writes_the_same_outputs(mode):
    device, emulate = mode
    x = torch.zeros(4, device=device)
    g = capture(lambda t: (t + 1, {"sq": t * t}), x, warmup=1, emulate=emulate)
    first = g.replay()
    assert torch.equal(first[0], torch.ones(4, device=device))
    x.copy_(torch.arange(4.0, device=device))  # refill in place
    second = g.replay()
    # the same static output tensors
    assert second[0] is first[0] and second[1]["sq"] is first[1]["sq"]
    assert torch.equal(second[0], torch.arange(4.0, device=device) + 1)
    assert torch.equal(second[1]["sq"], torch.arange(4.0, device=device) ** 2)
    assert g.replays == 2


def test_replay_mutates_the_original_tensors_not_copies(mode):
    device, emulate = mode
    counter = torch.zeros((), dtype=torch.long, device=device)
    buf = torch.zeros(8, device=device)
    x = torch.ones(1, device=device)

    def step(v):
        buf.index_copy_(0, counter.view(1), v)  # write at the counter, like StaticLayer.update
        counter.add_(1)
        return buf.sum().view(1)

    g = capture(step, x, warmup=2, emulate=emulate)
    assert int(counter) == 2, "warm-up calls are real: their side effects stay"
    assert buf[:2].tolist() == [1.0, 1.0] and buf[2:].abs().sum() == 0, (
        "capturing itself ran nothing")
    x.fill_(5.0)
    out = g.replay()
    assert int(counter) == 3 and buf[2].item() == 5.0 and out.item() == 7.0


def test_python_values_are_frozen_at_capture(mode):
    device, emulate = mode
    scale = {"k": 2.0}
    x = torch.ones(2, device=device)
    g = capture(lambda t: t * scale["k"], x, warmup=0, emulate=emulate)
    scale["k"] = 10.0  # eager code would see this; the graph does not
    assert g.replay().tolist() == [2.0, 2.0]


def test_rebinding_a_tensor_the_graph_read_leaves_the_graph_on_the_old_one(mode):
    device, emulate = mode
    holder = {"w": torch.full((2,), 3.0, device=device)}
    x = torch.ones(2, device=device)
    g = capture(lambda t: t * holder["w"], x, warmup=0, emulate=emulate)
    old = holder["w"]
    holder["w"] = torch.full((2,), 7.0, device=device)  # a new tensor: eager would use it
    assert g.replay().tolist() == [3.0, 3.0]
    old.fill_(4.0)  # the old buffer, mutated in place, is what the graph reads
    assert g.replay().tolist() == [4.0, 4.0]


def test_compiled_runner_recompiles_for_a_python_value_and_reads_rebound_tensors():
    from kvlab.graphs import CompiledStep, step_runner

    torch.compiler.reset()
    state = {"k": 2.0, "w": torch.full((2,), 3.0)}
    x = torch.ones(2)
    step = step_runner("compiled", lambda t: t * state["k"] + state["w"], x, warmup=1)
    assert (isinstance(step, CompiledStep) and step.compiles == 1
            and step.describe().startswith("COMPILED"))
    assert step.replay().tolist() == [5.0, 5.0] and step.compiles == 1  # same guards: no recompile
    state["k"] = 10.0  # a Python value the graph specialised on: a guard fails, Dynamo recompiles
    assert step.replay().tolist() == [13.0, 13.0] and step.compiles == 2
    # a rebound tensor of the same shape: read anew, no recompile needed
    state["w"] = torch.full((2,), 7.0)
    assert step.replay().tolist() == [17.0, 17.0]


def test_emulation_memory_splits_what_exists_anyway_from_what_the_recording_owns():
    from kvlab.graphs import emulation_memory

    w = torch.full((256,), 2.0)  # like a weight: read in place, never copied
    x = torch.ones(256)
    g = capture(lambda t: t * w + 1, x, warmup=0, emulate=True)
    use = emulation_memory(g, [w, x])
    assert use == {"shared": 2 * 256 * 4, "own": 256 * 4}  # own: the static output only
    assert emulation_memory(g)["shared"] == 0


@pytest.mark.parametrize("how", ["item", "bool", "branch", "nonzero", "tolist", "numpy", "asarray",
                                 "mask"])
def test_host_sync_during_capture_is_an_error(how):
    x = torch.ones(3)

    def step(t):
        if how == "item":
            return t * t.sum().item()
        if how == "bool":
            return t * bool(t.sum() > 0)
        if how == "branch":
            return t + 1 if (t > 0).all() else t - 1
        # no aten operation at all: the emulation once captured it with its values frozen
        if how == "tolist":
            return torch.tensor(t.tolist()) * 2
        if how == "numpy":
            return torch.from_numpy(t.numpy()) * 2
        if how == "asarray":
            import numpy as np

            return torch.as_tensor(np.asarray(t)) * 2
        if how == "mask":  # captured before, then failed at replay with a raw shape error
            return t[t > 0] * 2
        return t[torch.nonzero(t > 0).flatten()]

    with pytest.raises(CaptureError, match="host synchronization"):
        capture(step, x, warmup=0)
    assert x.tolist() == [1.0, 1.0, 1.0] and x.numpy().sum() == 3  # refused only while recording


def test_failed_capture_leaves_no_side_effect():
    counter = torch.zeros((), dtype=torch.long)

    def step(t):
        counter.add_(1)
        return t * counter.item()

    with pytest.raises(CaptureError):
        capture(step, torch.ones(1), warmup=0)
    assert int(counter) == 0


def test_static_input_rebound_or_resized_is_refused():
    x = torch.ones(3)
    g = capture(lambda t: t + 1, x, warmup=0)
    x.resize_(10)
    with pytest.raises(ReplayError, match="in place"):
        g.replay()


def test_out_of_range_write_is_an_error_on_cpu_with_the_gpu_explained():
    counter = torch.tensor(3)
    buf = torch.zeros(4)

    def step(v):
        buf.index_copy_(0, counter.view(1), v)
        counter.add_(1)
        return buf

    g = capture(step, torch.ones(1), warmup=0)
    g.replay()  # slot 3: the last one
    with pytest.raises(ReplayError, match="device-side assert"):
        g.replay()  # slot 4 does not exist


def test_before_replay_guard_runs_on_the_host_before_every_replay(mode):
    device, emulate = mode
    counter = torch.zeros((), dtype=torch.long, device=device)

    def room():
        if int(counter) >= 2:
            raise ValueError("cache full")

    g = capture(lambda t: counter.add_(1) + t, torch.zeros((), dtype=torch.long, device=device),
                warmup=0,
                emulate=emulate, before_replay=room)
    g.replay()
    g.replay()
    with pytest.raises(ValueError, match="cache full"):
        g.replay()
    assert int(counter) == 2


def test_bad_arguments_are_refused():
    with pytest.raises(CaptureError, match="tensor input"):
        capture(lambda: 1)
    with pytest.raises(CaptureError, match="warmup"):
        capture(lambda t: t, torch.ones(1), warmup=-1)
    with pytest.raises(CaptureError, match="return tensors"):
        capture(lambda t: 3, torch.ones(1), warmup=0)
    if not CUDA:
        with pytest.raises(CaptureError, match="emulate=False"):
            capture(lambda t: t, torch.ones(1), emulate=False)


@needs_cuda
def test_real_graph_is_labelled_and_refuses_host_sync():
    x = torch.ones(3, device="cuda")
    g = capture(lambda t: t * 2, x, warmup=1)
    assert not g.emulated and "real CUDA graph on" in g.describe()
    with pytest.raises(CaptureError):
        capture(lambda t: t * t.sum().item(), x, warmup=0)


class FakeCuda:
    """The few torch.cuda calls of ``graphs._capture_cuda``, on CPU. Like torch.cuda.graph, the fake
    capture's exit restores the current stream only when capture_end() succeeds; ``end_error`` makes
    capture_end() fail."""

    class Stream(str):
        def wait_stream(self, other):
            pass

    def __init__(self, end_error=None):
        self.end_error, self.current, self.modes = end_error, self.Stream("caller's stream"), []

    def install(self, monkeypatch):
        from contextlib import contextmanager

        @contextmanager
        def stream(s):
            before, self.current = self.current, s
            try:
                yield
            finally:
                self.current = before

        @contextmanager
        def graph(g, capture_error_mode="global"):
            self.modes.append(capture_error_mode)
            before, self.current = self.current, self.Stream("capture stream")
            try:
                yield
            # __exit__: capture_end(), then the stream's restore, which a failing capture_end()
            # skips
            finally:
                if self.end_error:
                    raise RuntimeError(self.end_error)
                self.current = before

        for name, value in {"Stream": lambda device=None: self.Stream("side stream"),
                            "stream": stream, "graph": graph,
                            "current_stream": lambda device=None: self.current,
                            "synchronize": lambda device=None: None,
                            "CUDAGraph": object, "current_blas_handle": lambda: 0,
                            "device": lambda d: __import__("contextlib").nullcontext()}.items():
            monkeypatch.setattr(torch.cuda, name, value)


INVALIDATED = "CUDA error: operation failed due to a previous error during capture"


@pytest.mark.parametrize("end_error", [None, INVALIDATED],
                         ids=["capture-ends", "capture-invalidated"])
def test_cuda_capture_raises_the_steps_own_error_and_restores_the_stream(monkeypatch, end_error):
    from kvlab import graphs

    class Refused(RuntimeError):  # like GraphSafeError: raised on purpose inside the captured step
        pass

    def step(t):
        raise Refused("the cache is not initialized yet and a step is being captured")

    cuda = FakeCuda(end_error)
    cuda.install(monkeypatch)
    with pytest.raises(Refused, match="not initialized yet") as info:
        graphs._capture_cuda(step, (torch.ones(1),), 0, None, torch.device("cpu"))
    assert cuda.current == "caller's stream"  # the capture ended and the caller's stream is back
    # CUDA refuses unsafe calls in the capturing thread only, as the emulation
    assert cuda.modes == ["thread_local"]
    notes = getattr(info.value, "__notes__", [])
    assert (end_error is not None) == any("previous error during capture" in n for n in notes)


def test_cuda_capture_refusals_become_capture_errors(monkeypatch):
    from kvlab import graphs

    cuda = FakeCuda(INVALIDATED)
    cuda.install(monkeypatch)
    for step, says in [(lambda t: t, "previous error during capture"),  # only capture_end() failed
                       (lambda t: (_ for _ in ()).throw(
                           RuntimeError("CUDA error: operation not permitted when "
                                        "stream is capturing")),
                        "not permitted")]:
        with pytest.raises(CaptureError, match=says):
            graphs._capture_cuda(step, (torch.ones(1),), 0, None, torch.device("cpu"))
        assert cuda.current == "caller's stream"
    cuda.end_error = None
    with pytest.raises(ValueError, match="a bug of the step"):  # not a CUDA error: unchanged
        graphs._capture_cuda(lambda t: (_ for _ in ()).throw(ValueError("a bug of the step")),
                             (torch.ones(1),), 0,
                             None, torch.device("cpu"))


@pytest.mark.parametrize("how", ["item", "bool", "int", "tolist", "numpy", "asarray", "index"])
def test_a_host_read_is_refused_with_the_same_words_by_a_cuda_capture_and_the_emulation(
        monkeypatch, how):
    """The CUDA path on CPU (FakeCuda): the same CaptureError and message as the emulation, not
    CUDA's own error (or, for .numpy() of a CUDA tensor, torch's TypeError); a tensor on another
    device than the capture's may be read."""
    import numpy as np

    from kvlab import graphs

    reads = {"item": lambda t: t.sum().item(), "bool": lambda t: bool(t.sum()),
             "int": lambda t: int(t.sum()),
             "tolist": lambda t: t.tolist()[0], "numpy": lambda t: t.numpy()[0],
             "asarray": lambda t: np.asarray(t)[0],
             "index": lambda t: [0, 1, 2][t.long().sum() - 2]}

    def step(t):
        return t * reads[how](t)

    with pytest.raises(CaptureError) as emulated:
        capture(step, torch.ones(3), warmup=0, emulate=True)
    FakeCuda().install(monkeypatch)
    with pytest.raises(CaptureError) as real:
        graphs._capture_cuda(step, (torch.ones(3),), 0, None, torch.device("cpu"))
    assert (str(real.value) == str(emulated.value)
            and "host synchronization during capture" in str(real.value))
    # CPU tensors, a "meta" capture: read
    graphs._capture_cuda(step, (torch.ones(3),), 0, None, torch.device("meta"))


@pytest.mark.parametrize("how", ["repeat_interleave", "bincount", "index_put_mask", "setitem_mask",
                                 "equal", "allclose"])
def test_data_dependent_shapes_and_python_bools_are_refused_at_capture(how):
    """Once captured, then failing at replay with a raw shape error (or frozen on one branch):
    refused at capture."""
    def set_masked(t):
        y = t.clone()
        y[t > 1] = 0.0
        return y

    steps = {"repeat_interleave": lambda t: torch.repeat_interleave(t, t.long()),
             "bincount": lambda t: torch.bincount(t.long()).float(),
             "index_put_mask": lambda t: t.clone().index_put_((t > 1,), torch.tensor(0.0)),
             "setitem_mask": set_masked,
             "equal": lambda t: t * 2 if torch.equal(t, torch.ones(4)) else t,
             "allclose": lambda t: t * 2 if t.allclose(torch.ones(4)) else t}
    with pytest.raises(CaptureError, match="host synchronization during capture"):
        capture(steps[how], torch.ones(4), warmup=0)
    assert torch.equal(capture(lambda t: torch.repeat_interleave(t, 2), torch.ones(2),
                               warmup=0).replay(), torch.ones(4))


FREED = "a raw graph was freed while this capture recorded"


def test_a_step_dropped_while_another_capture_records_keeps_its_graph_until_that_capture_ends(mode):
    """CUDA invalidates a capture during which a graph is destroyed: a captured step dropped
    mid-capture (here by the step itself; in lesson 05, by another thread or the garbage collector)
    keeps its graph until the capture ends."""
    import weakref

    device, emulate = mode
    x, y = torch.ones(3, device=device), torch.ones(3, device=device)
    held = [capture(lambda t: t * 2, x, warmup=1, emulate=emulate)]
    graph = weakref.ref(held[0].graph if held[0].graph is not None else held[0].traced)
    alive_inside = []

    def step(t):
        held.clear()  # the last reference to the first step, while this capture records
        alive_inside.append(graph() is not None)
        return t + 1

    # no warm-up: the recorded call is the one that drops it
    g = capture(step, y, warmup=0, emulate=emulate)
    assert alive_inside == [True] and graph() is None, (
        "kept through the capture, destroyed when it ended")
    assert torch.equal(g.replay(), y + 1)
    del g
    assert torch.equal(capture(lambda t: t * 3, x, warmup=0, emulate=emulate).replay(), x * 3)


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if CUDA else []))
def test_a_raw_graph_freed_while_a_step_records_spoils_that_capture_with_the_same_words(device):
    """A raw CUDAGraph of your own is not kvlab's to keep: CUDA's rule holds, and the emulation
    refuses it alike."""
    from kvlab.graphs import cuda_or_emulation

    cuda = cuda_or_emulation(device)
    x, y = torch.ones(3, device=device), torch.ones(3, device=device)
    held = [raw_recipe(cuda, device, lambda t: t * 2, x)[0]]

    def step(t):
        held.clear()  # destroys the raw graph while this capture records
        return t + 1

    with pytest.raises(CaptureError, match=FREED):
        capture(step, y, warmup=0)
    # the process captures normally again
    assert torch.equal(capture(lambda t: t + 1, y, warmup=0).replay(), y + 1)


def test_automatic_garbage_collection_pauses_while_a_step_records(mode):
    device, emulate = mode
    seen = []
    capture(lambda t: (seen.append(gc.isenabled()), t + 1)[1], torch.ones(2, device=device),
            warmup=1,
            emulate=emulate)
    assert seen == [True, False], (
        "warm-up calls run with the collector on; the recorded call with it paused")
    assert gc.isenabled()
    gc.disable()
    try:  # a collector the caller had turned off stays off
        capture(lambda t: t + 1, torch.ones(2, device=device), warmup=0, emulate=emulate)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_capture_in_one_thread_leaves_other_threads_and_torch_unchanged():
    """Host reads are refused in the capturing thread only, and torch.Tensor's methods are the same
    afterwards."""
    originals = {name: torch.Tensor.__dict__.get(name) for name in ("item", "__int__", "__bool__",
                                                                    "tolist")}
    recording, other_thread_read = threading.Event(), threading.Event()
    reads = []

    def step(t):
        recording.set()
        assert other_thread_read.wait(10)
        return t + 1

    def reader():
        assert recording.wait(10)
        reads.append((int(torch.tensor(3)), torch.tensor([1.5]).item(), bool(torch.tensor(1))))
        other_thread_read.set()

    thread = threading.Thread(target=reader)
    thread.start()
    capture(step, torch.ones(2), warmup=0)
    thread.join()
    assert reads == [(3, 1.5, True)]
    assert {name: torch.Tensor.__dict__.get(name) for name in originals} == originals
    assert int(torch.tensor(3)) == 3


DEVICES = ["cpu"] + (["cuda"] if CUDA else [])


@pytest.mark.parametrize("other", ["graph-safe", "static"], ids=["both-capture", "one-eager"])
@pytest.mark.parametrize("device", DEVICES)
def test_two_threads_decoding_their_own_models_through_graphs_get_right_tokens(device, other):
    """Each thread's captures wait for the other's (one at a time per process), and eager work in
    another thread runs beside a capture. At 0aea04c most of these decodes raised CaptureError and
    afterwards int(tensor) raised it in the main thread too; at cf5e8e4, on the H200, CUDA's
    "global" capture mode refused the other thread's work (8 of 12 decodes raised), and the
    device-wide sync after one thread's warm-up spoiled the other's capture."""
    import kvlab
    from kvlab.lab.models import tiny_model

    models = [tiny_model("tiny-llama").to(device), tiny_model("tiny-qwen2").to(device)]
    ids = torch.randint(0, 100, (1, 7), generator=torch.Generator().manual_seed(0)).to(device)
    want = [kvlab.decode(m, ids, 8) for m in models]
    right, errors = [], []

    def work(i):
        for k in range(6):  # a new cache length each time: a new decoder, so a new capture
            try:
                got = kvlab.decode(models[i], ids, 8, strategy="graph-safe" if i == 0 else other,
                                   max_cache_len=16 + k)
                right.append(torch.equal(got, want[i]))
            except Exception as e:  # the assertion below prints it
                errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and right == [True] * 12, (right, errors)
    assert int(torch.tensor(3, device=device)) == 3
    assert torch.equal(kvlab.decode(models[0], ids, 8, strategy="graph-safe", max_cache_len=40),
                       want[0])


def test_a_capture_inside_a_warm_up_call_is_refused_not_a_deadlock():
    """The capture lock is held from the first warm-up call: a step that captures inside itself gets
    an error."""
    def step(t):
        capture(lambda u: u * 2, t, warmup=0)
        return t + 1

    with pytest.raises(CaptureError, match="inside a step being captured"):
        capture(step, torch.ones(2), warmup=1)
    assert capture(lambda t: t + 1, torch.ones(2), warmup=1).replay().tolist() == [2.0, 2.0]


# ---- PyTorch's raw recipe, the same lines on every machine (lesson 04)
# ----------------------------------------------

def raw_recipe(cuda, device, step, static_x, warmup: int = 3):
    """torch.cuda's documented capture recipe, written against ``cuda`` (torch.cuda or
    EMULATED_CUDA)."""
    side = cuda.Stream()
    side.wait_stream(cuda.current_stream())
    with cuda.stream(side):
        for _ in range(warmup):
            step(static_x)
    cuda.current_stream().wait_stream(side)
    g = cuda.CUDAGraph()
    # torch.cuda.graph, unlike kvlab's capture, leaves the collector on: a dead cycle holding
    # another test's graph, collected mid-capture, would invalidate this capture (kvlab.graphs'
    # docstring)
    gc.collect()
    gc.disable()
    try:
        with cuda.graph(g):
            static_y = step(static_x)
    finally:
        gc.enable()
    return g, static_y


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def test_the_raw_recipe_runs_the_same_lines_emulated_and_on_cuda(device):
    from kvlab.graphs import EMULATED_CUDA, cuda_or_emulation

    cuda = cuda_or_emulation(device)
    assert ((cuda is torch.cuda) == (device == "cuda")
            and (cuda is EMULATED_CUDA) == (device == "cpu"))
    static_x = torch.zeros(4, device=device)
    g, static_y = raw_recipe(cuda, device, lambda t: (t * 2 + 1).sin(), static_x)
    address = static_y.data_ptr()
    for values in ([0.0, 1.0, 2.0, 3.0], [10.0, 20.0, 30.0, 40.0]):
        static_x.copy_(torch.tensor(values, device=device))
        g.replay()
        assert torch.equal(static_y, (torch.tensor(values, device=device) * 2 + 1).sin())
    assert static_y.data_ptr() == address
    # rebound: the graph keeps reading the old tensor (now 10..40)
    static_x = torch.full((4,), 5.0, device=device)
    g.replay()
    assert torch.equal(static_y, (torch.tensor([10.0, 20.0, 30.0, 40.0],
                                               device=device) * 2 + 1).sin())


def test_the_emulated_recipe_runs_nothing_at_capture_and_refuses_what_cuda_refuses():
    from kvlab.graphs import EMULATED_CUDA

    total = torch.ones(2)
    g = EMULATED_CUDA.CUDAGraph()
    with pytest.raises(ReplayError, match="before capture"):
        g.replay()
    with EMULATED_CUDA.graph(g):
        # a write into a tensor made before the block: not done by the capture, done by every replay
        total.add_(1)
        made = total * 3
    # a capture runs no kernel
    assert torch.equal(total, torch.ones(2)) and torch.equal(made, torch.zeros(2))
    g.replay()
    g.replay()
    assert torch.equal(total, torch.full((2,), 3.0)) and torch.equal(made, torch.full((2,), 9.0))
    with pytest.raises(CaptureError, match=r"Tensor.__bool__\(\)"):
        with EMULATED_CUDA.graph(EMULATED_CUDA.CUDAGraph()):
            if total.sum() > 0:
                pass
    # nothing left changed by the refused capture
    assert int(torch.tensor(3)) == 3 and gc.isenabled()
    with pytest.raises(CaptureError, match="takes an EMULATED_CUDA.CUDAGraph"):
        with EMULATED_CUDA.graph(object()):
            pass

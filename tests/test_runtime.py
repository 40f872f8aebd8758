"""kvlab.runtime (quick mode, device/dtype choice, environment) and the version check of
kvlab/__init__.py."""

import json

import pytest
import torch

import kvlab
from kvlab import runtime

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU behaviour")


@pytest.mark.parametrize(("value", "expected"),
                         [("1", True), ("true", True), (" ON ", True), ("0", False), ("", False),
                          ("no", False)])
def test_quick_mode(monkeypatch, value, expected):
    monkeypatch.setenv(runtime.QUICK_ENV, value)
    assert runtime.quick_mode() is expected
    assert runtime.size("full", "quick") == ("quick" if expected else "full")


def test_quick_mode_off_when_unset(monkeypatch):
    monkeypatch.delenv(runtime.QUICK_ENV, raising=False)
    assert runtime.quick_mode() is False and runtime.size(100, 10) == 100


def test_pick_device():
    assert runtime.pick_device("cpu") == torch.device("cpu")
    assert runtime.pick_device(torch.device("cpu")) == torch.device("cpu")
    assert runtime.pick_device().type == ("cuda" if torch.cuda.is_available() else "cpu")


@no_cuda
def test_pick_device_cuda_without_gpu_says_what_to_do():
    with pytest.raises(RuntimeError, match="device='cpu'"):
        runtime.pick_device("cuda")


def test_pick_dtype(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert runtime.pick_dtype(cpu) == torch.float32
    assert runtime.pick_dtype(cpu, "bfloat16") == torch.bfloat16
    assert runtime.pick_dtype(cuda, torch.float32) == torch.float32
    monkeypatch.setattr(runtime, "gpu_capability", lambda index=None: (9, 0))
    assert runtime.pick_dtype(cuda) == torch.bfloat16  # A100, H100, H200
    monkeypatch.setattr(runtime, "gpu_capability", lambda index=None: (7, 5))
    assert runtime.pick_dtype(cuda) == torch.float16  # T4: no bf16


def test_synchronize_only_touches_cuda(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    runtime.synchronize("cpu")
    assert calls == []
    runtime.synchronize(torch.device("cuda"))
    assert calls == [torch.device("cuda")]


def test_hardware_and_environment_on_cpu():
    hw = runtime.hardware("cpu")
    assert hw.startswith("CPU: ") and f"({torch.get_num_threads()} threads)" in hw
    env = runtime.environment("cpu")
    assert env["hardware"] == hw and env["device"] == "cpu" and env["torch"] == torch.__version__
    assert env["transformers"] == kvlab.PINNED_TRANSFORMERS
    assert env["quick_mode"] == runtime.quick_mode()
    json.dumps(env)  # stored beside every measurement


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA GPU: run on Colab/GPU machine")
def test_environment_on_cuda():
    env = runtime.environment("cuda")
    assert (env["hardware"] == runtime.gpu_name() and env["cuda"] == torch.version.cuda
            and env["driver"])


# ---- version check (kvlab/__init__.py) ----

def test_version_check_passes_on_the_pinned_versions():
    kvlab._check_versions()


@pytest.mark.parametrize("found", ["5.23.0", None])
def test_wrong_transformers_says_how_to_fix(monkeypatch, found):
    def fake_version(name):
        if found is None:
            raise kvlab.PackageNotFoundError(name)
        return found

    monkeypatch.setattr(kvlab, "version", fake_version)
    with pytest.raises(ImportError) as info:
        kvlab._check_versions()
    message = str(info.value)
    assert (f"pip install transformers=={kvlab.PINNED_TRANSFORMERS}" in message
            and "restart the kernel" in message)
    assert (found or "no transformers") in message


@pytest.mark.parametrize("found", ["2.5.1", "2.14.0+cu130"])
def test_torch_out_of_range_says_how_to_fix(monkeypatch, found):
    monkeypatch.setattr(torch, "__version__", found)
    with pytest.raises(ImportError, match=r"pip install 'torch>=2.6,<2.14'") as info:
        kvlab._check_versions()
    assert found in str(info.value)


def test_exports():
    assert all(hasattr(kvlab, name) for name in kvlab.__all__)
    assert (kvlab.ModelUnavailableError is kvlab.lab.models.ModelUnavailableError
            and kvlab.size is runtime.size)


def test_the_collector_stays_paused_until_the_last_overlapping_block_ends():
    """A timing in one thread and a capture in another each pause the collector: the first to end
    must not resume it while the other still runs (before, a timing that ended mid-capture
    re-enabled it)."""
    import gc
    import threading

    from kvlab.runtime import collector_paused

    assert gc.isenabled()
    inside, first_ended, seen = threading.Event(), threading.Event(), []

    def other():
        with collector_paused():
            inside.set()
            assert first_ended.wait(10)
            # the first block has ended: this one still needs the collector paused
            seen.append(gc.isenabled())

    thread = threading.Thread(target=other)
    with collector_paused():
        thread.start()
        assert inside.wait(10)
    first_ended.set()
    thread.join()
    assert seen == [False] and gc.isenabled()
    gc.disable()
    try:  # a collector the caller had turned off stays off
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()

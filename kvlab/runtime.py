"""Where the course runs: quick mode, device and dtype choice, and the environment a number was
measured on."""

from __future__ import annotations

import gc
import operator
import os
import platform
import threading
import weakref
from contextlib import contextmanager
from functools import cache

import torch

QUICK_ENV = "KVLAB_QUICK"


def quick_mode() -> bool:
    """True when ``KVLAB_QUICK=1``: CI's setting, which shrinks lengths and loops but skips
    nothing."""
    return os.environ.get(QUICK_ENV, "0").strip().lower() in ("1", "true", "yes", "on")


def size(full, quick):
    """Pick ``full`` for a person's run and ``quick`` under ``KVLAB_QUICK=1``."""
    return quick if quick_mode() else full


class _Pause:
    """Who holds the collector paused, process-wide (the collector is one per process): how many
    blocks, and whether it was collecting when the first of them began."""

    lock = threading.Lock()
    blocks = 0
    collecting = False


@contextmanager
def collector_paused():
    """Pause Python's automatic garbage collection for the block (``timeit``'s rule), then restore
    it as it was.

    The cyclic collector runs at whatever allocation crosses its threshold: inside a timed call it
    adds its pause to one call's time, and inside a CUDA graph capture it can free a graph and
    invalidate the capture. Blocks may overlap, in one thread or several (a capture in one thread, a
    timing in another): the collector resumes when the last of them ends, never while another still
    needs it paused."""
    with _Pause.lock:
        if _Pause.blocks == 0:
            _Pause.collecting = gc.isenabled()
        _Pause.blocks += 1
        gc.disable()
    try:
        yield
    finally:
        with _Pause.lock:
            _Pause.blocks -= 1
            if _Pause.blocks == 0 and _Pause.collecting:
                gc.enable()


def count(value, name: str, *, minimum: int = 1) -> int:
    """``value`` as a Python int of at least ``minimum``: an int, a numpy integer or a 0-dim integer
    tensor (``operator.index``); a bool, a float or a wider tensor is refused, naming ``name``."""
    wrong = isinstance(value, bool) or type(value).__name__ in ("bool", "bool_") or (
        isinstance(value, torch.Tensor) and (value.dim() != 0 or value.dtype == torch.bool))
    try:
        number = None if wrong else operator.index(value)
    except TypeError:
        number = None
    if number is None or number < minimum:
        hint = (": pass int(x)" if isinstance(value, float | str) else
                ": a bool is not a count"
                if wrong and "bool" in str(getattr(value, "dtype", type(value))) else "")
        kind = {0: "a non-negative int", 1: "a positive int"}.get(minimum, f"an int >= {minimum}")
        raise ValueError(f"{name} must be {kind}, got {value!r}{hint}")
    return number


def pick_device(device: str | torch.device | None = None) -> torch.device:
    """The device asked for ("cpu", "cuda", "cuda:N", a torch.device), else CUDA when present, else
    CPU."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    asked = device
    try:
        device = torch.device(device) if isinstance(device, str | torch.device) else None
    except (RuntimeError, TypeError):
        device = None
    if device is None or device.type not in ("cpu", "cuda", "meta"):
        raise ValueError("device must be 'cpu', 'cuda' or 'cuda:N' (the course runs on those), got "
                         f"{asked!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            "device='cuda' was asked for but torch sees no CUDA GPU. Use device='cpu', or on Colab "
            "pick Runtime > Change runtime type > T4 GPU and restart."
        )
    if (device.type == "cuda" and device.index is not None
            and device.index >= torch.cuda.device_count()):
        raise RuntimeError(f"{device} was asked for but this machine has "
                           f"{torch.cuda.device_count()} GPU(s)")
    return device


_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
          "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
          "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}


def as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """A torch dtype from itself or a name: ``"bf16"``, ``"fp16"``, ``"float32"``,
    ``"torch.bfloat16"``, ..."""
    if isinstance(dtype, torch.dtype):
        return dtype
    name = str(dtype).strip().lower().removeprefix("torch.")
    found = _DTYPES.get(name, getattr(torch, name, None))
    if not isinstance(found, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}: use a torch.dtype or one of "
                         f"{', '.join(_DTYPES)}")
    return found


def check_dtype(device: torch.device | str, dtype: torch.dtype) -> None:
    """Refuse bfloat16 on a GPU that does not compute it natively (a T4: compute capability
    7.5 < 8.0): torch would emulate it slowly in eager mode, and torch.compile's Triton kernels
    cannot use it at all."""
    if dtype == torch.bfloat16 and torch.device(device).type == "cuda" and not _native_bf16(device):
        raise ValueError(
            "bfloat16 was asked for, but this GPU has no native bfloat16 (that needs compute "
            "capability 8.0, Ampere or newer; a T4 is 7.5). Use dtype=torch.float16 ('fp16'), what "
            "kvlab picks on this GPU by default."
        )


def pick_dtype(device: torch.device | str, dtype: torch.dtype | str | None = None) -> torch.dtype:
    """CUDA: bf16 where the GPU supports it natively (Ampere and newer), else fp16 (a T4). CPU:
    fp32.

    An explicit ``dtype`` (a torch dtype or a name such as ``"bf16"``) is used as given, except bf16
    on a GPU without native bf16, which is refused with what to use instead."""
    device = torch.device(device)
    if dtype is not None:
        dtype = as_dtype(dtype)
        check_dtype(device, dtype)
        return dtype
    if device.type == "cuda":
        return torch.bfloat16 if _native_bf16(device) else torch.float16
    return torch.float32


# Compute capabilities (major, minor) that kvlab's GPU paths
# need; ``gpu_supports`` is the one rule that checks them.
BF16 = (8, 0)  # native bfloat16: Ampere and newer
# kvlab's own Triton kernels (kvlab.kernels): Ampere (A100, RTX 30xx) and newer
TRITON_KERNELS = (8, 0)
PDL = (9, 0)  # programmatic dependent launch: Hopper (H100, H200) and newer
_CAPABILITY: dict[int, tuple[int, int]] = {}  # GPU index -> its compute capability, asked once

# ``KVLAB_GPU_AS=t4``: kvlab's own GPU rules (capability, bfloat16, which of its paths run, the name
# a number is recorded under) answer as this GPU, while torch, inductor and Triton still see the
# real one. It previews on a newer GPU the paths a Colab T4 takes (float16, the PyTorch form of the
# kernels, SDPA in compiled steps, no PDL); timings stay the real GPU's.
GPU_AS_ENV = "KVLAB_GPU_AS"
GPU_PROXIES = {"t4": {"name": "Tesla T4", "capability": (7, 5), "multiprocessors": 40}}


def _gpu_proxy() -> dict | None:
    """The GPU that ``KVLAB_GPU_AS`` names (``GPU_PROXIES``), or None when unset or empty."""
    name = os.environ.get(GPU_AS_ENV, "").strip().lower()
    if not name:
        return None
    if name not in GPU_PROXIES:
        raise ValueError(f"{GPU_AS_ENV}={name!r} is not a GPU kvlab can answer as; use one of "
                         f"{', '.join(GPU_PROXIES)}, or unset it")
    return GPU_PROXIES[name]


def _native_bf16(device: torch.device | str) -> bool:
    """True on a CUDA GPU that computes bfloat16 natively (``BF16``); False on a CPU and on a T4."""
    return gpu_supports(device, BF16)


def gpu_supports(device: torch.device | str, capability: tuple[int, int]) -> bool:
    """True on a CUDA GPU of compute capability ``capability`` or newer (e.g. ``TRITON_KERNELS``,
    ``PDL``); False on a CPU and on older GPUs (a T4 is 7.5). Under ``torch.compile`` the answer is
    a constant of the graph."""
    device = torch.device(device)
    return device.type == "cuda" and _at_least(device.index, *capability)


def _at_least(index: int | None, major: int, minor: int) -> bool:
    found = gpu_capability(index)
    return found is not None and found >= (major, minor)


# What torch.compiler.assume_constant_result sets,
# without importing torch._dynamo (and Triton) with kvlab.
_at_least._dynamo_marked_constant = True


def gpu_capability(index: int | None = None) -> tuple[int, int] | None:
    """(major, minor) compute capability of CUDA GPU ``index`` (None: the current one), asked once
    per GPU; None without CUDA. Under ``KVLAB_GPU_AS`` the proxied GPU's."""
    if not torch.cuda.is_available():
        return None
    proxy = _gpu_proxy()
    if proxy is not None:
        return proxy["capability"]
    index = torch.cuda.current_device() if index is None else index
    if index not in _CAPABILITY:
        _CAPABILITY[index] = tuple(torch.cuda.get_device_capability(index))
    return _CAPABILITY[index]


def gpu_name(device: torch.device | str | None = None) -> str:
    """The GPU's name as a number is recorded under: the real name, and under ``KVLAB_GPU_AS`` what
    it answers as, e.g. 'NVIDIA H100 80GB HBM3 as a Tesla T4 (KVLAB_GPU_AS=t4)'."""
    name = torch.cuda.get_device_name(device)
    proxy = _gpu_proxy()
    if proxy is None:
        return name
    return f"{name} as a {proxy['name']} ({GPU_AS_ENV}={os.environ[GPU_AS_ENV].strip().lower()})"


def multiprocessors(device: torch.device | str) -> int:
    """The GPU's streaming multiprocessors (the proxied GPU's under ``KVLAB_GPU_AS``)."""
    proxy = _gpu_proxy()
    if proxy is not None:
        return proxy["multiprocessors"]
    return torch.cuda.get_device_properties(torch.device(device)).multi_processor_count


def synchronize(device: torch.device | str | None) -> None:
    """Wait for queued GPU work; a no-op on CPU. Every timer in the course calls this before reading
    a clock (``device``: None for ``pick_device()``'s default)."""
    device = pick_device() if device is None else device
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@cache
def cpu_name() -> str:
    """The processor's model name, e.g. 'Intel(R) Xeon(R) Processor'."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware(device: torch.device | str | None = None) -> str:
    """A one-line name of the machine a number comes from, e.g. 'NVIDIA H200' or
    'CPU: ... (2 threads)'."""
    device = pick_device(device)
    if device.type == "cuda":
        return gpu_name(device)
    return f"CPU: {cpu_name()} ({torch.get_num_threads()} threads)"


def environment(device: torch.device | str | None = None) -> dict:
    """Hardware and versions, attached to every measurement the course records."""
    import transformers

    device = pick_device(device)
    env = {
        "hardware": hardware(device),
        "device": str(device),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "quick_mode": quick_mode(),
    }
    if device.type == "cuda" and _gpu_proxy() is not None:
        env["gpu_as"] = os.environ[GPU_AS_ENV].strip().lower()
    if device.type == "cuda":
        env["cuda"] = torch.version.cuda
        try:
            import subprocess

            env["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=10,
            ).stdout.strip().splitlines()[0]
        except (OSError, IndexError, subprocess.SubprocessError):
            env["driver"] = "unknown"
    return env


def runtime_summary(device: torch.device | str | None = None) -> str:
    """What a lesson will use here, in three lines: versions, the GPU (or what to do without one),
    the dtype and which of kvlab's GPU paths run. Printed by the Colab set-up cell at the top of
    every notebook."""
    import sys

    import transformers

    device = pick_device(device)
    dtype = pick_dtype(device)
    lines = [f"python {sys.version.split()[0]} | torch {torch.__version__} | transformers "
             f"{transformers.__version__}"]
    if device.type != "cuda":
        lines.append("GPU: none. The lessons run on the CPU (slowly, no graph speedups); for a GPU "
                     "pick Runtime > Change runtime type > T4 GPU, then run this cell again")
        lines.append("dtype: float32 (what the course computes in on a CPU)")
        return "\n".join(lines)
    major, minor = gpu_capability(device.index)
    lines.append(f"GPU: {gpu_name(device)}, compute capability {major}.{minor}")
    name = str(dtype).removeprefix("torch.")
    if dtype == torch.bfloat16:
        line = f"dtype: {name}"
    else:
        line = f"dtype: {name} (this GPU has no native bfloat16: bf16 is refused here, use float16)"
    if gpu_supports(device, TRITON_KERNELS):
        line += "; kvlab's Triton kernels run" + (
            "" if gpu_supports(device, PDL) else
            " (programmatic dependent launch needs 9.0, Hopper: off)")
    else:
        line += ("; kvlab's Triton kernels need compute capability 8.0 (Ampere): their PyTorch "
                 "form runs instead, and graph-safe-compiled keeps SDPA attention")
    lines.append(line)
    return "\n".join(lines)



_RUNNING = weakref.WeakKeyDictionary()  # owner -> the lock its running call holds
_RUNNING_LOCK = threading.Lock()


@contextmanager
def one_call(owner, error: type[Exception], what: str, entry: str):
    """The body of one call of ``owner.entry``, an object that owns state a call resets or advances
    (a decoder's cache, a batcher's pool, a cache handed to ``kvlab.decode``): a second call while
    one runs, from a callback of the first (``on_token``) or from another thread, is refused with
    ``error`` instead of corrupting the first call's state. The lock lives here, not on ``owner``
    (which stays copyable)."""
    with _RUNNING_LOCK:
        lock = _RUNNING.setdefault(owner, threading.Lock())
    if not lock.acquire(blocking=False):
        raise error(f"this {what} is already decoding: {entry}() (directly or through "
                    "kvlab.decode) was called again from inside a call of it (an on_token "
                    "callback) or from another thread, and would reset or advance the state the "
                    "running call reads. Finish the first call before the next, or give each "
                    f"thread (or nested decode) its own {what}")
    try:
        yield
    finally:
        lock.release()

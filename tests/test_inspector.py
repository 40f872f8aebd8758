"""kvlab.lab.inspector, driven without a browser: what each frame says about a hand-written cache
growing, a vanilla StaticCache under (emulated) replay beside eager, and the graph-safe cache
serving two prompts through one graph; the widget's slider and dropdown redraw it; bad input is
refused with a clear error."""

import re

import matplotlib
import pytest
import torch

from kvlab import failures as F
from kvlab.cache_view import CacheRecorder
from kvlab.graph_decoder import GraphSafeDecoder
from kvlab.handwritten import HandwrittenCache, decode_handwritten
from kvlab.lab.inspector import CacheInspector, Inspection, Run, describe_counters, slot_ranges
from kvlab.lab.models import ByteTokenizer, tiny_model

matplotlib.use("Agg")
N = 24  # tiny-qwen3 shows lesson 04's failures within 24 tokens (tests/test_failures.py)
P = 11


@pytest.fixture(scope="module")
def qwen3():
    return tiny_model("tiny-qwen3")


@pytest.fixture(scope="module")
def ids(prompt):
    return prompt(P)


@pytest.fixture(scope="module")
def handwritten(qwen3, ids):
    cache = HandwrittenCache()
    rec = CacheRecorder(cache, layers=(0, 1))
    decode_handwritten(qwen3, ids, 6, cache=cache, on_token=rec)
    return Inspection(Run("hand-written", rec, prompt_len=P))


@pytest.fixture(scope="module")
def warmup(qwen3, ids):
    result = F.run("warmup-advance", qwen3, ids, N, runner="emulated")
    return result, Inspection.of_failure(result)


def plain(html_text: str) -> str:
    """The text a browser shows of an HTML widget's value."""
    return re.sub(r"<[^>]+>", "", html_text).replace("&#x27;", "'").strip()


def test_the_handwritten_cache_grows_one_slot_per_step(handwritten):
    assert handwritten.steps == 6
    for step in range(6):
        frame = handwritten.frames(step, 0)[0]
        held = P + step  # the prompt, then one more fed token per step
        # the buffer IS the tokens: no spare slot
        assert frame.slots == held and frame.lengths == [held, held]
        assert frame.counters == [] and frame.counter is None and "no counter" in frame.caption()
        assert frame.written == list(range(held)) and frame.valid == held and frame.beyond == []
        assert frame.trash is None and frame.padding == []
        assert len(frame.tokens) == step + 1 and frame.seconds > 0


def test_replay_shows_the_warmup_drift_beside_eager(warmup):
    result, inspection = warmup
    assert inspection.first_wrong == result.first_wrong is not None
    eager, replay = inspection.frames(1, 0)
    layers = len(result.recorder.counters[0])
    assert eager.counters == [P + 1] * layers and eager.beyond == []
    # the three warm-up calls wrote the first token three times and moved every counter three ahead
    assert replay.counters == [P + 1 + F.WARMUP] * layers and replay.counter == P + 1 + F.WARMUP
    assert (replay.beyond == list(range(P + 1, P + 1 + F.WARMUP))
            and replay.valid == eager.valid == P + 1)
    wrong = inspection.frames(inspection.first_wrong, 1)[1]
    assert wrong.differs_from == inspection.first_wrong
    assert "WRONG since step" in inspection.caption(inspection.first_wrong, 1)
    if inspection.first_wrong > 0:
        assert "same tokens so far" in inspection.caption(inspection.first_wrong - 1, 1)


def test_padding_pollution_marks_the_padding(qwen3, ids):
    # id 0: zero keys in tiny models
    result = F.run("padding-pollution", qwen3, ids, 4, runner="emulated", pad_id=32)
    bucket = result.extra["bucket"]
    eager, padded = Inspection.of_failure(result).frames(0, 0)
    assert (padded.padding == list(range(P, bucket))
            and padded.counters == [bucket] * len(padded.counters))
    assert eager.padding == [] and eager.beyond == []
    assert f"padding in slots {P}..{bucket - 1}" in padded.caption()


def test_graph_safe_cache_over_two_prompts_in_one_graph(prompt):
    model = tiny_model("tiny-llama")
    bucket = 16
    decoder = GraphSafeDecoder(model, bucket + 8 + 4, prefill_bucket=bucket)
    runs = []
    for label, length in (("A", 11), ("B", 7)):
        rec = CacheRecorder(decoder.cache, layers=(0, 1))
        decoder.generate(prompt(length, seed=length), 8, on_token=rec)
        runs.append(Run(label, rec, prompt_len=length, bucket=bucket))
    assert decoder.prefill_graph.replays == 2  # both prompts through the one captured prefill
    inspection = Inspection(runs)
    trash = decoder.max_cache_len
    # layer 1: in layer 0 the pad id 0 has a zero embedding, so its key is zero and the trash slot
    # looks empty
    for frame, length in zip(inspection.frames(0, 1), (11, 7), strict=True):
        # the padded rows' keys went to the trash slot
        assert frame.trash == trash and frame.trash_written
        # nothing of the padding in the visible slots
        assert frame.padding == [] and frame.beyond == []
        assert frame.written == list(range(length)) + [trash]
        # the counter moved by the valid length only
        assert frame.counters == [length] * len(frame.counters)
        assert ("one tensor, shared" in frame.caption()
                and f"trash slot {trash}: holds a key" in frame.caption())
    # two prompts: nothing to compare
    assert inspection.first_wrong is None and inspection.differs == {}


def test_caption_and_frame_name_the_step(warmup):
    _, inspection = warmup
    for step in (0, 3, inspection.steps - 1):
        assert inspection.caption(step, 0).startswith(f"step {step} ")
        assert all(f.caption().startswith(f"step {step} ") for f in inspection.frames(step, 0))


def test_the_layer_choice_changes_the_frame(warmup):
    _, inspection = warmup
    zero, one = inspection.frames(5, 0)[1], inspection.frames(5, 1)[1]
    assert zero.layer == 0 and one.layer == 1 and not torch.equal(zero.heads, one.heads)


def test_text_with_a_tokenizer_ids_without(qwen3, ids):
    rec = CacheRecorder(HandwrittenCache())
    decode_handwritten(qwen3, ids, 3, cache=rec.cache, on_token=rec)
    with_text = Inspection(Run("r", rec, prompt_len=P), tokenizer=ByteTokenizer()).frames(2, 0)[0]
    with_ids = Inspection(Run("r", rec, prompt_len=P)).frames(2, 0)[0]
    assert with_text.text == ByteTokenizer().decode(rec.token_ids[0])
    assert with_ids.text == " ".join(str(int(i)) for i in rec.token_ids[0])


def test_a_recorder_refuses_layers_the_cache_lacks_and_snapshots_before_any_buffer(qwen3, ids):
    from transformers import StaticCache

    with pytest.raises(ValueError, match=r"the cache has no layers yet.*on_token="):
        CacheRecorder(HandwrittenCache()).snapshot()
    with pytest.raises(ValueError, match=r"hold no buffers yet.*on_token="):
        CacheRecorder(StaticCache(config=qwen3.config, max_cache_len=32)).snapshot()
    with pytest.raises(ValueError,
                       match=r"layers \[7\] are not in this cache: it has 2 layers \(0\.\.1\)"):
        # known at once
        CacheRecorder(StaticCache(config=qwen3.config, max_cache_len=32), layers=(7,))
    cache = HandwrittenCache()
    with pytest.raises(ValueError, match=r"layers \[7\] are not in this cache: it has 2 layers"):
        # at the prefill
        decode_handwritten(qwen3, ids, 3, cache=cache, on_token=CacheRecorder(cache, layers=(7,)))
    with pytest.raises(ValueError, match="layer indices"):
        CacheRecorder(HandwrittenCache(), layers=("0",))


def test_the_figure_shows_the_runs_side_by_side(warmup):
    import matplotlib.pyplot as plt

    _, inspection = warmup
    open_before = plt.get_fignums()
    fig, axes = inspection.figure(1, 0)
    assert (len(axes) == 2 and "eager" in axes[0].get_title()
            and "warmup-advance" in axes[1].get_title())
    assert ("WRONG" in axes[1].get_title()) == (inspection.first_wrong <= 1)
    plt.close(fig)
    png = inspection.png(2, 1)
    # the widget's figures are closed
    assert png.startswith(b"\x89PNG") and plt.get_fignums() == open_before


def test_the_widget_follows_its_slider_and_dropdown(warmup):
    import ipywidgets as widgets

    _, inspection = warmup
    inspector = CacheInspector(inspection)
    assert "kvlab-inspector" in inspector.box._dom_classes
    assert "kvlab-inspector-image" in inspector.image._dom_classes
    assert "kvlab-inspector-caption" in inspector.caption._dom_classes
    assert isinstance(inspector.slider,
                      widgets.IntSlider) and isinstance(inspector.play, widgets.Play)
    assert inspector.slider.max == inspector.play.max == inspection.steps - 1
    assert inspector.slider.value == inspection.first_wrong  # it opens where the runs part
    assert plain(inspector.caption.value).startswith(f"step {inspection.first_wrong} ")
    before = bytes(inspector.image.value)
    assert before.startswith(b"\x89PNG")
    inspector.slider.value = target = (inspection.first_wrong + 2) % inspection.steps
    assert (plain(inspector.caption.value).startswith(f"step {target} ")
            and bytes(inspector.image.value) != before)
    before = bytes(inspector.image.value)
    inspector.layer.value = 1
    assert "layer 1" in plain(inspector.caption.value) and bytes(inspector.image.value) != before


def test_bad_input_is_refused_clearly(warmup, handwritten):
    _, inspection = warmup
    with pytest.raises(ValueError,
                       match=rf"step {N} is out of range: the runs recorded steps 0\.\.{N - 1}"):
        inspection.frames(N, 0)
    with pytest.raises(ValueError, match=r"layer 5 was not recorded"):
        inspection.caption(0, 5)
    with pytest.raises(ValueError, match=r"layers=\(\.\.\., 7\)"):
        inspection.runs[0].frame(0, 7)
    with pytest.raises(TypeError, match="step must be an int"):
        inspection.figure(1.0, 0)
    with pytest.raises(ValueError, match="out of range"):
        CacheInspector(inspection, step=-1)
    with pytest.raises(TypeError, match="CacheRecorder"):
        Run("x", object())
    with pytest.raises(ValueError, match="nothing recorded"):
        Inspection(Run("empty", CacheRecorder(HandwrittenCache())))
    with pytest.raises(ValueError, match="bucket"):
        Run("x", inspection.runs[0].recorder, prompt_len=20, bucket=10)
    with pytest.raises(ValueError, match="same label"):
        Inspection([handwritten.runs[0], handwritten.runs[0]])
    with pytest.raises(TypeError, match="Inspection"):
        CacheInspector(handwritten.runs[0])


def test_the_words_for_counters_and_slots():
    assert describe_counters([14] * 30) == "14 (all 30 layers)"
    assert describe_counters([14] + [17] * 29) == "layer 0: 14; layers 1-29: 17"
    assert slot_ranges([9, 3, 4, 5]) == "3..5, 9"


def test_the_recorder_times_each_token_and_counts_tokens(handwritten):
    rec = handwritten.runs[0].recorder
    assert rec.token_counts == list(range(1, 7)) and all(s > 0 for s in rec.seconds)
    rec2 = CacheRecorder(rec.cache)
    rec2.snapshot()  # a bare snapshot: no token, no time
    assert rec2.token_counts == [0] and rec2.seconds == [None]
    assert rec2.heads[0][0].shape == (2, P + 5)  # [kv_heads, slots]

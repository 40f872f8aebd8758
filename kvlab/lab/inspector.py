"""kvlab's cache inspector: step through a recorded decode and see, per layer and kv head, which
slots hold a key.

The state is plain Python, usable without a browser:

- ``Run``: one recorded decode, a ``kvlab.cache_view.CacheRecorder`` (the ``on_token`` callback that
  recorded it) with a label, the prompt length (where a correct cache's valid tokens end) and, for a
  padded prefill, its bucket;
- ``Frame``: everything one view of one run shows at one step and layer: the ``[kv_heads, slots]``
  key norms, every layer's counter (or, for a cache without one, its length), the slots written past
  the valid tokens, the padding, the trash slot of a graph-safe cache, the tokens so far, the step's
  time; ``Frame.caption()``;
- ``Inspection``: one or more runs side by side (eager beside replay, two prompts through one
  graph): ``frames``, ``caption`` (it starts with ``"step {k}"``), ``figure`` (the static matplotlib
  figure of one step) and ``png``.

``CacheInspector(inspection)`` is the widget (ipywidgets, imported only there, on API that
ipywidgets 7.7 and 8 both have): a Play button linked to a step slider, a layer dropdown, the figure
as an image and the caption. It draws the initial frame when created; ``display(inspector)`` shows
it.

Step ``k`` is the cache after new token ``k`` (step 0: the prefill and the first token), as the
recorder saw it.
"""

from __future__ import annotations

import html
import io
import textwrap
from dataclasses import dataclass, field

import torch

from ..cache_view import CacheRecorder
from ..decoding import first_mismatch
from ..runtime import count
from .plots import figure as styled_figure

CAPTION_TOKENS = 160  # characters of the tokens' text a caption keeps (the newest ones)
EMPTY = "0.88"  # the colour of a slot that holds no key


def trash_slot(cache) -> int | None:
    """The trash slot of a graph-safe cache (``max_cache_len``: padded rows are written there, never
    read); None for every other cache."""
    from ..graph_safe_cache import GraphSafeStaticCache

    return cache.max_cache_len if isinstance(cache, GraphSafeStaticCache) else None


def describe_counters(values: list[int]) -> str:
    """One number per layer in a few words: ``"14 (all 30 layers)"`` or
    ``"layer 0: 14; layers 1-29: 17"``."""
    if not values:
        return "none"
    if len(set(values)) == 1:
        return (f"{values[0]} (all {len(values)} layers)" if len(values) > 1
                else f"{values[0]} (the one layer)")
    groups, start = [], 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[start]:
            where = f"layer {start}" if i - 1 == start else f"layers {start}-{i - 1}"
            groups.append(f"{where}: {values[start]}")
            start = i
    return "; ".join(groups)


def slot_ranges(slots: list[int]) -> str:
    """Slots as runs of adjacent ones: ``[3, 4, 5, 9]`` -> ``"3..5, 9"``."""
    runs = []
    for s in sorted(slots):
        if runs and runs[-1][1] == s - 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    return ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in runs)


def token_text(ids: torch.Tensor, tokenizer=None) -> str:
    """The tokens as text with a tokenizer, else their ids (random weights: the text would mean
    nothing)."""
    ids = ids.reshape(-1)
    if tokenizer is not None:
        return tokenizer.decode(ids)
    return " ".join(str(int(i)) for i in ids)


def runner_kind(describe: str) -> str:
    """A few words for a step runner's ``describe()``: a real CUDA graph's replay, the emulation's,
    eager calls."""
    for prefix, words in (("real CUDA graph", "CUDA graph replay"), ("EMULATED", "emulated replay"),
                          ("EAGER", "eager calls"), ("COMPILED", "torch.compile")):
        if describe.startswith(prefix):
            return words
    return describe.split(";")[0]


def _index(name: str, value, allowed, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value not in allowed:
        raise ValueError(f"{name} {value} {what}")
    return value


@dataclass
class Frame:
    """One run at one step and layer: what the inspector draws and writes."""

    label: str
    step: int
    steps: int  # steps this run recorded
    layer: int
    cache_type: str
    # [kv_heads, slots]: key norm per kv head and slot, 0 = empty
    heads: torch.Tensor = field(repr=False)
    # every layer's counter after this step; [] for a cache without counter tensors
    counters: list[int]
    lengths: list[int]  # every layer's buffer length in slots
    # slots a correct cache holds after this step (prompt + tokens fed); None: prompt unknown
    valid: int | None
    written: list[int]  # slots of this layer holding a key
    # written at or past ``valid`` (trash slot aside): padding, warm-up copies, shifted writes
    beyond: list[int]
    padding: list[int]  # slots holding a padded prefill's pad rows
    trash: int | None  # the trash slot (graph-safe caches), else None
    trash_written: bool  # the trash slot holds a key (padded rows went there)
    tokens: torch.Tensor = field(repr=False)  # [tokens so far] of row 0
    text: str  # the tokens so far, as text or ids
    seconds: float | None  # wall time since the previous token; None for a snapshot without a token
    # the first step where this run's tokens differ from the first run's
    differs_from: int | None = None

    @property
    def slots(self) -> int:
        return int(self.heads.shape[1])

    @property
    def counter(self) -> int | None:
        """This layer's counter (the slot its next write goes to), None for a cache without one."""
        return self.counters[self.layer] if self.counters else None

    def count_text(self) -> str:
        """Every layer's counter, or for a cache without one its length."""
        # a graph-safe cache: one counter tensor for every layer
        if self.counters and self.trash is not None:
            return (f"counter {self.counters[0]} (one tensor, shared by all "
                    f"{len(self.counters)} layers)")
        if self.counters:
            return f"counter {describe_counters(self.counters)}"
        return f"no counter ({self.cache_type}); length {describe_counters(self.lengths)}"

    def summary(self) -> str:
        """One line of what this frame shows, without the step (a caption line of one run)."""
        count = self.count_text()
        held = len([s for s in self.written if s != self.trash])
        parts = [f"{self.label}: {count}", f"layer {self.layer}: {held} slots written"]
        if self.valid is not None:
            parts[-1] += f", a correct cache holds {self.valid}"
        if self.beyond:
            parts.append(f"written past the valid tokens: slots {slot_ranges(self.beyond)}")
        if self.padding:
            parts.append(f"padding in slots {slot_ranges(self.padding)}")
        if self.trash is not None:
            parts.append(f"trash slot {self.trash}: "
                         + ("holds a key (padded rows go there)" if self.trash_written
                            else "zero (nothing written, or a zero key)"))
        if self.seconds is not None:
            parts.append(f"{1e3 * self.seconds:.1f} ms since the previous token")
        else:
            parts.append("no token at this step (a bare snapshot)")
        if self.differs_from is not None:
            parts.append(f"WRONG since step {self.differs_from}" if self.differs_from <= self.step
                         else "same tokens so far")
        tail = (self.text if len(self.text) <= CAPTION_TOKENS
                else "…" + self.text[-CAPTION_TOKENS:])
        parts.append(f"tokens: {tail!r}")
        return " | ".join(parts)

    def caption(self) -> str:
        """``"step {k} of {n} | layer {l} | ..."``: the frame in words."""
        return f"step {self.step} of {self.steps - 1} | {self.summary()}"


@dataclass
class Run:
    """One recorded decode: the recorder that was its ``on_token``, with what the inspector cannot
    read from it."""

    label: str
    recorder: CacheRecorder = field(repr=False)
    prompt_len: int | None = None  # a correct cache holds prompt_len + k slots after step k
    # a padded prefill's length: slots prompt_len..bucket-1 would get its padding
    bucket: int | None = None

    def __post_init__(self):
        if not isinstance(self.recorder, CacheRecorder):
            raise TypeError("recorder must be a kvlab.cache_view.CacheRecorder (the on_token "
                            f"callback of the decode), got {type(self.recorder).__name__}")
        for name in ("prompt_len", "bucket"):
            value = getattr(self, name)
            if value is not None:  # a NumPy or 0-dim tensor int read as an int
                setattr(self, name, count(value, f"{name} (or None)", minimum=0))
        if self.bucket is not None and (self.prompt_len is None or self.bucket < self.prompt_len):
            raise ValueError(f"bucket ({self.bucket}) needs the prompt_len it pads, and must be at "
                             f"least as long (got prompt_len={self.prompt_len})")

    @property
    def steps(self) -> int:
        return len(self.recorder.counters)

    @property
    def layers(self) -> tuple[int, ...]:
        return self.recorder.layers

    @property
    def trash(self) -> int | None:
        return trash_slot(self.recorder.cache)

    def check(self, step, layer) -> None:
        """Refuse a step this run did not record or a layer it did not record, saying what it
        has."""
        if self.steps == 0:
            raise ValueError(f"{self.label}: nothing recorded yet; pass its CacheRecorder as "
                             "on_token= to a decode first")
        _index("step", step, range(self.steps),
               f"is out of range: {self.label} recorded steps 0..{self.steps - 1}")
        _index("layer", layer, self.layers,
               f"was not recorded by {self.label} (recorded: {list(self.layers)}): record it with "
               f"CacheRecorder(cache, layers=(..., {layer}))")

    def frame(self, step: int, layer: int, tokenizer=None) -> Frame:
        """What this run's cache held after ``step``, in ``layer``."""
        self.check(step, layer)
        rec = self.recorder
        heads = rec.heads[layer][step]  # [kv_heads, slots]
        held = (heads > 0).any(dim=0)  # [slots]
        written = held.nonzero().flatten().tolist()
        count = rec.token_counts[step]
        valid = None if self.prompt_len is None else (self.prompt_len + count - 1 if count else 0)
        trash = self.trash if self.trash is not None and self.trash < heads.shape[1] else None
        beyond = [s for s in written if valid is not None and s >= valid and s != trash]
        padding = []
        if self.bucket is not None:
            # the pad rows are written by the prefill (step 0)
            at_prefill = (rec.heads[layer][0] > 0).any(dim=0)
            end = min(self.bucket, heads.shape[1])
            padding = [s for s in range(self.prompt_len, end)
                       if s != trash and at_prefill[s] and held[s]]
        tokens = rec.token_ids[0, :count].cpu() if count else torch.zeros(0, dtype=torch.long)
        return Frame(label=self.label, step=step, steps=self.steps, layer=layer,
                     cache_type=type(rec.cache).__name__, heads=heads,
                     counters=list(rec.counters[step]), lengths=list(rec.lengths[step]),
                     valid=valid,
                     written=written, beyond=beyond, padding=padding, trash=trash,
                     trash_written=trash is not None and bool(held[trash]), tokens=tokens,
                     text=token_text(tokens, tokenizer), seconds=rec.seconds[step])


class Inspection:
    """One or more recorded runs, viewed side by side at one step and layer (plain Python: no widget
    needed).

    ``tokenizer``: decode the tokens to text (None: show ids). ``compare=True``: the later runs'
    tokens are checked against the first run's (eager beside replay), and a run's frames say from
    which step they differ. ``max_slots``: show only the first slots (the trash slot is still shown,
    at the right). ``env``: ``kvlab.environment(device)``, stamped on the figures.
    """

    def __init__(self, runs, *, tokenizer=None, compare: bool = False, max_slots: int | None = None,
                 env: dict | None = None):
        runs = [runs] if isinstance(runs, Run) else list(runs)
        if not runs or not all(isinstance(r, Run) for r in runs):
            raise TypeError("runs must be a kvlab.lab.inspector.Run or a non-empty list of them, "
                            "e.g. [Run('eager', recorder, prompt_len=p)]")
        empty = [r.label for r in runs if r.steps == 0]
        if empty:
            raise ValueError(f"nothing recorded in {empty}: pass each CacheRecorder as on_token= "
                             "to a decode first")
        layers = [i for i in runs[0].layers if all(i in r.layers for r in runs)]
        if not layers:
            raise ValueError("the runs recorded no layer in common "
                             f"({[(r.label, r.layers) for r in runs]}): record "
                             "the same layers, e.g. CacheRecorder(cache, layers=(0, 1)) for each")
        if max_slots is not None:
            max_slots = count(max_slots, "max_slots (or None: every slot)")
        self.runs, self.layers, self.tokenizer, self.max_slots, self.env = (
            runs, layers, tokenizer, max_slots, env)
        labels = [r.label for r in runs]
        if len(set(labels)) != len(labels):
            raise ValueError(f"two runs have the same label ({labels}): give each its own, they "
                             "name the panels")
        self.differs = {r.label: self._first_difference(r) for r in runs[1:]} if compare else {}

    @classmethod
    def of_failure(cls, result, *, tokenizer=None, max_slots: int | None = None,
                   env: dict | None = None):
        """A lesson-04 scenario (``kvlab.failures.FailureResult``): the eager reference beside the
        scenario's run."""
        eager = Run("eager (correct)", result.expected_recorder, prompt_len=result.prompt_len)
        bucket = result.extra.get("bucket")
        broken = Run(f"{result.name} ({runner_kind(result.runner)})", result.recorder,
                     prompt_len=result.prompt_len, bucket=bucket)
        return cls([eager, broken], tokenizer=tokenizer, compare=True, max_slots=max_slots, env=env)

    def _first_difference(self, run: Run) -> int | None:
        a, b = self.runs[0].recorder.token_ids.cpu(), run.recorder.token_ids.cpu()
        n = min(a.shape[1], b.shape[1])
        found = first_mismatch(a[:1, :n], b[:1, :n])
        if found is None and b.shape[1] < a.shape[1]:
            return n  # it stopped early
        return found

    @property
    def steps(self) -> int:
        """The most steps any run recorded (the slider goes from 0 to ``steps - 1``)."""
        return max(r.steps for r in self.runs)

    @property
    def first_wrong(self) -> int | None:
        """The first step where some run's tokens differ from the first run's (``compare=True``);
        None if they all agree or the runs are not compared."""
        found = [d for d in self.differs.values() if d is not None]
        return min(found) if found else None

    def check(self, step, layer) -> None:
        _index("step", step, range(self.steps),
               f"is out of range: the runs recorded steps 0..{self.steps - 1}")
        _index("layer", layer, self.layers,
               f"was not recorded by every run (recorded: {self.layers})")

    def frames(self, step: int, layer: int) -> list[Frame | None]:
        """Each run's frame at ``step`` (None for a run that stopped before it)."""
        self.check(step, layer)
        out = []
        for run in self.runs:
            if step >= run.steps:
                out.append(None)
                continue
            frame = run.frame(step, layer, self.tokenizer)
            frame.differs_from = self.differs.get(run.label)
            out.append(frame)
        return out

    def caption(self, step: int, layer: int) -> str:
        """``"step {k} | layer {l}"``, then one line per run."""
        lines = [f"step {step} of {self.steps - 1} | layer {layer}"]
        for run, frame in zip(self.runs, self.frames(step, layer), strict=True):
            lines.append(frame.summary() if frame is not None
                         else f"{run.label}: stopped after step {run.steps - 1} (no step {step})")
        return "\n".join(lines)

    def vmax(self, layer: int) -> float:
        """The largest key norm of ``layer`` over every run and step: one colour scale while
        stepping."""
        return max((float(h.max()) for r in self.runs for h in r.recorder.heads[layer]
                    if h.numel()), default=0.0) or 1.0

    def figure(self, step: int, layer: int | None = None):
        """The static figure of one step: per run, a ``[kv_heads, slots]`` heatmap of layer
        ``layer``'s keys, the end of the valid tokens, the layer's counter, the slots written past
        them, the padding and the trash slot."""
        layer = self.layers[0] if layer is None else layer
        frames = self.frames(step, layer)
        fig, axes = styled_figure(f"The cache after step {step}, layer {layer}", "cache slot",
                                  "kv head", env=self.env, ncols=len(frames),
                                  figsize=(max(8.5, 6.4 * len(frames)), 3.6))
        axes = [axes] if len(frames) == 1 else list(axes)
        legend = {}  # label -> handle, over all panels
        for ax, run, frame in zip(axes, self.runs, frames, strict=True):
            ax.grid(False)
            if frame is None:
                ax.set_title(f"{run.label}\nstopped after step {run.steps - 1}", fontsize=9)
                ax.set(xticks=[], yticks=[])
            else:
                self._panel(ax, frame, legend)
        if legend:
            fig.legend(handles=list(legend.values()), loc="lower left",
                       ncol=2 if len(frames) == 1 else 3, fontsize=7,
                       facecolor="0.85", framealpha=1.0)  # left of the hardware stamp
        fig.subplots_adjust(left=0.06 / len(frames) + 0.02, right=0.98, top=0.78, bottom=0.3,
                            wspace=0.15)
        return fig, axes

    def _panel(self, ax, frame: Frame, legend: dict) -> None:
        """One run's heatmap and marks in ``ax``; adds the handles of what it drew to ``legend``."""
        import matplotlib.pyplot as plt
        import numpy as np
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch, Rectangle

        # widest buffer, any step
        width = max(h.shape[1] for r in self.runs for h in r.recorder.heads[frame.layer])
        shown = list(range(min(width, self.max_slots or width)))
        if frame.trash is not None and frame.trash not in shown:
            shown.append(frame.trash)  # always drawn, at the right
        column = {s: i for i, s in enumerate(shown)}
        heads = frame.heads.shape[0]
        norms = np.zeros((heads, len(shown)), dtype=np.float32)  # [kv_heads, shown slots]
        inside = [i for i, s in enumerate(shown) if s < frame.slots]
        norms[:, inside] = frame.heads[:, [shown[i] for i in inside]].numpy()
        # slots without a key (norm 0) in grey
        cmap = plt.get_cmap("magma").with_extremes(bad=EMPTY)
        ax.imshow(np.ma.masked_equal(norms, 0.0), aspect="auto", cmap=cmap, vmin=0,
                  vmax=self.vmax(frame.layer), interpolation="nearest")
        if (norms[:, inside] == 0).any():
            legend["empty"] = Patch(fc=EMPTY, ec="0.5", label="empty slot")
        # a buffer that grows (torch.cat): these slots do not exist yet
        if len(inside) < len(shown):
            ax.axvspan(len(inside) - 0.5, len(shown) - 0.5, fc="white", ec="0.6", hatch="..", lw=0)
            legend["grows"] = Patch(fc="white", ec="0.6", hatch="..",
                                    label="no slot yet (the buffer grows)")

        def mark(slots, key, label, color, hatch=None, lw=1.5, merge=False):
            """Outline these slots' columns (one box per slot, or per run of adjacent slots)."""
            boxes = []
            for c in sorted(column[s] for s in slots if s in column):
                if merge and boxes and boxes[-1][1] == c:
                    boxes[-1][1] = c + 1
                else:
                    boxes.append([c, c + 1])
            for start, end in boxes:
                ax.add_patch(Rectangle((start - 0.5, -0.5), end - start, heads, fill=False,
                                       ec=color, lw=lw, hatch=hatch))
                legend[key] = Patch(fill=False, ec=color, hatch=hatch, label=label)

        mark(frame.padding, "padding", "padding", "deepskyblue", hatch="///", merge=True)
        mark([s for s in frame.beyond if s not in frame.padding], "beyond",
             "written past the valid tokens", "red")
        if frame.trash is not None:
            mark([frame.trash], "trash", "trash slot (padded rows go there)", "lime", lw=2.5)
        if frame.valid is not None and frame.valid <= len(shown):
            ax.axvline(frame.valid - 0.5, color="cyan", lw=1.5)
            legend["valid"] = Line2D([], [], color="cyan", label="end of the valid tokens")
        if frame.counter is not None and frame.counter in column:
            ax.axvline(column[frame.counter] - 0.5, color="blue", lw=2.0, ls="--")
            legend["counter"] = Line2D([], [], color="blue", ls="--", lw=2.0,
                                       label="this layer's counter (next write)")
        every = max(1, len(shown) // 8)
        ticks = list(range(0, len(shown), every))
        if frame.trash is not None:  # its own tick, at the right
            ticks = [t for t in ticks if t < len(shown) - 1 - every // 2] + [len(shown) - 1]
        ax.set_xticks(ticks, [("trash" if shown[t] == frame.trash else str(shown[t]))
                              for t in ticks])
        ax.set_yticks(range(heads))
        wrong = frame.differs_from is not None and frame.differs_from <= frame.step
        ms = "" if frame.seconds is None else f" | {1e3 * frame.seconds:.1f} ms"
        ax.set_title(f"{frame.label}{'  (WRONG tokens)' if wrong else ''}\n"
                     f"{frame.count_text()}{ms}",
                     fontsize=9, color="C3" if wrong else "black")
        tail = frame.text if len(frame.text) <= 90 else "…" + frame.text[-90:]
        ax.set_xlabel("cache slot\n" + "\n".join(textwrap.wrap(repr(tail), 70)[:2]), fontsize=8)

    def png(self, step: int, layer: int | None = None, *, dpi: int = 80) -> bytes:
        """The figure of one step as PNG bytes (the figure is closed: nothing is left for the
        notebook to show)."""
        import matplotlib.pyplot as plt

        fig, _ = self.figure(step, layer)
        buffer = io.BytesIO()
        try:
            fig.savefig(buffer, format="png", dpi=dpi)
        finally:
            plt.close(fig)
        return buffer.getvalue()


class CacheInspector:
    """The widget: Play and a step slider (linked), a layer dropdown, the step's figure and its
    caption.

    Its root is ``box``, a VBox with the CSS class ``kvlab-inspector``; the image has
    ``kvlab-inspector-image`` and the caption (an HTML widget whose text starts with ``"step {k}"``)
    ``kvlab-inspector-caption``. Moving the slider or the dropdown redraws both. ``step`` defaults
    to the first wrong step of a comparison, else the last.
    """

    def __init__(self, inspection: Inspection, *, step: int | None = None, layer: int | None = None,
                 interval_ms: int = 1000):
        import ipywidgets as widgets

        if not isinstance(inspection, Inspection):
            raise TypeError("CacheInspector shows a kvlab.lab.inspector.Inspection, got "
                            f"{type(inspection).__name__}: wrap your runs first, "
                            "Inspection([Run(label, recorder, prompt_len=p)])")
        self.inspection = inspection
        last = inspection.steps - 1
        if step is None:
            step = last if inspection.first_wrong is None else min(inspection.first_wrong, last)
        layer = inspection.layers[0] if layer is None else layer
        inspection.check(step, layer)
        self.play = widgets.Play(value=step, min=0, max=last, step=1, interval=interval_ms,
                                 description="play")
        self.slider = widgets.IntSlider(value=step, min=0, max=last, step=1, description="step")
        widgets.jslink((self.play, "value"), (self.slider, "value"))
        self.layer = widgets.Dropdown(options=[(f"layer {i}", i) for i in inspection.layers],
                                      value=layer, description="layer")
        self.image = widgets.Image(format="png")
        self.image.add_class("kvlab-inspector-image")
        self.caption = widgets.HTML()
        self.caption.add_class("kvlab-inspector-caption")
        self.box = widgets.VBox([widgets.HBox([self.play, self.slider, self.layer]), self.image,
                                 self.caption])
        self.box.add_class("kvlab-inspector")
        self.slider.observe(self._redraw, names="value")
        self.layer.observe(self._redraw, names="value")
        self.redraw()

    def redraw(self) -> None:
        """Draw the slider's step in the dropdown's layer."""
        step, layer = self.slider.value, self.layer.value
        self.image.value = self.inspection.png(step, layer)
        text = html.escape(self.inspection.caption(step, layer)).replace("\n", "<br>")
        self.caption.value = f'<div style="font-family: monospace; font-size: 12px">{text}</div>'

    def _redraw(self, change) -> None:
        self.redraw()

    def _ipython_display_(self):
        from IPython.display import display

        display(self.box)

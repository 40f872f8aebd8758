"""What the lessons' cells share, so that no notebook copies another's code.

- ``lesson_setup()``: the set-up cell of every lesson on the course model: the device, the real
  model (or labelled random weights of its shape), what it runs on, printed; a ``Lesson`` holds
  them.
- ``course_model()``: the one way the lessons load the course model, with its offline fallback.
- ``show_source``, ``show_doc``, ``show_diff``: the installed package's own code, docstrings and the
  diff of two functions, displayed (never a copy that could drift from what runs).
- ``release()``: free what a section left and print what is still held.
"""

from __future__ import annotations

import difflib
import inspect
import os
from dataclasses import dataclass

import torch

from ..runtime import count, environment, hardware, pick_device, quick_mode
from ..sizes import model_sizes
from .measure import free_unreferenced, memory_held
from .models import ModelUnavailableError, load_model, random_smollm2

RANDOM_ENV = "KVLAB_RANDOM_WEIGHTS"


@dataclass
class CourseModel:
    """The model a lesson runs on; ``tokenizer`` is None when it fell back to random weights."""

    model: torch.nn.Module
    tokenizer: object | None
    label: str  # printed beside every result: which weights, which dtype

    @property
    def random(self) -> bool:
        return self.tokenizer is None

    def encode(self, question: str, *, max_random_tokens: int | None = None) -> torch.Tensor:
        """The chat prompt of ``question`` as ids ``[1, prompt_len]``; with random weights, its
        UTF-8 bytes."""
        device = next(self.model.parameters()).device
        if self.random:
            return torch.tensor([list(question.encode())[:max_random_tokens]], device=device)
        chat = [{"role": "user", "content": question}]
        return self.tokenizer.apply_chat_template(chat, add_generation_prompt=True,
                                                  return_tensors="pt")["input_ids"].to(device)

    def text(self, ids: torch.Tensor) -> str:
        """Decoded text; with random weights (meaningless text), the first and last few ids."""
        ids = ids.reshape(-1)
        if not self.random:
            return self.tokenizer.decode(ids)
        if ids.numel() <= 12:
            return " ".join(str(int(i)) for i in ids)
        return (" ".join(str(int(i)) for i in ids[:6]) + " ... "
                + " ".join(str(int(i)) for i in ids[-6:]))


def course_model(device=None, dtype: torch.dtype = torch.float32) -> CourseModel:
    """The real SmolLM2-135M-Instruct, or random weights of its shape when
    ``KVLAB_RANDOM_WEIGHTS=1`` or the real one cannot be had (a GPU machine without network): the
    mechanics and timings stay real, the text does not."""
    dtype_name = str(dtype).removeprefix("torch.")
    if os.environ.get(RANDOM_ENV) != "1":
        try:
            model, tokenizer = load_model(device=device, dtype=dtype)
            return CourseModel(model, tokenizer, f"SmolLM2-135M-Instruct, {dtype_name}")
        except ModelUnavailableError as e:
            print(f"the real model is not available here ({str(e).splitlines()[0]}); "
                  "using random weights")
    return CourseModel(
        random_smollm2(device=device, dtype=dtype),
        None,
        f"RANDOM WEIGHTS in SmolLM2-135M's shape, {dtype_name}: the text is meaningless, "
        "the mechanics and timings are real",
    )


@dataclass
class Lesson:
    """What a lesson's set-up cell gives its cells: where it runs and the course model it runs
    on."""

    device: torch.device
    env: dict  # kvlab.environment(device): the hardware and versions printed beside every plot
    course: CourseModel
    # with random weights, ``encode`` keeps this many bytes of a question
    max_random_tokens: int | None = None

    @property
    def gpu(self) -> bool:
        return self.device.type == "cuda"

    @property
    def model(self) -> torch.nn.Module:
        return self.course.model

    @property
    def config(self):
        return self.course.model.config

    @property
    def tokenizer(self):
        """The real model's tokenizer; None with random weights."""
        return self.course.tokenizer

    @property
    def random(self) -> bool:
        return self.course.random

    @property
    def label(self) -> str:
        return self.course.label

    def encode(self, question: str) -> torch.Tensor:
        """The chat prompt of ``question`` as ids ``[1, prompt_len]`` (random weights: its UTF-8
        bytes)."""
        return self.course.encode(question, max_random_tokens=self.max_random_tokens)

    def text(self, ids: torch.Tensor) -> str:
        return self.course.text(ids)


CAPTURE_HERE = {
    True: "real CUDA graphs on {hardware}",
    False: "EMULATED (no CUDA: kvlab.graphs records the step's aten operations once and replays "
           "them; same contract, same tokens, no speedup)",
}


def lesson_setup(dtype: torch.dtype = torch.float32, *, device=None, graphs: bool = False,
                 max_random_tokens: int | None = None) -> Lesson:
    """The set-up of every lesson on the course model, printed: the device (a GPU if there is one),
    the course model in ``dtype`` (float32 by default: the lessons compare tokens, and lesson 00
    shows why that needs it), or random weights of its shape where the real ones cannot be had
    (``course_model``), quick mode, the model's sizes, and with ``graphs=True`` whether a captured
    graph is a real CUDA graph here or kvlab's emulation."""
    device = pick_device(device)
    lesson = Lesson(device, environment(device), course_model(device, dtype), max_random_tokens)
    s = model_sizes(lesson.config)
    print(lesson.label)
    print(f"hardware: {lesson.env['hardware']} | "
          f"quick mode: {'on (shortened runs)' if quick_mode() else 'off'}")
    print(f"model: {s.layers} layers, hidden {s.hidden}, {s.heads} query heads, "
          f"{s.kv_heads} kv heads, head_dim {s.head_dim}")
    if graphs:
        print("capture here:", CAPTURE_HERE[lesson.gpu].format(hardware=hardware(device)))
    return lesson


def _source(obj, name: str = "obj") -> str:
    """The source of ``obj`` (a module, class or function), else a ValueError saying what to
    pass."""
    try:
        return inspect.getsource(obj)
    except (TypeError, OSError) as e:
        raise ValueError(f"{name} must be a module, class or function whose source is on disk "
                         f"(e.g. kvlab.decode), got {type(obj).__name__} {obj!r:.60} ({e})"
                         ) from None


def show_source(*objects) -> None:
    """Display the installed package's own code (never a copy)."""
    from IPython.display import Code, display

    sources = [_source(obj, f"objects[{i}]") for i, obj in enumerate(objects)]  # all, first
    for source in sources:
        display(Code(source, language="python"))


def show_doc(obj) -> None:
    """Display the docstring of a module, class or function of the installed package, as plain
    text."""
    from IPython.display import Markdown, display

    if not hasattr(obj, "__name__"):  # a docstring of its own: a module, class or function
        raise ValueError(f"obj must be a module, class or function (e.g. kvlab.decode), got "
                         f"{type(obj).__name__} {obj!r:.60}")
    display(Markdown("```text\n" + (inspect.getdoc(obj) or f"({obj.__name__} has no docstring)")
                     + "\n```"))


def show_diff(old, new, *, context: int = 1) -> None:
    """Display what changes from the source of ``old`` to the source of ``new`` (two functions), as
    a unified diff."""
    from IPython.display import Code, display

    before, after = _source(old, "old"), _source(new, "new")
    diff = difflib.unified_diff(before.splitlines(), after.splitlines(),
                                getattr(old, "__qualname__", old.__name__),
                                getattr(new, "__qualname__", new.__name__), lineterm="",
                                n=count(context, "context", minimum=0))
    display(Code("\n".join(diff), language="diff"))


def release(device) -> dict:
    """Free what the previous section left: collect garbage, return CUDA's cached blocks, print what
    is still held.

    Call it after ``del`` of the section's models, caches and graphs; a CUDA graph keeps its memory
    pool until the graph object itself is gone. Returns ``kvlab.lab.measure.memory_held(device)``.
    """
    free_unreferenced(device)
    held = memory_held(device)
    print("memory held now: " + ", ".join(f"{k.removesuffix('_mb').replace('_', ' ')} {v:,.0f} MB"
                                          for k, v in held.items()))
    return held

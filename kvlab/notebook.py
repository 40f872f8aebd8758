"""What the lessons' set-up cells share: the course model with its offline fallback, prompts, and package source."""

from __future__ import annotations

import gc
import inspect
import os
from dataclasses import dataclass

import torch

from .measure import memory_held
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
        """The chat prompt of ``question`` as ids ``[1, prompt_len]``; with random weights, its UTF-8 bytes."""
        device = next(self.model.parameters()).device
        if self.random:
            return torch.tensor([list(question.encode())[:max_random_tokens]], device=device)
        chat = [{"role": "user", "content": question}]
        return self.tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt")["input_ids"].to(device)

    def text(self, ids: torch.Tensor) -> str:
        """Decoded text; with random weights (meaningless text), the first and last few ids."""
        ids = ids.reshape(-1)
        if not self.random:
            return self.tokenizer.decode(ids)
        if ids.numel() <= 12:
            return " ".join(str(int(i)) for i in ids)
        return " ".join(str(int(i)) for i in ids[:6]) + " ... " + " ".join(str(int(i)) for i in ids[-6:])


def course_model(device=None, dtype: torch.dtype = torch.float32) -> CourseModel:
    """The real SmolLM2-135M-Instruct, or random weights of its shape when ``KVLAB_RANDOM_WEIGHTS=1`` or the real
    one cannot be had (a GPU machine without network): the mechanics and timings stay real, the text does not."""
    dtype_name = str(dtype).removeprefix("torch.")
    if os.environ.get(RANDOM_ENV) != "1":
        try:
            model, tokenizer = load_model(device=device, dtype=dtype)
            return CourseModel(model, tokenizer, f"SmolLM2-135M-Instruct, {dtype_name}")
        except ModelUnavailableError as e:
            print(f"the real model is not available here ({str(e).splitlines()[0]}); using random weights")
    return CourseModel(
        random_smollm2(device=device, dtype=dtype),
        None,
        f"RANDOM WEIGHTS in SmolLM2-135M's shape, {dtype_name}: the text is meaningless, the mechanics and timings are real",
    )


def show_source(*objects) -> None:
    """Display the installed package's own code (never a copy)."""
    from IPython.display import Code, display

    for obj in objects:
        display(Code(inspect.getsource(obj), language="python"))


def release(device) -> dict:
    """Free what the previous section left: collect garbage, return CUDA's cached blocks, print what is still held.

    Call it after ``del`` of the section's models, caches and graphs; a CUDA graph keeps its memory pool until the
    graph object itself is gone. Returns ``kvlab.measure.memory_held(device)``.
    """
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    held = memory_held(device)
    print("memory held now: " + ", ".join(f"{k.removesuffix('_mb').replace('_', ' ')} {v:,.0f} MB" for k, v in held.items()))
    return held

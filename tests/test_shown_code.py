"""The code the lessons put on screen carries the idea, not the refusals.

Each function below is shown by a lesson (``show_source``). Its refusals live at its door, a
``check_*`` call or the caller's ``check_inputs``, so what a student reads holds no ``raise``: the
cache update, the capture, the decode step.
"""

import ast
import inspect
import textwrap
from pathlib import Path

import pytest

from kvlab import decoding, failures, graphs, handwritten
from kvlab.continuous_batching import ContinuousBatcher
from kvlab.graph_decoder import GraphSafeDecoder, model_step
from kvlab.graph_safe_cache import GraphSafeStaticCache
from kvlab.kernels.step import layer_kernels
from kvlab.lab import serving
from kvlab.paged_cache import memory_accounting, paged_mask, slots_of
from kvlab.speculative import SpeculativeDecoder, kept_drafts, prompt_lookup_draft

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
SHOWN = {  # function: what the lesson's show_source call names
    decoding.decode_naive: "decoding.decode_naive",
    decoding.greedy: "decoding.greedy",
    handwritten.HandwrittenLayer.append: "handwritten.HandwrittenLayer",
    graphs.capture: "show_source(capture)",
    failures.decode_static_graph: "show_source(decode_static_graph)",
    GraphSafeStaticCache.write_positions: "GraphSafeStaticCache.write_positions",
    GraphSafeStaticCache.update: "GraphSafeStaticCache.update",
    GraphSafeStaticCache.reset: "GraphSafeStaticCache.reset",
    model_step: "show_source(model_step",
    GraphSafeDecoder.one_step: "GraphSafeDecoder.one_step",
    GraphSafeDecoder.multi_step: "GraphSafeDecoder.multi_step",
    layer_kernels: "show_source(layer_kernels)",
    prompt_lookup_draft: "show_source(prompt_lookup_draft)",
    kept_drafts: "show_source(kept_drafts)",
    SpeculativeDecoder.verify: "SpeculativeDecoder.verify",
    memory_accounting: "show_source(memory_accounting)",
    slots_of: "show_source(slots_of",
    paged_mask: "paged_mask)",
    ContinuousBatcher.fill: "ContinuousBatcher.fill",
    ContinuousBatcher.decode_step: "ContinuousBatcher.decode_step",
    serving.paged_runs: "serving.paged_runs",
}


@pytest.mark.parametrize("fn", list(SHOWN), ids=lambda f: f.__qualname__)
def test_a_function_a_lesson_shows_refuses_nothing_itself(fn):
    shown = "".join(p.read_text() for p in NOTEBOOKS.glob("*.ipynb"))
    assert SHOWN[fn] in shown, f"no lesson shows {fn.__qualname__} any more: take it off this list"
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    raises = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Raise)]
    assert not raises, (
        f"{fn.__qualname__} raises on its own lines {raises}: move the refusal to its door")

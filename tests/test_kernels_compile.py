"""Every Triton kernel of ``graph-safe-kernels`` compiles for the GPUs the course runs on, here
without one.

``tools/compile_kernels.py`` compiles each launch of the decode step, the prefill and the decode
attention (SmolLM2's shapes in bfloat16 and float32, the tests' tiny models) for a target Triton is
told about. ptxas then refuses what the CPU interpreter accepts: a loop variable that changes type,
an operation it cannot lower, a kernel that needs more shared memory than the GPU gives one program.
Compiling is not running: the timings and the tokens are the GPU check's.
"""

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import compile_kernels  # noqa: E402

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("triton") is None,
        reason="needs the triton package (pip install triton on Linux x86-64)",
    ),
    pytest.mark.heavy,
]
KERNELS = {
    "gemv_kernel",
    "tile_kernel",
    "_argmax_kernel",
    "_rope_cache_attention_kernel",
    "_prefill_attention_kernel",
    "_partial_kernel",
    "_combine_kernel",
}


@pytest.fixture(
    scope="module", params=[90, 89], ids=["sm_90 (H200)", "sm_89 (L4: the least shared memory)"]
)
def compiled(request, tmp_path_factory) -> tuple[int, list[dict]]:
    out = tmp_path_factory.mktemp("compiled") / "kernels.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "compile_kernels.py"),
            "--capability",
            str(request.param),
            "--json",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode == 3:
        pytest.skip(done.stderr.strip())
    assert done.returncode == 0, done.stderr[-4000:]
    return request.param, json.loads(out.read_text())["kernels"]


def test_every_kernel_compiles_without_spilling_and_fits_the_gpus_shared_memory(compiled):
    capability, rows = compiled
    assert KERNELS <= {r["kernel"] for r in rows}, (
        "a kernel of the path was never launched: the check would miss it"
    )
    assert not [r for r in rows if r["spilled_bytes"]], [r for r in rows if r["spilled_bytes"]]
    limit = compile_kernels.SHARED_LIMIT[capability]
    too_big = [
        (r["kernel"], r["shared_bytes"], r["constants"]) for r in rows if r["shared_bytes"] > limit
    ]
    assert not too_big, (
        f"more shared memory than sm_{capability} gives one program ({limit:,} B): {too_big}"
    )


def test_a_weight_read_in_parts_loads_as_the_whole_weight_does(compiled):
    """``copy_weights=False`` reads q/k/v and gate/up where they lie. At SmolLM2's shapes each
    program's outputs lie in one part (``BY_BLOCK``), and its kernel makes the same global loads, as
    many of them 16-byte vectors, as the kernel of the fused copy's whole weight."""
    _, rows = compiled
    whole = {(r["kernel"], re.sub(r" PARTS=\d BY_BLOCK=\w+", "", r["constants"])): r for r in rows
             if " PARTS=1 " in r["constants"]}
    stacked = [
        r for r in rows if "BY_BLOCK=True" in r["constants"] and " PARTS=1 " not in r["constants"]
    ]
    assert len(stacked) >= 8, "the stacked launches were not compiled"
    for r in stacked:
        twin = whole[(r["kernel"], re.sub(r" PARTS=\d BY_BLOCK=\w+", "", r["constants"]))]
        assert (r["global_loads"], r["vector16_loads"]) == (
            twin["global_loads"],
            twin["vector16_loads"],
        ), (r, twin)

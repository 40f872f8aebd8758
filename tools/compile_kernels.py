"""Compile every Triton kernel of ``graph-safe-kernels`` for a GPU, on a machine without one.

    python tools/compile_kernels.py                    # for an H200 (sm_90, with PDL), a table per
    kernel python tools/compile_kernels.py --capability 80    # for an A100 (sm_80, no PDL) python
    tools/compile_kernels.py --json out.json    # the table as JSON, e.g. to compare two commits

Triton compiles for whatever target its driver reports. Here a stand-in driver reports the GPU asked
for, and every kernel launch of ``kernel_step``, ``kernel_prefill`` and ``decode_attention`` is
compiled (Triton's ``warmup``: nothing runs) with the arguments the real calls pass: SmolLM2-135M's
shapes (random weights, one layer), bfloat16 and float32, batch 1, 16 and 64, each option of the
step, and the tiny models the tests use. So ptxas sees what the CPU interpreter never does (an
unsupported operation, a layout it cannot lower, registers spilled), and each kernel's resource use
is printed: registers per thread, bytes spilled, shared memory, and how many of its global loads are
16-byte vector loads. It measures no time: a GPU does that (``tools/time_kernels.py``). It leans on
Triton's internals (its driver and ``JITFunction.run``), so it runs in a process of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvlab.graph_safe_cache import GraphSafeStaticCache  # noqa: E402
from kvlab.kernels import attention, common, step  # noqa: E402
from kvlab.lab.models import random_smollm2, tiny_model  # noqa: E402

# Shared memory one program may use, by compute capability x 10 (the CUDA C++ Programming Guide's
# technical specifications: 163 KB on an A100 and a Jetson Orin, 99 KB on an RTX 30xx/40xx or an L4,
# 227 KB on an H100/H200)
SHARED_LIMIT = {80: 163 * 1024, 86: 99 * 1024, 87: 163 * 1024, 89: 99 * 1024, 90: 227 * 1024}


@contextmanager
def compile_only(capability: int):
    """Inside it, a Triton launch compiles its kernel for compute capability ``capability`` and runs
    nothing; the kernels' Python wrappers take CPU tensors for the GPU's (``common.available``,
    ``common.pdl``). Yields the list that each launch appends ``(kernel name, compiled kernel)``
    to."""
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.driver import CudaDriver
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    class StandIn(CudaDriver):  # the target is all a compile asks of the driver
        def __init__(self):
            pass

        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def get_current_target(self):
            return GPUTarget("cuda", capability, 32)

    compiled = []

    def launch(self, grid):
        def run(*args, **kwargs):
            compiled.append((self.fn.__name__, self.run(*args, grid=grid, warmup=True, **kwargs)))
        return run

    saved = (JITFunction.__getitem__, common.available, common.pdl, common.multiprocessors)
    driver.set_active(StandIn())
    JITFunction.__getitem__ = launch
    common.available = lambda x: True
    common.pdl = lambda device: capability >= 90 and common.HAS_GDC
    # an H100's or H200's multiprocessors: the launches fill_splits plans there
    common.multiprocessors = lambda device: 132
    try:
        yield compiled
    finally:  # the driver stays the stand-in: this process compiles, and exits
        JITFunction.__getitem__, common.available, common.pdl, common.multiprocessors = saved


def new_cache(model, batch: int, slots: int = 320) -> GraphSafeStaticCache:
    config = model.config
    cache = GraphSafeStaticCache(config=config, max_cache_len=slots)
    head_dim = model.model.layers[0].self_attn.head_dim
    cache.early_initialization(
        batch, config.num_key_value_heads, head_dim, next(model.parameters()).dtype, "cpu"
    )
    return cache


def launch_everything(model, fused, batches, options, prefill_rows: int) -> None:
    """Every launch of the step at each batch and option, of the prefill of ``prefill_rows`` padded
    rows, on the fused copy and on the model's own weights (stacked q/k/v and gate/up)."""
    with torch.inference_mode():
        for weights in (fused, model):
            for b in batches:
                for option in options:
                    token = torch.zeros(b, 1, dtype=torch.long)
                    step.kernel_step(
                        weights,
                        new_cache(weights, b),
                        token,
                        step.arrival_counters(weights, b, "cpu"),
                        **option,
                    )
            valid = torch.tensor(prefill_rows - 3)
            # the attention's tiles: fewer rows where they would not fill the GPU (batch 1), or all
            for b in (1, 16):
                prompt = torch.zeros(b, prefill_rows, dtype=torch.long)
                step.kernel_prefill(
                    weights, new_cache(weights, b), prompt, valid, torch.zeros(b, 1,
                    dtype=torch.long)
                )


def compile_all(capability: int) -> list[dict]:
    """Compile the kernels path's launches (see the module docstring) -> one row per distinct
    compiled kernel."""
    from kvlab.fusion import fused_copy

    steps = [
        {},
        {"dot_attention": False},
        {"tiles": False},
        {"fill_splits": False},
    ]
    with compile_only(capability) as compiled:
        for dtype in (torch.bfloat16, torch.float32):  # float32: the token check's
            model = random_smollm2(device="cpu", dtype=dtype, layers=1)
            launch_everything(
                model,
                fused_copy(model, attention=False),
                (1, 16, 64),
                steps if dtype == torch.bfloat16 else [{}],
                prefill_rows=64,
            )
            q = torch.zeros(1, 9, 1, 64, dtype=dtype)
            kv = torch.zeros(1, 3, 320, 64, dtype=dtype)
            attention.decode_attention(q, kv, kv, torch.ones(1, 1, 1, 320, dtype=torch.bool), 0.125)
        # the GPU tests' models: head_dim 16, biases (Qwen2)
        for name in ("tiny-llama", "tiny-qwen2"):
            model = tiny_model(name)
            launch_everything(
                model, fused_copy(model, attention=False), (2,), [{}], prefill_rows=16
            )
    rows, seen = [], set()
    for name, kernel in compiled:
        if kernel.hash in seen:
            continue
        seen.add(kernel.hash)
        rows.append({"kernel": name, **resources(kernel), "constants": describe(kernel)})
    return rows


def describe(kernel) -> str:
    """The constexpr arguments a compiled kernel was specialized for, as ``NAME=value`` pairs."""
    src = kernel.src
    names = getattr(src, "fn", None) and src.fn.arg_names
    values = getattr(src, "constants", {}) or {}
    pairs = []
    for key, value in values.items():
        index = key[0] if isinstance(key, tuple) else key
        name = names[index] if isinstance(index, int) and names else str(index)
        if name.isupper():
            pairs.append(f"{name}={value}")
    pointers = [
        t
        for t in getattr(src, "signature", {}).values()
        if isinstance(t, str) and t.startswith("*")
    ]
    # the second: W, K, or the cache
    return " ".join([pointers[1] if len(pointers) > 1 else "", *pairs]).strip()


def resources(kernel) -> dict:
    """Registers per thread, spilled bytes (stores), shared memory, global loads and how many are
    16-byte vectors."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        usage = subprocess.run(
            [str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True
        ).stdout
    regs = re.search(r"REG:(\d+)", usage)
    local = re.search(r"LOCAL:(\d+)", usage)
    ptx = kernel.asm["ptx"]
    body = [line.strip() for line in ptx.splitlines() if line.strip() and line.strip()[0].isalpha()
            and not line.strip().startswith(("ld.param", "."))]
    return {
        "instructions": len(body),
        "registers": int(regs.group(1)) if regs else None,
        "spilled_bytes": int(local.group(1)) if local else None,
        "shared_bytes": kernel.metadata.shared,
        "warps": kernel.metadata.num_warps,
        "global_loads": len(re.findall(r"\bld\.global", ptx)),
        "vector16_loads": len(re.findall(r"\bld\.global\S*\.v4", ptx)),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--capability",
        type=int,
        default=90,
        choices=sorted(SHARED_LIMIT),
        help="compute capability x 10: 90 (H100/H200), 80 (A100), 89 (L4, RTX 40xx), 86 (RTX 30xx)",
    )
    parser.add_argument("--json", help="write the rows here as JSON")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        parser.error("unset TRITON_INTERPRET: the interpreter compiles nothing")
    try:
        import triton.backends.nvidia.driver  # noqa: F401
        from triton.backends.compiler import GPUTarget  # noqa: F401
    # no Triton, or one without its NVIDIA backend (macOS, Windows, an AMD-only build)
    except ImportError as err:
        print(
            f"cannot compile for an NVIDIA GPU here: {err}. Linux x86-64 wheels of triton include "
            "the backend (pip install triton)",
            file=sys.stderr,
        )
        return 3
    rows = compile_all(args.capability)
    limit = SHARED_LIMIT[args.capability]
    print(
        f"{len(rows)} kernels compiled for sm_{args.capability} (shared memory per program: at "
        f"most {limit:,} B)"
    )
    print(
        f"{'kernel':<30}{'PTX':>6}{'regs':>5}{'spill B':>8}{'shared B':>9}{'warps':>6}"
        f"{'loads':>6}{'v4':>4}  constants"
    )
    for r in rows:
        print(f"{r['kernel']:<30}{r['instructions']:>6}{r['registers']:>5}{r['spilled_bytes']:>8}{r['shared_bytes']:>9}"
              f"{r['warps']:>6}{r['global_loads']:>6}{r['vector16_loads']:>4}  {r['constants']}")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "capability": args.capability,
                    "shared_limit": limit,
                    "triton": __import__("triton").__version__,
                    "kernels": rows,
                },
                indent=1,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

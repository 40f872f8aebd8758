"""kvlab.decode_kernel: the split-K Triton decode attention equals SDPA, and a decode through it equals naive.

On CUDA the kernel runs natively; on a CPU it runs in Triton's interpreter (``TRITON_INTERPRET=1``), which
needs the ``triton`` package (CUDA builds of torch bring it; on a CPU-only machine ``pip install triton``).
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kvlab
from kvlab import decode_kernel, fusion
from kvlab.fast_decode import MultiStepDecoder, decode_graph_safe_fast
from kvlab.models import tiny_model

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="needs the triton package to run the kernel (CUDA builds of torch include it; on a CPU-only machine "
           "`pip install triton` runs it in Triton's CPU interpreter)",
)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

CASES = {  # batch, heads, kv_heads, cache slots, head_dim, valid slots, dtype
    "smollm2-heads": (1, 9, 3, 320, 64, 200, torch.float32),  # group 3, padded to 4 rows in the kernel
    "ragged-slots": (2, 4, 2, 70, 16, 33, torch.float32),  # slots not a multiple of the block
    "long-cache": (1, 9, 3, 2100, 64, 1500, torch.float32),  # more blocks than MAX_SPLITS: several per program
    "one-valid-slot": (1, 9, 3, 320, 64, 1, torch.float32),  # every other share of the cache is empty
    "no-gqa-bf16": (2, 8, 8, 40, 32, 40, torch.bfloat16),
}
DECODES = [(name, graph) for name in ("tiny-llama", "tiny-qwen2") for graph in (False, True)]


def check_kernel(case: str, with_mask: bool) -> None:
    b, heads, kv_heads, length, d, valid, dtype = CASES[case]
    gen = torch.Generator().manual_seed(length)
    q, k, v = (torch.randn(b, n, s, d, generator=gen).to(DEVICE, dtype) for n, s in ((heads, 1), (kv_heads, length), (kv_heads, length)))
    mask = (torch.arange(length, device=DEVICE) < valid).reshape(1, 1, 1, length) if with_mask else None  # batch broadcast
    assert decode_kernel.available(q) and decode_kernel.supports(q, k, v, mask)
    got = decode_kernel.decode_attention(q, k, v, mask, d**-0.5)
    expected, _ = fusion.decode_attention(torch.nn.Module(), q, k, v, mask, scaling=d**-0.5)
    assert got.shape == expected.shape == (b, 1, heads, d)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), expected.float(), atol=tol, rtol=tol)


def check_decode(name: str, graph: bool) -> None:
    model = tiny_model(name).to(DEVICE)
    calls, run = [], decode_kernel.decode_attention
    decode_kernel.decode_attention = lambda *a: calls.append(1) or run(*a)  # count the kernel's runs
    try:
        gen = torch.Generator().manual_seed(5)
        for prompt_len in (7, 3):  # a second prompt through the same decoder (and graph)
            ids = torch.randint(0, 256, (2, prompt_len), generator=gen).to(DEVICE)
            out = decode_graph_safe_fast(model, ids, 12, steps=4, graph=graph, compile_mode=None, attention="triton",
                                         max_cache_len=48)
            assert torch.equal(out, kvlab.decode(model, ids, 12)), (name, prompt_len)
    finally:
        decode_kernel.decode_attention = run
    assert calls, "the Triton kernel never ran: the check would only have tested the fallback"


def check_compiled_decode() -> None:
    """The kernel inside a torch.compile'd step (a custom op: inductor calls it as it is), several steps per call."""
    model = tiny_model("tiny-llama").to(DEVICE)
    ids = torch.randint(0, 256, (1, 9), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    fast = fusion.fused_copy(model, attention="triton", gemv=True)
    decoder = MultiStepDecoder(fast, 32, 1, steps=4, graph=DEVICE == "cuda", compile_mode="default")
    with torch.inference_mode():
        assert torch.equal(decoder.generate(ids, 20), kvlab.decode(model, ids, 20))


def run_checks() -> dict[str, str]:
    """Every check, by id: "ok" or the error (what the interpreter subprocess reports)."""
    checks = {f"kernel-{case}-mask{m}": (check_kernel, case, m) for case in CASES for m in (True, False)}
    checks |= {f"decode-{name}-graph{g}": (check_decode, name, g) for name, g in DECODES}
    checks["compiled-decode"] = (check_compiled_decode,)
    results = {}
    for key, (fn, *args) in checks.items():
        try:
            fn(*args)
            results[key] = "ok"
        except Exception as err:  # reported per check by the parent test
            results[key] = f"{type(err).__name__}: {err}"[:2000]
    return results


@pytest.fixture(scope="module")
def interpreted():
    """None on CUDA (checks run in this process); on CPU, the results of all checks run once in a subprocess
    under ``TRITON_INTERPRET=1`` (Triton reads it when it is first imported, so it cannot be switched on here)."""
    if DEVICE == "cuda":
        return None
    env = os.environ | {"TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600,
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def outcome(interpreted, key: str, fn, *args) -> None:
    if interpreted is None:
        fn(*args)
    else:
        assert interpreted[key] == "ok", interpreted[key]


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("with_mask", [True, False])
def test_kernel_matches_sdpa(interpreted, case, with_mask):
    outcome(interpreted, f"kernel-{case}-mask{with_mask}", check_kernel, case, with_mask)


@pytest.mark.parametrize(("name", "graph"), DECODES)
def test_decode_with_the_kernel_is_token_exact(interpreted, name, graph):
    outcome(interpreted, f"decode-{name}-graph{graph}", check_decode, name, graph)


def test_compiled_step_with_the_kernel_is_token_exact(interpreted):
    outcome(interpreted, "compiled-decode", check_compiled_decode)


def test_unsupported_shapes_fall_back():
    q = torch.randn(1, 4, 3, 16)  # three query tokens: the prefill
    k = torch.randn(1, 2, 8, 16)
    assert not decode_kernel.supports(q, k, k, None)
    one = q[:, :, :1]
    assert decode_kernel.supports(one, k, k, None)
    assert decode_kernel.supports(one, k, k, torch.ones(1, 1, 1, 8, dtype=torch.bool))
    assert not decode_kernel.supports(torch.randn(1, 4, 1, 24), torch.randn(1, 2, 8, 24), torch.randn(1, 2, 8, 24), None)  # head_dim 24
    assert not decode_kernel.supports(one, k, k, torch.zeros(1, 1, 1, 8))  # an additive float mask
    assert not decode_kernel.supports(one, k, k, torch.ones(1, 1, 1, 7, dtype=torch.bool))  # a mask of other length
    assert not decode_kernel.supports(one, k, k.transpose(1, 2).contiguous().transpose(1, 2), None)  # values laid out unlike keys


if __name__ == "__main__":  # the interpreter subprocess of the `interpreted` fixture
    print(json.dumps(run_checks()))

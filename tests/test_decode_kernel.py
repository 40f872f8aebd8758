"""kvlab's Triton kernels: ``decode_kernel`` (split-K attention) equals SDPA, ``kernel_step``'s kernels equal their
PyTorch references, and decodes through either equal naive.

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
from kvlab import decode_kernel, fusion, kernel_step
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


def reference(fn, *args, **kwargs):
    """``fn`` of kernel_step run by its PyTorch reference instead of its kernel."""
    use, kernel_step._use_triton = kernel_step._use_triton, lambda x: False
    try:
        return fn(*args, **kwargs)
    finally:
        kernel_step._use_triton = use


GEMVS = {  # rows, N, K, the prologue and epilogue: K and N off the block sizes, so the masks are exercised
    "plain": (1, 37, 80, {}),
    "rmsnorm-bias": (3, 37, 200, {"norm": True, "bias": True}),
    "silu-mul-residual": (2, 24, 150, {"silu_mul": True, "residual": True}),
    "bf16-rmsnorm-residual": (1, 64, 576, {"norm": True, "residual": True, "dtype": torch.bfloat16}),
}


def check_gemv(case: str) -> None:
    rows, n, k, opts = GEMVS[case]
    dtype = opts.get("dtype", torch.float32)
    gen = torch.Generator().manual_seed(n * k)
    rand = lambda *shape: torch.randn(*shape, generator=gen).to(DEVICE, dtype)  # noqa: E731
    x = rand(rows, 2 * k if opts.get("silu_mul") else k)
    kwargs = {"bias": rand(n) if opts.get("bias") else None, "norm": rand(k) if opts.get("norm") else None,
              "residual": rand(rows, n) if opts.get("residual") else None, "silu_mul": opts.get("silu_mul", False)}
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(DEVICE, dtype)  # outputs of order 1, like a model's
    got = kernel_step.gemv(x, w, **kwargs)
    expected = reference(kernel_step.gemv, x, w, **kwargs)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.float(), expected.float(), atol=tol, rtol=tol)


ATTENTIONS = {  # batch, heads, kv_heads, slots, head_dim, position (the counter), dtype
    "one-split": (1, 9, 3, 30, 64, 12, torch.float32),
    "three-splits": (2, 4, 2, 70, 16, 33, torch.float32),  # the last program of each kv head combines
    "first-token": (1, 4, 2, 70, 16, 0, torch.float32),
    "cache-full": (1, 4, 4, 40, 16, 40, torch.float32),  # written to the trash slot, attends to every slot
    "long-bf16": (1, 9, 3, 1100, 64, 1000, torch.bfloat16),  # several blocks per program
}


def check_rope_cache_attention(case: str) -> None:
    b, heads, kv_heads, slots, d, position, dtype = ATTENTIONS[case]
    gen = torch.Generator().manual_seed(slots)
    rand = lambda *shape: torch.randn(*shape, generator=gen).to(DEVICE, dtype)  # noqa: E731
    qkv = rand(b, (heads + 2 * kv_heads) * d)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2, device=DEVICE).float() / d))  # the default RoPE's
    keys, values = rand(b, kv_heads, slots + 1, d), rand(b, kv_heads, slots + 1, d)
    pos = torch.tensor(position, device=DEVICE)
    done = torch.zeros(b * kv_heads, dtype=torch.int32, device=DEVICE)
    k2, v2 = keys.clone(), values.clone()
    got = kernel_step.rope_cache_attention(qkv, inv_freq, 1.0, keys, values, pos, heads, d**-0.5, done)
    expected = reference(kernel_step.rope_cache_attention, qkv, inv_freq, 1.0, k2, v2, pos, heads, d**-0.5)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.float(), expected.float(), atol=tol, rtol=tol)
    torch.testing.assert_close(keys, k2, atol=tol, rtol=tol)  # the new k (after RoPE) and v, at the same slot
    torch.testing.assert_close(values, v2, atol=0, rtol=0)
    assert not done.any(), "the arrival counters must be left at zero for the next call"


HEADS = {  # rows, vocabulary, hidden, dtype
    "ragged-vocab": (2, 1000, 64, torch.float32),
    "bf16": (1, 1500, 576, torch.bfloat16),
}


def check_greedy_head(case: str) -> None:
    """The LM head + argmax kernels choose what argmax of the logits chooses, the FIRST index on ties, and
    advance the counter."""
    rows, vocab, hidden, dtype = HEADS[case]
    gen = torch.Generator().manual_seed(vocab)
    x = torch.randn(rows, hidden, generator=gen).to(DEVICE, dtype)
    w = (torch.randn(vocab, hidden, generator=gen) / hidden**0.5).to(DEVICE, dtype)
    norm = torch.rand(hidden, generator=gen).to(DEVICE, dtype) + 0.5
    logits = reference(kernel_step.gemv, x, w, norm=norm)  # [rows, vocab]
    top = logits.float().argmax(-1)
    w[vocab - 1] = w[top[0]]  # a tie with a later index, and one with an earlier index (in another block)
    w[3] = w[top[0]] if int(top[0]) > 3 else w[3]
    token, position = torch.zeros(rows, 1, dtype=torch.long, device=DEVICE), torch.tensor(5, device=DEVICE)
    kernel_step.greedy_head(x, w, norm, 1e-6, token, position)
    logits = reference(kernel_step.gemv, x, w, norm=norm)
    if dtype == torch.float32:
        expected = logits.argmax(-1, keepdim=True)
        assert torch.equal(token, expected), (token.flatten().tolist(), expected.flatten().tolist())
    else:  # bf16 logits summed in another order may differ by a rounding step: the choice must be a maximum
        chosen, best = logits.gather(1, token).float(), logits.float().max(-1, keepdim=True).values
        assert (chosen >= best - 0.02 * best.abs()).all(), (chosen, best)
    assert int(position) == 6


def check_kernel_step_decode(name: str) -> None:
    """The whole step through the kernels, token-exact against naive, on two prompts through one decoder."""
    model = tiny_model(name).to(DEVICE)
    calls, run = [], kernel_step.rope_cache_attention
    kernel_step.rope_cache_attention = lambda *a: calls.append(kernel_step._use_triton(a[0])) or run(*a)
    try:
        gen = torch.Generator().manual_seed(6)
        for prompt_len in (7, 3):  # a second prompt through the same decoder (and graph, on CUDA)
            ids = torch.randint(0, 256, (2, prompt_len), generator=gen).to(DEVICE)
            out = kernel_step.decode_graph_safe_kernels(model, ids, 7, steps=3, max_cache_len=48)
            assert torch.equal(out, kvlab.decode(model, ids, 7)), (name, prompt_len)
    finally:
        kernel_step.rope_cache_attention = run
    assert any(calls), "the kernels never ran: the check would only have tested the PyTorch reference"


# Qwen2 has q/k/v biases. In Triton's CPU interpreter a decode takes about a minute: one architecture there.
KERNEL_STEP_DECODES = ["tiny-llama", "tiny-qwen2"] if DEVICE == "cuda" else ["tiny-qwen2"]


def run_checks() -> dict[str, str]:
    """Every check, by id: "ok" or the error (what the interpreter subprocess reports)."""
    checks = {f"kernel-{case}-mask{m}": (check_kernel, case, m) for case in CASES for m in (True, False)}
    checks |= {f"decode-{name}-graph{g}": (check_decode, name, g) for name, g in DECODES}
    checks["compiled-decode"] = (check_compiled_decode,)
    checks |= {f"gemv-{case}": (check_gemv, case) for case in GEMVS}
    checks |= {f"rope-cache-attention-{case}": (check_rope_cache_attention, case) for case in ATTENTIONS}
    checks |= {f"greedy-head-{case}": (check_greedy_head, case) for case in HEADS}
    checks |= {f"kernel-step-{name}": (check_kernel_step_decode, name) for name in KERNEL_STEP_DECODES}
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


@pytest.mark.parametrize("case", list(GEMVS))
def test_gemv_kernel_matches_reference(interpreted, case):
    outcome(interpreted, f"gemv-{case}", check_gemv, case)


@pytest.mark.parametrize("case", list(ATTENTIONS))
def test_rope_cache_attention_kernel_matches_reference(interpreted, case):
    outcome(interpreted, f"rope-cache-attention-{case}", check_rope_cache_attention, case)


@pytest.mark.parametrize("case", list(HEADS))
def test_greedy_head_kernels_match_argmax(interpreted, case):
    outcome(interpreted, f"greedy-head-{case}", check_greedy_head, case)


@pytest.mark.parametrize("name", KERNEL_STEP_DECODES)
def test_kernel_step_decode_is_token_exact(interpreted, name):
    outcome(interpreted, f"kernel-step-{name}", check_kernel_step_decode, name)


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

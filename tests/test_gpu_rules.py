"""What runs on which GPU, with the GPU queries faked (no GPU here): bf16 only where it is native,
kvlab's Triton kernels from compute capability 8.0 (Ampere), programmatic dependent launch from 9.0
(Hopper); a T4 (7.5) gets float16 and the PyTorch form of the kernels. One rule,
``runtime.gpu_supports``, decides for every caller."""

from types import SimpleNamespace

import pytest
import torch

from kvlab import compiled_step, runtime
from kvlab.kernels import common, gemv

T4, A100, H200, BLACKWELL = (7, 5), (8, 0), (9, 0), (10, 0)
CUDA = torch.device("cuda")


@pytest.fixture
def gpu(monkeypatch):
    """``gpu(capability, bf16=...)``: make torch report one CUDA GPU of that compute capability."""

    def fake(capability, *, bf16=None):
        # asked once per GPU: forget the real answer
        monkeypatch.setattr(runtime, "_CAPABILITY", {})
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        native = capability >= (8, 0) if bf16 is None else bf16
        monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                            lambda including_emulation=True: native or including_emulation)
        monkeypatch.setattr(torch.cuda, "get_device_name",
                            lambda device=None: f"fake GPU sm{capability[0]}{capability[1]}")

    return fake


@pytest.mark.parametrize(("name", "dtype"), [
    ("bf16", torch.bfloat16), ("bfloat16", torch.bfloat16), ("torch.bfloat16", torch.bfloat16),
    ("BF16", torch.bfloat16),
    ("fp16", torch.float16), ("float16", torch.float16), ("half", torch.float16),
    ("fp32", torch.float32), ("float32", torch.float32), ("float", torch.float32),
    ("float64", torch.float64),
    (torch.float16, torch.float16),
])
def test_dtype_names(name, dtype):
    assert runtime.as_dtype(name) == dtype
    assert runtime.pick_dtype("cpu", name) == dtype


@pytest.mark.parametrize("name", ["bf32", "fp8", "cuda", ""])
def test_unknown_dtype_names_are_refused(name):
    with pytest.raises(ValueError, match="unknown dtype"):
        runtime.pick_dtype("cpu", name)


def test_a_t4_gets_float16_and_refuses_bf16_saying_what_to_use(gpu):
    gpu(T4)
    assert runtime.pick_dtype(CUDA) == torch.float16
    assert runtime.pick_dtype(CUDA, "fp16") == torch.float16
    assert runtime.pick_dtype(CUDA, torch.float32) == torch.float32
    for asked in ("bf16", "bfloat16", torch.bfloat16):
        with pytest.raises(ValueError, match=r"no native bfloat16.*dtype=torch\.float16"):
            runtime.pick_dtype(CUDA, asked)
    with pytest.raises(ValueError, match="float16"):
        # what compile_step and compiled_decoder(compile_mode=...) ask
        runtime.check_dtype("cuda:0", torch.bfloat16)
    runtime.check_dtype("cuda", torch.float16)
    # a CPU computes bf16 (slowly); not refused
    assert runtime.pick_dtype("cpu", "bf16") == torch.bfloat16


@pytest.mark.parametrize("capability", [A100, H200])
def test_ampere_and_newer_get_bf16(gpu, capability):
    gpu(capability)
    assert runtime.pick_dtype(CUDA) == torch.bfloat16
    assert runtime.pick_dtype(CUDA, "bf16") == torch.bfloat16


@pytest.mark.parametrize(("capability", "triton_kernels", "pdl"), [
    (T4, False, False), ((7, 0), False, False), (A100, True, False), ((8, 6), True, False),
    ((8, 9), True, False),
    (H200, True, True), (BLACKWELL, True, True), ((12, 0), True, True),
])
def test_the_capability_rule(gpu, capability, triton_kernels, pdl):
    gpu(capability)
    assert runtime.gpu_capability() == capability
    for device in ("cuda", "cuda:0", CUDA):
        assert runtime.gpu_supports(device, runtime.TRITON_KERNELS) is triton_kernels
        assert runtime.gpu_supports(device, runtime.PDL) is pdl
    assert not runtime.gpu_supports("cpu", runtime.TRITON_KERNELS)


def test_no_cuda_supports_nothing(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert runtime.gpu_capability() is None
    assert not runtime.gpu_supports("cuda", (1, 0))


def test_the_capability_is_asked_once_per_gpu(gpu, monkeypatch):
    gpu(H200)
    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_capability",
                        lambda device=None: asked.append(device) or H200)
    for _ in range(3):
        runtime.gpu_supports("cuda:0", runtime.PDL)
        runtime.gpu_supports("cuda:1", runtime.PDL)
    assert asked == [0, 1]


def test_the_rule_is_a_constant_under_torch_compile(monkeypatch):
    """graph-safe-compiled asks it inside its compiled step (fullgraph=True): it must not break the
    graph. Faked one level lower than the others, since dynamo itself calls
    torch.cuda.is_available."""
    capability = {"now": T4}
    monkeypatch.setattr(runtime, "gpu_capability", lambda index=None: capability["now"])

    def step(x):
        return x + 1 if runtime.gpu_supports(CUDA, runtime.TRITON_KERNELS) else x - 1

    for capability["now"], expected in ((T4, -1.0), (A100, 1.0)):
        torch._dynamo.reset()
        assert torch.compile(step, backend="eager",
                             fullgraph=True)(torch.zeros(2)).tolist() == [expected] * 2
    torch._dynamo.reset()


@pytest.mark.skipif(common.triton is None, reason="needs Triton (the course installs it on Linux)")
@pytest.mark.parametrize(("capability", "kernels"), [(T4, False), (A100, True), (H200, True)])
def test_triton_kernels_only_from_ampere(gpu, capability, kernels):
    """kvlab.kernels.common.available is what graph-safe-compiled's attention and every kernel of
    graph-safe-kernels ask: False on a T4, so the attention stays SDPA and the kernel step runs the
    PyTorch form of the same math."""
    gpu(capability)
    # only its device (and rows, for the GEMV) are looked at
    query = SimpleNamespace(device=CUDA, shape=(1, 64))
    assert common.available(query) is kernels
    assert gemv.uses_gemv_kernel(query) is kernels


@pytest.mark.parametrize(("capability", "expected"),
                         [(T4, False), (A100, False), (H200, True), (BLACKWELL, True)])
def test_pdl_only_from_hopper(gpu, capability, expected):
    gpu(capability)
    assert common.pdl(CUDA) is (expected and common.HAS_GDC and not common.INTERPRET)
    assert common.launch_options(CUDA) == ({"launch_pdl": True} if common.pdl(CUDA) else {})
    assert not common.pdl(torch.device("cpu"))


@pytest.mark.parametrize(("capability", "expected"), [(T4, False), (A100, False), (H200, True)])
def test_inductor_pdl_only_from_hopper(gpu, capability, expected):
    config = torch._inductor.config
    if not hasattr(config.triton, "enable_pdl"):
        pytest.skip("this torch's inductor has no enable_pdl")
    gpu(capability)
    before = config.triton.enable_pdl
    with compiled_step.inductor_options(True, CUDA):
        assert config.coordinate_descent_tuning
        assert config.triton.enable_pdl is (expected or before)
    assert config.triton.enable_pdl == before


@pytest.mark.parametrize(("capability", "says"), [
    (T4, ["compute capability 7.5", "dtype: float16", "bf16 is refused",
          "PyTorch form runs instead"]),
    (A100, ["compute capability 8.0", "dtype: bfloat16", "Triton kernels run", "launch needs 9.0"]),
    (H200, ["compute capability 9.0", "dtype: bfloat16", "Triton kernels run"]),
])
def test_runtime_summary_on_gpus(gpu, capability, says):
    gpu(capability)
    summary = runtime.runtime_summary("cuda")
    assert summary.count("\n") == 2 and f"GPU: fake GPU sm{capability[0]}{capability[1]}" in summary
    for words in says:
        assert words in summary, (words, summary)
    assert ("launch needs" in summary) is (capability == A100)


def test_runtime_summary_without_gpu_says_how_to_get_one():
    summary = runtime.runtime_summary("cpu")
    assert "Runtime > Change runtime type > T4 GPU" in summary and "dtype: float32" in summary
    assert f"torch {torch.__version__}" in summary


# ---- the T4 proxy: KVLAB_GPU_AS=t4 on a newer GPU ----

H100 = (9, 0)


def test_the_t4_proxy_answers_as_a_t4_on_an_h100(gpu, monkeypatch):
    """Every kvlab rule answers as a T4 would (float16, no Triton kernels, no PDL, 40
    multiprocessors, the name a number is recorded under) while torch still reports the real GPU."""
    gpu(H100)
    assert runtime.pick_dtype(CUDA) == torch.bfloat16 and runtime.gpu_supports(CUDA, runtime.PDL)
    monkeypatch.setenv(runtime.GPU_AS_ENV, "t4")
    assert torch.cuda.get_device_capability() == H100  # torch, inductor and Triton see the real GPU
    assert runtime.gpu_capability() == T4
    assert runtime.pick_dtype(CUDA) == torch.float16
    with pytest.raises(ValueError, match="float16"):
        runtime.pick_dtype(CUDA, "bf16")
    assert not runtime.gpu_supports(CUDA, runtime.TRITON_KERNELS)
    assert not runtime.gpu_supports(CUDA, runtime.PDL)
    assert runtime.multiprocessors(CUDA) == 40
    assert runtime.hardware(CUDA) == "fake GPU sm90 as a Tesla T4 (KVLAB_GPU_AS=t4)"
    summary = runtime.runtime_summary(CUDA)
    assert "compute capability 7.5" in summary and "PyTorch form runs instead" in summary
    monkeypatch.setenv(runtime.GPU_AS_ENV, " T4 ")  # case and spaces as a person types them
    assert runtime.gpu_capability() == T4
    monkeypatch.setenv(runtime.GPU_AS_ENV, "")
    assert runtime.gpu_capability() == H100 and runtime.hardware(CUDA) == "fake GPU sm90"


def test_the_proxy_is_recorded_in_the_environment(gpu, monkeypatch):
    gpu(H100)
    monkeypatch.setattr(runtime, "pick_device", lambda device=None: CUDA)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setenv(runtime.GPU_AS_ENV, "t4")
    env = runtime.environment(CUDA)
    assert env["gpu_as"] == "t4" and "as a Tesla T4" in env["hardware"]
    monkeypatch.delenv(runtime.GPU_AS_ENV)
    assert "gpu_as" not in runtime.environment(CUDA)


def test_an_unknown_proxy_is_refused_with_the_choices(gpu, monkeypatch):
    gpu(H100)
    monkeypatch.setenv(runtime.GPU_AS_ENV, "t5")
    with pytest.raises(ValueError, match=r"KVLAB_GPU_AS='t5'.*t4"):
        runtime.pick_dtype(CUDA)


def test_the_proxy_does_nothing_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv(runtime.GPU_AS_ENV, "t4")
    assert runtime.gpu_capability() is None and runtime.pick_dtype("cpu") == torch.float32


@pytest.mark.skipif(common.triton is None, reason="needs Triton (the course installs it on Linux)")
def test_under_the_proxy_the_kernels_take_their_pytorch_form(gpu, monkeypatch):
    gpu(H100)
    monkeypatch.setenv(runtime.GPU_AS_ENV, "t4")
    monkeypatch.setattr(common, "INTERPRET", False)
    query = SimpleNamespace(device=CUDA, shape=(1, 64))
    assert not common.available(query) and not gemv.uses_gemv_kernel(query)
    assert not common.pdl(CUDA)
    monkeypatch.delenv(runtime.GPU_AS_ENV)
    assert common.available(query) and common.pdl(CUDA) is common.HAS_GDC

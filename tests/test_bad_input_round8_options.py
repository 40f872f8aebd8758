"""Issue 48, probe round 8 (options): right inputs refused and wrong ones accepted by the options of
the strategies and their builders. NumPy and 0-dim tensor ints refused where every other count
takes them, ``build`` refusing the ``attention_mask=`` that ``state`` takes, ``graph=None`` meaning
the default in one speculative strategy and an error in the other, switches taking any truthy value
(an ablation timing the opposite of what was asked) and ``tiny_model``'s dtype and seed."""

import numpy as np
import pytest
import torch

import kvlab
from kvlab.graph_decoder import GraphSafeDecoder
from kvlab.graphs import CaptureError, capture
from kvlab.lab.models import tiny_model
from kvlab.strategies import STRATEGIES, check_options

INTS = {"numpy": np.int64, "0-dim tensor": torch.tensor}
INT_OPTIONS = [
    ("graph-safe", "prefill_bucket", 8, {"max_cache_len": 9}),
    ("graph-safe-speculative", "k", 3, {}),
    ("graph-safe-speculative", "prefill_bucket", 8, {"max_cache_len": 12}),
    ("graph-safe-speculative/kernels", "k", 3, {}),
    ("paged", "warmup", 1, {}),
]


@pytest.mark.parametrize("kind", INTS)
@pytest.mark.parametrize("strategy, option, value, extra", INT_OPTIONS)
def test_an_int_option_reads_numpy_and_tensor_ints(strategy, option, value, extra, kind, prompt):
    """prefill_bucket, the speculative k and the batcher's warmup were checked with isinstance int:
    np.int64(8) was refused ("prefill_bucket must be in [1, max_cache_len=9], got 8"), while
    max_cache_len, steps and max_new_tokens took it. A bool is still no count."""
    model, ids = tiny_model("tiny-llama"), prompt(5)
    with pytest.raises(ValueError, match=option):
        kvlab.decode(model, ids, 4, strategy=strategy, **{option: True}, **extra)
    got = kvlab.decode(model, ids, 4, strategy=strategy, **{option: INTS[kind](value)}, **extra)
    assert torch.equal(got, kvlab.decode(model, ids, 4))


def _paged_allocator(n):
    from kvlab.paged_cache import BlockAllocator

    return BlockAllocator(n).allocate(n)


def _paged_cache(n):
    from kvlab.paged_cache import PagedKVCache

    return PagedKVCache(tiny_model("tiny-llama").config, num_blocks=n, block_size=n,
                        max_blocks_per_request=n).max_len


def _accounting(n):
    from kvlab.paged_cache import memory_accounting

    return memory_accounting([3, 5], n, 10)


def _capture(n):
    buffer = torch.zeros(1)
    capture(lambda t: t.add_(1), buffer, warmup=n, emulate=True).replay()
    return buffer.item()


def _flops(n):
    from kvlab.sizes import flops_breakdown, kv_cache_bytes

    config = tiny_model("tiny-llama").config
    return flops_breakdown(config, n, n, batch=n), kv_cache_bytes(config, n, torch.float32, batch=n)


def _recorder(n):
    from kvlab.cache_view import CacheRecorder
    from kvlab.graph_safe_cache import GraphSafeStaticCache

    cache = GraphSafeStaticCache(config=tiny_model("tiny-llama").config, max_cache_len=8)
    return CacheRecorder(cache, layers=(n - 2, n - 1)).layers


def _bench(n):
    from kvlab.lab import bench

    return bench.check_settings(n, n, [n], ["naive"], n, n, n)


def _serving(n):
    from kvlab.lab.serving import arriving_requests

    return [(r.prompt.tolist(), r.max_new_tokens, r.arrival)
            for r in arriving_requests(n, 256, prompt_lens=(n, n), new_tokens=(n, n))]


def _timing(n):
    from kvlab.lab.measure import count

    return count("repeats", n, 1)


LIBRARY = {"BlockAllocator": _paged_allocator, "PagedKVCache": _paged_cache,
           "memory_accounting's block_size": _accounting, "capture's warmup": _capture,
           "flops_breakdown and kv_cache_bytes": _flops, "CacheRecorder's layers": _recorder,
           "bench.check_settings": _bench, "arriving_requests' ranges": _serving,
           "measure's counts": _timing}


@pytest.mark.parametrize("kind", INTS)
@pytest.mark.parametrize("where", LIBRARY)
def test_the_library_counts_read_numpy_and_tensor_ints(where, kind):
    """The same isinstance-int checks in the paged cache, capture, the size arithmetic, the
    recorder, the bench's settings and the lab's timing helpers refused np.int64(2) or
    torch.tensor(2) (measure's count took NumPy but no tensor)."""
    assert LIBRARY[where](INTS[kind](2)) == LIBRARY[where](2)


def test_the_bench_settings_come_back_as_python_ints():
    """check_settings passed the caller's np.int64 on into the record, which json cannot write."""
    from kvlab.lab import bench

    read = bench.check_settings(*(np.int64(4),) * 2, [np.int64(1)], ["naive"],
                                *(np.int64(2),) * 3)
    assert read == (4, 4, [1], 2, 2, 2)
    assert all(type(v) is int for v in [*read[:2], *read[2], *read[3:]])


BUILT = ["graph-safe", "graph-safe-speculative", "graph-safe-kernels", "paged"]


@pytest.mark.parametrize("strategy", BUILT)
def test_build_takes_an_attention_mask_as_state_does(strategy, prompt):
    """STRATEGIES[s].build(m, ids, n, attention_mask=...) was refused ("takes no attention_mask=")
    although kvlab.decode and .state take it and build's docstring says it checks its inputs as
    kvlab.decode does. A mask with padding is refused by both, with the same message."""
    model, ids = tiny_model("tiny-llama"), prompt(5)
    chosen = STRATEGIES[strategy]
    assert chosen.build(model, ids, 4, attention_mask=torch.ones_like(ids)) is not None
    padded = torch.ones_like(ids)
    padded[0, 0] = 0
    with pytest.raises(ValueError) as by_state:
        chosen.state(model, ids, 4, attention_mask=padded)
    with pytest.raises(ValueError) as by_build:
        chosen.build(model, ids, 4, attention_mask=padded)
    assert str(by_build.value) == str(by_state.value)


@pytest.mark.parametrize("strategy", ["graph-safe-speculative", "graph-safe-speculative/kernels"])
def test_graph_none_is_the_default_for_both_speculative_strategies(strategy, prompt):
    """graph=None was graph-safe-speculative's default (decode_speculative drops it) but refused by
    its own state and by graph-safe-speculative/kernels ("graph must be True, False or 'emulate',
    got None")."""
    model, ids = tiny_model("tiny-llama"), prompt(5)
    assert torch.equal(kvlab.decode(model, ids, 4, strategy=strategy, graph=None),
                       kvlab.decode(model, ids, 4))
    decoder = STRATEGIES[strategy].state(model, ids, 4, graph=None)["decoder"]
    assert decoder.use_graph


SWITCHES = [("graph-safe-kernels", "tiles", "no"), ("graph-safe-kernels", "dot_attention", 0),
            ("graph-safe-kernels", "captured_prefill", None),
            ("graph-safe-kernels", "fill_splits", "False"), ("graph-safe-compiled", "fuse", 1),
            ("graph-safe-compiled", "gemv", "yes"), ("graph-safe-compiled", "tune", 0)]


@pytest.mark.parametrize("strategy, switch, value", SWITCHES)
def test_a_switch_that_is_not_a_bool_is_refused(strategy, switch, value, prompt):
    """The kernels' and the fused copy's switches took any value as its truth: tiles="no" ran the
    tiles, dot_attention=0 broadcast, and an ablation timed the opposite of what was asked."""
    model, ids = tiny_model("tiny-llama"), prompt(5)
    message = f"{switch} must be True or False, got {value!r}"
    with pytest.raises(ValueError, match=message):
        kvlab.decode(model, ids, 4, strategy=strategy, **{switch: value})
    if switch != "tune":  # a decode's keyword, no builder's
        with pytest.raises(ValueError, match=message):
            STRATEGIES[strategy].state(model, ids, 4, **{switch: value})


def test_the_declared_switches_still_pass(prompt):
    """The ablations fix their switches in options (MappingProxyType({"tiles": False})): the new
    check must take them, and the variant still decodes the naive tokens."""
    for strategy in STRATEGIES.values():
        check_options(dict(strategy.options))
    model, ids = tiny_model("tiny-llama"), prompt(5)
    assert torch.equal(kvlab.decode(model, ids, 4, strategy="graph-safe-kernels/row-gemv"),
                       kvlab.decode(model, ids, 4))


def test_graph_and_emulate_take_bools_only():
    """ContinuousBatcher's emulate="no" forced the emulation on a GPU, capture's too; and
    GraphSafeDecoder's graph=0 passed as False (0 == False) but captured (`graph is not False`)."""
    from kvlab.continuous_batching import ContinuousBatcher

    model = tiny_model("tiny-llama")
    with pytest.raises(ValueError, match="emulate must be True, False or None, got 'no'"):
        ContinuousBatcher(model, num_blocks=4, emulate="no")
    with pytest.raises(ValueError, match="graph must be True, False or .emulate., got 1"):
        ContinuousBatcher(model, num_blocks=4, graph=1)
    with pytest.raises(CaptureError, match="emulate must be True, False or None, got 'no'"):
        capture(lambda t: t.add_(1), torch.zeros(1), emulate="no")
    with pytest.raises(ValueError, match="graph must be True, False or 'emulate', got 0"):
        GraphSafeDecoder(model, 16, graph=0)
    assert GraphSafeDecoder(model, 16, graph="".join(["emu", "late"])).emulate


def test_tiny_model_takes_dtype_none_and_refuses_what_it_cannot_build():
    """tiny_model(name, dtype=None) was refused ("unknown dtype None") though load_model's default
    is None; seed=2**70 failed with "Overflow when unpacking long long" and dtype="float8_e4m3fn"
    with "couldn't find storage object Float8_e4m3fnStorage"."""
    default = tiny_model("tiny-llama", dtype=None)
    assert next(default.parameters()).dtype == torch.float32
    plain = tiny_model("tiny-llama").parameters()
    assert all(torch.equal(a, b) for a, b in zip(default.parameters(), plain, strict=True))
    for seed in (2**70, 2**64, -2**63 - 1):
        with pytest.raises(ValueError, match="seed must fit in 64 bits"):
            tiny_model("tiny-llama", seed=seed)
    tiny_model("tiny-llama", seed=2**64 - 1)
    for dtype in ("float8_e4m3fn", torch.int32):
        with pytest.raises(ValueError, match="cannot hold the course's weights: use float32"):
            tiny_model("tiny-llama", dtype=dtype)

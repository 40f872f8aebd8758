"""kvlab.paged_cache and kvlab.continuous_batching: a paged KV cache, its block allocator, and
continuous batching decoded by captured graphs (emulated on CPU), token-exact with each request
decoded on its own."""

import pytest
import torch

import kvlab
from kvlab.continuous_batching import (
    ContinuousBatcher,
    Request,
    decode_paged,
    default_buckets,
    serve,
)
from kvlab.paged_cache import (
    BlockAllocator,
    OutOfBlocksError,
    PagedCacheError,
    PagedKVCache,
    bytes_per_token,
    memory_accounting,
    paged_mask,
)

# (prompt_len, max_new_tokens, arrival step): different lengths, joining at different steps, one
# that wants a single token (it leaves right after its prefill), 3 rows at once (padded up to the
# bucket of 4).
TRAFFIC = [(5, 7, 0), (9, 3, 0), (3, 10, 2), (12, 6, 4), (4, 1, 5), (7, 8, 9)]


def requests(traffic=TRAFFIC, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [Request(torch.randint(1, 256, (p,), generator=gen), n, a) for p, n, a in traffic]


def assert_each_request_exact(model, reqs, served):
    for i, (req, tokens) in enumerate(zip(reqs, served.tokens, strict=True)):
        alone = kvlab.decode(model, req.prompt[None], req.max_new_tokens)[0]  # naive, one sequence
        assert torch.equal(tokens, alone), (
            f"request {i} (prompt {req.prompt.shape[0]}, arrival {req.arrival})")


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-mistral"])
def test_requests_joining_and_leaving_are_token_exact(name):
    model = kvlab.tiny_model(name)
    reqs = requests()
    batcher = ContinuousBatcher(model, num_blocks=16, block_size=4, max_batch=4,
                                max_blocks_per_request=6)
    served = batcher.serve(reqs)
    assert_each_request_exact(model, reqs, served)
    steps = served.timeline
    joined_at = sorted({s["step"] for s in steps if s["joined"]})
    # joins at several steps, leaves mid-run
    assert len(joined_at) >= 3 and any(s["left"] for s in steps[:-1])
    assert (any(s["rows"] > 1 for s in steps)
            and any(s["bucket"] and s["bucket"] > s["rows"] for s in steps))
    used = {s["bucket"] for s in steps if s["bucket"]}
    # one graph per bucket
    assert set(batcher.graphs) == used and all(g.emulated for g in batcher.graphs.values())
    assert sum(g.replays for g in batcher.graphs.values()) == sum(1 for s in steps if s["rows"])
    assert batcher.allocator.num_used == 0  # every block went back


def test_a_held_batcher_replays_its_graphs_for_new_requests():
    model = kvlab.tiny_model("tiny-llama")
    batcher = ContinuousBatcher(model, num_blocks=12, block_size=4, max_batch=2,
                                max_blocks_per_request=6)
    first = requests([(6, 5, 0), (3, 8, 1)], seed=1)
    assert_each_request_exact(model, first, batcher.serve(first))
    graphs = dict(batcher.graphs)
    # more requests than rows: one waits
    second = requests([(10, 6, 0), (2, 9, 0), (5, 4, 3)], seed=2)
    assert_each_request_exact(model, second, batcher.serve(second))
    assert all(batcher.graphs[b] is g for b, g in graphs.items())  # nothing captured again


def test_a_small_pool_makes_requests_wait_and_reuses_freed_blocks():
    model = kvlab.tiny_model("tiny-qwen2")
    reqs = requests([(6, 6, 0), (7, 5, 0), (5, 6, 0), (8, 4, 1)], seed=3)
    # room for two requests at a time
    batcher = ContinuousBatcher(model, num_blocks=6, block_size=4, max_batch=4)
    served = batcher.serve(reqs)
    assert_each_request_exact(model, reqs, served)
    assert max(s["blocks_used"] for s in served.timeline) <= 6
    # the pool, not the rows, held the others back
    assert max(s["rows"] for s in served.timeline) == 2
    assert sum(len(s["joined"]) for s in served.timeline) == 4 and batcher.allocator.num_used == 0


def test_decode_paged_is_a_strategy_with_a_reusable_batcher():
    model = kvlab.tiny_model("tiny-llama")
    ids = torch.randint(1, 256, (3, 6), generator=torch.Generator().manual_seed(4))
    state = kvlab.STRATEGIES["paged"].state(model, ids, 7, max_cache_len=16)
    seen = []
    out = kvlab.decode(model, ids, 7, strategy="paged", on_token=lambda k, t: seen.append((k, t)),
                       **state)
    assert torch.equal(out, kvlab.decode(model, ids, 7)) and [k for k, _ in seen] == list(range(7))
    assert torch.equal(torch.cat([t for _, t in seen], 1), out)
    assert torch.equal(decode_paged(model, ids, 7, **state), out)  # replayed
    with pytest.raises(ValueError, match="pass batcher= or block_size=, not both"):
        decode_paged(model, ids, 7, block_size=8, **state)
    with pytest.raises(PagedCacheError, match="built for another model"):
        decode_paged(kvlab.tiny_model("tiny-llama"), ids, 7, **state)


def test_the_allocator_frees_reuses_and_refuses_clearly():
    pool = BlockAllocator(4)
    a = pool.allocate(3)
    assert a == [0, 1, 2] and (pool.num_free, pool.num_used) == (1, 3)
    with pytest.raises(OutOfBlocksError, match=r"asked for 2 block\(s\) but only 1 of 4 are free"):
        pool.allocate(2)
    assert pool.num_free == 1  # a refused request takes nothing
    pool.free(a[:2])
    assert sorted(pool.allocate(3)) == [0, 1, 3]  # freed blocks are handed out again
    with pytest.raises(PagedCacheError, match="not in use"):
        pool.free([2, 2])


def test_a_request_that_cannot_fit_is_refused_before_anything_runs():
    model = kvlab.tiny_model("tiny-llama")
    batcher = ContinuousBatcher(model, num_blocks=4, block_size=4, max_batch=2,
                                max_blocks_per_request=3)
    with pytest.raises(PagedCacheError, match="needs 14 slots.*may hold 12 slots"):
        batcher.serve(requests([(10, 5, 0)]))
    with pytest.raises(ValueError, match="1-D LongTensor"):
        batcher.serve([Request(torch.ones(1, 4, dtype=torch.long), 2)])
    assert batcher.graphs == {} and batcher.allocator.num_used == 0
    with pytest.raises(ValueError, match="largest is max_batch"):
        ContinuousBatcher(model, num_blocks=4, max_batch=4, buckets=[1, 2])
    assert default_buckets(8) == [1, 2, 4, 8] and default_buckets(6) == [1, 2, 4, 6]


def test_the_trash_slot_absorbs_a_padding_row():
    model = kvlab.tiny_model("tiny-llama")
    cache = PagedKVCache(model.config, num_blocks=4, block_size=4, max_blocks_per_request=2)
    for layer in cache.layers:
        layer.keys.normal_()
        layer.values.normal_()
    before = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
    table = torch.tensor([[2, 1], [0, 0]])  # row 0 holds blocks 2, 1; row 1 is padding
    # row 0 writes its position 5 (block 1, offset 1)
    slots = torch.tensor([[1 * 4 + 1], [cache.trash_slot]])
    seq_lens, positions = torch.tensor([6, 1]), torch.tensor([[5], [0]])
    with torch.inference_mode(), cache.reading(table, slots):
        logits = model(input_ids=torch.tensor([[7], [9]]), position_ids=positions, cache=cache,
                       attention_mask=paged_mask(seq_lens, 1, cache.max_len)).logits
    assert torch.isfinite(logits).all()
    for layer, (keys, values) in zip(cache.layers, before, strict=True):
        for now, then in ((layer.keys, keys), (layer.values, values)):
            changed = (now != then).flatten(1).any(1).nonzero().flatten().tolist()
            # row 0's slot, and the trash slot: nothing else
            assert changed == [5, cache.trash_slot]
    with pytest.raises(PagedCacheError, match="outside `with cache.reading"):
        model(input_ids=torch.tensor([[7]]), position_ids=torch.tensor([[0]]), cache=cache,
              attention_mask=paged_mask(torch.tensor([1]), 1, cache.max_len))


def test_the_mask_sees_each_rows_own_length():
    mask = paged_mask(torch.tensor([3, 1]), 1, 5)  # [batch, 1, T, max_len]
    assert mask.shape == (2, 1, 1, 5)
    assert mask[:, 0, 0].tolist() == [[True, True, True, False, False],
                                      [True, False, False, False, False]]
    prefill = paged_mask(torch.tensor([3]), 3, 4)[0, 0]  # a 3-token prompt: causal
    assert prefill.tolist() == [[True, False, False, False], [True, True, False, False],
                                [True, True, True, False]]


def test_static_buffers_and_pools_keep_their_addresses_across_steps():
    model = kvlab.tiny_model("tiny-llama")
    batcher = ContinuousBatcher(model, num_blocks=16, block_size=4, max_batch=4,
                                max_blocks_per_request=6)

    def addresses():
        return (batcher.tokens.data_ptr(), batcher.step_inputs.data_ptr(),
                batcher.cache.pool_addresses())

    start, seen = addresses(), []
    served = batcher.serve(requests(), on_token=lambda i, k, t: seen.append(addresses()))
    assert seen and all(a == start for a in seen)
    for graph in batcher.graphs.values():  # each graph reads the one token buffer, where it lives
        assert graph.static_inputs[0].data_ptr() == batcher.tokens.data_ptr()
    with pytest.raises(TypeError, match="cannot be pickled"):
        import copy
        copy.deepcopy(batcher)
    assert served.tokens and all(t.dtype == torch.long for t in served.tokens)


def test_memory_accounting_counts_blocks_against_a_static_cache():
    numbers = memory_accounting([5, 17, 32], block_size=16, token_bytes=10)
    assert numbers == {"per_request": [160, 320, 320], "paged": 800, "static": 960,
                       "paged_fraction": 800 / 960}
    assert memory_accounting([5, 17], 16, 10, batch=4)["static"] == 4 * 17 * 10
    model = kvlab.tiny_model("tiny-llama")  # 2 layers x 2 kv heads x head_dim 16, K and V, float32
    assert bytes_per_token(model.config) == 2 * 2 * 2 * 16 * 4
    reqs = requests([(5, 4, 0), (14, 3, 0)], seed=5)
    served = serve(model, reqs, num_blocks=8, block_size=4, max_batch=2)
    block = 4 * bytes_per_token(model.config)
    assert [s["paged_bytes"] for s in served.timeline] == [
        s["blocks_used"] * block for s in served.timeline]
    # ceil(6 / 4) + ceil(15 / 4): blocks as the rows grew
    assert served.timeline[0]["blocks_used"] == 2 + 4
    # 2 rows of the longest (14 + 3 - 1)
    assert served.static_bytes == 2 * 16 * bytes_per_token(model.config)


# ---- bad input and interrupted serves (issue 48) ----

class Stop(Exception):
    pass


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, Stop])
def test_an_interrupted_serve_frees_its_blocks_and_the_next_serve_runs(interrupt):
    model = kvlab.tiny_model("tiny-llama")
    # room for two requests at a time
    batcher = ContinuousBatcher(model, num_blocks=6, block_size=4, max_batch=2)
    reqs = requests([(6, 6, 0), (7, 5, 0), (5, 6, 1)], seed=5)

    def on_token(index, k, token):
        if k == 2:
            raise interrupt

    with pytest.raises(interrupt):
        batcher.serve(reqs, on_token=on_token)
    assert batcher.allocator.num_used == 0 and batcher.allocator.num_free == 6
    assert_each_request_exact(model, reqs, batcher.serve(reqs))


def test_admission_counts_free_blocks_not_the_pool():
    model = kvlab.tiny_model("tiny-llama")
    batcher = ContinuousBatcher(model, num_blocks=6, block_size=4, max_batch=2)
    taken = batcher.allocator.allocate(4)  # held outside serve: 2 free
    with pytest.raises(OutOfBlocksError,
                       match="needs 3 blocks but only 2 of the pool's 6 are free"):
        batcher.serve(requests([(6, 6, 0)], seed=6))
    batcher.allocator.free(taken)
    reqs = requests([(6, 6, 0), (7, 5, 0)], seed=6)
    assert_each_request_exact(model, reqs, batcher.serve(reqs))


def test_a_far_arrival_is_skipped_to_not_stepped_through():
    import time

    model = kvlab.tiny_model("tiny-llama")
    batcher = ContinuousBatcher(model, num_blocks=8, block_size=4, max_batch=2)
    now = int(time.time())
    gen = torch.Generator().manual_seed(7)
    reqs = [Request(torch.randint(1, 256, (5,), generator=gen), 3, arrival=now),
            Request(torch.randint(1, 256, (4,), generator=gen), 2, arrival=now + 10**6)]
    start = time.perf_counter()
    served = batcher.serve(reqs)
    assert time.perf_counter() - start < 30
    assert_each_request_exact(model, reqs, served)
    assert len(served.timeline) <= 6 and served.timeline[0]["step"] == now
    assert served.timeline[-1]["step"] >= now + 10**6
    with pytest.raises(ValueError, match="arrival must be a scheduler step number"):
        batcher.serve([Request(reqs[0].prompt, 2, arrival=1.5)])
    import numpy as np
    # NumPy ints are step numbers too
    served = batcher.serve([Request(reqs[0].prompt, 2, arrival=np.int64(3))])
    assert served.timeline[0]["step"] == 3


def test_batcher_keywords_are_refused_by_the_callers_names():
    model = kvlab.tiny_model("tiny-llama")
    ids = torch.randint(1, 256, (2, 5), generator=torch.Generator().manual_seed(8))
    with pytest.raises(TypeError, match=r"sets max_batch= itself"):
        kvlab.STRATEGIES["paged"].state(model, ids, 4, max_batch=4)
    with pytest.raises(TypeError,
                       match=r"unknown keyword blok_size=; it takes max_cache_len=, block_size="):
        kvlab.STRATEGIES["paged"].state(model, ids, 4, blok_size=4)
    with pytest.raises(TypeError, match=r"serve got unknown keyword max_bach="):
        serve(model, requests([(5, 3, 0)]), num_blocks=4, max_bach=2)
    with pytest.raises(TypeError, match="batcher= takes a kvlab ContinuousBatcher"):
        decode_paged(model, ids, 4, batcher="mine")


@pytest.mark.parametrize("settings, message", [
    ({"block_size": 0}, r"block_size must be a positive int, got 0"),
    ({"block_size": 2.5}, r"block_size must be a positive int, got 2.5"),
    ({"max_cache_len": 0}, r"max_cache_len must be a positive int, got 0"),
    ({"max_cache_len": 5}, r"max_cache_len=5 is too short .* Pass max_cache_len >= 8"),
])
def test_the_paged_strategy_names_the_setting_the_caller_passed(settings, message):
    model = kvlab.tiny_model("tiny-llama")
    ids = torch.randint(1, 256, (2, 5), generator=torch.Generator().manual_seed(9))
    with pytest.raises(ValueError, match=message):
        kvlab.decode(model, ids, 4, strategy="paged", **settings)


@pytest.mark.parametrize("settings, message", [
    ({"num_blocks": 0}, "num_blocks must be a positive int, got 0"),
    ({"num_blocks": 4, "block_size": 0}, "block_size must be a positive int, got 0"),
    ({"num_blocks": 4, "max_blocks_per_request": -1},
     "max_blocks_per_request must be a positive int"),
    ({"num_blocks": 4, "buckets": [0, 8]}, "each of buckets must be a positive int, got 0"),
    ({"num_blocks": 4, "warmup": -1}, "warmup must be a non-negative int"),
])
def test_batcher_settings_are_checked_at_the_door(settings, message):
    with pytest.raises(ValueError, match=message):
        ContinuousBatcher(kvlab.tiny_model("tiny-llama"), **settings)


def test_reading_refuses_block_and_slot_ids_out_of_range():
    cache = PagedKVCache(kvlab.tiny_model("tiny-llama").config, num_blocks=4, block_size=2,
                         max_blocks_per_request=2)
    good_table, good_slots = torch.tensor([[0, 3]]), torch.tensor([[cache.trash_slot]])
    with cache.reading(good_table, good_slots):
        pass
    for table, slots, message in [
        (torch.tensor([[0, 4]]), good_slots,
         r"block_table holds ids 0 .. 4, but this cache's block ids run 0 .. 3"),
        (torch.tensor([[-1, 0]]), good_slots, r"block_table holds ids -1 .. 0"),
        (good_table, torch.tensor([[cache.trash_slot + 1]]),
         r"slot_mapping holds ids 9 .. 9, .* run 0 .. 8"),
    ]:
        with pytest.raises(PagedCacheError, match=message), cache.reading(table, slots):
            pass


def test_allocator_and_accounting_refuse_nonsense_counts():
    pool = BlockAllocator(4)
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="allocate takes a number of blocks"):
            pool.allocate(bad)
    assert pool.num_free == 4 and pool.allocate(0) == []
    with pytest.raises(ValueError, match="block_size must be a positive int, got 0"):
        memory_accounting([3, 5], 0, 8)
    with pytest.raises(ValueError, match="lengths are tokens in the cache"):
        memory_accounting([3, -5], 4, 8)

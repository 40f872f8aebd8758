"""kvlab.flops: the per-pass FLOP formula against torch's own FLOP counter, and its decode-step series."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from kvlab.flops import decode_step_flops, flops_breakdown, forward_flops
from kvlab.models import TINY_CONFIGS, tiny_model


def counted_flops(model, input_ids, **kw) -> int:
    """FLOPs torch's FlopCounterMode records for one forward pass (matmuls; eager attention's too)."""
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        model(input_ids, **kw)
    return counter.get_total_flops()


@pytest.mark.parametrize("name", sorted(TINY_CONFIGS))
def test_matmul_parts_match_torch_counter(name):
    """sdpa on CPU is not counted by FlopCounterMode, so the projections + MLP + lm_head must match exactly."""
    model = tiny_model(name)
    ids = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(0))
    parts = flops_breakdown(model.config, 7, batch=2)
    assert counted_flops(model, ids, use_cache=False) == parts["projections"] + parts["mlp"] + parts["lm_head"]


def test_full_rectangle_attention_matches_eager_counter():
    """Eager attention multiplies the whole q x ctx rectangle: causal=False must match the counter exactly."""
    model = tiny_model("tiny-llama")
    model.config._attn_implementation = "eager"
    ids = torch.randint(0, 256, (1, 9), generator=torch.Generator().manual_seed(1))
    assert counted_flops(model, ids, use_cache=False) == forward_flops(model.config, 9, causal=False)


def test_cached_pass_matches_counter():
    """One token after 9 cached ones: the eager counter sees 1 x 10 attention pairs, as the formula says."""
    from kvlab.handwritten import HandwrittenCache

    model = tiny_model("tiny-llama")
    model.config._attn_implementation = "eager"
    ids = torch.randint(0, 256, (1, 10), generator=torch.Generator().manual_seed(2))
    cache = HandwrittenCache()
    with torch.inference_mode():
        model(ids[:, :9], cache=cache)
    assert counted_flops(model, ids[:, 9:], cache=cache) == forward_flops(model.config, 1, past=9)


def test_causal_pairs_and_parts():
    cfg = tiny_model("tiny-llama").config
    full, causal = flops_breakdown(cfg, 8, causal=False), flops_breakdown(cfg, 8)
    # 8 queries over 8 keys: 64 pairs in the rectangle, 1 + 2 + ... + 8 = 36 under the causal mask
    assert causal["attention"] * 64 == full["attention"] * 36
    assert {k: v for k, v in causal.items() if k != "attention"} == {k: v for k, v in full.items() if k != "attention"}
    assert flops_breakdown(cfg, 8, logits="last")["lm_head"] * 8 == causal["lm_head"]
    assert forward_flops(cfg, 3, batch=4) == 4 * forward_flops(cfg, 3)


def test_naive_steps_grow_and_cached_steps_stay_flat():
    cfg = tiny_model("tiny-llama").config
    naive = decode_step_flops(cfg, 5, 6, cached=False)
    cached = decode_step_flops(cfg, 5, 6, cached=True)
    assert naive[0] == cached[0] == forward_flops(cfg, 5)  # both start by reading the prompt
    assert all(b > a for a, b in zip(naive, naive[1:], strict=False))
    assert naive[3] == forward_flops(cfg, 8)
    assert cached[3] == forward_flops(cfg, 1, past=7)
    # a cached step only adds attention over one more key
    assert cached[4] - cached[3] == flops_breakdown(cfg, 1, 8)["attention"] - flops_breakdown(cfg, 1, 7)["attention"]


@pytest.mark.parametrize(
    "kw", [dict(new_tokens=0), dict(new_tokens=2.0), dict(past=-1), dict(batch=0), dict(logits="first"), dict(new_tokens=True)]
)
def test_bad_arguments_raise(kw):
    cfg = tiny_model("tiny-llama").config
    args = dict(new_tokens=3, past=0) | kw
    with pytest.raises(ValueError):
        flops_breakdown(cfg, args.pop("new_tokens"), **args)


def test_bad_decode_arguments_raise():
    cfg = tiny_model("tiny-llama").config
    with pytest.raises(ValueError, match="prompt_len"):
        decode_step_flops(cfg, 0, 3, cached=True)
    with pytest.raises(ValueError, match="new_tokens"):
        decode_step_flops(cfg, 3, 0, cached=False)

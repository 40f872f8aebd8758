"""Round 16 of the hostile-user probe, exercise checkers: a bfloat16 tolerance that passed a wrong
attention scale, record= read inside the checked region, bench rows without a key, and
kept_drafts in uint8."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from kvlab.exercises import lesson02

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _attention(*, scale=1.0, root=True, causal=True):
    """softmax(q * scale @ keys.T / sqrt(d)) @ values, with the root or the mask left out."""
    def attend(q, keys, values):
        T, S, d = q.shape[0], keys.shape[0], q.shape[-1]
        scores = (q * scale) @ keys.T / (math.sqrt(d) if root else 1)
        if causal:
            scores = scores.masked_fill(~torch.ones(T, S, dtype=torch.bool).tril(S - T),
                                        float("-inf"))
        return torch.softmax(scores, dim=-1) @ values
    return attend


def _sdpa(q, keys, values):
    T, S = q.shape[0], keys.shape[0]
    mask = torch.ones(T, S, dtype=torch.bool).tril(S - T)
    return F.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=mask)[0]


def _in(fn, dtype, *, via=None):
    """``fn`` on the inputs cast to ``dtype`` (or computed in ``via`` and the output cast)."""
    def attend(q, keys, values):
        work = via or dtype
        return fn(q.to(work), keys.to(work), values.to(work)).to(dtype)
    return attend


@pytest.mark.parametrize("dtype", DTYPES)
def test_attend_wrong_scale_fails_in_every_dtype(dtype):
    """In bfloat16 the tolerance was 4 epsilons, so an attention with 1/sqrt(d) off by 5% (or 10%)
    was called correct."""
    for wrong in (_attention(scale=1.05), _attention(scale=0.95), _attention(scale=1.1),
                  _attention(root=False), _attention(causal=False)):
        verdict = lesson02.check_attend(_in(wrong, dtype))
        assert verdict.startswith("not quite"), (dtype, verdict)


@pytest.mark.parametrize("dtype", DTYPES)
def test_attend_right_attention_passes_in_every_dtype(dtype):
    """A right attention, computed in the dtype or in float32 and cast, stays correct."""
    for right in (_in(_attention(), dtype), _in(_sdpa, dtype), _in(lesson02.attend, dtype),
                  _in(_attention(), dtype, via=torch.float32),
                  _in(_sdpa, dtype, via=torch.float64)):
        verdict = lesson02.check_attend(right)
        assert verdict.startswith("correct"), (dtype, verdict)


"""Probe round 18 and the leftovers of round 17: results that a run recorded without checking."""

import pytest
import torch

import kvlab
from kvlab.lab import serving
from kvlab.speculative import SpeculativeDecoder

PAIR = {"graph-safe-speculative": "graph-safe"}


@pytest.fixture(scope="module")
def model():
    return kvlab.tiny_model("tiny-llama")


@pytest.fixture(scope="module")
def ids():
    return torch.randint(1, 256, (1, 8), generator=torch.Generator().manual_seed(0))


@pytest.fixture
def wrong_after_first_call(monkeypatch):
    """SpeculativeDecoder.generate right on each decoder's first call, one token off after."""
    calls = {}
    generate = SpeculativeDecoder.generate

    def drifting(self, *args, **kwargs):
        out = generate(self, *args, **kwargs)
        calls[id(self)] = calls.get(id(self), 0) + 1
        return out if calls[id(self)] == 1 else torch.cat([out[:, :-1], out[:, -1:] + 1], 1)

    monkeypatch.setattr(SpeculativeDecoder, "generate", drifting)


def test_speculation_runs_checks_the_timed_calls_tokens(model, ids, wrong_after_first_call):
    """speculation_runs compared the tokens of one untimed call per path; a held decoder whose
    timed calls made other tokens was recorded exact."""
    run = serving.speculation_runs(model, {"p": ids}, 6, rounds=2, k=2, pairs=PAIR)["runs"][0]
    assert run["exact"] == {"graph-safe": True, "graph-safe-speculative": False}


def test_speculation_runs_calls_a_steady_decoder_exact(model, ids):
    run = serving.speculation_runs(model, {"p": ids}, 6, rounds=2, k=2, pairs=PAIR)["runs"][0]
    assert run["exact"] == {"graph-safe": True, "graph-safe-speculative": True}


def test_k_sweep_checks_the_timed_calls_tokens(model, ids, wrong_after_first_call):
    """k_sweep compared one untimed call per draft length; timed calls making other tokens were
    recorded exact."""
    rows = serving.k_sweep(model, ids, 6, ks=(1, 2), rounds=2)["rows"]
    assert [row["exact"] for row in rows] == [False, False]


def test_k_sweep_calls_steady_decoders_exact(model, ids):
    rows = serving.k_sweep(model, ids, 6, ks=(1, 2), rounds=2)["rows"]
    assert [row["exact"] for row in rows] == [True, True]

"""Probe round 18 and the leftovers of round 17: results that a run recorded without checking."""

import pytest
import torch

import kvlab
from kvlab.graph_safe_cache import GraphSafeError
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


class Stop(Exception):
    pass


def stop(step, token):
    raise Stop


@pytest.mark.parametrize("strategy", ["static", "graph-safe", "graph-safe-speculative"])
@pytest.mark.parametrize("how", ["stopped before capture", "graph=False"])
def test_a_live_decoders_cache_is_refused_to_another_decode(model, strategy, how):
    """static took the cache of a live GraphSafeDecoder that had not captured yet (graph=False,
    or stopped before its first capture): it wrote another prompt there, and the decoder's next
    decode_steps continued that prompt's sequence without an error."""
    from kvlab.graph_decoder import GraphSafeDecoder
    from kvlab.graph_safe_cache import GraphSafeStaticCache

    gen = torch.Generator().manual_seed(17)
    p = torch.randint(0, 256, (1, 9), generator=gen)
    q = torch.randint(0, 256, (1, 5), generator=gen)
    cache = GraphSafeStaticCache(config=model.config, max_cache_len=30)
    decoder = GraphSafeDecoder(model, cache, 1, graph=how != "graph=False")
    with pytest.raises(Stop):
        decoder.generate(p, 6, on_token=stop)
    with pytest.raises((ValueError, RuntimeError), match="belongs to"):
        kvlab.decode(model, q, 4, strategy=strategy, cache=cache)
    assert torch.equal(decoder.generate(p, 6), kvlab.decode(model, p, 6))


@pytest.mark.parametrize("edit", ["prompt out of the vocabulary", "prompt in place",
                                  "more tokens"])
def test_a_request_changed_while_it_waits_changes_nothing(model, edit):
    """serve checked its requests once, then read them again when each joined: an on_token that
    changed a waiting request gave a raw IndexError from torch's embedding, or an
    OutOfBlocksError blaming blocks "taken outside serve"."""
    from kvlab.continuous_batching import ContinuousBatcher, Request

    batcher = ContinuousBatcher(model, num_blocks=8, block_size=4, max_batch=1)
    requests = [Request(torch.tensor([1, 2, 3, 4, 5]), 3), Request(torch.tensor([6, 7, 8, 9]), 3)]
    want = [kvlab.decode(model, r.prompt[None], 3)[0] for r in requests]

    def on_token(i, k, token):
        if (i, k) == (0, 0):
            if edit == "prompt out of the vocabulary":
                requests[1].prompt = torch.tensor([999, 1000])
            elif edit == "prompt in place":
                requests[1].prompt.fill_(255)
            else:
                requests[1].max_new_tokens = 500

    served = batcher.serve(requests, on_token=on_token)
    assert all(torch.equal(got, w) for got, w in zip(served.tokens, want, strict=True))
    assert batcher.allocator.num_used == 0


def test_kept_drafts_that_reads_the_first_row_only_is_told_so():
    """A kept_drafts reading row 0 only was told "you counted every right draft", a mistake it
    did not make (the two counts coincide on one of the checker's batches)."""
    from kvlab.exercises import lesson07

    def first_row(rows, verified):
        return (rows[:1, 1:] == verified[:1, :-1]).long().cumprod(-1).sum(-1).min()

    def every_right(rows, verified):
        return (rows[:, 1:] == verified[:, :-1]).long().sum(-1).min()

    verdict = lesson07.check_kept_drafts(first_row)
    assert verdict.startswith("not quite") and "first row's" in verdict, verdict
    verdict = lesson07.check_kept_drafts(every_right)
    assert verdict.startswith("not quite") and "every right draft" in verdict, verdict


# ------------------------------------------------------------------ round 19, the decoding side
@pytest.mark.parametrize("request_, match", [
    (lambda: [1, 2, 3], r"^request 0: prompt must be a 1-D LongTensor \[prompt_len\], got list"),
    (lambda: torch.tensor([1, 2, 3]),
     r"^request 0: max_new_tokens must be a positive int, got 4.0"),
])
def test_paged_runs_reads_its_requests_as_serve_does(model, request_, match):
    """paged_runs measured its requests' lengths before serve checked them: a list prompt raised
    AttributeError ('list' object has no attribute 'shape'), max_new_tokens=4.0 a message about
    a "length" the caller never gave."""
    from kvlab.continuous_batching import Request

    count = 4.0 if isinstance(request_(), torch.Tensor) else 4
    with pytest.raises(ValueError, match=match):
        serving.paged_runs(model, [Request(request_(), count)])


def test_an_edit_in_place_is_not_offered_an_undo(model, ids):
    """A held decoder refused after an edit in place said "or undo the change"; putting the values
    back does not help (the check follows versions), so the message must not offer it."""
    fresh = kvlab.tiny_model("tiny-llama")
    state = kvlab.STRATEGIES["graph-safe-compiled"].state(fresh, ids, 4)
    kvlab.decode(fresh, ids, 4, strategy="graph-safe-compiled", **state)
    weight = fresh.model.layers[0].mlp.down_proj.weight
    with torch.no_grad():
        weight.mul_(2).div_(2)
    with pytest.raises(GraphSafeError, match="an edit in place cannot be undone") as refused:
        kvlab.decode(fresh, ids, 4, strategy="graph-safe-compiled", **state)
    assert "or undo the change" not in str(refused.value)


def test_speculation_runs_and_k_sweep_take_a_tokenizers_output(model):
    """kvlab.decode takes a tokenizer's output; speculation_runs and k_sweep refused it."""
    ids = torch.tensor([[5, 6, 7, 5, 6, 7]])
    encoded = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    run = serving.speculation_runs(model, {"a": encoded}, 4, rounds=1, k=2, pairs=PAIR)
    assert run["runs"][0]["prompt_len"] == 6 and all(run["runs"][0]["exact"].values())
    rows = serving.k_sweep(model, encoded, 4, ks=(2,), rounds=1)["rows"]
    assert rows[0]["exact"]

"""kvlab.speculative: prompt-lookup drafts, verified k at a time in one captured graph, token-exact
with naive."""

import pytest
import torch

import kvlab
from kvlab.graph_safe_cache import GraphSafeError
from kvlab.lab.models import tiny_model
from kvlab.speculative import (
    SpeculativeDecoder,
    decode_speculative,
    padded_draft,
    prompt_lookup_draft,
    speculative_decoder,
)

N = 24


@pytest.fixture(scope="module")
def models():
    return {name: tiny_model(name) for name in ("tiny-llama", "tiny-qwen2", "tiny-qwen3")}


def repeating(batch: int, seed: int = 3) -> torch.Tensor:
    """A prompt of 6 random tokens said 3 times: [batch, 18]."""
    return torch.randint(1, 256, (batch, 6),
                         generator=torch.Generator().manual_seed(seed)).repeat(1, 3)


def simulated(ids: torch.Tensor, reference: torch.Tensor, k: int) -> tuple[int, int, int]:
    """(verify steps, drafted, accepted) that speculative decoding must have, replayed on the host
    from naive's tokens: each row drafts from its text so far, every row keeps the fewest right
    drafts of any row."""
    history, ref = ids.tolist(), reference.tolist()
    for row, tokens in zip(history, ref, strict=True):
        row.append(tokens[0])
    done = steps = drafted = accepted = 0
    done = 1
    while done < reference.shape[1]:
        drafts = [prompt_lookup_draft(row, k) for row in history]
        right = []
        for row, draft, tokens in zip(history, drafts, ref, strict=True):
            full, n = padded_draft(draft, k, row[-1]), 0
            while n < k and done + n < len(tokens) and full[n] == tokens[done + n]:
                n += 1
            right.append(n)
        take = min(min(right) + 1, reference.shape[1] - done)
        for row, tokens in zip(history, ref, strict=True):
            row.extend(tokens[done : done + take])
        steps, drafted = steps + 1, drafted + sum(map(len, drafts))
        accepted += sum(min(take - 1, len(d)) for d in drafts)
        done += take
    return steps, drafted, accepted


# ---- drafting
# --------------------------------------------------------------------------------------
def test_the_longest_ngram_wins():
    # suffix [1, 2, 3] occurs at 4; [2, 3] alone already at 1
    tokens = [7, 2, 3, 4, 1, 2, 3, 5, 6, 1, 2, 3]
    assert prompt_lookup_draft(tokens, 4) == [5, 6, 1, 2]
    assert prompt_lookup_draft(tokens, 4, max_ngram=2) == [4, 1, 2, 3]  # 2-grams only: [2, 3] at 1
    assert prompt_lookup_draft(torch.tensor(tokens), 4) == [5, 6, 1, 2]  # a 1-D tensor too


def test_the_earliest_occurrence_is_taken():
    # [1, 2] at 0 and 3: the first one
    assert prompt_lookup_draft([1, 2, 8, 1, 2, 9, 1, 2], 2) == [8, 1]


def test_no_match_gives_no_draft():
    assert prompt_lookup_draft([1, 2, 3], 4) == []
    assert prompt_lookup_draft([5], 4) == []
    assert prompt_lookup_draft([1, 2, 3, 1], 4, min_ngram=2) == []  # only a 1-gram occurs


def test_fewer_than_k_drafts_are_padded():
    # the text ends 3 tokens after the match
    assert prompt_lookup_draft([4, 5, 6, 4, 5], 8) == [6, 4, 5]
    assert padded_draft([6, 4, 5], 5, last=9) == [6, 4, 5, 5, 5]
    assert padded_draft([], 3, last=9) == [9, 9, 9]


def test_drafts_match_transformers_prompt_lookup():
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    gen = torch.Generator().manual_seed(0)
    lookup = PromptLookupCandidateGenerator(num_output_tokens=4, max_matching_ngram_size=3,
                                            max_length=1000)
    for _ in range(200):
        ids = torch.randint(0, 4, (1, int(torch.randint(2, 16, (1,), generator=gen))),
                            generator=gen)
        candidates, _ = lookup.get_candidates(ids)
        assert prompt_lookup_draft(ids[0], 4) == candidates[0, ids.shape[1]:].tolist(), ids


# ---- token-exact
# ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-qwen3"])
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("k", [1, 4])
def test_token_exact_with_naive_and_stats_as_simulated(models, name, batch, k):
    model = models[name]
    decoder = speculative_decoder(model, repeating(batch), N, k=k)
    for ids in (repeating(batch),
                torch.randint(1, 256, (batch, 9), generator=torch.Generator().manual_seed(k))):
        reference = kvlab.decode(model, ids, N)
        out = decoder.generate(ids, N)
        assert torch.equal(out, reference), (name, batch, k)
        stats = decoder.last_stats
        assert (stats.verify_steps, stats.drafted, stats.accepted) == simulated(ids, reference, k)
        assert stats.tokens_per_verify == (N - 1) / stats.verify_steps
    # one graph, captured at the first call, replayed for the second
    assert decoder.verify_graph is not None


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
@pytest.mark.parametrize("batch", [1, 2])
def test_speculation_over_the_kernels_step_is_token_exact_with_the_same_stats(models, name, batch):
    """The decoder takes a verify like any step: over kvlab's kernels (their PyTorch form here;
    tests/test_kernels.py runs the Triton kernels in the interpreter) the tokens and the drafts kept
    are those of the model's forward."""
    from kvlab.kernels.decoder import speculative_kernels_decoder
    from kvlab.kernels.step import kernel_verify

    model, k = models[name], 4
    decoder = speculative_kernels_decoder(model, repeating(batch), N, k=k)
    assert decoder.verify_fn is kernel_verify
    # its prefill is captured, as graph-safe-kernels' is
    assert decoder.prefill_bucket is not None
    for ids in (repeating(batch),
                torch.randint(1, 256, (batch, 9), generator=torch.Generator().manual_seed(k))):
        reference = kvlab.decode(model, ids, N)
        assert torch.equal(decoder.generate(ids, N), reference), (name, batch)
        stats = decoder.last_stats
        assert (stats.verify_steps, stats.drafted, stats.accepted) == simulated(ids, reference, k)
    assert decoder.verify_graph is not None
    ids = repeating(batch)
    assert torch.equal(kvlab.decode(model, ids, N, strategy="graph-safe-speculative/kernels"),
                       kvlab.decode(model, ids, N))
    tight = kvlab.decode(model, ids, N, strategy="graph-safe-speculative/kernels",
                         max_cache_len=ids.shape[1] + N - 1)
    # the last verify steps run into the trash slot
    assert torch.equal(tight, kvlab.decode(model, ids, N))


def test_repeating_prompts_get_drafts_accepted(models):
    model = models["tiny-qwen2"]
    for batch, k in [(1, 1), (1, 4), (2, 4)]:
        decoder = speculative_decoder(model, repeating(batch), N, k=k)
        decoder.generate(repeating(batch), N)
        stats = decoder.last_stats
        assert (stats.accepted > 0 and 0 < stats.acceptance_rate <= 1
                and stats.tokens_per_verify > 1), stats
        assert stats.verify_steps < N - 1


def test_a_cache_without_head_room_is_exact(models):
    """max_cache_len = prompt + new - 1: the last verify steps run past the end, into the trash
    slot."""
    model = models["tiny-llama"]
    ids = repeating(2)
    out = decode_speculative(model, ids, N, k=4, max_cache_len=ids.shape[1] + N - 1)
    assert torch.equal(out, kvlab.decode(model, ids, N))
    assert torch.equal(kvlab.decode(model, ids, N, strategy="graph-safe-speculative",
                                    max_cache_len=64),
                       kvlab.decode(model, ids, N))


def test_eager_verify_and_captured_prefill_are_exact(models):
    model = models["tiny-qwen3"]
    ids = repeating(1)
    reference = kvlab.decode(model, ids, N)
    assert torch.equal(decode_speculative(model, ids, N, graph=False), reference)
    decoder = speculative_decoder(model, ids, N, prefill_bucket=32)
    assert torch.equal(decoder.generate(ids, N), reference) and decoder.prefill_graph is not None


# ---- the rollback
# -------------------------------------------------------------------------------------
@torch.inference_mode()
def test_a_verify_step_leaves_the_counter_after_the_accepted_drafts(models):
    model = models["tiny-llama"]
    ids = repeating(1)
    reference = kvlab.decode(model, ids, 6)[0].tolist()
    decoder = SpeculativeDecoder(model, 40, k=4)
    for drafts, accepted in [(reference[1:5], 4), (reference[1:3] + [0, 0], 2), ([0, 0, 0, 0], 0)]:
        decoder.prefill(ids)  # the counter at 18, the first token in hand
        decoder.rows.copy_(torch.tensor([[reference[0], *drafts]]))
        verified = decoder.verify_step()
        assert int(decoder.accepted) == accepted
        # the last token + accepted drafts
        assert int(decoder.cache.cache_position) == ids.shape[1] + 1 + accepted
        assert verified[0, : accepted + 1].tolist() == reference[1 : accepted + 2]


def test_a_decoder_continues_and_is_reused_for_another_prompt(models):
    model = models["tiny-qwen2"]
    ids, other = repeating(1), repeating(1, seed=9)
    decoder = speculative_decoder(model, ids, N, k=4, max_cache_len=64)
    reference = kvlab.decode(model, ids, N + 5)
    for n in range(N - 5, N + 1):  # some end inside a verify step's accepted drafts: trimmed
        assert torch.equal(decoder.generate(ids, n), reference[:, :n])
        # as GraphSafeDecoder.generate leaves it
        assert int(decoder.cache.cache_position) == ids.shape[1] + n - 1
        # plain steps continue the sequence
        assert torch.equal(decoder.decode_steps(5), reference[:, n : n + 5])
    assert torch.equal(decoder.generate(other, N), kvlab.decode(model, other, N))
    assert torch.equal(decoder.generate(ids, N), reference[:, :N])


def test_on_token_sees_every_token_once_in_order(models):
    model = models["tiny-qwen2"]
    ids, seen = repeating(2), []
    out = decode_speculative(model, ids, N, on_token=lambda step, t: seen.append((step, t.clone())))
    assert ([s for s, _ in seen] == list(range(N))
            and torch.equal(torch.cat([t for _, t in seen], 1), out))


# ---- refusals
# -----------------------------------------------------------------------------------------
def test_bad_settings_and_calls_are_refused(models):
    model = models["tiny-llama"]
    ids = repeating(1)
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="k must be a positive int"):
            SpeculativeDecoder(model, 32, k=bad)
        with pytest.raises(ValueError, match="k must be a positive int"):
            prompt_lookup_draft([1, 2, 1], bad)
    with pytest.raises(ValueError, match=r"min_ngram \(3\) must be <= max_ngram \(2\)"):
        speculative_decoder(model, ids, N, max_ngram=2, min_ngram=3)
    with pytest.raises(ValueError, match="tokens must be 1-D"):
        prompt_lookup_draft(ids, 4)
    decoder = SpeculativeDecoder(model, ids.shape[1] + N - 2, k=4)
    with pytest.raises(GraphSafeError, match="do not fit in max_cache_len"):
        decoder.generate(ids, N)
    with pytest.raises(GraphSafeError, match="batch 1, got batch 2"):
        decoder.generate(repeating(2), 4)
    with pytest.raises(GraphSafeError, match="pass decoder= or k=, not both"):
        decode_speculative(model, ids, 4, decoder=decoder, k=2)
    with pytest.raises(GraphSafeError, match="built for another model"):
        decode_speculative(models["tiny-qwen2"], ids, 4, decoder=decoder)

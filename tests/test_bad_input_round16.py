"""Bad input, round 16 (issue 48): the decoding side."""
import pytest
import torch

import kvlab
from kvlab.lab.models import tiny_model


def test_a_hand_built_decoder_says_which_strategy_it_decodes_as(prompt):
    """Each builder tags the decoder it makes with its strategy (kvlab told them apart by function
    names and fused copies): taken under its own name, refused under another's."""
    from kvlab.compiled_step import compiled_decoder

    model = tiny_model("tiny-llama")
    ids = prompt(5)
    want = kvlab.decode(model, ids, 4)
    unfused = compiled_decoder(model, ids, 4, fuse=False, gemv=False, graph="emulate")
    assert torch.equal(kvlab.decode(model, ids, 4, strategy="graph-safe-compiled",
                                    decoder=unfused), want)
    with pytest.raises(ValueError, match="decodes the 'graph-safe-compiled' way.*'graph-safe'"):
        kvlab.decode(model, ids, 4, strategy="graph-safe", decoder=unfused)
    # a state() is its strategy's only, an ablation's included
    state = kvlab.STRATEGIES["graph-safe-kernels"].state(model, ids, 4, graph="emulate")
    with pytest.raises(ValueError, match=r"built by STRATEGIES\['graph-safe-kernels'\]\.state"):
        kvlab.decode(model, ids, 4, strategy="graph-safe-kernels/row-gemv", **state)


def test_the_paged_strategys_unknown_keyword_message_names_all_it_takes(prompt):
    """kvlab.decode(..., strategy="paged", nope=1) listed the batcher's settings but not on_token=
    or batcher=, which the strategy takes too."""
    model = tiny_model("tiny-llama")
    with pytest.raises(TypeError, match="nope=.*on_token=, batcher=, max_cache_len="):
        kvlab.decode(model, prompt(5), 3, strategy="paged", nope=1)
    with pytest.raises(TypeError, match="sets num_blocks= itself"):
        kvlab.decode(model, prompt(5), 3, strategy="paged", num_blocks=4)


@pytest.mark.parametrize("strategy", ["naive", "static", "graph-safe", "paged"])
def test_an_attention_kvlab_does_not_check_is_refused(prompt, strategy):
    """A model switched to flex_attention decoded: on the CPU its tokens differed between
    strategies and between two naive calls. kvlab checks sdpa and eager only."""
    model = tiny_model("tiny-llama")
    model.set_attn_implementation("flex_attention")
    with pytest.raises(ValueError, match="'flex_attention'.*set_attn_implementation\\('sdpa'\\)"):
        kvlab.decode(model, prompt(5), 3, strategy=strategy)
    model.set_attn_implementation("eager")
    assert torch.equal(kvlab.decode(model, prompt(5), 3, strategy=strategy),
                       kvlab.decode(model, prompt(5), 3))


def test_speculative_stats_are_of_the_last_call_only(prompt):
    """last_stats kept an earlier call's numbers after a call that was refused or stopped."""
    from kvlab.graph_safe_cache import GraphSafeError
    from kvlab.speculative import SpeculativeDecoder

    decoder = SpeculativeDecoder(tiny_model("tiny-llama"), 30, k=3, graph="emulate")
    decoder.generate(prompt(6), 15)
    assert decoder.last_stats.new_tokens == 15

    def stop(k, token):
        if k == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        decoder.generate(prompt(6), 10, on_token=stop)
    assert decoder.last_stats is None
    decoder.generate(prompt(6), 9)
    with pytest.raises(GraphSafeError):
        decoder.generate(prompt(6), 40)
    assert decoder.last_stats is None


def test_serving_runs_record_the_models_device():
    """paged_runs and speculation_runs took device='meta' for a CPU model and recorded it beside
    CPU timings (on a GPU machine, device='cuda' would name the GPU for CPU runs)."""
    from kvlab.lab import serving

    model = tiny_model("tiny-llama")
    requests = serving.arriving_requests(2, 256, prompt_lens=(2, 4), new_tokens=(2, 3),
                                         device="cpu")
    with pytest.raises(ValueError, match="device='meta' but the model is on cpu"):
        serving.paged_runs(model, requests, device="meta")
    ids = torch.randint(0, 256, (1, 5), generator=torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match="device='meta' but the model is on cpu"):
        serving.speculation_runs(model, {"a": ids}, 4, rounds=1, device="meta")
    with pytest.raises(ValueError, match="but the model is on cpu"):
        serving.k_sweep(model, ids, 4, ks=(1,), rounds=1, device="meta")
    assert serving.paged_runs(model, requests)["env"]["device"] == \
        serving.paged_runs(model, requests, device="cpu")["env"]["device"]


def test_arriving_requests_take_a_range_as_an_array():
    """prompt_lens=np.array([2, 5]) or torch.tensor([2, 5]) was refused as not a range, where a
    tuple was taken."""
    import numpy as np

    from kvlab.lab.serving import arriving_requests

    want = [r.prompt.tolist() for r in arriving_requests(3, 256, prompt_lens=(2, 5))]
    for given in (np.array([2, 5]), torch.tensor([2, 5])):
        got = arriving_requests(3, 256, prompt_lens=given, new_tokens=np.array([8, 64]))
        assert [r.prompt.tolist() for r in got] == want


def test_eager_vs_replay_checks_the_positions_it_decodes():
    """eager_vs_replay checked the prompt + steps against the position limit, but decodes 2 tokens
    more: prompt 1016 and steps=8 fed position 1024, past max_position_embeddings=1024."""
    from kvlab.lab.measure import eager_vs_replay

    model = tiny_model("tiny-llama")
    limit = model.config.max_position_embeddings
    ids = torch.randint(0, 256, (1, limit - 8), generator=torch.Generator().manual_seed(2))
    with pytest.raises(ValueError, match="max_position_embeddings.*steps \\+ 2 tokens"):
        eager_vs_replay(model, ids, steps=8, rounds=1)

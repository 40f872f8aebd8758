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

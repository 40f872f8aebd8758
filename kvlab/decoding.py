"""The contract every decoding strategy keeps, and the naive loop that every other one is
checked against.

A strategy is a function ``fn(model, input_ids, max_new_tokens, *, on_token=None, **kw)`` that
returns the new token ids, shape ``[batch, max_new_tokens]``, chosen greedily;
``on_token(step, token_ids)`` is called after each new token. ``kvlab.strategies`` holds the table
of them and ``kvlab.decode``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import torch

from .frozen_state import layer_problem
from .runtime import count, synchronize

OnToken = Callable[[int, torch.Tensor], None] | None


class StepClock:
    """An ``on_token`` callback that records, after a device sync, the wall time of every step."""

    def __init__(self, device):
        self.device = device
        synchronize(device)
        self.times: list[float] = []
        self._last = time.perf_counter()

    def __call__(self, step: int, token_ids: torch.Tensor) -> None:
        synchronize(self.device)
        now = time.perf_counter()
        self.times.append(now - self._last)
        self._last = now


# the attentions every strategy is checked with (kvlab's own, "kvlab-...", are its fused copies')
CHECKED_ATTENTIONS = ("sdpa", "eager")


def check_model(model) -> None:
    """Refuse what is not a model before its first use: above all ``load_model``'s
    ``(model, tokenizer)`` pair."""
    if isinstance(model, tuple):
        kinds = ", ".join(type(x).__name__ for x in model)
        raise TypeError(f"model is a tuple ({kinds}), not a model: kvlab.load_model returns "
                        "(model, tokenizer). Unpack it first: "
                        "model, tokenizer = kvlab.load_model(...)")
    if (not isinstance(model, torch.nn.Module)
            or not hasattr(getattr(model, "config", None), "get_text_config")):
        raise TypeError("model must be a transformers model (a torch.nn.Module with a .config), "
                        f"got {type(model).__name__}: load one with "
                        "model, tokenizer = kvlab.load_model(...)")

    if getattr(model, "get_output_embeddings", lambda: None)() is None:
        raise TypeError(f"{type(model).__name__} has no language-model head (lm_head), so it gives "
                        "no next-token logits: load the causal-LM model "
                        "(transformers.AutoModelForCausalLM, or kvlab.load_model(...))")
    attention = model.config._attn_implementation
    if attention not in CHECKED_ATTENTIONS and not str(attention).startswith("kvlab-"):
        checked = " and ".join(CHECKED_ATTENTIONS)
        raise ValueError(f"the model's attention implementation is {attention!r}: kvlab checks its "
                         f"strategies against naive decoding with {checked} only (another may "
                         "give other tokens per strategy, or per call). Call "
                         "model.set_attn_implementation('sdpa') first")
    # a falsy return_dict makes every forward return a tuple: kvlab reads outputs by name
    for where, config in (("", model.config), (".get_text_config()",
                                                model.config.get_text_config())):
        if not getattr(config, "return_dict", True):
            raise ValueError(f"model.config{where}.return_dict is {config.return_dict!r}: the "
                             "model returns tuples, and kvlab reads its outputs by name (.logits). "
                             f"Set model.config{where}.return_dict = True")


def _random_in_training(model) -> str | None:
    """A dropout that would change tokens at random, in a model left in train mode, else None."""
    if not model.training:
        return None
    for name, module in model.named_modules():
        p = (module.p if isinstance(module, torch.nn.Dropout)
             else getattr(module, "attention_dropout", 0.0))
        if module.training and isinstance(p, float) and p > 0:
            return (f"the model is in train mode and {name or 'model'} drops activations at random "
                    f"(p={p}): decoded tokens would be random and differ between strategies. Call "
                    "model.eval() first")
    return None


_TOKENIZE = "tokenizer(text, return_tensors='pt').input_ids"


def _not_a_tensor(input_ids, tokenized: bool) -> str:
    """What non-tensor ``input_ids`` are, and how to make the LongTensor asked for. ``tokenized``:
    they came in a tokenizer's output (a tokenizer called without ``return_tensors='pt'``)."""
    kind = type(input_ids).__name__
    numpy = type(input_ids).__module__ == "numpy"
    rows = input_ids if isinstance(input_ids, (list, tuple)) else None
    if input_ids is None:
        what, how = "None", f"Give the prompt's ids: {_TOKENIZE}"
    elif isinstance(input_ids, str):
        what, how = "a str (text, not token ids)", f"Tokenize it: {_TOKENIZE}"
    elif numpy:
        dims = getattr(input_ids, "ndim", None)
        what = (f"a NumPy array {getattr(input_ids, 'dtype', '')} "
                f"{tuple(getattr(input_ids, 'shape', ()))}")
        how = ("Convert it: torch.from_numpy(ids).long()"
               + ("[None] (a batch of one)" if dims == 1 else "" if dims == 2
                  else ", of 2 dims [batch, prompt_len]"))
    elif rows is None:
        what, how = f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}", f"Use {_TOKENIZE}"
    elif not rows:
        what, how = f"an empty Python {kind}", "Give at least one prompt: torch.tensor([[...]])"
    else:
        what = f"a Python {kind} of {'/'.join(sorted({type(r).__name__ for r in rows}))}s"
        if all(isinstance(r, (list, tuple)) for r in rows):
            lengths = [len(r) for r in rows]
            if len(set(lengths)) > 1:
                what += f" of lengths {lengths[:8]}"
                how = ("kvlab decodes prompts of one length: decode each alone, as "
                       "torch.tensor([prompt])")
            else:
                how = "Make a tensor: torch.tensor(ids), or tokenize with return_tensors='pt'"
        elif all(isinstance(r, torch.Tensor) for r in rows):
            how = "Stack them: torch.stack(ids) (prompts of one length)"
        else:
            what += " (one prompt)"
            how = "Make a batch of one: torch.tensor([ids])"
    if tokenized:  # the remedy is the tokenizer's
        return f"{what} in the tokenizer's output. Call the tokenizer with return_tensors='pt'"
    return f"{what}. {how}"


def _check_ids(input_ids, tokenized: bool = False, tokenizer_output: bool = True) -> None:
    """``tokenizer_output``: the caller takes a tokenizer's output too (the door unpacks it)."""
    if not isinstance(input_ids, torch.Tensor):
        also = " (or a tokenizer's output)" if tokenizer_output else ""
        raise ValueError(f"input_ids must be a LongTensor of shape [batch, prompt_len]{also}; got "
                         + _not_a_tensor(input_ids, tokenized))
    if input_ids.dtype != torch.long or input_ids.dim() != 2:
        cast = (" (token ids held as another dtype: convert them with input_ids.long())"
                if input_ids.dim() == 2 else "")
        raise ValueError(
            "input_ids must be a LongTensor of shape [batch, prompt_len]; got "
            f"{type(input_ids).__name__} {input_ids.dtype} {tuple(input_ids.shape)}{cast}. "
            f"Use {_TOKENIZE}."
        )


def _vocabulary(model) -> int:
    """How many token ids the model can read: its input embedding's rows (``config.vocab_size`` can
    be edited without resizing it)."""
    embedding = getattr(model, "get_input_embeddings", lambda: None)()
    rows = getattr(embedding, "num_embeddings", None)
    return rows if rows is not None else model.config.get_text_config().vocab_size


def check_inputs(model, input_ids: torch.Tensor, max_new_tokens: int, *,
                 tokenizer_output: bool = True, name: str = "input_ids") -> int:
    """Reject what would otherwise fail deep inside the model, or silently decode the wrong thing.
    Returns ``max_new_tokens`` as an int (a numpy or 0-dim tensor integer is accepted).
    ``tokenizer_output``: the caller takes a tokenizer's output too (the door: its messages offer
    it); ``name``: what the caller calls the ids, in the messages about their device and values."""
    check_model(model)
    _check_ids(input_ids, tokenizer_output=tokenizer_output)
    if input_ids.shape[0] == 0:
        raise ValueError("the batch is empty (input_ids has 0 rows): give at least one prompt")
    if input_ids.shape[1] == 0:
        raise ValueError("the prompt is empty: give at least one token")
    max_new_tokens = count(max_new_tokens, "max_new_tokens")
    device = next(model.parameters()).device
    if device.type == "meta":
        raise ValueError("the model's weights are on the 'meta' device (shapes only, no values): "
                         "load real weights, e.g. kvlab.load_model(...) or "
                         "model.to_empty(device=...) followed by loading a state dict")
    if input_ids.device != device:
        raise ValueError(f"{name} on {input_ids.device}, but the model is on {device}: call "
                         f"{name}.to({str(device)!r})")
    dropout = _random_in_training(model)
    if dropout is not None:
        raise ValueError(dropout)
    if torch.is_autocast_enabled(device.type):
        raise ValueError(f"torch.autocast is on for {device.type}: it runs some of the model's "
                         "operations in another dtype, and the strategies would disagree (a cache "
                         "write refuses the mix, a graph replays the dtypes it captured). Decode "
                         "outside the autocast block, or convert the model "
                         "(model.to(torch.bfloat16))")
    # a forward runs layers[:num_hidden_layers]; a cache has num_hidden_layers
    layers = layer_problem(model)
    if layers is not None:
        raise ValueError(layers)
    config = model.config.get_text_config()
    vocab = _vocabulary(model)
    head = getattr(model.get_output_embeddings(), "out_features", vocab)
    if head > vocab:
        raise ValueError(f"the model's lm_head scores {head} token ids but its embedding reads "
                         f"{vocab}: a predicted id >= {vocab} could not be fed back. Resize both "
                         f"with model.resize_token_embeddings({head})")
    # one host read, not two (on a GPU: a sync each)
    low, high = torch.stack(torch.aminmax(input_ids)).tolist()
    if high >= vocab or low < 0:
        edited = (f" (model.config.vocab_size says {config.vocab_size}; the embedding has {vocab} "
                  "rows: resize it with model.resize_token_embeddings(n))"
                  if config.vocab_size != vocab else "")
        raise ValueError(f"{name} holds ids outside the model's vocabulary [0, {vocab}){edited}: "
                         "was it tokenized for another model?")
    limit = getattr(config, "max_position_embeddings", None)
    if limit is not None and input_ids.shape[1] + max_new_tokens > limit:
        raise ValueError(
            f"prompt ({input_ids.shape[1]}) + max_new_tokens ({max_new_tokens}) exceeds the "
            f"model's max_position_embeddings ({limit}): shorten one of them"
        )
    return max_new_tokens


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """The next token of each sequence: argmax over the last position's logits.
    [batch, seq, vocab] -> [batch, 1]."""

    return logits[:, -1, :].argmax(dim=-1, keepdim=True)


@torch.inference_mode()
def decode_naive(model, input_ids: torch.Tensor, max_new_tokens: int, *,
                 on_token: OnToken = None) -> torch.Tensor:
    """No cache: every step runs the model over the whole sequence so far, prompt included
    (O(n^2) work)."""
    seq = input_ids  # [batch, prompt_len]
    for step in range(max_new_tokens):
        # [batch, len(seq), vocab]: every position recomputed
        logits = model(seq, use_cache=False).logits
        next_id = greedy(logits)  # [batch, 1]
        seq = torch.cat([seq, next_id], dim=1)
        if on_token is not None:
            on_token(step, next_id)
    return seq[:, input_ids.shape[1]:]


# a tokenizer's output; token types: unread
_READ_KEYS = ("input_ids", "attention_mask", "token_type_ids")


def unpadded_ids(input_ids, attention_mask=None) -> torch.Tensor:
    """The prompt ids of ``input_ids`` (a tensor, or a tokenizer's output with its mask),
    refusing padded rows.

    Every strategy feeds each row's tokens at positions 0, 1, ...: a padded row would be decoded as
    if its padding were prompt text, so a batch must hold prompts of one length, and a mask with any
    0 is refused. A mask holds 0 and 1 only, as int, bool or float (as transformers takes it). A
    mask given twice (in the tokenizer's output and as ``attention_mask=``) must be the same mask.
    """
    if isinstance(input_ids, Mapping):  # BatchEncoding or dict from a tokenizer
        if "input_ids" not in input_ids:
            raise ValueError("a mapping of inputs needs 'input_ids' (a tokenizer's output has it); "
                             f"got keys {list(input_ids)}")
        unread = [k for k in input_ids if k not in _READ_KEYS]
        if unread:
            raise ValueError(f"the inputs hold {unread}, which kvlab's strategies would not read: "
                             "they decode from input_ids (and check attention_mask) only. Pass "
                             "just those")
        inner = input_ids.get("attention_mask")
        if attention_mask is None:
            attention_mask = inner
        elif inner is not None and inner is not attention_mask and not (
                isinstance(inner, torch.Tensor) and isinstance(attention_mask, torch.Tensor)
                and inner.shape == attention_mask.shape
                and bool((inner == attention_mask.to(inner.device)).all())):
            raise ValueError("two different attention masks: the tokenizer's output holds one and "
                             "attention_mask= gives another. Pass one of them: "
                             "decode(model, inputs, n) or "
                             "decode(model, inputs['input_ids'], n, attention_mask=mask)")
        input_ids = input_ids["input_ids"]
        if not isinstance(input_ids, torch.Tensor):
            _check_ids(input_ids, tokenized=True)
    if attention_mask is not None:
        _check_ids(input_ids)
        if (not isinstance(attention_mask, torch.Tensor)
                or tuple(attention_mask.shape) != tuple(input_ids.shape)):
            raise ValueError(
                f"attention_mask must be a tensor of the ids' shape {tuple(input_ids.shape)}, got "
                f"{tuple(getattr(attention_mask, 'shape', ())) or type(attention_mask).__name__}")
        # an int, bool or float mask of 0/1, as transformers takes it
        other = (attention_mask != 0) & (attention_mask != 1)
        if attention_mask.is_complex() or bool(other.any()):
            wrong = ("complex values" if attention_mask.is_complex() else
                     ", ".join(map(str, sorted(set(attention_mask[other].tolist()), key=str)[:6])))
            raise ValueError("attention_mask must hold only 0 (padding) and 1 (a token), as a "
                             "tokenizer makes it (int, bool or float); got "
                             f"{wrong} ({attention_mask.dtype})")
        padded = (attention_mask == 0).sum(dim=1)
        if bool(padded.any()):
            rows = [(i, int(n)) for i, n in enumerate(padded.tolist()) if n]
            raise ValueError(
                f"padded rows (row, padding tokens): {rows}. kvlab's strategies decode prompts of "
                "one length and would read the padding as prompt text. Decode each prompt alone, "
                "or batch prompts of equal length."
            )
    return input_ids


def first_mismatch(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """Index of the first step where any sequence differs, None if identical. [batch, n] each (0 if
    shapes differ)."""
    if a.shape != b.shape:
        return 0
    diff = (a != b).any(dim=0).nonzero()
    return int(diff[0]) if len(diff) else None

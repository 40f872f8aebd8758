"""Prompt-lookup speculative decoding: guess the next k tokens from text already seen, check all of
them in one replay.

Greedy decoding makes one token per forward. When the output repeats its input (a quote, a summary
that copies names, code edited in place), the next tokens can be guessed for free: find the last few
tokens (an n-gram) earlier in the prompt or the output, and propose the k tokens that followed them
(``prompt_lookup_draft``, the rule of transformers' ``PromptLookupCandidateGenerator``). One forward
over the last token and the k drafts (k + 1 query rows, causal) gives the model's own greedy token
after each of them: draft ``i`` is right if it equals the model's token after draft ``i - 1``. The
longest prefix of right drafts is kept, plus the model's token after it, so one verify step makes
from 1 (no draft right) to k + 1 (all right) tokens, and they are the tokens plain greedy decoding
makes: the drafts only decide how many come per forward.

``SpeculativeDecoder`` is a ``kvlab.graph_decoder.GraphSafeDecoder`` (its cache, prefill, capture
and checks) with one more captured graph: the verify step of k + 1 rows, a plain function like a
decoder's step (``model_verify``: the model's forward; ``kvlab.kernels.step.kernel_verify``: kvlab's
kernels). Per verify step the host drafts (``prompt_lookup_draft`` on its own copy of each row's
tokens), writes the rows into the static buffer ``rows``, replays, and reads the number of accepted
drafts (its one host sync). The rollback happens inside the graph: the forward advanced the cache's
one counter by k + 1, and the graph subtracts the rejected drafts, in place. The rejected drafts'
keys and values stay in the slots after the counter, where the causal mask hides them until the next
verify overwrites them.

With batch > 1 the cache has one counter for all rows, so every row keeps as many drafts as the row
that accepted the fewest (the min): the tokens are still exact, but the drafts a luckier row got
right are thrown away and verified again. Per-row counters are a paged cache's job, not this one's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .decoding import OnToken
from .graph_decoder import GraphSafeDecoder, cache_length, decoder_for, forward_mask, model_step
from .graph_safe_cache import GraphSafeError, GraphSafeStaticCache
from .runtime import count


def _check_draft_settings(k: int, max_ngram: int, min_ngram: int) -> tuple[int, int, int]:
    """``(k, max_ngram, min_ngram)`` as Python ints (``count``: a NumPy or 0-dim tensor int too),
    refused unless positive with ``min_ngram <= max_ngram``."""
    k, max_ngram, min_ngram = (count(k, "k"), count(max_ngram, "max_ngram"),
                               count(min_ngram, "min_ngram"))
    if min_ngram > max_ngram:
        raise ValueError(f"min_ngram ({min_ngram}) must be <= max_ngram ({max_ngram}): the lookup "
                         "tries n-grams from max_ngram down to min_ngram")
    return k, max_ngram, min_ngram


def _check_draft_input(tokens, k: int, max_ngram: int, min_ngram: int) -> list[int]:
    """``tokens`` (a list of ids or a 1-D tensor) as a list, after ``_check_draft_settings``; a 2-D
    tensor is refused."""
    _check_draft_settings(k, max_ngram, min_ngram)
    if isinstance(tokens, torch.Tensor):
        if tokens.dim() != 1:
            raise ValueError("tokens must be 1-D (one row of ids), got shape "
                             f"{tuple(tokens.shape)}: draft each row apart")
        return tokens.tolist()
    return list(tokens)


def prompt_lookup_draft(tokens, k: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """Up to ``k`` draft tokens for what follows ``tokens`` (a list of ids or a 1-D tensor: prompt +
    output so far).

    For n from ``max_ngram`` down to ``min_ngram``: look for the last n tokens earlier in
    ``tokens``; at the first n that occurs, take the EARLIEST occurrence followed by at least one
    token, and return the (at most ``k``) tokens that follow it. Returns ``[]`` when no n-gram
    occurs earlier. The earliest occurrence, as transformers' ``PromptLookupCandidateGenerator``
    takes it: in a prompt that is being quoted it is the quoted passage itself, and it has the most
    tokens after it (a recent one can run into the suffix and give fewer drafts).
    """
    tokens = _check_draft_input(tokens, k, max_ngram, min_ngram)  # a list of ints
    for n in range(min(max_ngram, len(tokens) - 1), min_ngram - 1, -1):
        suffix = tokens[-n:]
        # windows ending before the last token: each has a token after it
        for start in range(len(tokens) - n):
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []


def padded_draft(draft: list[int], k: int, last: int) -> list[int]:
    """``draft`` padded to ``k`` tokens by repeating its last token (``last``, the row's last token,
    if it is empty).

    The verify graph always checks k drafts; a padded one is checked like any other and kept only if
    it is the model's token (then it is right, whatever put it there)."""
    fill = draft[-1] if draft else last
    return draft + [fill] * (k - len(draft))


def kept_drafts(rows: torch.Tensor, verified: torch.Tensor) -> torch.Tensor:
    """How many drafts every row keeps: ``rows`` [batch, k + 1] (the last token, then k drafts),
    ``verified`` [batch, k + 1] (the model's greedy token after each of them). Draft ``i`` is right
    if it equals the model's token after row ``i - 1``; a row keeps its longest right prefix, and
    the batch keeps the fewest of any row (one counter). A 0-d tensor, computed on the device: no
    host sync, so it can be captured."""
    right = rows[:, 1:] == verified[:, :-1]  # [batch, k]
    # a False stops the cumprod: the right prefix's length
    return right.long().cumprod(dim=-1).sum(dim=-1).min()


def model_verify(model, cache, rows: torch.Tensor, verified: torch.Tensor) -> torch.Tensor:
    """The verify forward: ``rows`` [batch, k + 1] (the last token, then k drafts) at the counter's
    positions, causal; writes the model's greedy token after each row into ``verified`` [batch, k +
    1] and advances the counter by k + 1 (the caller rolls back the rejected drafts)."""
    mask = forward_mask(model, cache, rows)  # [batch, 1, k + 1, slots] causal from the counter
    # counter += k+1
    logits = model(input_ids=rows, cache=cache, attention_mask=mask, use_cache=True).logits
    verified.copy_(logits.argmax(dim=-1))  # [batch, k + 1]: verified[:, i] follows rows[:, i]
    return verified


@dataclass(frozen=True)
class SpeculativeStats:
    """What one ``SpeculativeDecoder.generate`` call did (``decoder.last_stats``)."""

    batch: int
    k: int
    new_tokens: int  # per row, the first one (made by the prefill) included
    verify_steps: int  # replays of the verify graph: one host sync each
    drafted: int  # draft tokens the lookup found, all rows together (the padding is not counted)
    # of those, kept: equal to the model's greedy token, and kept by every row (the min, batch > 1)
    accepted: int

    @property
    def acceptance_rate(self) -> float:
        """Kept drafts / drafted (0.0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_verify(self) -> float:
        """New tokens per row per verify step, the prefill's token left out: 1.0 = no gain, k + 1 =
        every draft kept (0.0 when no verify step ran)."""
        return (self.new_tokens - 1) / self.verify_steps if self.verify_steps else 0.0


class SpeculativeDecoder(GraphSafeDecoder):
    """A GraphSafeDecoder that decodes by prompt-lookup drafts verified ``k`` at a time in one
    captured graph.

    ``k``: drafts per verify step (the graph's k + 1 query rows). ``max_ngram``/``min_ngram``: the
    n-gram lengths ``prompt_lookup_draft`` tries. ``verify``: ``verify(model, cache, rows, verified)
    -> verified`` (default ``model_verify``). ``step``, ``prefill``, ``prefill_bucket``, ``graph``:
    as for GraphSafeDecoder (its plain decode steps, ``decode_steps``, still work after
    ``generate``).

    Room: the cache must hold prompt + max_new_tokens - 1 tokens, as for GraphSafeDecoder. A verify
    step near the end may run past ``max_cache_len``: those rows' keys go to the trash slot and
    their tokens are never used (the output is trimmed to ``max_new_tokens``).
    ``speculative_decoder`` sizes the cache with k - 1 more slots, so that no verify step reaches
    the end.
    """

    kvlab_strategy = "graph-safe-speculative"

    def __init__(self, model, max_cache_len: int | GraphSafeStaticCache, batch: int = 1, *,
                 k: int = 4, max_ngram: int = 3, min_ngram: int = 1, verify=model_verify,
                 step=model_step, prefill=None, prefill_bucket: int | None = None,
                 graph: bool | str = True):
        k, max_ngram, min_ngram = _check_draft_settings(k, max_ngram, min_ngram)
        if not callable(verify):
            raise TypeError("verify must be a function (verify(model, cache, rows, verified)), got "
                            f"{type(verify).__name__}")
        super().__init__(model, max_cache_len, batch, step=step, prefill=prefill,
                         prefill_bucket=prefill_bucket, graph=graph)
        self.k, self.max_ngram, self.min_ngram, self.verify_fn = k, max_ngram, min_ngram, verify
        # static: last token, k drafts
        self.rows = torch.zeros(batch, k + 1, dtype=torch.long, device=self.device)
        # static: token after each
        self.verified = torch.zeros(batch, k + 1, dtype=torch.long, device=self.device)
        # static: drafts every row accepted
        self.accepted = torch.zeros((), dtype=torch.long, device=self.device)
        self.verify_graph = None
        self.last_stats: SpeculativeStats | None = None

    # ---- the verify step (no host sync inside: it is captured)
    # ---------------------------------------
    def verify(self, rows: torch.Tensor) -> torch.Tensor:
        """Run ``rows`` [batch, k + 1] (the last token, then k drafts) at the counter's positions;
        write the model's greedy token after each row into ``verified`` [batch, k + 1], the number
        of drafts every row accepts into ``accepted``, and leave the counter after the last token
        and the accepted drafts."""
        width = rows.shape[1]  # k + 1
        self.verify_fn(self.model, self.cache, rows, self.verified)  # the counter advanced by k + 1
        self.accepted.copy_(kept_drafts(rows, self.verified))
        # roll back in place: drop the rejected drafts
        self.cache.cache_position.sub_(width - 1 - self.accepted)
        return self.verified

    def verify_step(self) -> torch.Tensor:
        """One verify of the static ``rows``: a replay of the verify graph (captured on first use),
        or eager."""
        if not self.use_graph:
            return self.verify(self.rows)
        if self.verify_graph is None:
            self.verify_graph = self.capture_graph(self.verify, self.rows)
        return self.verify_graph.replay()

    # ---- generation
    # --------------------------------------------------------------------------------
    @torch.inference_mode()
    def _generate(self, input_ids: torch.Tensor, max_new_tokens: int, *,
                  on_token: OnToken = None) -> torch.Tensor:
        """Greedy-decode ``max_new_tokens`` after ``input_ids`` [batch, prompt_len]; returns
        ``[batch, max_new_tokens]``, the tokens of ``kvlab.decode(model, input_ids,
        max_new_tokens)``. ``on_token`` gets each verify step's tokens one by one, after its replay.
        What the call did goes to ``self.last_stats`` (None until it returns)."""
        self.last_stats = None  # a call refused or stopped did not do what the last one did
        max_new_tokens = self._check(input_ids, max_new_tokens)
        k = self.k
        out = torch.empty(self.batch, max_new_tokens, dtype=torch.long, device=self.device)
        # per row: prompt + output so far, on the host, where drafting happens
        history = input_ids.tolist()
        verify_steps = drafted = accepted_drafts = 0
        # room was checked above; rows past the end go to the trash slot
        with self._emptied_if_stopped(), self.cache.unchecked():
            # counter = prompt_len: the first token's position
            out[:, :1].copy_(self._prefill(input_ids))
            for row, token in zip(history, out[:, 0].tolist(), strict=True):
                row.append(token)
            if on_token is not None:
                on_token(0, out[:, :1].clone())  # the caller's copy
            made = 1
            while made < max_new_tokens:
                drafts = [prompt_lookup_draft(row, k, self.max_ngram, self.min_ngram)
                          for row in history]
                rows = [[row[-1], *padded_draft(draft, k, row[-1])]
                        for row, draft in zip(history, drafts, strict=True)]
                # in place: the graph reads the buffer by address
                self.rows.copy_(torch.tensor(rows))
                self.verify_step()
                accepted = int(self.accepted)  # the one host sync of a verify step
                # trim at the end: never more than asked for
                take = min(accepted + 1, max_new_tokens - made)
                out[:, made : made + take].copy_(self.verified[:, :take])
                for row, tokens in zip(history, self.verified[:, :take].tolist(), strict=True):
                    row.extend(tokens)
                verify_steps += 1
                drafted += sum(len(draft) for draft in drafts)
                accepted_drafts += sum(min(take - 1, len(draft)) for draft in drafts)
                if on_token is not None:
                    for i in range(made, made + take):
                        on_token(i, out[:, i : i + 1].clone())  # the caller's copy
                made += take
        # A trimmed last step left the counter past the last token: put it there, and the last token
        # in `token`, as GraphSafeDecoder.generate leaves them (decode_steps continues from here).
        self.cache.set_position(input_ids.shape[1] + max_new_tokens - 1)
        self.token.copy_(out[:, -1:])
        self.last_stats = SpeculativeStats(batch=self.batch, k=k, new_tokens=max_new_tokens,
                                           verify_steps=verify_steps, drafted=drafted,
                                           accepted=accepted_drafts)
        return out

    def describe(self) -> str:
        verify = (f"verify graph: {self.verify_graph.describe()}" if self.verify_graph is not None
                  else ("verify graph not captured yet" if self.use_graph
                        else "verify eager (no graph)"))
        return (f"SpeculativeDecoder(batch={self.batch}, max_cache_len={self.max_cache_len}, "
                f"k={self.k}, ngrams={self.min_ngram}..{self.max_ngram}): {verify}")


def speculative_decoder(model, input_ids: torch.Tensor, max_new_tokens: int, *, k: int = 4,
                        max_cache_len: int | None = None, cache: GraphSafeStaticCache | None = None,
                        **settings) -> SpeculativeDecoder:
    """The decoder ``decode_speculative`` builds for one call: batch from the call, the cache
    ``max_cache_len`` (a given ``cache``'s own), else prompt + max_new_tokens + k - 1 (the last
    verify step's k drafts fit), ``settings`` for ``SpeculativeDecoder`` (``verify``, ``step`` and
    ``prefill`` too: see ``kvlab.kernels.decoder.speculative_kernels_decoder``; ``graph=None`` is
    the default, True, as ``decode_speculative`` reads it). Pass it back as ``decoder=`` to replay
    its graphs in later calls."""
    k = _check_draft_settings(k, settings.get("max_ngram", 3), settings.get("min_ngram", 1))[0]
    if "graph" in settings and settings["graph"] is None:
        del settings["graph"]
    if max_cache_len is None and cache is None:
        max_cache_len = input_ids.shape[1] + max_new_tokens + k - 1
    length = cache_length(input_ids, max_new_tokens, max_cache_len, cache)
    return SpeculativeDecoder(model, length, input_ids.shape[0], k=k, **settings)


def decode_speculative(model, input_ids: torch.Tensor, max_new_tokens: int, *,
                       on_token: OnToken = None, decoder: SpeculativeDecoder | None = None,
                       k: int | None = None, max_ngram: int | None = None,
                       min_ngram: int | None = None, max_cache_len: int | None = None,
                       graph: bool | None = None, prefill_bucket: int | None = None,
                       cache: GraphSafeStaticCache | None = None) -> torch.Tensor:
    """The ``"graph-safe-speculative"`` strategy: eager prefill, then prompt-lookup drafts verified
    ``k`` (default 4) at a time in one captured graph (``SpeculativeDecoder``).

    ``decoder``: replay this SpeculativeDecoder's graphs (its own settings). Otherwise one is built
    for this call (``speculative_decoder``; ``max_ngram`` default 3, ``min_ngram`` 1, ``graph``
    True).
    """
    settings = {"k": k, "max_ngram": max_ngram, "min_ngram": min_ngram, "graph": graph,
                "prefill_bucket": prefill_bucket}
    settings = {name: value for name, value in settings.items() if value is not None}
    if decoder is not None:
        if not isinstance(decoder, SpeculativeDecoder):
            raise TypeError(f"decoder must be a SpeculativeDecoder, got {type(decoder).__name__}: "
                            "build one with kvlab.speculative.speculative_decoder(model, "
                            "input_ids, max_new_tokens)")
        if settings or cache is not None or max_cache_len is not None:
            given = ", ".join(f"{name}=" for name in [
                *settings, *(["cache"] if cache is not None else []),
                *(["max_cache_len"] if max_cache_len is not None else [])])

            raise GraphSafeError(f"pass decoder= or {given}, not both: a SpeculativeDecoder keeps "
                                 "the settings and cache it was built with. Drop them to reuse the "
                                 "decoder, or drop decoder= to build one")
        return decoder_for(decoder, model).generate(input_ids, max_new_tokens, on_token=on_token)
    decoder = speculative_decoder(model, input_ids, max_new_tokens, max_cache_len=max_cache_len,
                                  cache=cache, **settings)
    return decoder.generate(input_ids, max_new_tokens, on_token=on_token)

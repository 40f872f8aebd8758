"""Checkers for lesson 07 (beyond one sequence: prompt-lookup speculative decoding and a paged KV
cache, ``notebooks/07_beyond_one_sequence.ipynb``). Each returns a verdict string; print it.

The code exercises run the student's function beside the package's own
(``kvlab.speculative.kept_drafts`` and ``prompt_lookup_draft``, ``kvlab.paged_cache.slots_of``) on
inputs made here, and name the typical mistake they find. ``kept_drafts`` runs inside the captured
verify graph, so its checker also captures the student's function (``kvlab.graphs.capture``,
emulated on a CPU) and replays it on other drafts: a count read back to the host (``.item()``,
``int()``, a Python ``if`` on a tensor) is right in value but refused there. The memory answer and
the prediction are computed here, live, with ``kvlab.paged_cache.blocks_for`` /
``memory_accounting`` and ``kept_drafts``.
"""

from __future__ import annotations

import torch

from .. import paged_cache, speculative
from .common import (
    FILLED_PREDICTION,
    NOT_ANSWERED,
    as_number,
    call_student,
    check_number,
    check_prediction,
    checker,
    choice_of,
    code_checker,
    index_dtype_problem,
    settings_read,
)
from .mistakes import first_match, show_sources

# ---- 1 · how many drafts the verify step keeps ---------------------------------------------------


def kept_drafts_solution(rows: torch.Tensor, verified: torch.Tensor) -> torch.Tensor:
    """The package's own rule (``kvlab.speculative.kept_drafts``): draft i (``rows[:, i]``, i >= 1)
    is right if it equals the model's token after row i - 1 (``verified[:, i - 1]``); each row keeps
    its longest right prefix, the batch keeps the fewest of any row (one counter). A 0-d long
    tensor, no host sync."""
    return speculative.kept_drafts(rows, verified)


def drafts_case(prefixes: list[int], k: int, extra: list[list[int]] | None = None, seed: int = 0):
    """``(rows, verified)`` [batch, k + 1] whose row b has exactly ``prefixes[b]`` right drafts
    first; then a wrong draft, then right drafts again at the draft indices (1-based) of
    ``extra[b]`` (which only a count that does not stop at the first wrong draft would count). Other
    tokens are distinct, so nothing else matches by chance."""
    gen = torch.Generator().manual_seed(seed)
    batch = len(prefixes)
    extra = extra or [[] for _ in prefixes]
    rows = torch.randperm(1000, generator=gen)[: batch * (k + 1)].reshape(batch, k + 1) + 1000
    verified = torch.randperm(1000, generator=gen)[: batch * (k + 1)].reshape(batch, k + 1) + 3000
    for b, (prefix, later) in enumerate(zip(prefixes, extra, strict=True)):
        for i in range(1, k + 1):  # draft i is right iff verified[b, i - 1] == rows[b, i]
            if i <= prefix or (i > prefix + 1 and i in later):
                verified[b, i - 1] = rows[b, i]
    return rows, verified


# Hand-built first: batch 1, k = 5, one right draft, then a wrong one, then two right again; and
# every draft i of it also equals the model's token after draft i (the repeated 9s), so each typical
# mistake gives another count: the rule 1, no stop at the first wrong draft 3, tokens made (+1) 2,
# verified[:, 1:] (off by one) 4.
REPEATS = (torch.tensor([[7, 3, 9, 9, 9, 8]]), torch.tensor([[3, 3, 9, 9, 9, 2]]))
# The fewest sits at a middle row alone, at the first alone and at the last alone: a count that
# reads a fixed subset of the rows (pre[1:], pre[:-1], pre[::2]) misses one of them.
KEPT_CASES = [  # (label, prefixes per row, k, extra right drafts after the first wrong one)
    ("batch 1, k=1, the draft right", [1], 1, None),
    ("batch 1, k=3, no draft right", [0], 3, [[2, 3]]),
    ("batch 3, k=4, rows keep 3, 1 and 4", [3, 1, 4], 4, [[], [3, 4], []]),
    ("batch 2, k=6, every draft right", [6, 6], 6, None),
    ("batch 4, k=2, the first row keeps none", [0, 2, 1, 2], 2, None),
    ("batch 3, k=5, rows keep 4, 5 and 2", [4, 5, 2], 5, [[], [], [4, 5]]),
]


def kept_cases() -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(label, rows, verified) of every case the checker tries, ``REPEATS`` first."""
    cases = [("batch 1, k=5, rows " + str(REPEATS[0].tolist()) + ", verified "
              + str(REPEATS[1].tolist()), *REPEATS)]
    for seed, (label, prefixes, k, extra) in enumerate(KEPT_CASES):
        cases.append((label, *drafts_case(prefixes, k, extra, seed)))
    return cases


def kept_mistakes(rows: torch.Tensor, verified: torch.Tensor) -> list[tuple]:
    """(value, hint) of the typical mistakes, as :func:`first_match` takes them."""
    right = rows[:, 1:] == verified[:, :-1]  # [batch, k]
    prefix = right.long().cumprod(-1).sum(-1)  # [batch]
    shifted = (rows[:, 1:] == verified[:, 1:]).long()
    return [
        (prefix.min() + 1, "that is the tokens the step makes (the kept drafts plus the model's "
                           "own token after them); return the number of drafts kept"),
        (right.long().sum(-1).min(), "you counted every right draft: the count stops at the first "
                                     "wrong one (the drafts after it were guessed from a wrong "
                                     "token); cumprod along the drafts "
                                     "keeps the right prefix only"),
        (shifted.cumprod(-1).sum(-1).min(), "off by one: draft i (rows[:, i]) is checked against "
                                            "the model's token after row i - 1, verified[:, i - "
                                            "1]: compare rows[:, 1:] with "
                                            "verified[:, :-1], not verified[:, 1:]"),
        (shifted.sum(-1).min(), "off by one (compare rows[:, 1:] with verified[:, :-1]), and the "
                                "count stops at the first wrong draft"),
        (prefix.max(), "you took the row that kept the most (max): the batch has one counter, so "
                       "every row keeps as many drafts as the row that kept the fewest (min)"),
        (prefix.sum(), "you added the rows' counts: the batch keeps the fewest of any row (min), "
                       "one count"),
    ]


def _kept_value(got) -> int | None:
    """The count in ``got`` (a 0-d integer tensor or a Python int), else None."""
    if isinstance(got, torch.Tensor) and got.dim() == 0 and not (
            got.dtype.is_floating_point or got.dtype.is_complex or got.dtype == torch.bool):
        return int(got)
    return got if isinstance(got, int) and not isinstance(got, bool) else None


def _kept_shape_mistake(got, rows, verified, case: str) -> str | None:
    """A verdict for something that is not one integer count, else None."""
    if isinstance(got, torch.Tensor):
        if got.dtype.is_floating_point or got.dtype.is_complex or got.dtype == torch.bool:
            return (f"not quite: for {case} kept_drafts gave a {got.dtype} tensor; it is a count "
                    "of drafts: return a long tensor (a bool tensor's .long(), then cumprod and "
                    "sum, stay long)")
        if got.dim() == 1 and got.shape[0] == rows.shape[0]:
            per_row = rows[:, 1:] == verified[:, :-1]
            same_as_rows = torch.equal(got.long(), per_row.long().cumprod(-1).sum(-1))
            return (f"not quite: for {case} you returned shape {list(got.shape)}, one count per row"
                    f"{' (right ones)' if same_as_rows else ''}. Hint: the batch has one counter, "
                    "so it keeps one count: the fewest of any row, .min(), a 0-d tensor")
        if got.dim() != 0:
            return (f"not quite: for {case} you returned shape {list(got.shape)}. Hint: one count "
                    "for the whole batch, a 0-d tensor (the .min() over rows of each row's count)")
        # the count moves the cache's position counter: an index dtype, as ids and positions
        wrong_dtype = index_dtype_problem(got, "the kept count and the positions it moves")
        return (f"not quite: for {case} kept_drafts gave a {got.dtype} tensor: {wrong_dtype} "
                "(.long() of the bool tensor, then cumprod, sum and min, stay long)"
                if wrong_dtype else None)
    if _kept_value(got) is None:
        return (f"not quite: for {case} kept_drafts returned a {type(got).__name__} ({got!r:.60}); "
                "return the count as a 0-d long tensor")
    return None


def _rolled_counts(fn, rows: torch.Tensor, verified: torch.Tensor) -> list[tuple[int, int]]:
    """(``fn``'s count, the rule's count of the first row alone) for the rows rolled by each
    shift."""
    counts = []
    for shift in range(rows.shape[0]):
        rolled, checked = rows.roll(shift, 0), verified.roll(shift, 0)
        counts.append((_kept_value(call_student(fn, rolled.clone(), checked.clone())),
                       int(kept_drafts_solution(rolled[:1], checked[:1]))))
    return counts


def _row_order_hint(fn, rows: torch.Tensor, verified: torch.Tensor) -> str | None:
    """A hint where ``fn``'s count is the first row's whichever row comes first, or changes when
    the rows are put in another order (the rule's does not: it reads every row), else None."""
    if rows.shape[0] == 1:
        return None
    counts = _rolled_counts(fn, rows, verified)
    if all(got == first for got, first in counts):
        return ("your count is the first row's, whichever row comes first: every row of the "
                "batch counts; each keeps its right prefix and the batch keeps the fewest (.min() "
                "over rows)")
    seen = sorted({got for got, _ in counts}, key=lambda c: -1 if c is None else c)
    if len(seen) < 2:
        return None
    return (f"your count changes with the order of the rows ({', '.join(map(str, seen))} "
            "for the same rows rolled): it reads some rows only; every row of the batch counts, "
            "each keeps its right prefix and the batch keeps the fewest (.min() over all rows)")


def _every_row_order(cases: list[tuple]) -> list[tuple]:
    """``cases``, then each batch of several rows rolled by every shift: the batch keeps the
    fewest whichever row holds it, so a count over a fixed subset of rows fails one of them."""
    return cases + [(f"{label}, its rows rolled by {shift}", rows.roll(shift, 0),
                     verified.roll(shift, 0))
                    for label, rows, verified in cases for shift in range(1, rows.shape[0])]


@code_checker(kept_drafts_solution)
def check_kept_drafts(fn) -> str:
    """Exercise: kept_drafts(rows, verified) = min over rows of the longest prefix of i with rows[:,
    i] == verified[:, i - 1].

    rows, verified: long tensors [batch, k + 1] (the last token then k drafts; the model's token
    after each). Returns a 0-d long tensor. Checked on batch 1 to 4 and k 1 to 6, then captured
    (emulated) and replayed on other drafts: a Python int is right in value but cannot come out of
    the captured verify graph."""
    ints = []
    for label, rows, verified in _every_row_order(kept_cases()):
        want = int(kept_drafts_solution(rows, verified))
        got = call_student(fn, rows.clone(), verified.clone())
        refused = _kept_shape_mistake(got, rows, verified, label)
        if refused:
            return refused
        if _kept_value(got) != want:
            hint = (_row_order_hint(fn, rows, verified)
                    or first_match(got if isinstance(got, torch.Tensor) else torch.tensor(got),
                                   kept_mistakes(rows, verified)))
            return (f"not quite: for {label} you kept {_kept_value(got)} draft(s), the rule keeps "
                    f"{want}. Hint: "
                    + (hint or "draft i is right if rows[:, i] == verified[:, i - 1]; each row "
                               "keeps its right prefix "
                                "((right).long().cumprod(-1).sum(-1)), the batch the fewest "
                                "(.min())"))
        if not isinstance(got, torch.Tensor):
            ints.append(label)
    if ints:
        return (f"not quite: your counts are right, but you returned a Python int ({ints[0]}). "
                "Hint: kept_drafts runs inside the captured verify graph, which cannot hand a "
                "value back to Python mid-step (no .item(), int() "
                "or if on a tensor): keep the count a 0-d tensor; the decoder reads it once, after "
                "the replay")
    return _kept_replayed(fn)


def _kept_replayed(fn) -> str:
    """Capture ``fn`` on one batch of drafts, refill the static rows/verified with others, replay,
    compare."""
    from ..graphs import CaptureError, capture

    rows, verified = drafts_case([3, 2, 4], 4, seed=11)
    again_rows, again_verified = drafts_case([4, 4, 3], 4, seed=12)  # the last row the fewest
    try:
        # inside a capture: no host compare (the eager call checked the inputs)
        graph = capture(lambda r, v: call_student(fn, r, v, writes_inputs=True), rows, verified,
                        warmup=0, emulate=True)
    except CaptureError as e:
        return ("not quite: right eagerly, but a captured graph refuses it "
                f"({str(e).split('. A captured')[0]}). Hint: kept_drafts runs inside the verify "
                "graph: no .item(), int(), .tolist() or `if` on a tensor; compare "
                "the whole [batch, k] at once and let cumprod stop the count at the first wrong "
                "draft")
    rows.copy_(again_rows)
    verified.copy_(again_verified)
    out = graph.replay()
    out = out[0] if isinstance(out, (tuple, list)) else out
    want = int(kept_drafts_solution(again_rows, again_verified))
    if _kept_value(out) != want:
        return ("not quite: captured on drafts that keep 2 and replayed on drafts that keep "
                f"{want}, your graph gave {_kept_value(out)}. Hint: a Python value taken from the "
                "tensors (a loop bound, a break) is frozen at "
                "capture; compute the count with tensor operations only: cumprod, sum, min")
    return (f"correct: {len(KEPT_CASES) + 1} cases (batch 1 to 4, k 1 to 6, each batch in every "
            "rolled row order) match "
            "kvlab.speculative.kept_drafts, and a captured graph of your function follows new "
            "drafts: the count stays on the device, so the verify step "
            "needs one host read, after its replay")


show_sources(check_kept_drafts, kept_drafts_solution, speculative.kept_drafts)


# ---- 2 · prompt lookup: the drafts ---------------------------------------------------------------


def draft_solution(tokens: list[int], k: int, max_ngram: int) -> list[int]:
    """The package's own lookup (``kvlab.speculative.prompt_lookup_draft`` with ``min_ngram=1``):
    the longest n-gram first, its earliest earlier occurrence, the (at most k) tokens after it."""
    return speculative.prompt_lookup_draft(tokens, k, max_ngram=max_ngram, min_ngram=1)


DRAFT_CASES = [  # (label, tokens, k, max_ngram)
    # the 3-gram suffix (8, 2, 3) occurs only as itself, (2, 3) at 3 and at 8, (3,) already at 0:
    # every typical mistake drafts something else here (tests/test_exercises_lesson07.py checks that
    # they differ)
    ("a 2-gram seen twice", [3, 7, 1, 2, 3, 4, 5, 9, 2, 3, 6, 8, 2, 3], 3, 3),
    ("the 2-gram suffix found as itself only", [1, 8, 2, 3, 4, 5, 8], 3, 2),
    ("a quoted passage, k larger than what follows", [11, 12, 13, 14, 15, 16, 20, 21, 11, 12, 13],
     8, 3),
    ("a repeated token (overlapping n-grams)", [5, 5, 5, 5], 4, 3),
    ("nothing seen before", [1, 2, 3, 4, 5], 3, 2),
    ("one token", [42], 2, 3),
    ("max_ngram 1", [6, 1, 2, 6, 3, 4, 6], 2, 1),
    # the 3-gram suffix (1, 2, 3) occurs earlier, but max_ngram is 2: (2, 3) first occurs at 0
    ("an n-gram longer than max_ngram seen before", [2, 3, 7, 1, 2, 3, 9, 2, 3, 8, 1, 2, 3], 2, 2),
    # the suffix's digits begin an earlier id (2 in 21): a search of the ids as text finds it
    ("ids whose digits occur in others", [21, 7, 2, 9, 2], 2, 1),
]


def _lookup(tokens, k, max_ngram, *, ngrams=None, latest=False, itself=False, cap=True,
            skip=True) -> list[int]:
    """A lookup with one typical mistake switched on: ``ngrams`` (the order of n), ``latest``
    occurrence first, ``itself`` (the suffix may match itself), ``cap`` at k off, ``skip`` the
    matched n-gram off."""
    order = ngrams if ngrams is not None else range(min(max_ngram, len(tokens) - 1), 0, -1)
    for n in order:
        suffix = tokens[-n:]
        starts = range(len(tokens) - n + (1 if itself else 0))
        for start in (reversed(starts) if latest else starts):
            if tokens[start : start + n] == suffix:
                after = tokens[start + (n if skip else 0):]
                return after[:k] if cap else after
    return []


def _text_lookup(tokens, k, max_ngram) -> list[int]:
    """The lookup done on the ids written out as text (" ".join): a suffix's digits match inside
    a longer id."""
    text = " ".join(map(str, tokens))
    for n in range(min(max_ngram, len(tokens) - 1), 0, -1):
        suffix = " ".join(map(str, tokens[-n:]))
        at = text.find(suffix)
        if 0 <= at < len(text) - len(suffix):
            start = len(text[:at].split())
            return tokens[start + n : start + n + k]
    return []


def draft_mistakes(tokens, k, max_ngram) -> list[tuple]:
    """(value, hint) of the typical mistakes on one case."""
    top = min(max_ngram, len(tokens) - 1)
    return [
        (_lookup(tokens, k, max_ngram, latest=True), "you took the LATEST earlier occurrence: take "
                                                     "the earliest (as "
         "transformers' PromptLookupCandidateGenerator does): in a quoted prompt it is the passage "
         "itself, and it has the most tokens after it"),
        (_lookup(tokens, k, max_ngram, ngrams=range(1, top + 1)), "you tried the short n-grams "
                                                                  "first: try n from "
         "max_ngram DOWN to 1: a longer match is more likely to continue the same way"),
        (_lookup(tokens, k, max_ngram, itself=True), "the suffix matched itself (the last window, "
                                                     "with nothing after "
         "it), so you drafted nothing instead of trying a shorter n-gram: search only the windows "
         "that end before the last token, range(len(tokens) - n), and fall back to shorter n-grams "
         "when the longest one is not found"),
        (_lookup(tokens, k, max_ngram, ngrams=[top] if top > 0 else []),
         "no fallback: when the longest n-gram does "
         "not occur earlier, try n - 1, n - 2, ... down to 1"),
        (_lookup(tokens, k, max_ngram, cap=False), "cap the draft at k tokens (tokens[start + n : "
                                                   "start + n + k])"),
        (_lookup(tokens, k, max_ngram, skip=False), "the draft starts AFTER the matched n-gram: "
         "tokens[start + n : start + n + k], not tokens[start : ...]"),
        (_text_lookup(tokens, k, max_ngram), "you searched the ids as text, where one id's digits "
         "occur inside another (2 in 21): compare lists of ids, tokens[start:start + n] == "
         "tokens[-n:]"),
    ]


@code_checker(draft_solution)
def check_draft(fn) -> str:
    """Exercise: draft(tokens, k, max_ngram): for n = max_ngram..1, the earliest earlier occurrence
    of the last n tokens; the k after it.

    tokens: a list of ints (prompt + output so far). Returns a list of at most k ints, [] when no
    n-gram (n >= 1) of the suffix occurs earlier. Checked on hand-built token lists where each
    typical mistake drafts differently."""
    for label, tokens, k, max_ngram in DRAFT_CASES:
        want = draft_solution(tokens, k, max_ngram)
        got = call_student(fn, list(tokens), k, max_ngram)
        case = f"{label}: draft({tokens}, k={k}, max_ngram={max_ngram})"
        if isinstance(got, torch.Tensor):
            return (f"not quite: for {case} you returned a tensor; return a list of ints "
                    "(.tolist()): the decoder pads and writes the drafts on the host, and a draft "
                    "of length 0 must be []")
        if not isinstance(got, list):
            return (f"not quite: for {case} you returned a {type(got).__name__} ({got!r:.60}); "
                    "return a list of ints ([] when there is no draft)")
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in got):
            kinds = sorted({type(t).__name__ for t in got
                            if not (isinstance(t, int) and not isinstance(t, bool))})
            return (f"not quite: for {case} your list holds {', '.join(kinds)}; return plain ints "
                    "(.tolist(), int(t))")
        if got != want:
            hint = first_match(got, draft_mistakes(tokens, k, max_ngram))
            return (f"not quite: for {case} you drafted {got}, the lookup drafts {want}. Hint: " + (
                hint or "for n from max_ngram down to 1, find the earliest start < len(tokens) - n "
                        "with tokens[start:start + n] == tokens[-n:], and return tokens[start + n "
                        ": start + n + k]"))
    return (f"correct: all {len(DRAFT_CASES)} token lists draft what "
            "kvlab.speculative.prompt_lookup_draft drafts (the longest n-gram first, its earliest "
            "occurrence, at most k tokens, never the suffix itself)")


show_sources(check_draft, draft_solution, speculative.prompt_lookup_draft)


# ---- 3 · the slots of a request in a paged pool --------------------------------------------------


def slots_solution(blocks: list[int], start: int, stop: int, block_size: int) -> list[int]:
    """The package's own (``kvlab.paged_cache.slots_of``): position p lives in the request's block p
    // block_size (look it up in ``blocks``), at offset p % block_size: slot blocks[p // block_size]
    * block_size + p % block_size."""
    return paged_cache.slots_of(blocks, start, stop, block_size)


SLOT_CASES = [  # (label, blocks, start, stop, block_size)
    ("a prefill of 10 tokens over blocks [7, 2, 9]", [7, 2, 9], 0, 10, 4),
    ("a chunk across a block boundary", [7, 2, 9], 3, 9, 4),
    ("one decode step at position 17", [5, 0, 3], 17, 18, 8),
    ("the first slot of a new block", [4, 6], 16, 17, 16),
    ("nothing (start == stop)", [3], 2, 2, 4),
]


def slot_mistakes(blocks, start, stop, block_size) -> list[tuple]:
    at = lambda p, b=blocks: b[p // block_size] * block_size + p % block_size  # noqa: E731
    positions = range(start, stop)
    return [
        (list(positions), "those are the positions: a position is a slot only in a static cache. "
                          "Look the block up in "
         "the request's table: blocks[p // block_size] * block_size + p % block_size"),
        ([blocks[p // block_size] + p % block_size for p in positions],
         "a block id counts blocks, not slots: block b "
         "starts at slot b * block_size"),
        ([blocks[p // block_size] * block_size for p in positions], "the offset inside the block "
                                                                    "is missing: + "
         "p % block_size"),
        ([at(p) for p in range(start, stop + 1)] if stop // block_size < len(blocks) else None,
         "one slot too many: stop is exclusive (positions start .. stop - 1)"),
        ([at(p) for p in range(start, stop - 1)], "one slot too few: the positions are start .. "
                                                  "stop - 1, stop - start "
         "of them"),
        ([at(p) for p in range(0, stop)] if start else None, "the positions start at start, not at "
                                                             "0"),
        ([blocks[p % len(blocks)] * block_size + p // len(blocks) for p in positions] if blocks
         else None,
         "position p is in the request's block number p // block_size, at offset p % block_size"),
    ]


@code_checker(slots_solution)
def check_slots(fn) -> str:
    """Exercise: slots(blocks, start, stop, block_size) = [blocks[p // block_size] * block_size + p
    % block_size for p in start..stop-1].

    blocks: the request's block ids in order (its block-table row). Returns a list of ints, one pool
    slot per position. Checked on non-contiguous, unsorted blocks, chunks that cross a block
    boundary, and an empty range."""
    for label, blocks, start, stop, block_size in SLOT_CASES:
        want = slots_solution(blocks, start, stop, block_size)
        got = call_student(fn, list(blocks), start, stop, block_size)
        case = f"{label}: slots({blocks}, start={start}, stop={stop}, block_size={block_size})"
        if isinstance(got, torch.Tensor):
            return (f"not quite: for {case} you returned a tensor; return a list of ints "
                    "(.tolist()): the scheduler works out slots on the host and copies them into "
                    "the static slot mapping once per step")
        if not isinstance(got, list):
            return (f"not quite: for {case} you returned a {type(got).__name__} ({got!r:.60}); "
                    "return a list of ints, one slot per position ([] for none)")
        if not all(isinstance(s, int) and not isinstance(s, bool) for s in got):
            kinds = sorted({type(s).__name__ for s in got
                            if not (isinstance(s, int) and not isinstance(s, bool))})
            return (f"not quite: for {case} your list holds {', '.join(kinds)}; return plain ints "
                    "(int(s))")
        if got != want:
            hint = first_match(got, slot_mistakes(blocks, start, stop, block_size))
            return (f"not quite: for {case} you gave {got}, expected {want}. Hint: " + (
                hint or "position p lives in block blocks[p // block_size], at offset p % "
                        "block_size: slot blocks[p // block_size] * block_size + p % block_size"))
    return (f"correct: all {len(SLOT_CASES)} cases match kvlab.paged_cache.slots_of: a request's "
            "positions go through its block table, so its blocks can sit anywhere in the pool, in "
            "any order")


show_sources(check_slots, slots_solution, paged_cache.slots_of)


# ---- 4 · blocks held, against a static cache -----------------------------------------------------


def blocks_held(lengths, block_size: int) -> int:
    """The blocks the pool hands out for requests of ``lengths`` tokens: ceil(length / block_size)
    each."""
    return sum(paged_cache.blocks_for(int(n), block_size) for n in lengths)


@checker
def check_blocks_held(answer, *, lengths=(5, 40, 130), block_size: int = 16) -> str:
    """Exercise: requests of ``lengths`` tokens in a paged cache of ``block_size``-token blocks: how
    many blocks in all?"""
    if answer is None:
        return NOT_ANSWERED
    answer = as_number(answer)
    lengths = [int(n) for n in lengths]
    want = blocks_held(lengths, block_size)
    longest = max(lengths)
    mistakes = [
        (sum(n // block_size for n in lengths), "you rounded down: a request of 5 tokens still "
                                                "needs a whole "
         "block, so ceil(length / block_size), -(-length // block_size)"),
        (paged_cache.blocks_for(sum(lengths), block_size), "the requests do not share blocks: "
                                                           "round up each "
         "request's blocks, then add them"),
        (len(lengths) * paged_cache.blocks_for(longest, block_size),
         "that is a static cache's reservation (every "
         "row sized for the longest request): a paged request holds only the blocks its own "
         "tokens fill"),
        (paged_cache.blocks_for(longest, block_size), "that is the longest request's blocks "
                                                      "alone: add every "
         "request's"),
        (sum(lengths), "that is tokens, not blocks: ceil(length / block_size) per request"),
    ]
    verdict = check_number(answer, want, what="the blocks held by requests of "
                                              f"{', '.join(map(str, lengths))} tokens "
                           f"(blocks of {block_size})",
                           hint="each request holds ceil(length / block_size) blocks of its own (a "
                                "block is never shared by two requests); add them up.",
                           mistakes=mistakes)
    if verdict.startswith("correct"):
        slots = want * block_size
        memory = paged_cache.memory_accounting(lengths, block_size, 1)
        verdict += (f". They hold {slots} token slots for {sum(lengths)} tokens (at most "
                    f"{block_size - 1} wasted per request); a static cache sized for the longest "
                    f"request reserves {longest} slots for every row, "
                    f"{len(lengths) * longest} in all: the paged pool holds "
                    f"{memory['paged_fraction']:.0%} of it. Paged memory follows each request's "
                    "length; a static cache reserves the longest for every row")
    return verdict


# ---- 5 · predict, then run: the tokens of one verify step in a batch -----------------------------

VERIFY_CHOICES = {
    "A": "5 tokens for row 0 and 1 for row 1: each row keeps its own right drafts (a counter per "
         "request)",
    "B": "1 token for each row: one shared counter, so the batch keeps the fewest drafts of any "
         "row, plus the model's own token",
    "C": "5 tokens for each row: the best row's drafts are kept for the batch",
    "D": "4 tokens for row 0 and none for row 1",
}
# right in general: an engine keeps a length per request, and each row keeps its own drafts
PER_REQUEST = "A"
VERIFY_WHY = ("kvlab's graph-safe cache has ONE counter for the whole batch (lesson 05), so the "
              "rollback keeps the same number of drafts for every row: the min (kept_drafts). "
              "Every row still gets the model's own token "
              "after them, so at least 1 token per step; row 0's right drafts are thrown away and "
              "drafted again next step. With a counter per request, as serving engines keep, each "
              "row keeps its own: 'A'")


def verify_tokens(prefixes=(4, 0), k: int = 4) -> list[int]:
    """Tokens each row gets from one verify step whose rows have ``prefixes`` right drafts first:
    kept_drafts (the package's own, run now) + 1, the same for every row."""
    rows, verified = drafts_case(list(prefixes), k)
    kept = int(speculative.kept_drafts(rows, verified))
    return [kept + 1] * len(prefixes)


@settings_read
def check_verify_prediction(prediction=None) -> str:
    """Predict, then run: batch 2, k = 4 drafts per row; row 0's 4 drafts are all right, row 1's
    first is wrong. How many tokens does each row get from this one verify step in kvlab (one shared
    counter)? Which of ``VERIFY_CHOICES``? Run here with kept_drafts. 'A' (a counter per request) is
    answered as right in general."""
    made = verify_tokens((4, 0), 4)
    table = {"A": [5, 1], "B": [1, 1], "C": [5, 5], "D": [4, 0]}
    measured = next((key for key, pair in table.items() if pair == made), None)
    if measured is None:  # the package changed under the question: say what the run showed
        return f"the run gave {made} tokens per row, which none of the choices describes"
    verdict = check_prediction(
        prediction, measured=measured, choices=VERIFY_CHOICES,
        what="the tokens each row gets from one verify step (batch 2, k = 4)")
    if (verdict.startswith("not quite: you predicted")
        and choice_of(prediction, VERIFY_CHOICES) == PER_REQUEST):
        verdict = ("not quite for kvlab: 'A' is right for speculative decoding with a counter per "
                   "request, but kvlab decodes into one shared counter, and the run shows "
                   f"{measured!r}: {VERIFY_CHOICES[measured]}")
    if verdict.removeprefix(FILLED_PREDICTION).startswith(
            ("correct", "not quite: you predicted", "not quite for kvlab")):
        verdict += (f" (run just now: kept_drafts = {made[0] - 1}, so {made} tokens). Why: "
                    f"{VERIFY_WHY}")
    return verdict

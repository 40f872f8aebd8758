"""Lesson 07's checkers: each gets its solution (correct), typical wrong answers written out here
(the specific hint), an unattempted stub (not attempted, or the reference filled in under
KVLAB_SOLUTIONS=1), code that raises (reported) and answers of the wrong type (refused, with what to
return)."""

import pytest
import torch
from student_code import assert_unattempted_filled_in_and_raising

from kvlab import paged_cache, speculative
from kvlab.exercises import lesson07
from kvlab.exercises.common import FILLED_PREDICTION, NOT_ANSWERED

CODE_CHECKERS = [lesson07.check_kept_drafts, lesson07.check_draft, lesson07.check_slots]


@pytest.mark.parametrize("check", CODE_CHECKERS, ids=lambda c: c.__name__)
def test_solution_stub_none_and_errors(check, monkeypatch):
    assert check(check.solution).startswith("correct")
    assert_unattempted_filled_in_and_raising(check, monkeypatch)


@pytest.mark.parametrize("check", CODE_CHECKERS, ids=lambda c: c.__name__)
def test_show_solution_prints_the_reference_and_the_package_code(check, capsys):
    check.show_solution()
    shown = capsys.readouterr().out
    assert f"def {check.solution.__name__}(" in shown
    assert any(f"def {name}(" in shown for name in ("kept_drafts", "prompt_lookup_draft",
                                                    "slots_of"))


# ---- 1 · kept drafts -----------------------------------------------------------------------------

def right_prefix(rows, verified):
    return (rows[:, 1:] == verified[:, :-1]).long().cumprod(dim=-1)  # [batch, k]


def kept(rows, verified):
    return right_prefix(rows, verified).sum(-1).min()


# another correct way: the first wrong draft's index, k where none is wrong
def kept_by_argmin(rows, verified):
    wrong = torch.cat([rows[:, 1:] != verified[:, :-1],
                       torch.ones(rows.shape[0], 1, dtype=torch.bool)], dim=1)
    return wrong.long().argmax(dim=-1).min()


# right values, but a Python `if` on a tensor: refused when captured
def kept_with_a_loop(rows, verified):
    counts = []
    for b in range(rows.shape[0]):
        n = 0
        for i in range(1, rows.shape[1]):
            if rows[b, i] != verified[b, i - 1]:
                break
            n += 1
        counts.append(n)
    return torch.tensor(min(counts))


def test_kept_drafts():
    check = lesson07.check_kept_drafts
    assert check(kept).startswith("correct")
    assert check(kept_by_argmin).startswith("correct")
    assert check(lambda r, v: kept(r, v).int()).startswith("correct")  # any integer dtype
    assert "you counted every right draft" in check(
        lambda r, v: (r[:, 1:] == v[:, :-1]).long().sum(-1).min())
    assert "off by one" in check(
        lambda r, v: (r[:, 1:] == v[:, 1:]).long().cumprod(-1).sum(-1).min())
    assert "verified[:, i - 1]" in check(
        lambda r, v: (r[:, 1:] == v[:, 1:]).long().cumprod(-1).sum(-1).min())
    assert "(max)" in check(lambda r, v: right_prefix(r, v).sum(-1).max())
    assert "added the rows' counts" in check(lambda r, v: right_prefix(r, v).sum())
    assert "tokens the step makes" in check(lambda r, v: kept(r, v) + 1)
    per_row = check(lambda r, v: right_prefix(r, v).sum(-1))
    assert "one count per row (right ones)" in per_row and ".min()" in per_row


def test_kept_drafts_on_the_host_is_refused_with_why():
    check = lesson07.check_kept_drafts
    as_int = check(lambda r, v: int(kept(r, v)))
    assert as_int.startswith("not quite: your counts are right, but you returned a Python int")
    assert "captured verify graph" in as_int
    item = check(lambda r, v: torch.tensor(kept(r, v).item()))
    assert (item.startswith("not quite: right eagerly, but a captured graph refuses it")
            and "Tensor.item()" in item)
    loop = check(kept_with_a_loop)
    assert (loop.startswith("not quite: right eagerly, but a captured graph refuses it")
            and "cumprod" in loop)


def test_kept_drafts_frozen_at_capture():
    # a count kept from an earlier call of the same shape: no host read at capture, but frozen there
    memo = {}

    def remembered(rows, verified):
        if rows.shape not in memo:
            memo[rows.shape] = kept(rows, verified)
        return memo[rows.shape]

    frozen = lesson07.check_kept_drafts(remembered)
    assert frozen.startswith(
        "not quite: captured on drafts that keep 2 and replayed on drafts that keep 3, your graph "
                             "gave 1") and "frozen at capture" in frozen


def test_kept_drafts_wrong_types():
    check = lesson07.check_kept_drafts
    assert "long tensor" in check(lambda r, v: kept(r, v).float())
    assert "long tensor" in check(lambda r, v: kept(r, v) > 0)  # a bool
    assert "returned a str" in check(lambda r, v: "two")
    assert "returned a bool" in check(lambda r, v: True)
    assert "a 0-d tensor" in check(lambda r, v: kept(r, v).reshape(1, 1))


def test_kept_cases_tell_the_mistakes_apart():
    cases = lesson07.kept_cases()
    # batch 1..4, k 1..6
    assert [tuple(r.shape) for _, r, _ in cases] == [(1, 6), (1, 2), (1, 4), (3, 5), (2, 7), (4, 3),
                                                     (3, 6)]
    for (label, rows, verified), want in zip(cases, [1, 1, 0, 1, 6, 0, 2], strict=True):
        assert int(speculative.kept_drafts(rows, verified)) == want, label
        assert int(kept(rows, verified)) == want
    _, rows, verified = cases[0]  # batch 1: each mistake of one row gives its own count
    values = [int(v) for v, _ in lesson07.kept_mistakes(rows, verified)[:3]]
    assert values == [2, 3, 4]
    _, rows, verified = cases[3]  # batch 3: the batch mistakes too
    assert [int(v) for v, _ in lesson07.kept_mistakes(rows, verified)] == [2, 3, 0, 0, 4, 8]


# ---- 2 · prompt lookup ---------------------------------------------------------------------------

def lookup(tokens, k, max_ngram, *, order=None, latest=False, itself=False, cap=True,
           skip_ngram=True, tensor=False):
    """The lookup written out, with one mistake at a time."""
    result = []
    for n in order or range(min(max_ngram, len(tokens) - 1), 0, -1):
        suffix = tokens[-n:]
        starts = list(range(len(tokens) - n + (1 if itself else 0)))
        found = [s for s in starts if tokens[s : s + n] == suffix]
        if found:
            start = found[-1] if latest else found[0]
            result = tokens[start + (n if skip_ngram else 0):]
            result = result[:k] if cap else result
            break
    return torch.tensor(result) if tensor else result


def test_draft():
    check = lesson07.check_draft
    assert check(lookup).startswith("correct")
    assert "LATEST earlier occurrence" in check(lambda t, k, m: lookup(t, k, m, latest=True))
    assert "short n-grams first" in check(lambda t, k, m: lookup(t, k, m, order=range(1, m + 1)))
    itself = check(lambda t, k, m: lookup(t, k, m, itself=True))
    assert "the suffix matched itself" in itself and "range(len(tokens) - n)" in itself
    no_fallback = check(
        lambda t, k, m: lookup(t, k, m, order=[min(m, len(t) - 1)] if len(t) > 1 else [1]))
    # drafts what matching the suffix itself drafts: one hint
    assert "fall back to shorter n-grams" in no_fallback
    assert "cap the draft at k" in check(lambda t, k, m: lookup(t, k, m, cap=False))
    assert "starts AFTER the matched n-gram" in check(
        lambda t, k, m: lookup(t, k, m, skip_ngram=False))


def test_draft_wrong_types():
    check = lesson07.check_draft
    assert "returned a tensor; return a list of ints" in check(
        lambda t, k, m: lookup(t, k, m, tensor=True))
    assert "returned a tuple" in check(lambda t, k, m: tuple(lookup(t, k, m)))
    # None for "no draft"
    assert "returned a NoneType" in check(lambda t, k, m: lookup(t, k, m) or None)
    assert "holds Tensor; return plain ints" in check(
        lambda t, k, m: list(torch.tensor(lookup(t, k, m) or [0])))


def test_draft_cases_tell_the_mistakes_apart():
    label, tokens, k, max_ngram = lesson07.DRAFT_CASES[0]
    want = speculative.prompt_lookup_draft(tokens, k, max_ngram=max_ngram)
    # the last mistake, a search of the ids as text, shows only where ids share digits: its case
    values = [tuple(v) for v, _ in lesson07.draft_mistakes(tokens, k, max_ngram)[:-1]]
    assert want not in [list(v) for v in values], label
    # matching the suffix itself and never falling back draft the same ([]): one hint names both
    assert len(set(values)) == len(values) - 1 and values[2] == values[3] == ()
    label, tokens, k, max_ngram = next(c for c in lesson07.DRAFT_CASES if "digits" in c[0])
    *others, (as_text, _) = lesson07.draft_mistakes(tokens, k, max_ngram)
    assert as_text != speculative.prompt_lookup_draft(tokens, k, max_ngram=max_ngram)
    assert as_text not in [v for v, _ in others], label
    # the written-out lookup is the package's
    for label, tokens, k, max_ngram in lesson07.DRAFT_CASES:
        assert (lookup(tokens, k, max_ngram)
                == speculative.prompt_lookup_draft(tokens, k, max_ngram=max_ngram)), label


# ---- 3 · slots in a paged pool -------------------------------------------------------------------

def slots(blocks, start, stop, block_size):
    return [blocks[p // block_size] * block_size + p % block_size for p in range(start, stop)]


def test_slots():
    check = lesson07.check_slots
    assert check(slots).startswith("correct")
    assert "those are the positions" in check(lambda b, start, stop, bs: list(range(start, stop)))
    no_table = lambda b, start, stop, bs: [(p // bs) * bs + p % bs for p in range(start, stop)]  # noqa: E731
    assert "Look the block up in the request's table" in check(no_table)
    assert "block b starts at slot b * block_size" in check(
        lambda b, start, stop, bs: [b[p // bs] + p % bs for p in range(start, stop)])
    assert "offset inside the block is missing" in check(
        lambda b, start, stop, bs: [b[p // bs] * bs for p in range(start, stop)])
    assert "one slot too many" in check(lambda b, start, stop, bs: slots(b, start, stop + 1, bs))
    assert "one slot too few" in check(lambda b, start, stop, bs: slots(b, start, stop - 1, bs))
    assert "start at start, not at 0" in check(lambda b, start, stop, bs: slots(b, 0, stop, bs))


def test_slots_wrong_types():
    check = lesson07.check_slots
    assert "returned a tensor; return a list of ints" in check(
        lambda *a: torch.tensor(slots(*a), dtype=torch.long))
    assert "returned a tuple" in check(lambda *a: tuple(slots(*a)))
    assert "holds float" in check(lambda *a: [float(s) for s in slots(*a)] or [0.5])


def test_slot_cases_are_the_package_s():
    for label, blocks, start, stop, block_size in lesson07.SLOT_CASES:
        assert (slots(blocks, start, stop, block_size)
                == paged_cache.slots_of(blocks, start, stop, block_size)), label
        want = paged_cache.slots_of(blocks, start, stop, block_size)
        if want:  # positions are never the slots, so "no table lookup" always shows
            assert want != list(range(start, stop)), label


# ---- 4 · blocks held -----------------------------------------------------------------------------

def test_blocks_held():
    check = lesson07.check_blocks_held
    assert check(None) == NOT_ANSWERED
    right = check(13)  # 1 + 3 + 9 blocks of 16 for 5, 40 and 130 tokens
    assert (right.startswith("correct") and "390" in right
            and "reserves the longest for every row" in right)
    assert check(torch.tensor(13)).startswith("correct")
    assert "rounded down" in check(10)
    assert "do not share blocks" in check(11)  # ceil(175 / 16)
    assert "static cache's reservation" in check(27)
    assert "longest request's blocks alone" in check(9)
    assert "tokens, not blocks" in check(175)
    assert check(14).startswith("not quite: you gave 14")
    assert check("13 blocks").startswith("correct")  # the question counts blocks
    assert "not a number" in check("13 MiB")
    assert check(3, lengths=(16, 17), block_size=16).startswith("correct")
    assert lesson07.blocks_held((5, 40, 130), 16) == 13


# ---- 5 · predict, then run: one verify step of a batch -------------------------------------------

def test_verify_prediction(monkeypatch):
    check = lesson07.check_verify_prediction
    # the min over rows, plus the model's own token
    assert lesson07.verify_tokens((4, 0), 4) == [1, 1]
    assert lesson07.verify_tokens((4, 4), 4) == [5, 5]
    right = check("B")
    assert right.startswith("correct") and "ONE counter" in right and "counter per request" in right
    # right with a counter per request; kvlab's one shared counter makes it B
    per_request = check("A")
    assert (per_request.startswith("not quite for kvlab: 'A' is right")
            and "counter per request" in per_request)
    assert "one shared counter" in per_request and "'B'" in per_request
    wrong = check("C")
    assert (wrong.startswith("not quite: you predicted 'C'") and "'B'" in wrong
            and "ONE counter" in wrong)
    # any case
    assert check("b").startswith("correct") and "one of 'A', 'B', 'C', 'D'" in check("E")
    # KVLAB_SOLUTIONS=1 fills it in, and says so (round 14)
    assert check(None).startswith(FILLED_PREDICTION + "correct")
    monkeypatch.delenv("KVLAB_SOLUTIONS", raising=False)
    unanswered = check(None)
    assert unanswered.startswith("not predicted") and "min" not in unanswered  # nothing given away

"""The verdict every exercise checker returns: "not answered yet", "correct: ..." or "not quite: ...
Hint: ..."."""

from __future__ import annotations

import contextlib
import contextvars
import copy
import decimal
import functools
import inspect
import linecache
import math
import numbers
import os
import re
import unicodedata
from types import SimpleNamespace

import torch
import transformers

from ..decoding import _random_in_training, check_inputs, check_model
from ..frozen_state import transparent_hook
from ..runtime import as_dtype, count
from ..sizes import model_sizes

NOT_ANSWERED = "not answered yet: replace `answer = None` with your number and run the cell again"


class NotANumber(ValueError):
    """An answer that is not one finite real number; the message says what it is instead."""


def real_number(answer, *, spelled: bool = True, counted: str = "") -> numbers.Real:
    """The one finite real number ``answer`` holds, as a Python int or float (or another
    ``numbers.Real``): a number, a NumPy scalar, a tensor or array of one element (0-d, ``[1]``,
    ``[1, 1]``, ...), a list or tuple of one number, or text that spells one (``"5120"``,
    ``" 5,120 "``, ``"5_120"``, ``"5.1e3"``). Raises :class:`NotANumber` for anything else (a bool,
    a complex number, several elements, other text, NaN or infinity), with what it is and the form
    to give. ``spelled=False`` for a value the student's code returns: text and lists are refused
    there (code that uses the value needs a number). ``counted``: what the question counts, whose
    words may follow the number (:func:`number_in_text`)."""
    if (spelled and isinstance(answer, list | tuple) and len(answer) == 1
        and not isinstance(answer[0], list | tuple)):
        answer = answer[0]  # [5120] or (5120,): the one number inside
    if spelled and isinstance(answer, str):
        answer = number_in_text(answer, counted=counted)
    elif hasattr(answer, "item") and not isinstance(answer, numbers.Number):
        # a tensor, an array, a NumPy scalar
        size = (answer.numel() if callable(getattr(answer, "numel", None))
                else getattr(answer, "size", None))
        if size != 1:
            shape = tuple(getattr(answer, "shape", ()))
            raise NotANumber(f"a {type(answer).__name__} of shape {shape} ({size} elements), not "
                             "one number: return one value (x.item() of a one-element tensor or "
                             "array)")
        answer = answer.item()
        if spelled and isinstance(answer, str):  # a NumPy array of one string: choice_of's rule
            answer = number_in_text(answer, counted=counted)
    elif hasattr(answer, "item") and not isinstance(answer, int | float):
        # numpy's float64, int64, bool_, ...
        answer = answer.item()
    elif isinstance(answer, decimal.Decimal) and answer.is_finite():
        answer = int(answer) if answer == answer.to_integral_value() else float(answer)
    if isinstance(answer, bool) or not isinstance(answer, numbers.Real):
        forms = NUMBER_FORMS if spelled else ("return one number (an int, a float, or x.item() of "
                                              "a tensor)")
        raise NotANumber(f"a {type(answer).__name__} ({answer!r:.80}), not a number: {forms}")
    if isinstance(answer, float) and not math.isfinite(answer):
        raise NotANumber(f"{answer}, which is not a finite number: a division by zero or an "
                         "overflow on the way?")
    return answer


NUMBER_FORMS = "give one number, e.g. 5120, 5120.0, \"5,120\" or a one-element tensor"
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(,\d{3})+(\.\d*)?([eE][+-]?\d+)?")


_NUMBER_WORDS = {word: i for i, word in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty".split())}


def _names_counted(words: str, counted: str) -> bool:
    """Every word of ``words`` (letters only, singular or plural) is a word of ``counted``, the
    question's own description of what it counts: "13 blocks" for "the blocks held", never a
    unit the question does not count in ("13 MiB", "13 bits" for bytes)."""
    said = set(re.findall(r"[a-z]+", counted.casefold()))
    return all(re.fullmatch(r"[a-z]+", w) and ({w, w + "s", w.removesuffix("s")} & said)
               for w in words.casefold().split())


def number_in_text(text: str, *, counted: str = "") -> numbers.Real:
    """The number ``text`` spells (``"5120"``, ``"5,120"`` with commas between thousands,
    ``"5_120"``, ``"5.1e3"``, ``"three"``, spaces or quotes around), as an int where it is one,
    followed or not by words that name what the question counts (``"13 blocks"`` where
    ``counted``, the question's description, says blocks: :func:`_names_counted`); else
    :class:`NotANumber`."""
    spelled = text.strip().strip("'\"").strip()
    worded = re.fullmatch(r"(\S+)\s+([^\d\s].*?)\.?", spelled)
    if worded and counted and _names_counted(worded[2], counted):
        spelled = worded[1]
    if spelled.casefold() in _NUMBER_WORDS:
        return _NUMBER_WORDS[spelled.casefold()]
    digits = spelled.replace(",", "") if _THOUSANDS.fullmatch(spelled) else spelled
    for parse in (int, float):
        try:
            # int and float both read "5_120"; float reads "nan" and "inf" (refused after)
            return parse(digits)
        except ValueError:
            pass
    raise NotANumber(f"the text {text!r:.80}, which is not a number: {NUMBER_FORMS}")


def truth(value) -> bool | None:
    """``value`` as a Python bool where it holds one: a bool, a NumPy bool (``np.bool_``), a
    one-element bool tensor or array; else None (``1``, ``"true"``, None: not a bool)."""
    if isinstance(value, bool):
        return value
    dtype = getattr(value, "dtype", None)
    if (dtype == torch.bool or getattr(dtype, "kind", "") == "b") and (
            getattr(value, "size", None) == 1 or getattr(value, "numel", lambda: 0)() == 1):
        return bool(value.item())
    return None


def number_text(number: numbers.Real, spec: str = ",") -> str:
    """``number`` (any ``numbers.Real``: an int, a float, a Fraction, a NumPy number) formatted
    with ``spec``: as itself where its type takes ``spec``, else as a float; a number past a
    float's range (``10**400``) or a whole one of more than 21 digits as ``d.ddde+N``. Every number
    a checker shows goes through here."""
    if isinstance(number, numbers.Rational) and abs(number) >= 10**21:
        digits, sign = str(abs(int(number))), "-" if number < 0 else "+" if "+" in spec else ""
        return f"{sign}{digits[0]}.{digits[1:4]}e+{len(digits) - 1}"
    try:
        return format(number, spec)
    except (TypeError, ValueError, OverflowError):  # a Fraction takes no spec before Python 3.12
        return format(float(number), spec)


def as_number(answer):
    """``real_number(answer)`` where ``answer`` holds one finite real number, else ``answer``
    unchanged: what a number checker's entry does, so that its own comparisons see a Python number
    (``check_number`` then refuses the rest with what it is)."""
    try:
        return real_number(answer)
    except NotANumber:
        return answer


def given_step(answer: numbers.Real, *, rounded_whole: bool = False) -> float:
    """Half a unit of the last digit ``answer`` gives, where it gives 3 significant digits or more
    (``1660.5``: 0.05; ``0.0123``: 0.00005), else 0. A float is read as its shortest
    spelling (``repr``): how far a right value may lie from an answer rounded to the digits it
    shows. ``rounded_whole``: a whole number's trailing zeros are not digits it gives (``1280``:
    5), for a measured or computed quantity; a count (the default) given as an int is read to its
    last digit; a whole float to its last digit, or, ending in 3 zeros or more, to its last
    nonzero digit (``1020.0``: 0.5; ``1.879e9``: 5e5, how a count rounded to 4 digits is
    written)."""
    if isinstance(answer, float) and answer.is_integer():
        whole = int(answer)  # "100.0" gives 3 digits, "1.879e9" 4: the larger reading
        written_rounded = whole % 1000 == 0  # 1020.0 is a count to its last digit, 1.879e9 is not
        return max(given_step(whole, rounded_whole=rounded_whole),
                   given_step(whole, rounded_whole=written_rounded))
    if not isinstance(answer, int | float) or isinstance(answer, bool):
        return 0.0
    spelled = decimal.Decimal(repr(answer))
    shown = (spelled.normalize() if rounded_whole and isinstance(answer, int)
             else spelled).as_tuple()
    if len(shown.digits) < 3 or not isinstance(shown.exponent, int):
        return 0.0
    return 0.5 * 10.0 ** shown.exponent


# relative gap of two float computations of one value (another order of the same operations)
NOISE = 1e-9


def _whole(x: numbers.Real) -> bool:
    try:
        return x == int(x)
    except (OverflowError, ValueError, TypeError):
        return False


def within_noise(a: numbers.Real, b: numbers.Real) -> bool:
    """True where ``a`` and ``b`` are one value up to floating-point rounding (``math.isclose``,
    ``NOISE`` relative): two orderings of one formula. Two whole numbers are counts: equal only
    when equal."""
    try:
        if a == b:
            return True
        if _whole(a) and _whole(b):
            return False
        return math.isclose(a, b, rel_tol=NOISE)
    except (OverflowError, TypeError, ValueError):
        return False


def is_right(answer: numbers.Real, expected: numbers.Real, *, rel_tol: float = 0.0,
             mistakes=()) -> bool:
    """True where ``answer`` (a real number) is ``expected``: equal up to float rounding
    (:func:`within_noise`), whatever the mistakes; or within ``rel_tol``, or equal at the precision
    it is given in (:func:`given_step`), and nearer ``expected`` than the value of every named
    mistake (``(value, hint)``, None values skipped): an answer as near a mistake as the right
    value, or nearer, is that mistake, whatever the tolerance."""
    try:
        error = abs(answer - expected)
    except OverflowError:  # an int past a float's range against a float: far from it
        return False
    if within_noise(answer, expected):
        return True
    # a quantity with a tolerance (rel_tol > 0) is not a count: "1280" may be 3 digits of it
    step = max(given_step(answer), given_step(answer, rounded_whole=rel_tol > 0))
    if not (error <= rel_tol * abs(expected) or error <= step * (1 + 1e-12)):
        return False
    return nearest_mistake(answer, expected, mistakes, rel_tol=math.inf) is None


def nearest_mistake(answer: numbers.Real, expected: numbers.Real, mistakes, *,
                    rel_tol: float = 0.0) -> str | None:
    """The hint of the named mistake (``(value, hint)`` of ``mistakes``) that ``answer`` is at least
    as near as it is to ``expected`` and within ``rel_tol`` of it (or equal at the precision the
    answer is given in), the nearest first; else None. A mistake equal to ``expected`` up to float
    rounding (:func:`within_noise`: a slip that changes nothing for these settings) or of no
    number is skipped."""
    try:
        error = abs(answer - expected)
    except OverflowError:
        error = math.inf
    near = []
    for value, hint in mistakes:
        if value is None or isinstance(value, bool) or not isinstance(value, numbers.Real):
            continue
        try:
            gap = abs(answer - value)
            if within_noise(value, expected) or gap > error:
                continue
        except OverflowError:
            continue
        if (rel_tol == math.inf or gap <= rel_tol * abs(value)
                or gap <= given_step(answer) * (1 + 1e-12)):
            near.append((gap, hint))
    return min(near, key=lambda item: item[0])[1] if near else None


def check_number(answer, expected: float, *, what: str, hint: str, rel_tol: float = 0.0,
                 mistakes=()) -> str:
    """Compare a numeric ``answer`` with ``expected`` (:func:`is_right`: exactly, within
    ``rel_tol``, or at the precision the answer is given in, and nearer it than every named
    mistake of ``mistakes``, ``(value, hint)``); return the verdict. Any one real number is
    accepted (``real_number``: a tensor or array of one element too); NaN and infinity are wrong.
    A wrong answer near a named mistake (:func:`nearest_mistake`, within ``rel_tol``) gets that
    mistake's hint, else ``hint``."""
    if answer is None:
        return NOT_ANSWERED
    try:
        answer = real_number(answer, counted=what)
    except NotANumber as e:
        return f"not quite: {what} is a number, but you gave {e}"
    if is_right(answer, expected, rel_tol=rel_tol, mistakes=mistakes):
        return f"correct: {what} = {number_text(expected)}"
    hint = nearest_mistake(answer, expected, mistakes, rel_tol=rel_tol) or hint
    try:
        error = abs(answer - expected)
    except OverflowError:  # an int past a float's range against a float: far from it
        error = math.inf
    try:
        share = float(error / abs(expected)) if expected else None
    except OverflowError:  # an int past a float's range over a small one
        share = math.inf
    # a near miss keeps two digits: never "0.0% off" for a wrong answer
    off = (f"{number_text(error, 'g')} off" if share is None else
           "many orders of magnitude off" if share == math.inf else
           f"{share:.1%} off" if round(share, 3) else f"{share * 100:.2g}% off")
    return f"not quite: you gave {number_text(answer)} for {what}, which is {off}. Hint: {hint}"


def plain_setting(value):
    """``value`` with an integer held by a NumPy scalar or a 0-d integer tensor or array
    (``np.int64(4)``, ``torch.tensor(4)``) made a Python int, in a list or tuple too; anything else
    unchanged (the code that uses a setting refuses a wrong one with its own message)."""
    if isinstance(value, list | tuple):
        return (type(value)(plain_setting(v) for v in value) if type(value) in (list, tuple)
                else value)
    dtype = getattr(value, "dtype", None)
    integral = dtype is not None and not isinstance(value, bool) and (
        (isinstance(dtype, torch.dtype) and not dtype.is_floating_point and not dtype.is_complex
         and dtype != torch.bool) or getattr(dtype, "kind", "") in ("i", "u"))
    return int(value.item()) if integral and getattr(value, "ndim", None) == 0 else value


# The checkers' int settings and the least each takes, by name: a count of tokens, of steps, of
# rows, a size. A checker whose exercise needs more of one names it in _OWN_MINIMUMS (by the
# checker's name), e.g. a graph replayed needs two tokens: one from the prefill, one replayed.
_COUNTS = {"new_tokens": 1, "prompt_len": 1, "tokens": 1, "batch": 1, "max_cache_len": 1,
           "length": 1, "n": 2, "warmup": 1, "extra": 1, "k": 1, "bucket": 1, "steps": 0,
           "rows": 1, "running": 1, "block_size": 1}
# settings that are a list of such counts: not empty, each at least this
_COUNT_LISTS = {"lengths": 1, "buckets": 1}
_OWN_MINIMUMS = {
    # one token is the prefill's argmax: a loop that never appends it would pass
    "check_naive_decode": {"new_tokens": 2},
    # one token never reads the student's cache back in the model's decode
    "check_cache_update": {"new_tokens": 2},
    # step 0 is the prefill: one token makes no step to check
    "check_decode_step": {"new_tokens": 2},
    # one token is the prefill's: the graph is never replayed
    "check_no_warmup_prediction": {"new_tokens": 2},
    # one replay reads the buffers exactly as capture left them: a loop that never refills or
    # advances them shows only from the second replay on (n=3: the prefill's token, two replays)
    "check_graph_decode": {"n": 3},
}


def _bound(read, args: tuple, kwargs: dict) -> None:
    """Refuse a call that does not fit the checker's own signature (the one its caller sees): a
    setting it does not take, a setting given by position, a setting it needs left out."""
    sig = inspect.signature(read)  # follows __wrapped__ to the check function written
    params = list(sig.parameters.values())
    name = read.__name__
    settings = [p.name for p in params[1:] if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
    takes = (f"it takes {', '.join(f'{s}=' for s in settings)}" if settings
             else "it takes no settings")
    unknown = [k for k in kwargs if k not in sig.parameters]
    if unknown:
        raise TypeError(f"{name}() has no setting {unknown[0]!r}: {takes} (a typo?)")
    try:
        sig.bind_partial(*args, **kwargs)
    except TypeError:
        by_position = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
        named = [p.name for p in params if p.kind is p.KEYWORD_ONLY]
        example = "model" if "model" in named else named[0] if named else "model"
        raise TypeError(f"{name}() got {len(args)} values by position, but takes only "
                        f"{' and '.join(by_position) or 'none'} so: pass the settings by name "
                        f"(e.g. {example}=...); {takes}") from None
    given = {p.name for p in params[:len(args)]} | kwargs.keys()
    missing = [p.name for p in params[1:] if p.default is p.empty
               and p.kind is not p.VAR_KEYWORD and p.kind is not p.VAR_POSITIONAL
               and p.name not in given]
    if missing:
        raise TypeError(f"{name}() needs the setting {missing[0]}=: {takes}")


def settings_read(fn=None, *, read: dict | None = None, together=None):
    """Make ``fn``'s keyword settings plain (:func:`plain_setting`) before it runs, and refuse a
    wrong one with an error of its own: the door of every checker. Refused: a call that does not
    fit the checker's signature (an unknown setting, a setting given by position, one left out), a
    count below its least (``_COUNTS``), ``model=`` that is not a model or one in train mode with
    a live dropout (it would make random tokens), and whatever a reader of ``read`` (setting name
    -> function that returns the setting as the checker uses it, or raises) refuses, and settings
    that do not go together (``together``: a function of the keyword settings, read, with the
    defaults of those left out, that raises :class:`SettingError`). A wrong setting is the
    caller's, never a "not quite" for the student's code."""
    if fn is None:
        return functools.partial(settings_read, read=read, together=together)

    @functools.wraps(fn)
    def read_settings(*args, **kwargs):
        _bound(read_settings, args, kwargs)
        settings = {k: plain_setting(v) for k, v in kwargs.items()}
        for name, reader in (read or {}).items():
            if name in settings:
                settings[name] = reader(settings[name])
        least = {**_COUNTS, **_OWN_MINIMUMS.get(read_settings.__name__, {})}
        for name, minimum in least.items():
            if name in settings:
                settings[name] = count(settings[name], name, minimum=minimum)
        for name, minimum in _COUNT_LISTS.items():
            if name in settings:
                settings[name] = _counts(settings[name], name, minimum)
        if settings.get("dtype") is not None:
            settings["dtype"] = dtype_setting(settings["dtype"])
        if settings.get("config") is not None and not isinstance(settings["config"],
                                                                 transformers.PretrainedConfig):
            made = "model.config" if hasattr(settings["config"], "config") else "a model's config"
            raise ValueError(f"config= takes a transformers config ({made}), got "
                             f"{type(settings['config']).__name__}")
        if settings.get("config") is not None:
            _sizes_readable(settings["config"])
        if settings.get("model") is not None:
            check_model(settings["model"])
            dropout = _random_in_training(settings["model"])
            if dropout is not None:
                raise ValueError(f"model=: {dropout}")
        if together is not None:  # every setting, the defaults of those left out too
            params = list(inspect.signature(read_settings).parameters.values())[1:]
            together(**{p.name: settings.get(p.name, p.default) for p in params
                        if p.kind is p.KEYWORD_ONLY})
        return fn(*args, **settings)

    return read_settings


def _sizes_readable(config) -> None:
    """Refuse ``config=`` that ``kvlab.sizes`` cannot read (no positive layers, heads, MLP size,
    vocabulary, or heads that do not divide): every checker of a config counts with it, and its
    error inside the check would read as the student's."""
    try:
        model_sizes(config)
    except (ValueError, AttributeError) as e:
        kind = getattr(config, "model_type", "") or type(config).__name__
        raise SettingError(f"config=: kvlab.sizes cannot read this {kind} config ({e}); the "
                           "exercises count a Llama-style decoder: pass a Llama, Mistral, Qwen2 or "
                           "Qwen3 config whose sizes fit (or none: a small GQA config)") from None


def dtype_setting(dtype) -> torch.dtype:
    """A checker's ``dtype=`` as a torch.dtype: a torch.dtype, or a name (``"float16"``, ``"fp16"``,
    ``"torch.bfloat16"``); anything else (a number, a NumPy dtype, an unknown name) is a
    ValueError that says what to give."""
    try:
        if isinstance(dtype, torch.dtype | str):
            return as_dtype(dtype)
    except ValueError:
        pass
    raise ValueError(f"dtype= must be a torch.dtype (e.g. torch.float16, or model.dtype) or its "
                     f"name (\"float16\", \"bf16\"), got {dtype!r:.80}")


def _counts(values, name: str, minimum: int) -> tuple[int, ...]:
    """``values`` (a list, tuple, set or range of counts, a 1-D NumPy array or tensor of integers)
    as a tuple of ints of at least ``minimum``, else a ValueError naming ``name``."""
    if getattr(values, "ndim", None) == 1 and callable(getattr(values, "tolist", None)):
        values = [plain_setting(v) for v in values]  # an array or tensor: its entries, each checked
    elif isinstance(values, range):
        values = list(values)
    elif isinstance(values, set | frozenset):  # in order where its entries compare
        try:
            values = sorted(values)
        except TypeError:
            values = list(values)
    if not isinstance(values, list | tuple) or not values:
        raise ValueError(f"{name} must be a non-empty list or tuple of ints, got {values!r:.80}")
    return tuple(count(v, f"every entry of {name}", minimum=minimum) for v in values)


# The layers of the checkers' own tiny models: more than the two of kvlab's tiny models, so that
# code with a layer count written in (range(2), storage for layers 0 and 1) fails; SmolLM2 has 30.
CHECK_LAYERS = 3


def checker_model(name: str, seed: int = 0):
    """The tiny random model ``name`` (``kvlab.lab.models.tiny_model``'s, float32) with
    :data:`CHECK_LAYERS` decoder layers, built afresh (student code cannot spoil the next check)."""
    from ..lab.models import tiny_model

    return tiny_model(name, seed=seed, layers=CHECK_LAYERS)


def check_prompt_ids(model, prompt_ids, new_tokens: int) -> None:
    """Refuse ``prompt_ids=`` of a checker that the model cannot decode from (not a LongTensor
    ``[batch, prompt_len]`` on the model's device, ids outside its vocabulary, too long), with
    kvlab.decode's own messages."""
    check_inputs(model, prompt_ids, new_tokens, tokenizer_output=False, name="prompt_ids")


# integer dtypes wide enough for any token id or position (a vocabulary of 49152, a long context)
WIDE_INTEGERS = (torch.int64, torch.int32)


def index_dtype_problem(tensor: torch.Tensor, what: str,
                        widths: tuple = WIDE_INTEGERS) -> str | None:
    """What is wrong with ``tensor``'s dtype for ``what`` (token ids, positions: indices), else
    None: they must be one of ``widths`` (default int64, torch.long, what argmax and arange give, or
    int32); a float, a complex, a bool or a narrower integer (uint8 wraps at 256, int16 at 32768) is
    refused."""
    if tensor.dtype in widths:
        return None
    integer = not (tensor.dtype.is_floating_point or tensor.dtype.is_complex
                   or tensor.dtype == torch.bool)
    why = (f"they are integers, not {tensor.dtype}" if not integer else
           f"{tensor.dtype} is too narrow: ids and positions past its range would wrap (SmolLM2's "
           "vocabulary is 49152)" if tensor.dtype in (torch.uint8, torch.int8, torch.int16) else
           f"{tensor.dtype} is refused here: index_copy_ takes torch.long indices only")
    return (f"{what} are indices: return a LongTensor (torch.long, what argmax, torch.arange and "
            f"tokenizers give); {why}.")


class SettingError(ValueError):
    """Settings of a checker that do not go together (each right alone): the caller's error, raised
    to the caller, never a verdict on the answer."""


def read_record(record, *, has: str, kind: str, example: str) -> dict:
    """``record=`` as the dict a checker reads (one that holds the key ``has``): the dict itself,
    the path of its .json (a str or Path, read with ``kvlab.lab.bench.load``), or a file of named
    sections (``data/lesson05_gpu.json``) with exactly one section that holds ``has``. Anything
    else is a :class:`SettingError` that names what to pass (``kind``: what the record is;
    ``example``: where to get the right one)."""
    from ..lab.bench import loaded

    try:
        record = loaded(record, "record=", f"pass {example}")
    except ValueError as e:
        raise SettingError(str(e)) from None
    if isinstance(record, dict) and has not in record:
        # a file of sections: the one that holds `has`, if only one does
        sections = [k for k, v in record.items() if isinstance(v, dict) and has in v]
        if len(sections) == 1:
            return record[sections[0]]
        if sections:
            named = ", ".join(map(repr, sections))
            raise SettingError(f"record= holds {len(sections)} records ({named}): pass one of "
                               f"them, e.g. record=data[{sections[0]!r}]")
    if not isinstance(record, dict) or has not in record:
        what = (f"a dict with {sorted(map(str, record))[:6]}" if isinstance(record, dict)
                else f"a {type(record).__name__}")
        raise SettingError(f"record= must be {kind} (a dict with {has!r}, or the path of its "
                           f".json), got {what}: pass {example}")
    return record


def record_rows(record: dict, key: str, needs: tuple[str, ...], kind: str) -> list[dict]:
    """``record[key]``, a list of rows (dicts) that each hold every key of ``needs``; else a
    :class:`SettingError` naming the row and the key it lacks (``kind``: what the record is)."""
    rows = record[key]
    if not isinstance(rows, list | tuple):
        raise SettingError(f"record[{key!r}] must be a list of rows, got a "
                           f"{type(rows).__name__}: pass {kind} as written")
    for i, row in enumerate(rows):
        missing = ([k for k in needs if k not in row] if isinstance(row, dict) else None)
        if missing is None or missing:
            what = (f"has no {missing[0]!r}" if missing else f"is a {type(row).__name__}")
            raise SettingError(f"row {i} of record[{key!r}] {what}: every row is a dict with "
                               f"{', '.join(map(repr, needs))}; pass {kind} as written")
    return list(rows)


def summary(fn) -> str:
    """The first paragraph of ``fn``'s docstring on one line (a checker's hint; a docstring wraps at
    100)."""
    return " ".join((fn.__doc__ or "").strip().split("\n\n")[0].split())


def checker(fn=None, *, read: dict | None = None, together=None):
    """Make ``fn`` a checker that always returns a verdict: ``None`` as the answer is "not answered
    yet", and an answer the comparison cannot even handle (a wrong type, a tensor on another device,
    ...) gets "not quite" with what went wrong, never a traceback. ``read``, ``together``: readers
    of settings and a check of them together (:func:`settings_read`), run at the door, before the
    answer is looked at: a setting the checker cannot use is the caller's error, never a "not
    quite"."""
    if fn is None:
        return functools.partial(checker, read=read, together=together)

    @functools.wraps(fn)
    @settings_read(read=read, together=together)
    def check(answer=None, *args, **kwargs) -> str:
        if answer is None:
            return NOT_ANSWERED
        try:
            return fn(answer, *args, **kwargs)
        except SettingError:
            raise
        except Exception as e:
            # the answer's shape or type, or a setting the checker cannot use: say so
            return (f"not quite: this answer could not be checked ({type(e).__name__}: "
                    f"{str(e).splitlines()[0][:200]}). Hint: {summary(fn)}")

    return check


# ---- exercises where the student writes code (issue 14's shape; every lesson uses it) ------------
#
# A code exercise in a notebook is a cell tagged ``exercise`` holding a stub the student replaces:
#
#     def attend(q, keys, values):          # the student's code goes here
#         raise NotImplementedError         # <- "not attempted" until this line is gone
#     print(lesson02.check_attend(attend))  # a verdict, never a traceback
#     # lesson02.check_attend.show_solution()  <- a solution, only on request
#
# With ``KVLAB_SOLUTIONS=1`` in the environment (the test suite sets it), a stub that is still
# unattempted is replaced by the reference solution, so nbmake runs every checker's full path
# against the reference.


SOLUTIONS_ENV = "KVLAB_SOLUTIONS"
NOT_ATTEMPTED = ("not attempted: replace the `raise NotImplementedError` line with your code and "
                 "run the cell again (the lesson runs on without it)")


class NotAttempted(Exception):
    """The student's code still raises NotImplementedError (or the answer is still None)."""


def solutions_filled_in() -> bool:
    """True where ``KVLAB_SOLUTIONS=1``: unattempted exercises are checked with the reference
    solution."""
    return os.environ.get(SOLUTIONS_ENV, "") == "1"


# code under these raises its own NotImplementedError: never the stub's
_LIBRARIES = tuple(os.path.dirname(m.__file__) + os.sep for m in (torch, transformers)) + (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,)  # kvlab's own


def stub_raised(error: NotImplementedError) -> bool:
    """True where ``error`` is the stub's own ``raise NotImplementedError``: raised by a raise
    statement in the student's code (not by torch or transformers underneath it, e.g. a meta tensor
    copied to the CPU), or bare (no message) where the source line cannot be read."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return not error.args
    filename = tb.tb_frame.f_code.co_filename
    if filename.startswith(_LIBRARIES) or "site-packages" in filename:
        return False
    line = linecache.getline(filename, tb.tb_lineno, tb.tb_frame.f_globals).strip()
    return bool(re.search(r"\braise\b", line)) if line else not error.args


class Misplaced(Exception):
    """The student's code returned a tensor no comparison can read: not dense, or not on the
    inputs' device (the message says which, and what to return)."""


def _inputs_device(args) -> torch.device | None:
    """The device of the first tensor (or model) among ``args``, else None."""
    for arg in args:
        if isinstance(arg, torch.Tensor):
            return arg.device
        if isinstance(arg, torch.nn.Module):
            weight = next(arg.parameters(), None)
            if weight is not None:
                return weight.device
    return None


def misplaced(returned, device: torch.device | None) -> str | None:
    """What is wrong with where the tensors of ``returned`` (a tensor, or a list or tuple of them)
    live, else None: each must be dense (strided), hold values (not on "meta") and sit on
    ``device`` (the inputs'; None: any)."""
    tensors = ([returned] if isinstance(returned, torch.Tensor) else
               [t for t in returned if isinstance(t, torch.Tensor)]
               if isinstance(returned, list | tuple) else [])
    for t in tensors:
        kind = ("a nested tensor" if t.is_nested else
                f"a {str(t.layout).removeprefix('torch.')} tensor" if t.layout != torch.strided
                else f"a tensor on {t.device}" if t.device.type == "meta" or (
                    device is not None and t.device != device) else None)
        if kind is not None:
            on = f" on the inputs' device ({device})" if device is not None else ""
            return (f"your code returned {kind}, which the check cannot compare: return a dense "
                    f"(strided) tensor{on}: no .to(device), .to_sparse() or torch.nested")
    return None


def _snapshot(value):
    """What :func:`_input_change` compares: a tensor's values (a clone), a list's or tuple's
    elements (each snapshot), None for anything else (a model, a cache: not compared here)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, list | tuple):
        return [(e, _snapshot(e)) for e in value]
    return None


def _input_change(value, snapshot) -> str | None:
    """How ``value`` differs from its :func:`_snapshot`, in words, else None."""
    if isinstance(snapshot, torch.Tensor):
        if (value.shape != snapshot.shape or value.dtype != snapshot.dtype
                or value.device != snapshot.device):
            return "a tensor resized or retyped in place"
        same = torch.equal(value, snapshot) or (value.is_floating_point() and torch.allclose(
            value, snapshot, rtol=0, atol=0, equal_nan=True))
        return None if same else "a tensor written in place"
    if isinstance(snapshot, list):
        if len(value) != len(snapshot) or any(e is not old for e, (old, _) in zip(
                value, snapshot, strict=False)):
            return f"a {type(value).__name__} appended to, shortened or edited"
        return next((c for e, (_, snap) in zip(value, snapshot, strict=True)
                     if (c := _input_change(e, snap))), None)
    return None


class Unfinished(Misplaced):
    """The student's code raised the stub's NotImplementedError for a case after it had returned an
    answer for an earlier one: attempted, not finished (never "not attempted")."""


# the student's functions (their __func__) that returned an answer in the running check: a later
# NotImplementedError from one of them is unfinished work (None outside a code checker)
_ANSWERED: contextvars.ContextVar[set | None] = contextvars.ContextVar("answered", default=None)


def _call_text(fn, args, kwargs) -> str:
    """The call in words, its tensors by shape: ``slots([7, 2], 5, 5, 4)``."""
    shown = [f"[{', '.join(map(str, a.shape))}]" if isinstance(a, torch.Tensor) else
             type(a).__name__ if isinstance(a, torch.nn.Module) else f"{a!r:.40}"
             for a in [*args, *kwargs.values()]]
    return f"{getattr(fn, '__name__', 'your function')}({', '.join(shown)})"


def call_student(fn, *args, writes_inputs: bool = False, **kwargs):
    """Call the student's ``fn``; the stub's own NotImplementedError (:func:`stub_raised`) becomes
    NotAttempted, any other error propagates (one torch raises inside the student's code too). A
    tensor or list argument the call changed raises :class:`Misplaced` (the caller's inputs are
    the caller's), unless ``writes_inputs``: the exercises whose contract is to write into what
    they are handed (a cache, a counter, buffers), and calls inside a graph capture. A
    returned tensor that is not dense or not on the inputs' device (:func:`misplaced`) raises
    :class:`Misplaced`: every comparison of a student's tensor reads a dense one, where the inputs
    are."""
    given = {**dict(enumerate(args)), **kwargs}
    snapshots = {} if writes_inputs else {
        key: snap for key, value in given.items() if (snap := _snapshot(value)) is not None}
    answered, key = _ANSWERED.get(), getattr(fn, "__func__", fn)
    try:
        returned = fn(*args, **kwargs)
    except NotImplementedError as e:
        if not stub_raised(e):
            raise
        if answered is not None and key in answered:
            said = f" ({str(e).splitlines()[0][:120]!r})" if str(e) else ""
            raise Unfinished(f"your code raised NotImplementedError{said} for "
                             f"{_call_text(fn, args, kwargs)}, after it answered an earlier case: "
                             "finish that case too") from e
        raise NotAttempted from e
    if answered is not None:
        answered.add(key)
    for key, snap in snapshots.items():
        change = _input_change(given[key], snap)
        if change:
            raise Misplaced(f"your function changed its input {_input_name(fn, key)} ({change}): "
                            "return a new value, do not write into the inputs")
    problem = misplaced(returned, _inputs_device([*args, *kwargs.values()]))
    if problem:
        raise Misplaced(problem)
    return returned


def _input_name(fn, key) -> str:
    """The name of ``fn``'s parameter ``key`` (a position or a name), else "argument N"."""
    if isinstance(key, str):
        return key
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    return params[key].name if key < len(params) else f"argument {key + 1}"


# ---- the caller's model is the caller's: student code runs on it, then it is put back ------------


def _module_state(module) -> dict:
    """A module's attributes: name -> (value, a copy of it where it is a dict: the parameters',
    buffers', submodules' and hooks' dicts, so that adding or replacing an entry shows)."""
    return {k: (v, copy.copy(v) if isinstance(v, dict) else None) for k, v in vars(module).items()}


def _restore(module, state: dict) -> None:
    """Put back ``_module_state``'s attributes; a dict is refilled in place (hook handles hold it
    weakly)."""
    vars(module).clear()
    for key, (value, entries) in state.items():
        if entries is not None:
            value.clear()
            value.update(entries)
        vars(module)[key] = value


def _values_changing(value):
    """``value`` less the hooks transformers installs that change no value (a hooks dict), as it
    is otherwise: a student's ``model(ids, output_hidden_states=True)`` changes nothing."""
    if isinstance(value, dict) and any(map(transparent_hook, value.values())):
        return {k: v for k, v in value.items() if not transparent_hook(v)}
    return value


def _same(a, b) -> bool:
    if a is b:
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(a[k] is b[k] for k in a)
    if (isinstance(a, (torch.Tensor, torch.nn.Module))
        or isinstance(b, (torch.Tensor, torch.nn.Module))):
        return False
    try:
        return bool(a == b)
    except Exception:  # an object without a usable ==
        return False


class ModeChange(str):
    """An entry of ``model_kept``'s list that is a mode flag only (``training``, ``requires_grad``):
    it changes no token the model computes, and the check puts it back."""


def _shown(value) -> str:
    """``value`` for a message: a plain number, text, bool or None as itself, anything else by its
    type."""
    return (repr(value) if value is None or isinstance(value, bool | int | float | str)
            else type(value).__name__)


def _mode_entries(training: dict, grads: dict) -> list[ModeChange]:
    """One entry for the modules whose ``training`` flag flipped (name -> new value) and one for the
    parameters whose ``requires_grad`` did (name -> new value)."""
    entries = []
    if training:
        now = set(training.values())
        mode = ("train mode (model.train())" if now == {True} else "eval mode (model.eval())"
                if now == {False}
                else f"a mixed train/eval mode ({len(training)} modules' .training flags)")
        entries.append(ModeChange(f"it switched the model to {mode}"))
    if grads:
        flag = next(iter(grads.values())) if len(set(grads.values())) == 1 else "mixed"
        entries.append(ModeChange(f"it set requires_grad={flag} on {len(grads)} parameter"
                                  f"{'s' if len(grads) > 1 else ''} (requires_grad_())"))
    return entries


# the settings objects a model holds and reads (model.generate reads generation_config): each is
# snapshot by value, an edit in place named and undone
_SETTINGS = ("config", "generation_config")


@contextlib.contextmanager
def model_kept(model):
    """Run student code on ``model`` inside; on the way out (any way out) every change it made is
    listed in the yielded list and undone: weights and buffers edited in place, replaced
    (``.data =``, a new Parameter) or removed, modules replaced or removed, module settings
    (``variance_epsilon``, hooks), the config and the generation config (``_SETTINGS``), each named
    by its path from ``model`` (``model.model.norm.variance_epsilon``); the mode flags
    (``training``, ``requires_grad``) as one :class:`ModeChange` entry each. Costs one copy of the
    weights."""
    modules = dict(model.named_modules())
    states = {name: _module_state(m) for name, m in modules.items()}
    tensors = {}  # id -> (name, tensor, its values, data_ptr, requires_grad)
    with torch.no_grad():
        for name, t in [*model.named_parameters(remove_duplicate=False),
                        *model.named_buffers(remove_duplicate=False)]:
            if id(t) not in tensors:
                tensors[id(t)] = (name, t, t.detach().clone(), t.data_ptr(), t.requires_grad)
    # the settings objects the model holds (edited in place, never replaced): deep copies
    settings = {name: (obj, copy.deepcopy(vars(obj))) for name in _SETTINGS
                if (obj := getattr(model, name, None)) is not None and hasattr(obj, "__dict__")}
    changed: list[str] = []
    try:
        yield changed
    finally:
        path = {name: f"model.{name}" if name else "model"
                for name in modules.keys() | dict(model.named_modules())}
        now = dict(model.named_modules())
        changed += [f"module {path[name]} {'replaced' if name in now else 'removed'}"
                    for name, m in modules.items() if now.get(name) is not m]
        changed += [f"module {path[name]} added" for name in now if name not in modules]
        training = {}  # module path -> its new training flag
        for name, m in modules.items():
            before, after = states[name], vars(m)
            for key in sorted(before.keys() | after.keys()):
                if key == "_output_capturing_hooks_installed":  # transformers' (put back too)
                    continue
                if key not in before or key not in after:
                    changed.append(f"{path[name]}.{key} "
                                   f"{'added' if key not in before else 'removed'}")
                    continue
                old = before[key][1] if before[key][1] is not None else before[key][0]
                if _same(*map(_values_changing, (old, after[key]))) or key == "_modules":
                    continue  # modules: listed above, by path
                if key == "training":
                    training[path[name]] = after[key]
                elif key in ("_parameters", "_buffers") and isinstance(after[key], dict):
                    for k in sorted(old.keys() | after[key].keys()):
                        how = ("added" if k not in old else "removed" if k not in after[key]
                               else "replaced")
                        changed += ([f"{path[name]}.{k} {how}"]
                                    if old.get(k) is not after[key].get(k) else [])
                elif isinstance(old, dict):
                    changed.append(f"{path[name]}.{key} changed (an entry added, removed or "
                                   "replaced)")
                else:
                    changed.append(f"{path[name]}.{key} changed from {_shown(old)} to "
                                   f"{_shown(after[key])}")
            _restore(m, before)
        grads = {}  # parameter name -> its new requires_grad
        with torch.no_grad():
            for name, t, values, ptr, requires_grad in tensors.values():
                if t.data_ptr() != ptr or t.shape != values.shape or t.dtype != values.dtype:
                    changed.append(f"model.{name} replaced (.data)")
                    t.data = values
                elif not torch.equal(t, values) and not (t.is_floating_point() and torch.allclose(
                        t, values, rtol=0, atol=0, equal_nan=True)):
                    changed.append(f"model.{name} edited in place")
                    t.copy_(values)
                if t.requires_grad != requires_grad:
                    grads[f"model.{name}"] = t.requires_grad
                    t.requires_grad_(requires_grad)
        for attr, (obj, state) in settings.items():
            if vars(obj) == state:
                continue
            keys = sorted(k for k in vars(obj).keys() | state.keys()
                          if k not in state or k not in vars(obj) or vars(obj)[k] != state[k])
            changed += [f"model.{attr}.{k} changed from {_shown(state.get(k))} to "
                        f"{_shown(vars(obj).get(k))}"
                        for k in keys]
            vars(obj).clear()
            vars(obj).update(state)
        changed += _mode_entries(training, grads)


def kept(model, run) -> str:
    """``run()``'s verdict, with ``model`` kept (``model_kept``): student code that changed the
    model is "not quite" whatever ``run`` found (its reference may have run on the changed model),
    and the model is put back. A change of mode flags alone (``model.train()``,
    ``requires_grad_()``) changes no token: the verdict stands, with a note on it."""
    with model_kept(model) as changed:
        verdict = run()
    return model_changed(changed) or verdict + mode_note(changed)


def model_changed(changed: list[str]) -> str | None:
    """The verdict for student code that changed the model (``model_kept``'s list), else None; mode
    flags alone (:class:`ModeChange`) are no verdict (``mode_note``)."""
    if all(isinstance(c, ModeChange) for c in changed):
        return None
    more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
    return (f"not quite: your code changed the model ({'; '.join(changed[:3])}{more}); the check "
            "put it back as it was. Hint: decoding only reads the model: leave its weights, "
            "modules and settings alone.")


def mode_note(changed: list[str]) -> str:
    """A note for mode flags changed (``model_kept``'s :class:`ModeChange` entries), else ""."""
    modes = [c for c in changed if isinstance(c, ModeChange)]
    if not modes:
        return ""
    return (f" (note: your code changed the caller's model: {'; '.join(modes)}; the check put it "
            "back. Leave the mode to the caller: a decode function needs no model.train(), "
            "model.eval() or requires_grad_().)")


def _not_callable(name: str, solution, student) -> str:
    """The verdict for a checker of code handed something it cannot call: the instance of a class
    (where a class is asked for) or what a function returned."""
    if inspect.isclass(solution):
        given = type(student)
        made = given.__module__ not in ("builtins", "torch", "numpy")
        what = f"an instance of {given.__name__}" if made else f"{student!r:.60}"
        return (f"not quite: you passed {what}. Hint: pass the class itself, {name}(YourClass), "
                "not YourClass(): the checker makes its own instances")
    return (f"not quite: you passed a {type(student).__name__} ({student!r:.60}), which cannot "
            f"be called. Hint: pass the function itself, {name}(your_function), not what it "
            f"returns, {name}(your_function(...)): the checker calls it on its own inputs")


def code_checker(solution, *, read: dict | None = None):
    """Make ``check(student_fn, **settings) -> verdict`` a checker of code written against
    ``solution``.

    The verdict is "not attempted" while the student's function still raises NotImplementedError (or
    is None), "not quite: your code raised ..." with the error's first line when it fails otherwise,
    and whatever ``check`` says when it runs. ``check`` calls the student's code through
    :func:`call_student`. Under ``KVLAB_SOLUTIONS=1`` an unattempted function is replaced by
    ``solution`` and the verdict says so. The checker gets ``.solution`` and ``.show_solution()``
    (prints the reference source: on request only). ``read``: readers of settings, run at the
    door (:func:`settings_read`).
    """
    def wrap(check):
        @functools.wraps(check)
        @settings_read(read=read)
        def checked(student=None, *args, **kwargs) -> str:
            filled = ""
            if student is None:
                if not solutions_filled_in():
                    return NOT_ATTEMPTED
                student, filled = solution, ("(the reference solution, filled in by "
                                             f"{SOLUTIONS_ENV}=1) ")
            if not callable(student):
                return _not_callable(check.__name__, solution, student)
            token = _ANSWERED.set(set())
            try:
                return filled + check(student, *args, **kwargs)
            except NotAttempted:
                if not solutions_filled_in() or filled:
                    return NOT_ATTEMPTED
                return (f"(the reference solution, filled in by {SOLUTIONS_ENV}=1) "
                        + check(solution, *args, **kwargs))
            except SettingError:
                raise
            except Misplaced as e:
                return f"not quite: {e}. Hint: {summary(check)}"
            except Exception as e:  # the student's code failed: say how, and where to look
                return (f"not quite: your code raised {type(e).__name__}: "
                        f"{str(e).splitlines()[0][:200] if str(e) else ''}. Hint: {summary(check)}")
            finally:
                _ANSWERED.reset(token)

        checked.solution = solution
        checked.show_solution = lambda: print(inspect.getsource(solution))
        return checked

    return wrap


def _loosely(text: str) -> str:
    """``text`` cased down, without spaces, hyphens, dashes or underscores (but a leading minus sign
    of a number), and without an ``x`` between two numbers (``"2x-4x"`` and ``"2-4x"`` both read
    ``"24x"``)."""
    # a minus sign in front of the first number is a sign, not a separator: "-10%" is not "10%"
    sign = "-" if re.match(r"\s*[\-\u2010-\u2015\u2212]\s*\d", text) else ""
    bare = sign + re.sub(r"[\s\-_\u2010-\u2015]", "", text).casefold()
    return re.sub(r"(?<=\d)x(?=\d)", "", bare)


def _numbers(text: str) -> list[str]:
    """The numbers ``text`` spells, in order (``"2x-4x"``: 2 and 4; ``"24x"``: 24)."""
    return re.findall(r"\d+(?:\.\d+)?", text)


def _described(text: str, choices) -> object | None:
    """The key of ``choices`` (a dict: key -> its description) that ``text`` names as the key
    followed by its own description, or the start of it (``"B: vanilla at bucket + steps"``), else
    None: the description must be the named key's (a key with another's description names
    neither)."""
    if not isinstance(choices, dict):
        return None
    for key, description in choices.items():
        if not (isinstance(key, str) and isinstance(description, str)):
            continue
        head = re.match(rf"\s*{re.escape(key)}\s*[:.)\-\u2010-\u2015=]?\s+(?P<rest>\S.*)", text,
                        re.IGNORECASE | re.DOTALL)
        rest = _loosely(head["rest"]).rstrip(".") if head else ""
        if rest and _loosely(description).startswith(rest):
            return key
    return None


# words before a choice that change nothing: "~10%", "+10%", "about 10%", "option B"
_HEDGE = re.compile(r"^(?:~|\u2248|\+|about|approx(?:imately|\.)?|around|roughly|circa|"
                    r"option|choice|answer)(?:\s*:)?\s*(?<=[~\u2248+.:]|\s)", re.IGNORECASE)
_SUPERSCRIPT = str.maketrans("\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079",
                             "0123456789")


def _plain_text(text: str) -> str:
    """``text`` in plain characters (NFKC: full-width ``"Ｂ"`` is ``"B"``; ``"×"`` is ``"x"``; a
    superscript power ``"10³"`` is ``"10^3"``), without spaces, quotes, brackets or a full stop,
    comma, semicolon, colon, question or exclamation mark around."""
    text = re.sub("[\u2070\u00b9\u00b2\u00b3\u2074-\u2079]+",
                  lambda m: "^" + m[0].translate(_SUPERSCRIPT), text)
    text = unicodedata.normalize("NFKC", text).replace("\u00d7", "x")
    return text.strip().strip("'\"()[].,;:!?").strip()


def _description_alone(text: str, choices) -> object | None:
    """The one key of ``choices`` (a dict: key -> its description) whose description ``text`` is,
    whole or up to its first ``:``, ``;``, ``,`` or ``(`` (``"about a thousand tokens"``), spelled
    loosely (:func:`_loosely`); else None (two keys alike: neither)."""
    if not isinstance(choices, dict) or not _loosely(text):
        return None
    fits = [key for key, description in choices.items() if isinstance(description, str)
            and _loosely(text) in (_loosely(description).rstrip("."),
                                   _loosely(re.split(r"[:;,(]", description)[0]))]
    return fits[0] if len(fits) == 1 else None


def choice_of(prediction, choices):
    """The key of ``choices`` that ``prediction`` names, else None. Any reasonable spelling of a key
    names it: a list or tuple of one element, text in any case with spaces, quotes, brackets or a
    full stop or comma around (``" b "``, ``"'B'"``, ``"(B)"``, ``"B."``, ``"B,"``), in full-width
    or other compatibility characters (NFKC: ``"Ｂ"``, ``"2×"``), after a word that changes nothing
    (``"option B"``, ``"~10%"``, ``"+10%"``, ``"about 10%"``), with spaces, hyphens or underscores
    for one another (``"kept hidden"`` for ``"kept-hidden"``, :func:`_loosely`, the numbers kept:
    ``"24x"`` is not ``"2x-4x"``), a key followed by its own description (:func:`_described`) or
    its description alone (:func:`_description_alone`), where ``choices`` is a dict of
    descriptions, a number key as text (``"1000"``, ``"1,000"``, ``"1e3"``, ``"1k"``, ``"10^3"``),
    followed by words of its own description (``"1000 tokens"``), a NumPy scalar or array of one
    element or a one-element tensor, a number for a ratio or percentage key (:func:`_by_number`:
    4, ``"4"`` or ``"x4"`` for ``"4x"``; 10 or 0.1 for ``"10%"`` where no other key fits), a range
    in words (``"between 2x and 4x"``, ``"2 to 4x"``). Never hashes ``prediction`` (a list is not
    an error)."""
    if isinstance(prediction, list | tuple) and len(prediction) == 1:
        prediction = prediction[0]
    if isinstance(prediction, list | tuple):  # several elements, or a list in a list
        return None
    if getattr(getattr(prediction, "dtype", None), "kind", "") == "U" and prediction.size == 1:
        prediction = prediction.item()  # a NumPy array of one string
    if isinstance(prediction, str):
        text = _plain_text(prediction)
        alone = _description_alone(text, choices)  # before the hedges go: "about a thousand ..."
        if alone is not None:
            return alone
        while (bare := _plain_text(_HEDGE.sub("", text, count=1))) != text:
            text = bare
        text = re.sub(r"(?<=\d)\s*(?:percent|per\s+cent|pct)$", "%", text, flags=re.IGNORECASE)
        # a range in words: "between 2x and 4x", "from 2x to 4x", "2 to 4x" for "2x-4x"
        text = re.sub(r"^(?:between\s+(\S+)\s+and|(?:from\s+)?(\S+)\s+to)\s+(\S+)$",
                      lambda m: f"{m[1] or m[2]}-{m[3]}", text, flags=re.IGNORECASE)
        spelled = {"".join(str(k).split()).casefold(): k for k in choices if isinstance(k, str)}
        if "".join(text.split()).casefold() in spelled:
            return spelled["".join(text.split()).casefold()]
        # looser: "kept hidden", "Kept_Hidden" for "kept-hidden"; "2-4x" for "2x-4x", with the
        # same numbers ("24x" is not "2x-4x")
        loose: dict = {}
        for k in choices:
            if isinstance(k, str):
                loose.setdefault(_loosely(k), []).append(k)
        alike = [k for k in loose.get(_loosely(text), ()) if _numbers(k) == _numbers(text)]
        if len(loose.get(_loosely(text), ())) == 1 and alike:  # two keys spelled alike: neither
            return alike[0]
        described = _described(text, choices)
        if described is not None:
            return described
        return _number_named(text, choices)
    try:
        value = real_number(prediction)
    except NotANumber:
        return None
    return _by_number(value, choices)


def _number_named(text: str, choices):
    """The key of ``choices`` that the number ``text`` spells names (:func:`_by_number`: ``"4"``,
    ``"x4"`` for a ratio, ``"10k"``), or that a key or number followed by words of that key's own
    description names (``"1000 tokens"`` where 1000's description says tokens); else None."""
    key = _by_spelled_number(text, choices)
    ratio = re.fullmatch(r"(\d+(?:\.\d+)?)\s*x", text, re.IGNORECASE)
    if key is None and ratio and float(ratio[1]) > 1:
        # "1.1x" for "10%": a growth spelled as a ratio, where no ratio key fits
        key = _by_number(round((float(ratio[1]) - 1) * 100, 9), {
            k: v for k, v in choices.items() if isinstance(k, str) and k.strip().endswith("%")}
            if isinstance(choices, dict) else ())
    worded = re.fullmatch(r"(\S+?)\s+([^\d\s].*)", text)
    if key is not None or not worded or not isinstance(choices, dict):
        return key
    head, words = worded[1], worded[2]
    keys = [k for k in choices if isinstance(k, str) and k.casefold() == head.casefold()]
    key = keys[0] if len(keys) == 1 else _by_spelled_number(head, choices)
    description = choices.get(key) if key is not None else None
    named = isinstance(description, str) and _loosely(words) in _loosely(description)
    return key if named else None


def _by_spelled_number(text: str, choices):
    """:func:`_by_number` of the number ``text`` spells (``"x4"`` for a ratio too), else None."""
    try:
        value = _spelled_number(re.sub(r"^x\s*(?=\d)", "", text, flags=re.IGNORECASE))
    except NotANumber:
        return None
    return _by_number(value, choices)


def _spelled_number(text: str) -> numbers.Real:
    """The number ``text`` spells (:func:`number_in_text`), with a thousands or millions suffix
    (``"10k"``, ``"1.5M"``) or as a power of a whole number (``"10^3"``, ``"10**3"``); else
    :class:`NotANumber`."""
    power = re.fullmatch(r"(\d+)\s*(?:\^|\*\*)\s*(\d{1,2})", text.strip())
    if power:
        return int(power[1]) ** int(power[2])
    suffixed = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([km])", text.strip(), re.IGNORECASE)
    if not suffixed:
        return number_in_text(text)  # words after it: _number_named reads them
    value = float(suffixed[1]) * (1e3 if suffixed[2] in "kK" else 1e6)
    return int(value) if value.is_integer() else value


def _by_number(value: numbers.Real, choices):
    """The one key of ``choices`` that the number ``value`` names, else None: a number key equal to
    it, a ratio key ``"Nx"`` or a percentage key ``"N%"`` with N equal to it, or a percentage key
    whose fraction it is (0.1 for ``"10%"``). Where two keys fit (0.1 with keys ``"10%"`` and
    ``"0.1%"``), none is named."""
    fits = []
    for k in choices:
        if isinstance(k, numbers.Real) and not isinstance(k, bool):
            fits += [k] if k == value else []
        elif isinstance(k, str) and (unit := re.fullmatch(r"(\d+(?:\.\d+)?)\s*([x%])",
                                                          k.strip().casefold())):
            n = float(unit[1])
            fits += [k] if n == value or (unit[2] == "%" and math.isclose(n, value * 100)) else []
    return fits[0] if len(fits) == 1 else None


RUN_AGAIN = "run the cell that measures it again, then this check"


def bad_measurement(measured: dict, fix: str = RUN_AGAIN) -> str | None:
    """The verdict for a measurement of ``measured`` (name -> value) that cannot decide a prediction
    (NaN, infinity, zero or below, not a number), else None: a checker never calls a prediction
    right against such a number. ``fix``: what to do about it."""
    for name, value in measured.items():
        try:
            number = real_number(value)
        except NotANumber as e:
            return f"not checked: the measurement {name} is {e}; {fix}"
        if number <= 0:
            return (f"not checked: the measurement {name} = {number} is not a positive number, so "
                    f"it cannot decide the question; {fix}")
    return None


def measured_ratio(numerator, denominator, name: str, fix: str = RUN_AGAIN):
    """``(numerator / denominator, None)`` for two measurements (positive, finite: read by
    :func:`bad_measurement` first), or ``(None, verdict)`` where the ratio is no finite number
    (``1e300 / 1e-300``, an int past a float's range): a measurement that cannot be, "not
    checked" like the others. ``name``: the ratio in words (``"doubled_seconds / seconds"``)."""
    try:
        ratio = numerator / denominator
    except OverflowError:
        ratio = math.inf
    return (None, bad) if (bad := bad_measurement({name: ratio}, fix)) else (ratio, None)


# the start of a verdict on a prediction that KVLAB_SOLUTIONS=1 filled in with the measured answer
FILLED_PREDICTION = f"(the measured answer, filled in by {SOLUTIONS_ENV}=1) "


def check_prediction(prediction, *, measured, choices: dict, what: str) -> str:
    """A "predict, then run" question: ``prediction`` names one key of ``choices`` (key -> what it
    would mean; any spelling :func:`choice_of` reads), ``measured`` the key the run just showed.
    Under ``KVLAB_SOLUTIONS=1`` a missing prediction is filled in."""
    filled = ""
    if prediction is None:
        if not solutions_filled_in():
            return ("not predicted: write your prediction (one of " + ", ".join(map(repr, choices))
                    + ") before running")
        prediction, filled = measured, FILLED_PREDICTION
    given, prediction = prediction, choice_of(prediction, choices)
    if prediction is None:
        return f"not quite: {what} is one of {', '.join(map(repr, choices))}, got {given!r:.80}"
    if prediction == measured:
        return f"{filled}correct: {what} is {measured!r}: {choices[measured]}"
    return (f"not quite: you predicted {prediction!r} ({choices[prediction]}), but the run shows "
            f"{measured!r}: {choices[measured]}")


@contextlib.contextmanager
def watch_positions(model, held: torch.Tensor | None = None, read: list | None = None,
                    used: list | None = None):
    """Inside: every run of ``model``'s decoder stack (``model.base_model``, whether ``model``
    calls it or the caller does, through ``__call__`` or ``.forward``) appends the
    ``position_ids`` it was given (a list of ints, or None); and to ``read``, whether they were
    ``held`` itself or a view of it (its storage); and to ``used`` a namespace of what it did:
    ``positions`` its rotary embedding took (a list of ints, None where the model has no
    ``rotary_emb``), ``counter`` the cache's counter before the run (None without a cache, given
    as ``cache=`` or ``past_key_values=``), ``shape`` (rows, tokens per row) fed, ``others`` the
    other keywords given to ``model`` (none where it was not called)."""
    base = getattr(model, "base_model", model)
    forward, signature = base.forward, inspect.signature(base.forward)
    outer = inspect.signature(model.forward)
    seen: list = []
    calling: list = []  # the other keywords of the call of model under way
    running: list = []  # the records of the stack's runs under way (the rotary fills the last)
    rotary = next((m for name, m in model.named_modules() if name.endswith("rotary_emb")), None)

    def outer_spy(module, args, kwargs):
        bound = outer.bind_partial(*args, **kwargs).arguments
        extra = {**bound.get("kwargs", {}), **{k: v for k, v in bound.items() if k != "kwargs"}}
        calling[:] = [k for k, v in extra.items() if v is not None and k not in (
            "input_ids", "cache", "past_key_values", "position_ids")]

    def watched(*args, **kwargs):
        bound = signature.bind_partial(*args, **kwargs).arguments
        given = bound.get("position_ids")
        seen.append(given.reshape(-1).tolist() if isinstance(given, torch.Tensor) else given)
        if read is not None and held is not None:
            read.append(isinstance(given, torch.Tensor) and given.untyped_storage().data_ptr()
                        == held.untyped_storage().data_ptr())
        if used is None:
            return forward(*args, **kwargs)
        named = bound.get("kwargs", {})
        cache = next((c for c in (bound.get("cache"), bound.get("past_key_values"),
                                  named.get("cache"), named.get("past_key_values"))
                      if c is not None), None)
        fed = bound.get("input_ids")
        fed = fed if isinstance(fed, torch.Tensor) else bound.get("inputs_embeds")
        used.append(SimpleNamespace(
            positions=None, counter=int(cache.get_seq_length()) if cache is not None else None,
            shape=tuple(fed.shape[:2]) if isinstance(fed, torch.Tensor) else None,
            others=list(calling)))
        calling.clear()
        running.append(used[-1])
        try:
            return forward(*args, **kwargs)
        finally:
            running.pop()

    def took(module, args, kwargs):
        positions = kwargs.get("position_ids", args[1] if len(args) > 1 else None)
        if running and isinstance(positions, torch.Tensor):
            running[-1].positions = positions.reshape(-1).tolist()

    had_own = "forward" in vars(base)
    base.forward = watched  # an instance attribute: __call__ and .forward both reach it
    handles = [model.register_forward_pre_hook(outer_spy, with_kwargs=True)] if (
        used is not None and base is not model) else []
    if used is not None and rotary is not None:
        handles.append(rotary.register_forward_pre_hook(took, with_kwargs=True))
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()
        if had_own:
            base.forward = forward
        else:
            del base.forward

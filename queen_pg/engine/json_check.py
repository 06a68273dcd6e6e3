"""Whether bytes are one JSON document that comes back exactly once stored: the check of a payload
the broker received as bytes (a binary push's frames and items, a timer's decoded payload).

The rule (docs/wire.md#limits-and-bad-input): RFC 8259 JSON in UTF-8 (no BOM, no NaN, no lone
surrogate), integers within 64 bits (-2^63 .. 2^64-1), no number that reads as an infinite double,
nesting within 254 levels (what orjson writes back), and, for a timer, no U+0000.

Building the document to check it costs Python objects: 25-30 times its size for ``[{},{},...]``
(a 16 MiB payload took 475 MB). So a payload of :data:`SMALL` bytes or more is checked without being
built: msgspec reads it as a ``msgspec.Raw`` (it checks the syntax, escapes and surrogate pairs, and
keeps a view, no copy), then C-speed scans of the bytes check what that does not: UTF-8, U+0000, and
on a copy without the strings (made a step at a time), the numbers (only where a run of digits or an
exponent is long enough to break a rule) and the nesting (the brackets alone, innermost pairs removed
a level per pass). Its extra memory is the copy without strings and the brackets: less than the
payload (0.8 x for ``[{},...]``), and no object per element. A smaller payload is built and written
back as before (faster there, and at most ~30 x :data:`SMALL` of objects, freed at once).

:func:`refusal` names the rule a big document breaks (api/shared/raw_fields.py answers a big JSON body's
free-form field with it, in the words a small body gets).

The two ways decide alike (tests/test_attack_items.py compares them, and the check before them, on
generated documents), except that the scan also refuses a big integer or U+0000 under an object key
that a later duplicate of the key overrides (building keeps only the last value).
"""

from __future__ import annotations

import codecs
import math
import re
from collections.abc import Iterator

import msgspec
import orjson

SMALL = 64 * 1024  # from this size on a payload is checked without being built
MAX_DEPTH = 254  # nesting orjson can write back
_DIGITS = b"0123456789"  # an integer orjson cannot write back has 19 digits at least
_STEP = 1 << 20  # scans that copy do it a step at a time
_OVERLAP = 256  # longer than anything a step looks for
_INT_MIN = -(2**63)
_INT_MAX = 2**64 - 1

_STRING_STEP = 64 * 1024  # strings are dropped a step at a time: at most one step's pieces exist
# Digit runs, found after a cheap look for a long run of zeros in a copy whose digits are all zeros.
_NUMBER_SHAPE = bytes.maketrans(_DIGITS + b"E", b"0" * 10 + b"e")
_LONG_RUN = re.compile(rb"\d{19,}")
_INT_RUN = b"0" * 19
# A double overflows past 1.8e308: with an exponent of 3 digits, or of 2 and 210 integer digits or more.
_BIG_EXPONENT = b"e000"
_LONG_MANTISSA = b"0" * 200
_NUMBER = re.compile(rb"-?\d+(?:\.\d+)?(?:[eE][+\-]?\d+)?")
# U+0000 as an escape, not preceded by an escaping backslash (`\\u0000` is the text "\u0000").
_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")
# Only the brackets of the emptied copy are kept, objects' as arrays'.
_BRACKETS = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def check(payload: bytes, *, nul_ok: bool) -> None:
    """Raises ValueError (or TypeError) unless ``payload`` follows the rule (the module doc). ``nul_ok``:
    U+0000 is allowed (a pushed payload lives in a segment, not a text column)."""
    if len(payload) < SMALL:
        _built(payload, nul_ok)
    else:
        _scanned(payload, nul_ok)


def _built(payload: bytes, nul_ok: bool) -> None:
    """The rule, by building the document (small payloads)."""
    if len(payload) - len(payload.translate(None, _DIGITS)) >= 19:
        # an integer beyond 64 bits may be here: orjson would read it as a float (it would come back
        # rounded), msgspec reads it exactly; writing it back refuses it (and nesting past MAX_DEPTH)
        try:
            value = msgspec.json.decode(payload)
        except msgspec.MsgspecError as exc:
            raise ValueError(str(exc)) from None
        except RecursionError:  # msgspec recurses per level
            raise ValueError("nesting too deep") from None
        orjson.dumps(value)  # JSONEncodeError, a TypeError
    else:
        value = orjson.loads(payload)  # syntax, UTF-8, lone surrogates, infinite doubles, trailing data
        # nesting past MAX_DEPTH takes more than MAX_DEPTH opening and as many closing brackets
        if len(payload) > 2 * MAX_DEPTH and payload.count(b"[") + payload.count(b"{") > MAX_DEPTH:
            orjson.dumps(value)  # nesting past what orjson writes back: JSONEncodeError (a TypeError)
    if not nul_ok and b"\\u0000" in payload and _NUL.search(payload) is not None:
        raise ValueError("U+0000 in a string")


def _scanned(payload: bytes, nul_ok: bool) -> None:
    """The rule, without building the document (the module doc)."""
    rule = refusal(payload)
    if rule is not None:
        raise ValueError(rule)
    if not nul_ok and b"\\u0000" in payload and _NUL.search(payload) is not None:
        raise ValueError("U+0000 in a string")


# What :func:`refusal` names, in the order a small document meets them: decoding refuses bad UTF-8 and an
# infinite number, writing back an integer beyond 64 bits and nesting past MAX_DEPTH.
UTF8 = "not UTF-8"
INFINITE = "a number that reads as an infinite double"
INTEGER = "an integer beyond 64 bits"
DEPTH = f"nesting deeper than {MAX_DEPTH} levels"


def refusal(payload: bytes) -> str | None:
    """Which rule (U+0000 aside) a document breaks, without building it: the syntax (msgspec's words),
    :data:`UTF8`, :data:`INFINITE`, :data:`INTEGER` or :data:`DEPTH`, checked in that order; None: none."""
    try:
        msgspec.json.decode(payload, type=msgspec.Raw)  # syntax, escapes, surrogate pairs, trailing data
    except msgspec.MsgspecError as exc:
        return str(exc)
    except RecursionError:
        return "nesting too deep"
    if not payload.isascii():
        try:
            _utf8(payload)
        except UnicodeDecodeError:
            return UTF8
    bare = without_strings(payload)
    ints, floats = _long_numbers(bare)
    if floats:
        for m in _NUMBER.finditer(bare):
            if math.isinf(float(m.group())):
                return INFINITE
    if ints:
        try:
            _integers(bare)
        except ValueError:
            return INTEGER
    left = _brackets(bare)
    del bare
    try:
        _depth(left)
    except ValueError:
        return DEPTH
    return None


def without_strings(payload: bytes) -> bytes | bytearray:
    """``payload`` (valid JSON) without its strings: what is left is structure, numbers and literals. A
    copy made a step at a time (no object per string): in each, escaped backslashes and quotes are
    dropped, so every quote left opens or closes a string; the pieces between quotes alternate."""
    if b'"' not in payload:
        return payload
    out = bytearray()
    inside = False  # whether the step starts inside a string
    carry = b""  # a run of backslashes that ended the last step (its pairs may continue in this one)
    view = memoryview(payload)
    for at in range(0, len(payload), _STRING_STEP):
        step = carry + view[at : at + _STRING_STEP].tobytes()
        carry = b""
        if b"\\" in step:
            run = len(step) - len(step.rstrip(b"\\"))
            if run and at + _STRING_STEP < len(payload):
                step, carry = step[:-run], step[-run:]
            step = step.replace(b"\\\\", b"").replace(b'\\"', b"")
        parts = step.split(b'"')
        out += b"".join(parts[1 if inside else 0 :: 2])
        if len(parts) % 2 == 0:
            inside = not inside
    return out


def _steps(data: bytes | bytearray, overlap: int = 0) -> Iterator[bytes]:
    """``data`` in copies of :data:`_STEP` bytes (plus ``overlap`` bytes of the next): a scan that makes
    a copy holds one step at a time."""
    view = memoryview(data)
    for at in range(0, len(data), _STEP):
        yield view[at : at + _STEP + overlap].tobytes()


def _long_numbers(bare: bytes | bytearray) -> tuple[bool, bool]:
    """Whether ``bare`` (strings emptied) may hold an integer beyond 64 bits (a run of 19 digits), and a
    number that may read as an infinite double (an exponent of 3 digits, :data:`_LONG_MANTISSA`)."""
    ints = floats = False
    for step in _steps(bare, _OVERLAP):
        shape = step.translate(_NUMBER_SHAPE, b"+")  # digits as 0, E as e, no +: two needles to look for
        if _INT_RUN in shape:
            ints = True
            floats = floats or _LONG_MANTISSA in shape
        floats = floats or _BIG_EXPONENT in shape
        if ints and floats:
            break
    return ints, floats


def _brackets(bare: bytes | bytearray) -> bytearray:
    """The brackets of ``bare``, objects' as arrays'."""
    out = bytearray()
    for step in _steps(bare):
        out += step.translate(_BRACKETS, _NOT_BRACKETS)
    return out


def _integers(bare: bytes | bytearray) -> None:
    """ValueError when an integer of ``bare`` (strings emptied) is beyond 64 bits. A run of 19 digits
    or more is an integer unless it is a fraction's, an exponent's or a float's integer part."""
    for m in _LONG_RUN.finditer(bare):
        start, end = m.span()
        if bare[end : end + 1] in (b".", b"e", b"E"):
            continue  # a float's integer part
        before = bare[start - 1 : start] if start else b""
        if before in (b".", b"e", b"E", b"+") or (before == b"-" and bare[start - 2 : start - 1] in (b"e", b"E")):
            continue  # a fraction or an exponent
        value = -int(m.group()) if before == b"-" else int(m.group())
        if not _INT_MIN <= value <= _INT_MAX:
            raise ValueError("an integer beyond 64 bits")


def _utf8(payload: bytes) -> None:
    """Strict UTF-8 (no encoded surrogates), decoded in steps and dropped."""
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    view = memoryview(payload)
    for at in range(0, len(payload), _STEP):
        decoder.decode(view[at : at + _STEP])  # UnicodeDecodeError is a ValueError
    decoder.decode(b"", final=True)


def _depth(left: bytearray) -> None:
    """ValueError when the brackets ``left`` (balanced: msgspec read them) nest past MAX_DEPTH. Each pass
    removes the innermost pairs, one level: a document is within MAX_DEPTH levels when that many passes
    leave nothing."""
    for _ in range(MAX_DEPTH):
        if not left:
            return
        left = left.replace(b"[]", b"")
    if left:
        raise ValueError(f"nesting deeper than {MAX_DEPTH} levels")

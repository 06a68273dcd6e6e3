"""The wire's text rules (docs/wire.md#text), declared once for every route, the binary bodies and the
tenant header. Imports nothing of ``queen_pg``: the api, the engine and security all use it.

* **Identifiers** (queue, partition, consumer group, namespace, task, trace and event names, KV
  namespaces, keys and lock names, timer keys, transactionIds, lease ids, tenants) hold no control
  character: nothing of Unicode's category Cc, i.e. C0 (U+0000-U+001F), DEL (U+007F) and C1
  (U+0080-U+009F). :data:`PATTERN` says it to msgspec and OpenAPI, :func:`has_control` to Python,
  :func:`utf8_has_control` to UTF-8 bytes, and :data:`MESSAGE` words the refusal.
* **Free text** (an ack's ``error``, search filters, paging cursors) only excludes U+0000, which a
  PostgreSQL text column refuses: :data:`FREE_TEXT_PATTERN`.

Payloads (JSON values) are neither: they keep their own rules (queen_pg/api/shared/body.py).
"""

from __future__ import annotations

import re

# The regex class of the refused characters. Regexes here are Python `re` (msgspec) and ECMA-262 (JSON
# Schema) alike.
CONTROL_CLASS = r"\x00-\x1f\x7f-\x9f"


def pattern(also: str = "") -> str:
    r"""The identifier pattern, refusing the characters of ``also`` (a regex class body) too. It ends in
    `(?![\s\S])`, not `$`: Python's `$` (msgspec's regexes are Python's) also matches before a final
    newline, so `^[^\n]*$` let "abc\n" through."""
    return f"^[^{CONTROL_CLASS}{also}]*(?![\\s\\S])"


PATTERN = pattern()  # an identifier (its length is the field's own rule)
FREE_TEXT_PATTERN = r"^[^\x00]*$"
RULE = "no control characters (U+0000-U+001F, U+007F-U+009F)"
MESSAGE = "must not contain control characters (U+0000-U+001F, U+007F-U+009F)"
FREE_TEXT_MESSAGE = "must not contain U+0000"

_CONTROL = re.compile(f"[{CONTROL_CLASS}]")
_search = _CONTROL.search  # bound once: the check costs one call into `re` (names are checked per push)
# The single-byte characters of the class (C0, DEL) for ``bytes.translate``: C1 in UTF-8 is two bytes.
C0_AND_DEL = bytes([*range(0x20), 0x7F])
# The same characters in UTF-8: C0 and DEL are single bytes (never inside a multi-byte sequence), C1 is
# 0xC2 followed by 0x80-0x9F.
_CONTROL_UTF8 = re.compile(rb"[\x00-\x1f\x7f]|\xc2[\x80-\x9f]")


def has_control(text: str) -> bool:
    """Whether ``text`` holds a character an identifier must not hold (one regex search, no Python loop)."""
    return _search(text) is not None


def utf8_has_control(raw: bytes) -> bool:
    """:func:`has_control` of UTF-8 bytes, without decoding them."""
    return _CONTROL_UTF8.search(raw) is not None

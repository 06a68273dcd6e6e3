"""The answer budget (``QUEEN_MAX_ANSWER_BYTES``): one rule for every read that gathers many items.

A page of a limit/offset listing (messages, dead letters, traces) or of a keyset listing (KV keys,
``getPrefix``) stops when its items reach the budget, and always holds at least one item, so a client
makes progress through items larger than the budget. The procedures stop handing out rows there
(their ``p_max_bytes``), and the broker stops decoding where the procedure could not know the size
(a zstd segment). A read that cannot page (a ``/kv`` batch, a transaction's KV reads) is refused by its procedure
instead (413 ``answer_too_large``, ``queen._kv_charge``: nothing of the call is written).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ITEM_OVERHEAD = 256  # bytes counted per item beyond its payload: ids, names, times, field names


@dataclass(slots=True)
class AnswerBudget:
    """Bytes an answer may still take; ``admit`` counts one item at a time."""

    limit: int
    used: int = 0

    def admit(self, size: int) -> bool:
        """Count an item of ``size`` payload bytes; False when it would pass the limit (and it is not
        the first: a page always makes progress)."""
        size += ITEM_OVERHEAD
        if self.used and self.used + size > self.limit:
            return False
        self.used += size
        return True


def mark_cut(answer: dict[str, Any], items: str) -> dict[str, Any]:
    """A limit/offset page (``limit``, ``offset``, ``total``) that the budget stopped before ``limit``
    items and before the end gets ``truncated: true`` and ``nextOffset`` (where the next page starts);
    a page the budget did not stop is left as it was."""
    shown = len(answer[items])
    if shown < answer["limit"] and answer["offset"] + shown < answer["total"]:
        answer["truncated"] = True
        answer["nextOffset"] = answer["offset"] + shown
    return answer

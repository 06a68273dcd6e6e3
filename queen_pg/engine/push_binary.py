"""Binary push (docs/wire.md#binary-push): flag-8 groups stored as they came, or, where something must be rewritten,
the same messages through the JSON path's packing (``push.prepare``).

A flag-8 group's blob is already what ``log_segments.payload`` holds: one zstd frame of QPF1 frames
(``codec.py``). When :func:`stored_as_is` says so, the blob becomes the segment without being
decompressed again or re-compressed (the parser read it once, to check it and hash the transactionIds),
and ``queen.push_v1`` gets the same arguments a JSON push would make: one blob per group, one hash and
message id per item. Otherwise every message becomes a :class:`push.NewMessage` (its client-minted id
kept) and is packed as a JSON push's would be, so each rewrite the JSON path applies (the token's
producerSub stamped into the frame, payload encryption) applies here too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from queen_pg.db.pool import Database
from queen_pg.engine import calls, sealing
from queen_pg.engine import push as push_engine
from queen_pg.engine.binary import Group
from queen_pg.engine.outcomes import Once
from queen_pg.errors import QueenError
from queen_pg.security import crypto


def needs_rewrite(vault: crypto.Vault, tenant: str, queue: str) -> bool:
    """THE hook for queue-level rewriting of pushed frames: True when a flag-8 group for ``queue`` may
    not be stored as the client framed it: an encrypted queue (its payloads are sealed first, by
    ``push.prepare``). The vault's cache may be stale; the database has the last word (``push``)."""
    return vault.encrypted(tenant, queue)


def stored_as_is(vault: crypto.Vault, tenant: str, groups: Sequence[Group], producer_sub: str | None) -> bool:
    """Whether the groups' blobs can be the segments as they are: every group framed (flag 8), no
    producerSub to stamp (JWT on: the token's sub goes into every frame, so the frames are rewritten),
    one group per (queue, partition) (``push_v1`` appends one segment per partition and call), and no
    queue that :func:`needs_rewrite`."""
    if producer_sub is not None:
        return False
    keys = {(g.queue, g.partition) for g in groups}
    if len(keys) != len(groups) or any(g.blob is None for g in groups):
        return False
    return not any(needs_rewrite(vault, tenant, q) for q in {g.queue for g in groups})


def messages(groups: Sequence[Group], producer_sub: str | None) -> list[push_engine.NewMessage]:
    """The groups' items as a JSON push's (``push.prepare`` frames them again, client ids kept)."""
    out: list[push_engine.NewMessage] = []
    new = push_engine.NewMessage
    for g in groups:
        ids = g.message_ids() if g.ids else [None] * len(g)
        traces = g.traces or [None] * len(g)
        q, p = g.queue, g.partition
        for txn, payload, mid, trace in zip(g.txns, g.payloads, ids, traces, strict=True):
            out.append(new(q, p, payload, txn or None, trace, producer_sub, mid))
    return out


def prepare(groups: Sequence[Group]) -> push_engine.PreparedPush:
    """``push_v3``'s arguments straight from the blobs (call only when :func:`stored_as_is`): the
    groups' id and hash columns joined, no work per message but its uuid (rendered in the answer)."""
    prepared = push_engine.PreparedPush([], [], [], [], [], [], [])
    for n, g in enumerate(groups, 1):
        assert g.blob is not None and len(g.ids) == 16 * len(g) and len(g.hashes) == 16 * len(g)
        prepared.queues.append(g.queue)
        prepared.partitions.append(g.partition)
        prepared.blobs.append(g.blob)
        prepared.sealed.append(False)  # stored as the client framed it: only for queues not encrypted
        prepared.item_group.extend([n] * len(g))
        prepared.msgids.extend(g.message_ids())
        prepared.txns.extend(g.txns)
    prepared.hash_blob = b"".join([g.hashes for g in groups])
    prepared.msgid_blob = b"".join([g.ids for g in groups])
    return prepared


async def push(db: Database, tenant: str, groups: Sequence[Group], once: Once | None = None) -> push_engine.Answer:
    """Store the blobs as the segments (one ``queen.push_v3`` call, or ``push_v2`` under a request key);
    one result per message, in body order, as a JSON push answers."""
    return (await push_many(db, tenant, [groups], once))[0]


async def push_many(
    db: Database, tenant: str, requests: Sequence[Sequence[Group]], once: Once | None = None
) -> list[push_engine.Answer]:
    """Several bodies' groups (on distinct partitions) in ONE call (the binary fusion lane,
    queen_pg/api/shared/binary.py); each body gets its own results, indexed from 0. ``once`` only with one body."""
    flat = [g for req in requests for g in req]
    prepared = prepare(flat)
    try:
        if once is None:
            (row,) = await db.fetch(calls.PUSH, tenant, *prepared.args_v3(), prepared.sealed)
            placed = push_engine.placed(prepared, row)
        else:
            rows = await db.fetch(calls.PUSH_ONCE, tenant, *prepared.args(), *once.args(), prepared.sealed)
            once.replayed = bool(rows) and rows[0]["replayed"]
            placed = push_engine.rows_placed(rows)
    except QueenError as err:
        named = sealing.mismatched(err)
        if named is None:
            raise
        # a queue is encrypted after all (this broker's cache did not know): learn it, and pack the
        # messages as a JSON push would, sealed (nothing was written)
        v = crypto.vault(db)
        for q, enc in named.items():
            v.learn(tenant, q, enc)
        if once is not None:
            return [await push_engine.push(db, tenant, messages(flat, None), once)]
        return await push_engine.push_many(db, tenant, [messages(req, None) for req in requests])
    out: list[push_engine.Answer] = []
    at = 0
    for req in requests:
        n = sum(len(g) for g in req)
        out.append(render(req, placed[at : at + n]))
        at += n
    return out


def render(groups: Sequence[Group], placed: Sequence[push_engine.Placed]) -> push_engine.Answer:
    """One body's answer: each message's transactionId as its frame holds it."""
    if len(groups) == 1:
        g = groups[0]
        return push_engine.answer(placed, g.txns, [g] * len(g))
    return push_engine.answer(placed, [t for g in groups for t in g.txns], [g for g in groups for _ in g.txns])


def counts(results: push_engine.Answer) -> dict[str, Any]:
    """The flag-2 answer: ``{"count", "queued", "duplicate", "error"}``."""
    return {"count": len(results), "queued": results.queued, "duplicate": results.duplicates, "error": None}

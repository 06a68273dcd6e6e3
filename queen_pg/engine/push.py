"""Push: pack items into one segment per (queue, partition), one call to ``queen.push_v3`` (or, under a
request key, ``queen.push_v2``: the outcome window, queen_pg/engine/outcomes.py).

push_v3 takes the items' transactionId hashes and message ids as one bytea each and answers ONE row
(per group its partition id and first offset, and only the duplicates), from which :func:`placed`
derives every item's verdict: encoding 2 × n uuids and decoding n result rows was the broker's largest
cost per pushed message (push_v1, one row per item, stays for the previous release).

The answer (docs/wire.md#push, one 9-key object per item) is rendered once, straight to the bytes the
client gets, by :func:`answers_v3` (per request of a fused call) or :func:`answer`: one f-string per
item around a per-partition fragment (queue, partition, partitionId; kept across requests), no dict
per item, no orjson pass; the bytes are exactly what orjson wrote for :func:`result`'s dicts
(tests/test_push_answer.py compares them). The :class:`Answer` also carries the counts and the
queues appended to, for the route's metrics and wake-ups.

Payloads of encrypted queues are sealed here (queen_pg/security/crypto.py), by the database handle's
vault: each group tells push_v1 whether it is sealed, push_v1 refuses a group that disagrees with its
queue (nothing written), and the call is made again sealed as the database said."""

from __future__ import annotations

import re
import struct
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, overload

import orjson

from queen_pg.db.pool import Database, Record
from queen_pg.db.types import fast_uuid
from queen_pg.engine import calls, codec, sealing
from queen_pg.engine.outcomes import Once
from queen_pg.security import crypto


class NewMessage(NamedTuple):
    """One message to append (a tuple: one is built per pushed message)."""

    queue: str
    partition: str
    payload: bytes  # the payload as JSON text
    transaction_id: str | None
    trace_id: uuid.UUID | None
    producer_sub: str | None = None  # the pushing token's sub (JWT on); never taken from the body
    message_id: uuid.UUID | None = None  # client-minted (binary push frames, engine/binary.py); None = mint


@dataclass(slots=True)
class PreparedPush:
    """Items packed for queen.push_v1/v3: one zstd blob per (queue, partition) group; per item its
    group, message id and transactionId, and (16 bytes each, in item order) the xxh3-128 hashes of
    the transactionIds and the message ids."""

    queues: list[str]
    partitions: list[str]
    blobs: list[bytes]
    item_group: list[int]
    msgids: list[uuid.UUID]
    txns: list[str]
    sealed: list[bool]  # per group: its payloads are sealed (the queue is encrypted, as far as we know)
    hash_blob: bytes = b""
    msgid_blob: bytes = b""

    @property
    def hashes(self) -> list[uuid.UUID]:
        h = self.hash_blob
        return [fast_uuid(h[i : i + 16]) for i in range(0, len(h), 16)]

    def args(self) -> tuple[Any, ...]:
        """queen.push_v1's arguments after the tenant, but ``sealed`` (passed last: :attr:`sealed`)."""
        return (self.queues, self.partitions, self.blobs, self.item_group, self.hashes, self.msgids)

    def args_v3(self) -> tuple[Any, ...]:
        """queen.push_v3's arguments after the tenant, but ``sealed``: hashes and ids as 16 × n bytes."""
        return (self.queues, self.partitions, self.blobs, self.item_group, self.hash_blob, self.msgid_blob)


# One item's verdict: (status, message id, partition id, offset); a duplicate's are the original's.
Placed = tuple[str, uuid.UUID, int, int]


def placed(prepared: PreparedPush, row: Record) -> list[Placed]:
    """Every item's verdict, in item order, from push_v3's one row: a queued item's offset is its
    group's base plus the queued items of its group before it; a duplicate is listed by index."""
    pids: list[int] = row["partition_ids"]
    nxt: list[int] = list(row["base_offsets"])
    dup_idx = row["dup_idx"]
    if not dup_idx:
        out: list[Placed] = []
        for g, mid in zip(prepared.item_group, prepared.msgids, strict=True):
            off = nxt[g - 1]
            nxt[g - 1] = off + 1
            out.append(("queued", mid, pids[g - 1], off))
        return out
    dups = dict(zip(dup_idx, zip(row["dup_msgid"], row["dup_offset"], strict=True), strict=True))
    out = []
    for i, (g, mid) in enumerate(zip(prepared.item_group, prepared.msgids, strict=True), 1):
        dup = dups.get(i)
        if dup is None:
            off = nxt[g - 1]
            nxt[g - 1] = off + 1
            out.append(("queued", mid, pids[g - 1], off))
        else:
            out.append(("duplicate", dup[0], pids[g - 1], dup[1]))
    return out


def rows_placed(rows: Sequence[Record]) -> list[Placed]:
    """push_v1/push_v2 rows (one per item) as :data:`Placed`."""
    return [(r["status"], r["message_id"], r["partition_id"], r["msg_offset"]) for r in rows]


_PLAIN = struct.Struct("<IB16sH")  # a QPF1 frame's head without trace id or producerSub (codec.encode_frame)


def prepare(items: list[NewMessage], vault: crypto.Vault | None = None, tenant: str = "") -> PreparedPush:
    """Pack ``items``; with a ``vault``, the payloads of the queues it believes encrypted are sealed
    for their (``tenant``, queue, partition).
    The ids of the items without one are minted at once (``codec.uuid7_blob``), the transactionIds
    hashed in one pass after the loop, and a plain frame (no trace id, no producerSub, not sealed)
    packed with one struct call."""
    groups: dict[tuple[str, str], int] = {}
    frames: list[list[bytes]] = []
    sealed: list[bool] = []
    item_group: list[int] = []
    msgids: list[uuid.UUID] = []
    txns: list[str] = []
    encoded: list[bytes] = []
    minted = codec.uuid7_blob(len(items))
    own_ids = False  # some item brought its message id: msgid_blob is joined from the items'
    at = 0
    last_q: str | None = None
    last_p: str | None = None
    out: list[bytes] = []
    seal = False
    place: crypto.Place | None = None  # the group's, when it is sealed: the associated data names it
    gid = 0
    pack_plain = _PLAIN.pack
    for queue, partition, payload, txn, trace, sub, mid in items:
        if queue != last_q or partition != last_p:  # a request's items mostly share one partition
            key = (queue, partition)
            g = groups.get(key)
            if g is None:
                g = groups[key] = len(groups)
                frames.append([])
                sealed.append(vault is not None and vault.encrypted(tenant, queue))
            last_q, last_p, out, seal, gid = queue, partition, frames[g], sealed[g], g + 1
            place = crypto.Place(tenant, queue, partition) if seal else None
        if mid is None:
            raw = minted[at : at + 16]
            mid = fast_uuid(raw)
        else:
            raw = mid.bytes
            own_ids = True
        at += 16
        if txn is None:
            txn = str(mid)
        t = txn.encode()
        if trace is None and sub is None and not seal:
            out.append(pack_plain(len(t) + len(payload) + 19, 0, raw, len(t)) + t + payload)
        else:
            if seal:
                assert vault is not None and place is not None
                payload = vault.seal(payload, place)
            out.append(codec.encode_frame(mid, txn, payload, trace, sub, sealed=seal))
        item_group.append(gid)
        msgids.append(mid)
        txns.append(txn)
        encoded.append(t)
    return PreparedPush(
        [k[0] for k in groups],
        [k[1] for k in groups],
        [codec.pack(f) for f in frames],
        item_group,
        msgids,
        txns,
        sealed,
        codec.txn_hashes(encoded),
        b"".join([m.bytes for m in msgids]) if own_ids else minted,
    )


def result(
    item: NewMessage, txn: str, status: str, message_id: object, partition_id: object, offset: object, index: int
) -> dict[str, Any]:
    """One push result as docs/wire.md#push shows it."""
    return {
        "index": index,
        "status": status,
        "transactionId": txn,
        "messageId": str(message_id),
        "queue": item.queue,
        "partition": item.partition,
        "partitionId": str(partition_id),
        "offset": offset,
        "error": None,
    }


_UNSAFE = re.compile(r'["\\\x00-\x1f]')  # what orjson escapes in a string (it writes other characters as UTF-8)
_STATUS = frozenset({"queued", "duplicate"})


class Answer(Sequence[dict[str, Any]]):
    """One push request's answer (docs/wire.md#push), rendered once to the bytes a client gets: ``body``
    is exactly ``orjson.dumps`` of the result dicts (:func:`result`'s keys, order and types), built
    from per-partition fragments without a dict per item. ``queued``/``duplicates`` count its items,
    ``queues`` names the queues it appended to (the route wakes their waiters). As a sequence it reads
    as those dicts (decoded from ``body`` on first use: transaction replies, tests, the flag-2 counts
    read the counters instead)."""

    __slots__ = ("_dicts", "_n", "body", "duplicates", "queued", "queues")

    def __init__(self, body: bytes, n: int, duplicates: int, queues: tuple[str, ...]) -> None:
        self.body = body
        self._n = n
        self.queued = n - duplicates
        self.duplicates = duplicates
        self.queues = queues
        self._dicts: list[dict[str, Any]] | None = None  # decoded from ``body`` when read as a sequence

    def _list(self) -> list[dict[str, Any]]:
        if self._dicts is None:
            self._dicts = orjson.loads(self.body)
        return self._dicts

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> dict[str, Any]: ...
    @overload
    def __getitem__(self, i: slice) -> list[dict[str, Any]]: ...
    def __getitem__(self, i: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        return self._list()[i]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self._list())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Answer):
            return self.body == other.body
        return isinstance(other, list) and self._list() == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Answer({self.body!r})"


class Home(Protocol):
    """Where an item went (a :class:`NewMessage`, a binary ``Group``)."""

    @property
    def queue(self) -> str: ...
    @property
    def partition(self) -> str: ...


_FRAGS: dict[int, tuple[str, str, str]] = {}  # partition id -> (queue, partition, fragment)
_FRAGS_MAX = 65_536  # partitions whose fragment is kept (cleared whole past that)


def _frag(pid: int, queue: str, partition: str) -> str:
    """An item's middle for partition ``pid``: ``,"queue":…,"partition":…,"partitionId":"…","offset":``
    (kept across requests; checked against the names, so a reused id can never borrow another's)."""
    hit = _FRAGS.get(pid)
    if hit is not None and hit[0] == queue and hit[1] == partition:
        return hit[2]
    if len(_FRAGS) >= _FRAGS_MAX:
        _FRAGS.clear()
    frag = f',"queue":{_text(queue)},"partition":{_text(partition)},"partitionId":"{pid}","offset":'
    _FRAGS[pid] = (queue, partition, frag)
    return frag


def _text(s: str) -> str:
    """``s`` as a JSON string, exactly as orjson writes it."""
    return orjson.dumps(s).decode()


def _plain(txns: Sequence[str | None]) -> bool:
    """Whether none of ``txns`` holds a character orjson escapes (then each is written as it is)."""
    given = [t for t in txns if t]
    return not given or _UNSAFE.search("".join(given)) is None


def answer(rows: Sequence[Placed], txns: Sequence[str | None], homes: Sequence[Home]) -> Answer:
    """The answer of one request whose items' verdicts are ``rows`` (indexed from 0): item ``i``'s
    transactionId is ``txns[i]``, or (None) its message id; its queue and partition ``homes[i]``'s.
    Per item one f-string; per partition one fragment (queue, partition, partitionId)."""
    frags: dict[int, str] = {}
    names: dict[int, str] = {}  # partition id -> queue
    plain = _plain(txns)
    parts: list[str] = []
    dups = 0
    for i, (status, mid, pid, off) in enumerate(rows):
        frag = frags.get(pid)
        if frag is None:
            home = homes[i]
            names[pid] = home.queue
            frag = frags[pid] = _frag(pid, home.queue, home.partition)
        m = str(mid)
        t = txns[i]
        if t is None:
            t = m
        elif not plain:
            t = _text(t)[1:-1]
        if status != "queued":
            dups += 1
            if status not in _STATUS:
                status = _text(status)[1:-1]
        parts.append(
            f'{{"index":{i},"status":"{status}","transactionId":"{t}","messageId":"{m}"{frag}{off},"error":null}}'
        )
    if not dups:
        queues = tuple(names.values()) if len(names) == 1 else tuple(dict.fromkeys(names.values()))
    else:
        queues = tuple(dict.fromkeys(names[r[2]] for r in rows if r[0] == "queued"))
    body = ("[" + parts[0] + "]" if len(parts) == 1 else "[" + ",".join(parts) + "]").encode()
    return Answer(body, len(parts), dups, queues)


def answers_v3(prepared: PreparedPush, row: Record, requests: list[list[NewMessage]]) -> list[Answer]:
    """Each request's answer from push_v3's one row (the requests' items are ``prepared``'s, in
    order). Without duplicates a request on one partition (the usual shape) is one comprehension:
    consecutive offsets from its group's next one, one fragment; anything else goes through
    :func:`placed` and :func:`answer`."""
    if row["dup_idx"]:
        rows = placed(prepared, row)
        out: list[Answer] = []
        at = 0
        for req in requests:
            end = at + len(req)
            out.append(answer(rows[at:end], [it.transaction_id or None for it in req], req))
            at = end
        return out
    pids: list[int] = row["partition_ids"]
    nxt: list[int] = list(row["base_offsets"])
    groups = prepared.item_group
    msgids = prepared.msgids
    out = []
    at = 0
    for req in requests:
        n = len(req)
        end = at + n
        g = groups[at] - 1
        if n == 1:  # a lone item: no list, no join
            base = nxt[g]
            nxt[g] = base + 1
            queue = prepared.queues[g]
            frag = _frag(pids[g], queue, prepared.partitions[g])
            m = str(msgids[at])
            t = req[0].transaction_id
            if not t:
                t = m
            elif _UNSAFE.search(t) is not None:
                t = _text(t)[1:-1]
            one = f'[{{"index":0,"status":"queued","transactionId":"{t}","messageId":"{m}"{frag}{base},"error":null}}]'
            out.append(Answer(one.encode(), 1, 0, (queue,)))
        elif len(set(groups[at:end])) == 1:
            base = nxt[g]
            nxt[g] = base + n
            queue = prepared.queues[g]
            frag = _frag(pids[g], queue, prepared.partitions[g])
            txns = [it.transaction_id for it in req]
            if not _plain(txns):
                txns = [_text(t)[1:-1] if t else None for t in txns]
            head = '","messageId":"'
            parts = [
                f'{{"index":{i},"status":"queued","transactionId":"{t or m}{head}{m}"{frag}{base + i},"error":null}}'
                for i, (m, t) in enumerate(zip(map(str, msgids[at:end]), txns, strict=True))
            ]
            out.append(Answer(("[" + ",".join(parts) + "]").encode(), n, 0, (queue,)))
        else:
            mine: list[Placed] = []
            for gi, mid in zip(groups[at:end], msgids[at:end], strict=True):
                off = nxt[gi - 1]
                nxt[gi - 1] = off + 1
                mine.append(("queued", mid, pids[gi - 1], off))
            out.append(answer(mine, [it.transaction_id or None for it in req], req))
        at = end
    return out


async def push(db: Database, tenant: str, items: list[NewMessage], once: Once | None = None) -> Answer:
    """Append ``items``; one result per item, in order (docs/wire.md#push). Under a request key (``once``)
    through ``queen.push_v2``: a retry within the window answers the recorded results, adding nothing."""
    if once is None:
        return (await push_many(db, tenant, [items]))[0]
    v = crypto.vault(db)

    async def attempt() -> list[Record]:
        prepared = prepare(items, v, tenant)
        return await db.fetch(calls.PUSH_ONCE, tenant, *prepared.args(), *once.args(), prepared.sealed)

    rows = await sealing.push_sealed(v, tenant, (it.queue for it in items), attempt)
    once.replayed = bool(rows) and rows[0]["replayed"]
    return answer(rows_placed(rows), [it.transaction_id or None for it in items], items)


async def push_many(db: Database, tenant: str, requests: list[list[NewMessage]]) -> list[Answer]:
    """Append several requests' items in ONE ``queen.push_v3`` call (request fusion,
    queen_pg/engine/fusion.py); each request gets exactly its own results, in its order, indexed
    from 0. Fusing is the same as running the requests one after the other in list order: offsets
    stay gapless per partition and an item repeating an earlier request's transactionId is that
    item's ``duplicate``, with the first one's messageId."""
    flat = requests[0] if len(requests) == 1 else [it for req in requests for it in req]
    v = crypto.vault(db)

    async def attempt() -> list[Answer]:
        prepared = prepare(flat, v, tenant)
        (row,) = await db.fetch(calls.PUSH, tenant, *prepared.args_v3(), prepared.sealed)
        return answers_v3(prepared, row, requests)

    return await sealing.push_sealed(v, tenant, {it.queue for it in flat}, attempt)

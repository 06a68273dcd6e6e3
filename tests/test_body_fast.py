"""The decoding fast path (queen_pg/api/shared/body.py): a body that cannot hold a control character is
decoded without the character-class regexes, and decides exactly as the declared type does: same
value, same class, same refusal with the same text. Bodies are the hot routes' (ack, ack/batch, push,
transaction), hostile ones included; then the same through real HTTP."""

from __future__ import annotations

import re
from typing import Any

import httpx
import msgspec
import pytest

from queen_pg.api.ack import AckBatchBody
from queen_pg.api.push import PushBody
from queen_pg.api.shared import body
from queen_pg.api.shared.items import AckItem
from queen_pg.api.transaction import TransactionRequest, TxAckOp, TxPushOp
from queen_pg.errors import QueenError

BODIES: list[tuple[type[Any], bytes]] = [
    (AckItem, b'{"transactionId":"t","partitionId":"12","leaseId":"L"}'),
    (AckItem, b'{"transactionId":"t","partitionId":12,"status":"RETRY","consumerGroup":"g"}'),
    (AckItem, b'{"transactionId":"","partitionId":"1"}'),  # too short: refused either way
    (AckItem, b'{"transactionId":"t\\u0000","partitionId":"1"}'),  # NUL
    (AckItem, b'{"transactionId":"t","partitionId":"1\\u0000"}'),
    (AckItem, b'{"transactionId":"t","partitionId":"1","leaseId":"\\u0000"}'),
    (AckItem, b'{"transactionId":"t","partitionId":"1","consumerGroup":"g\\n"}'),  # a control char in a name
    (AckItem, b'{"transactionId":"t","partitionId":"1","consumerGroup":"g\\u001f"}'),
    (AckItem, b'{"transactionId":"t","partitionId":"1","status":"nope"}'),
    (AckItem, b'{"partitionId":"1"}'),
    (
        AckBatchBody,
        b'{"consumerGroup":"g","acknowledgments":[{"transactionId":"a","partitionId":"1"},'
        b'{"transactionId":"b","partitionId":2,"leaseId":"x"}]}',
    ),
    (AckBatchBody, b'{"consumerGroup":"g\\t","acknowledgments":[]}'),
    (AckBatchBody, b'{"acknowledgments":[{"transactionId":"a\\\\n","partitionId":"1"}]}'),  # "\\n": no control
    (PushBody, b'{"items":[{"queue":"q","payload":{"a":"x\\ny"}}]}'),  # a control char in a payload is fine
    (PushBody, b'{"items":[{"queue":"q\\n","payload":1}]}'),
    (PushBody, b'{"items":[{"queue":"q","partition":"p\\u0001","payload":1}]}'),
    (PushBody, b'{"items":[{"queue":"q","transactionId":"del\x7f","payload":1}]}'),  # raw DEL in a new id
    (PushBody, b'{"items":[{"queue":"q","transactionId":"del\\u007F","payload":1}]}'),
    (PushBody, b'{"items":[{"queue":"q","transactionId":"ok","traceId":"not-a-uuid","payload":1}]}'),
    (PushBody, b'{"items":[{"queue":"","payload":1}]}'),
    (PushBody, b'{"items":[]}'),
    (PushBody, b'{"items":[{"queue":"q","payload":5.0}]}'),
    (
        TransactionRequest,
        b'{"operations":[{"type":"ack","transactionId":"t","partitionId":"1"},'
        b'{"type":"push","items":[{"queue":"q","payload":1}]}]}',
    ),
    (TransactionRequest, b'{"operations":[{"type":"ack","transactionId":"t\\u0000","partitionId":"1"}]}'),
    (TransactionRequest, b'{"operations":[{"type":"nope"}]}'),
    (TransactionRequest, b'{"operations":[{"type":"ack","transactionId":"t","partitionId":1.0}]}'),
    (AckItem, b'{"transactionId":"t",'),  # malformed
    # the status: the usual spellings pass the twin's Literal, any other case goes to the declared pattern
    (AckItem, b'{"transactionId":"t","partitionId":"1","status":"success"}'),
    (AckItem, b'{"transactionId":"t","partitionId":"1","status":"Dlq"}'),
    (AckItem, b'{"transactionId":"t","partitionId":"1","status":"completedx"}'),
    (AckItem, b'{"transactionId":"t","partitionId":"1","status":""}'),
    (AckItem, b'{"transactionId":"t","partitionId":"1","status":5}'),
    # the text rule's C1 and final newline (docs/wire.md#text)
    (PushBody, b'{"items":[{"queue":"q","transactionId":"c1\xc2\x85","payload":1}]}'),  # raw C1 in a new id
    (PushBody, b'{"items":[{"queue":"q","transactionId":"c1\\u009b","payload":1}]}'),
    (PushBody, b'{"items":[{"queue":"q","transactionId":"nl\\n","payload":1}]}'),  # a final newline
    (PushBody, b'{"items":[{"queue":"q","transactionId":"deg\xc2\xb0","payload":"25 \xc2\xb0C"}]}'),  # not C1
]


def outcome(raw: bytes, t: type[Any]) -> Any:
    try:
        value = body.decode(raw, t)
    except QueenError as err:
        return ("refused", err.kind.code, str(err), err.fields)
    return ("ok", _plain(value))


def _plain(value: Any) -> Any:
    """A decoded value as builtins, each Struct as (class name, fields)."""
    if isinstance(value, msgspec.Struct):
        return (type(value).__name__, {f: _plain(getattr(value, f)) for f in value.__struct_fields__})
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


@pytest.mark.parametrize(("t", "raw"), BODIES)
def test_the_fast_path_decides_as_the_declared_type(t: type[Any], raw: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    fast = outcome(raw, t)
    monkeypatch.setattr(body, "_clean", lambda raw: False)  # every body looks suspicious: declared only
    assert outcome(raw, t) == fast


def test_the_twin_keeps_classes_tags_and_wire_names() -> None:
    raw = BODIES[22][1]
    value = body.decode(raw, TransactionRequest)
    assert isinstance(value, TransactionRequest)
    ack, push = value.operations
    assert isinstance(ack, TxAckOp) and isinstance(push, TxPushOp)
    item = body.decode(BODIES[1][1], AckItem)
    assert isinstance(item, AckItem) and (item.partition_id, item.status, item.group) == (12, "RETRY", "g")
    assert body._twin(AckItem) is not AckItem and issubclass(body._twin(AckItem), AckItem)


def test_the_scan_finds_every_control_character_the_patterns_refuse() -> None:
    # C0 can only come escaped; DEL and C1 escaped or raw (docs/wire.md#text)
    for c in [*range(0x20), *range(0x7F, 0xA0)]:
        escaped = msgspec.json.encode(chr(c))
        escaped = escaped if b"\\" in escaped else b'"\\u%04x"' % c
        assert not body._clean(escaped), hex(c)
        if c >= 0x7F:
            assert not body._clean(('"' + chr(c) + '"').encode()), hex(c)
    for c in [0x7F, 0x85, 0x9F]:
        assert not body._clean(b'"\\u%04X"' % c), hex(c)
    assert body._clean(b'{"a":"plain \\u00e9 \\u00a0 \\" \\\\ \\/"}')


# every way a JSON body can hold a control character: an escape, a raw DEL, a raw C1 (what _clean looks for)
_ANY_CONTROL = re.compile(rb"\\(?:[bfnrt]|u00[0189]|u007[fF])|\x7f|\xc2[\x80-\x9f]")


def test_the_memchr_shortcuts_agree_with_one_scan() -> None:
    # a body without a backslash, a raw DEL byte or a 0xC2 byte cannot hold one: clean without a regex
    for raw in [b'{"a":"plain"}', b'{"a":"caf\xc3\xa9"}', b"", b'{"a":"x\x7f"}', b'{"a":"\\u0000"}',
                b'{"a":"\\n"}', b'{"a":"\\\\n"}', b'{"a":"\\u00e9"}', b'{"a":"\\u007F"}', b'{"a":"\\u0085"}',
                b'{"a":"25 \xc2\xb0C"}', b'{"a":"\xc2\x85"}', b'{"a":"\xc2\xa0 \xc2\x9b"}']:  # fmt: skip
        assert body._clean(raw) is (_ANY_CONTROL.search(raw) is None), raw


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The types ``body.decoder`` is asked for, in order (a spy around the real one)."""
    asked: list[Any] = []
    real = body.decoder

    def spy(t: Any, strict: bool = True) -> Any:
        asked.append(t)
        return real(t, strict)

    monkeypatch.setattr(body, "decoder", spy)
    return asked


def test_usual_status_spellings_take_the_twin_and_others_the_declared_type(asked: list[Any]) -> None:
    for word in ("completed", "success", "failed", "retry", "dlq"):
        asked.clear()
        item = body.decode(b'{"transactionId":"t","partitionId":"1","status":"%s"}' % word.encode(), AckItem)
        assert item.status == word and asked == [body._twin(AckItem)]
    asked.clear()
    item = body.decode(b'{"transactionId":"t","partitionId":"1","status":"FaIlEd"}', AckItem)
    assert item.status == "FaIlEd" and isinstance(item, AckItem)
    assert asked == [body._twin(AckItem), AckItem]  # the twin refused it; the declared pattern accepted it


async def test_hostile_names_and_ids_are_still_refused_over_http(http: httpx.AsyncClient) -> None:
    r = await http.post("/api/v1/push", json={"items": [{"queue": "a\nb", "payload": 1}]})
    assert r.status_code == 400 and "items[0].queue" in r.json()["error"]
    r = await http.post("/api/v1/ack", json={"transactionId": "t\x00", "partitionId": "1"})
    assert r.status_code == 400 and "transactionId" in r.json()["error"]
    r = await http.post("/api/v1/push", content=b'{"items":[{"queue":"q","transactionId":"a\x7f","payload":1}]}',
                        headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code == 400 and "transactionId" in r.json()["error"]
    r = await http.post("/api/v1/push", json={"items": [{"queue": "q", "payload": {"text": "line\nbreak"}}]})
    assert r.status_code == 201


def test_a_clean_body_takes_the_fast_path_and_a_suspicious_one_the_declared(asked: list[Any]) -> None:
    body.decode(BODIES[10][1], AckBatchBody)
    assert asked == [body._twin(AckBatchBody)]
    asked.clear()
    with pytest.raises(QueenError):
        body.decode(BODIES[11][1], AckBatchBody)  # "\t" in the group: only the declared type decides
    assert asked == [AckBatchBody]

"""The ``queen-pg`` commands that talk to a running broker over HTTP: ``queues``, ``tail``, ``dlq``,
``kv get|put`` and ``timers list``.

Each takes ``--url`` (env ``QUEEN_URL``, default ``http://localhost:6632``) and ``--json`` (machine
output: the broker's JSON, or one JSON object per line for ``tail``); the default output is a table
or plain lines for a person. A failure is one line on stderr and exit code 1 (2 for a usage error),
never a traceback: "cannot reach the broker at URL" when nothing answers there, "the broker answered
404 not_found: ..." when it refuses.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO
from urllib.parse import quote

import httpx
import orjson

DEFAULT_URL = "http://localhost:6632"
QUEUE_MODE = "__QUEUE_MODE__"


class CliError(Exception):
    """A failure the user can act on: printed as one line, exit ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class BrokerClient:
    """A small synchronous HTTP client that turns every failure into a :class:`CliError`."""

    def __init__(self, url: str, timeout: float) -> None:
        self.url = url.rstrip("/")
        self.http = httpx.Client(base_url=self.url, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def reconnect(self) -> None:
        """Drop every open connection (one may carry a request cut short, e.g. by Ctrl-C: closing it
        tells the broker its client is gone) and start afresh."""
        timeout = self.http.timeout
        self.http.close()
        self.http = httpx.Client(base_url=self.url, timeout=timeout)

    def request(self, method: str, path: str, *, ok: Sequence[int] = (200,), **kwargs: Any) -> httpx.Response:
        try:
            r = self.http.request(method, path, **kwargs)
        except httpx.ConnectError:
            raise CliError(f"cannot reach the broker at {self.url}") from None
        except httpx.TimeoutException:
            raise CliError(f"the broker at {self.url} did not answer in time") from None
        except httpx.HTTPError as exc:
            raise CliError(f"cannot talk to the broker at {self.url}: {exc}") from None
        if r.status_code not in ok:
            raise CliError(refusal(r))
        return r

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        r = self.request(method, path, **kwargs)
        if not r.content:
            return None
        try:
            return orjson.loads(r.content)
        except orjson.JSONDecodeError:
            raise CliError(f"the broker at {self.url} answered {r.status_code} with a body that is not JSON") from None


def refusal(r: httpx.Response) -> str:
    """``the broker answered 404 not_found: no such queue`` from an error answer."""
    detail = r.text.strip()[:200]
    code = ""
    try:
        body = orjson.loads(r.content)
    except orjson.JSONDecodeError:
        body = None
    if isinstance(body, dict):
        code = str(body.get("code") or "")
        detail = str(body.get("detail") or body.get("error") or detail)
    where = f" ({r.request.method} {r.request.url.path})"
    return f"the broker answered {r.status_code}{' ' + code if code else ''}: {detail or r.reason_phrase}{where}"


# ---- output ---------------------------------------------------------------------------------------


def cell(value: Any, width: int = 60) -> str:
    if value is None:
        return "-"
    text = value if isinstance(value, str) else orjson.dumps(value).decode()
    text = text.replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], out: TextIO) -> None:
    """Columns aligned; numbers right-aligned."""
    cells = [[cell(v) for v in row] for row in rows]
    numeric = [all(isinstance(row[i], int | float) for row in rows) and bool(rows) for i in range(len(headers))]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric, strict=True)]
        return "  ".join(parts).rstrip()

    print(line(list(headers)), file=out)
    for row in cells:
        print(line(row), file=out)


def print_json(value: Any, out: TextIO) -> None:
    print(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode(), file=out)


# ---- commands -------------------------------------------------------------------------------------


def cmd_queues(client: BrokerClient, args: argparse.Namespace, out: TextIO) -> int:
    body = client.json("GET", "/api/v1/resources/queues")
    if args.json:
        print_json(body, out)
        return 0
    queues = body.get("queues", []) if isinstance(body, dict) else []
    rows = [
        [
            q.get("name"),
            q.get("partitions", 0),
            q.get("messages", 0),
            q.get("backlog", 0),
            q.get("inFlight", 0),
            q.get("dlq", 0),
            ", ".join(f"{g.get('name')}:{g.get('lag')}" for g in q.get("groups") or []) or None,
        ]
        for q in queues
    ]
    table(["QUEUE", "PARTITIONS", "MESSAGES", "BACKLOG", "IN FLIGHT", "DLQ", "GROUPS (lag)"], rows, out)
    total = body.get("total", len(queues)) if isinstance(body, dict) else len(queues)
    print(f"{total} queue{'s' if total != 1 else ''}", file=out)
    return 0


def message_line(m: dict[str, Any]) -> str:
    data = orjson.dumps(m.get("data")).decode()
    return f"{m.get('createdAt')}  {m.get('partition')}  #{m.get('offset')}  {m.get('transactionId')}  {data}"


def cmd_tail(client: BrokerClient, args: argparse.Namespace, out: TextIO) -> int:
    own_group = args.group is None
    group = args.group or f"queen-pg-tail-{secrets.token_hex(4)}"
    params: dict[str, Any] = {
        "consumerGroup": group,
        "batch": args.batch,
        "wait": "true",
        "timeout": args.wait_ms,
        "autoAck": "true",
        "subscriptionMode": "all" if args.from_start else "new",
    }
    path = f"/api/v1/pop/queue/{quote(args.queue, safe='')}"
    seen = 0
    try:
        while args.limit is None or seen < args.limit:
            if args.limit is not None:
                params["batch"] = min(args.batch, args.limit - seen)
            r = client.request("GET", path, params=params, ok=(200, 204), timeout=args.wait_ms / 1000 + 30)
            if r.status_code == 204:
                continue
            for m in orjson.loads(r.content).get("messages", []):
                if args.json:
                    keep = ("createdAt", "queue", "partition", "partitionId", "offset", "transactionId", "data")
                    print(orjson.dumps({k: m.get(k) for k in keep}).decode(), file=out, flush=True)
                else:
                    print(message_line(m), file=out, flush=True)
                seen += 1
    except KeyboardInterrupt:
        pass
    finally:
        if own_group:  # the throwaway group would otherwise keep its cursors forever
            # First close the connection of a long-poll cut short by Ctrl-C: the broker then drops that
            # pop instead of claiming later for nobody, re-creating the group deleted here.
            client.reconnect()
            try:
                client.request("DELETE", f"/api/v1/consumer-groups/{quote(group, safe='')}", ok=(200, 404))
            except CliError:
                pass
    return 0


def cmd_dlq(client: BrokerClient, args: argparse.Namespace, out: TextIO) -> int:
    if args.requeue:
        pid, txn = args.requeue
        body = client.json("POST", f"/api/v1/messages/{quote(pid, safe='')}/{quote(txn, safe='')}/retry")
        if args.json:
            print_json(body, out)
        else:
            print(
                f"requeued {txn} to {body.get('queue')}/{body.get('partition')} at offset {body.get('offset')}",
                file=out,
            )
        return 0
    params: dict[str, Any] = {"queue": args.queue, "limit": args.limit, "offset": args.offset}
    if args.group:
        params["consumerGroup"] = args.group
    body = client.json("GET", "/api/v1/dlq", params=params)
    if args.json:
        print_json(body, out)
        return 0
    messages = body.get("messages", [])
    rows = [
        [
            m.get("failedAt"),
            m.get("partition"),
            m.get("partitionId"),
            m.get("offset"),
            m.get("transactionId"),
            m.get("consumerGroup") or "(queue mode)",
            m.get("retryCount"),
            cell(m.get("errorMessage"), 40),
            cell(m.get("data"), 60),
        ]
        for m in messages
    ]
    table(
        ["FAILED AT", "PARTITION", "PARTITION ID", "OFFSET", "TRANSACTION", "GROUP", "ATTEMPTS", "ERROR", "DATA"],
        rows,
        out,
    )
    total = body.get("total", 0)
    first = args.offset + 1 if messages else 0
    print(f"{first}-{args.offset + len(messages)} of {total} dead letters in {args.queue}", file=out)
    if messages:
        print(f"requeue one with: queen-pg dlq {args.queue} --requeue PARTITION_ID TRANSACTION_ID", file=out)
    return 0


def _kv(client: BrokerClient, op: dict[str, Any]) -> dict[str, Any]:
    body = client.json("POST", "/api/v1/kv", json={"operations": [op]})
    if isinstance(body, dict) and body.get("ok") is False:
        raise CliError(f"refused ({body.get('reason')}): {body.get('error') or body}")
    result: dict[str, Any] = body["results"][0]
    return result


def cmd_kv_get(client: BrokerClient, args: argparse.Namespace, out: TextIO) -> int:
    result = _kv(client, {"op": "get", "ns": args.ns, "key": args.key})
    if args.json:
        print_json(result, out)
        return 0 if result.get("found") else 1
    if not result.get("found"):
        raise CliError(f"{args.ns}/{args.key} not found")
    print_json(result.get("value"), out)
    return 0


def cmd_kv_put(client: BrokerClient, args: argparse.Namespace, out: TextIO) -> int:
    try:
        value = orjson.loads(args.value)
    except orjson.JSONDecodeError as exc:
        raise CliError(f"VALUE must be JSON (e.g. '{{\"a\": 1}}' or '\"text\"'): {exc}", 2) from None
    op: dict[str, Any] = {"op": "put", "ns": args.ns, "key": args.key, "value": value}
    if args.ttl is not None:
        op["ttlSeconds"] = args.ttl
    else:
        op["forever"] = True
    result = _kv(client, op)
    if args.json:
        print_json(result, out)
    else:
        expiry = f", expires {result['expiresAt']}" if result.get("expiresAt") else ""
        print(f"put {args.ns}/{args.key} version {result.get('version')}{expiry}", file=out)
    return 0


def cmd_timers_list(client: BrokerClient, args: argparse.Namespace, out: TextIO) -> int:
    rows: list[dict[str, Any]] = []
    after: str | None = None
    path = f"/api/v1/timers/{quote(args.queue, safe='')}"
    while args.limit is None or len(rows) < args.limit:
        params: dict[str, Any] = {"limit": args.page if args.limit is None else min(args.page, args.limit - len(rows))}
        if after is not None:
            params["after"] = after
        page = client.json("GET", path, params=params)
        rows.extend(page.get("rows", []))
        after = page.get("nextAfter")
        if not after:
            break
    if args.json:
        print_json({"queue": args.queue, "rows": rows}, out)
        return 0
    table(
        ["TIMER KEY", "DELIVER AT", "TXN", "PARTITION"],
        [[t.get("timerKey"), t.get("deliverAt"), t.get("txn"), t.get("partition")] for t in rows],
        out,
    )
    print(f"{len(rows)} pending timer{'s' if len(rows) != 1 else ''} in {args.queue}", file=out)
    return 0


# ---- the parsers ----------------------------------------------------------------------------------

Command = Callable[[BrokerClient, argparse.Namespace, TextIO], int]


def _positive(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _client_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    default = os.environ.get("QUEEN_URL") or DEFAULT_URL
    common.add_argument("--url", default=default, help=f"broker URL [QUEEN_URL; default {DEFAULT_URL}; now {default}]")
    common.add_argument("--json", action="store_true", help="machine output: the broker's JSON")
    common.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for an answer [30]")
    return common


def _command(sub: Any, name: str, cmd: Command, help: str, description: str) -> argparse.ArgumentParser:
    """A client command: the common options (``--url``, ``--json``, ``--timeout``), then ``cmd`` runs it."""
    p: argparse.ArgumentParser = sub.add_parser(name, parents=[_client_options()], help=help, description=description)
    p.set_defaults(client_cmd=cmd)
    return p


def add_commands(sub: Any) -> None:
    """Add the broker client commands to the ``queen-pg`` subparsers."""
    _command(
        sub,
        "queues",
        cmd_queues,
        help="list the queues: partitions, messages, backlog, in flight, DLQ",
        description="List the broker's queues (GET /api/v1/resources/queues).",
    )

    p = _command(
        sub,
        "tail",
        cmd_tail,
        help="follow new messages of a queue, decoded",
        description="Print the queue's messages as they arrive, one line each: time, partition, offset, "
        "transactionId, JSON data. Reads with a consumer group of its own (deleted on exit), so the "
        "queue's other consumers are not disturbed. Ctrl-C stops.",
    )
    p.add_argument("queue")
    p.add_argument("--from-start", action="store_true", help="start at the oldest retained message, not new ones")
    p.add_argument("--group", help="read as this consumer group (kept) instead of a throwaway queen-pg-tail-<random>")
    p.add_argument("--limit", type=_positive, help="stop after N messages")
    p.add_argument("--batch", type=_positive, default=100, help="messages per pop [100]")
    p.add_argument("--wait-ms", type=_positive, default=30_000, help="long-poll time per pop [30000]")

    p = _command(
        sub,
        "dlq",
        cmd_dlq,
        help="list a queue's dead letters, or requeue one",
        description="List a queue's dead letters, newest first (GET /api/v1/dlq), or put one back at the end "
        "of its partition (--requeue PARTITION_ID TRANSACTION_ID).",
    )
    p.add_argument("queue")
    p.add_argument("--limit", type=_positive, default=20, help="dead letters per page [20]")
    p.add_argument("--offset", type=int, default=0, help="skip this many (paging) [0]")
    p.add_argument("--group", help="only this consumer group's dead letters")
    p.add_argument(
        "--requeue", nargs=2, metavar=("PARTITION_ID", "TRANSACTION_ID"), help="requeue this dead letter instead"
    )

    kv = sub.add_parser("kv", help="read or write a KV entry", description="Read or write one KV entry.")
    kv_sub = kv.add_subparsers(dest="kv_command", required=True)
    p = _command(
        kv_sub,
        "get",
        cmd_kv_get,
        help="print a value",
        description="Print the value of NS/KEY as JSON (exit 1: absent).",
    )
    p.add_argument("ns")
    p.add_argument("key")
    p = _command(kv_sub, "put", cmd_kv_put, help="write a value", description="Write VALUE (JSON text) at NS/KEY.")
    p.add_argument("ns")
    p.add_argument("key")
    p.add_argument("value", help="the value as JSON, e.g. '{\"a\": 1}' or '\"text\"'")
    expiry = p.add_mutually_exclusive_group()
    expiry.add_argument("--ttl", type=_positive, metavar="SECONDS", help="expire after this many seconds")
    expiry.add_argument("--forever", action="store_true", help="never expire (the default)")

    timers = sub.add_parser("timers", help="inspect timers", description="Inspect a queue's timers.")
    t_sub = timers.add_subparsers(dest="timers_command", required=True)
    p = _command(
        t_sub,
        "list",
        cmd_timers_list,
        help="list a queue's pending timers",
        description="List a queue's pending timers by key, following the pages (nextAfter).",
    )
    p.add_argument("queue")
    p.add_argument("--limit", type=_positive, help="list at most N timers")
    p.add_argument("--page", type=_positive, default=1000, help="timers per request (≤ 1000) [1000]")


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run a client command; failures are one line on stderr."""
    out = out or sys.stdout
    err = err or sys.stderr
    command: Command = args.client_cmd
    client = BrokerClient(args.url, args.timeout)
    try:
        return command(client, args, out)
    except CliError as exc:
        print(f"queen-pg {args.command}: {exc}", file=err)
        return exc.code
    except BrokenPipeError:  # `queen-pg tail q | head`
        return 0
    finally:
        client.close()

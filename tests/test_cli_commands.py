"""The queen-pg commands beside `serve`: each against a real broker over HTTP (run in a thread, since
the broker runs in the test's event loop), their --help, and their failure paths (broker down,
refusals, bad input: one line on stderr, non-zero exit, no traceback); `migrate` on an empty
database; `serve --workers 2` as a real process with its embedded PostgreSQL."""

from __future__ import annotations

import asyncio
import base64
import subprocess
import sys
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from queen_pg.cli import bench, main
from queen_pg.jobs.dlq_fill import DlqFill
from tests.conftest import Broker, PgServer, empty_database, free_port
from tests.helpers import eventually, fetchval_once, push
from tests.test_cli import _embedded_env, _term_stops_postgres, _wait, _wait_healthy


async def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = await asyncio.to_thread(main, list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def down_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


# ---- --help ---------------------------------------------------------------------------------------

HELP = [
    (["serve"], "QUEEN_WORKERS"),
    (["migrate"], "DATABASE_URL"),
    (["queues"], "QUEEN_URL"),
    (["tail"], "--from-start"),
    (["dlq"], "--requeue"),
    (["kv"], "{get,put}"),
    (["kv", "get"], "QUEEN_URL"),
    (["kv", "put"], "--forever"),
    (["timers"], "{list}"),
    (["timers", "list"], "--limit"),
    (["bench"], "--scenarios"),
]


@pytest.mark.parametrize(("argv", "needle"), HELP, ids=[" ".join(a) for a, _ in HELP])
def test_help_of_every_command(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: ") and needle in out, out


def test_top_level_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for command in ("serve", "migrate", "queues", "tail", "dlq", "kv", "timers", "bench"):
        assert command in out


# ---- broker commands ------------------------------------------------------------------------------


async def test_queues_table_and_json(broker: Broker, http: httpx.AsyncClient, capsys: Any) -> None:
    await push(http, "cli-orders", [{"payload": i} for i in range(3)], partition="a")
    await push(http, "cli-orders", [{"payload": 9}], partition="b")
    await push(http, "cli-empty-ish", [{"payload": 1}])
    popped = (await http.get("/api/v1/pop/queue/cli-orders", params={"consumerGroup": "billing"})).json()
    assert len(popped["messages"]) == 1  # one message in flight for billing

    code, out, err = await run(capsys, "queues", "--url", broker.url)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["QUEUE", "PARTITIONS"] and "DLQ" in lines[0]
    row = next(line for line in lines if line.startswith("cli-orders "))
    assert row.split()[1:3] == ["2", "4"]  # partitions, messages
    assert "billing:4" in row
    assert lines[-1] == "2 queues"

    code, out, _ = await run(capsys, "queues", "--url", broker.url, "--json")
    body = orjson.loads(out)
    orders = next(q for q in body["queues"] if q["name"] == "cli-orders")
    assert orders["partitions"] == 2 and orders["messages"] == 4 and orders["inFlight"] == 1


async def test_tail_prints_new_messages_then_stops(
    broker: Broker, http: httpx.AsyncClient, conn: asyncpg.Connection, capsys: Any
) -> None:
    await push(http, "cli-tail", [{"payload": {"old": True}, "transactionId": "old-1"}])
    waiters = broker.app.state.queen.waiters
    tail = asyncio.create_task(
        run(capsys, "tail", "cli-tail", "--url", broker.url, "--limit", "3", "--wait-ms", "5000")
    )
    await eventually(lambda: waiters.parked == 1, "the tail's long-poll to park")
    await push(http, "cli-tail", [{"payload": {"n": 1}, "transactionId": "t-1"}], partition="p1")
    await push(http, "cli-tail", [{"payload": {"n": 2}, "transactionId": "t-2"}, {"payload": "three"}], partition="p2")
    code, out, err = await asyncio.wait_for(tail, 20)
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 3, out
    assert "old-1" not in out  # subscriptionMode=new: only what came after it started
    first = lines[0].split("  ")
    assert first[1:4] == ["p1", "#0", "t-1"] and first[4] == '{"n":1}' and first[0].endswith("Z")
    assert lines[1].split("  ")[1:4] == ["p2", "#0", "t-2"] and lines[2].endswith('"three"')
    left = await conn.fetchval("SELECT count(*) FROM queen.log_groups WHERE name LIKE 'queen-pg-tail-%'")
    assert left == 0  # its throwaway group is gone

    code, out, err = await run(
        capsys, "tail", "cli-tail", "--url", broker.url, "--from-start", "--limit", "2", "--json", "--group", "keep"
    )
    assert code == 0, err
    got = [orjson.loads(line) for line in out.splitlines()]
    assert [m["transactionId"] for m in got] == ["old-1", "t-1"]  # oldest pending partition first
    assert got[0]["data"] == {"old": True} and got[0]["partition"] == "Default" and got[0]["offset"] == 0
    assert await conn.fetchval("SELECT count(*) FROM queen.log_groups WHERE name = 'keep'") == 1  # named: kept


async def test_dlq_list_page_and_requeue(broker: Broker, http: httpx.AsyncClient, capsys: Any) -> None:
    await push(http, "cli-dlq", [{"payload": {"i": i}, "transactionId": f"d-{i}"} for i in range(3)])
    msgs = (await http.get("/api/v1/pop/queue/cli-dlq", params={"batch": 3})).json()["messages"]
    acks = [
        {"transactionId": m["transactionId"], "partitionId": m["partitionId"], "status": "dlq", "error": "bad input"}
        for m in msgs
    ]
    r = await http.post("/api/v1/ack/batch", json={"acknowledgments": acks})
    assert all(x["success"] for x in r.json())

    code, out, err = await run(capsys, "dlq", "cli-dlq", "--url", broker.url)
    assert code == 0, err
    assert out.splitlines()[0].split()[:3] == ["FAILED", "AT", "PARTITION"]
    assert all(f"d-{i}" in out for i in range(3)) and "bad input" in out and '{"i":0}' in out
    assert "1-3 of 3 dead letters in cli-dlq" in out

    code, out, _ = await run(capsys, "dlq", "cli-dlq", "--url", broker.url, "--limit", "1", "--offset", "1", "--json")
    page = orjson.loads(out)
    assert page["total"] == 3 and len(page["messages"]) == 1

    await DlqFill().tick(broker.app.state.queen.db)  # payloads copied out: requeue is possible now
    pid = msgs[0]["partitionId"]
    code, out, err = await run(capsys, "dlq", "cli-dlq", "--url", broker.url, "--requeue", pid, "d-0")
    assert code == 0, err
    assert out.strip() == "requeued d-0 to cli-dlq/Default at offset 3"
    code, out, _ = await run(capsys, "dlq", "cli-dlq", "--url", broker.url)
    assert "1-2 of 2 dead letters" in out and "d-0" not in out

    code, out, err = await run(capsys, "dlq", "cli-dlq", "--url", broker.url, "--requeue", pid, "d-0")
    assert code == 1 and out == ""
    assert err.startswith("queen-pg dlq: the broker answered 404 not_found") and len(err.splitlines()) == 1
    code, _, err = await run(capsys, "dlq", "cli-dlq", "--url", broker.url, "--requeue", "abc", "d-1")
    assert code == 1 and "400 bad_request" in err


async def test_kv_put_and_get(broker: Broker, capsys: Any) -> None:
    code, out, err = await run(capsys, "kv", "put", "cfg", "limits", '{"max": 5}', "--url", broker.url)
    assert code == 0, err
    assert out.startswith("put cfg/limits version ") and "expires" not in out
    code, out, err = await run(capsys, "kv", "get", "cfg", "limits", "--url", broker.url)
    assert code == 0 and orjson.loads(out) == {"max": 5}

    code, out, _ = await run(capsys, "kv", "put", "cfg", "tmp", '"x"', "--ttl", "60", "--url", broker.url, "--json")
    put = orjson.loads(out)
    assert put["version"] > 0 and put.get("expiresAt")
    code, out, _ = await run(capsys, "kv", "get", "cfg", "tmp", "--url", broker.url, "--json")
    assert code == 0 and orjson.loads(out)["value"] == "x"

    code, out, err = await run(capsys, "kv", "get", "cfg", "absent", "--url", broker.url)
    assert code == 1 and out == "" and err.strip() == "queen-pg kv: cfg/absent not found"
    code, _, err = await run(capsys, "kv", "put", "cfg", "k", "{not json", "--url", broker.url)
    assert code == 2 and "VALUE must be JSON" in err
    code, _, err = await run(capsys, "kv", "put", "queen-locks", "k", "1", "--url", broker.url)
    assert code == 1 and "the broker answered 400" in err  # reserved namespace
    with pytest.raises(SystemExit) as exc:  # --ttl and --forever exclude each other
        main(["kv", "put", "a", "b", "1", "--ttl", "5", "--forever"])
    assert exc.value.code == 2


async def test_timers_list_follows_pages(broker: Broker, http: httpx.AsyncClient, capsys: Any) -> None:
    payload = base64.b64encode(b'{"wake": true}').decode()
    ops = [
        {"op": "schedule", "queue": "cli-timers", "timerKey": f"job/{i}", "payload": payload, "delayMs": 3_600_000}
        for i in range(5)
    ]
    r = await http.post("/api/v1/timers", json={"operations": ops})
    assert r.status_code == 200, r.text
    code, out, err = await run(capsys, "timers", "list", "cli-timers", "--url", broker.url, "--page", "2")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["TIMER", "KEY"]
    assert [line.split()[0] for line in lines[1:6]] == [f"job/{i}" for i in range(5)]
    assert lines[-1] == "5 pending timers in cli-timers"
    code, out, _ = await run(capsys, "timers", "list", "cli-timers", "--url", broker.url, "--limit", "3", "--json")
    assert [t["timerKey"] for t in orjson.loads(out)["rows"]] == ["job/0", "job/1", "job/2"]
    code, out, _ = await run(capsys, "timers", "list", "nothing-here", "--url", broker.url)
    assert code == 0 and out.splitlines()[-1] == "0 pending timers in nothing-here"


@pytest.mark.parametrize(
    "argv",
    [["queues"], ["tail", "q", "--limit", "1"], ["dlq", "q"], ["kv", "get", "n", "k"], ["timers", "list", "q"]],
    ids=lambda a: a[0],
)
async def test_broker_down_is_one_clear_line(argv: list[str], capsys: Any) -> None:
    url = down_url()
    code, out, err = await run(capsys, *argv, "--url", url)
    assert code == 1 and out == ""
    assert err == f"queen-pg {argv[0]}: cannot reach the broker at {url}\n"


async def test_url_from_the_environment(broker: Broker, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUEEN_URL", broker.url)
    code, out, err = await run(capsys, "kv", "put", "env", "k", "1")
    assert code == 0 and out.startswith("put env/k"), err


# ---- migrate, bench -------------------------------------------------------------------------------


async def test_migrate_an_empty_database(pg_server: PgServer, capsys: Any) -> None:
    url = empty_database(pg_server)
    code, out, err = await run(capsys, "migrate", "--database-url", url)
    assert code == 0, err
    assert "migrate: applying 0001_baseline ..." in out and "migrate: at head" in out
    assert await fetchval_once(url, "SELECT to_regproc('queen.push_v1') IS NOT NULL")
    code, out, _ = await run(capsys, "migrate", "--database-url", url)  # again: nothing to do
    assert code == 0 and "applying" not in out and "at head" in out


async def test_migrate_failures(capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.delenv("QUEEN_DATABASE_URL", raising=False)
    code, _, err = await run(capsys, "migrate")
    assert code == 2 and "no database" in err
    code, _, err = await run(capsys, "migrate", "--database-url", f"postgresql://x@127.0.0.1:{free_port()}/none")
    assert code == 1 and len(err.splitlines()) == 1 and err.startswith("queen-pg migrate: failed on ")
    assert "Traceback" not in err


def test_bench_lists_scenarios_or_says_it_is_missing(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["bench", "--list"]) == 0
    assert "push_batch100" in capsys.readouterr().out
    assert bench(["--list"], root=tmp_path) == 2
    assert "benchmark suite is not here" in capsys.readouterr().err


# ---- serve --workers ------------------------------------------------------------------------------


def test_serve_with_two_workers(tmp_path: Path) -> None:
    port = free_port()
    env = _embedded_env(tmp_path, port, QUEEN_DB_POOL_SIZE="3")
    log = open(tmp_path / "out.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "queen_pg.cli", "serve", "--workers", "2"], env=env, stdout=log, stderr=log
    )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(base, 30, "/health", proc, tmp_path / "out.log")
        r = httpx.post(f"{base}/api/v1/push", json={"items": [{"queue": "w", "payload": {"x": 1}}]})
        assert r.status_code == 201
        r = httpx.get(f"{base}/api/v1/pop/queue/w", params={"autoAck": "true"})
        assert r.status_code == 200 and r.json()["messages"][0]["data"] == {"x": 1}

        def scrape() -> dict[str, float]:
            text = httpx.get(f"{base}/metrics").text
            return {
                s.name + str(sorted(s.labels.items())): s.value
                for f in text_string_to_metric_families(text)
                for s in f.samples
            }

        pushed = "queen_messages_pushed_total[('tenant', 'default')]"
        pool = "queen_db_pool_max_connections[]"
        # both workers' numbers in every scrape, whichever worker answers it
        _wait(lambda: scrape().get(pool) == 6, 10, "both workers' pools in /metrics")
        for _ in range(4):
            assert scrape()[pushed] == 1
        workers = [line for line in (tmp_path / "out.log").read_text().splitlines() if "Started server process" in line]
        assert len(workers) == 2
        _term_stops_postgres(proc, tmp_path, 30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()

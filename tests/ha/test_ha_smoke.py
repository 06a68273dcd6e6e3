"""``make ha`` end to end (QUEEN_HA=1): deploy/ha/run.py brings up etcd, 3 PostgreSQL nodes under
Patroni (synchronous, strict), 2 meshed brokers and HAProxy; the official client (queen-mq 2.6.0)
pushes and pops through HAProxy; ``patronictl switchover`` moves the primary while a writer keeps
pushing; the client pushes and pops again, and every push the client saw acknowledged is there
(zero lost); Ctrl-C stops it all. The figures (cluster start, the switchover as the client saw it)
are printed (run with -s)."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from queen import Queen

from tests.ha.harness import cluster, leader
from tests.helpers import until

BASE_PORT = int(os.environ.get("QUEEN_HA_BASE_PORT", "25400"))  # clear of `make ha`'s 15400
QUEUE = "ha-smoke"


async def drain(client: Queen, group: str) -> list[str]:
    """Every message of QUEUE for ``group``, acked: their transactionIds."""
    seen: list[str] = []
    while True:
        msgs = await client.queue(QUEUE).group(group).batch(500).wait(False).pop()
        if not msgs:
            return seen
        seen += [m["transactionId"] for m in msgs]
        res = await client.ack(msgs, True, {"group": group})
        assert res.get("success"), res


@pytest.mark.timeout(600)
@pytest.mark.parametrize("db", ["multi-host", "via-proxy"])
async def test_make_ha_serves_through_a_switchover(tmp_path: Path, patroni_venv: Path, db: str) -> None:
    """``db``: how the brokers reach the primary, a multi-host URL with target_session_attrs=read-write
    or HAProxy's PostgreSQL door (GET /primary)."""
    figures: dict[str, Any] = {}
    async with cluster(tmp_path / "ha", patroni_venv, BASE_PORT, "--db", db) as ready:
        figures["cluster_ready_s"] = round(time.monotonic() - ready["t0"], 1)
        figures["run_py"] = ready["timings"]
        async with Queen(ready["front"]) as client:
            await client.queue(QUEUE).create()
            before: list[dict[str, Any]] = [{"data": {"i": i}, "transactionId": f"before-{i}"} for i in range(10)]
            results = await client.queue(QUEUE).push(before)
            assert [r["status"] for r in results] == ["queued"] * 10
            assert sorted(await drain(client, "g1")) == sorted(m["transactionId"] for m in before)

            # a writer pushes one message at a time through the switchover; what the client saw
            # acknowledged must survive it
            acked: list[str] = []
            acked_at: list[float] = []
            failed: list[str] = []
            stop = asyncio.Event()

            async def writer() -> None:
                n = 0
                while not stop.is_set():
                    tid = f"during-{n}"
                    n += 1
                    try:
                        res = await client.queue(QUEUE).push([{"data": {"n": n}, "transactionId": tid}])
                    except Exception:  # the client's retries ran out: in doubt, not acknowledged
                        failed.append(tid)
                        continue
                    if res and res[0].get("status") in ("queued", "duplicate"):
                        acked.append(tid)
                        acked_at.append(time.monotonic())

            old = await leader(ready["rest"])
            w = asyncio.create_task(writer())
            await until(lambda: asyncio.sleep(0, bool(acked)), "the writer's first push", within=10)
            t_switch = time.monotonic()
            sw = await asyncio.to_thread(
                subprocess.run, [*ready["patronictl"], "switchover", "--force"], capture_output=True, text=True
            )
            assert sw.returncode == 0, sw.stdout + sw.stderr
            figures["patronictl_s"] = round(time.monotonic() - t_switch, 1)

            async def moved() -> bool:
                new = await leader(ready["rest"])
                return new is not None and new != old

            await until(moved, "a new leader", within=60)
            after: list[dict[str, Any]] = [{"data": {"i": i}, "transactionId": f"after-{i}"} for i in range(10)]
            results = await client.queue(QUEUE).push(after)  # the client's own retries ride out the rest
            assert [r["status"] for r in results] == ["queued"] * 10
            figures["first_push_after_switch_s"] = round(time.monotonic() - t_switch, 1)
            n_acked = len(acked)
            await until(lambda: asyncio.sleep(0, len(acked) > n_acked), "the writer's push on the new primary", 30)
            stop.set()
            await w

            got = await drain(client, "g1")
            expected = set(acked) | {m["transactionId"] for m in after}
            lost = expected - set(got)
            assert not lost, f"{len(lost)} acknowledged pushes lost: {sorted(lost)[:5]}"
            assert len(got) == len(set(got)), "a message delivered twice to one group"
            gap = max(b - a for a, b in itertools.pairwise(acked_at))
            figures.update(old_leader=old, new_leader=await leader(ready["rest"]), writer_acked=len(acked),
                           writer_in_doubt=len(failed), writer_longest_gap_s=round(gap, 2))  # fmt: skip
    figures["total_s"] = round(time.monotonic() - ready["t0"], 1)
    print(f"\nha smoke ({db}):", json.dumps(figures))

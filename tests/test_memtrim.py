"""The heap trimmer (queen_pg/memtrim.py): freed heap goes back to the system after a burst, and every
serving process runs it unless QUEEN_MALLOC_TRIM_S is 0. The supported platforms (Debian, the Docker
image) use glibc, so these tests run everywhere the suite runs; on a libc without malloc_trim they fail
(trim_now answers -1 and the task ends at once) rather than skip."""

from __future__ import annotations

from typing import Any

import pytest

from queen_pg import memtrim
from tests.conftest import Broker


def test_a_freed_burst_is_given_back() -> None:
    # a burst of 1 KiB blocks (glibc's heap, not Python's arenas) with a small block kept after it, so the
    # heap top stays pinned and glibc's own trimming of the top cannot give anything back
    burst = [bytes(1024) + bytes([i % 256]) for i in range(60_000)]
    pin = bytes(2048) + b"x"
    grown = memtrim.anon_kb()
    del burst
    assert memtrim.anon_kb() > grown - 20_000  # freed, but still mapped
    given = memtrim.trim_now()
    assert given > 20_000, f"only {given} kB given back"
    assert pin.endswith(b"x")


async def test_the_broker_runs_the_trimmer_unless_off(start_broker: Any) -> None:
    on: Broker = await start_broker(jobs_enabled=False)
    task = on.app.state.jobs.task("malloc_trim")
    assert task is not None and not task.done()
    off: Broker = await start_broker(jobs_enabled=False, malloc_trim_s=0)
    with pytest.raises(KeyError):
        off.app.state.jobs.task("malloc_trim")

"""Give freed heap back to the system after a burst: glibc's ``malloc_trim(0)`` every few seconds.

A burst (large push bodies, a thousand partitions in one request, many segments decoded) makes
glibc's heap grow; when those objects die, the memory is free inside the process but most of it stays
mapped (the heap top is pinned by a live block, and glibc only trims the top), so the RSS of an idle
broker stays at the burst's peak. ``malloc_trim(0)`` releases every free page of every arena
(``MADV_DONTNEED``), costing a walk of the free lists (about a millisecond for a 100 MB heap), so it
runs only when the anonymous memory grew since the last trim or at most every ``interval`` seconds.
Not glibc (musl, macOS): nothing to do, the task ends at once.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import logging
from collections.abc import Callable

log = logging.getLogger("queen_pg.memtrim")


@functools.cache  # find_library may run ldconfig: look it up once per process
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        fn = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    trim: Callable[[int], int] = fn
    return trim


def anon_kb() -> int:
    """This process's anonymous resident memory (RssAnon, kB); 0 when /proc is not there."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def trim_now() -> int:
    """One ``malloc_trim(0)``; the kB of anonymous memory it gave back (-1: not glibc)."""
    trim = _malloc_trim()
    if trim is None:
        return -1
    before = anon_kb()
    trim(0)
    return max(before - anon_kb(), 0)


async def run_trimmer(interval_s: float) -> None:
    """Trim after each interval in which the heap grew by 1 MiB or more (the supervisor runs it)."""
    trim = _malloc_trim()
    if trim is None or interval_s <= 0:
        return
    floor = anon_kb()
    while True:
        await asyncio.sleep(interval_s)
        now = anon_kb()
        if now - floor >= 1024:
            trim(0)
            floor = anon_kb()
            log.debug("event=malloc_trim anon_kb_before=%d anon_kb_after=%d", now, floor)

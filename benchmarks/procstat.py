"""What /proc says about the broker: its process tree, CPU seconds per role, resident memory.

The tree under the ``queen-pg serve`` process holds the broker's Python processes (the server, or a
supervisor and its workers) and the embedded PostgreSQL (postmaster and backends, ``comm`` postgres).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: str) -> tuple[int, str, int] | None:
    """(ppid, comm, utime+stime ticks) of a process, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            s = f.read()
    except OSError:
        return None
    lp, rp = s.find(b"("), s.rfind(b")")
    fields = s[rp + 2 :].split()
    return int(fields[1]), s[lp + 1 : rp].decode(errors="replace"), int(fields[11]) + int(fields[12])


def _all_stats() -> dict[int, tuple[int, str, int]]:
    return {int(p): st for p in os.listdir("/proc") if p.isdigit() and (st := _stat(p)) is not None}


def _tree(root: int, stats: dict[int, tuple[int, str, int]]) -> list[int]:
    """``root`` and its descendants, parents before children."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _comm, _ticks) in stats.items():
        children.setdefault(ppid, []).append(pid)
    out, stack = [], [root] if root in stats else []
    while stack:
        pid = stack.pop()
        out.append(pid)
        stack.extend(sorted(children.get(pid, []), reverse=True))
    return out


def tree_cpu(root: int) -> dict[str, float]:
    """CPU seconds so far of the tree under ``root``: python (broker) processes vs postgres ones."""
    stats = _all_stats()
    out = {"broker": 0.0, "postgres": 0.0}
    for pid in _tree(root, stats):
        _ppid, comm, ticks = stats[pid]
        out["postgres" if comm.startswith("postgres") else "broker"] += ticks / TICK
    return out


def machine_cpu() -> dict[str, float]:
    """CPU seconds of the whole machine so far (/proc/stat): processes (user + system), interrupts
    (irq + softirq: mostly loopback networking, ours included), and time stolen by the hypervisor."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = v[:8]
    return {"procs": (user + nice + system) / TICK, "irq": (irq + softirq) / TICK, "steal": steal / TICK}


class CpuWindow:
    def __init__(self, root: int | None) -> None:
        self.root = root
        self.start: dict[str, float] = {}

    def snapshot(self) -> dict[str, float]:
        t = os.times()
        snap = {"loadgen": t.user + t.system, "wall": time.monotonic()}
        snap |= machine_cpu()
        if self.root is not None:
            snap |= tree_cpu(self.root)
        return snap

    def begin(self) -> None:
        self.start = self.snapshot()

    def end(self) -> dict[str, float]:
        e, s = self.snapshot(), self.start
        d = {k: e[k] - s[k] for k in e}
        wall = d.pop("wall") or 1e-9
        # processes that are neither the broker tree nor this one: other people's work on the machine
        # (clamped: tick granularity and processes that exited make it slightly negative when idle)
        d["other"] = max(0.0, d.pop("procs") - d["loadgen"] - d.get("broker", 0.0) - d.get("postgres", 0.0))
        # as cores used during the window (1.0 = one core busy all the time)
        return {k: round(v / wall, 3) for k, v in d.items()}


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    comm: str
    cmdline: str
    rss_mb: float
    hwm_mb: float  # peak RSS


def _status_mb(pid: int, key: str) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return 0.0


def anon_mb(pid: int) -> float:
    """Anonymous (heap) memory of a process in MB (RssAnon): RSS without the mapped code and libraries."""
    return _status_mb(pid, "RssAnon")


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def broker_processes(root: int) -> list[Proc]:
    """The Python processes of the tree under ``root`` (the root first), PostgreSQL excluded."""
    stats = _all_stats()
    out = []
    for pid in _tree(root, stats):
        ppid, comm, _ticks = stats[pid]
        if not comm.startswith("postgres"):
            out.append(Proc(pid, ppid, comm, _cmdline(pid), _status_mb(pid, "VmRSS"), _status_mb(pid, "VmHWM")))
    return out


def workers(procs: list[Proc]) -> list[Proc]:
    """The processes that serve HTTP: the children of a supervisor (not multiprocessing's resource
    tracker), or the root itself when it has none."""
    if not procs:
        return []
    kids = [p for p in procs[1:] if "resource_tracker" not in p.cmdline]
    return kids or procs[:1]

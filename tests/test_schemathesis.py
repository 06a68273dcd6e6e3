"""Schemathesis against a real broker: a bounded run (fixed seed, deterministic generation) over every
operation of ``/openapi.json``, with the checks that the document and the broker agree: no server
error, answers, statuses and content types as documented, data valid by the schema accepted and data
invalid by it refused (``tests/schemathesis.toml`` says which statuses count). Zero failures.

Five operations have rules that relate several parameters or items, which JSON Schema cannot state, so
for them "valid by the schema" is not "accepted" and the positive-data check does not run (every other
check does): ``GET /api/v1/pop`` (namespace and/or task), ``POST /api/v1/kv`` and ``/transaction`` (one
write per key per call, at most 256 distinct keys, exactly one of ttlSeconds/forever, byte limits of ns
and key), ``POST /api/v1/locks`` (at most 1024 slots per call), ``POST /api/v1/timers`` (one op per
queue and timer key; ``payload`` is base64 of JSON)."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import Broker

CONFIG = Path(__file__).with_name("schemathesis.toml")
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    "positive_data_acceptance",
    "negative_data_rejection",
)
CROSS_FIELD = r"^(GET /api/v1/pop|POST /api/v1/(kv|locks|timers|transaction))$"
SEED = 20260101
MAX_EXAMPLES = 6  # per operation and phase: both runs together take about a minute on two busy cores


async def schemathesis(broker: Broker, log: Path, checks: tuple[str, ...], *select: str) -> tuple[int, str]:
    exe = Path(sys.executable).with_name("schemathesis")
    args = [
        *("--config-file", str(CONFIG), "run", f"{broker.url}/openapi.json"),
        *("--checks", ",".join(checks), "--phases", "examples,fuzzing"),
        *("--max-examples", str(MAX_EXAMPLES), "--seed", str(SEED), "--generation-deterministic"),
        *("--no-shrink", "--workers", "1", "--request-timeout", "10", "--output-truncate", "false"),
        *select,
    ]
    proc = await asyncio.create_subprocess_exec(
        str(exe), *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, cwd=log.parent
    )
    out, _ = await proc.communicate()
    text = out.decode(errors="replace")
    await asyncio.to_thread(log.write_text, text)
    return await proc.wait(), text  # already exited (communicate read to EOF): its exit code


@pytest.mark.timeout(400)
async def test_schemathesis_finds_nothing(start_broker, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    broker: Broker = await start_broker(max_waiters=1)
    async with httpx.AsyncClient(base_url=broker.url) as http:
        paths = (await http.get("/openapi.json")).json()["paths"]
    ops = [f"{m.upper()} {p}" for p, item in paths.items() for m in item if m in ("get", "post", "put", "delete")]
    cross = sum(1 for op in ops if re.match(CROSS_FIELD, op))
    assert cross == 5, ops
    rc, text = await schemathesis(broker, tmp_path / "all.log", CHECKS, "--exclude-name-regex", CROSS_FIELD)
    assert rc == 0 and " passed" in text, text[-20000:]
    assert f"Tested: {len(ops) - cross}" in text, text[-3000:]  # every operation but the five below
    others = tuple(c for c in CHECKS if c != "positive_data_acceptance")
    rc, text = await schemathesis(broker, tmp_path / "cross.log", others, "--include-name-regex", CROSS_FIELD)
    assert rc == 0 and " passed" in text, text[-20000:]
    assert "Tested: 5" in text, text[-3000:]

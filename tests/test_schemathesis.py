"""Schemathesis against a real broker: a bounded run (fixed seed) over every operation of
``/openapi.json``, with the checks that the document and the broker agree: no server error, answers
and statuses as documented, data valid by the schema accepted and data invalid by it refused
(``tests/schemathesis.toml`` says which statuses count). Zero failures."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from tests.conftest import Broker

CONFIG = Path(__file__).with_name("schemathesis.toml")
CHECKS = ",".join(
    (
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_schema_conformance",
        "positive_data_acceptance",
        "negative_data_rejection",
    )
)
SEED = 20260101
MAX_EXAMPLES = 8  # per operation and phase: the run takes well under a minute on two busy cores


async def test_schemathesis_finds_nothing(start_broker, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    broker: Broker = await start_broker(max_waiters=1)
    exe = Path(sys.executable).with_name("schemathesis")
    proc = await asyncio.create_subprocess_exec(
        str(exe),
        "--config-file",
        str(CONFIG),
        "run",
        f"{broker.url}/openapi.json",
        "--checks",
        CHECKS,
        "--phases",
        "examples,fuzzing",
        "--max-examples",
        str(MAX_EXAMPLES),
        "--seed",
        str(SEED),
        "--generation-deterministic",
        "--no-shrink",
        "--workers",
        "1",
        "--request-timeout",
        "10",
        "--output-truncate",
        "false",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=tmp_path,
    )
    out, _ = await proc.communicate()
    text = out.decode(errors="replace")
    (tmp_path / "schemathesis.log").write_text(text)
    assert proc.returncode == 0, text[-20000:]
    assert "No issues found" in text or "passed" in text, text[-5000:]

"""The README's Python snippet runs as written, against a real broker, with the official
client: it pushes, `consume` hands the message to `handle` and acks it, and runs until cancelled."""

from __future__ import annotations

import asyncio
import re
import signal
import sys

import httpx

from tests.conftest import ROOT, Broker
from tests.helpers import until


def readme_snippet() -> str:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    (snippet,) = [b for b in blocks if "asyncio.run(main())" in b]
    return snippet


async def test_the_readme_snippet_runs_as_written(broker: Broker, http: httpx.AsyncClient) -> None:
    snippet = readme_snippet()
    assert 'Queen("http://localhost:6632")' in snippet  # the URL `make run` serves
    code = snippet.replace("http://localhost:6632", broker.url)  # only the address changes
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert line.decode().strip() == "billing o-1 {'total': 30}", line

        async def acked() -> bool:
            r = await http.get("/api/v1/messages", params={"queue": "orders", "consumerGroup": "billing"})
            return bool(r.status_code == 200 and [m["status"] for m in r.json()["messages"]] == ["consumed"])

        await until(acked, "consume() to ack the message after handle returned")
        assert proc.returncode is None, "consume() returned: it should run until cancelled"
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)  # Ctrl-C: the client stops consume() once its long poll returns
        _out, err = await asyncio.wait_for(proc.communicate(), 30 + 15)  # the client's long poll: 30 s
    # the client's own SIGINT handler closes it and exits 0: stopped because it was cancelled
    assert proc.returncode == 0, (proc.returncode, err.decode()[-2000:])


def test_the_readme_names_no_file_outside_the_repository() -> None:
    """The API reference lives in the repository: no `../` paths, and every repository path
    the README names (`dir/file.ext`) exists."""
    readme = (ROOT / "README.md").read_text()
    assert "../" not in readme and "WIRE.md" not in readme
    named = set(re.findall(r"`([A-Za-z0-9_.-]+/[A-Za-z0-9_./-]+\.(?:py|sql|md|sh|ini|toml|json|html))`", readme))
    assert "sql/schema.sql" in named
    missing = sorted(p for p in named if not p.startswith("/") and not (ROOT / p).is_file())
    assert not missing, f"the README names files that are not in the repository: {missing}"

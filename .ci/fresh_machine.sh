#!/usr/bin/env bash
# The fresh-machine check: the broker as a user installs it, with nothing from the
# source tree or the test extras around it.
#
#   1. build a wheel (not editable) from a copy of the source tree;
#   2. install it with its runtime dependencies only into an empty venv;
#      install the official client, queen-mq==2.6.0, into a second venv (never into the first:
#      the runtime venv must prove that the runtime dependencies alone run the broker);
#   3. start `queen-pg serve` from a directory outside the source tree, on a free port, with an
#      embedded PostgreSQL in a temporary data directory; wait for /health;
#   4. `queen-pg migrate` with the packaged alembic revisions reaches head on that database;
#   5. push and pop (and ack) one message with the official client; fetch /docs and its assets;
#   6. SIGTERM the broker; it must exit 0 within 20 s and leave no PostgreSQL running.
#
# Every step prints one progress line; any failure prints the broker's log and exits non-zero.
# Usage: .ci/fresh_machine.sh   (PYTHON=python3.12 to choose the interpreter; KEEP=1 keeps the temp dir)
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-python3}"
T0=$(date +%s%N)
WORK="$(mktemp -d "${TMPDIR:-/tmp}/queen-fresh.XXXXXX")"
chmod 755 "$WORK"  # as root the embedded PostgreSQL runs as `postgres`, which must reach its data dir
BROKER_PID=""

say() { local ms=$(( ($(date +%s%N) - T0) / 1000000 )); printf 'fresh-machine: [%3d.%01ds] %s\n' $((ms / 1000)) $((ms % 1000 / 100)) "$*"; }
fail() {
    say "FAILED: $*" >&2
    if [[ -f "$WORK/run/broker.log" ]]; then
        echo "---- broker log (last 60 lines) ----" >&2
        tail -n 60 "$WORK/run/broker.log" >&2
        echo "------------------------------------" >&2
    fi
    exit 1
}
cleanup() {
    local rc=$?
    if [[ -n "$BROKER_PID" ]] && kill -0 "$BROKER_PID" 2>/dev/null; then
        kill -KILL "$BROKER_PID" 2>/dev/null || true  # the embedded PostgreSQL follows (parent-death signal)
        wait "$BROKER_PID" 2>/dev/null || true
    fi
    if [[ "${KEEP:-0}" == 1 ]]; then echo "fresh-machine: kept $WORK"; else rm -rf "$WORK"; fi
    exit $rc
}
trap cleanup EXIT
trap 'fail "interrupted"' INT TERM

free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# 1. the wheel, built from what a clone has (tracked files and new unignored ones), never from ./build
say "building the wheel from a copy of $ROOT"
mkdir -p "$WORK/src" "$WORK/dist"
(cd "$ROOT" && git ls-files -z -co --exclude-standard | while IFS= read -r -d '' f; do
    [[ -f "$f" ]] && printf '%s\0' "$f"
done | tar --null -T - -cf -) | tar -xf - -C "$WORK/src"
"$PY" -m pip wheel --no-deps --disable-pip-version-check -q -w "$WORK/dist" "$WORK/src" >"$WORK/build.log" 2>&1 \
    || { cat "$WORK/build.log" >&2; fail "the wheel did not build"; }
WHEEL="$(ls "$WORK"/dist/queen_pg-*.whl)" || fail "no wheel in $WORK/dist"
say "built $(basename "$WHEEL")"

# 2. two venvs, installed in parallel: the runtime one (the wheel and its dependencies, nothing
#    else) and the client one (queen-mq 2.6.0, to talk to the broker)
say "installing the wheel (runtime dependencies only) and, apart, queen-mq==2.6.0"
"$PY" -m venv "$WORK/runtime" && "$PY" -m venv "$WORK/client"
"$WORK/runtime/bin/python" -m pip install -q --no-compile --disable-pip-version-check "$WHEEL" >"$WORK/runtime.log" 2>&1 &
RT=$!
"$WORK/client/bin/python" -m pip install -q --no-compile --disable-pip-version-check "queen-mq==2.6.0" >"$WORK/client.log" 2>&1 &
CL=$!
wait $RT || { cat "$WORK/runtime.log" >&2; fail "installing the wheel into an empty venv failed"; }
wait $CL || { cat "$WORK/client.log" >&2; fail "installing queen-mq==2.6.0 failed"; }
for extra in pytest queen jsonschema; do  # the test extras must not be there: the proof would be void
    if "$WORK/runtime/bin/python" -c "import $extra" 2>/dev/null; then
        fail "the runtime venv has '$extra' (a test-only package): it proves nothing"
    fi
done
say "runtime venv: $("$WORK/runtime/bin/python" -m pip list --disable-pip-version-check 2>/dev/null | tail -n +3 | wc -l) packages, no test extras"
# every module of the package imports with the runtime dependencies alone (the migrations are
# alembic scripts, loaded by `queen-pg migrate` below)
(cd "$WORK" && env -u PYTHONPATH "$WORK/runtime/bin/python" - <<'PY') || fail "a queen_pg module does not import with the runtime dependencies alone"
import importlib
import pkgutil

import queen_pg

names = [m.name for m in pkgutil.walk_packages(queen_pg.__path__, "queen_pg.") if not m.name.startswith("queen_pg.migrations")]
for name in names:
    importlib.import_module(name)
print(f"fresh-machine: imported {len(names)} queen_pg modules")
PY

# 3. serve from outside the source tree
mkdir -p "$WORK/run" && chmod 755 "$WORK/run"
cd "$WORK/run"
PORT="$(free_port)"
PG_PORT="$(free_port)"
WHERE="$(env -u PYTHONPATH "$WORK/runtime/bin/python" -c 'import queen_pg, os; print(os.path.dirname(queen_pg.__file__))')"
[[ "$WHERE" == "$WORK/runtime/"* ]] || fail "queen_pg imports from $WHERE, not from the runtime venv"
say "starting queen-pg serve on :$PORT from $WORK/run (embedded PostgreSQL on socket port $PG_PORT)"
env -u PYTHONPATH -u DATABASE_URL -u QUEEN_DATABASE_URL \
    "$WORK/runtime/bin/queen-pg" serve --host 127.0.0.1 --port "$PORT" --data-dir "$WORK/run/.queen" \
    --pg-port "$PG_PORT" >"$WORK/run/broker.log" 2>&1 &
BROKER_PID=$!
for _ in $(seq 1 600); do  # up to 60 s
    kill -0 "$BROKER_PID" 2>/dev/null || fail "queen-pg serve exited before /health answered"
    if curl -fsS -o /dev/null "http://127.0.0.1:$PORT/health" 2>/dev/null; then break; fi
    sleep 0.1
done
HEALTH="$(curl -fsS "http://127.0.0.1:$PORT/health")" || fail "/health did not answer 200 within 60 s"
say "/health: $HEALTH"
grep -q "open it with:" "$WORK/run/broker.log" || fail "serve did not print the psql line"
say "psql line: $(grep -A1 'open it with:' "$WORK/run/broker.log" | tail -1 | sed 's/^ *//')"

# 4. the packaged migrations (no alembic.ini, no checkout): the database boot set up is at head
DSN="postgresql://queen@/queen?host=$WORK/run/.queen/sock&port=$PG_PORT&passfile=$WORK/run/.queen/pgpass"  # the socket wants the password (scram)
MIGRATE="$(env -u PYTHONPATH "$WORK/runtime/bin/queen-pg" migrate --database-url "$DSN" 2>&1)" \
    || { echo "$MIGRATE" >&2; fail "queen-pg migrate failed from the installed wheel"; }
grep -q "migrate: at head" <<<"$MIGRATE" || { echo "$MIGRATE" >&2; fail "queen-pg migrate did not reach head"; }
say "queen-pg migrate from the wheel: $(tail -1 <<<"$MIGRATE")"

# 5. one message through the official client; the offline /docs
"$WORK/client/bin/python" - "http://127.0.0.1:$PORT" <<'PY' || fail "push/pop/ack with queen-mq 2.6.0 failed"
import asyncio
import sys

from queen import Queen


async def main(url: str) -> None:
    async with Queen(url) as q:
        pushed = await q.queue("fresh-machine").push([{"data": {"hello": "fresh"}, "transactionId": "fm-1"}])
        assert [r["status"] for r in pushed] == ["queued"], pushed
        (m,) = await q.queue("fresh-machine").batch(1).wait(False).pop()
        assert m["data"] == {"hello": "fresh"}, m
        assert (await q.ack(m, True))["success"] is True
        assert await q.queue("fresh-machine").batch(1).wait(False).pop() == []
    print("fresh-machine: client pushed, popped and acked", m["transactionId"])


asyncio.run(main(sys.argv[1]))
PY
QUEUES="$(env -u PYTHONPATH "$WORK/runtime/bin/queen-pg" queues --url "http://127.0.0.1:$PORT" 2>&1)" \
    || { echo "$QUEUES" >&2; fail "queen-pg queues (the client commands, httpx) failed"; }
grep -q "fresh-machine" <<<"$QUEUES" || { echo "$QUEUES" >&2; fail "queen-pg queues does not list the queue"; }
say "queen-pg queues lists the queue (client commands work from the wheel)"
DOCS="$(curl -fsS "http://127.0.0.1:$PORT/docs")" || fail "/docs did not answer 200"
for asset in $(grep -oE '(src|href)="/[^"]+"' <<<"$DOCS" | sed -E 's/^(src|href)="//; s/"$//'); do
    size="$(curl -fsS "http://127.0.0.1:$PORT$asset" | wc -c)" || fail "/docs asset $asset did not answer 200"
    [[ "$size" -gt 0 ]] || fail "/docs asset $asset is empty"
done
say "/docs and its assets served by the broker"

# 6. a clean stop
kill -TERM "$BROKER_PID"
for _ in $(seq 1 200); do kill -0 "$BROKER_PID" 2>/dev/null || break; sleep 0.1; done
kill -0 "$BROKER_PID" 2>/dev/null && fail "queen-pg serve still running 20 s after SIGTERM"
set +e
wait "$BROKER_PID"
RC=$?
set -e
BROKER_PID=""
[[ "$RC" -eq 0 ]] || fail "queen-pg serve exited with $RC after SIGTERM"
[[ ! -e "$WORK/run/.queen/pgdata/postmaster.pid" ]] || fail "the embedded PostgreSQL is still running (postmaster.pid)"
grep -q "Traceback" "$WORK/run/broker.log" && fail "the broker log has a traceback"
say "stopped cleanly (exit 0, embedded PostgreSQL stopped); fresh-machine check passed"

"""The dashboard in a real browser (Debian's chromium, Playwright) against a real broker with real data.

Every test starts from tests/dashboard/seed.py: the seed's worker story (one transaction: ack + KV put
of the order's state + push to ``shipments`` + a reminder timer one day later), a backlog, a lagging
group, two dead letters and trace events. The ``dash`` fixture fails a test on any console error, page
error or failed request the test did not provoke on purpose. Screenshots (1280×800) go to
``.screenshots/dashboard/`` (git-ignored); docs/dashboard-*.png are copies of two of them.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest
from playwright.async_api import Request, Route, expect

from queen_pg.jobs.dlq_fill import DlqFill
from queen_pg.jobs.stats import Stats
from tests.dashboard.conftest import Dash, token
from tests.helpers import pop, push_at, until

pytestmark = pytest.mark.timeout(300)  # the first test may install chromium (apt-get) in its setup


async def test_worker_story_shows_on_the_kv_and_timers_pages(dash: Dash) -> None:
    page = dash.page
    await dash.goto("/kv")
    await page.get_by_test_id("kv-namespaces").get_by_role("link", name="orders").click()
    row = page.get_by_test_id("kv-row").filter(has_text=dash.seeded.kv_key)
    await expect(row).to_contain_text('{"status":"paid"}')
    await expect(row).to_contain_text("(in 7.0 d)")  # the worker's ttl: 7 days
    await dash.shot("kv")

    await dash.goto("/timers")
    await page.get_by_test_id("timer-queue").fill("reminders")
    await page.get_by_test_id("timer-queue").press("Enter")
    timer = page.get_by_test_id("timer-row").filter(has_text=dash.seeded.timer_key)
    await expect(timer).to_contain_text(re.compile(r"\(in (23\.9|24\.0) h\)"))  # one day after the commit
    await expect(timer).to_contain_text('{"orderId":"o-1","customer":"c-42"}')
    await dash.shot("timers")


async def test_requeue_from_the_dlq_page_then_the_message_is_consumed(dash: Dash) -> None:
    page = dash.page
    # the dlq_fill job copies the payloads out of their segments (a retry answers 503 until then): run it
    # now rather than wait for its tick (it decodes in one call and writes in the next; the broker's own
    # job may lead a tick meanwhile)
    db = dash.broker.app.state.queen.db
    job = DlqFill()

    async def copied() -> bool:
        await job.run_once(db)
        return await db.fetchval("SELECT count(*) FROM queen.log_dlq WHERE payload IS NULL") == 0

    await until(copied, "the dead letters' payloads to be copied")
    await dash.goto("/dlq")
    rows = page.get_by_test_id("dlq-row")
    await expect(rows).to_have_count(2)
    await expect(rows.filter(has_text="pay-1")).to_contain_text('{"amount":10}')
    await dash.shot("dlq")
    # one by its own button ...
    await rows.filter(has_text="pay-2").get_by_test_id("dlq-requeue").click()
    await dash.confirm()
    await expect(rows).to_have_count(1)
    # ... the rest as a selection
    await page.get_by_test_id("dlq-all").check()
    await page.get_by_test_id("dlq-requeue-selected").click()
    await dash.confirm()
    await expect(rows).to_have_count(0)
    await expect(page.get_by_text("No dead letters.")).to_be_visible()

    async with httpx.AsyncClient(base_url=dash.url) as http:  # the worker takes them again and succeeds
        r = await http.get(
            "/api/v1/pop/queue/payments", params={"batch": 10, "wait": "false", "consumerGroup": "ledger"}
        )
        got = r.json()["messages"]
        assert sorted(m["transactionId"] for m in got) == ["pay-1", "pay-2"]
        acks = [
            {
                "transactionId": m["transactionId"],
                "partitionId": m["partitionId"],
                "leaseId": m["leaseId"],
                "status": "completed",
                "consumerGroup": "ledger",
            }
            for m in got
        ]
        assert (await http.post("/api/v1/ack/batch", json={"acknowledgments": acks})).status_code == 200
    first = dash.seeded.dead[0]
    await dash.goto(f"/messages/{first['partitionId']}/{first['transactionId']}")
    state = page.get_by_test_id("message-group").filter(has_text="ledger")
    await expect(state).to_contain_text("consumed")


async def test_seek_a_group_from_its_page_changes_its_lag(dash: Dash) -> None:
    page = dash.page
    await dash.goto("/groups")
    await expect(page.get_by_test_id("lagging-row").first).to_contain_text("billing")  # 7 behind: the most
    await dash.shot("groups")
    await page.get_by_test_id("lagging-row").first.get_by_role("link", name="billing").click()
    lag = page.get_by_test_id("group-queue-lag")
    await expect(lag).to_have_text("lag 7")
    await dash.shot("group")
    await page.get_by_test_id("seek-end").click()
    await expect(page.get_by_test_id("confirm")).to_contain_text("Move billing on orders to the end?")
    await dash.confirm()
    await expect(lag).to_have_text("lag 0")
    await page.get_by_test_id("seek-start").click()
    await dash.confirm()
    await expect(lag).to_have_text("lag 7")
    # a cancelled confirmation moves nothing
    await page.get_by_test_id("seek-end").click()
    await page.get_by_role("button", name="Cancel").click()
    await expect(page.get_by_test_id("confirm")).to_have_count(0)
    async with httpx.AsyncClient(base_url=dash.url) as http:
        assert (await http.get("/api/v1/consumer-groups/billing")).json()["totalLag"] == 7


async def test_messages_page_filters_by_a_groups_status_on_the_server(dash: Dash) -> None:
    """The status select asks the API for that status (total and paging over the filtered set), not a
    filter of the rows already shown."""
    page = dash.page
    async with httpx.AsyncClient(base_url=dash.url) as http:
        r = await http.get("/api/v1/messages", params={"queue": "orders", "consumerGroup": "fulfillment"})
        states = [(m["transactionId"], m["status"]) for m in r.json()["messages"]]
    consumed = [t for t, s in states if s == "consumed"]
    pending = [t for t, s in states if s == "pending"]
    assert consumed and pending, states
    await dash.goto("/messages?queue=orders&consumerGroup=fulfillment")
    rows = page.get_by_test_id("message-row")
    await expect(rows).to_have_count(len(states))
    with_status: list[str] = []
    page.on("request", lambda req: with_status.append(req.url) if "status=consumed" in req.url else None)
    await page.get_by_test_id("f-status").select_option("consumed")
    await expect(page.get_by_test_id("messages-total")).to_have_text(f"{len(consumed)} consumed in orders")
    await expect(rows).to_have_count(len(consumed))
    for t in consumed:
        await expect(rows.filter(has_text=t)).to_contain_text("consumed")
    assert any("/api/v1/messages?" in u and "consumerGroup=fulfillment" in u for u in with_status), with_status
    await page.get_by_test_id("f-status").select_option("pending")
    await expect(page.get_by_test_id("messages-total")).to_have_text(f"{len(pending)} pending in orders")
    await expect(rows).to_have_count(len(pending))
    await page.get_by_test_id("f-status").select_option("dead")
    await expect(page.get_by_test_id("messages-total")).to_have_text("0 dead in orders")
    await expect(page.get_by_text("No message dead for fulfillment.")).to_be_visible()
    # clearing the group drops the status (the API needs a group for it): every message again
    await page.get_by_test_id("f-consumerGroup").fill("")
    await page.get_by_test_id("f-consumerGroup").press("Enter")
    await expect(page.get_by_test_id("messages-total")).to_have_text(f"{len(states)} in orders")
    assert "status=" not in page.url


LOCAL = """(iso) => {
  const d = new Date(iso); const p = (n) => String(n).padStart(2, '0');
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}`
    + `T${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}"""  # an instant as the browser's local date-time (what a datetime-local input holds)


async def test_seek_a_group_to_a_time_from_its_page(dash: Dash, conn: asyncpg.Connection) -> None:
    """Two pushes an hour apart (time passed to queen.push_v1); seeking to a time between them leaves
    the second push to read, before both all of them, after both none. The page turns the browser's
    local time into the UTC instant it sends."""
    page = dash.page
    t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=3)
    t1 = t0 + timedelta(hours=1)
    async with httpx.AsyncClient(base_url=dash.url) as http:
        r = await http.post("/api/v1/configure", json={"queue": "clock", "options": {}})
        assert r.status_code == 200, r.text
        await push_at(conn, "clock", ["early-0", "early-1"], t0)
        await push_at(conn, "clock", ["late-0", "late-1", "late-2"], t1)
        got = await pop(
            http, "clock", consumerGroup="audit", subscriptionMode="all", batch=10, autoAck=True, wait=False
        )
        assert len(got["messages"]) == 5  # the group is at the end: lag 0
    await dash.goto("/groups/audit")
    lag = page.get_by_test_id("group-queue-lag")
    await expect(lag).to_have_text("lag 0")
    seek = page.get_by_test_id("seek-clock")

    async def seek_to(at: datetime, lag_after: int) -> None:
        await seek.get_by_test_id("seek-time-input").fill(await page.evaluate(LOCAL, at.isoformat()))
        await seek.get_by_test_id("seek-time").click()
        iso = at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
        await expect(page.get_by_test_id("confirm")).to_contain_text(f"Move audit on clock to {iso}?")
        await dash.confirm()
        await expect(lag).to_have_text(f"lag {lag_after}")

    await seek_to(t0 + timedelta(minutes=30), 3)  # between the pushes: the late three again
    await dash.shot("group-seek-time")
    await seek_to(t0 - timedelta(minutes=30), 5)  # before both
    await seek_to(t1 + timedelta(minutes=30), 0)  # after both
    await seek_to(t1, 3)  # at the second push: "at or after"
    async with httpx.AsyncClient(base_url=dash.url) as http:
        again = await pop(http, "clock", consumerGroup="audit", batch=10, autoAck=True, wait=False)
        assert [m["transactionId"] for m in again["messages"]] == ["late-0", "late-1", "late-2"]


DESTRUCTIVE = re.compile(r"^(Delete.*|Requeue.*|Seek to .*|Turn (on|off)|Edit|Cancel|Put)$")


async def _destructive_buttons(dash: Dash) -> list[str]:
    """The labels of every write button on the pages where they live."""
    page = dash.page
    found: list[str] = []
    for hash_, ready in (
        ("/", "maint-push"),
        ("/queues/orders", "queue-config"),
        ("/dlq", "dlq-row"),
        ("/groups/billing", "group-queue"),
        ("/kv?ns=orders", "kv-row"),
        ("/timers?queue=reminders", "timer-row"),
        (f"/messages/{dash.seeded.dead[0]['partitionId']}/{dash.seeded.dead[0]['transactionId']}", "message-group"),
    ):
        await dash.goto(hash_)
        await expect(page.get_by_test_id(ready).first).to_be_visible()
        await page.wait_for_load_state("networkidle")  # the admin probe has answered
        labels = await page.locator("main button").all_inner_texts()
        found += [f"{hash_}: {t}" for t in labels if DESTRUCTIVE.match(t.strip())]
    return found


async def test_read_only_mode_hides_every_destructive_button(dash: Dash) -> None:
    """Read-only is what a token without write rights sees: the dashboard's admin probe
    (POST /api/v1/stats/refresh) answers 403. Here Playwright answers that one probe with 403 on a broker
    without JWT (every other call goes to the real broker); the same with real tokens against the
    broker's JWT check: test_with_jwt_on_a_read_only_token_sees_no_destructive_button."""
    writable = await _destructive_buttons(dash)
    for expected in ("Turn on", "Delete queue", "Requeue", "Seek to end", "Delete group", "Delete", "Cancel", "Edit"):
        assert any(w.endswith(f": {expected}") for w in writable), (expected, writable)
    assert not await dash.page.get_by_test_id("read-only").count()

    async def forbid(route: Route) -> None:
        await route.fulfill(status=403, json={"error": "forbidden: read-only token", "code": "forbidden"})

    await dash.page.route("**/api/v1/stats/refresh", forbid)
    dash.allowed.append("status of 403")  # the browser logs the refused probe
    await dash.page.reload()  # the probe runs when the dashboard loads, as with a new token
    # the refused probe's answer, awaited as an event: "networkidle" alone could come before it (a CI run
    # on a loaded box listed the maintenance buttons of a page rendered before the probe answered)
    await expect(dash.page.get_by_test_id("read-only")).to_be_visible()
    assert await _destructive_buttons(dash) == []
    await expect(dash.page.get_by_test_id("read-only")).to_be_visible()
    await dash.goto("/dlq")
    await expect(dash.page.get_by_test_id("dlq-row").first).to_be_visible()
    assert await dash.page.get_by_test_id("dlq-requeue-selected").count() == 0
    await expect(dash.page.locator("input[type=checkbox]")).to_have_count(0)
    await dash.shot("read-only")


async def test_a_401_asks_for_a_token_and_every_call_then_carries_it(dash: Dash) -> None:
    """The JWT contract, with Playwright playing the checking proxy: a call without
    ``Authorization: Bearer s3cret`` answers 401; the dashboard asks once, keeps the token in
    sessionStorage and sends it on every call after."""
    page = dash.page
    seen: list[str | None] = []

    async def gate(route: Route, request: Request) -> None:
        auth = request.headers.get("authorization")
        seen.append(auth)
        if auth != "Bearer s3cret":
            await route.fulfill(status=401, json={"error": "unauthorized", "code": "unauthorized"})
        else:
            await route.continue_()

    await page.route("**/api/v1/**", gate)
    dash.allowed.append("status of 401")
    await dash.goto("/")
    prompt = page.get_by_test_id("token-prompt")
    await expect(prompt).to_be_visible()
    await expect(page.get_by_test_id("stat-queues")).to_contain_text("–")
    await page.get_by_test_id("token-input").fill("s3cret")
    await page.get_by_role("button", name="Use token").click()
    await expect(prompt).to_have_count(0)
    await expect(page.get_by_test_id("stat-queues")).to_contain_text("3")
    assert await page.evaluate("sessionStorage.getItem('queen.token')") == "s3cret"
    before = len(seen)
    await dash.goto("/queues")  # a new page keeps the token for the session
    await expect(page.get_by_test_id("queue-row")).to_have_count(3)
    assert seen[before:] and all(a == "Bearer s3cret" for a in seen[before:]), seen[before:]
    await expect(prompt).to_have_count(0)


JWT_SECRET = "dashboard-secret-0123456789-abcdefghij"


@pytest.mark.broker(jwt_enabled=True, jwt_secret=JWT_SECRET)
async def test_with_jwt_on_a_read_only_token_sees_no_destructive_button(dash: Dash) -> None:
    """The broker's own JWT check, no stand-in: without a token the dashboard asks for one; the broker
    refuses a read-only token's admin probe (403) and no destructive button shows on any page; with an
    admin token they are back."""
    page = dash.page
    dash.allowed += ["status of 401", "status of 403"]  # the calls before the token; the refused probe
    await dash.goto("/")
    prompt = page.get_by_test_id("token-prompt")
    await expect(prompt).to_be_visible()
    await page.get_by_test_id("token-input").fill(token(JWT_SECRET, "read-only"))
    await page.get_by_role("button", name="Use token").click()
    await expect(prompt).to_have_count(0)
    await expect(page.get_by_test_id("stat-queues")).to_contain_text("3")  # reads work with it
    await expect(page.get_by_test_id("read-only")).to_be_visible()
    assert await _destructive_buttons(dash) == []
    await dash.shot("read-only-jwt")
    await page.evaluate("t => sessionStorage.setItem('queen.token', t)", token(JWT_SECRET, "admin"))
    await page.reload()
    writable = await _destructive_buttons(dash)
    for expected in ("Turn on", "Delete queue", "Requeue", "Seek to end"):
        assert any(w.endswith(f": {expected}") for w in writable), (expected, writable)
    assert not await page.get_by_test_id("read-only").count()


@pytest.mark.broker(jobs_enabled=False)  # the test writes the stats history itself (a job's sample would skip it)
async def test_every_page_renders_with_no_console_error(dash: Dash) -> None:
    page = dash.page
    ship = "ship-o-1"
    async with httpx.AsyncClient(base_url=dash.url) as http:
        r = await http.get("/api/v1/messages", params={"queue": "shipments"})
        pid = r.json()["messages"][0]["partitionId"]
        # three minutes of history for the charts: the stats job's samples, time passed to it
        db = dash.broker.app.state.queen.db
        now = datetime.now(UTC)
        for minutes_ago in (3, 2, 1, 0):
            items = [{"queue": "orders", "partition": "c-9", "payload": {"i": i}} for i in range(4 * minutes_ago + 3)]
            assert (await http.post("/api/v1/push", json={"items": items})).status_code == 201
            await Stats().run_once(db, now=now - timedelta(minutes=minutes_ago))
        series = (await http.get("/api/v1/status/analytics")).json()["series"]
        assert sum(1 for b in series if b["backlog"] is not None) >= 3
    pages: list[tuple[str, str, Any]] = [
        ("overview", "/", page.get_by_test_id("stat-dlq")),
        ("queues", "/queues", page.get_by_test_id("queue-row").filter(has_text="orders")),
        ("queue", "/queues/orders", page.get_by_test_id("group-row").filter(has_text="fulfillment")),
        ("messages", "/messages?queue=orders&consumerGroup=fulfillment", page.get_by_test_id("message-row").first),
        ("message", f"/messages/{pid}/{ship}", page.get_by_test_id("timeline")),
        ("traces", "/traces?name=order-o-1", page.get_by_test_id("timeline")),
        ("traces-by-message", f"/traces?pid={pid}&txn={ship}", page.get_by_test_id("timeline")),
    ]
    for name, hash_, ready in pages:
        await dash.goto(hash_)
        await expect(ready.first).to_be_visible()
        await page.wait_for_load_state("networkidle")
        await dash.shot(name)
    await dash.goto("/")
    await expect(page.get_by_test_id("stat-dlq")).to_contain_text("2")
    await expect(page.get_by_test_id("stat-messages")).to_have_text("46Messages")  # 10 seeded + 36 pushed above
    await expect(page.get_by_test_id("chart-throughput").locator("canvas")).to_have_count(1)
    await expect(page.get_by_test_id("chart-backlog").locator("canvas")).to_have_count(1)
    await expect(page.locator("main")).to_contain_text("limiters")
    await dash.goto("/messages/1/no-such-message")  # a 404 is shown on the page, not thrown
    dash.allowed.append("status of 404")
    await expect(page.get_by_role("alert")).to_contain_text("404")


async def test_overview_refreshes_in_place(dash: Dash) -> None:
    """A push shows on the open overview within a refresh, in the same DOM nodes (no flicker)."""
    page = dash.page
    await dash.goto("/")
    stat = page.get_by_test_id("stat-messages")
    await expect(stat).to_contain_text("10")
    await stat.evaluate("el => { el.dataset.mark = 'kept' }")
    async with httpx.AsyncClient(base_url=dash.url) as http:
        items = [{"queue": "orders", "partition": "c-9", "payload": {"i": i}} for i in range(5)]
        assert (await http.post("/api/v1/push", json={"items": items})).status_code == 201
    await expect(stat).to_contain_text("15")
    assert await stat.get_attribute("data-mark") == "kept"


async def test_operations_from_the_pages(dash: Dash) -> None:
    """Configure a queue, put and delete a KV key, cancel a timer, switch maintenance on and off."""
    page = dash.page
    await dash.goto("/queues/orders")
    await page.get_by_test_id("config-edit").click()
    await page.get_by_test_id("opt-leaseTime").fill("120")
    await page.get_by_test_id("config-save").click()
    await dash.confirm()
    await expect(page.get_by_test_id("val-leaseTime")).to_have_text("120")

    await dash.goto("/kv?ns=orders")
    await expect(page.get_by_test_id("kv-row")).to_have_count(1)
    await page.get_by_test_id("kv-key").fill("order-o-2")
    await page.get_by_test_id("kv-value").fill('{"status": "new"}')
    await page.get_by_test_id("kv-put").click()
    await dash.confirm()
    await expect(page.get_by_test_id("kv-got")).to_contain_text('"status": "new"')
    await expect(page.get_by_test_id("kv-row")).to_have_count(2)
    await page.get_by_test_id("kv-row").filter(has_text="order-o-2").get_by_test_id("kv-delete").click()
    await dash.confirm()
    await expect(page.get_by_test_id("kv-row")).to_have_count(1)
    await page.get_by_test_id("kv-value").fill("not json")
    await page.get_by_test_id("kv-put").click()  # refused in the page, nothing sent
    await expect(page.get_by_test_id("kv-tool")).to_contain_text("The value must be JSON")

    await dash.goto("/timers?queue=reminders")
    await page.get_by_test_id("timer-row").get_by_test_id("timer-cancel").click()
    await dash.confirm()
    await expect(page.get_by_test_id("timer-row")).to_have_count(0)

    await dash.goto("/")
    state = page.get_by_test_id("maint-push-state")
    await expect(state).to_have_text("off")
    await page.get_by_test_id("maint-push-toggle").click()
    await dash.confirm()
    await expect(state).to_have_text("on")
    one = {"items": [{"queue": "orders", "payload": 1}]}
    async with httpx.AsyncClient(base_url=dash.url) as http:
        # each process re-reads the switches every maintenance_refresh_ms: the gate follows within one
        async def push_is(status: int) -> bool:
            return (await http.post("/api/v1/push", json=one)).status_code == status

        await until(lambda: push_is(503), "pushes refused in push maintenance")
        await page.get_by_test_id("maint-push-toggle").click()
        await dash.confirm()
        await expect(state).to_have_text("off")
        await until(lambda: push_is(201), "pushes accepted again")


async def test_the_queue_list_searches_and_pages_on_the_server(dash: Dash) -> None:
    """33 queues (the seed's 3 + 30): the list shows 25 and pages to the rest; a search narrows it
    through the API's ``search`` (the page count follows the filtered total)."""
    page = dash.page
    async with httpx.AsyncClient(base_url=dash.url) as http:
        items = [{"queue": f"bulk-{i:02d}", "payload": {"i": i}} for i in range(30)]
        assert (await http.post("/api/v1/push", json={"items": items})).status_code == 201
    await dash.goto("/queues")
    rows = page.get_by_test_id("queue-row")
    pager = page.locator(".pager")
    await expect(rows).to_have_count(25)
    await expect(pager).to_contain_text("1–25 of 33")
    await pager.get_by_role("button", name="Next ›").click()
    await expect(rows).to_have_count(8)
    await expect(pager).to_contain_text("26–33 of 33")
    await expect(pager.get_by_role("button", name="Next ›")).to_be_disabled()
    await page.get_by_test_id("queue-search").fill("bulk-1")
    await expect(rows).to_have_count(10)  # bulk-10 .. bulk-19
    await expect(pager).to_contain_text("1–10 of 10")
    assert "search=bulk-1" in page.url
    await page.get_by_test_id("queue-search").fill("no-such-queue")
    await expect(page.get_by_text("No queue matches “no-such-queue”.")).to_be_visible()


async def test_the_open_queue_page_refreshes_in_place(dash: Dash) -> None:
    """A push shows on an open queue's page within a refresh (a group's lag), in the same DOM node."""
    page = dash.page
    async with httpx.AsyncClient(base_url=dash.url) as http:
        groups = (await http.get("/api/v1/resources/queues/orders")).json()["groups"]
        lag = next(g["lag"] for g in groups if g["name"] == "fulfillment")
    await dash.goto("/queues/orders")
    cell = page.get_by_test_id("group-row").filter(has_text="fulfillment").get_by_test_id("group-lag")
    await expect(cell).to_have_text(str(lag))
    await cell.evaluate("el => { el.dataset.mark = 'kept' }")
    async with httpx.AsyncClient(base_url=dash.url) as http:
        items = [{"queue": "orders", "partition": "c-9", "payload": {"i": i}} for i in range(5)]
        assert (await http.post("/api/v1/push", json={"items": items})).status_code == 201
    await expect(cell).to_have_text(str(lag + 5))
    assert await cell.get_attribute("data-mark") == "kept"


async def test_messages_page_filters_by_partition_and_offsets_then_deletes_one(dash: Dash) -> None:
    """The partition and offset filters ask the API for that slice; a message's page deletes it (with
    confirmation) and the API then knows it no more."""
    page = dash.page
    want_params = {"queue": "orders", "partition": "c-7", "fromOffset": "1", "toOffset": "3"}
    async with httpx.AsyncClient(base_url=dash.url) as http:
        everything = (await http.get("/api/v1/messages", params={"queue": "orders"})).json()["total"]
        want = (await http.get("/api/v1/messages", params=want_params)).json()
    assert 0 < want["total"] < everything, (want, everything)
    await dash.goto("/messages?queue=orders")
    rows = page.get_by_test_id("message-row")
    await expect(page.get_by_test_id("messages-total")).to_contain_text(f"{everything} in orders")
    for key in ("partition", "fromOffset", "toOffset"):
        await page.get_by_test_id(f"f-{key}").fill(want_params[key])
    await page.get_by_role("button", name="Apply").click()
    await expect(page.get_by_test_id("messages-total")).to_contain_text(f"{want['total']} in orders")
    await expect(rows).to_have_count(len(want["messages"]))
    for m in want["messages"]:
        await expect(rows.filter(has_text=m["transactionId"])).to_contain_text("c-7")
    victim = want["messages"][0]
    await rows.filter(has_text=victim["transactionId"]).get_by_role("link").click()
    await expect(page.get_by_test_id("message-group").first).to_be_visible()
    await page.get_by_test_id("message-delete").click()
    await dash.confirm()
    await expect(page.get_by_test_id("messages-total")).to_be_visible()  # back on the queue's list
    async with httpx.AsyncClient(base_url=dash.url) as http:
        r = await http.get(f"/api/v1/messages/{victim['partitionId']}/{victim['transactionId']}")
        assert r.status_code == 404, r.text


async def test_kv_prefix_browse_and_get_then_a_group_deleted_from_its_page(dash: Dash) -> None:
    """The KV page's prefix browser and one-key get; a consumer group deleted from its page (with
    confirmation) is gone from the API."""
    page = dash.page
    async with httpx.AsyncClient(base_url=dash.url) as http:
        ops = [
            {"op": "put", "ns": "orders", "key": f"invoice-{i}", "value": {"n": i}, "forever": True} for i in range(3)
        ]
        assert (await http.post("/api/v1/kv", json={"operations": ops})).status_code == 200
    await dash.goto("/kv?ns=orders")
    rows = page.get_by_test_id("kv-row")
    await expect(rows).to_have_count(4)  # the worker's order-o-1 and three invoices
    await page.get_by_test_id("kv-prefix").fill("invoice-")
    await page.get_by_role("button", name="Browse").click()
    await expect(rows).to_have_count(3)
    await expect(rows.filter(has_text="order-o-1")).to_have_count(0)
    await page.get_by_test_id("kv-key").fill("invoice-2")
    await page.get_by_test_id("kv-get").click()
    await expect(page.get_by_test_id("kv-got")).to_contain_text('"n": 2')

    await dash.goto("/groups/billing")
    await expect(page.get_by_test_id("group-queue-lag")).to_have_text("lag 7")
    await page.get_by_test_id("group-delete").click()
    await dash.confirm()
    async with httpx.AsyncClient(base_url=dash.url) as http:

        async def gone() -> bool:
            groups = (await http.get("/api/v1/consumer-groups")).text
            return "billing" not in groups

        await until(gone, "the group to be deleted")


@pytest.mark.broker(jwt_enabled=True, jwt_secret=JWT_SECRET, jwt_tenant_claim="tenant")
async def test_another_tenants_admin_is_refused_the_maintenance_switch_and_keeps_its_buttons(dash: Dash) -> None:
    """The maintenance switches are system-wide: an admin of a tenant other than the default one gets the
    broker's 403 on the page, the switch stays off, and the dashboard does not fall into read-only mode."""
    page = dash.page
    dash.allowed += ["status of 401", "status of 403"]
    await dash.goto("/")
    await page.get_by_test_id("token-input").fill(token(JWT_SECRET, "admin", tenant="tenant-b"))
    await page.get_by_role("button", name="Use token").click()
    await expect(page.get_by_test_id("token-prompt")).to_have_count(0)
    state = page.get_by_test_id("maint-push-state")
    await expect(state).to_have_text("off")
    await page.get_by_test_id("maint-push-toggle").click()
    await dash.confirm()
    await expect(page.locator(".toast.bad")).to_contain_text("403")
    await expect(page.locator(".toast.bad")).to_contain_text("default tenant")
    await expect(state).to_have_text("off")
    await expect(page.get_by_test_id("maint-push-toggle")).to_be_visible()  # still an admin here
    assert not await page.get_by_test_id("read-only").count()
    async with httpx.AsyncClient(base_url=dash.url) as http:
        operator = {"Authorization": f"Bearer {token(JWT_SECRET, 'admin', tenant='default')}"}
        r = await http.get("/api/v1/system/maintenance", headers=operator)
        assert r.json()["maintenanceMode"] is False

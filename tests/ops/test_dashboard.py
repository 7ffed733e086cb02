"""``keyqueue dashboard``: the live page of Redis queues, its API and guard, in a real Chromium.

Each test runs the real command (``python -m keyqueue dashboard NAME
--redis-url URL --port 0 --no-open``) against the session's valkey-server, on
a queue of its own that the test fills through its own clients: so every key
the page shows was put there by another process. The browser tests use
Debian's Chromium through Playwright (``support/web_browser.py``'s fixtures); they skip
without it, unless KEYQUEUE_REQUIRE_BROWSER=1.

The dashboard reads its queues once a second: every wait below is a bounded
wait for a state to appear, never a sleep.
"""

from __future__ import annotations

import asyncio
import http.server
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from keyqueue import Empty
from keyqueue._web.app import HEADERS
from keyqueue._web.static import SHARED
from keyqueue.lab.web.server import WebServer
from keyqueue.redis import RedisRateLimiter, RedisWorkQueue
from keyqueue.testing import ValkeyServer
from tests.support import valkey_server
from tests.support.dashboard import WAIT, page_token, request, running, state_until
from tests.support.foreground import top_line

pytest_plugins = ["tests.support.web_browser"]  # the browser and its context

if TYPE_CHECKING:
    from playwright.sync_api import BrowserContext

    from tests.support.web_browser import LabPage

name = valkey_server.name  # fixtures: a queue of this test's own
make = valkey_server.make

APPEAR = 3.0
"""Seconds within which a change made by another process must be on the page."""
DOCS_SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "dashboard.png"
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 900}
SLOW = RedisRateLimiter(base_delay=60.0, max_delay=600.0)
"""A failing key stays in backoff for the whole test."""


def busy_queue(make: Callable[..., RedisWorkQueue]) -> tuple[RedisWorkQueue, RedisWorkQueue]:
    """Keys waiting (``w1``..``w3``), ``held`` held by another client (holder
    ``worker-b``), ``broken`` failing three times and in backoff."""
    q = make(rate_limiter=SLOW)
    other = make(lease=30.0, holder="worker-b")
    other.add("held")
    assert other.get(timeout=1) == "held"
    q.add_many(["w1", "w2", "w3"])
    for _ in range(3):
        q.retry("broken")
    return q, other


# -- what the page says, without a browser ---------------------------------------------


def test_state_lists_waiting_held_delayed_and_failing_keys_with_their_numbers(
    valkey_url: str, name: str, make: Callable[..., RedisWorkQueue]
) -> None:
    busy_queue(make)
    second = RedisWorkQueue(f"{name}-second", url=valkey_url)
    second.add("only")
    with running(valkey_url, name, second.name) as url:
        status, state = request(f"{url}api/state")
    second.close()
    assert status == 200
    assert [queue["name"] for queue in state["queues"]] == [name, second.name]
    assert [row["key"] for row in state["queues"][1]["now"]["waiting"]] == ["only"]
    now = state["queues"][0]["now"]
    assert [row["key"] for row in now["waiting"]] == ["w1", "w2", "w3"]
    assert all(row["waited"] >= 0 and row["priority"] == 0 for row in now["waiting"])
    (held,) = now["processing"]
    assert (held["key"], held["holder"]) == ("held", "worker-b")
    assert 25 < held["lease_left"] <= 30
    assert held["token"] > 0
    assert [(r["key"], r["failures"]) for r in now["failing"]] == [("broken", 3)]
    assert 0 < now["failing"][0]["comes_back_in"] <= 600
    assert [r["key"] for r in now["delayed"]] == ["broken"]
    assert now["stats"]["depth"] == 3
    assert now["stats"]["processing"] == 1


def test_a_foreign_host_or_origin_and_a_post_without_the_token_are_refused(
    valkey_url: str, name: str, make: Callable[..., RedisWorkQueue]
) -> None:
    q = make(rate_limiter=SLOW)
    q.retry("broken")
    with running(valkey_url, name) as url:
        token = page_token(url)
        body = {"queue": name, "key": "broken"}
        good = {"Content-Type": "application/json", "X-Keyqueue-Token": token}
        port = url.rsplit(":", 1)[1].strip("/")
        status, answer = request(f"{url}api/state", headers={"Host": f"evil.example:{port}"})
        assert status == 421
        assert "is not this server" in answer["error"]
        status, answer = request(
            f"{url}api/forget", body, {**good, "Origin": "http://evil.example"}
        )
        assert status == 403
        assert "other sites' requests are refused" in answer["error"]
        status, answer = request(f"{url}api/forget", body, {"Content-Type": "application/json"})
        assert status == 403
        assert "X-Keyqueue-Token" in answer["error"]
        status, _ = request(f"{url}api/forget", body, {**good, "Content-Type": "text/plain"})
        assert status == 415
        status, answer = request(f"{url}api/forget", {**body, "queue": "other"}, good)
        assert (status, answer["error"]) == (400, "no queue 'other' on this dashboard")
        assert q.num_requeues("broken") == 1  # nothing above changed anything
        status, answer = request(f"{url}api/forget", body, {**good, "Origin": url.rstrip("/")})
        assert (status, answer["ok"]) == (200, True)
        assert "failures cleared" in answer["message"]
    assert q.num_requeues("broken") == 0


def test_read_only_serves_the_page_without_actions(
    valkey_url: str, name: str, make: Callable[..., RedisWorkQueue]
) -> None:
    q = make(rate_limiter=SLOW)
    q.retry("broken")
    with running(valkey_url, name, args=("--read-only",), sigint_ignored=True) as url:
        assert page_token(url) == ""
        status, answer = request(
            f"{url}api/forget",
            {"queue": name, "key": "broken"},
            {"Content-Type": "application/json", "X-Keyqueue-Token": ""},
        )
        assert status == 403
        assert "read-only" in answer["error"]
    assert q.num_requeues("broken") == 1


def _answer(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any, bytes]:
    """(status, headers, body) of a GET, an error answer included."""
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=WAIT) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.headers, error.read()


def test_the_dashboard_and_the_labs_page_send_the_same_headers_and_shared_files(
    valkey_url: str, name: str, make: Callable[..., RedisWorkQueue]
) -> None:
    make().add("k")
    lab_paths = ["", "static/app.js", "static/app.css", "api/live"]
    paths = ["", "static/app.js", "static/app.css", "api/state"]
    with running(valkey_url, name) as url, WebServer("127.0.0.1", 0) as lab:
        answers = [_answer(f"{lab.url}{path}") for path in lab_paths]
        answers += [_answer(f"{url}{path}") for path in paths]
        port = url.rsplit(":", 1)[1].strip("/")
        refused = _answer(f"{url}api/state", {"Host": f"evil.example:{port}"})
        lab_refused = _answer(f"{lab.url}api/live", {"Host": f"evil.example:{lab.port}"})
        shared = {
            file: (_answer(f"{lab.url}static/{file}"), _answer(f"{url}static/{file}"))
            for file in SHARED
        }
    assert [status for status, _, _ in answers] == [200] * len(answers)
    assert (refused[0], lab_refused[0]) == (421, 421)
    for _, headers, _ in [*answers, refused, lab_refused]:
        assert {header: headers[header] for header in HEADERS} == HEADERS
    assert headers["Referrer-Policy"] == "no-referrer"
    for (status, headers, body), (_, _, same) in shared.values():
        assert status == 200
        assert {header: headers[header] for header in HEADERS} == HEADERS
        assert body == same
    assert shared["format.js"][0][1]["Content-Type"].startswith("text/javascript")
    assert shared["base.css"][0][1]["Content-Type"].startswith("text/css")


@pytest.mark.parametrize(
    ("args", "status", "words"),
    [
        (
            ["nobody-used-this-queue", "--redis-url", "{url}"],
            1,
            "no queue 'nobody-used-this-queue' at 127.0.0.1:",
        ),
        (
            ["q", "--redis-url", "redis://127.0.0.1:1/0"],
            1,
            "cannot reach the server at 127.0.0.1:1/0",
        ),
        (["q", "--redis-url", "ftp://x"], 2, "--redis-url"),
        (["--redis-url", "{url}"], 2, "Missing argument"),
    ],
)
def test_cli_errors_are_one_line(valkey_url: str, args: list[str], status: int, words: str) -> None:
    argv = [a.replace("{url}", valkey_url) for a in args]
    proc = subprocess.run(
        [sys.executable, "-m", "keyqueue", "dashboard", *argv, "--no-open", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=WAIT * 3,
        check=False,
    )
    assert proc.returncode == status, proc.stderr
    assert words in proc.stderr
    assert proc.stderr.startswith("keyqueue dashboard: error:"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def health_of(state: dict[str, Any], queue: str) -> dict[str, Any]:
    (item,) = [q for q in state["queues"] if q["name"] == queue]
    return dict(item["health"] or {})


_DIE_HOLDING = (
    "import os, signal, sys\n"
    "from keyqueue.redis import RedisWorkQueue\n"
    "q = RedisWorkQueue(sys.argv[1], url=sys.argv[2], lease=1.0, holder='doomed')\n"
    "q.add('k')\n"
    "assert q.get(timeout=5) == 'k'\n"
    "os.kill(os.getpid(), signal.SIGKILL)  # a worker that dies holding its key\n"
)


def test_an_overdue_key_a_lease_run_out_and_no_worker_each_read_so_in_the_page_and_top(
    valkey_url: str, name: str
) -> None:
    """No worker anywhere: a delayed key past due, a key whose holder died past
    its lease, keys that wait with no client holding one. Before: "Idle:
    nothing arrives and nothing waits" for the first, and an overdue key's
    ``due in -258000000µs``."""
    overdue, expired, waiting = f"{name}-overdue", f"{name}-expired", f"{name}-waiting"
    with RedisWorkQueue(overdue, url=valkey_url) as q:
        q.add_after("late", 0.2)
    died = subprocess.run(
        [sys.executable, "-c", _DIE_HOLDING, expired, valkey_url], timeout=WAIT * 3, check=False
    )
    assert died.returncode == -signal.SIGKILL
    with RedisWorkQueue(waiting, url=valkey_url) as q:
        q.add_many(["a", "b", "c"])
    expected = {overdue: "overdue", expired: "expired-leases", waiting: "no-workers"}
    with running(valkey_url, overdue, expired, waiting) as url:
        state, _ = state_until(
            url,
            lambda st: all(health_of(st, q)["state"] == s for q, s in expected.items()),
        )
    words = {
        overdue: "Overdue: 1 delayed key is past due (the first by ",
        expired: "Leases run out: 1 held key past its lease (the first by ",
        waiting: "No worker is taking keys: 3 keys wait, the oldest for ",
    }
    for queue, text in words.items():
        assert health_of(state, queue)["text"].startswith(text)
        assert "Idle" not in health_of(state, queue)["text"]
    (item,) = [q for q in state["queues"] if q["name"] == overdue]
    (late,) = item["now"]["delayed"]
    assert re.fullmatch(r"overdue \d+(\.\d+)?s", late["cells"][0]), late["cells"]
    (item,) = [q for q in state["queues"] if q["name"] == expired]
    (held,) = item["now"]["processing"]
    assert held["cells"][0] == "doomed"
    assert re.fullmatch(r"overdue \d+(\.\d+)?s", held["cells"][3]), held["cells"]
    for queue, health in expected.items():  # top says the same, from its first line on
        assert top_line(valkey_url, queue)["health"] == health
    table = subprocess.run(
        [sys.executable, "-m", "keyqueue", "inspect", overdue, "--redis-url", valkey_url],
        capture_output=True,
        text=True,
        timeout=WAIT * 3,
        check=False,
    )
    assert re.search(r"late\s+overdue \d+(\.\d+)?s", table.stdout), table.stdout
    assert "µs" not in table.stdout


def test_a_server_restart_is_said_in_the_header_and_is_a_reset_for_the_rates(
    name: str, tmp_path: Path
) -> None:
    """The server dies: the header says every queue cannot be read (before: green
    "live"). It comes back empty: the counters start again, and no rate is
    negative (before: "-812/s reconciled", the chart below zero)."""
    (tmp_path / "valkey").mkdir()
    with ValkeyServer(tmp_path / "valkey") as server:
        with RedisWorkQueue(name, url=server.url) as q:
            q.add_many([f"k{i}" for i in range(300)])
            for _ in range(300):
                q.done(q.get_nowait())
        with running(server.url, name) as url:
            state, _ = state_until(url, lambda st: st["header"]["state"] == "ok")
            assert state["header"]["text"] == "live: 1 of 1 queues read"
            with RedisWorkQueue(name, url=server.url) as q:  # rates from here on
                q.add_many([f"j{i}" for i in range(200)])
            state_until(url, lambda st: (st["queues"][0]["now"] or {}).get("rates") is not None)
            server.kill()
            state, _ = state_until(url, lambda st: st["header"]["state"] == "down")
            assert state["header"]["text"].startswith("cannot read any queue: ")
            assert health_of(state, name)["state"] == "error"
            server.start()  # on the same port, with no data: every counter is 0
            with RedisWorkQueue(name, url=server.url) as q:
                q.add_many(["after-1", "after-2"])
            state, seen = state_until(
                url,
                lambda st: (
                    st["header"]["state"] == "ok"
                    and st["queues"][0]["now"]["stats"]["adds"] == 2
                    and st["queues"][0]["now"]["rates"] is not None
                ),
            )
            later, more = state_until(url, lambda st: st["rev"] > state["rev"] + 1)
    now = later["queues"][0]["now"]
    assert now["reset_at"] is not None
    for st in [*seen, *more]:
        item = st["queues"][0]
        if item["now"] and item["now"]["rates"]:
            assert min(item["now"]["rates"].values()) >= 0, item["now"]["rates"]
            assert "-" not in item["now"]["shown"]["rates"]["adds"]
    history = later["queues"][0]["history"]  # the chart: no point below zero
    assert all(p[2] is None or p[2] >= 0 for p in history), history
    assert all(p[3] is None or p[3] >= 0 for p in history), history
    assert any(p[2] is None for p in history)  # the reset, where no rate is taken
    assert later["queues"][0]["health"]["state"] in ("starting", "keeping-up", "no-workers")


# -- the page in Chromium ----------------------------------------------------------------


@contextmanager
def opened(context: BrowserContext, url: str, viewport: dict[str, int]) -> Iterator[LabPage]:
    """The dashboard in a new page, live; what it said on the console and fetched."""
    from playwright.sync_api import expect  # noqa: PLC0415 (optional: see web_browser)

    from tests.support.web_browser import LabPage  # noqa: PLC0415

    page = context.new_page()
    try:
        page.set_viewport_size(viewport)  # type: ignore[arg-type]
        shown = LabPage(page, url, expect)
        page.on(
            "console", lambda m: shown.console_errors.append(m.text) if m.type == "error" else None
        )
        page.on("pageerror", lambda error: shown.console_errors.append(f"uncaught: {error}"))
        page.on(
            "request",
            lambda r: (
                None if r.url.startswith((url, "data:")) else shown.foreign_requests.append(r.url)
            ),
        )
        page.goto(url)
        expect(page.locator("#conn")).to_have_attribute("data-state", "ok")
        expect(page.locator("#conn")).to_contain_text("live: ")
        expect(page.locator(".queue .counters .counter").first).to_be_visible()
        yield shown
    finally:
        page.close()


def row(shown: LabPage, queue: str, list_name: str, key: str) -> Any:
    return shown.page.locator(
        f'.queue[data-queue="{queue}"] .list[data-list="{list_name}"] .row[data-key="{key}"]'
    )


def test_page_shows_each_key_with_its_numbers_and_new_keys_without_a_reload(
    valkey_url: str, name: str, make: Callable[..., RedisWorkQueue], context: BrowserContext
) -> None:
    q, _ = busy_queue(make)
    with running(valkey_url, name) as url, opened(context, url, DESKTOP) as shown:
        expect = shown.expect
        for key in ("w1", "w2", "w3"):
            expect(row(shown, name, "waiting", key)).to_contain_text("waited")
        held = row(shown, name, "processing", "held")
        expect(held).to_contain_text("holder worker-b")
        expect(held).to_contain_text(re.compile(r"lease ends in \d+(\.\d+)?s"))
        expect(held).to_contain_text("token")
        expect(held.locator(".lease .fill")).to_be_visible()
        expect(row(shown, name, "failing", "broken")).to_contain_text("failures 3")
        expect(row(shown, name, "failing", "broken")).to_contain_text("comes back in ")
        expect(row(shown, name, "delayed", "broken")).to_contain_text(
            re.compile(r"due in \d+(\.\d+)?s")
        )
        expect(shown.page.get_by_test_id("depth").locator(".value")).to_have_text("3")
        q.add_many(["fresh-1", "fresh-2"])  # another process than the dashboard
        expect(row(shown, name, "waiting", "fresh-2")).to_be_visible(timeout=APPEAR * 1000)
        expect(shown.page.get_by_test_id("depth").locator(".value")).to_have_text("5")
        shown.assert_clean()


def test_page_shows_a_sharded_queue_once_with_a_line_of_its_shards(
    valkey_url: str, name: str, make: Callable[..., RedisWorkQueue], context: BrowserContext
) -> None:
    q = make(shards=3)
    keys = [f"s{i}" for i in range(9)]
    q.add_many(keys)
    with running(valkey_url, name) as url, opened(context, url, DESKTOP) as shown:
        expect, page = shown.expect, shown.page
        expect(page.locator(".queue")).to_have_count(1)
        line = page.locator(f'.queue[data-queue="{name}"] .shards')
        expect(line).to_be_visible()
        expect(line).to_contain_text("shards (waiting/held): 0: ")
        for key in keys:
            expect(row(shown, name, "waiting", key)).to_be_visible()
        q.add("later")
        expect(row(shown, name, "waiting", "later")).to_be_visible(timeout=APPEAR * 1000)
        shown.assert_clean()


def test_retry_now_on_the_failing_key_puts_it_back_waiting_with_failures_cleared(
    valkey_url: str, name: str, make: Callable[..., RedisWorkQueue], context: BrowserContext
) -> None:
    q, _ = busy_queue(make)
    with running(valkey_url, name) as url, opened(context, url, DESKTOP) as shown:
        expect, page = shown.expect, shown.page
        failing = row(shown, name, "failing", "broken")
        failing.get_by_role("button", name="Forget broken").click()
        page.locator("#confirm").get_by_role("button", name="Cancel").click()
        expect(page.locator("#message")).to_have_text("Cancelled: nothing changed.")
        assert q.num_requeues("broken") == 3
        failing.get_by_role("button", name="Retry now broken").click()
        expect(page.locator("#confirm-text")).to_contain_text('Retry "broken" now')
        page.locator("#confirm").get_by_role("button", name="Retry now").click()
        expect(page.locator("#message")).to_contain_text("failures cleared and added again")
        expect(page.locator("#message")).to_contain_text("waiting now")
        expect(row(shown, name, "waiting", "broken")).to_be_visible(timeout=APPEAR * 1000)
        expect(failing).to_have_count(0)
        assert q.num_requeues("broken") == 0
        shown.assert_clean()


def test_page_shows_the_servers_verdict_and_durations_and_a_header_that_is_true(
    name: str, tmp_path: Path, context: BrowserContext
) -> None:
    """An overdue key reads ``due overdue 1.2s`` as ``inspect`` writes it (before:
    ``due in -258000000µs``), with the server's "Overdue" verdict; when the server
    dies the header says no queue can be read (before: green "live")."""
    (tmp_path / "valkey").mkdir()
    with ValkeyServer(tmp_path / "valkey") as server:
        with RedisWorkQueue(name, url=server.url) as q:
            q.add_after("late", 0.1)  # and no worker to release it: overdue
        with running(server.url, name) as url, opened(context, url, DESKTOP) as shown:
            expect, page = shown.expect, shown.page
            expect(page.locator("#conn")).to_have_text("live: 1 of 1 queues read")
            late = row(shown, name, "delayed", "late")
            expect(late).to_contain_text(
                re.compile(r"due overdue \d+(\.\d+)?s"), timeout=WAIT * 1000
            )
            verdict = page.locator(f'.queue[data-queue="{name}"] .verdict')
            expect(verdict).to_have_attribute("data-state", "overdue")
            expect(verdict.locator(".finding").first).to_contain_text(
                "Overdue: 1 delayed key is past due (the first by "
            )
            assert "µs" not in page.locator("main").inner_text()
            server.kill()
            expect(page.locator("#conn")).to_have_attribute(
                "data-state", "down", timeout=WAIT * 1000
            )
            expect(page.locator("#conn")).to_contain_text("cannot read any queue: ")
            expect(verdict).to_have_attribute("data-state", "error")
            expect(page.locator(f'.queue[data-queue="{name}"] .error')).to_be_visible()
            server.start()
            expect(page.locator("#conn")).to_have_attribute("data-state", "ok", timeout=WAIT * 1000)
            shown.assert_clean()


@contextmanager
def another_site() -> Iterator[str]:
    """A page of another origin, served from 127.0.0.1 too (Chromium lets only a
    loopback page reach a loopback server): yields its URL."""

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(b"<!doctype html><title>another site</title>")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page) as site:
        thread = threading.Thread(target=site.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{site.server_address[1]}"
        finally:
            site.shutdown()
            thread.join(WAIT)


def test_a_cross_origin_post_from_another_sites_page_is_refused_and_changes_nothing(
    valkey_url: str, name: str, make: Callable[..., RedisWorkQueue], context: BrowserContext
) -> None:
    """Another site's page POSTs a text/plain body (no CORS preflight needed): the
    browser sends that page's Origin, and the guard answers 403 before any handler
    (what it says is checked without a browser above: Chromium keeps an opaque
    answer's body from the page and from Playwright)."""
    q = make(rate_limiter=SLOW)
    q.retry("broken")
    page = context.new_page()
    try:
        with running(valkey_url, name) as url, another_site() as site:
            page.goto(site)
            with page.expect_response(f"{url}api/forget") as answer:
                page.evaluate(
                    """([url, queue]) => fetch(url, {method: "POST", mode: "no-cors",
                        headers: {"Content-Type": "text/plain"},
                        body: JSON.stringify({queue, key: "broken"})})""",
                    [f"{url}api/forget", name],
                )
            assert answer.value.status == 403
    finally:
        page.close()
    assert q.num_requeues("broken") == 1


@contextmanager
def behind_a_proxy(upstream: str) -> Iterator[str]:
    """What the nginx block of docs/operations.md does, in aiohttp: ``/keyqueue/`` on another
    origin (localhost and another port) passed to ``upstream`` with its own
    ``Host``, the public ``Origin`` turned into the dashboard's, any other
    ``Origin`` passed on. Yields the public URL of the page."""
    from aiohttp import ClientSession, web  # noqa: PLC0415 (the lab extra)

    own = upstream.rstrip("/").removeprefix("http://")
    public: list[str] = []
    started = threading.Event()
    stop: list[Callable[[], None]] = []

    async def forward(request: web.Request) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "origin")}
        headers["Host"] = own
        if (origin := request.headers.get("Origin")) is not None:
            headers["Origin"] = f"http://{own}" if origin == public[0] else origin
        async with (
            ClientSession(auto_decompress=False) as session,
            session.request(
                request.method,
                f"{upstream}{request.match_info['tail']}",
                params=request.query,
                headers=headers,
                data=await request.read(),
            ) as answer,
        ):
            hop = ("content-length", "transfer-encoding", "connection")
            response = web.StreamResponse(
                status=answer.status,
                headers={k: v for k, v in answer.headers.items() if k.lower() not in hop},
            )
            await response.prepare(request)
            async for chunk in answer.content.iter_any():  # the event stream, as it comes
                await response.write(chunk)
            return response

    async def serve() -> None:
        app = web.Application()
        app.router.add_route("*", "/keyqueue/{tail:.*}", forward)
        runner = web.AppRunner(app, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        done = asyncio.Event()
        loop = asyncio.get_running_loop()
        stop.append(lambda: loop.call_soon_threadsafe(done.set))
        public.append(f"http://localhost:{runner.addresses[0][1]}")
        started.set()
        await done.wait()
        await runner.cleanup()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    assert started.wait(WAIT)
    try:
        yield f"{public[0]}/keyqueue/"
    finally:
        stop[0]()
        thread.join(WAIT)


def test_behind_a_proxy_at_a_sub_path_the_page_is_live_and_its_actions_work(
    valkey_url: str, name: str, make: Callable[..., RedisWorkQueue], context: BrowserContext
) -> None:
    q = make(rate_limiter=SLOW)
    q.retry("broken")
    with (
        running(valkey_url, name) as url,
        behind_a_proxy(url) as public,
        opened(context, public, DESKTOP) as shown,
    ):
        page = shown.page
        row(shown, name, "failing", "broken").get_by_role("button", name="Forget broken").click()
        page.locator("#confirm").get_by_role("button", name="Forget").click()
        shown.expect(page.locator("#message")).to_contain_text("failures cleared")
        shown.expect(row(shown, name, "failing", "broken")).to_have_count(0)
        shown.assert_clean()
    assert q.num_requeues("broken") == 0


def test_read_only_page_shows_the_keys_without_actions(
    valkey_url: str, name: str, make: Callable[..., RedisWorkQueue], context: BrowserContext
) -> None:
    busy_queue(make)
    with (
        running(valkey_url, name, args=("--read-only",)) as url,
        opened(context, url, DESKTOP) as shown,
    ):
        shown.expect(row(shown, name, "failing", "broken")).to_contain_text("failures 3")
        shown.expect(shown.page.locator("#mode")).to_have_text("read-only: no actions")
        shown.expect(shown.page.locator(".row button")).to_have_count(0)
        shown.assert_clean()


def test_phone_width_has_no_horizontal_scroll(
    valkey_url: str, name: str, make: Callable[..., RedisWorkQueue], context: BrowserContext
) -> None:
    busy_queue(make)
    make().add("a-key-with-a-rather-long-name/in-a-namespace/that-must-wrap-on-a-phone")
    with running(valkey_url, name) as url, opened(context, url, PHONE) as shown:
        page = shown.page
        shown.expect(row(shown, name, "processing", "held")).to_be_visible()
        assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
        # The rows are redrawn each second: measure every shown button at one instant.
        right = page.evaluate(
            "Math.max(...[...document.querySelectorAll('.row button')]"
            ".filter((b) => b.offsetParent).map((b) => b.getBoundingClientRect().right))"
        )
        assert 0 < right <= PHONE["width"]
        shown.assert_clean()


@pytest.mark.parametrize("name", ["default/pods"])  # the queue's name in the picture
def test_screenshot_of_the_dashboard_on_a_busy_queue(
    valkey_url: str,
    name: str,
    make: Callable[..., RedisWorkQueue],
    context: BrowserContext,
    tmp_path: Path,
) -> None:
    """The README's picture, 1440 wide, of a queue falling behind a producer:
    KEYQUEUE_UPDATE_SCREENSHOT=1 keeps it as docs/dashboard.png."""
    busy_queue(make)
    stop = threading.Event()
    producer, worker = make(), make(holder="worker-a")

    def produce() -> None:
        rng = random.Random(0)
        while not stop.is_set():
            producer.add_many([f"default/pod-{rng.randrange(3000)}" for _ in range(40)])
            time.sleep(0.1)

    def work() -> None:
        while not stop.is_set():
            try:
                key = worker.get(timeout=0.2)
            except Empty:
                continue
            time.sleep(0.004)
            worker.done(key)

    threads = [threading.Thread(target=produce), threading.Thread(target=work)]
    for thread in threads:
        thread.start()
    try:
        with (
            running(valkey_url, name) as url,
            opened(context, url, {"width": 1440, "height": 900}) as shown,
        ):
            page = shown.page
            shown.expect(page.locator(".chart.rates polyline.adds")).to_have_attribute(
                "points", re.compile(r"(\S+ ){5}"), timeout=WAIT * 1000
            )  # a few seconds of history
            shown.expect(page.locator(".verdict")).to_have_attribute(
                "data-state", "behind", timeout=WAIT * 3000
            )  # the trend read: 10 s of readings
            shot = tmp_path / "dashboard.png"
            page.screenshot(path=str(shot), full_page=True)
            shown.assert_clean()
    finally:
        stop.set()
        for thread in threads:
            thread.join(WAIT)
    png = shot.read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert int.from_bytes(png[16:20], "big") == 1440
    if os.environ.get("KEYQUEUE_UPDATE_SCREENSHOT") == "1":
        DOCS_SCREENSHOT.write_bytes(png)


# -- dead keys ---------------------------------------------------------------------------


def test_state_lists_the_dead_keys_and_replay_is_guarded_as_the_other_actions(
    valkey_url: str, name: str, make: Callable[..., RedisWorkQueue]
) -> None:
    q = make()
    q.add("alive")  # a queue exists once a client has used it
    q.give_up("gone", "permanent", ValueError("no such customer"))
    with running(valkey_url, name) as url:
        status, state = request(f"{url}api/state")
        assert status == 200
        (dead,) = state["queues"][0]["now"]["dead"]
        assert (dead["key"], dead["reason"], dead["error_type"]) == (
            "gone",
            "permanent",
            "ValueError",
        )
        assert dead["cells"][:3] == ["permanent", "ValueError: no such customer", "0"]
        assert state["columns"]["dead"] == ["reason", "error", "failures", "given up"]
        token = page_token(url)
        body = {"queue": name, "key": "gone"}
        good = {"Content-Type": "application/json", "X-Keyqueue-Token": token}
        status, answer = request(
            f"{url}api/replay", body, {**good, "Origin": "http://evil.example"}
        )
        assert status == 403
        assert "other sites' requests are refused" in answer["error"]
        status, _ = request(f"{url}api/replay", body, {"Content-Type": "application/json"})
        assert status == 403
        assert [d.key for d in q.dead()] == ["gone"]  # nothing above changed anything
        status, answer = request(f"{url}api/replay", body, good)
        assert (status, answer["ok"]) == (200, True)
        assert "replayed" in answer["message"]
        status, answer = request(f"{url}api/replay", body, good)
        assert status == 400
        assert "is not a dead key" in answer["error"]
    assert q.dead() == ()
    assert [q.get_nowait(), q.get_nowait()] == ["alive", "gone"]


def test_replay_on_the_dead_list_puts_the_key_back_waiting(
    valkey_url: str, name: str, make: Callable[..., RedisWorkQueue], context: BrowserContext
) -> None:
    q = make()
    q.add("alive")
    q.give_up("gone", "retries", TimeoutError("upstream timed out"))
    with running(valkey_url, name) as url, opened(context, url, DESKTOP) as shown:
        expect, page = shown.expect, shown.page
        dead = row(shown, name, "dead", "gone")
        expect(dead).to_contain_text("TimeoutError: upstream timed out")
        expect(dead.get_by_role("button", name="Retry now gone")).to_have_count(0)
        dead.get_by_role("button", name="Replay gone").click()
        expect(page.locator("#confirm-text")).to_contain_text('Replay "gone"')
        page.locator("#confirm").get_by_role("button", name="Replay").click()
        expect(page.locator("#message")).to_contain_text("replayed")
        expect(row(shown, name, "waiting", "gone")).to_be_visible(timeout=APPEAR * 1000)
        expect(dead).to_have_count(0)
        assert q.dead() == ()
        shown.assert_clean()

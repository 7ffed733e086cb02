"""``keyqueue lab web``: the instrument page, its API, its live queue, and a real Chromium.

The first half needs no browser: the JSON API against ``run_model`` and
``run_backoff`` (one implementation), the live queue's trace driven directly,
the server's lifecycle and the CLI. The second half drives the page in
Debian's Chromium through Playwright (fixtures in ``support/web_browser.py``); those
tests skip when the browser is missing, unless KEYQUEUE_REQUIRE_BROWSER=1.

Nothing races a timer: the live trace's held key waits for its Release click
(or ``release()``), and every wait is a bounded wait for a state to appear.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest
from click.testing import CliRunner

from keyqueue._console.format import count, counted, duration, number, numbered
from keyqueue._web.guard import refusal
from keyqueue._web.listen import url_for
from keyqueue.cli import keyqueue as keyqueue_cli
from keyqueue.lab.backoff.run import run_backoff
from keyqueue.lab.model.run import POISSON_WARNING, prediction, run_model
from keyqueue.lab.web.live import ABSENT, PENDING, PROCESSING, TIMES, WAITING, LiveLab
from keyqueue.lab.web.server import WebServer

pytest_plugins = ["tests.support.web_browser"]  # the browser, server and page fixtures

if TYPE_CHECKING:
    from tests.support.web_browser import LabPage

T = TypeVar("T")
WAIT = 10.0
"""Generous bound, in wall seconds, for a real loop or thread to get somewhere."""
DOCS_SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "lab-web.png"


def run_in_thread(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on a fresh thread (the main thread may be Playwright's)."""
    result: list[T] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            result.append(asyncio.run(coro))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(WAIT * 3)
    assert not thread.is_alive(), "the test's event loop did not finish"
    if errors:
        raise errors[0]
    return result[0]


def get(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=WAIT) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read())


def post(url: str, body: object) -> tuple[int, dict[str, Any]]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=WAIT) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read())


# -- the model's prediction in words (model.py, shared with the page) ----------------


@pytest.mark.parametrize(
    ("arrival", "service", "backlog", "t0", "words"),
    [
        (4, 3, 4, 0, "backlog 4+t"),
        (5, 3, 4, 0, "backlog 4+2t"),
        (5, 3, 7, 3, "backlog 7+2(t-3)"),
        (2, 3, 4, 0, "clears at t=4"),
        (2, 3, 2, 2, "clears at t=4"),
        (2, 4, 3, 0, "clears at t=1.5"),
        (3, 3, 4, 0, "backlog stays at 4"),
        (2, 3, 0, 0, "backlog stays at 0"),
    ],
)
def test_prediction_words_for_each_regime(
    arrival: float, service: float, backlog: float, t0: int, words: str
) -> None:
    assert prediction(run_model(arrival, service, backlog, steps=1), t0) == words


def test_prediction_rejects_a_negative_start() -> None:
    with pytest.raises(ValueError, match="t0 must be >= 0"):
        prediction(run_model(4, 3, 4, steps=1), -1)


# -- the JSON API ---------------------------------------------------------------------


@pytest.fixture
def api() -> Any:
    with WebServer("127.0.0.1", 0, reconcile=0.01) as running:
        yield running


@pytest.mark.parametrize(("arrival", "service", "backlog"), [(4, 3, 4), (2, 3, 4), (2.5, 3, 1)])
def test_model_api_stepped_from_the_page_equals_lab_model(
    api: WebServer, arrival: float, service: float, backlog: float
) -> None:
    expected = run_model(arrival, service, backlog, steps=8)
    t, level = 0, backlog
    seen = [level]
    for _ in range(8):
        status, data = get(
            f"{api.url}api/model?arrival={arrival}&service={service}&backlog={level}&t={t}"
        )
        assert status == 200
        t, level = data["next"]["t"], data["next"]["backlog"]
        seen.append(level)
    assert seen == [step.backlog for step in expected.steps]


def test_model_api_says_the_prediction_and_gives_mm1_only_below_capacity(api: WebServer) -> None:
    _, over = get(f"{api.url}api/model?arrival=4&service=3&backlog=4&t=0")
    assert over["prediction"] == "backlog 4+t"
    assert over["mm1"] is None
    _, under = get(f"{api.url}api/model?arrival=2&service=3&backlog=4&t=0")
    assert under["prediction"] == "clears at t=4"
    assert under["mm1"]["mean_in_system"] == 2
    assert under["mm1"]["mean_time_in_system"] == 1
    assert under["warnings"][0] == POISSON_WARNING


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("arrival=-1", "λ (arrival) must be >= 0, got -1"),
        ("arrival=x", "λ (arrival) must be a finite number, got 'x'"),
        ("service=nan", "μ (service) must be a finite number, got 'nan'"),
        ("service=0", "μ (service) must be > 0, got 0"),
        ("backlog=-2", "initial backlog must be >= 0, got -2"),
        ("backlog=inf", "backlog must be a finite number, got 'inf'"),
        ("t=-1", "t must be a whole number >= 0"),
        ("t=1.5", "t must be a whole number >= 0"),
    ],
)
def test_model_api_rejects_bad_input_naming_the_problem(
    api: WebServer, query: str, message: str
) -> None:
    status, data = get(f"{api.url}api/model?{query}")
    assert status == 400
    assert message in data["error"]


def test_backoff_api_is_lab_backoffs_computation(api: WebServer) -> None:
    status, data = get(f"{api.url}api/backoff?base_ms=5&cap=1000&herd=300")
    assert status == 200
    assert data == json.loads(json.dumps(run_backoff(0.005, 1000, None, 300).to_json()))


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("base_ms=0", "base (ms) must be > 0, got 0"),
        ("base_ms=5&cap=0.001", "cap (s) must be at least the base: got 0.001 s, under 5 ms"),
        ("herd=0", "herd (keys) must be a whole number from 1 to 10000"),
        ("herd=2.5", "herd (keys) must be a whole number"),
    ],
)
def test_backoff_api_rejects_bad_input(api: WebServer, query: str, message: str) -> None:
    status, data = get(f"{api.url}api/backoff?{query}")
    assert status == 400
    assert message in data["error"]


def test_page_and_static_files_come_from_the_package_with_a_self_only_policy(
    api: WebServer,
) -> None:
    for path, kind in [("", "text/html"), ("static/app.js", "text/javascript"),
                       ("static/app.css", "text/css")]:  # fmt: skip
        with urllib.request.urlopen(api.url + path, timeout=WAIT) as response:
            assert response.headers["Content-Type"].startswith(kind)
            assert "default-src 'self'" in response.headers["Content-Security-Policy"]
            body = response.read().decode().replace("http://www.w3.org/2000/svg", "")
        assert "http://" not in body  # (the SVG namespace is a name, not a fetch)
        assert "https://" not in body
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(api.url + "static/nope.js", timeout=WAIT)
    missing.value.close()
    assert missing.value.code == 404


@pytest.mark.parametrize(
    ("action", "body", "message"),
    [
        ("add", {}, "key must be a non-empty string"),
        ("add", {"key": "  "}, "key must be a non-empty string"),
        ("add", {"key": "k" * 101}, "key must be at most 100 characters"),
        ("burst", {"key": "k", "n": 0}, "burst size must be a whole number from 1 to 10000"),
        ("fail", {"key": "k", "n": "3"}, "failures must be a whole number"),
        ("release", {"key": "k"}, "key 'k' is not held"),
        ("config", {"workers": 0}, "workers must be a whole number from 1 to 16"),
        ("config", {"reconcile_ms": 1.5}, "reconcile time (ms) must be a whole number"),
        ("add", b"not json", "the request body must be a JSON object"),
        ("add", ["k"], "the request body must be a JSON object"),
    ],
)
def test_live_api_rejects_bad_input_and_changes_nothing(
    api: WebServer, action: str, body: object, message: str
) -> None:
    _, before = get(f"{api.url}api/live")
    status, data = post(f"{api.url}api/live/{action}", body)
    assert status == 400
    assert message in data["error"]
    _, after = get(f"{api.url}api/live")
    assert after["rev"] == before["rev"]
    assert after["keys"] == before["keys"] == []


# -- other sites: a foreign Host (DNS rebinding), a foreign Origin, a non-JSON body ---------


def send(
    server: WebServer, method: str, path: str, body: bytes = b"", **headers: str
) -> tuple[int, dict[str, Any]]:
    """One request with exactly these headers (``Host`` included: http.client adds none)."""
    headers.setdefault("Host", f"127.0.0.1:{server.port}")
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=WAIT)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for name, value in {**headers, "Content-Length": str(len(body))}.items():
            conn.putheader(name.replace("_", "-"), value)
        conn.endheaders(body)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


@pytest.mark.parametrize("path", ["/api/live", "/api/model", "/api/backoff?herd=10"])
@pytest.mark.parametrize(
    "host", ["attacker.example", "attacker.example:{port}", "127.0.0.1.nip.io:{port}"]
)
def test_a_foreign_host_is_refused_even_for_reading(api: WebServer, path: str, host: str) -> None:
    status, data = send(api, "GET", path, Host=host.format(port=api.port))
    assert status == 421
    assert data["error"].startswith(f"Host {host.format(port=api.port)!r} is not this server")
    assert "\n" not in data["error"]


def test_its_own_address_and_the_loopback_names_with_its_port_are_served(api: WebServer) -> None:
    port = api.port
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LocalHost:{port}", f"[::1]:{port}"):
        assert send(api, "GET", "/api/live", Host=host)[0] == 200, host
    other = 1 if port != 1 else 2
    for host in (f"127.0.0.1:{other}", f"localhost:{other}", "localhost", "127.0.0.1", ""):
        assert send(api, "GET", "/api/live", Host=host)[0] == 421, host


@pytest.mark.parametrize(
    ("action", "body"), [("burst", b'{"key": "k", "n": 100}'), ("config", b'{"workers": 16}')]
)
def test_a_cross_site_text_plain_post_is_refused_and_changes_nothing(
    api: WebServer, action: str, body: bytes
) -> None:
    _, before = get(f"{api.url}api/live")
    status, data = send(
        api,
        "POST",
        f"/api/live/{action}",
        body,
        Origin="http://attacker.example",
        Content_Type="text/plain;charset=UTF-8",
    )
    assert status == 403
    assert data["error"].startswith("Origin 'http://attacker.example' is not this server's own")
    _, after = get(f"{api.url}api/live")
    assert (after["rev"], after["workers"], after["keys"]) == (before["rev"], 2, [])


def test_a_state_changing_request_needs_the_pages_own_origin(api: WebServer) -> None:
    port = api.port
    other = 1 if port != 1 else 2
    body = b'{"key": "k"}'
    for origin in ("null", f"http://localhost:{other}", f"https://127.0.0.1:{port}",
                   f"http://127.0.0.1:{port}/path", "http://attacker.example"):  # fmt: skip
        status, _ = send(
            api, "POST", "/api/live/hold", body, Origin=origin, Content_Type="application/json"
        )
        assert status == 403, origin
    assert get(f"{api.url}api/live")[1]["keys"] == []
    for origin in (f"http://127.0.0.1:{port}", f"http://localhost:{port}"):
        status, _ = send(
            api, "POST", "/api/live/hold", body, Origin=origin, Content_Type="application/json"
        )
        assert status == 200, origin
    assert get(f"{api.url}api/live")[1]["keys"][0]["hold_next"] is True


@pytest.mark.parametrize(
    "content_type", [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]
)
def test_a_json_body_needs_the_json_content_type(api: WebServer, content_type: str | None) -> None:
    headers = {} if content_type is None else {"Content_Type": content_type}
    status, data = send(api, "POST", "/api/live/add", b'{"key": "k"}', **headers)
    assert status == 415
    assert data["error"] == (
        "the request body must be JSON with Content-Type: application/json, got "
        + ("none" if content_type is None else repr(content_type))
    )
    assert get(f"{api.url}api/live")[1]["keys"] == []
    ok = send(api, "POST", "/api/live/add", b'{"key": "k"}',
              Content_Type="application/json; charset=utf-8")  # fmt: skip
    assert ok == (200, {"ok": True})


@pytest.mark.parametrize(
    ("host", "origin", "local", "names", "status"),
    [
        ("127.0.0.1:8765", None, ("127.0.0.1", 8765), (), None),
        ("localhost:8765", "http://LOCALHOST:8765", ("127.0.0.1", 8765), (), None),
        ("[::1]:8765", "http://127.0.0.1:8765", ("::1", 8765), (), None),
        ("127.0.0.1:8765", None, ("::ffff:127.0.0.1", 8765), (), None),  # dual-stack socket
        ("192.168.1.5:8765", None, ("192.168.1.5", 8765), (), None),  # bound to 0.0.0.0
        ("0.0.0.0:8765", None, ("127.0.0.1", 8765), ("0.0.0.0",), None),  # the printed URL
        ("box.lan:8765", None, ("192.168.1.5", 8765), ("Box.LAN",), None),  # --host box.lan
        ("localhost", None, ("127.0.0.1", 80), (), None),  # the default port, left out
        (None, None, ("127.0.0.1", 8765), (), None),  # HTTP/1.0: no browser sends none
        ("box.lan:8765", None, ("192.168.1.5", 8765), (), 421),
        ("attacker.example:8765", None, ("127.0.0.1", 8765), (), 421),
        ("localhost:8766", None, ("127.0.0.1", 8765), (), 421),
        ("localhost:", None, ("127.0.0.1", 8765), (), 421),
        ("::1:8765", None, ("::1", 8765), (), 421),  # an IPv6 address needs brackets
        ("[::1]x", None, ("::1", 8765), (), 421),
        ("[localhost]:8765", None, ("127.0.0.1", 8765), (), 421),
        ("localhost:87a5", None, ("127.0.0.1", 8765), (), 421),
        ("localhost:8765:8765", None, ("127.0.0.1", 8765), (), 421),
        ("127.1:8765", None, ("127.0.0.1", 8765), (), 421),
        ("", None, ("127.0.0.1", 8765), (), 421),
        ("localhost:8765", "null", ("127.0.0.1", 8765), (), 403),
        ("localhost:8765", "http://localhost:8766", ("127.0.0.1", 8765), (), 403),
        ("localhost:8765", "https://localhost:8765", ("127.0.0.1", 8765), (), 403),
        ("localhost:8765", "http://attacker.example", ("127.0.0.1", 8765), (), 403),
        ("localhost:8765", "http://localhost:8765/", ("127.0.0.1", 8765), (), 403),
        ("localhost:8765", "localhost:8765", ("127.0.0.1", 8765), (), 403),
    ],
)
def test_guard_serves_only_its_own_host_and_origin(
    host: str | None,
    origin: str | None,
    local: tuple[str, int],
    names: tuple[str, ...],
    status: int | None,
) -> None:
    refused = refusal(host, origin, local, names)
    assert (refused and refused.status) == status
    if refused is not None:
        assert "\n" not in refused.message
        assert repr(host if status == 421 else origin) in refused.message


# -- the live queue, driven directly ----------------------------------------------------


async def until(lab: LiveLab, ok: Callable[[], bool]) -> None:
    """Wait (bounded) until ``ok()``, checking after each change of the lab."""
    deadline = time.monotonic() + WAIT
    while not ok():
        left = deadline - time.monotonic()
        assert left > 0, "the live lab did not get there"
        await lab.wait_change(lab.rev, left)


def state(lab: LiveLab, key: str) -> str:
    return next(row["state"] for row in lab.snapshot()["keys"] if row["key"] == key)


def lines(lab: LiveLab, key: str) -> list[str]:
    return [line["text"] for line in lab.snapshot()["lines"] if line["key"] == key]


def test_live_trace_of_a_key_added_while_held() -> None:
    async def scenario() -> tuple[list[str], list[str], dict[str, Any]]:
        lab = LiveLab(workers=2, reconcile=0.01)
        lab.start()
        states = []
        try:
            lab.hold("default/web")
            lab.add("default/web")
            await until(lab, lambda: lab.snapshot()["keys"][0]["held"])
            states.append(state(lab, "default/web"))
            lab.add("default/web")
            states.append(state(lab, "default/web"))
            lab.burst("default/web", 3)
            lab.release("default/web")
            await until(lab, lambda: lab.queue.stats().dones == 2)
            states.append(state(lab, "default/web"))
            return states, lines(lab, "default/web"), lab.snapshot()["counters"]
        finally:
            await lab.close()

    states, texts, counters = run_in_thread(scenario())
    assert states == [PROCESSING, PENDING, ABSENT]
    held_by = re.match(r"\[(WORKER-\d)\]", texts[1])
    assert held_by is not None
    worker = held_by.group(1)
    assert texts[:6] == [
        "[ENQUEUE] key=default/web",
        f"[{worker}] key=default/web Get seq=1",
        f"[REQUEUE-WHILE-PROCESSING] key=default/web (held by {worker}: one more Get after Done)",
        f"[COALESCED] key=default/web (held by {worker}, redelivery already pending) {TIMES}3",
        f"[{worker}] key=default/web Done seq=1 result=OK → Forget",
        "[REDELIVERY] key=default/web (changed while held: queued once)",
    ]
    assert re.fullmatch(r"\[WORKER-\d\] key=default/web Get seq=2", texts[6])
    assert re.fullmatch(r"\[WORKER-\d\] key=default/web Done seq=2 result=OK → Forget", texts[7])
    assert len(texts) == 8
    assert counters["redeliveries"] == 1
    assert counters["coalesced"] == 3
    assert counters["marked_while_processing"] == 1


def test_live_trace_of_a_failing_key_backs_off_then_succeeds() -> None:
    async def scenario() -> list[str]:
        lab = LiveLab(workers=1, reconcile=0)
        lab.start()
        try:
            lab.fail("default/db", 1)
            lab.add("default/db")
            await until(lab, lambda: lab.queue.stats().dones == 2)
            return lines(lab, "default/db")
        finally:
            await lab.close()

    assert run_in_thread(scenario()) == [
        "[ENQUEUE] key=default/db",
        "[WORKER-1] key=default/db Get seq=1",
        "[WORKER-1] key=default/db Done seq=1 result=ERROR → Retry",
        "[RATELIMIT] key=default/db attempt=1 backoff=250ms",
        "[ENQUEUE] key=default/db",
        "[WORKER-1] key=default/db Get seq=2",
        "[WORKER-1] key=default/db Done seq=2 result=OK → Forget",
    ]


def test_live_waiting_keys_form_the_fifo_and_coalesce() -> None:
    async def scenario() -> tuple[list[str], str, list[str]]:
        lab = LiveLab(workers=1, reconcile=0)
        lab.start()
        try:
            lab.hold("a")
            lab.add("a")
            await until(lab, lambda: lab.snapshot()["keys"][0]["held"])
            lab.add("b")
            lab.add("c")
            lab.burst("b", 2)
            fifo = lab.snapshot()["fifo"]
            b_state = state(lab, "b")
            b_lines = lines(lab, "b")
            lab.release("a")
            await until(lab, lambda: lab.queue.stats().dones == 3)
            return fifo, b_state, b_lines
        finally:
            await lab.close()

    fifo, b_state, b_lines = run_in_thread(scenario())
    assert fifo == ["b", "c"]
    assert b_state == WAITING
    assert b_lines == ["[ENQUEUE] key=b", f"[COALESCED] key=b (already waiting) {TIMES}2"]


def test_live_worker_count_changes_while_a_key_is_held() -> None:
    async def scenario() -> tuple[int, list[str]]:
        lab = LiveLab(workers=3, reconcile=0)
        lab.start()
        try:
            lab.hold("k")
            lab.add("k")
            await until(lab, lambda: lab.snapshot()["keys"][0]["held"])
            lab.configure(workers=1, reconcile_ms=5)
            lab.release("k")
            await until(lab, lambda: lab.queue.stats().dones == 1)
            for key in ("x", "y"):
                lab.add(key)
            await until(lab, lambda: lab.queue.stats().dones == 3)
            return lab.snapshot()["workers"], lines(lab, "x") + lines(lab, "y")
        finally:
            await lab.close()

    workers, texts = run_in_thread(scenario())
    assert workers == 1
    assert [t for t in texts if "Get" in t] == [
        "[WORKER-1] key=x Get seq=2",
        "[WORKER-1] key=y Get seq=3",
    ]


def test_live_bad_input_raises_and_changes_nothing() -> None:
    async def scenario() -> None:
        lab = LiveLab()
        lab.start()
        try:
            rev, reconcile = lab.rev, lab.reconcile
            with pytest.raises(ValueError, match="workers must be a whole number"):
                lab.configure(workers=True, reconcile_ms=5)
            with pytest.raises(ValueError, match="key must be a non-empty string"):
                lab.burst(7, 3)
            assert (lab.rev, lab.reconcile, lab.snapshot()["keys"]) == (rev, reconcile, [])
        finally:
            await lab.close()

    run_in_thread(scenario())
    with pytest.raises(ValueError, match="reconcile must be 0 to 60 seconds"):
        LiveLab.check_options(2, -1)


# -- the server's lifecycle and the CLI ------------------------------------------------------


def test_url_for_brackets_ipv6() -> None:
    assert url_for("127.0.0.1", 8765) == "http://127.0.0.1:8765/"
    assert url_for("::1", 80) == "http://[::1]:80/"


def test_server_stops_with_an_open_event_stream_and_on_an_exception() -> None:
    server = WebServer("127.0.0.1", 0)

    def serve_then_fail() -> None:
        with server, urllib.request.urlopen(server.url + "api/live/events", timeout=WAIT) as s:
            assert s.readline().startswith(b"data: ")
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        serve_then_fail()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", server.port), timeout=WAIT).close()


def test_cli_web_reports_a_port_in_use_in_one_line() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = CliRunner().invoke(
            keyqueue_cli, ["lab", "web", "--no-open", "--port", str(port)], prog_name="keyqueue"
        )
    assert result.exit_code == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.output
    assert "Traceback" not in result.output


# As a background job of a shell without job control starts: SIGINT ignored, through exec.
_SIGINT_IGNORED = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


@pytest.mark.parametrize("started", ["as-is", "sigint-ignored"])
def test_cli_web_serves_until_ctrl_c(started: str) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    python = [sys.executable] + (["-c", _SIGINT_IGNORED] if started == "sigint-ignored" else [])
    proc = subprocess.Popen(
        [*python, "-m", "keyqueue", "lab", "web", "--no-open", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            assert sel.select(WAIT * 2), "keyqueue lab web printed nothing"
        first = proc.stdout.readline()
        match = re.search(r"serving on (http://127\.0\.0\.1:\d+/) \(Ctrl-C to stop\)", first)
        assert match, first
        with urllib.request.urlopen(match.group(1), timeout=WAIT) as response:
            assert b"keyqueue lab" in response.read()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err  # Ctrl-C: 130, as every subcommand
    assert "stopped" in out
    assert "Traceback" not in err


# -- in the browser ----------------------------------------------------------------------


@pytest.mark.parametrize(("required", "outcome"), [("", "1 skipped"), ("1", "1 error")])
def test_a_missing_browser_skips_naming_the_apt_command_unless_required(
    required: str, outcome: str
) -> None:
    env = {
        **os.environ,
        "KEYQUEUE_CHROMIUM": "/nonexistent/chromium",
        "KEYQUEUE_REQUIRE_BROWSER": required,
    }
    test = f"{__file__}::test_desktop_layout_has_no_horizontal_overflow"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
        capture_output=True,
        text=True,
        timeout=WAIT * 6,
        env=env,
        cwd=Path(__file__).resolve().parents[2],
        check=False,
    )
    assert outcome in proc.stdout, proc.stdout
    assert "no Chromium at /nonexistent/chromium" in proc.stdout
    assert "apt-get update && apt-get install -y chromium" in proc.stdout


def test_overloaded_model_after_reset_and_three_steps_has_backlog_7(lab: LabPage) -> None:
    expect, page = lab.expect, lab.page
    page.get_by_label("λ", exact=True).fill("4")
    page.get_by_label("μ", exact=True).fill("3")
    page.get_by_label("Initial backlog", exact=True).fill("4")
    page.get_by_role("button", name="Reset", exact=True).click()
    expect(page.get_by_test_id("prediction")).to_have_text("backlog 4+t")
    step = page.get_by_role("button", name="Step", exact=True)
    for _ in range(3):
        step.click()
    expect(page.get_by_test_id("t")).to_have_text("3")
    expect(page.get_by_test_id("backlog")).to_have_text("7")
    expect(page.get_by_role("img", name="Backlog over t: 7 at t=3")).to_be_visible()
    expect(page.get_by_test_id("utilisation")).to_have_text("133%")  # as lab model says it
    expect(page.get_by_test_id("mm1")).to_be_hidden()  # rho > 1: no steady state
    lab.assert_clean()


def test_underloaded_model_plays_until_the_backlog_clears_at_t_4(lab: LabPage) -> None:
    expect, page = lab.expect, lab.page
    page.get_by_label("λ", exact=True).fill("2")
    page.get_by_label("μ", exact=True).fill("3")
    page.get_by_role("button", name="Reset", exact=True).click()
    expect(page.get_by_test_id("prediction")).to_have_text("clears at t=4")
    mm1 = page.get_by_test_id("mm1")
    expect(mm1).to_be_visible()
    expect(page.locator("#mm1-rho")).to_have_text("67%")
    expect(page.locator("#mm1-l")).to_have_text("2 keys")
    expect(page.locator("#mm1-w")).to_have_text("1 step")
    expect(page.locator("#mm1 .caveat")).to_have_text(POISSON_WARNING)  # said once
    page.get_by_role("button", name="Play", exact=True).click()
    expect(page.get_by_role("button", name="Pause", exact=True)).to_be_visible()
    expect(page.get_by_role("button", name="Step", exact=True)).to_be_disabled()
    # Play pauses by itself when the backlog clears.
    expect(page.get_by_role("button", name="Play", exact=True)).to_be_visible()
    expect(page.get_by_test_id("backlog")).to_have_text("0")
    expect(page.get_by_test_id("t")).to_have_text("4")
    expect(page.get_by_role("img", name="Backlog over t: 0 at t=4")).to_be_visible()
    lab.assert_clean()


def test_model_bad_input_is_shown_and_changes_nothing(lab: LabPage) -> None:
    expect, page = lab.expect, lab.page
    page.get_by_role("button", name="Step", exact=True).click()
    expect(page.get_by_test_id("t")).to_have_text("1")
    expect(page.get_by_test_id("prediction")).to_have_text("backlog 4+t")
    page.get_by_label("μ", exact=True).fill("0")
    page.get_by_role("button", name="Step", exact=True).click()
    expect(page.get_by_role("alert").filter(has_text="μ")).to_have_text(
        "μ (service) must be > 0, got 0"  # the field the page shows, not a parameter
    )
    expect(page.get_by_test_id("t")).to_have_text("1")
    expect(page.get_by_test_id("backlog")).to_have_text("5")
    # No prediction from the last valid input is left standing beside the error.
    expect(page.get_by_test_id("prediction")).to_have_text("none until the input is fixed")
    expect(page.get_by_test_id("utilisation")).to_have_text("\u2013")  # an en dash: no value
    expect(page.get_by_test_id("mm1")).to_be_hidden()
    # The browser reports each 400 on the console; nothing else may appear there.
    assert lab.console_errors
    assert all("status of 400" in error for error in lab.console_errors), lab.console_errors
    assert lab.foreign_requests == []


def test_adding_a_held_key_shows_pending_and_one_redelivery_after_done(lab: LabPage) -> None:
    expect, page = lab.expect, lab.page
    key = "default/web"
    page.get_by_label("Key", exact=True).fill(key)
    page.get_by_role("button", name="Hold", exact=True).click()
    page.get_by_role("button", name="Add", exact=True).click()
    row = page.locator(f'#keys tr[data-key="{key}"]')
    release = page.get_by_role("button", name=f"Release {key}", exact=True)
    expect(release).to_be_visible()  # a worker holds the key until we click
    expect(row).to_have_attribute("data-state", "processing")

    page.get_by_role("button", name="Add", exact=True).click()
    expect(row).to_have_attribute("data-state", "processing + pending")
    expect(row.get_by_text("processing + pending", exact=True)).to_be_visible()
    page.get_by_role("button", name="Add", exact=True).click()
    log = page.locator(f'#log li[data-key="{key}"]')
    expect(log.filter(has_text="[COALESCED]")).to_have_count(1)

    release.click()
    expect(row).to_have_attribute("data-state", "absent")
    expect(log).to_have_count(8)
    texts = [re.sub(r"WORKER-\d", "WORKER-n", t) for t in log.locator(".text").all_inner_texts()]
    assert texts == [
        f"[ENQUEUE] key={key}",
        f"[WORKER-n] key={key} Get seq=1",
        f"[REQUEUE-WHILE-PROCESSING] key={key} (held by WORKER-n: one more Get after Done)",
        f"[COALESCED] key={key} (held by WORKER-n, redelivery already pending)",
        f"[WORKER-n] key={key} Done seq=1 result=OK → Forget",
        f"[REDELIVERY] key={key} (changed while held: queued once)",
        f"[WORKER-n] key={key} Get seq=2",
        f"[WORKER-n] key={key} Done seq=2 result=OK → Forget",
    ]
    expect(page.get_by_test_id("redeliveries")).to_have_text("1")
    expect(page.get_by_test_id("marked")).to_have_text("1")
    expect(page.get_by_test_id("coalesced")).to_have_text("1")
    expect(page.get_by_test_id("adds")).to_have_text("3")
    lab.assert_clean()


def test_live_controls_burst_fail_and_configure_the_server_queue(lab: LabPage) -> None:
    expect, page = lab.expect, lab.page
    page.get_by_label("Workers", exact=True).fill("3")
    page.get_by_label("Reconcile (ms)", exact=True).fill("0")
    page.get_by_label("Key", exact=True).fill("default/db")
    page.get_by_label("Failures", exact=True).fill("1")
    page.get_by_role("button", name="Fail", exact=True).click()
    page.get_by_label("Burst size", exact=True).fill("5")
    page.get_by_role("button", name="Burst", exact=True).click()
    log = page.locator('#log li[data-key="default/db"]')
    expect(log.filter(has_text="[RATELIMIT] key=default/db attempt=1 backoff=250ms")).to_have_count(
        1
    )
    expect(log.filter(has_text="result=OK")).to_have_count(1)
    expect(page.get_by_test_id("adds")).not_to_have_text("0")
    _, snapshot = get(lab.url + "api/live")
    assert (snapshot["workers"], snapshot["reconcile_ms"]) == (3, 0)
    lab.assert_clean()


def test_desktop_layout_has_no_horizontal_overflow(lab: LabPage) -> None:
    page = lab.page
    assert page.viewport_size == {"width": 1280, "height": 800}
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    model = page.locator("#model").bounding_box()
    backoff = page.locator("#backoff").bounding_box()
    assert model is not None
    assert backoff is not None
    assert model["y"] == backoff["y"]  # side by side
    assert model["x"] + model["width"] <= backoff["x"]
    lab.assert_clean()


def test_phone_width_has_no_horizontal_overflow_and_controls_stay_usable(
    phone_lab: LabPage,
) -> None:
    expect, page = phone_lab.expect, phone_lab.page
    assert page.viewport_size == {"width": 390, "height": 844}
    key = "default/" + "x" * 90
    page.get_by_label("Key", exact=True).fill(key)
    page.get_by_role("button", name="Hold", exact=True).click()
    page.get_by_role("button", name="Add", exact=True).click()
    expect(page.get_by_role("button", name=f"Release {key}")).to_be_visible()
    page.get_by_role("button", name="Step", exact=True).click()
    expect(page.get_by_test_id("t")).to_have_text("1")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    for name in ("Reset", "Step", "Play", "Add", "Hold", "Burst", "Fail", f"Release {key}"):
        box = page.get_by_role("button", name=name, exact=True).bounding_box()
        assert box is not None
        assert box["x"] >= 0
        assert box["x"] + box["width"] <= 390
    phone_lab.assert_clean()


WIDE = {"width": 1440, "height": 900}

# The words of each table header that the browser broke across lines (none, if each
# header wraps only between words): a word on one line is one client rect.
BROKEN_HEADER_WORDS = """() => [...document.querySelectorAll("th")].flatMap((th) => {
  const text = th.firstChild;
  if (!text || text.nodeType !== Node.TEXT_NODE || th.getClientRects().length === 0) return [];
  return [...text.data.matchAll(/\\S+/g)].filter((m) => {
    const range = document.createRange();
    range.setStart(text, m.index);
    range.setEnd(text, m.index + m[0].length);
    return range.getClientRects().length > 1;
  }).map((m) => m[0]);
})"""

# Each chart label's rendered height and whether it lies inside its chart.
CHART_LABELS = """() => [...document.querySelectorAll("svg.chart text")].map((t) => {
  const r = t.getBoundingClientRect(), c = t.ownerSVGElement.getBoundingClientRect();
  return {text: t.textContent, height: r.height,
          inside: r.left >= c.left - 0.5 && r.right <= c.right + 0.5};
})"""

LOG_PLACEHOLDER = "getComputedStyle(document.getElementById('log'), '::after').content"


def test_at_1440x900_the_live_trace_and_its_log_are_above_the_fold(lab: LabPage) -> None:
    expect, page = lab.expect, lab.page
    page.set_viewport_size(WIDE)  # type: ignore[arg-type]
    assert page.evaluate("document.documentElement.scrollWidth") <= WIDE["width"]
    live = page.locator("#live").bounding_box()
    log = page.get_by_test_id("log").bounding_box()
    assert live is not None
    assert log is not None
    assert live["y"] < 200  # the first panel
    assert log["y"] >= 0
    assert log["y"] + log["height"] <= WIDE["height"]  # the whole log, not only its top
    # Every tab shares the server's one queue, and the page says so.
    expect(page.get_by_test_id("shared")).to_contain_text("every open tab")
    # Before the first event the log says what will appear there, not a bare bar.
    assert "No events yet" in page.evaluate(LOG_PLACEHOLDER)
    page.get_by_role("button", name="Add", exact=True).click()
    expect(page.locator("#log li").first).to_be_visible()
    assert page.evaluate(LOG_PLACEHOLDER) == "none"
    lab.assert_clean()


# Numbers that show each rule: ties to even (0.125, 2.5, 90.5 s), thousands, no exponent
# (1e-7, 1e12), rounding up a digit (999,999.7, 59.9996 s), negatives, hours.
FORMATTED = [0.0, -0.0, 1, 2.5, 0.125, 0.5, 1.5, 7.45, 4 / 3, 2 / 3, 0.1 + 0.2, 12_345,
             12_345.6, 999_999.7, 1e12, 1e-7, 0.00045, 0.0125, -1.5, -0.004, 59.9996, 90.5,
             119.6, 3_600, 7_322.5, 1e8 + 0.5, 123_456_789.123, 1.125, 1.0625, 10.125,
             1_234.5]  # fmt: skip
FORMATTED += [1.2345678 * 10.0**e for e in range(-9, 13)] + [x / 8 for x in range(0, 5000, 37)]


def test_format_js_writes_numbers_and_durations_as_the_commands_do(lab: LabPage) -> None:
    """The pages' format.js against keyqueue._console.format, which top and the lab print with."""
    got = lab.page.evaluate(
        """async (xs) => {
            const f = await import("/static/format.js");
            return xs.map((x) => [f.number(x, 3), f.number(x, 4), f.number(x), f.count(x),
                                  f.counted(x, "key"), f.numbered(x, "step", "steps", 4),
                                  f.duration(x)]);
        }""",
        FORMATTED,
    )
    want = [
        [number(x, 3), number(x, 4), number(x), count(x), counted(x, "key"),
         numbered(x, "step", digits=4), duration(x)]
        for x in FORMATTED
    ]  # fmt: skip
    assert got == want
    lab.assert_clean()


def test_backoff_bad_input_names_the_field_and_shows_no_stale_table(lab: LabPage) -> None:
    expect, page = lab.expect, lab.page
    page.get_by_label("Base (ms)", exact=True).fill("0")
    alert = page.locator("#backoff-error")
    expect(alert).to_have_text("base (ms) must be > 0, got 0")
    expect(page.locator("#backoff-table")).to_be_hidden()
    expect(page.get_by_test_id("herd-summary")).to_be_hidden()
    page.get_by_label("Base (ms)", exact=True).fill("5")
    expect(alert).to_be_hidden()
    expect(page.locator("#backoff-table tbody tr").first).to_have_text("15ms5ms")
    assert all("status of 400" in error for error in lab.console_errors), lab.console_errors
    assert lab.foreign_requests == []


def test_phone_headers_wrap_between_words_and_chart_labels_stay_readable(
    phone_lab: LabPage,
) -> None:
    page = phone_lab.page
    assert page.evaluate(BROKEN_HEADER_WORDS) == []
    labels = page.evaluate(CHART_LABELS)
    assert {label["text"] for label in labels} >= {"backlog", "0", "0s"}
    for label in labels:
        assert label["height"] >= 11, label  # 12px text, as on a desktop
        assert label["inside"], label
    phone_lab.assert_clean()


def test_screenshot_of_the_lab_in_use(lab: LabPage, tmp_path: Path) -> None:
    """The README's picture, 1440 wide: KEYQUEUE_UPDATE_SCREENSHOT=1 (make screenshot) keeps it."""
    expect, page = lab.expect, lab.page
    page.set_viewport_size(WIDE)  # type: ignore[arg-type]
    page.get_by_role("button", name="Reset", exact=True).click()
    for _ in range(3):
        page.get_by_role("button", name="Step", exact=True).click()
    expect(page.get_by_test_id("t")).to_have_text("3")
    page.get_by_label("Key", exact=True).fill("default/api")
    page.get_by_label("Burst size", exact=True).fill("20")
    page.get_by_role("button", name="Burst", exact=True).click()
    page.get_by_label("Key", exact=True).fill("default/web")
    page.get_by_role("button", name="Hold", exact=True).click()
    for _ in range(4):
        page.get_by_role("button", name="Add", exact=True).click()
    expect(page.locator('#keys tr[data-key="default/web"]')).to_have_attribute(
        "data-state", "processing + pending"
    )
    expect(
        page.locator('#log li[data-key="default/web"]').filter(has_text=f"{TIMES}2")
    ).to_have_count(1)
    shot = tmp_path / "lab-web.png"
    page.screenshot(path=str(shot), full_page=True)
    png = shot.read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    width = int.from_bytes(png[16:20], "big")
    assert width == WIDE["width"]
    if os.environ.get("KEYQUEUE_UPDATE_SCREENSHOT") == "1":
        DOCS_SCREENSHOT.write_bytes(png)
    lab.assert_clean()


def test_cli_web_json_prints_one_document_and_ctrl_c_exits_130() -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "keyqueue", "lab", "web", "--no-open", "--port", "0", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            assert sel.select(WAIT * 2), "keyqueue lab web --json printed nothing"
        doc = json.loads(proc.stdout.readline())
        assert doc["url"] == f"http://127.0.0.1:{doc['port']}/"
        assert doc["host"] == "127.0.0.1"
        with urllib.request.urlopen(doc["url"], timeout=WAIT) as response:
            assert b"keyqueue lab" in response.read()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert out == ""  # one document, and nothing else
    assert "Traceback" not in err


def test_cli_web_plain_is_accepted_as_on_every_subcommand() -> None:
    result = CliRunner().invoke(keyqueue_cli, ["lab", "web", "--help"], prog_name="keyqueue")
    assert "--plain" in result.output
    assert "--json" in result.output


def test_cli_web_a_host_that_does_not_resolve_is_a_usage_error_about_the_host() -> None:
    result = CliRunner().invoke(
        keyqueue_cli,
        ["lab", "web", "--no-open", "--host", "nosuchhost.invalid", "--port", "0"],
        prog_name="keyqueue",
    )
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("keyqueue lab web: error: Invalid value for '--host': cannot resolve")
    assert "--port" not in line

"""Fixtures for tests/lab/test_web.py: the lab's web server and one headless Chromium.

Chromium is Debian's (``apt-get install chromium``), driven by Playwright's
Python package through ``executable_path`` (Playwright cannot download its own
browsers here). Without Chromium or Playwright the browser tests skip, saying
how to install them; with ``KEYQUEUE_REQUIRE_BROWSER=1`` (set by ``.ci/run``)
they fail instead, so CI cannot pass without having run them.

One browser and one browser context for the module (every browser test is in
lab/test_web.py); a fresh server on a free loopback port and a new page for each test.
The browser is module-scoped rather than session-scoped on purpose: while
Playwright's sync API is running, ``asyncio.run`` cannot be called on the main
thread, which the suite's ``async def`` tests need.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

from keyqueue.lab.web.server import WebServer

if TYPE_CHECKING:
    from playwright.sync_api import Browser, BrowserContext, Page

CHROMIUM = os.environ.get("KEYQUEUE_CHROMIUM", "/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
INSTALL = "apt-get update && apt-get install -y chromium"
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
TEST_RECONCILE = 0.05
"""Seconds each simulated reconcile takes on the test server (the CLI's default is 0.8)."""


def browser_required() -> bool:
    return os.environ.get("KEYQUEUE_REQUIRE_BROWSER", "") not in ("", "0")


def _unavailable(reason: str) -> None:
    message = (
        f"{reason}; install it with `{INSTALL}` "
        "(KEYQUEUE_REQUIRE_BROWSER=1 turns this skip into a failure)"
    )
    if browser_required():
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One headless Chromium, closed when the module's tests are done."""
    try:
        from playwright.sync_api import expect, sync_playwright  # noqa: PLC0415 (optional)
    except ImportError:
        _unavailable("the playwright package is missing (pip install -e '.[test]')")
        raise  # not reached: _unavailable skips or fails
    if not os.access(CHROMIUM, os.X_OK):
        _unavailable(f"no Chromium at {CHROMIUM}")
    expect.set_options(timeout=10_000)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def server() -> Iterator[WebServer]:
    """The lab's app on a free loopback port, stopped on every exit path."""
    with WebServer("127.0.0.1", 0, reconcile=TEST_RECONCILE) as running:
        yield running


@dataclass
class LabPage:
    """A page showing the lab, and what it said on the console and fetched."""

    page: Page
    url: str
    expect: Callable[..., Any]
    """Playwright's ``expect`` (imported here, so lab/test_web.py imports without Playwright)."""
    console_errors: list[str] = field(default_factory=list)
    foreign_requests: list[str] = field(default_factory=list)

    def assert_clean(self) -> None:
        """No console errors or uncaught exceptions; nothing loaded from elsewhere."""
        assert self.console_errors == []
        assert self.foreign_requests == []


@pytest.fixture(scope="module")
def context(browser: Browser) -> Iterator[BrowserContext]:
    """One browser context for the module: each test opens its own page on its own server
    (a fresh origin: a new port), which is cheaper than a context per test."""
    context = browser.new_context()
    try:
        yield context
    finally:
        context.close()


def open_lab(
    context: BrowserContext, server: WebServer, viewport: dict[str, int]
) -> Iterator[LabPage]:
    """Open the lab in a new page; wait until the model is drawn and the trace is live."""
    from playwright.sync_api import expect  # noqa: PLC0415 (optional: see ``browser``)

    page = context.new_page()
    try:
        page.set_viewport_size(viewport)  # type: ignore[arg-type]
        lab = LabPage(page, server.url, expect)

        def on_console(message: Any) -> None:
            if message.type == "error":
                lab.console_errors.append(message.text)

        def on_request(request: Any) -> None:
            if not request.url.startswith((server.url, "data:")):
                lab.foreign_requests.append(request.url)

        page.on("console", on_console)
        page.on("pageerror", lambda error: lab.console_errors.append(f"uncaught: {error}"))
        page.on("request", on_request)
        page.goto(server.url)
        expect(page.get_by_test_id("prediction")).not_to_be_empty()
        expect(page.locator("#conn")).to_have_text("live")
        expect(page.locator("#backoff-table tbody tr").first).to_be_visible()
        yield lab
    finally:
        page.close()


@pytest.fixture
def lab(context: BrowserContext, server: WebServer) -> Iterator[LabPage]:
    """The lab at 1280x800."""
    yield from open_lab(context, server, DESKTOP)


@pytest.fixture
def phone_lab(context: BrowserContext, server: WebServer) -> Iterator[LabPage]:
    """The lab on a phone-width window (390x844)."""
    yield from open_lab(context, server, PHONE)

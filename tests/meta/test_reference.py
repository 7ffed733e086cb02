"""The API reference as a reader gets it: the pages ``make docs`` renders from
docs/reference/*.md and the docstrings (mkdocs + mkdocstrings, in strict mode).

- Every public name (each module's ``__all__``) is on exactly one page, one
  page per public area, and each page's sidebar is its table of contents: an
  entry per class and function, and per member of each class.
- Every public member mkdocstrings would show (fields, properties, methods,
  inherited ones included) has a docstring: what has none is dropped from the
  page without a word (``show_if_no_docstring: false``), so a field without
  one is a field the reference never mentions. Read with griffe, as
  mkdocstrings reads the sources.
- No private name reaches a page: no private base class, no ``_module``, no
  value spelled in private names.
- In Chromium (Debian's, through Playwright; skipped without it unless
  ``KEYQUEUE_REQUIRE_BROWSER=1``): no signature or heading runs out of its
  box, and the table of contents stays within the window; a screenshot of
  each page goes to build/reference-shots/.
"""

from __future__ import annotations

import functools
import http.server
import importlib
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.meta.test_docs import PUBLIC_MODULES

pytest_plugins = ["tests.support.web_browser"]  # the browser fixture

if TYPE_CHECKING:
    from playwright.sync_api import Browser

ROOT = Path(__file__).resolve().parents[2]
PAGES_DIR = ROOT / "docs" / "reference"
SHOTS = ROOT / "build" / "reference-shots"

# What no page may say: the private bases and helpers a public class is built on.
PRIVATE_WORDS = (
    "ThreadingFront",
    "AsyncioFront",
    "QueueBase",
    "QueueOptions",
    "RedisFront",
    "module docstring",
)
_PRIVATE_NAME = re.compile(r"(?<!\w)_[a-z]\w*")  # _x, keyqueue._x; not __x__ nor max_depth
_DIRECTIVE = re.compile(r"^::: (\S+)\n((?:    .*\n)*)", re.MULTILINE)


def _public_names() -> set[str]:
    names = set()
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        names.update(f"{module_name}.{name}" for name in module.__all__)
    return names


def _documented() -> dict[str, list[str]]:
    """Page stem -> the public names its ``:::`` directives document (a module
    directive documents the module's ``__all__``, or the ``members: [...]`` it
    lists, or none with ``members: false``)."""
    pages: dict[str, list[str]] = {}
    for page in sorted(PAGES_DIR.glob("*.md")):
        names = pages.setdefault(page.stem, [])
        for target, options in _DIRECTIVE.findall(page.read_text()):
            if target in PUBLIC_MODULES:
                members = re.search(r"members: \[(.*)\]", options)
                if members:  # a list: those, in that order
                    names.extend(f"{target}.{name.strip()}" for name in members[1].split(","))
                elif "members: false" not in options:
                    module = importlib.import_module(target)
                    names.extend(f"{target}.{name}" for name in module.__all__)
            else:
                names.append(target)
    return pages


def test_every_public_name_is_on_exactly_one_reference_page() -> None:
    pages = _documented()
    everywhere = [name for names in pages.values() for name in names]
    assert sorted(set(everywhere)) == sorted(_public_names())
    assert sorted(everywhere) == sorted(set(everywhere)), "a name is on two pages"
    # one page per area: no page is the whole package again
    assert max(len(names) for names in pages.values()) <= 12
    assert all(names for stem, names in pages.items() if stem != "keyqueue")


# -- the docstrings, as mkdocstrings reads them --------------------------------


def _griffe_package() -> Any:
    import griffe  # noqa: PLC0415 (the docs extra, in the test extra)

    extensions = griffe.load_extensions("griffe_inherited_docstrings")
    return griffe.load(
        "keyqueue", search_paths=[str(ROOT / "src")], allow_inspection=False, extensions=extensions
    )


def _target(obj: Any) -> Any:
    """What an alias (a re-export, an inherited member) stands for."""
    return obj.final_target if obj.is_alias else obj


def _public_objects() -> Iterator[tuple[str, Any]]:
    """(public path, griffe object) of every public name and every public member
    of a public class, inherited members included, as the reference shows them."""
    package = _griffe_package()

    def walk(path: str, obj: Any) -> Iterator[tuple[str, Any]]:
        yield path, obj
        if obj.is_class:
            members = {**obj.inherited_members, **obj.members}
            for name, member in members.items():
                if not name.startswith("_"):
                    yield from walk(f"{path}.{name}", _target(member))

    for module_name in PUBLIC_MODULES:
        module = package if module_name == "keyqueue" else package[module_name.partition(".")[2]]
        yield module_name, module
        for name in module.exports:
            yield from walk(f"{module_name}.{name}", _target(module[name]))


def test_every_public_name_field_and_method_has_a_docstring() -> None:
    objects = dict(_public_objects())
    undocumented = sorted(
        path for path, obj in objects.items() if not (obj.docstring and obj.docstring.value.strip())
    )
    assert undocumented == []
    # the walk saw the fields a dataclass declares, not only its methods
    for field in ("keyqueue.Stats.gets", "keyqueue.Event.kind", "keyqueue.HeldKey.key"):
        assert field in objects


# -- the rendered pages ----------------------------------------------------------


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference built as ``make docs`` builds it (strict: a warning fails)."""
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    return out


class _Page(HTMLParser):
    """A rendered page's element ids, its sidebar's links and its main column's text."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.toc: list[str] = []
        self.text: list[str] = []
        self._sidebar = self._main = 0  # depth inside each, 0 outside
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attr = dict(attrs)
        if attr.get("id"):
            self.ids.add(attr["id"] or "")
        classes = (attr.get("class") or "").split()
        if self._sidebar:
            self._sidebar += tag != "br"
            if tag == "a" and (attr.get("href") or "").startswith("#"):
                self.toc.append((attr["href"] or "")[1:])
        elif "bs-sidebar" in classes:
            self._sidebar = 1
        if self._main:
            self._main += tag not in ("br", "img", "hr", "input", "meta", "link")
        elif attr.get("role") == "main":
            self._main = 1

    def handle_endtag(self, tag: str) -> None:
        if self._sidebar:
            self._sidebar -= 1
        if self._main:
            self._main -= 1

    def handle_data(self, data: str) -> None:
        if self._main:
            self.text.append(data)


def _rendered(site: Path) -> dict[str, _Page]:
    return {
        stem: _Page((site / "reference" / stem / "index.html").read_text())
        for stem in _documented()
    }


def test_each_page_has_its_names_and_a_table_of_contents(site: Path) -> None:
    rendered = _rendered(site)
    for stem, names in _documented().items():
        page = rendered[stem]
        for name in names:
            assert name in page.ids, f"{name} is not on {stem}"
            assert name in page.toc, f"{name} is not in {stem}'s table of contents"
    # a class's members are in its page's table of contents too
    queues = rendered["queues"].toc
    assert {"keyqueue.WorkQueue.add", "keyqueue.AsyncWorkQueue.shutdown"} <= set(queues)
    assert "keyqueue.Stats.gets" in rendered["reading"].toc


def test_every_public_member_is_on_its_page(site: Path) -> None:
    rendered = _rendered(site)
    ids = set().union(*(page.ids for page in rendered.values()))
    objects = dict(_public_objects())
    missing = sorted(path for path in objects if path not in ids and path not in PUBLIC_MODULES)
    assert missing == []
    # a module's page opens with its docstring (the module has no heading of its own)
    for module_name in PUBLIC_MODULES:
        first_line = objects[module_name].docstring.value.splitlines()[0].replace("``", "")
        page = rendered[module_name.partition(".")[2] or "keyqueue"]
        assert first_line in " ".join("".join(page.text).split()), module_name


def test_no_page_names_a_private_name(site: Path) -> None:
    for stem, page in _rendered(site).items():
        text = "".join(page.text)
        private = sorted(set(_PRIVATE_NAME.findall(text)))
        assert private == [], stem
        assert [word for word in PRIVATE_WORDS if word in text] == [], stem


# -- in Chromium -------------------------------------------------------------------

WIDTHS = (1280, 800, 390)  # a desktop, a narrow window, a phone

_OVERFLOWING = """() => [...document.querySelectorAll('.doc-signature pre, .doc-heading')]
    .filter(e => e.scrollWidth > e.clientWidth + 1
                 || e.getBoundingClientRect().right > document.documentElement.clientWidth)
    .map(e => e.textContent.trim().slice(0, 60))"""
_TOC_BOTTOM = """() => {
    window.scrollTo(0, document.body.scrollHeight);
    const toc = document.querySelector('#toc-collapse');
    return [toc.getBoundingClientRect().bottom, window.innerHeight];
}"""


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    """The built site over HTTP on a free loopback port, stopped at the end."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(site))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_signatures_fit_their_boxes_in_chromium(browser: Browser, served: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    checked = 0
    for width in WIDTHS:
        page = browser.new_page(viewport={"width": width, "height": 800})
        try:
            for stem in _documented():
                page.goto(f"{served}/reference/{stem}/")
                signatures = page.locator(".doc-signature").count()
                assert signatures > 0 or stem == "keyqueue", stem
                assert page.evaluate(_OVERFLOWING) == [], f"{stem} at {width}px"
                if width == WIDTHS[0]:
                    page.screenshot(path=str(SHOTS / f"{stem}.png"))
                    bottom, window = page.evaluate(_TOC_BOTTOM)
                    assert bottom <= window, f"{stem}: the table of contents runs below the window"
                checked += signatures
        finally:
            page.close()
    assert checked > 100  # the boxes were there to check

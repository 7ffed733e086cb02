"""A page's files, from the package: its own ``static/`` and the two every page shares.

An app serves ``/static/{name}`` with ``StaticFiles(__package__, names)``:
``names`` from its package's ``static/`` folder, and ``SHARED`` from this
package's, which every page loads before its own:

- ``base.css``: the colours, fonts and reset both pages are drawn with (each
  ``app.css`` adds its own tokens and layout);
- ``format.js``: a module that writes numbers and durations as
  ``keyqueue._console.format`` writes them (``number``, ``count``,
  ``counted``, ``numbered``, ``duration``), so a state reads the same on a
  page and in ``keyqueue top``; each ``app.js`` imports it.

Nothing comes from elsewhere (no CDN, no build step); a name not served is a 404.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import resources
from pathlib import PurePosixPath

from aiohttp import web

__all__ = ["SHARED", "StaticFiles"]

SHARED = ("base.css", "format.js")
"""The files every page's ``/static/`` serves from this package."""
_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}


class StaticFiles:
    """The files one app serves under ``/static/``: ``names`` from ``package``'s
    ``static/`` folder, and ``SHARED`` from this package's."""

    def __init__(self, package: str, names: Iterable[str]) -> None:
        own = tuple(names)
        if clash := set(own) & set(SHARED):
            raise ValueError(f"{sorted(clash)} are the shared files: name the page's own otherwise")
        self._package = package
        self._served = {*own, *SHARED}

    def read(self, name: str) -> bytes:
        """A file's bytes: a shared one, or any of the package's ``static/`` (served or not)."""
        package = __package__ if name in SHARED else self._package
        return resources.files(package).joinpath("static", name).read_bytes()

    def response(self, name: str) -> web.Response:
        """A served file as an answer, with its content type; 404 for any other name."""
        if name not in self._served:
            raise web.HTTPNotFound()
        kind = _TYPES[PurePosixPath(name).suffix]
        return web.Response(body=self.read(name), content_type=kind, charset="utf-8")

    async def serve(self, request: web.Request) -> web.Response:
        """The handler of ``/static/{name}`` (and of ``/``, as ``index.html``)."""
        return self.response(request.match_info.get("name", "index.html"))

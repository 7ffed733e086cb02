"""List and watch options for the lab's API server: selectors, continue tokens, checks.

Theory of operation
-------------------
What the real API server's ``ListOptions`` mean, for ConfigMaps, as pure
functions the server's handlers call (no I/O here):

- ``Selector``: a label selector (``labelSelector``) and a field selector
  (``fieldSelector``) parsed into requirements an object must all meet.
  Label selectors are the equality-based kind (``k=v``, ``k==v``, ``k!=v``,
  and ``k`` / ``!k`` for a label present or absent); set-based ones
  (``k in (a,b)``, ``notin``) are a 400, refused rather than ignored. Field
  selectors know ``metadata.name`` and ``metadata.namespace`` (``=``, ``==``,
  ``!=``); any other field is a 400 ``field label not supported``, as the
  real server says for a ConfigMap.
- Continue tokens are the real server's shape: base64url (no padding) of
  ``{"v": "meta.k8s.io/v1", "rv": N, "start": "<key after the last one sent,
  relative to the list's prefix>"}``. Every page of a list is read at the
  first page's revision ``N``, so the pages together are one snapshot; once
  etcd has compacted ``N`` away the token has expired (410 ``Expired``).
- ``watch_options``/``list_options`` check the combinations the real server
  checks (422 Invalid): ``sendInitialEvents`` needs
  ``resourceVersionMatch=NotOlderThan`` and ``allowWatchBookmarks=true``; a
  watch's ``resourceVersionMatch`` needs ``sendInitialEvents``; a list's
  needs a ``resourceVersion``; ``continue`` comes without one (400).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "INITIAL_EVENTS_END",
    "ListOptions",
    "OptionError",
    "Selector",
    "WatchOptions",
    "decode_continue",
    "encode_continue",
    "list_options",
    "watch_options",
]

INITIAL_EVENTS_END = "k8s.io/initial-events-end"
"""The annotation on the BOOKMARK that ends a streaming list's initial events."""
_TRUE = ("true", "t", "1")  # Go's strconv.ParseBool, as the real server reads flags
_FALSE = ("false", "f", "0")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$")
_LABEL_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_FIELDS = ("metadata.name", "metadata.namespace")
_MATCHES = ("NotOlderThan", "Exact")


class OptionError(ValueError):
    """A query the real server refuses: ``code`` 400 (BadRequest) or 422 (Invalid)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _bad(message: str) -> OptionError:
    return OptionError(400, message)


def _invalid(message: str) -> OptionError:
    return OptionError(422, message)


def _label_key(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _LABEL_PREFIX.match(prefix)):
        return False
    return len(name) <= 63 and bool(_LABEL_NAME.match(name))


def _label_value(value: str) -> bool:
    return value == "" or (len(value) <= 63 and bool(_LABEL_NAME.match(value)))


def _requirements(text: str, what: str) -> list[tuple[str, str, str]]:
    """``(key, op, value)`` for each comma-separated requirement; op is ``=``,
    ``!=``, ``exists`` or ``!exists``."""
    if "(" in text or re.search(r"\s(in|notin)\s", f" {text} "):
        raise _bad(f"{what}: set-based requirements (in, notin) are not supported here: {text!r}")
    out = []
    for raw in text.split(","):
        part = raw.strip()
        if not part:
            if text.strip():
                raise _bad(f"{what}: empty requirement in {text!r}")
            continue
        for op in ("!=", "==", "="):
            if op in part:
                key, value = (s.strip() for s in part.split(op, 1))
                out.append((key, "!=" if op == "!=" else "=", value))
                break
        else:
            if part.startswith("!"):
                out.append((part[1:].strip(), "!exists", ""))
            else:
                out.append((part, "exists", ""))
    return out


@dataclass(frozen=True, slots=True)
class Selector:
    """Label and field requirements; ``matches(obj)`` for a stored ConfigMap dict."""

    labels: tuple[tuple[str, str, str], ...] = ()
    fields: tuple[tuple[str, str, str], ...] = ()

    @classmethod
    def parse(cls, label_selector: str, field_selector: str) -> Selector:
        """Both selectors parsed; ``OptionError`` (400) for what cannot be served."""
        labels = _requirements(label_selector, "labelSelector")
        for key, _, value in labels:
            if not _label_key(key) or not _label_value(value):
                raise _bad(
                    f"unable to parse requirement: labelSelector {label_selector!r}: "
                    f"invalid key {key!r} or value {value!r}"
                )
        fields = _requirements(field_selector, "fieldSelector")
        for key, op, _ in fields:
            if op not in ("=", "!="):
                raise _bad(f"fieldSelector {field_selector!r}: a requirement needs = or !=")
            if key not in _FIELDS:
                raise _bad(f"field label not supported: {key}")
        return cls(tuple(labels), tuple(fields))

    def __bool__(self) -> bool:
        return bool(self.labels or self.fields)

    def matches(self, obj: Mapping[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        for key, op, value in self.labels:
            if op == "exists":
                ok = key in labels
            elif op == "!exists":
                ok = key not in labels
            elif op == "=":
                ok = labels.get(key) == value
            else:
                ok = labels.get(key) != value
            if not ok:
                return False
        for key, op, value in self.fields:
            actual = meta.get(key.split(".", 1)[1], "")
            if (actual == value) != (op == "="):
                return False
        return True


def encode_continue(revision: int, start: str) -> str:
    """The real server's continue token for the page after ``start`` (relative key)."""
    token = json.dumps({"v": "meta.k8s.io/v1", "rv": revision, "start": start})
    return base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")


def decode_continue(token: str) -> tuple[int, str]:
    """``(revision, start)`` from a token; ``OptionError`` (400) if it is not one."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = json.loads(raw)
        revision, start = data["rv"], data["start"]
    except (binascii.Error, ValueError, KeyError, TypeError):
        raise _bad(f"continue key is not valid: {token!r}") from None
    if (
        data.get("v") != "meta.k8s.io/v1"
        or not isinstance(revision, int)
        or isinstance(revision, bool)
        or revision < 1
        or not isinstance(start, str)
        or not start
        or start.startswith("/")
        or ".." in start.split("/")
    ):
        raise _bad(f"continue key is not valid: {token!r}")
    return revision, start


def _flag(query: Mapping[str, str], name: str) -> bool:
    value = query.get(name, "").lower()
    if value in ("", *_FALSE):
        return False
    if value in _TRUE:
        return True
    raise _bad(f"{name}: must be a boolean, got {query[name]!r}")


def _natural(query: Mapping[str, str], name: str) -> int:
    value = query.get(name, "")
    try:
        number = int(value) if value else 0
    except ValueError:
        raise _bad(f"{name}: must be an integer, got {value!r}") from None
    return max(number, 0)


def _revision(query: Mapping[str, str]) -> int:
    rv = query.get("resourceVersion", "")
    try:
        return int(rv) if rv else 0
    except ValueError:
        raise _bad(f"resourceVersion: must be an integer, got {rv!r}") from None


@dataclass(frozen=True, slots=True)
class ListOptions:
    selector: Selector
    limit: int
    """0: everything in one response."""
    revision: int
    """The etcd revision to read at (0: now)."""
    start: str
    """Where in the list's prefix to begin ("": its first key)."""


@dataclass(frozen=True, slots=True)
class WatchOptions:
    selector: Selector
    revision: int
    """Watch changes after this one (0: send the current objects first)."""
    timeout: float | None
    bookmarks: bool
    send_initial_events: bool


def list_options(query: Mapping[str, str]) -> ListOptions:
    """A list's options, checked as the real server checks them."""
    selector = Selector.parse(query.get("labelSelector", ""), query.get("fieldSelector", ""))
    limit, revision = _natural(query, "limit"), _revision(query)
    match, token = query.get("resourceVersionMatch", ""), query.get("continue", "")
    if match and match not in _MATCHES:
        raise _invalid(f"resourceVersionMatch: Unsupported value: {match!r}")
    if match and "resourceVersion" not in query:
        raise _invalid("resourceVersionMatch is forbidden unless resourceVersion is provided")
    if match == "Exact" and revision == 0:
        raise _invalid('resourceVersionMatch "Exact" is forbidden for resourceVersion "0"')
    if token:
        if query.get("resourceVersion"):
            raise _bad("specifying resource version is not allowed when using continue")
        revision, start = decode_continue(token)
        return ListOptions(selector, limit, revision, start)
    # NotOlderThan, or no match: the newest state is never older than asked.
    return ListOptions(selector, limit, revision if match == "Exact" else 0, "")


def watch_options(query: Mapping[str, str]) -> WatchOptions:
    """A watch's options, checked as the real server checks them."""
    selector = Selector.parse(query.get("labelSelector", ""), query.get("fieldSelector", ""))
    revision = _revision(query)
    timeout = float(_natural(query, "timeoutSeconds")) if "timeoutSeconds" in query else None
    bookmarks = _flag(query, "allowWatchBookmarks")
    initial = "sendInitialEvents" in query and _flag(query, "sendInitialEvents")
    match = query.get("resourceVersionMatch", "")
    if match and "sendInitialEvents" not in query:
        raise _invalid(
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch "
            "unless sendInitialEvents is provided"
        )
    if initial and match != "NotOlderThan":
        raise _invalid(
            "resourceVersionMatch: Forbidden: sendInitialEvents requires setting "
            "resourceVersionMatch to NotOlderThan"
        )
    if initial and not bookmarks:
        raise _invalid(
            "allowWatchBookmarks: Forbidden: sendInitialEvents requires setting "
            "allowWatchBookmarks to true"
        )
    if match and match != "NotOlderThan":
        raise _invalid(f"resourceVersionMatch: Unsupported value: {match!r}")
    return WatchOptions(selector, revision, timeout, bookmarks, initial)

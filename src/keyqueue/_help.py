"""What ``help()`` and ``inspect`` show for the public queues, in both builds.

Theory of operation
-------------------
mypyc keeps neither docstrings nor annotations: a compiled front's method is a
C method descriptor whose ``__doc__`` is only its text signature
(``add(self, /, key, priority=0)``), with no way to set ``__doc__`` or
``__signature__`` on it. The public queues must still call that descriptor
directly (a Python method in between would double the cost of ``q.add(k)``).

The two needs meet in ``Documented``, the queues' metaclass. An attribute
looked up on an instance (``q.add``) never consults the metaclass, so calls
are untouched. An attribute looked up on the class (``WorkQueue.add``, which
is what ``help``, ``pydoc`` and ``inspect.getdoc`` read) goes through
``Documented.__getattribute__``: when it finds a front's own member there, it
answers with a view of it: a function (or property) carrying the docstring
from the front's source and the signature the public class declares for type
checkers (its ``if TYPE_CHECKING`` stubs, key-typed), else the front's own.
The view calls the front's member, so ``WorkQueue.add(q, k)`` still works.

Both builds take the same path from the same ``.py`` files (a wheel ships the
sources beside the extensions), so they show the same text; the views are made
on first look-up, so importing keyqueue parses nothing. What stays as mypyc
makes it, in the compiled build: an instance's bound method (``q.add``) has
an untyped signature (``inspect.getdoc`` finds its docstring through the
class), and ``AsyncWorkQueue``'s coroutine methods bound to an instance have
no docstring (mypyc names them ``AsyncioFront.get``, which leads nowhere).
"""

from __future__ import annotations

import ast
import functools
import inspect  # imports ast too, and asyncio imports both
from pathlib import Path
from typing import Any

from ._build import COMPILED_MODULES

__all__ = ["Documented"]

_HERE = Path(__file__).resolve().parent
_PACKAGE = __name__.rpartition(".")[0]
_FRONT_MODULES = frozenset(f"{_PACKAGE}.{name}" for name in COMPILED_MODULES)
_QUEUES = f"{_PACKAGE}._queues"  # where the public queues and their typed stubs are
_MISSING = object()
_DUNDERS = frozenset({"__init__", "__len__", "__repr__"})  # the ones the fronts define
_class_dict = type.__dict__["__dict__"].__get__  # a class's own namespace, not via getattr


class Documented(type):
    """The public queues' metaclass: class look-ups of a front's member see its view."""

    def __getattribute__(cls, name: str) -> Any:
        value = type.__getattribute__(cls, name)
        if name[0] == "_" and name not in _DUNDERS:
            return value  # private, or a dunder no front writes: no view
        for owner in type.__getattribute__(cls, "__mro__"):
            member = _class_dict(owner).get(name, _MISSING)
            if member is _MISSING:
                continue
            if member is not value or owner.__module__ not in _FRONT_MODULES:
                return value  # the class's own (or a subclass's override)
            view = _view(_public_class(cls), owner, name)
            return value if view is None else view
        return value

    @property
    def __signature__(cls) -> inspect.Signature:
        """What ``inspect.signature(WorkQueue)`` shows: the typed constructor.

        Python 3.13 finds a class's ``__init__`` in the namespaces of its MRO,
        past ``__getattribute__`` above, so it would show the front's
        ``(*args, **options)``; ``inspect.signature`` asks for ``__signature__``
        first. A subclass with an ``__init__`` of its own gets none here
        (AttributeError), and inspect reads that ``__init__`` as usual.
        """
        init = Documented.__getattribute__(cls, "__init__")  # the view, for a front's
        signature = getattr(init, "__signature__", None)
        if not isinstance(signature, inspect.Signature) or init.__module__ not in _FRONT_MODULES:
            raise AttributeError("__signature__")
        return signature.replace(parameters=list(signature.parameters.values())[1:])  # no self


def _public_class(cls: type) -> type:
    """The public queue ``cls`` is or derives from: the class whose stubs type its views."""
    return next(c for c in cls.__mro__ if c.__module__ == _QUEUES)


@functools.cache
def _view(public: type, owner: type, name: str) -> Any:
    """The documented stand-in for ``owner.<name>`` as seen on ``public``, or None."""
    source = _class_defs(owner.__module__.rpartition(".")[2], owner.__name__).get(name)
    if source is None:
        return None  # not written in the front's source: nothing to show but what is there
    doc = ast.get_docstring(source)
    member = _class_dict(owner)[name]
    if any(isinstance(d, ast.Name) and d.id == "property" for d in source.decorator_list):
        return property(member.__get__, doc=doc)
    if doc is None and name[:2] == "__":
        doc = getattr(object, name).__doc__  # as inspect.getdoc finds it for the pure one
    typed = _class_defs(_QUEUES.rpartition(".")[2], public.__name__).get(name, source)
    if isinstance(typed, ast.AsyncFunctionDef):

        async def view(self: Any, /, *args: Any, **kwargs: Any) -> Any:
            return await member(self, *args, **kwargs)

    else:

        def view(self: Any, /, *args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
            return member(self, *args, **kwargs)

    view.__name__ = name
    view.__qualname__ = f"{owner.__qualname__}.{name}"
    view.__module__ = owner.__module__
    view.__doc__ = doc
    view.__signature__ = _signature(typed)  # type: ignore[attr-defined]
    view.__wrapped__ = member  # type: ignore[attr-defined]
    return view


@functools.cache
def _class_defs(module: str, class_name: str) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """The functions written in ``class <class_name>`` of ``<module>.py`` (in the package),
    those under ``if TYPE_CHECKING:`` included; the first of each name."""
    tree = ast.parse((_HERE / f"{module}.py").read_text(encoding="utf-8"))
    defs: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            body = list(node.body)
            while body:
                item = body.pop(0)
                if isinstance(item, ast.If):
                    body[:0] = item.body
                elif isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    defs.setdefault(item.name, item)
    return defs


def _signature(source: ast.FunctionDef | ast.AsyncFunctionDef) -> inspect.Signature:
    """The signature ``def`` gives ``source`` under ``from __future__ import annotations``."""
    empty = inspect.Parameter.empty

    def annotation(node: ast.expr | None) -> Any:
        return empty if node is None else ast.unparse(node)

    def parameter(arg: ast.arg, kind: Any, value: ast.expr | None = None) -> inspect.Parameter:
        default = empty if value is None else ast.literal_eval(value)
        return inspect.Parameter(
            arg.arg, kind, default=default, annotation=annotation(arg.annotation)
        )

    args, kind = source.args, inspect.Parameter
    positional = [*args.posonlyargs, *args.args]
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    parameters = [
        parameter(
            arg,
            kind.POSITIONAL_ONLY if i < len(args.posonlyargs) else kind.POSITIONAL_OR_KEYWORD,
            value,
        )
        for i, (arg, value) in enumerate(zip(positional, defaults, strict=True))
    ]
    if args.vararg:
        parameters.append(parameter(args.vararg, kind.VAR_POSITIONAL))
    parameters += map(
        parameter, args.kwonlyargs, [kind.KEYWORD_ONLY] * len(args.kwonlyargs), args.kw_defaults
    )
    if args.kwarg:
        parameters.append(parameter(args.kwarg, kind.VAR_KEYWORD))
    return inspect.Signature(parameters, return_annotation=annotation(source.returns))

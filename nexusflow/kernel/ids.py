"""Typed row identifiers (seed 003 "Identity rules": internal relations use
typed identifiers and foreign keys).

Every :class:`~nexusflow.kernel.models.GuardedModel` has a primary key of its
own kind: ``Execution.Id`` is ``ExecutionId``, ``FlowRun.Id`` is ``FlowRunId``.
Both are ``int`` subclasses, so they compare, hash, format and serialize to
JSON exactly like the number they carry; what they add is that a store can
tell them apart. :func:`require_id` accepts a value of the expected kind or a
plain ``int`` (from a boundary: URL kwargs, command arguments, JSON documents)
and refuses an id of another kind before any SQL runs.

The database never sees the type: the ORM binds ``int(value)``, and raw SQL
binds :func:`sql_param` of a value.
"""
from __future__ import annotations

import re
import threading
from typing import Any

from .errors import InvalidIdentity


class TypedId(int):
    """Base of every per-model id class; never instantiated directly.

    Subclasses are made by :func:`id_class_for`; ``model_label`` names the
    owning model as ``"<app_label>.<Model>"``.
    """

    __slots__ = ()
    model_label: str = ""

    def __new__(cls, value: Any):
        if cls is TypedId:
            raise TypeError("TypedId is abstract: use Model.Id or id_class_for(model)")
        return super().__new__(cls, value)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({int.__repr__(self)})"

    # ``int`` has no ``__str__`` of its own: without this, str() and f-strings
    # would fall back to ``__repr__`` and print ``ExecutionId(5)``.
    def __str__(self) -> str:
        return int.__repr__(self)

    def __format__(self, spec: str) -> str:
        return int.__format__(int(self), spec)

    def __reduce__(self):
        return (_restore, (self.model_label, int(self)))


_REGISTRY: dict[str, type[TypedId]] = {}
_REGISTRY_LOCK = threading.Lock()


def _label_of(model_or_label: Any) -> str:
    if isinstance(model_or_label, str):
        return model_or_label
    meta = getattr(model_or_label, "_meta", None)
    if meta is None:
        raise TypeError(f"expected a model class or '<app_label>.<Model>', got {model_or_label!r}")
    return meta.label


def id_class_for(model_or_label: Any) -> type[TypedId]:
    """Return the id class of a model, creating it on first use.

    Args:
        model_or_label: a model class (concrete or historical) or its label
            ``"<app_label>.<Model>"``; both name the same class.

    Returns:
        The ``TypedId`` subclass ``"<Model>Id"``, one per label for the life of
        the process (historical models in migrations share it).

    Raises:
        TypeError: the argument is neither a model class nor a label.

    Seed 003, "Identity rules".
    """
    label = _label_of(model_or_label)
    cls = _REGISTRY.get(label)
    if cls is not None:
        return cls
    with _REGISTRY_LOCK:
        cls = _REGISTRY.get(label)
        if cls is None:
            name = f"{label.rpartition('.')[2]}Id"
            cls = type(name, (TypedId,), {"__slots__": (), "model_label": label, "__module__": __name__,
                                          "__qualname__": name,
                                          "__doc__": f"Primary key of ``{label}`` rows."})
            _REGISTRY[label] = cls
    return cls


def _restore(label: str, value: int) -> TypedId:
    return id_class_for(label)(value)


def require_id(value: Any, kind: Any, *, field: str = "id") -> TypedId:
    """Return ``value`` as an id of ``kind``, refusing any other kind of id.

    Args:
        value: a ``TypedId`` of exactly ``kind``, or a plain positive ``int``
            crossing a boundary (URL kwarg, command argument, JSON document).
        kind: a model class, its label, or a ``TypedId`` subclass.
        field: name used in the error message.

    Returns:
        ``value`` itself when it already has the kind, else ``kind``'s id class
        wrapping it.

    Raises:
        InvalidIdentity: ``value`` is an id of another model, a ``bool``, an
            ``int`` below 1, or not an integer at all (``str``, ``float``,
            ``None``...). Runs no SQL.

    Seed 003, "Identity rules" (typed identifiers for internal relations).
    """
    id_cls = kind if isinstance(kind, type) and issubclass(kind, TypedId) else id_class_for(kind)
    if type(value) is id_cls:
        if value < 1:
            raise InvalidIdentity(f"{field}: {value!r} is not a row id")
        return value
    if isinstance(value, TypedId):
        raise InvalidIdentity(f"{field}: expected a {id_cls.__name__}, got {value!r}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidIdentity(f"{field}: expected a {id_cls.__name__}, got {type(value).__name__} {value!r}")
    if value < 1:
        raise InvalidIdentity(f"{field}: {value!r} is not a row id")
    return id_cls(value)


#: An id written as text: ASCII digits, no sign, no leading zero, below 2**63 (a BIGINT primary key).
_ID_TEXT = re.compile(r"[1-9][0-9]{0,18}")


def id_from_text(text: str, kind: Any, *, field: str = "id") -> TypedId:
    """Parse an id given as text (a command argument, a URL segment) and return it as an id of ``kind``.

    Raises:
        InvalidIdentity: anything but ASCII digits without a leading zero (no sign, space, other
            Unicode digits such as superscripts) or a value of 2**63 or more. Runs no SQL.
    """
    if not isinstance(text, str) or not _ID_TEXT.fullmatch(text) or int(text) >= 2**63:
        raise InvalidIdentity(f"{field} {text!r} is not a positive integer")
    return require_id(int(text), kind, field=field)


def sql_param(value: Any) -> Any:
    """Return ``value`` ready to bind in raw SQL: a typed id becomes a plain ``int``.

    The MySQL driver picks its encoder by exact type and would quote an
    unknown ``int`` subclass as text; every other value passes unchanged.
    """
    return int(value) if isinstance(value, TypedId) else value

"""Record classes for the telemetry model: slots, keyword defaults, equality.

Why not ``dataclasses``: every command builds the model's classes when it
starts, the one-shot ``gpustation snapshot`` included, and ``dataclasses``
first imports ``inspect`` and then writes, compiles and runs the source of an
``__init__``, ``__repr__`` and ``__eq__`` for each class. On an H200 host that
was the largest single part of the snapshot's start (``-X importtime``;
figures in ``bench/RESULTS.md``, "The snapshot's record classes"). Here a
record is its annotated fields, a ``__slots__`` made from them and one shared
``__init__``, ``__repr__`` and ``__eq__`` that walk the class's field table.
Type checkers read :func:`record` as a dataclass through ``dataclass_transform``.

What a record supports, and all the model uses: fields in declaration order,
positional or keyword arguments, defaults and ``field(default_factory=...)``,
``metadata`` on a field, ``frozen=True`` (and then a hash), no inheritance
between records.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, overload

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform
else:

    def dataclass_transform(**_kwargs: Any) -> Callable[[Any], Any]:
        return lambda obj: obj


_T = TypeVar("_T")
_MISSING: Any = object()


class Field:
    """One declared field: its name, its default (or default factory), its metadata."""

    __slots__ = ("default", "factory", "metadata", "name")

    def __init__(
        self,
        default: Any = _MISSING,
        factory: Callable[[], Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        self.name = ""
        self.default = default
        self.factory = factory
        self.metadata: Mapping[str, Any] = metadata or {}


def field(
    *,
    default: Any = _MISSING,
    default_factory: Callable[[], Any] | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> Any:
    """Declare a field with a default, a default factory or metadata."""
    return Field(default, default_factory, metadata)


def fields(cls: type) -> tuple[Field, ...]:
    """The fields of a record class, in declaration order."""
    table: tuple[Field, ...] = cls.__record_fields__  # type: ignore[attr-defined]
    return table


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    table: tuple[Field, ...] = type(self).__record_fields__
    if len(args) > len(table):
        raise TypeError(f"{type(self).__name__}() takes {len(table)} positional arguments")
    setter = object.__setattr__
    for f, value in zip(table, args, strict=False):
        setter(self, f.name, value)
    for f in table[len(args) :]:
        name = f.name
        if name in kwargs:
            setter(self, name, kwargs.pop(name))
        elif f.factory is not None:
            setter(self, name, f.factory())
        elif f.default is not _MISSING:
            setter(self, name, f.default)
        else:
            raise TypeError(f"{type(self).__name__}() missing argument {name!r}")
    if kwargs:
        raise TypeError(f"{type(self).__name__}() got unexpected arguments {sorted(kwargs)}")


def _repr(self: Any) -> str:
    inner = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in type(self).__record_fields__)
    return f"{type(self).__qualname__}({inner})"


def _values(self: Any) -> tuple[Any, ...]:
    return tuple(getattr(self, f.name) for f in type(self).__record_fields__)


def _eq(self: Any, other: object) -> bool:
    if type(other) is not type(self):
        # typeshed gives NotImplemented a type derived from Any
        return NotImplemented  # type: ignore[no-any-return]
    return _values(self) == _values(other)


def _hash(self: Any) -> int:
    return hash(_values(self))


def _frozen_setattr(self: Any, name: str, value: Any) -> None:
    raise AttributeError(f"{type(self).__name__} is frozen: cannot set {name!r}")


def _make(cls: type, frozen: bool) -> type:
    table: list[Field] = []
    namespace = dict(cls.__dict__)
    for name in cls.__annotations__:
        declared = namespace.pop(name, _MISSING)
        f = declared if isinstance(declared, Field) else Field(default=declared)
        f.name = name
        table.append(f)
    namespace.pop("__dict__", None)
    namespace.pop("__weakref__", None)
    namespace["__slots__"] = tuple(f.name for f in table)
    namespace["__qualname__"] = cls.__qualname__
    namespace["__record_fields__"] = tuple(table)
    namespace["__init__"] = _init
    namespace.setdefault("__repr__", _repr)
    namespace["__eq__"] = _eq
    if frozen:
        namespace["__setattr__"] = _frozen_setattr
        namespace["__hash__"] = _hash
    else:
        namespace["__hash__"] = None
    return type(cls.__name__, cls.__bases__, namespace)


@overload
def record(cls: type[_T], /) -> type[_T]: ...
@overload
def record(*, frozen: bool = False) -> Callable[[type[_T]], type[_T]]: ...


@dataclass_transform(field_specifiers=(field,))
def record(cls: Any = None, /, *, frozen: bool = False) -> Any:
    """Make ``cls`` a record (``@record`` or ``@record(frozen=True)``)."""
    if cls is None:
        return lambda c: _make(c, frozen)
    return _make(cls, frozen)

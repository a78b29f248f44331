"""One `__eq__`, `__hash__` and `__repr__` for gpunode's dataclasses, instead of the ones `@dataclass` writes for
each class.

`@dataclass` generates these methods as source text and compiles them once per class, at import: about a tenth of
what a converged `gpunode install` spends importing (docs/benchmarks.md, "The converged path's imports"). A class
declared `@dataclass(frozen=True, eq=False, repr=False)` on `Frozen` (or `@dataclass(eq=False, repr=False)` on
`Record`) gets these shared methods instead, which read the class's `dataclasses.fields` on first use and give the
same answers as the generated ones:

- `==` is True only between instances of the same class whose compared fields (`compare=True`, the default) are
  equal as tuples; another class gets NotImplemented (Python then tries the other side, then identity);
- `hash()` (`Frozen` only; a `Record` is unhashable, as a mutable dataclass with eq is) is the hash of the tuple
  of the fields `field(hash=...)` selects (by default the compared ones);
- `repr()` is `QualifiedName(field=repr(value), ...)` over the fields with `repr=True`, `...` for an instance
  met again while it is being formatted.

A method the class body defines itself wins, as with `@dataclass`. tests/test_record.py compares every class of
the package built this way with the methods `@dataclass` would have generated for it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from operator import attrgetter
from reprlib import recursive_repr
from typing import Any, NamedTuple


class _Shape(NamedTuple):
    compared: Callable[[Any], tuple[Any, ...]]
    hashed: Callable[[Any], tuple[Any, ...]]
    shown: tuple[str, ...]


_SHAPES: dict[type, _Shape] = {}


def _getter(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """The values of these attributes, always as a tuple (the generated methods compare and hash tuples)."""
    if len(names) > 1:
        return attrgetter(*names)
    if names:
        one = attrgetter(names[0])
        return lambda obj: (one(obj),)
    return lambda obj: ()


def _shape(cls: type) -> _Shape:
    shape = _SHAPES.get(cls)
    if shape is None:
        fields = dataclasses.fields(cls)
        shape = _SHAPES[cls] = _Shape(
            compared=_getter(tuple(f.name for f in fields if f.compare)),
            hashed=_getter(tuple(f.name for f in fields if (f.compare if f.hash is None else f.hash))),
            shown=tuple(f.name for f in fields if f.repr))
    return shape


class _Shared:
    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            compared = _shape(self.__class__).compared
            return compared(self) == compared(other)
        return NotImplemented

    @recursive_repr()
    def __repr__(self) -> str:
        cls = self.__class__
        return f"{cls.__qualname__}({', '.join([f'{name}={getattr(self, name)!r}' for name in _shape(cls).shown])})"


class Record(_Shared):
    """Equality and repr of a mutable dataclass (declared `@dataclass(eq=False, repr=False)`); unhashable."""

    __slots__ = ()
    __hash__ = None  # type: ignore[assignment]  # as `@dataclass` with eq and without frozen


class Frozen(_Shared):
    """Equality, hash and repr of a frozen dataclass (declared `@dataclass(frozen=True, eq=False, repr=False)`)."""

    __slots__ = ()

    def __hash__(self) -> int:
        return hash(_shape(self.__class__).hashed(self))

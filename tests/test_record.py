"""gpunode/record.py's shared `__eq__`, `__hash__` and `__repr__` answer as the ones `@dataclass` generates: for
every dataclass of the package built on Record or Frozen, compared with a dataclass of the same fields whose
methods `@dataclass` wrote, on instances holding the same values; and for the field options the package does
not use yet."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from typing import Any, ClassVar

import pytest

import gpunode
from gpunode.record import Frozen, Record


def _package_dataclasses() -> list[type]:
    found: dict[type, None] = {}
    for info in pkgutil.walk_packages(gpunode.__path__, "gpunode."):
        if info.name.endswith("__main__"):
            continue  # it runs the CLI
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if isinstance(value, type) and dataclasses.is_dataclass(value) and value.__module__ == module.__name__:
                found[value] = None
    return sorted(found, key=lambda c: f"{c.__module__}.{c.__qualname__}")


PACKAGE = _package_dataclasses()
SHARED = [cls for cls in PACKAGE if issubclass(cls, (Record, Frozen))]


def _generated(cls: type) -> type:
    """A dataclass with cls's fields (and their compare/repr/hash options) whose methods `@dataclass` generates."""
    params = cls.__dataclass_params__  # type: ignore[attr-defined]
    specs = [(f.name, f.type, dataclasses.field(init=f.init, repr=f.repr, hash=f.hash, compare=f.compare))
             for f in dataclasses.fields(cls)]
    ref = dataclasses.make_dataclass(cls.__name__, specs, frozen=params.frozen)
    ref.__qualname__ = cls.__qualname__
    return ref


_CONCRETE: dict[type, type] = {}


def _blank(cls: type, values: list[Any]) -> Any:
    """An instance without running __init__ (no field has to be valid for its class), holding these values; for an
    abstract class, of one subclass of the same name that overrides nothing."""
    if getattr(cls, "__abstractmethods__", None):
        if cls not in _CONCRETE:
            _CONCRETE[cls] = type(cls.__name__, (cls,), {"__qualname__": cls.__qualname__})
            _CONCRETE[cls].__abstractmethods__ = frozenset()
        cls = _CONCRETE[cls]
    obj = object.__new__(cls)
    for f, value in zip(dataclasses.fields(cls), values, strict=True):
        object.__setattr__(obj, f.name, value)
    return obj


def _hash(*objs: Any) -> Any:
    """The objects' hashes, or the type of what hash() raised (the same either way is what is compared)."""
    try:
        return ("value", [hash(obj) for obj in objs])
    except TypeError as exc:
        return ("raises", type(exc))


def assert_same(cls: type, ref: type) -> None:
    count = len(dataclasses.fields(cls))
    assert [f.name for f in dataclasses.fields(ref)] == [f.name for f in dataclasses.fields(cls)]
    assert (cls.__hash__ is None) == (ref.__hash__ is None), cls  # hashable exactly when @dataclass makes it so
    nan = float("nan")
    rows = [[(i, f"text {i}\n'q'") for i in range(count)],  # hashable values
            [[i] for i in range(count)],  # unhashable values: hash() raises alike
            [nan] * count,  # the same NaN object: equal as tuple items (identity first), in both
            [None] * count]
    for row in rows:
        ours, theirs = _blank(cls, row), _blank(ref, row)
        twin, ref_twin = _blank(cls, list(row)), _blank(ref, list(row))
        assert (ours == twin) == (theirs == ref_twin), (cls, row)
        assert (ours != twin) == (theirs != ref_twin), (cls, row)
        assert _hash(ours) == _hash(theirs), (cls, row)
        if cls.__repr__ in (Record.__repr__, Frozen.__repr__):  # else the class wrote its own, as @dataclass keeps
            assert repr(ours) == repr(theirs), cls
        assert ours.__eq__(object()) is NotImplemented and theirs.__eq__(object()) is NotImplemented
        for k in range(count):  # one field differs: unequal only if that field is compared, hash likewise
            other, ref_other = list(row), list(row)
            other[k] = ref_other[k] = ("other", k)
            a, b = _blank(cls, other), _blank(ref, ref_other)
            assert (ours == a) == (theirs == b), (cls, k)
            assert _hash(ours, a) == _hash(theirs, b), (cls, k)  # the same values: equal exactly when generated ones are
    if count and cls.__repr__ in (Record.__repr__, Frozen.__repr__):
        # an instance inside itself is shown as `...`, as the generated repr does
        ours, theirs = _blank(cls, [None] * count), _blank(ref, [None] * count)
        name = dataclasses.fields(cls)[0].name
        object.__setattr__(ours, name, [ours])
        object.__setattr__(theirs, name, [theirs])
        assert repr(ours) == repr(theirs)


def test_the_package_s_dataclasses_are_found():
    assert len(PACKAGE) >= 160 and len(SHARED) >= 150  # the walk really saw them


@pytest.mark.parametrize("cls", SHARED, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_a_package_dataclass_compares_hashes_and_shows_as_generated(cls):
    params = cls.__dataclass_params__
    assert not params.eq and not params.repr and not params.order and not params.unsafe_hash  # ours, not generated
    assert issubclass(cls, Frozen) == params.frozen  # a frozen class is hashable, a mutable one is not
    assert cls.__eq__ is Record.__eq__ is Frozen.__eq__  # no class in between generated or wrote its own
    assert_same(cls, _generated(cls))


def test_every_package_dataclass_is_built_on_the_shared_methods():
    # a new dataclass generating its own __eq__/__hash__/__repr__ costs import time on every run: declare it
    # `@dataclass(frozen=True, eq=False, repr=False)` on Frozen (or `eq=False, repr=False` on Record). The one
    # exceptions: a fact compares by identity (eq=False) and writes its own repr; the typer patch's class extends
    # typer's own dataclass.
    kept = [f"{cls.__module__}.{cls.__qualname__}" for cls in PACKAGE if cls not in SHARED]
    assert kept == ["gpunode.cli._typerpatch._Deferred", "gpunode.facts.registry.Fact"]


SPECS: list[tuple[str, dict[str, Any]]] = [
    ("no fields", {}),
    ("one field", {"a": dataclasses.field()}),
    ("compare=False", {"a": dataclasses.field(), "b": dataclasses.field(compare=False)}),
    ("repr=False", {"a": dataclasses.field(repr=False), "b": dataclasses.field()}),
    ("hash=False", {"a": dataclasses.field(hash=False), "b": dataclasses.field()}),
    ("hash=True, compare=False", {"a": dataclasses.field(hash=True, compare=False), "b": dataclasses.field()}),
    ("every field left out", {"a": dataclasses.field(compare=False, repr=False)}),
]


@pytest.mark.parametrize("frozen", [True, False])
@pytest.mark.parametrize(("label", "spec"), SPECS, ids=[s[0] for s in SPECS])
def test_field_options_behave_as_generated(label, spec, frozen):
    fields = [(name, Any, f) for name, f in spec.items()]
    ours = dataclasses.make_dataclass("Thing", fields, bases=(Frozen if frozen else Record,), frozen=frozen,
                                      eq=False, repr=False)
    theirs = dataclasses.make_dataclass("Thing", [(n, t, dataclasses.field(repr=f.repr, hash=f.hash,
                                                                           compare=f.compare)) for n, t, f in fields],
                                        frozen=frozen)
    assert_same(ours, theirs)


def test_subclasses_kw_only_and_class_variables_behave_as_generated():
    @dataclasses.dataclass(frozen=True, eq=False, repr=False)
    class Base(Frozen):
        a: int
        b: str = "b"
        kind: ClassVar[str] = "not a field"

    @dataclasses.dataclass(frozen=True, eq=False, repr=False, kw_only=True)
    class Child(Base):
        c: int = dataclasses.field(default=0, compare=False)

    @dataclasses.dataclass(frozen=True)
    class GenBase:
        a: int
        b: str = "b"
        kind: ClassVar[str] = "not a field"

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class GenChild(GenBase):
        c: int = dataclasses.field(default=0, compare=False)

    Child.__qualname__ = GenChild.__qualname__
    assert_same(Child, GenChild)
    assert repr(Child(1, c=2)) == repr(GenChild(1, c=2)) and repr(Child(1, c=2)).endswith("(a=1, b='b', c=2)")
    assert Child(1, c=2) == Child(1, c=3) and hash(Child(1, c=2)) == hash(Child(1, c=3)) == hash((1, "b"))
    assert Base(1) != Child(1) and GenBase(1) != GenChild(1)  # another class is never equal, as generated
    with pytest.raises(dataclasses.FrozenInstanceError):
        Child(1).a = 2  # type: ignore[misc]

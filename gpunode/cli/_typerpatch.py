"""Two small workarounds for what typer costs at start-up, each measured (benchmarks/imports.py, docs/benchmarks.md)
and each a no-op where typer's internals are not the ones described (tests/cli/test_typerpatch.py checks both
against typer's own behaviour). Neither changes what a user sees.

1. `typer.rich_utils` (every rich --help) imports `rich.markdown` (markdown_it, ~40% of `gpunode --help`'s
   imports) and `rich.traceback` (rich.pretty, rich.syntax, pygments) at its top level. It uses Markdown only in
   rich_markup_mode="markdown", which gpunode never sets, and Traceback only to print an uncaught exception.
   `import_rich_help()` imports typer.rich_utils with stand-ins for the two classes that import the real one when
   first used; the real modules stay importable as usual (the stand-ins are never left in sys.modules).
2. typer (>= 0.2x) coerces every parameter through a pydantic TypeAdapter, built when the parameter's first value
   is processed; defaults and absent options (None) included. So any command, even one given no option, imports
   pydantic and builds an adapter per parameter (~0.1 s). `defer_coercion(command)` gives each parameter a
   coercion that answers None (typer's own rule), a str for a str, an int for an int, a float for a float, a list
   of str for a list[str], and a plain decimal string ("8", "2.5") for an unconstrained int or float itself: the
   values typer's adapter returns the same. Anything else (a path, a choice, a signed or odd number, a bad value
   and its error message) goes to typer's own adapter, built then.
"""

from __future__ import annotations

import importlib
import re
import sys
import types
from dataclasses import dataclass
from typing import Any

# the plain decimal numbers whose value no parser can read differently; the rest (signs, exponents, "1_000",
# spaces, leading zeros) goes to typer's adapter
_NUMBER = {int: re.compile(r"0|[1-9][0-9]{0,17}"), float: re.compile(r"(0|[1-9][0-9]{0,14})(\.[0-9]{1,15})?")}
_LATER = {"rich.markdown": "Markdown", "rich.traceback": "Traceback"}


class _Later(type):
    """A class that stands for `module.name` and imports it on first use (a call or an attribute)."""

    _where: tuple[str, str]

    def real(cls) -> Any:
        module, name = cls._where
        return getattr(importlib.import_module(module), name)

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return cls.real()(*args, **kwargs)

    def __getattr__(cls, name: str) -> Any:  # Traceback.from_exception
        return getattr(cls.real(), name)

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, cls.real())


def import_rich_help(target: str = "typer.rich_utils") -> types.ModuleType:
    """typer.rich_utils, imported without rich.markdown and rich.traceback (see the module docstring)."""
    if target in sys.modules:
        return sys.modules[target]
    placed = []
    for module, name in _LATER.items():
        if module not in sys.modules:
            stand_in = types.ModuleType(module)
            setattr(stand_in, name, _Later(name, (), {"_where": (module, name)}))
            sys.modules[module] = stand_in
            placed.append(module)
    try:
        return importlib.import_module(target)
    except ImportError:  # a typer that wants more of them than the two classes: its own import, as it is
        sys.modules.pop(target, None)
        for module in placed:
            del sys.modules[module]
        placed.clear()
        return importlib.import_module(target)
    finally:
        for module in placed:
            del sys.modules[module]


_TyperParameter: Any = None
try:  # typer's pydantic coercion (typer >= 0.2x); older typers coerce through click's types: nothing to defer
    from typer._coercion import RuntimeParam, TypeDescriptor, build_runtime_param
    from typer.core import _TyperParameter
except ImportError:  # pragma: no cover - depends on the installed typer
    pass


if _TyperParameter is not None:
    @dataclass(frozen=True)
    class _Deferred(RuntimeParam):
        """Coerces the values typer's adapter would return unchanged; builds that adapter for anything else.
        RuntimeParam.coerce answers None and refuses a bare string for a list before it calls this."""

        descriptor: TypeDescriptor

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            info, annotation = self.parameter_info, self.annotation
            if self.descriptor.file_annotation is None and info.parser is None and (
                    annotation is str or info.min is None and info.max is None):
                if annotation in (str, int, float) and type(value) is annotation:
                    return value
                if annotation in (int, float) and type(value) is str and _NUMBER[annotation].fullmatch(value):
                    return annotation(value)
                if annotation == list[str] and isinstance(value, (list, tuple)) and \
                        all(type(item) is str for item in value):
                    return list(value)
            real = build_runtime_param(self.descriptor)
            param._runtime_param = real  # from now on typer's own
            return real._coerce_value(value, param=param, ctx=ctx)


def defer_coercion(command: Any) -> Any:
    """Give each typer parameter of `command` (and of its subcommands) the deferred coercion; returns `command`."""
    if _TyperParameter is None:  # pragma: no cover
        return command
    for param in getattr(command, "params", ()):
        if isinstance(param, _TyperParameter) and getattr(param, "_runtime_param", "") is None:
            desc: Any = getattr(param, "type_descriptor", None)
            info = getattr(desc, "parameter_info", None)
            if not all(hasattr(info, a) for a in ("parser", "min", "max")) or not hasattr(desc, "file_annotation"):
                continue  # not the typer this was written for (0.29): its own coercion
            param._runtime_param = _Deferred(parameter_info=desc.parameter_info, annotation=desc.annotation,
                                             descriptor=desc)
    return command

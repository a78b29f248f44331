"""Fixes as data: what to do about a problem, in parts a front door renders for its users.

A fix is prose with commands in it. A command is a gpunode command with its options (`Gpunode`: the CLI prints
`gpunode install --host gpu-01 --only toolkit`, Ansible prints the module arguments that do the same, the library
gives the options as data), a command line to run ON THE NODE (`OnNode`: the CLI wraps it in `ssh ... '...'` for a
remote node), or a command line run where the user is (`Here`: kubectl against the cluster). Everything else is
words for a person (a manual action).

`Fix` is also the plain text of the fix (a `str`), so every report, JSON document and test that reads a fix as
text keeps working; the renderers (gpunode/cli/_target.py, the Ansible bridge) read its parts. Fixes are joined
with `+` (which keeps the parts), never with f-strings (which would keep only the text).

Nothing outside the renderers and this module spells `gpunode <command>`, and no `sudo ...` is bare text
(tests/test_fixes.py scans the source). A fix that is a plain `str` is words: no renderer guesses commands in it.
explain's tables say where each command runs (their `runs` column, read by from_row).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from gpunode.record import Frozen

if TYPE_CHECKING:
    from gpunode.options import Options

NODE_COMMANDS = ("plan", "install", "doctor", "verify", "status", "facts", "uninstall")  # they take --host


@dataclass(frozen=True, eq=False, repr=False)
class Gpunode(Frozen):
    """`gpunode <command>` with its options: (name, value) pairs, a name being the option table's (gpunode/options.py)
    or, for a command's own option, its long name with `_` for `-` (compat's `gpu` is --gpu). True is a flag;
    a list or tuple repeats the option; None leaves it out, and so does False unless the option has a --no- form
    (--no-hold-kernel)."""

    command: str
    options: tuple[tuple[str, Any], ...] = ()

    def option_words(self) -> list[str]:
        words: list[str] = []
        for name, value in self.options:
            flag = flag_of(name, value)
            if value is None or (value is False and not flag.startswith("--no-")):
                continue
            if isinstance(value, bool):
                words.append(flag)
            elif isinstance(value, (list, tuple)):
                for item in value:
                    words += [flag, str(item)]
            elif isinstance(value, Verbatim):
                words += [flag, value]
            else:
                words += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
        return words

    def text(self, node_args: Iterable[str] = ()) -> str:
        """The command line; `node_args` (how to reach the node, e.g. --host gpu-01) right after the command."""
        reach = list(node_args) if self.command in NODE_COMMANDS else []
        return " ".join(w if isinstance(w, Verbatim) else shlex.quote(w)
                        for w in ["gpunode", self.command, *reach, *self.option_words()])


@dataclass(frozen=True, eq=False, repr=False)
class OnNode(Frozen):
    """A command line run on the node (as the user there). `into`: piped into a gpunode command run HERE
    (`sudo dmesg | gpunode explain`)."""

    command: str
    into: Gpunode | None = None

    def text(self, wrap: Callable[[str], str] = lambda c: c, render: Callable[[Gpunode], str] | None = None) -> str:
        there = wrap(self.command)
        if self.into is None:
            return there
        return there + " | " + (render(self.into) if render else self.into.text())


@dataclass(frozen=True, eq=False, repr=False)
class Here(Frozen):
    """A command line run where the user is (the machine gpunode runs on, Ansible's controller), not on the node:
    `kubectl` against the cluster, a look at a Dockerfile where the image is built."""

    command: str

    def text(self) -> str:
        return self.command


class Verbatim(str):
    """An option value printed as it is, unquoted: a data table's `<placeholder>` the user fills in (`gpunode
    install --driver <a newer branch>`)."""


@dataclass(frozen=True, eq=False, repr=False)
class Output(Frozen):
    """The output of the commands that failed, where the front door shows it: above, in a terminal; in the task
    result's `output`, in Ansible."""

    def text(self) -> str:
        return "see the output above"


Part = str | Gpunode | OnNode | Here | Output

# where a command in a data table runs (the `runs` column of data/explain_detectors.csv, installer_failures.csv)
RUNS = ("node", "controller", "manual")


def flag_of(name: str, value: Any = True) -> str:
    """The command line's spelling of an option: the table's flag (the --no- form for a tri-state False), else
    the name with dashes."""
    from gpunode import options as table  # this module is imported by the connection: keep it light

    row = next((o for o in table.option_table() if o.name == name), None)
    if row is None:
        return "--" + name.replace("_", "-")
    on, _, off = row.flag.partition("/")
    return off if value is False and off else on


def plain(part: Part) -> str:
    if isinstance(part, str):
        return part
    return part.text()


class Fix(str):
    """A fix: its plain text, and its parts for the renderers."""

    parts: tuple[Part, ...]

    def __new__(cls, *parts: Part) -> Fix:
        flat: list[Part] = []
        for part in parts:
            flat.extend(part.parts if isinstance(part, Fix) else [part])
        merged: list[Part] = []
        for part in flat:  # adjacent words become one string part
            if isinstance(part, str) and merged and isinstance(merged[-1], str):
                merged[-1] = merged[-1] + str(part)
            elif part != "":
                merged.append(str(part) if isinstance(part, str) else part)
        self = super().__new__(cls, "".join(plain(p) for p in merged))
        self.parts = tuple(merged)
        return self

    def __add__(self, other: object) -> Fix:
        if not isinstance(other, str):
            return NotImplemented
        return Fix(self, other)

    def __radd__(self, other: object) -> Fix:
        if not isinstance(other, str):
            return NotImplemented
        return Fix(other, self)

    def render(self, gpunode: Callable[[Gpunode], str], node: Callable[[OnNode], str],
               output: Callable[[Output], str] = Output.text, prose: Callable[[str], str] = str,
               here: Callable[[Here], str] = Here.text) -> str:
        return "".join(prose(p) if isinstance(p, str) else gpunode(p) if isinstance(p, Gpunode) else
                       node(p) if isinstance(p, OnNode) else here(p) if isinstance(p, Here) else output(p)
                       for p in self.parts)

    def commands(self) -> list[Gpunode]:
        return [p for p in self.parts if isinstance(p, Gpunode)]

    def to_data(self) -> list[dict[str, Any]]:
        """The parts as JSON-able data, for a program acting on the fix (gpunode/api.py): {"words": text},
        {"gpunode": command, "options": {name: value}} (the option table's names, as api.request takes them),
        {"node": command line, "into": the gpunode command it is piped into, or None}, {"here": command line},
        {"output": true}."""
        def command(part: Gpunode) -> dict[str, Any]:
            options: dict[str, Any] = {}
            for name, value in part.options:
                if name in options and isinstance(options[name], list):
                    options[name] = [*options[name], *(value if isinstance(value, (list, tuple)) else [value])]
                elif name in options:
                    options[name] = [options[name], *(value if isinstance(value, (list, tuple)) else [value])]
                else:
                    options[name] = list(value) if isinstance(value, tuple) else value
            return {"gpunode": part.command, "options": options}

        return [{"words": p} if isinstance(p, str) else command(p) if isinstance(p, Gpunode) else
                {"node": p.command, "into": command(p.into) if p.into else None} if isinstance(p, OnNode) else
                {"here": p.command} if isinstance(p, Here) else {"output": True} for p in self.parts]


def gpunode(command: str, **options: Any) -> Fix:
    """A fix that is one gpunode command: gpunode("install", only="toolkit")."""
    return Fix(Gpunode(command, tuple(options.items())))


def on_node(command: str, into: Gpunode | Fix | None = None, note: str | None = None) -> Fix:
    """A fix that is one command run on the node (`note`: words for the person after it, `  # note`)."""
    target = into.commands()[0] if isinstance(into, Fix) else into
    fix = Fix(OnNode(command, target))
    return fix if note is None else fix + "  # " + note


def runs(fix: str) -> str:
    """Where a fix's first command runs (RUNS): node, controller (a gpunode command, or Here), or manual (words)."""
    first = next((p for p in getattr(fix, "parts", ()) if not isinstance(p, str)), None)
    return "node" if isinstance(first, OnNode) else "controller" if isinstance(first, (Gpunode, Here)) else "manual"


def here(command: str, note: str | None = None) -> Fix:
    """A fix that is one command run where the user is, not on the node (kubectl against the cluster)."""
    fix = Fix(Here(command))
    return fix if note is None else fix + "  # " + note


def from_row(text: str, runs: str | None) -> str:
    """A data table's fix as data: `runs` says where its command runs (RUNS; None: a gpunode command where the text
    is one, else words for a person). The command is the text up to a `  # comment`; a few words ending in `: `
    may come before it (`without a reboot: sudo ...`, `nvidia-docker 1.x is deprecated: gpunode install ...`)."""
    if runs is None or runs == "manual":
        return from_text(text)
    parsed = from_text(text)
    if isinstance(parsed, Fix):  # a gpunode command (or a node command piped into one) is where it says
        return parsed
    lead = _LEAD.match(text)  # `without a reboot: sudo ...`, `Ubuntu: sudo ...`: words, then the command
    words, text = (lead.group(0), text[lead.end():]) if lead else ("", text)
    parsed = from_text(text)
    if isinstance(parsed, Fix):
        return words + parsed
    command, sep, comment = text.partition("  #")
    part = OnNode(command) if runs == "node" else Here(command)
    return words + Fix(part) + sep + comment


_LEAD = re.compile(r"(?!sudo )[A-Za-z][A-Za-z0-9 ,.()/-]{0,40}: (?=\S)")


def from_text(text: str) -> str:
    """A data table's fix (data/*.csv) as data where it is a gpunode command (up to a `  # comment`): the same text
    as a Fix, or the text as it is when it is anything else. Only an exact round trip is accepted."""
    command, sep, comment = text.partition("  #")
    there, pipe, here = command.partition(" | gpunode ")
    if pipe:  # `sudo dmesg | gpunode explain`: the node's output into gpunode here
        into = from_text("gpunode " + here)
        return Fix(OnNode(there, into.commands()[0])) + sep + comment if isinstance(into, Fix) else text
    held = _PLACEHOLDER.findall(command)  # `<a newer branch>`: one word, printed as it is
    try:
        words = [held[int(w[len(_HELD):])] if w.startswith(_HELD) else w
                 for w in shlex.split(_PLACEHOLDER.sub(lambda m: f"{_HELD}{held.index(m.group(0))}", command))]
    except (ValueError, IndexError):
        return text
    if len(words) < 2 or words[0] != "gpunode" or words[1].startswith("-"):
        return text
    from gpunode import options as table

    flags = {}
    for row in table.option_table():
        on, _, off = row.flag.partition("/")
        flags[on] = (row.name, True if row.type == "bool" else None)
        if off:
            flags[off] = (row.name, False)
    given: list[tuple[str, Any]] = []
    rest = words[2:]
    while rest:
        word = rest.pop(0)
        if not word.startswith("--"):
            return text
        name, fixed = flags.get(word, (word[2:].replace("-", "_"), None))
        if fixed is None and rest and not rest[0].startswith("--"):
            value = rest.pop(0)
            given.append((name, Verbatim(value) if value in held else value))
        else:
            given.append((name, True if fixed is None else fixed))
    parsed = Fix(Gpunode(words[1], tuple(given)))
    # the same words (a %(placeholder)s value is quoted until it is filled in), nothing after the last one
    same = parsed == command or ("%(" in command and shlex.split(parsed) == words and command == command.rstrip())
    return parsed + sep + comment if same else text


_PLACEHOLDER = re.compile(r"<[^<>]+>")
_HELD = "\x00held"


def fill(text: str, values: Callable[[str], str]) -> str:
    """`text` with `values` applied to its words (a data table's %(name)s placeholders), parts kept."""
    if not isinstance(text, Fix):
        return values(text)
    def part(p: Part) -> Part:
        if isinstance(p, str):
            return values(p)
        if isinstance(p, Gpunode):
            return Gpunode(p.command, tuple((n, values(v) if isinstance(v, str) and not isinstance(v, Verbatim)
                                             else v) for n, v in p.options))
        if isinstance(p, OnNode):
            return OnNode(values(p.command), p.into)
        if isinstance(p, Here):
            return Here(values(p.command))
        return p

    return Fix(*(part(p) for p in text.parts))


def join(*parts: Part | Fix) -> Fix:
    return Fix(*parts)


def join_with(separator: str, items: Iterable[str]) -> Fix:
    """`separator.join(items)` that keeps the items' parts (str.join keeps only their text)."""
    return Fix(*[part for i, item in enumerate(items) for part in ((separator,) if i else ()) + (item,)])


def same_run(opts: Options, command: str = "install", **changes: Any) -> Fix:
    """The gpunode command of this run again, with every pipeline option the user gave that the node's plan can
    read back from Options (the driver's, day 2's, the runtime's), and `changes` on top (e.g. stop_gpu_services=True):
    a follow-up that drops nothing the user asked for."""
    from gpunode import options as table

    given: list[tuple[str, Any]] = []
    for name in _AGAIN:
        row = next(o for o in table.option_table() if o.name == name)
        value = changes.pop(name) if name in changes else getattr(opts, name, row.default)
        if value != row.default and value not in ((), []):
            given.append((name, value))
    return Fix(Gpunode(command, (*given, *changes.items())))


def with_options(fix: Fix, **changes: Any) -> Fix:
    """`fix` with `changes` set on every gpunode command in it, each replacing the option the command gave (a value
    known only when the command's action runs, e.g. a version the node's repositories turned out to offer)."""
    return Fix(*(replace(p, options=(*[(n, v) for n, v in p.options if n not in changes], *changes.items()))
                 if isinstance(p, Gpunode) else p for p in fix.parts))


# what `same_run` repeats, in the order it spells them: the options a step's plan reads from Options as given
# (cache_dir and toolkit_packages are resolved to paths, and only/skip are not Options: they are not repeated)
_AGAIN = ("driver", "driver_source", "driver_run", "sha256", "kernel_module", "module_signing_key", "module_signing_cert",
          "toolkit_version", "set_as_default", "k8s", "engines", "kubeconfig", "gpu_replicas", "mps",
          "mps_thread_percentage", "mig_layout", "hold_kernel", "hold_driver", "stop_gpu_services")


# after an interrupted or aborted run (gpunode/cancel.py, the runner, the SSH connection)
CHECK_AND_RERUN = Fix("check the node (", Gpunode("status"), "), then run the same command again")
# a step that did not converge: what its commands printed says why
SEE_OUTPUT_RERUN = Fix(Output(), "; fix the cause, then run the same command again")

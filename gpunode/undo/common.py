"""The undo rules every step shares (pure): files, packages, units. docs/day2.md "## Uninstall" states them.

- a file gpunode created whose content is still what gpunode wrote: removed;
- a file gpunode replaced, still with gpunode's content: its backup (the user's file) moved back;
- a file changed since gpunode wrote it: left as it is (a step may instead remove only gpunode's entries: `strip`);
- packages gpunode's transactions installed (they were not there before): removed; others are never touched;
- units gpunode enabled that were not enabled before: disabled (and stopped).
"""

from __future__ import annotations

from collections.abc import Callable

from gpunode import pkgmgr
from gpunode.actions.packages import package_command
from gpunode.plan import Action, RunCommand
from gpunode.records import FileRecord, HoldRecord, PackagesRecord, UnitRecord
from gpunode.undo.actions import RemoveFile, RestoreFile, StripEntries
from gpunode.undo.state import MARKER, NodeState, Record, UndoRequest

Strip = Callable[[str, str | None], str | None]  # (text now, the user's text before gpunode or None) -> the text
# without gpunode's entries; None: it cannot be read, so it cannot be edited key by key


def file_actions(records: list[Record], state: NodeState, strip: dict[str, Strip] | None = None,
                 restart: dict[str, str] | None = None, hints: dict[str, str] | None = None,
                 exact: Callable[[str, str], bool] | None = None) -> tuple[list[Action], list[str]]:
    """Per path gpunode wrote (most recent first): what undoing it takes, and notes for what it leaves.
    `exact(path, text)`: whether a key-by-key rewrite of that text keeps everything but gpunode's entries (and
    the layout)."""
    strip, restart = strip or {}, restart or {}
    by_path: dict[str, list[FileRecord]] = {}
    for r in records:
        if isinstance(r, FileRecord):
            by_path.setdefault(r.path, []).append(r)
    actions: list[Action] = []
    notes: list[str] = []
    for path in reversed(list(by_path)):
        recs = by_path[path]
        first, last = recs[0], recs[-1]
        backups = [r.backup for r in recs if r.backup]
        original = first.backup if first.existed and first.backup else None
        leftovers = tuple(b for b in backups if b != original and state.files.get(b, "-") != "-")
        current = state.files.get(path)
        unit = restart.get(path, "")
        if first.marker:  # an old journal: only a file that still says gpunode wrote it
            text = state.texts.get(path)
            if current not in (None, "-") and text is not None and MARKER in text:
                actions.append(RemoveFile(f"remove {path} (it carries gpunode's marker)", path=path, before=text))
            continue
        if current is None:
            notes.append(f"{path}: could not be read; left as it is")
            continue
        if first.existed is None:
            notes.append(f"{path}: the journal does not say whether it existed before gpunode; left as it is")
            continue
        if current == "-":
            if first.existed:
                notes.append(f"{path} was deleted since gpunode changed it; left so (its backup: {original})")
            continue
        ours = bool(last.sha256) and current == last.sha256
        if ours and not first.existed:
            actions.append(RemoveFile(f"remove {path} (gpunode created it)", path=path, before=state.texts.get(path),
                                      leftovers=leftovers, restart=unit))
        elif ours and original and state.files.get(original, "-") != "-":
            actions.append(RestoreFile(f"restore {path} from the copy made before gpunode changed it", path=path,
                                       backup=original, before=state.texts.get(path), after=state.texts.get(original),
                                       leftovers=leftovers, restart=unit))
        elif ours:
            notes.append(f"{path}: the backup made before gpunode changed it ({original}) is gone; left as it is")
        elif path in strip and state.texts.get(path) is not None:
            text = state.texts[path] or ""
            stripped = strip[path](text, state.texts.get(original) if original else None)
            if stripped is None:
                notes.append(f"{path} changed since gpunode wrote it and cannot be parsed, so gpunode's entries "
                              "cannot be removed key by key: left as it is. Fix: " + (hints or {}).get(
                                  path, "remove gpunode's entries by hand"))
            elif stripped != text or leftovers or (original and state.files.get(original, "-") != "-"):
                copies = tuple(b for b in dict.fromkeys(backups) if state.files.get(b, "-") != "-")
                keep = exact is None or not exact(path, text)
                actions.append(StripEntries(f"remove only gpunode's entries from {path} (changed since)"
                                            + (f" and gpunode's copies of it ({', '.join(copies)})" if copies else ""),
                                            path=path, before=text, after=stripped, removes=copies, keep_copy=keep))
                if keep:
                    notes.append(f"{path}: rewritten without gpunode's entries, which does not keep everything in it "
                                 "(comments): a copy of it as it is now is kept beside it (.gpunode-bak.TIME)")
        elif first.existed and (not original or state.files.get(original, "-") == "-"):
            continue  # put back already (the backup moved over it), or never backed up: nothing to do
        else:
            notes.append(f"{path} changed since gpunode wrote it: left as it is (never clobbered)")
    return actions, notes


def installed_by_gpunode(records: list[Record], state: NodeState) -> tuple[str, list[str], list[str]]:
    """(manager, the packages gpunode installed that are still installed, notes)."""
    manager, names, notes = "", list[str](), list[str]()
    for r in records:
        if not isinstance(r, PackagesRecord):
            continue
        manager = r.manager or manager
        if r.unknown:
            notes.append("a package transaction could not be recorded (the node did not list its packages): "
                         "what it installed is kept")
        names += r.names
    if state.packages is None and names:
        return manager, [], [*notes, "the installed packages could not be listed: none removed"]
    return manager, [n for n in dict.fromkeys(names) if state.packages and n in state.packages], notes


def package_actions(records: list[Record], state: NodeState, request: UndoRequest, what: str
                    ) -> tuple[list[Action], list[str]]:
    manager, names, notes = installed_by_gpunode(records, state)
    if not names:
        return [], notes
    m = pkgmgr.get(manager)
    return [package_command(f"remove {what} gpunode installed: {', '.join(names)}", manager, m.remove(names),
                            packages=names, lock_timeout=request.lock_timeout)], notes


def unit_actions(records: list[Record], state: NodeState) -> tuple[list[Action], list[str]]:
    """Per unit, the first record says what it was before gpunode: not enabled -> disabled and stopped."""
    actions: list[Action] = []
    notes: list[str] = []
    first: dict[str, str] = {}
    for r in records:
        if isinstance(r, UnitRecord):
            first.setdefault(r.unit, r.was)
    for unit, was in first.items():
        if was in ("enabled", "static", "unknown"):
            if was == "unknown":
                notes.append(f"{unit}: its state before gpunode is unknown; left enabled")
            continue
        if state.units.get(unit) == "enabled":
            actions.append(RunCommand(f"disable and stop {unit} (gpunode enabled it)",
                                      ("systemctl", "disable", "--now", unit), timeout=120))
    return actions, notes


def stopped_units(actions: list[Action] | tuple[Action, ...]) -> tuple[str, ...]:
    """The units a plan's `systemctl disable --now` actions stop."""
    found: list[str] = []
    for a in actions:
        argv = a.cmd if isinstance(a, RunCommand) and isinstance(a.cmd, tuple) else ()
        if argv[:3] == ("systemctl", "disable", "--now"):
            found += [u if "." in u else f"{u}.service" for u in argv[3:]]
    return tuple(found)


def held_by_gpunode(records: list[Record], state: NodeState) -> tuple[str, list[str], list[str]]:
    """(manager, the holds gpunode placed that are still in place, notes)."""
    manager, names, notes = "", list[str](), list[str]()
    for r in records:
        if not isinstance(r, HoldRecord):
            continue
        manager = r.manager or manager
        if r.unknown:
            notes.append("a hold could not be recorded (the node did not list its holds): it is kept")
        names += r.held
    if state.holds is None and names:
        return manager, [], [*notes, "the held packages could not be listed: no hold released"]
    return manager, [n for n in dict.fromkeys(names) if state.holds and n in state.holds], notes


def hold_actions(records: list[Record], state: NodeState, request: UndoRequest) -> tuple[list[Action], list[str]]:
    """Release the holds gpunode placed (apt-mark unhold, versionlock delete, zypper removelock): before any
    package goes (apt refuses to remove a held package), and also on a package gpunode did not install."""
    manager, names, notes = held_by_gpunode(records, state)
    if not names:
        return [], notes
    m = pkgmgr.get(manager)
    return [package_command(f"release the hold gpunode placed on {', '.join(names)}", manager, m.unhold(names),
                            packages=names, lock_timeout=request.lock_timeout, timeout=600)], notes

"""`nvidia-ctk runtime configure` for one container engine, with the files it is predicted to leave behind."""

from __future__ import annotations

from dataclasses import dataclass

from gpunode.actions.base import Action, Looks, WriteFile, command_line
from gpunode.connection.base import Connection
from gpunode.records import FileRecord, UndoRecord
from gpunode.shell import Script

# Copies each existing file next to itself before nvidia-ctk rewrites it (it drops comments). The suffix never
# matches *.json / *.toml / *.conf, so no engine reads the copy.
_BACKUP = Script(
    name="backup-files",
    body='stamp=$(date +%Y%m%dT%H%M%S); for f; do [ -f "$f" ] || continue; b="$f.gpunode-bak.$stamp"; '
         '[ ! -e "$b" ] || b="$b.$$"; cp -p -- "$f" "$b" && echo "$b"; done',
)


@dataclass(frozen=True, eq=False, repr=False)
class ConfigureRuntime(Action):
    engine: str = ""
    argv: tuple[str, ...] = ()
    files: tuple[tuple[str, str | None, str], ...] = ()  # (path, content now or None, predicted content)
    backups: tuple[str, ...] = ()  # existing files nvidia-ctk rewrites: copied aside first
    restart: str = ""  # the running engine's unit: it must restart to load the change (owed until it has)

    kind = "runtime-config"

    def deferred(self) -> tuple[tuple[str, str], ...]:
        return (("restart", self.restart),) if self.restart else ()

    def backup_script(self) -> Script:
        return Script(_BACKUP.body, self.backups, _BACKUP.name)

    def commands(self) -> list[str]:
        return [command_line(self.backup_script())] * bool(self.backups) + [command_line(self.argv)]

    def changed_files(self) -> tuple[tuple[str, str | None, str | None], ...]:
        return self.files  # nvidia-ctk's edits, predicted

    def diff(self) -> str:
        return "".join(WriteFile(path, path=path, before=before, after=after).diff() for path, before, after in self.files)

    def to_dict(self) -> dict[str, object]:
        return {**super().to_dict(), "engine": self.engine, "files": [f[0] for f in self.files],
                "diff": self.diff()}

    def apply(self, conn: Connection) -> str | None:
        return self.apply_recorded(conn)[0]

    def apply_recorded(self, conn: Connection) -> tuple[str | None, list[UndoRecord]]:
        """nvidia-ctk's edit, recorded per file for `gpunode uninstall`: whether it existed, its backup, the sha256
        of what nvidia-ctk left (read back: its output is only predicted)."""
        note, kept = None, []
        paths = [path for path, _, _ in self.files]
        looks = Looks(before=(("files", *paths),), after=(("files", *paths),)) if paths else Looks()
        if self.backups:
            result = looks.run(conn, self.backup_script(), sudo=True, timeout=60, last=False)
            kept = result.check(f"backing up {', '.join(self.backups)}").stdout.split()
            note = "backup: " + ", ".join(kept) if kept else None
        looks.run(conn, self.argv, sudo=True, timeout=180, first=not self.backups).check(self.summary)
        seen, seen_after = looks.answers()
        before, after = (seen[0], seen_after[0]) if paths else ({}, {})
        records: list[UndoRecord] = []
        for path in paths:
            backup = next((b for b in kept if b.startswith(path + ".gpunode-bak.")), None)
            was, now = (before or {}).get(path), (after or {}).get(path)
            records.append(FileRecord(path=path, existed=None if was is None else was != "-", backup=backup,
                                      sha256=now if now and now != "-" else None, engine=self.engine,
                                      restart=self.restart))
        return note, records

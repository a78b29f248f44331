"""Starting fabric manager and waiting until the NVLink fabric is programmed."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpunode import fixes
from gpunode.actions.base import Action, Looks, command_line
from gpunode.connection.base import Connection
from gpunode.errors import CommandError
from gpunode.records import UndoRecord, UnitRecord
from gpunode.shell import Script

POLL_SECONDS = 2.0

# The per-GPU `Fabric` blocks of `nvidia-smi -q`.
FABRIC_STATE = Script(
    name="fabric-state",
    body="nvidia-smi -q 2>/dev/null | awk '/^GPU /{print; next} /^    Fabric *$/{f=1; print; next} "
         "f && /^        /{print; next} {f=0}'",
)
_LOG_TAIL = Script(name="fabricmanager-log", body='tail -n 15 "$1" 2>/dev/null; true')

Unsettled = Callable[[str], list[str]]  # FABRIC_STATE output -> the GPUs not programmed yet, described


def _none_unsettled(text: str) -> list[str]:
    return []


@dataclass(frozen=True, eq=False, repr=False)
class StartFabricManager(Action):
    """Enable and (re)start the service, then wait for the fabric to be programmed: the GPUs report state
    "Completed" once fabric manager is done, or the reason it failed. A failing start brings the log along."""

    service: str = "nvidia-fabricmanager"
    log: str = "/var/log/fabricmanager.log"
    wait: float = 180.0
    unsettled: Unsettled = field(default=_none_unsettled, compare=False, repr=False)  # the step's reading

    kind = "service"

    def commands(self) -> list[str]:
        return [command_line(("systemctl", "enable", self.service)),
                command_line(("systemctl", "restart", self.service))]

    def details(self) -> list[str]:
        return [f"wait up to {self.wait:.0f}s for every GPU's fabric state to be Completed (nvidia-smi -q)"]

    def to_dict(self) -> dict[str, object]:
        return {**super().to_dict(), "unit": f"{self.service}.service"}

    def settles(self) -> tuple[tuple[str, str], ...]:
        """A start owed since a driver upgrade stopped fabric manager (gpunode/actions/driver.py)."""
        return (("start", f"{self.service}.service"),)

    def apply(self, conn: Connection) -> str | None:
        return self._apply(conn, Looks())

    def _apply(self, conn: Connection, looks: Looks) -> str | None:
        """apply(), with `looks` riding in the `systemctl enable` command."""
        service = self.service
        looks.run(conn, ("systemctl", "enable", service), sudo=True, timeout=120).check(f"enabling {service}")
        result = conn.run(("systemctl", "restart", service), sudo=True, timeout=300)
        if not result.ok:
            log = conn.run(Script(_LOG_TAIL.body, (self.log,), _LOG_TAIL.name), sudo=True, timeout=60).stdout.strip()
            raise CommandError(f"{service} did not start" + (f"; {self.log} says:\n{log}" if log else ""),
                               fix="the fabric manager version must equal the loaded driver's exactly; check `"
                                   + fixes.on_node(f"journalctl -u {service}") + "`")
        deadline = time.monotonic() + self.wait
        while True:
            stuck = self.unsettled(conn.run(FABRIC_STATE, sudo=True, timeout=120).stdout)
            if not stuck or time.monotonic() >= deadline:
                break
            time.sleep(POLL_SECONDS)
        if stuck:
            raise CommandError(f"{service} runs, but the fabric is not ready: " + "; ".join(stuck[:4]),
                               fix=f"look at {self.log} and `" + fixes.on_node("nvidia-smi -q") + "` (Fabric section)")
        return None

    def apply_recorded(self, conn: Connection) -> tuple[str | None, list[UndoRecord]]:
        """For `gpunode uninstall`: whether the unit was enabled before gpunode enabled it (not enabled before:
        uninstall disables and stops it)."""
        unit = f"{self.service}.service"
        looks = Looks(before=(("units", unit),))
        note = self._apply(conn, looks)
        before = looks.answers()[0][0]
        return note, [UnitRecord(unit=unit, was=(before or {}).get(unit, "unknown"))]

"""What the user asked for, as one immutable value every step's plan reads."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Options:
    driver: str | None = None  # requested driver version, e.g. 535.129.03
    reboot: bool = False  # may gpunode reboot the node when a step needs it
    reboot_timeout: float = 900.0
    max_reboots: int = 2

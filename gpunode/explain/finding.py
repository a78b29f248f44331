"""What explain returns (`Finding`) and what its detectors read (`Doc`: the normalised text)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from gpunode.record import Frozen, Record


@dataclass(frozen=True, eq=False, repr=False)
class Finding(Frozen):
    id: str  # stable: "nvml.mismatch", "xid.79"
    title: str  # one line
    cause: str  # why it happens, for this text
    fix: str  # the command to run first (a gpunode or shell command)
    excerpt: str  # the line(s) that proved it, as normalised (a refined finding: the headline and the decisive line)
    values: dict[str, Any] = field(default_factory=dict)  # what was read out of the text (versions, PCI, ...)
    also: tuple[str, ...] = ()  # further commands or checks, in order
    strength: int = field(default=50, compare=False)  # how surely the text shows this cause (ranking)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "cause": self.cause, "fix": self.fix, "also": list(self.also),
                "excerpt": self.excerpt, "values": self.values}


@dataclass(eq=False, repr=False)
class Doc(Record):
    text: str  # normalised

    def excerpt(self, start: int, end: int, limit: int = 320) -> str:
        """The logical line holding text[start:end], cut around the match when long."""
        line_start = self.text.rfind("\n", 0, start) + 1
        line_end = self.text.find("\n", end)
        line_end = len(self.text) if line_end < 0 else line_end
        if line_end - line_start <= limit:
            return self.text[line_start:line_end].strip()
        lo = max(line_start, start - 100)
        hi = min(line_end, max(end + 40, lo + limit))
        if end - start > limit:
            lo, hi = start, start + limit
        text = self.text[lo:hi].strip().replace("\n", " ")
        return ("…" if lo > line_start else "") + text + ("…" if hi < line_end else "")

    def has(self, pattern: re.Pattern[str]) -> re.Match[str] | None:
        return pattern.search(self.text)

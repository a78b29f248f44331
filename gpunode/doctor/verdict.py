"""The readiness verdict: ONE function turns a node's check results into "ready or not, reboot or not, why", and
every format a scheduler reads is rendered from that one value, so they cannot disagree:

- nhc: Slurm NHC-style, one drain-reason line (`ERROR: gpunode: HOST: CHECK: REASON`) and the exit code;
- k8s: a readiness document (the readiness file exists only while the node is ready) and a kured-style reboot
  marker (exists only while a reboot is required);
- prometheus: node_exporter textfile-collector metrics;
- json: the `doctor --json` document with a `readiness` block.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpunode import __version__
from gpunode.doctor.base import STATUSES, CheckResult, Node
from gpunode.facts import Facts
from gpunode.facts.gpuhealth import REBOOT_FLAG
from gpunode.record import Frozen

FORMATS = ("table", "json", "nhc", "k8s", "prometheus")
MARKER_HEADER = "gpunode: reboot required"  # first line of the marker gpunode writes (and the only one it removes)
READY_MARK = '"gpunode_version"'  # in every readiness document gpunode writes
_REASON_MAX = 200


@dataclass(frozen=True, eq=False, repr=False)
class Readiness(Frozen):
    host: str
    ready: bool  # no check failed
    reboot_required: bool
    failing: tuple[CheckResult, ...]  # failed checks, in layer order (the first is the likeliest root cause)
    reboot_because: tuple[str, ...]  # check ids (or "node: /var/run/reboot-required") that a reboot clears
    results: tuple[CheckResult, ...]
    xid_counts: dict[int, int] = field(default_factory=dict)  # Xid number -> occurrences since boot

    @property
    def reason(self) -> str | None:
        """One line: the first failing check and its evidence (and how many more fail)."""
        if not self.failing:
            return None
        first = self.failing[0]
        more = f" (+{len(self.failing) - 1} more)" if len(self.failing) > 1 else ""
        return f"{first.id}: {_one_line(first.evidence)}"[:_REASON_MAX] + more


def _one_line(text: str) -> str:
    return " ".join(text.split())


def readiness(host: str, facts: Facts, results: Sequence[CheckResult]) -> Readiness:
    """The verdict. Ready: no check failed (warnings do not drain a node). Reboot required: a warned or failed
    check says a reboot (or GPU reset) clears it, or the node's own package scripts asked for one."""
    failing = tuple(r for r in results if r.status == "fail")
    because = [r.id for r in results if r.reboot and r.status in ("warn", "fail")]
    if facts.get(REBOOT_FLAG) is not None:
        because.append("node: /var/run/reboot-required")
    counts: dict[int, int] = {}
    for finding in Node(facts).kernel_findings:
        xid = finding.values.get("xid")
        if finding.id.startswith("xid.") and isinstance(xid, int):
            counts[xid] = counts.get(xid, 0) + int(finding.values.get("count", 1))
    return Readiness(host, not failing, bool(because), failing, tuple(because), tuple(results), counts)


# ---- nhc ----------------------------------------------------------------------------------------------------

_NHC_UNSAFE = re.compile(r"[^\x20-\x7e]")


def nhc_line(verdict: Readiness) -> str | None:
    """`ERROR: gpunode: HOST: CHECK: REASON`, printable ASCII on one line (Slurm shows it as the drain reason);
    None when the node is ready."""
    if verdict.ready:
        return None
    return _NHC_UNSAFE.sub("?", f"ERROR: gpunode: {verdict.host}: {verdict.reason}")


# ---- k8s readiness file and reboot marker --------------------------------------------------------------------


def readiness_document(verdict: Readiness) -> str:
    return json.dumps({
        "host": verdict.host, "ready": verdict.ready, "reboot_required": verdict.reboot_required,
        "reason": verdict.reason, "failing": [r.id for r in verdict.failing],
        "reboot_because": list(verdict.reboot_because), "gpunode_version": __version__,
    }, indent=2) + "\n"


def reboot_marker(verdict: Readiness) -> str | None:
    """The reboot-required marker's text (kured only looks at whether the file exists); None: no reboot needed."""
    if not verdict.reboot_required:
        return None
    return MARKER_HEADER + "\n" + "".join(f"{reason}\n" for reason in verdict.reboot_because)


# ---- prometheus ----------------------------------------------------------------------------------------------


def _label(value: str) -> str:
    """A label value escaped as the exposition format requires (backslash, double quote, newline)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus(verdict: Readiness, now: float) -> str:
    """node_exporter textfile-collector metrics. Metric names are fixed; node text only ever appears, escaped,
    in label values."""
    out = ["# HELP gpunode_node_ready 1 when no gpunode doctor check failed.", "# TYPE gpunode_node_ready gauge",
           f"gpunode_node_ready {int(verdict.ready)}",
           "# HELP gpunode_reboot_required 1 when a reboot (or GPU reset) would clear a finding.",
           "# TYPE gpunode_reboot_required gauge", f"gpunode_reboot_required {int(verdict.reboot_required)}",
           "# HELP gpunode_check_status 1 for the status (severity) a doctor check has now, 0 for the others.",
           "# TYPE gpunode_check_status gauge"]
    for r in verdict.results:
        for status in STATUSES:
            out.append(f'gpunode_check_status{{check="{_label(r.id)}",layer="{_label(r.layer)}",'
                       f'severity="{status}"}} {int(r.status == status)}')
    out += ["# HELP gpunode_xid_errors_total Xid errors in the kernel log since boot, by Xid number.",
            "# TYPE gpunode_xid_errors_total counter"]
    out += [f'gpunode_xid_errors_total{{xid="{xid}"}} {count}' for xid, count in sorted(verdict.xid_counts.items())]
    out += ["# HELP gpunode_doctor_last_run_timestamp_seconds When gpunode doctor wrote these metrics.",
            "# TYPE gpunode_doctor_last_run_timestamp_seconds gauge",
            f"gpunode_doctor_last_run_timestamp_seconds {now:.3f}"]
    return "\n".join(out) + "\n"


# ---- files on the machine where doctor runs -----------------------------------------------------------------


def write_atomic(path: str, text: str) -> None:
    """Write `text` to `path` by a temporary file in the same directory and a rename, so a reader (kubelet,
    kured, node_exporter) never sees half a file."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".gpunode-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def remove_if_ours(path: str, mark: str) -> bool:
    """Remove a file gpunode wrote (its text contains `mark`); a file someone else wrote (Ubuntu's own
    /var/run/reboot-required) stays. True when the file is gone."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read(65536)
    except FileNotFoundError:
        return True
    if mark in text:
        os.unlink(path)
        return True
    return False

"""Xid (GPU) and SXid (NVSwitch) error lines: one finding per Xid number and GPU, counted, with the meaning and
the operator's action from data/xid.csv; the few Xids whose action depends on the line (94/95 containment, NVLink
fatal or not, 154's recovery action) are read here."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from gpunode import fixes
from gpunode.explain.finding import Doc, Finding
from gpunode.explain.tables import MACROS, compile_pattern, tables

Hit = tuple[int, int, Finding]  # strength, position, finding
XID_CATALOG_URL = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
_PCI = MACROS["@PCI@"]

# Severity: what a GPU operator has to do, from NVIDIA's Xid catalog "immediate action" (in gpunode's words).
#   info    nothing now (keep an eye on it)     app     restart the application; it caused or suffered the fault
#   reset   reset the GPU (drain it first)      reboot  reboot the node; the GPU is unreachable
#   hardware  check the hardware                 nvlink  NVLink error: severity depends on the line
SEVERITY_TEXT = {
    "info": "informational; no action needed now",
    "app": "the application's work was lost; restart it (the GPU is normally fine)",
    "reset": "reset the GPU before it runs work again",
    "reboot": "reboot the node; the GPU cannot be recovered otherwise",
    "hardware": "check the hardware",
    "nvlink": "NVLink error",
    "unknown": "not in gpunode's table",
}

# Ranking: an Xid that takes the GPU away outranks the consequences it causes elsewhere in the text.
STRENGTH = {"reboot": 89, "hardware": 87, "reset": 79, "unknown": 62, "nvlink": 62, "app": 58, "info": 40}
# An uncorrectable memory error is evidence about the GPU itself even when contained (its action is the
# application's): it ranks above the application faults of the same action.
MEMORY_ERRORS = frozenset({48, 63, 64, 92, 94, 95})

# Where a message's detail ends when several were run together on one line: the next timestamp.
_NEXT_STAMP = r"\[\s*[+-]?\d+\.\d+\]|\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)\s"
_XID = re.compile(rf"\bXid\s+\((?:PCI:)?(?P<pci>{_PCI})(?:\s+GPU-I:(?P<gi>\w+))?[^)]*\):\s*(?P<xid>\d+)\b"
                  rf",?\s*(?P<rest>(?:(?!\bNVRM:|\bXid\s+\(|{_NEXT_STAMP})[^\n])*)")  # up to the next message
_XID_PID = re.compile(r"^pid=(?P<pid>'[^']*'|[^,\s]*),\s*(?:name=(?P<name>[^,]*),\s*)?")
_RECOVERY = re.compile(r"changed from (?P<from>0x[0-9a-fA-F]+) \((?P<from_text>[^)]*)\) to (?P<to>0x[0-9a-fA-F]+) "
                       r"\((?P<to_text>[^)]*)\)", re.IGNORECASE)


def _reset_command(pci: str) -> str:
    address = pci if "." in pci else f"{pci}.0"
    return fixes.on_node(f"sudo nvidia-smi -r -i {address}")


_REBOOT = fixes.on_node("sudo reboot")
_BUG_REPORT = fixes.on_node("sudo nvidia-bug-report.sh")


def _xid_finding(xid: int, pci: str, lines: list[re.Match[str]], doc: Doc) -> Finding:
    first = lines[0]
    meaning, severity = tables()[1].get(xid, (f"Xid {xid} is not in gpunode's table; see NVIDIA's Xid catalog",
                                               "unknown"))
    rest = first["rest"].strip()
    values: dict[str, Any] = {"xid": xid, "pci": pci, "count": len(lines)}
    pids, names = [], []
    for line in lines:
        pm = _XID_PID.match(line["rest"].strip())
        if pm:
            pid = pm["pid"].strip("'")
            if pid and pid not in pids and pid != "<unknown>":
                pids.append(pid)
            name = (pm["name"] or "").strip()
            if name and name not in names and name != "<unknown>":
                names.append(name)
    detail = _XID_PID.sub("", rest)
    if pids:
        values["pids"] = pids
    if names:
        values["processes"] = names
    if first["gi"]:
        values["gpu_instance"] = first["gi"]
    values["detail"] = detail
    reset = _reset_command(pci)
    fix = {"info": fixes.on_node("sudo journalctl -k | grep -i xid") + "  # nothing to do now; watch whether it repeats",
           "app": "compute-sanitizer <program>  # after restarting the job, if the fault recurs",
           "reset": reset, "reboot": _REBOOT, "hardware": _BUG_REPORT, "unknown": _BUG_REPORT}.get(severity, reset)
    also: list[str] = []
    if xid in (94, 95):
        rst = re.search(r"\bRST:\s*(Yes|No)", rest, re.IGNORECASE)
        drst = re.search(r"\bD-RST:\s*(Yes|No)", rest, re.IGNORECASE)
        if rst:
            values["reset_required"] = rst[1].lower() == "yes"
            if values["reset_required"]:
                severity, fix = "reset", reset
        if drst:
            values["drain_and_reset"] = drst[1].lower() == "yes"
        if xid == 94 and severity == "app":
            fix = reset + "  # when the GPU is idle, after restarting the job: remaps the failing memory"
    elif severity == "nvlink":
        fatal = re.search(r"\b(Non-?fatal|Fatal)\b", rest, re.IGNORECASE)
        if fatal:
            values["fatal"] = fatal[1].lower() == "fatal"
            severity = "reset" if values["fatal"] else "info"
        else:
            severity = "reset"
        fix = reset if severity == "reset" else fixes.on_node("nvidia-smi nvlink -e -i " + (pci if "." in pci else
                                                                                           f"{pci}.0"))
    elif xid == 154:
        rm = _RECOVERY.search(rest)
        if rm:
            values["recovery_action"] = rm["to_text"]
            action = rm["to_text"].lower()
            if "reboot" in action:
                severity, fix = "reboot", _REBOOT
            elif "reset" in action or "flr" in action:
                severity, fix = "reset", reset
            elif "drain" in action:
                severity, fix = "reset", reset
    elif xid == 48:
        also.append(fixes.on_node("nvidia-smi -q -d ECC,ROW_REMAPPER,PAGE_RETIREMENT -i " + (pci if "." in pci else
                                                                                              f"{pci}.0")))
    elif xid == 63:
        fix = reset + "  # when the GPU is idle, to apply the remap"
        also.append(fixes.on_node("nvidia-smi -q -d ROW_REMAPPER -i " + (pci if "." in pci else f"{pci}.0")))
    elif xid == 79:
        also.append(_BUG_REPORT + "  # before rebooting")
    elif xid == 74:
        also.append(fixes.on_node("nvidia-smi nvlink -s -i " + (pci if "." in pci else f"{pci}.0")))
    elif xid == 54:
        fix = "power off and connect the GPU's auxiliary power cables"
    values["meaning"] = meaning
    values["severity"] = severity
    values["action"] = SEVERITY_TEXT[severity]
    if severity in ("reboot", "hardware", "unknown") or xid in (48, 64, 95, 119, 120):
        also.append("if it recurs on the same GPU: collect `" + _BUG_REPORT + "` and contact your hardware vendor")
    also.append(XID_CATALOG_URL)
    times = f" ({len(lines)} times)" if len(lines) > 1 else ""
    cause = f"Xid {xid} on GPU {pci}{times}: {meaning}. Action: {SEVERITY_TEXT[severity]}."
    strength = STRENGTH[severity] + (2 if xid in MEMORY_ERRORS else 0)
    return Finding(f"xid.{xid}", f"Xid {xid}: {meaning.split(':')[0]}", cause, fix,
                   doc.excerpt(first.start(), first.end()), values, tuple(also), strength)


def _xids(doc: Doc) -> Iterator[Hit]:
    groups: dict[tuple[int, str], list[re.Match[str]]] = {}
    for m in _XID.finditer(doc.text):
        groups.setdefault((int(m["xid"]), m["pci"].lower()), []).append(m)
    for (xid, pci), lines in groups.items():
        finding = _xid_finding(xid, pci, lines, doc)
        yield finding.strength, lines[0].start(), finding


_SXID = re.compile(rf"\bSXid\s+\(PCI:(?P<pci>{_PCI})\):\s*(?P<sxid>\d+),\s*(?P<sev>Non-fatal|Fatal)?,?\s*"
                   rf"(?P<rest>(?:(?!\bSXid\s+\(|\bnvidia-nvswitch\d|{_NEXT_STAMP})[^\n])*)", re.IGNORECASE)
_FM_SXID = compile_pattern(r"detected NVSwitch (?P<sev>non-fatal|fatal) error (?P<sxid>\d+) on fid \d+ on NVSwitch pci bus id "
               rf"(?P<pci>{_PCI})(?: physical id (?P<phys>\d+))?(?: port (?P<port>\d+))?")


def _sxids(doc: Doc) -> Iterator[Hit]:
    groups: dict[tuple[int, str], list[re.Match[str]]] = {}
    for pattern in (_SXID, _FM_SXID):
        for m in pattern.finditer(doc.text):
            groups.setdefault((int(m["sxid"]), m["pci"].lower()), []).append(m)
    for (sxid, pci), matches in groups.items():
        first = min(matches, key=lambda x: x.start())
        fatal = any((x["sev"] or "").lower() == "fatal" for x in matches)
        values: dict[str, Any] = {"sxid": sxid, "pci": pci, "count": len(matches), "fatal": fatal,
                                  "source": "fabricmanager" if first.re is _FM_SXID else "kernel"}
        if first.re is _FM_SXID:
            if first["port"]:
                values["port"] = int(first["port"])
            if first["phys"]:
                values["switch_physical_id"] = int(first["phys"])
        else:
            values["detail"] = first["rest"].strip()
            link = re.search(r"\bLink (\d+)", first["rest"])
            if link:
                values["port"] = int(link[1])
        if fatal:
            cause = (f"NVSwitch {pci} reported fatal error SXid {sxid}. The NVLink fabric through that switch is "
                     "down; the GPUs on it need a reset (in practice, a reboot) and fabric manager a restart.")
            fix = _REBOOT
        else:
            cause = (f"NVSwitch {pci} reported non-fatal error SXid {sxid}"
                     + (f" on port {values['port']}" if "port" in values else "")
                     + ". Work goes on; if the count keeps growing on the same port, have the NVLink/NVSwitch "
                     "hardware checked.")
            fix = fixes.on_node("nvidia-smi nvlink -e") + "  # NVLink error counters per GPU"
        times = f" ({len(matches)} times)" if len(matches) > 1 else ""
        strength = STRENGTH["reset"] if fatal else STRENGTH["info"]
        yield strength, first.start(), Finding(
            f"sxid.{sxid}", f"NVSwitch {'fatal' if fatal else 'non-fatal'} error SXid {sxid}{times}", cause, fix,
            doc.excerpt(first.start(), first.end()), values,
            (fixes.on_node("journalctl -u nvidia-fabricmanager -b"), _BUG_REPORT), strength)


# An Xid named in prose ("an Xid 79 error", "`Xid 48 / 171`: uncorrectable ECC"), without the kernel's line: weaker
# evidence (no GPU address, no detail), ranked below any log line and below the table rows that read such prose.
_XID_PROSE = re.compile(r"(?<![\w(])Xid(?:\s+error)?[\s:#]*(?P<xid>\d{1,3})\b(?!\s*\))", re.IGNORECASE)
PROSE_STRENGTH = 38


def _prose_xids(doc: Doc, logged: set[int]) -> Iterator[Hit]:
    seen: set[int] = set()
    for m in _XID_PROSE.finditer(doc.text):
        xid = int(m["xid"])
        if xid in logged or xid in seen:
            continue
        seen.add(xid)
        meaning, severity = tables()[1].get(xid, (f"Xid {xid} is not in gpunode's table; see NVIDIA's Xid catalog",
                                                   "unknown"))
        cause = (f"The text names Xid {xid} (there is no kernel log line with the GPU's address): {meaning}. "
                 f"Action: {SEVERITY_TEXT[severity]}.")
        values: dict[str, Any] = {"xid": xid, "meaning": meaning, "severity": severity,
                                  "action": SEVERITY_TEXT[severity], "from_prose": True}
        yield PROSE_STRENGTH, m.start(), Finding(
            f"xid.{xid}", f"Xid {xid}: {meaning.split(':')[0]}", cause, fixes.on_node("sudo dmesg -T | grep -E 'NVRM: Xid'"),
            doc.excerpt(m.start(), m.end()), values, (XID_CATALOG_URL,), PROSE_STRENGTH)


def findings(doc: Doc) -> list[Hit]:
    logged = [*_xids(doc)]
    return [*logged, *_prose_xids(doc, {int(hit[2].values["xid"]) for hit in logged}), *_sxids(doc)]

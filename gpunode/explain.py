"""Recognise error messages people paste (docker, nvidia-container-cli, nvidia-smi, nvidia-installer, the kernel
log, fabric manager, CUDA programs) and say what caused them and what to run.

Pure: no I/O. `normalise(text)` cleans a paste (ANSI escapes, prompts, markdown quoting and indentation, log
timestamps, curly quotes, wrapped lines); `explain(text)` returns one `Finding` per recognised problem, in the
order the problems appear in the text. Unknown text gives an empty list.

Finding ids are stable (scripts may match on them): `docker.no-gpu-driver`, `cuda.requirement`, `xid.79`, ...
`IDS` lists every fixed id; Xid and SXid findings are `xid.<N>` and `sxid.<N>`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

# ---------------------------------------------------------------------------------------------------------
# Findings
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    id: str  # stable: "nvml.mismatch", "xid.79"
    title: str  # one line
    cause: str  # why it happens, for this text
    fix: str  # the command to run first (a gpunode or shell command)
    excerpt: str  # the recognised text, as normalised
    values: dict[str, Any] = field(default_factory=dict)  # what was read out of the text (versions, PCI, ...)
    also: tuple[str, ...] = ()  # further commands or checks, in order

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "cause": self.cause, "fix": self.fix, "also": list(self.also),
                "excerpt": self.excerpt, "values": self.values}


IDS: tuple[str, ...] = (
    "docker.no-gpu-driver", "docker.unknown-runtime", "docker.toolkit-binary-missing",
    "cuda.requirement", "container.requirement", "cuda.insufficient-driver",
    "fabricmanager.802", "fabricmanager.version-mismatch", "fabricmanager.no-nvswitch",
    "nvml.mismatch", "nvml.unknown-error", "smi.no-driver", "smi.no-devices", "smi.device-handle",
    "driver.not-loaded", "lib.nvml-missing",
    "installer.nouveau", "installer.no-kernel-source", "installer.nvidia-ko-load", "installer.module-in-use",
    "installer.failed",
    "kernel.fallen-off-bus", "kernel.no-adapter-probed", "kernel.probe-failed", "kernel.gpu-unsupported",
    "kernel.open-module-unsupported", "kernel.rm-init-failed", "kernel.module-missing",
    "secureboot.module-rejected", "dkms.build-failed",
)

XID_CATALOG_URL = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"

# ---------------------------------------------------------------------------------------------------------
# normalise
# ---------------------------------------------------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_CHARS = str.maketrans({
    "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'", "\u00b4": "'",
    "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"', "\u2033": '"', "\u00ab": '"', "\u00bb": '"',
    "\u00a0": " ", "\u2002": " ", "\u2003": " ", "\u2009": " ", "\u202f": " ", "\u3000": " ",
    "\u200b": "", "\u200c": "", "\u200d": "", "\u2060": "", "\ufeff": "",
    "\u2010": "-", "\u2011": "-",
})

# Log prefixes a line may carry, stripped repeatedly (a syslog line can wrap a dmesg one).
_STAMPS = tuple(re.compile(p) for p in (
    r"^\d+,\d+,\d+,[^;]*;",  # /dev/kmsg record: priority,sequence,usec,flags;message
    r"^<\d{1,3}>",  # printk priority
    # syslog / journalctl: "Jun 30 11:07:05 host ident[pid]: " or ISO time
    r"^(?:[A-Z][a-z]{2}\s+\d{1,2}\s+\d\d:\d\d:\d\d|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?"
    r"(?:Z|[+-]\d\d:?\d\d)?)\s+[\w.-]+\s+[\w.@/-]+(?:\[\d+\])?:\s",
    r"^\[\s*[+-]?\d+\.\d+\]",  # dmesg: [  123.456789], dmesg -d: [  +0.000421]
    r"^\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)\s+[A-Z][a-z]{2}\s+\d{1,2}\s+\d\d:\d\d:\d\d\s+\d{4}\]",  # dmesg -T
    r"^\[[A-Z][a-z]{2}\s?\d{1,2}\s+\d\d:\d\d\]",  # dmesg -e: [Aug30 11:43]
    r"^\[?\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\]?(?=\s)",  # ISO time
    r"^\[[A-Z][a-z]{2}\s+\d{1,2}\s+\d{4}\s+\d\d:\d\d:\d\d\]",  # fabricmanager.log
    r"^\[(?:INFO|WARNING|WARN|ERROR|FATAL|DEBUG|CRITICAL)\](?:\s*\[tid \d+\])?",  # fabricmanager level
    r"^(?:kern|user|daemon|syslog)\s*:\s*(?:emerg|alert|crit|err|warn|notice|info|debug)\s*:",  # dmesg -x
    r"^(?:[\w.-]+\s+)?kernel:\s",  # "kernel: " left by grep, or "host kernel: " after a monotonic stamp
))
_PROMPTS = tuple(re.compile(p) for p in (
    r"^(?:\([\w.-]+\)\s+)?[\w.-]+@[\w.-]+:[^\s$#]*\s?[$#]\s?",  # (env) user@host:~/dir$
    r"^(?:\([\w.-]+\)\s+)?\[[\w.-]+@[\w.-]+(?:\s[^\]]*)?\]\s?[$#]\s?",  # [root@host dir]#
    r"^(?:\([\w.-]+\)\s+)?[\w.-]+@[\w.-]+\s?[$#%>]\s",  # user@host$
    r"^(?:\([\w.-]+\)\s+)?[$#%]\s",  # "$ cmd", "# cmd"
    r"^\$(?=[a-z])",  # "$nvidia-smi"
    r"^(?:\u276f|\u279c|\u03bb)\s+(?:~\S*\s+)?",  # zsh-style arrows
    r"^PS [A-Za-z]:\\[^>]*>\s?",  # PowerShell
))
_QUOTE = re.compile(r"^(?:[ \t]{0,3}>[ \t]?)+")
_FENCE = re.compile(r"^\s*(?:```|~~~)")
_BULLET = re.compile(r"^[-*+]\s+")
# A line that begins a message of its own, never the tail of a wrapped one.
_RECORD_START = re.compile(r"^(?:[\w.\-/]+(?:\[\d+\])?:\s|[A-Z]{4,}\[|\[|Error\b|ERROR\b|WARNING\b|Failed\b|"
                           r"Unable\b|NVIDIA-SMI\b|NVRM\b|Traceback\b|terminate\b)")


@dataclass
class _Line:
    text: str  # content after prefixes
    stamped: bool  # carried a log timestamp
    prompt: bool  # was a shell prompt (the rest is a command)
    indent: int  # leading whitespace after dedent, before prefixes
    width: int  # width as pasted (after quoting and dedent)


def _unescape(text: str) -> str:
    text = re.sub(r"#012(?![0-9A-Fa-f]{3})", "\n", text)  # rsyslog's escaped newline / tab
    text = re.sub(r"#011(?![0-9A-Fa-f]{3})", "\t", text)
    if re.search(r"\\+n", text) and re.search(r'\\+"|\\\\', text):  # a message quoted (maybe twice) in Go/JSON
        text = re.sub(r"\\+n", "\n", text)
        text = re.sub(r'\\+"', '"', text)
    return text


def _strip_prefixes(line: str) -> tuple[str, bool, bool]:
    stamped = prompt = False
    text = line.strip()
    bullet = _BULLET.match(text)
    if bullet and any(p.match(text[bullet.end():]) for p in _STAMPS[:8]):
        text = text[bullet.end():]
    changed = True
    while changed and text:
        changed = False
        for pattern in _STAMPS:
            match = pattern.match(text)
            if match and match.end() > 0:
                text, stamped, changed = text[match.end():].lstrip(), True, True
                break
    if not stamped:
        for pattern in _PROMPTS:
            match = pattern.match(text)
            if match:
                text, prompt = text[match.end():].lstrip(), True
                break
    return text, stamped, prompt


def _lines(text: str) -> list[_Line]:
    text = _ANSI.sub("", text).replace("\r\n", "\n").replace("\r", "\n")
    text = _unescape(_CONTROL.sub("", text.translate(_CHARS)).expandtabs(8))
    raw = []
    for line in text.split("\n"):
        if _FENCE.match(line):
            continue
        raw.append(_QUOTE.sub("", line).rstrip())
    widths = [len(line) - len(line.lstrip()) for line in raw if line.strip()]
    common = min(widths, default=0)
    lines = []
    for line in raw:
        line = line[common:] if line.strip() else ""
        content, stamped, prompt = _strip_prefixes(line)
        lines.append(_Line(re.sub(r"\s+", " ", content).strip(), stamped, prompt,
                           len(line) - len(line.lstrip()), len(line)))
    return lines


_NVRM = re.compile(r"^NVRM:\s*")


def _continues(prev: _Line, head: _Line, line: _Line, widest: int) -> bool:
    """Is `line` the tail of the logical line that began with `head`, last ended with `prev`, and whose widest
    physical line so far is `widest` columns?"""
    if line.prompt or head.prompt:
        return False
    nvrm = _NVRM.match(line.text)
    if nvrm and _NVRM.match(head.text):
        # the kernel splits one message over several "NVRM:" lines, stamped or not
        rest = line.text[nvrm.end():]
        if rest and (rest[0].islower() or rest[0] == "(") and not prev.text.endswith((".", "!", "?")):
            return True
    if line.stamped:
        return False
    if line.indent > head.indent:  # hanging indent: nvidia-installer paragraphs, dmesg continuation lines
        return True
    if prev.text.endswith((".", "!", "?", ":")) or line.indent != prev.indent:
        return False
    split_word = re.search(r"[A-Za-z0-9]-$", prev.text) and line.text[:1].isalnum()
    if not split_word and _RECORD_START.match(line.text):
        return False
    if line.indent == 0:
        # wrapped at a fixed width of 60 to 120 columns (a split word says so more surely): the line before was
        # ended early only because this line's first word did not fit
        word = len(line.text.split(" ", 1)[0])
        return (40 if split_word else 60) <= widest <= 120 and (prev is head or prev.width + 1 + word > widest)
    return True  # wrapped inside an indented paragraph


def _logical(text: str) -> list[str]:
    out: list[list[str]] = []  # logical lines, as the parts that were joined
    head: _Line | None = None
    prev: _Line | None = None
    widest = 0
    for line in _lines(text):
        if not line.text:
            if out and out[-1]:
                out.append([])
            head = prev = None
            continue
        if head is not None and prev is not None and _continues(prev, head, line, max(widest, prev.width)):
            parts, tail = out[-1], line.text
            if _NVRM.match(tail) and _NVRM.match(parts[0]):
                tail = _NVRM.sub("", tail)
            # a word split at its hyphen ("libnvidia-" / "ml.so.1") is joined back without a space
            split_word = re.search(r"[A-Za-z0-9]-$", parts[-1]) and tail[:1].isalnum()
            parts.append(tail if split_word else " " + tail)
            widest = max(widest, prev.width)
        else:
            out.append([line.text])
            head, widest = line, 0
        prev = line
    while out and not out[-1]:
        out.pop()
    return ["".join(parts) for parts in out]


def normalise(text: str) -> str:
    """The paste as plain logical lines: no ANSI escapes, shell prompts, markdown quoting or common
    indentation, log timestamps or priorities; straight quotes; wrapped lines re-joined; runs of
    whitespace collapsed. Blank lines between paragraphs are kept (one)."""
    return "\n".join(_logical(text))


# ---------------------------------------------------------------------------------------------------------
# Matching helpers
# ---------------------------------------------------------------------------------------------------------

# Between two words of a message: whitespace, possibly a line break and a kernel "NVRM:" prefix.
_GAP = r"(?:\s+NVRM:)?\s+"


def _rx(pattern: str, flags: int = re.IGNORECASE) -> re.Pattern[str]:
    """Compile `pattern` with every literal space meaning `_GAP`, so a message matches however it was wrapped.
    (Write `\\s` where exactly one whitespace character is meant; never put a space inside [...].)"""
    return re.compile(pattern.replace(" ", _GAP), flags)


@dataclass
class _Doc:
    text: str  # normalised

    def excerpt(self, start: int, end: int, limit: int = 320) -> str:
        """The logical lines holding text[start:end], cut around the match when long."""
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


Hit = tuple[int, Finding]  # position of the first match, finding
Detector = Callable[[_Doc], Iterator[Hit]]
DETECTORS: list[Detector] = []


def _detector(fn: Detector) -> Detector:
    DETECTORS.append(fn)
    return fn


# ---------------------------------------------------------------------------------------------------------
# Docker and the NVIDIA Container Toolkit
# ---------------------------------------------------------------------------------------------------------

_NO_DEVICE_DRIVER = _rx(r'could not select device driver "(?P<driver>[^"]*)" with capabilities: '
                        r"\[\[(?P<caps>[^\]]*)\]\]")


@_detector
def _docker_no_gpu_driver(doc: _Doc) -> Iterator[Hit]:
    m = doc.has(_NO_DEVICE_DRIVER)
    if not m:
        return
    caps = [c.strip() for c in m["caps"].replace(" ", ",").split(",") if c.strip()]
    yield m.start(), Finding(
        "docker.no-gpu-driver", "Docker has no GPU device driver (NVIDIA Container Toolkit missing or not wired in)",
        "`--gpus` asks the Docker daemon for a device driver with the `gpu` capability. The daemon registers "
        "the NVIDIA one only if it finds `nvidia-container-runtime-hook` (NVIDIA Container Toolkit) on its PATH "
        "when it starts. So the toolkit is not installed, Docker was not restarted after installing it, or "
        "Docker is the snap package, which cannot see the host's toolkit.",
        "gpunode install --only toolkit --only runtime",
        doc.excerpt(m.start(), m.end()), {"driver": m["driver"], "capabilities": caps},
        ("sudo nvidia-ctk runtime configure --runtime=docker && sudo systemctl restart docker",
         "snap list docker  # if listed: remove the snap and install Docker from your distribution or docker.com",
         "gpunode doctor"))


_UNKNOWN_RUNTIME = _rx(r"(?:unknown or invalid runtime name|Unknown runtime specified): (?P<name>[\w.-]+?)\.?(?=\s|$|\")")


@_detector
def _docker_unknown_runtime(doc: _Doc) -> Iterator[Hit]:
    m = doc.has(_UNKNOWN_RUNTIME)
    if not m:
        return
    name = m["name"]
    yield m.start(), Finding(
        "docker.unknown-runtime", f"Docker does not know the runtime {name!r}",
        f"`--runtime={name}` (or \"default-runtime\": \"{name}\") names a runtime that is not registered in "
        "/etc/docker/daemon.json, or Docker was not restarted after it was added. `nvidia-ctk runtime "
        "configure` writes that entry; a hand-edited or overwritten daemon.json loses it. With a current "
        "toolkit `--gpus all` alone is enough and needs no runtime entry.",
        "gpunode install --only runtime",
        doc.excerpt(m.start(), m.end()), {"runtime": name},
        ("sudo nvidia-ctk runtime configure --runtime=docker && sudo systemctl restart docker",
         "docker info --format '{{json .Runtimes}}'  # nvidia must be listed"))


_MISSING_BINARY = _rx(r'exec: "?(?P<binary>nvidia-container-(?:runtime-hook|runtime|cli|toolkit))"?: '
                      r"executable file not found in \$PATH")


@_detector
def _docker_toolkit_binary(doc: _Doc) -> Iterator[Hit]:
    m = doc.has(_MISSING_BINARY)
    if not m:
        return
    yield m.start(), Finding(
        "docker.toolkit-binary-missing", f"{m['binary']} is not installed",
        f"The container engine is configured to call {m['binary']} (an nvidia runtime entry or hook), but the "
        "program is not on its PATH: the NVIDIA Container Toolkit was removed, or only part of it installed.",
        "gpunode install --only toolkit",
        doc.excerpt(m.start(), m.end()), {"binary": m["binary"]},
        ("sudo apt-get install -y nvidia-container-toolkit  # RHEL/Fedora: sudo dnf install -y "
         "nvidia-container-toolkit", "sudo systemctl restart docker"))


_REQUIREMENT = _rx(r"unsatisfied condition: (?P<cond>(?P<key>cuda|driver|arch|brand)\s*(?P<op>>=|<=|==|!=|=|<|>)"
                   r"\s*(?P<value>[\w.-]+?))(?=[\s,\\\"']|\.?$)", re.IGNORECASE | re.MULTILINE)


def _required_cuda(condition: str, value: str) -> str:
    """The X.Y of a `cuda>=X.Y` condition, read the way gpunode.compat reads NVIDIA_REQUIRE_CUDA."""
    try:
        from gpunode import compat
        return compat.parse_require_cuda(condition).cuda_minimum or value
    except Exception:
        return value


def _driver_for_cuda(cuda: str) -> dict[str, Any]:
    """Minimum drivers for a CUDA version from gpunode.compat (empty when the table does not know it)."""
    try:
        from gpunode import compat
        need = compat.driver_needed_for_cuda(cuda)
    except Exception:  # unknown version, or the tables are unavailable: say nothing rather than guess
        return {}
    values: dict[str, Any] = {}
    if need.native_min is not None:
        values["driver_min"] = str(need.native_min)
        values["driver_branch_min"] = compat.branch_of(need.native_min)
    if need.minor_compat_min is not None:
        values["driver_min_minor_compat"] = str(need.minor_compat_min)
    return values


@_detector
def _container_requirement(doc: _Doc) -> Iterator[Hit]:
    seen: set[str] = set()
    for m in _REQUIREMENT.finditer(doc.text):
        key, value = m["key"].lower(), m["value"].rstrip(".")
        condition = f"{key}{m['op']}{value}"
        if condition in seen:
            continue
        seen.add(condition)
        excerpt = doc.excerpt(m.start(), m.end())
        if key != "cuda":
            yield m.start(), Finding(
                "container.requirement", f"The image requires {condition}, which this node does not meet",
                "nvidia-container-cli checks the image's NVIDIA_REQUIRE_* variables against the node before "
                f"starting the container; {condition} does not hold here.",
                "nvidia-smi -q | grep -iE 'Driver Version|Product Brand|Product Architecture'",
                excerpt, {"condition": condition},
                ("docker run -e NVIDIA_DISABLE_REQUIRE=1 ...  # skips the check; only if you know the image works",))
            continue
        value = _required_cuda(condition, value)
        values: dict[str, Any] = {"condition": condition, "cuda_required": value, **_driver_for_cuda(value)}
        if "driver_min" in values:
            need = (f"A driver that supports CUDA {value} natively is {values['driver_min']} or newer "
                    f"(branch R{values['driver_branch_min']}+).")
            fix = f"gpunode install --driver <{values['driver_branch_min']}.x or newer>"
            fix = _recommended_install(values["driver_min"]) or fix
        else:
            need = f"gpunode's CUDA table does not know CUDA {value}; check NVIDIA's release notes for its driver."
            fix = "nvidia-smi  # the header's 'CUDA Version' is the newest CUDA the installed driver supports"
        yield m.start(), Finding(
            "cuda.requirement", f"The container needs CUDA {value}; the node's driver is older",
            f"The image sets NVIDIA_REQUIRE_CUDA={condition}, and nvidia-container-cli refuses to start it "
            f"because the installed driver supports an older CUDA. {need} Alternatively run an image built "
            "for the CUDA version `nvidia-smi` reports.",
            fix, excerpt, values,
            ("nvidia-smi  # 'CUDA Version' in the header: the newest CUDA this driver supports",
             "docker run ... nvidia/cuda:<X.Y.Z>-base-ubuntu22.04  # an image for that CUDA version or older"))


def _recommended_install(driver_min: str) -> str | None:
    try:
        from gpunode import compat
        branches = compat.recommended_drivers(compat.parse_driver(driver_min))
    except Exception:
        return None
    if not branches or branches[0].latest_known is None:
        return None
    return f"gpunode install --driver {branches[0].latest_known}"


_INSUFFICIENT = _rx(r"CUDA driver version is insufficient for CUDA runtime version|cudaErrorInsufficientDriver|"
                    r"CUDA_ERROR_INSUFFICIENT_DRIVER|The NVIDIA driver on your system is too old "
                    r"\(found version (?P<found>\d+)\)")


@_detector
def _cuda_insufficient(doc: _Doc) -> Iterator[Hit]:
    m = doc.has(_INSUFFICIENT)
    if not m:
        return
    values: dict[str, Any] = {}
    if m["found"]:
        found = int(m["found"])
        values["driver_cuda"] = f"{found // 1000}.{found % 1000 // 10}"
    yield m.start(), Finding(
        "cuda.insufficient-driver", "The driver is older than the CUDA the program was built with",
        "The CUDA runtime in the program (or container) is newer than the newest CUDA the installed driver "
        "supports, and minor-version compatibility does not cover it (different CUDA major version, or a "
        "feature that needs the newer driver).",
        "nvidia-smi  # 'CUDA Version' in the header is the newest CUDA this driver supports",
        doc.excerpt(m.start(), m.end()), values,
        ("gpunode install --driver <a driver for the program's CUDA version>",
         "or use a build of the program for the CUDA version nvidia-smi reports"))


_NVML_MISSING = _rx(r"(?P<lib>libnvidia-ml\.so(?:\.1)?): cannot open shared object file|"
                    r"NVIDIA-SMI couldn't find (?P<lib2>libnvidia-ml\.so) library|"
                    r"could not load NVML library|Failed to initialize NVML: could not load")


@_detector
def _lib_nvml_missing(doc: _Doc) -> Iterator[Hit]:
    m = doc.has(_NVML_MISSING)
    if not m:
        return
    library = m["lib"] or m["lib2"] or "libnvidia-ml.so.1"
    window = doc.text[max(0, m.start() - 200):m.end()]
    also: tuple[str, ...]
    if "nvidia-container-cli" in window:
        reporter = "nvidia-container-cli"
        cause = ("nvidia-container-cli runs on the host and loads the driver's NVML library from there. It is "
                 "missing: the NVIDIA driver's user-space part is not installed on the host (only the kernel "
                 "module, or no driver at all), or it was installed in a directory the dynamic linker does not "
                 "search (ldconfig cache not updated, e.g. a custom install path).")
        fix = "gpunode doctor"
        also = ("ldconfig -p | grep libnvidia-ml  # empty: the driver's libraries are not installed or not in "
                "the linker cache", "sudo ldconfig", "gpunode install --driver <version>")
    elif "NVIDIA-SMI couldn't find" in m.group(0):
        reporter = "nvidia-smi"
        cause = ("nvidia-smi cannot load the driver's NVML library. Inside a container this means the container "
                 "was started without GPU access (no `--gpus all` / nvidia runtime), so the toolkit did not "
                 "mount the host's driver libraries into it, or the image carries its own stale or broken "
                 "libnvidia-ml.so link that hides the mounted one; on a host it means the driver's user-space "
                 "libraries are missing or not in the linker cache.")
        fix = "docker run --rm --gpus all <image> nvidia-smi"
        also = ("ldconfig -p | grep libnvidia-ml", "gpunode doctor")
    else:
        reporter = "other"
        cause = ("The program could not load the driver's NVML library: the NVIDIA driver's user-space part is "
                 "not installed, or not in the linker cache, or (in a container) GPU access was not requested.")
        fix = "gpunode doctor"
        also = ("ldconfig -p | grep libnvidia-ml",)
    yield m.start(), Finding("lib.nvml-missing", f"{library} (NVML, part of the NVIDIA driver) cannot be loaded",
                             cause, fix, doc.excerpt(m.start(), m.end()),
                             {"library": library, "reporter": reporter}, also)


_NVML_DRIVER_NOT_LOADED = _rx(r"nvml error: driver not loaded")


@_detector
def _driver_not_loaded(doc: _Doc) -> Iterator[Hit]:
    m = doc.has(_NVML_DRIVER_NOT_LOADED)
    if not m:
        return
    yield m.start(), Finding(
        "driver.not-loaded", "The NVIDIA kernel module is not loaded on the host",
        "nvidia-container-cli found the driver's libraries but not the kernel module: it was not built for the "
        "running kernel, Secure Boot refused it, nouveau holds the GPU, or it was never loaded after install.",
        "gpunode doctor", doc.excerpt(m.start(), m.end()), {},
        ("sudo modprobe nvidia  # prints the real reason when it fails", "dkms status", "mokutil --sb-state"))


# ---------------------------------------------------------------------------------------------------------
# NVML / nvidia-smi
# ---------------------------------------------------------------------------------------------------------

_NVML_MISMATCH = _rx(r"(?:Failed to initialize NVML: )?Driver/library version mismatch")
_NVML_LIB_VERSION = _rx(r"NVML library version: (?P<v>\d+\.\d+(?:\.\d+)?)")
_API_MISMATCH = _rx(r"API mismatch: the client (?:'(?P<client>[^']*)' \(pid (?P<pid>\d+)\) )?has the version "
                    r"(?P<client_v>\d+\.\d+(?:\.\d+)?), but this kernel module has the version "
                    r"(?P<kernel_v>\d+\.\d+(?:\.\d+)?)")


@_detector
def _nvml_mismatch(doc: _Doc) -> Iterator[Hit]:
    m = doc.has(_NVML_MISMATCH)
    api = doc.has(_API_MISMATCH)
    if not m and not api:
        return
    first = min((x for x in (m, api) if x), key=lambda x: x.start())
    values: dict[str, Any] = {}
    lib = doc.has(_NVML_LIB_VERSION)
    if lib:
        values["nvml_library_version"] = lib["v"]
    if api:
        values["library_version"] = api["client_v"]
        values["kernel_module_version"] = api["kernel_v"]
        if api["client"]:
            values["client"] = api["client"]
    sides = ""
    if api:
        sides = (f" Here the user-space libraries are {api['client_v']} and the loaded kernel module is "
                 f"{api['kernel_v']}.")
    elif lib:
        sides = f" Here the NVML library is {lib['v']}; `cat /proc/driver/nvidia/version` shows the loaded module."
    excerpt = doc.excerpt(first.start(), first.end())
    if m and lib and lib.start() > m.start():
        excerpt = doc.excerpt(m.start(), lib.end())
    yield first.start(), Finding(
        "nvml.mismatch", "NVIDIA driver/library version mismatch",
        "The driver's user-space libraries and the kernel module that is loaded have different versions. This "
        "almost always follows a driver upgrade (often by unattended-upgrades) that replaced the libraries "
        "while the old module stayed loaded; it also happens when the module was rebuilt from another version "
        f"(DKMS) than the libraries.{sides}",
        "sudo reboot", excerpt, values,
        ("cat /proc/driver/nvidia/version; modinfo -F version nvidia  # loaded vs installed module",
         "without a reboot: sudo systemctl stop nvidia-persistenced; sudo modprobe -r nvidia_drm nvidia_modeset "
         "nvidia_uvm nvidia && sudo modprobe nvidia",
         "grep -i nvidia /var/log/apt/history.log  # what upgraded it; hold the packages to stop it recurring"))


_NVML_UNKNOWN = _rx(r"Failed to initialize NVML: Unknown Error")


@_detector
def _nvml_unknown(doc: _Doc) -> Iterator[Hit]:
    m = doc.has(_NVML_UNKNOWN)
    if not m:
        return
    yield m.start(), Finding(
        "nvml.unknown-error", "NVML cannot reach the GPU (\"Unknown Error\")",
        "Inside a container that used to work, this usually means the container lost access to /dev/nvidia* "
        "after `systemctl daemon-reload` (or a systemd update) re-applied the cgroup device rules; Docker "
        "with the systemd cgroup driver is affected. On a host it means the GPU or driver is in a bad state "
        "(check the kernel log for Xid errors).",
        "docker restart <container>", doc.excerpt(m.start(), m.end()), {},
        ("sudo nvidia-ctk system create-dev-char-symlinks --create-all  # lasting fix for the cgroup case",
         "sudo dmesg -T | grep -iE 'xid|NVRM'  # on a host"))


_SMI_NO_DRIVER = _rx(r"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver")


@_detector
def _smi_no_driver(doc: _Doc) -> Iterator[Hit]:
    m = doc.has(_SMI_NO_DRIVER)
    if not m:
        return
    yield m.start(), Finding(
        "smi.no-driver", "nvidia-smi cannot talk to the NVIDIA kernel module",
        "The user-space driver is installed but the kernel module is not loaded. Usual reasons: the kernel "
        "was updated and the module was not rebuilt for it (missing headers, DKMS failure), Secure Boot "
        "rejected the unsigned module, nouveau holds the GPU, or the machine was not rebooted after the "
        "install.",
        "gpunode doctor", doc.excerpt(m.start(), m.end()), {},
        ("sudo modprobe nvidia  # prints the real reason when it fails",
         "dkms status  # is the module built for $(uname -r)?", "mokutil --sb-state",
         "lsmod | grep -E '^(nvidia|nouveau) '"))


_SMI_NO_DEVICES = _rx(r"^No devices were found\b", re.IGNORECASE | re.MULTILINE)


@_detector
def _smi_no_devices(doc: _Doc) -> Iterator[Hit]:
    m = doc.has(_SMI_NO_DEVICES)
    if not m:
        return
    yield m.start(), Finding(
        "smi.no-devices", "The driver is loaded but initialised no GPU",
        "nvidia.ko is loaded, yet no GPU came up: the GPU is not supported by this driver or this kernel-module "
        "flavour (open modules need Turing or newer; Blackwell and Grace need them), another driver holds "
        "it, or it failed to initialise (see NVRM lines in the kernel log).",
        "sudo dmesg -T | grep -E 'NVRM|nvidia'", doc.excerpt(m.start(), m.end()), {},
        ("lspci -nnk -d 10de:  # 'Kernel driver in use' should be nvidia", "gpunode doctor"))


_DEVICE_HANDLE = _rx(r"Unable to determine the device handle for (?:GPU\s*)?(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:"
                     r"[0-9A-Fa-f]{2}\.[0-7]): (?P<error>[^\n.]+)")


@_detector
def _smi_device_handle(doc: _Doc) -> Iterator[Hit]:
    for m in _DEVICE_HANDLE.finditer(doc.text):
        error = m["error"].strip()
        lost = "lost" in error.lower()
        pci = m["pci"].lower()
        yield m.start(), Finding(
            "smi.device-handle", f"nvidia-smi cannot reach GPU {pci}",
            f"The driver knows GPU {pci} but cannot talk to it ({error}). The GPU has most likely fallen "
            "off the bus or hit a fatal error (look for Xid 79 / 'fallen off the bus' in the kernel log); "
            + ("the driver has marked it lost, and only a reboot brings it back. " if lost else
               "a reboot (or a GPU reset, if the driver still allows one) is needed. ")
            + "If it happens again, suspect power, cooling, the riser or the slot.",
            "sudo reboot", doc.excerpt(m.start(), m.end()), {"pci": pci, "error": error},
            ("sudo dmesg -T | grep -iE 'xid|fallen off the bus'", "sudo nvidia-bug-report.sh  # before rebooting"))


# ---------------------------------------------------------------------------------------------------------
# Fabric manager (NVSwitch systems)
# ---------------------------------------------------------------------------------------------------------

_NOT_READY = _rx(r"(?:Error 802: )?system not yet initialized|cudaErrorSystemNotReady|CUDA_ERROR_SYSTEM_NOT_READY")


@_detector
def _fabricmanager_802(doc: _Doc) -> Iterator[Hit]:
    m = doc.has(_NOT_READY)
    if not m:
        return
    values: dict[str, Any] = {"cuda_error": 802}
    if doc.has(_rx(r"gpu count: 0")):
        values["gpu_count"] = 0
    yield m.start(), Finding(
        "fabricmanager.802", "CUDA error 802: system not yet initialized (NVSwitch fabric not ready)",
        "On NVSwitch systems (HGX/DGX A100, H100, H200, B200) CUDA refuses to start until nvidia-fabricmanager "
        "has set up the NVLink fabric. It is not installed, not running, or failed to start, most often because "
        "its version differs from the driver's (they must match exactly). nvidia-smi still works.",
        "gpunode install --only fabricmanager", doc.excerpt(m.start(), m.end()), values,
        ("systemctl status nvidia-fabricmanager", "sudo systemctl enable --now nvidia-fabricmanager",
         "journalctl -u nvidia-fabricmanager -b  # a version mismatch shows here",
         "nvidia-smi -q | grep -A2 -i fabric  # State should be Completed"))


_FM_MISMATCH = _rx(r"fabric manager NVIDIA GPU driver interface version (?P<fm>\d+\.\d+(?:\.\d+)?) "
                   r"(?:don't|doesn't|does not) match with driver version (?P<driver>\d+\.\d+(?:\.\d+)?)")


def _fm_package(driver: str) -> str:
    branch = int(driver.split(".")[0])
    if branch >= 580:
        return f"sudo apt-get install -y nvidia-fabricmanager={driver}-1"
    return f"sudo apt-get install -y nvidia-fabricmanager-{branch}={driver}-1"


@_detector
def _fabricmanager_mismatch(doc: _Doc) -> Iterator[Hit]:
    m = doc.has(_FM_MISMATCH)
    if not m:
        return
    fm, driver = m["fm"], m["driver"]
    yield m.start(), Finding(
        "fabricmanager.version-mismatch", f"Fabric manager {fm} does not match driver {driver}",
        f"nvidia-fabricmanager must have exactly the driver's version. It is {fm}, the loaded driver is "
        f"{driver}, so it refuses to start and CUDA fails with error 802. Usually one of the two was upgraded "
        "without the other (hold both packages).",
        "gpunode install --only fabricmanager", doc.excerpt(m.start(), m.end()),
        {"fabricmanager_version": fm, "driver_version": driver},
        (f"{_fm_package(driver)}  # Ubuntu; RHEL: sudo dnf install -y nvidia-fabric"
         f"{'' if int(driver.split('.')[0]) >= 580 else '-'}manager-{driver}-1",
         "sudo systemctl restart nvidia-fabricmanager"))


_FM_NOTHING = _rx(r"NV_WARN_NOTHING_TO_DO")


@_detector
def _fabricmanager_nothing(doc: _Doc) -> Iterator[Hit]:
    m = doc.has(_FM_NOTHING)
    if not m:
        return
    yield m.start(), Finding(
        "fabricmanager.no-nvswitch", "Fabric manager found no NVSwitch to manage",
        "nvidia-fabricmanager exits with NV_WARN_NOTHING_TO_DO on a machine without NVSwitches (PCIe GPUs, "
        "4-GPU boards with direct NVLink, GB200/GB300 compute trays). It is not needed there.",
        "sudo systemctl disable --now nvidia-fabricmanager", doc.excerpt(m.start(), m.end()), {},
        ("lspci -d 10de: -nn | grep -i bridge  # NVSwitches show as bridges",))


# ---------------------------------------------------------------------------------------------------------
# nvidia-installer
# ---------------------------------------------------------------------------------------------------------

_INSTALLER_LOG = _rx(r"Please see the file '(?P<log>[^']+)' for details")
_INSTALLER_VERSION = _rx(r"installer version: (?P<v>\d+\.\d+(?:\.\d+)?)|NVIDIA-Linux-[\w]+-(?P<v2>\d+\.\d+(?:\.\d+)?)"
                         r"(?:-[\w-]+)?\.run")


def _installer_values(doc: _Doc) -> dict[str, Any]:
    values: dict[str, Any] = {}
    log = doc.has(_INSTALLER_LOG)
    if log:
        values["log_file"] = log["log"]
    version = doc.has(_INSTALLER_VERSION)
    if version:
        values["driver_version"] = version["v"] or version["v2"]
    return values


_INSTALLER_NOUVEAU = _rx(r"The Nouveau kernel driver is currently in use by your system")


@_detector
def _installer_nouveau(doc: _Doc) -> Iterator[Hit]:
    m = doc.has(_INSTALLER_NOUVEAU)
    if not m:
        return
    yield m.start(), Finding(
        "installer.nouveau", "nouveau is loaded, so the NVIDIA installer stops",
        "nouveau (the open-source driver for NVIDIA GPUs) is bound to the GPU, and nvidia.ko cannot take it "
        "over. nouveau must be blacklisted, the initramfs rebuilt (otherwise it loads again from there) and "
        "the machine rebooted before installing.",
        "gpunode install --only nouveau", doc.excerpt(m.start(), m.end()), _installer_values(doc),
        ("printf 'blacklist nouveau\\noptions nouveau modeset=0\\n' | sudo tee /etc/modprobe.d/blacklist-nouveau.conf",
         "sudo update-initramfs -u  # RHEL/Fedora: sudo dracut --force", "sudo reboot"))


_INSTALLER_SOURCE = _rx(r"Unable to find the kernel source tree for the currently running kernel")


@_detector
def _installer_no_source(doc: _Doc) -> Iterator[Hit]:
    m = doc.has(_INSTALLER_SOURCE)
    if not m:
        return
    yield m.start(), Finding(
        "installer.no-kernel-source", "Kernel headers for the running kernel are not installed",
        "nvidia-installer builds nvidia.ko against the running kernel's headers (kernel-devel on RHEL/Fedora, "
        "linux-headers on Debian/Ubuntu), and they are missing. Often the kernel was updated and the machine "
        "not rebooted, so the headers installed belong to a different kernel than `uname -r`.",
        "sudo apt-get install -y linux-headers-$(uname -r)", doc.excerpt(m.start(), m.end()), _installer_values(doc),
        ("sudo dnf install -y kernel-devel-$(uname -r) kernel-headers-$(uname -r)  # RHEL/Fedora",
         "uname -r; ls /lib/modules  # reboot first if a newer kernel is installed but not running"))


_INSTALLER_KO = _rx(r"Unable to load the kernel module '(?P<module>nvidia[\w-]*)(?:\.ko)?'")
_SB_EVIDENCE = _rx(r"Key was rejected by service|Required key not available|Loading of unsigned module is "
                   r"(?:rejected|restricted)|unsigned module loading is restricted|Lockdown: [\w-]+: unsigned module")
_NOUVEAU_EVIDENCE = _rx(r"^nouveau\s+\d+|\bnouveau \d{4}:|probe routine was not called|No NVIDIA graphics adapter "
                        r"probed|Nouveau kernel driver is currently in use", re.IGNORECASE | re.MULTILINE)
_VGPU_EVIDENCE = _rx(r"\bvGPU\b|\bGRID\b|-grid\.run|\bVMware\b|\bhypervisor\b|virtual GPU")
_BUILD_EVIDENCE = _rx(r"Invalid module format|Exec format error|Unknown symbol|disagrees about version of symbol")
_UNSUPPORTED_EVIDENCE = _rx(r"is not supported by (?:the )?NVIDIA [\d.]+ driver release|not supported by open "
                            r"nvidia\.ko|Open nvidia\.ko is only ready for use on Data Center GPUs|"
                            r"could not insert 'nvidia': No such device")


@_detector
def _installer_nvidia_ko(doc: _Doc) -> Iterator[Hit]:
    m = doc.has(_INSTALLER_KO)
    if not m:
        return
    likely = [name for name, pattern in (("secure-boot", _SB_EVIDENCE), ("nouveau", _NOUVEAU_EVIDENCE),
                                         ("vgpu", _VGPU_EVIDENCE), ("kernel-mismatch", _BUILD_EVIDENCE),
                                         ("unsupported-gpu", _UNSUPPORTED_EVIDENCE)) if doc.has(pattern)]
    values = {"module": f"{m['module']}.ko" if not m["module"].endswith(".ko") else m["module"], "likely": likely,
              **_installer_values(doc)}
    reasons = {
        "secure-boot": "Secure Boot is on and the module is not signed with a key the firmware trusts",
        "nouveau": "nouveau (or another driver) holds the GPU",
        "vgpu": "this is a vGPU guest, which needs the vGPU (GRID) guest driver matching the host's vGPU manager",
        "kernel-mismatch": "the module was built for a different kernel than the running one",
        "unsupported-gpu": "no GPU in the machine is supported by this driver release or module flavour",
    }
    if likely:
        cause = "nvidia.ko was built but the kernel refused to load it; the text points to: " + "; ".join(
            reasons[k] for k in likely) + "."
    else:
        cause = ("nvidia.ko was built but the kernel refused to load it. The usual reasons: Secure Boot rejects "
                 "the unsigned module; nouveau holds the GPU; a vGPU guest needs the GRID guest driver; or the "
                 "GPU is not supported by this release. The installer log's 'Kernel module load error' and "
                 "'Kernel messages' entries say which.")
    fixes = {"secure-boot": "mokutil --sb-state", "nouveau": "gpunode install --only nouveau",
             "vgpu": "nvidia-smi vgpu  # on the host: the vGPU manager version the guest driver must match",
             "kernel-mismatch": "sudo apt-get install -y linux-headers-$(uname -r)  # then re-run the installer",
             "unsupported-gpu": "lspci -nn -d 10de:  # then pick a driver branch that supports that PCI id"}
    log = values.get("log_file", "/var/log/nvidia-installer.log")
    also = [f"sudo grep -A20 -E 'Kernel module load error|Kernel messages' {log}", "gpunode doctor"]
    if "secure-boot" in likely:
        also.insert(0, "sign the module: re-run the installer with --module-signing-secret-key=KEY "
                       "--module-signing-public-key=CERT, then sudo mokutil --import CERT and reboot")
    yield m.start(), Finding("installer.nvidia-ko-load", "The NVIDIA installer built nvidia.ko but could not load it",
                             cause, fixes[likely[0]] if likely else "gpunode doctor",
                             doc.excerpt(m.start(), m.end()), values, tuple(also))


_INSTALLER_IN_USE = _rx(r"An NVIDIA kernel module '(?P<module>[\w-]+)' appears to already be loaded in your kernel")


@_detector
def _installer_in_use(doc: _Doc) -> Iterator[Hit]:
    m = doc.has(_INSTALLER_IN_USE)
    if not m:
        return
    yield m.start(), Finding(
        "installer.module-in-use", f"An NVIDIA module ({m['module']}) is loaded and in use",
        f"The installer must unload the running driver first, but {m['module']} is in use: a display server, "
        "nvidia-persistenced, a CUDA program or a container holds it. Stop them (or boot to a text target) "
        "and unload the modules; a reboot into multi-user mode also works.",
        "sudo systemctl stop nvidia-persistenced && sudo modprobe -r nvidia_drm nvidia_modeset nvidia_uvm nvidia",
        doc.excerpt(m.start(), m.end()), {"module": m["module"], **_installer_values(doc)},
        ("sudo lsof /dev/nvidia*  # what still holds the GPU",
         "sudo systemctl isolate multi-user.target  # stops the display manager"))


_INSTALLER_FAILED = _rx(r"ERROR: Installation has failed")


@_detector
def _installer_failed(doc: _Doc) -> Iterator[Hit]:
    m = doc.has(_INSTALLER_FAILED)
    if not m:
        return
    values = _installer_values(doc)
    log = values.get("log_file", "/var/log/nvidia-installer.log")
    yield m.start(), Finding(
        "installer.failed", "The NVIDIA installer failed",
        f"The text shows only the installer's summary; the reason is in {log}.",
        f"sudo tail -n 60 {log} | gpunode explain", doc.excerpt(m.start(), m.end()), values, ())


# ---------------------------------------------------------------------------------------------------------
# Kernel log
# ---------------------------------------------------------------------------------------------------------

_PCI = r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?"
_FALLEN = _rx(rf"(?:The NVIDIA GPU|GPU(?: at PCI:)?) (?P<pci>{_PCI}):?(?: \(PCI ID: (?P<id>[0-9a-fA-F]{{4}}:"
              r"[0-9a-fA-F]{4})\))?(?: installed in this system)?(?: GPU)?(?: has)? fallen off the bus")


@_detector
def _kernel_fallen(doc: _Doc) -> Iterator[Hit]:
    seen: set[str] = set()
    for m in _FALLEN.finditer(doc.text):
        pci = m["pci"].lower()
        if pci in seen:
            continue
        seen.add(pci)
        values = {"pci": pci}
        if m["id"]:
            values["pci_id"] = m["id"].lower()
        yield m.start(), Finding(
            "kernel.fallen-off-bus", f"GPU {pci} has fallen off the PCIe bus",
            "The GPU stopped answering on PCIe, so the driver cannot use it. Everything on that GPU is lost and "
            "only a reboot (often a full power cycle) brings it back. It is a hardware-level event: power "
            "delivery, overheating, the riser or slot, or a failing GPU. If it recurs, have the GPU serviced.",
            "sudo reboot", doc.excerpt(m.start(), m.end()), values,
            ("sudo nvidia-bug-report.sh  # before rebooting, for the vendor",
             f"sudo lspci -vvv -s {pci}  # link state; 'rev ff' means the device is gone"))


_NOT_PROBED = _rx(r"No NVIDIA graphics adapter probed!?|The NVIDIA probe routine was not called for (?P<n>\d+) "
                  r"device\(s\)")
_CONFLICT = _rx(r"a driver such as: (?P<drivers>[\w\s,]+?) was loaded and obtained ownership")


@_detector
def _kernel_not_probed(doc: _Doc) -> Iterator[Hit]:
    matches = list(_NOT_PROBED.finditer(doc.text))
    if not matches:
        return
    values: dict[str, Any] = {}
    count = next((int(m["n"]) for m in matches if m["n"]), None)
    if count is not None:
        values["devices"] = count
    conflict = doc.has(_CONFLICT)
    if conflict:
        values["conflicting_drivers"] = [d for d in re.split(r"[,\s]+|\bor\b", conflict["drivers"]) if d]
    other_driver = count is not None or conflict is not None
    cause = ("nvidia.ko loaded but did not bind to any GPU because another kernel driver already owns "
             "them — nouveau almost always (vfio-pci on a passthrough host). Blacklist it, rebuild the initramfs "
             "and reboot." if other_driver else
             "nvidia.ko loaded but found no GPU it could drive: another driver (nouveau, vfio-pci) owns the GPU, "
             "the GPU is not supported by this driver release, or there is no NVIDIA GPU visible to the system.")
    m = matches[0]
    shown = next((x for x in matches if x["n"]), m)
    yield m.start(), Finding(
        "kernel.no-adapter-probed", "nvidia.ko found no GPU it could bind to", cause,
        "gpunode install --only nouveau" if other_driver else "lspci -nnk -d 10de:",
        doc.excerpt(shown.start(), conflict.end() if conflict and conflict.start() > shown.start() else shown.end()),
        values,
        ("lspci -nnk -d 10de:  # 'Kernel driver in use' shows who owns each GPU", "gpunode doctor"))


_PROBE_FAILED = _rx(r"The NVIDIA probe routine failed for (?P<n>\d+) device\(s\)")


@_detector
def _kernel_probe_failed(doc: _Doc) -> Iterator[Hit]:
    m = doc.has(_PROBE_FAILED)
    if not m:
        return
    yield m.start(), Finding(
        "kernel.probe-failed", f"nvidia.ko failed to initialise {m['n']} GPU(s)",
        "The driver tried to take the GPU and failed. The NVRM lines just before this one say why: a GPU not "
        "supported by this release or module flavour, a GPU that fell off the bus, or an initialisation error.",
        "sudo dmesg -T | grep -B8 'probe routine failed'", doc.excerpt(m.start(), m.end()), {"devices": int(m["n"])},
        ("gpunode doctor",))


_UNSUPPORTED = _rx(rf"The NVIDIA GPU (?P<pci>{_PCI}) \(PCI ID: (?P<id>[0-9a-fA-F]{{4}}:[0-9a-fA-F]{{4}})\) "
                   r"installed in this system is not supported by the (?:NVIDIA )?(?P<version>\d+\.\d+(?:\.\d+)?) "
                   r"(?:NVIDIA )?(?:Linux )?(?:graphics )?driver release")


@_detector
def _kernel_unsupported(doc: _Doc) -> Iterator[Hit]:
    m = doc.has(_UNSUPPORTED)
    if not m:
        return
    yield m.start(), Finding(
        "kernel.gpu-unsupported", f"GPU {m['id'].lower()} is not supported by driver {m['version']}",
        f"Driver {m['version']} does not know this GPU: the GPU is newer than the driver (install a newer "
        "branch) or older than the branch supports (R590+ dropped Maxwell, Pascal and Volta; older GPUs need a "
        "legacy branch).",
        "gpunode doctor", doc.excerpt(m.start(), m.end()),
        {"pci": m["pci"].lower(), "pci_id": m["id"].lower(), "driver_version": m["version"]},
        ("lspci -nn -d 10de:  # the GPU's PCI id",))


_OPEN_UNSUPPORTED = _rx(rf"(?:The NVIDIA GPU (?P<pci>{_PCI}) \(PCI ID: (?P<id>[0-9a-fA-F]{{4}}:[0-9a-fA-F]{{4}})\) )?"
                        r"installed in this system is not supported by open nvidia\.ko|"
                        r"Open nvidia\.ko is only ready for use on Data Center GPUs")


@_detector
def _kernel_open_unsupported(doc: _Doc) -> Iterator[Hit]:
    m = doc.has(_OPEN_UNSUPPORTED)
    if not m:
        return
    values: dict[str, Any] = {}
    if m["pci"]:
        values.update(pci=m["pci"].lower(), pci_id=m["id"].lower())
    if "Data Center" in m.group(0):
        cause = ("This early release of the open kernel modules supports only data-center GPUs by default. "
                 "Use the proprietary flavour, or a newer driver (R560+ supports GeForce/RTX with open modules).")
        fix = "sudo sh NVIDIA-Linux-x86_64-<version>.run --kernel-module-type=proprietary"
    else:
        cause = ("The open kernel modules were installed (the default since R560), but this GPU predates Turing "
                 "and has no GSP, so only the proprietary modules can drive it. Reinstall with the "
                 "proprietary flavour on a branch that still supports the GPU (R580 is the last for Maxwell, "
                 "Pascal and Volta).")
        fix = "sudo sh NVIDIA-Linux-x86_64-<580.x>.run --kernel-module-type=proprietary"
    yield m.start(), Finding("kernel.open-module-unsupported", "The open NVIDIA kernel module cannot drive this GPU",
                             cause, fix, doc.excerpt(m.start(), m.end()), values,
                             ("older installers: -m=kernel instead of --kernel-module-type=proprietary",))


_RM_INIT = _rx(rf"GPU (?P<pci>{_PCI}): RmInitAdapter failed! \((?P<code>[0-9a-fx:]+)\)")
_FIRMWARE = _rx(r"Direct firmware load for (?P<fw>nvidia/[\w./-]+) failed|RmFetchGspRmImages: No firmware image found")


@_detector
def _kernel_rm_init(doc: _Doc) -> Iterator[Hit]:
    m = doc.has(_RM_INIT)
    if not m:
        return
    firmware = doc.has(_FIRMWARE)
    values: dict[str, Any] = {"pci": m["pci"].lower(), "code": m["code"]}
    if firmware:
        values["missing_firmware"] = firmware["fw"] or True
        cause = ("The driver could not load its GSP firmware (the firmware files do not match the kernel "
                 "module: a partial upgrade or a module built from another version), so the GPU did not start.")
        fix = "sudo reboot  # if the packages are consistent; otherwise reinstall the driver"
    else:
        cause = ("The driver failed to initialise the GPU. Common reasons: a module flavour the GPU does not "
                 "support, a GPU left in a bad state (needs a reset or a power cycle), mismatched firmware, or "
                 "a hardware fault.")
        fix = "sudo reboot"
    yield m.start(), Finding("kernel.rm-init-failed", f"The driver could not initialise GPU {m['pci'].lower()}",
                             cause, fix, doc.excerpt(m.start(), m.end()), values,
                             ("sudo dmesg -T | grep -B5 RmInitAdapter", "sudo nvidia-bug-report.sh"))


_MODULE_MISSING = _rx(r"modprobe: FATAL: Module (?P<module>nvidia[\w-]*) not found in directory "
                      r"(?P<dir>/(?:usr/)?lib/modules/(?P<kernel>[^\s/]+))")


@_detector
def _kernel_module_missing(doc: _Doc) -> Iterator[Hit]:
    m = doc.has(_MODULE_MISSING)
    if not m:
        return
    kernel = m["kernel"]
    yield m.start(), Finding(
        "kernel.module-missing", f"No {m['module']} module for kernel {kernel}",
        f"There is no {m['module']}.ko for kernel {kernel}: the kernel was updated and DKMS did not (or could "
        "not, without headers) rebuild the driver for it, or the driver was never installed for this kernel.",
        f"sudo apt-get install -y linux-headers-{kernel} && sudo dkms autoinstall -k {kernel}",
        doc.excerpt(m.start(), m.end()), {"module": m["module"], "kernel": kernel},
        (f"sudo dnf install -y kernel-devel-{kernel} && sudo dkms autoinstall -k {kernel}  # RHEL/Fedora",
         "dkms status"))


_SB_REJECTED = _rx(r"(?:could not insert '(?P<module>[\w-]+)': )?(?:Key was rejected by service|Required key not "
                   r"available)|Loading of unsigned module is rejected|unsigned module loading is restricted")


@_detector
def _secureboot(doc: _Doc) -> Iterator[Hit]:
    m = doc.has(_SB_REJECTED)
    if not m:
        return
    if "nvidia" not in doc.text.lower():
        return
    values: dict[str, Any] = {"module": m["module"]} if m["module"] else {}
    yield m.start(), Finding(
        "secureboot.module-rejected", "Secure Boot rejected the unsigned NVIDIA kernel module",
        "Secure Boot is on (kernel lockdown), and nvidia.ko is not signed with a key the firmware or MOK list "
        "trusts, so the kernel refuses to load it. Sign the module and enrol the key, use your distribution's "
        "pre-signed modules, or turn Secure Boot off.",
        "mokutil --sb-state", doc.excerpt(m.start(), m.end()), values,
        ("sudo mokutil --import <the .der certificate the module was signed with>  # then reboot and enrol it "
         "in MOK Manager",
         "Ubuntu: sudo ubuntu-drivers install --gpgpu nvidia:<branch>-server  # pre-signed modules"))


_DKMS = _rx(r"Bad return status for module build on kernel: (?P<kernel>\S+) \((?P<arch>[\w-]+)\)")
_DKMS_LOG = _rx(r"Consult (?P<log>/\S*?/(?P<module>[\w-]+)/(?P<version>[\w.-]+)/build/make\.log)")


@_detector
def _dkms(doc: _Doc) -> Iterator[Hit]:
    m = doc.has(_DKMS)
    if not m:
        return
    log = doc.has(_DKMS_LOG)
    values: dict[str, Any] = {"kernel": m["kernel"], "arch": m["arch"]}
    if log:
        values.update(log_file=log["log"], module=log["module"], module_version=log["version"])
    path = values.get("log_file", "/var/lib/dkms/nvidia/<version>/build/make.log")
    yield m.start(), Finding(
        "dkms.build-failed", f"DKMS could not build the driver for kernel {m['kernel']}",
        "The driver's kernel module does not compile against this kernel: headers missing or for another "
        "kernel, a compiler different from the kernel's, or a kernel newer than this driver branch supports "
        "(then a newer driver branch is needed, or stay on the older kernel).",
        f"sudo tail -n 50 {path}", doc.excerpt(m.start(), m.end()), values,
        (f"sudo apt-get install -y linux-headers-{m['kernel']}  # RHEL/Fedora: kernel-devel-{m['kernel']}",
         "gpunode install --driver <a newer branch>"))


# ---------------------------------------------------------------------------------------------------------
# Xid and SXid
# ---------------------------------------------------------------------------------------------------------

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

# number: (meaning, severity)
XIDS: dict[int, tuple[str, str]] = {
    8: ("GPU stopped processing: a channel timed out", "app"),
    11: ("invalid or corrupted push buffer stream", "app"),
    13: ("graphics engine exception: usually the application (illegal address or instruction, out-of-bounds "
         "access); rarely the driver or hardware", "app"),
    31: ("GPU memory page fault: the application accessed an invalid GPU address (a driver bug in rare cases)",
         "app"),
    32: ("invalid or corrupted push buffer stream (PBDMA)", "app"),
    38: ("driver firmware error (watchdog)", "info"),
    43: ("GPU stopped processing the application's channel after a fault in that application; other work "
          "goes on", "app"),
    45: ("preemptive cleanup: the driver stopped the application's channels, usually because of an earlier "
          "error (look for another Xid just before) or because the process was killed", "info"),
    46: ("GPU stopped processing (GPU timeout)", "reset"),
    48: ("double-bit (uncorrectable) ECC error in GPU memory", "reset"),
    54: ("auxiliary power is not connected to the GPU board", "hardware"),
    61: ("internal micro-controller breakpoint or warning (older GPUs)", "reset"),
    62: ("internal micro-controller halt", "reset"),
    63: ("memory remapping event: a failing memory row (A100 and newer) or page (older GPUs) was marked for "
          "remapping/retirement; it takes effect at the next GPU reset", "info"),
    64: ("memory remapping or page retirement failed", "hardware"),
    68: ("video decoder (NVDEC) exception", "app"),
    69: ("graphics engine class error", "app"),
    74: ("NVLink error", "reset"),
    79: ("GPU has fallen off the bus: it no longer answers on PCIe", "reboot"),
    80: ("corrupted data sent to the GPU", "app"),
    92: ("high single-bit ECC error rate (corrected)", "info"),
    93: ("non-fatal violation of the InfoROM wear limit", "info"),
    94: ("contained uncorrectable memory error: only the affected application was stopped", "app"),
    95: ("uncontained uncorrectable memory error: every application on the GPU is affected", "reset"),
    109: ("context switch timeout", "reset"),
    110: ("security fault", "reset"),
    119: ("GSP RPC timeout: the GPU System Processor firmware did not answer the driver in time", "reset"),
    120: ("GSP error: the GPU System Processor firmware reported an error", "reset"),
    121: ("C2C (chip-to-chip) link error", "info"),
    136: ("NVLink link training failed", "reset"),
    137: ("NVLink privilege error", "info"),
    140: ("unrecovered ECC error", "reset"),
    143: ("GPU initialisation error", "reset"),
    144: ("NVLink SAW error", "nvlink"),
    145: ("NVLink RLW error", "nvlink"),
    146: ("NVLink TLW error", "nvlink"),
    147: ("NVLink TREX error", "nvlink"),
    148: ("NVLink NVLPW_CTRL error", "nvlink"),
    149: ("NVLink NETIR error", "nvlink"),
    150: ("NVLink MSE error", "nvlink"),
    151: ("key rotation error (confidential computing)", "reboot"),
    154: ("GPU recovery action changed: the driver states what it takes to recover from an earlier error", "info"),
    155: ("NVLink software-defined error", "reset"),
    156: ("resource retirement event", "reset"),
    157: ("resource retirement failure", "hardware"),
    158: ("GPU fatal timeout", "reset"),
}

# Where a message's detail ends when several were run together on one line: the next timestamp.
_NEXT_STAMP = r"\[\s*[+-]?\d+\.\d+\]|\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)\s"
_XID = re.compile(rf"\bXid\s+\((?:PCI:)?(?P<pci>{_PCI})(?:\s+GPU-I:(?P<gi>\w+))?[^)]*\):\s*(?P<xid>\d+)\b"
                  rf",?\s*(?P<rest>(?:(?!\bNVRM:|\bXid\s+\(|{_NEXT_STAMP})[^\n])*)")  # up to the next message
_XID_PID = re.compile(r"^pid=(?P<pid>'[^']*'|[^,\s]*),\s*(?:name=(?P<name>[^,]*),\s*)?")
_RECOVERY = re.compile(r"changed from (?P<from>0x[0-9a-fA-F]+) \((?P<from_text>[^)]*)\) to (?P<to>0x[0-9a-fA-F]+) "
                       r"\((?P<to_text>[^)]*)\)", re.IGNORECASE)


def _reset_command(pci: str) -> str:
    address = pci if "." in pci else f"{pci}.0"
    return f"sudo nvidia-smi -r -i {address}"


def _xid_finding(xid: int, pci: str, lines: list[re.Match[str]], doc: _Doc) -> Finding:
    first = lines[0]
    meaning, severity = XIDS.get(xid, (f"Xid {xid} is not in gpunode's table; see NVIDIA's Xid catalog", "unknown"))
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
    fix = {"info": "sudo journalctl -k | grep -i xid  # nothing to do now; watch whether it repeats",
           "app": "compute-sanitizer <program>  # after restarting the job, if the fault recurs",
           "reset": reset, "reboot": "sudo reboot", "hardware": "sudo nvidia-bug-report.sh",
           "unknown": "sudo nvidia-bug-report.sh"}.get(severity, reset)
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
            fix = f"{reset}  # when the GPU is idle, after restarting the job: remaps the failing memory"
    elif severity == "nvlink":
        fatal = re.search(r"\b(Non-?fatal|Fatal)\b", rest, re.IGNORECASE)
        if fatal:
            values["fatal"] = fatal[1].lower() == "fatal"
            severity = "reset" if values["fatal"] else "info"
        else:
            severity = "reset"
        fix = reset if severity == "reset" else "nvidia-smi nvlink -e -i " + (pci if "." in pci else f"{pci}.0")
    elif xid == 154:
        rm = _RECOVERY.search(rest)
        if rm:
            values["recovery_action"] = rm["to_text"]
            action = rm["to_text"].lower()
            if "reboot" in action:
                severity, fix = "reboot", "sudo reboot"
            elif "reset" in action or "flr" in action:
                severity, fix = "reset", reset
            elif "drain" in action:
                severity, fix = "reset", reset
    elif xid == 48:
        also.append("nvidia-smi -q -d ECC,ROW_REMAPPER,PAGE_RETIREMENT -i " + (pci if "." in pci else f"{pci}.0"))
    elif xid == 63:
        fix = f"{reset}  # when the GPU is idle, to apply the remap"
        also.append("nvidia-smi -q -d ROW_REMAPPER -i " + (pci if "." in pci else f"{pci}.0"))
    elif xid == 79:
        also.append("sudo nvidia-bug-report.sh  # before rebooting")
    elif xid == 74:
        also.append("nvidia-smi nvlink -s -i " + (pci if "." in pci else f"{pci}.0"))
    elif xid == 54:
        fix = "power off and connect the GPU's auxiliary power cables"
    values["meaning"] = meaning
    values["severity"] = severity
    values["action"] = SEVERITY_TEXT[severity]
    if severity in ("reboot", "hardware", "unknown") or xid in (48, 64, 95, 119, 120):
        also.append("if it recurs on the same GPU: collect `sudo nvidia-bug-report.sh` and contact your "
                    "hardware vendor")
    also.append(XID_CATALOG_URL)
    times = f" ({len(lines)} times)" if len(lines) > 1 else ""
    cause = f"Xid {xid} on GPU {pci}{times}: {meaning}. Action: {SEVERITY_TEXT[severity]}."
    return Finding(f"xid.{xid}", f"Xid {xid}: {meaning.split(':')[0]}", cause, fix,
                   doc.excerpt(first.start(), first.end()), values, tuple(also))


@_detector
def _xids(doc: _Doc) -> Iterator[Hit]:
    groups: dict[tuple[int, str], list[re.Match[str]]] = {}
    for m in _XID.finditer(doc.text):
        groups.setdefault((int(m["xid"]), m["pci"].lower()), []).append(m)
    for (xid, pci), lines in groups.items():
        yield lines[0].start(), _xid_finding(xid, pci, lines, doc)


_SXID = re.compile(rf"\bSXid\s+\(PCI:(?P<pci>{_PCI})\):\s*(?P<sxid>\d+),\s*(?P<sev>Non-fatal|Fatal)?,?\s*"
                   rf"(?P<rest>(?:(?!\bSXid\s+\(|\bnvidia-nvswitch\d|{_NEXT_STAMP})[^\n])*)", re.IGNORECASE)
_FM_SXID = _rx(r"detected NVSwitch (?P<sev>non-fatal|fatal) error (?P<sxid>\d+) on fid \d+ on NVSwitch pci bus id "
               rf"(?P<pci>{_PCI})(?: physical id (?P<phys>\d+))?(?: port (?P<port>\d+))?")


@_detector
def _sxids(doc: _Doc) -> Iterator[Hit]:
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
            fix = "sudo reboot"
        else:
            cause = (f"NVSwitch {pci} reported non-fatal error SXid {sxid}"
                     + (f" on port {values['port']}" if "port" in values else "")
                     + ". Work goes on; if the count keeps growing on the same port, have the NVLink/NVSwitch "
                     "hardware checked.")
            fix = "nvidia-smi nvlink -e  # NVLink error counters per GPU"
        times = f" ({len(matches)} times)" if len(matches) > 1 else ""
        yield first.start(), Finding(
            f"sxid.{sxid}", f"NVSwitch {'fatal' if fatal else 'non-fatal'} error SXid {sxid}{times}", cause, fix,
            doc.excerpt(first.start(), first.end()), values,
            ("journalctl -u nvidia-fabricmanager -b", "sudo nvidia-bug-report.sh"))


# ---------------------------------------------------------------------------------------------------------
# explain
# ---------------------------------------------------------------------------------------------------------

# A finding that only restates the consequence of another one is dropped when the other is present.
_SUPPRESSED_BY = {
    "kernel.probe-failed": ("kernel.fallen-off-bus", "kernel.gpu-unsupported", "kernel.open-module-unsupported",
                            "kernel.no-adapter-probed"),
    "installer.failed": ("installer.nouveau", "installer.no-kernel-source", "installer.nvidia-ko-load",
                         "installer.module-in-use"),
    "smi.no-devices": ("kernel.fallen-off-bus", "kernel.open-module-unsupported", "kernel.gpu-unsupported"),
    "kernel.fallen-off-bus": ("xid.79",),
}


def explain(text: str) -> list[Finding]:
    """Every recognised problem in `text` (a paste, a log), in the order they first appear."""
    doc = _Doc(normalise(text))
    if not doc.text:
        return []
    hits: list[Hit] = []
    for detector in DETECTORS:
        hits.extend(detector(doc))
    ids = {finding.id for _, finding in hits}
    hits = [(pos, f) for pos, f in hits if not any(other in ids for other in _SUPPRESSED_BY.get(f.id, ()))]
    hits.sort(key=lambda hit: hit[0])
    return [finding for _, finding in hits]

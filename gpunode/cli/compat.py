"""`gpunode compat`: CUDA / driver / GPU compatibility questions, answered offline from NVIDIA's tables.

    gpunode compat --driver 535.129.03      newest native CUDA, minor-version range, architectures, branch
    gpunode compat --cuda 12.4              minimum drivers (native, minor-compat), recommended drivers
    gpunode compat --image nvidia/cuda:12.4.1-base-ubuntu22.04 [--driver V]   NVIDIA_REQUIRE_CUDA and whether V meets it
    gpunode compat --gpu H100               architecture, driver branches, CUDA majors, kernel-module flavour

Options combine: with --driver and any of --cuda/--image/--gpu, `checks` says whether that driver fits them.
Exit codes: 0 answered (every check ok or conditional), 1 a check is blocked, 2 bad input (a version, image or
GPU name, or a driver whose branch is not in data/driver_branches.csv). `--driver 535` asks about a branch: it is
answered for the newest 535 release in data/driver_branches.csv, and the output says so. A conditional check is shown in yellow with the condition in its reason.

JSON shape (`--json`); a section is null when its option was not given:

    {
      "schema_version": 1,
      "query":  {"driver": str|null, "cuda": str|null, "image": str|null, "gpu": str|null},
      "driver": null | {
        "version": "535.129.03", "branch": 535,
        "branch_asked": 535|null,               # `--driver 535`: answered for the branch's newest known release
        "beyond_latest_known": bool,            # newer than the newest release of its branch in the table
        "branch_type": "lts"|"production"|"new-feature"|null, "branch_end_of_life": "2026-06"|null,
        "branch_status": "supported"|"end-of-life"|"unknown", "branch_latest_known": "535.309.01"|null,
        "native_cuda": "12.2"|null, "native_cuda_release": "12.2.2"|null,
        "minor_compat": [{"major": 12, "min_driver": "525.60.13", "cuda_range": ["12.3", "12.9"]}],
        "minor_compat_limits": [str],
        "unknown_minimum": ["13.4.0", ...],          # newer releases whose minimum driver is unknown
        "architectures": [{"architecture": "Kepler", "compute_capabilities": ["3.5", "3.7"],
                           "supported": false, "reason": str|null}],
        "verify_image": "nvidia/cuda:12.2.2-base-ubuntu22.04"|null
      },
      "cuda": null | {
        "version": "12.4", "releases": [{"version", "release", "min_driver", "source", "note"}],
        "native_min_driver": "550.54.14"|null, "minor_compat_min_driver": "525.60.13"|null,
        "minor_compat_limits": [str],
        "recommended_drivers": [{"version": "580.178.04", "branch": 580, "type": "lts",
                                 "end_of_life": "2028-06"|null, "status": "supported"}],
        "architectures": [{"architecture": "Maxwell", "compute_capabilities": ["5.0", "5.2"]}]
      },
      "image": null | {
        "image": str, "cuda": "12.4.1"|null, "require_cuda": str|null, "require_cuda_recorded": bool,
        "cuda_from_tag_name": bool,             # not nvidia/cuda; CUDA read off its tag (...-cuda12.4-...)
        "native_min_driver": "550.54.14"|null, "forward_compat_branches": [int], "forward_compat_brands": [str],
        "driver": str|null, "satisfied": true|false|null, "satisfied_by": [str], "explanation": str
      },
      "gpu": null | {
        "query": "H100",
        "devices": [{"pci_id": "10de:2330", "name", "architecture", "compute_capability", "segment", "open_module"}],
        "architectures": [{"architecture": "Hopper", "compute_capabilities": ["9.0"], "cuda_first": "11.8",
                           "cuda_last": str|null, "cuda_majors": [11, 12, 13], "min_driver": "520.61.05"|null,
                           "last_driver_branch": int|null,
                           "supported_branches": [{"branch", "type", "end_of_life", "status", "latest_known"}],
                           "kernel_module": {"open_module": "supported", "flavour": "open", "reason": str}}]
      },
      "checks": [{"target": str, "status": "ok"|"conditional"|"blocked", "reason": str,   # conditional: ok only
                                                                  # if what the reason says holds (a GPU brand)
                  "via": "native"|"minor-version compatibility"|"forward compatibility"|null,
                  "min_driver": str|null, "max_branch": int|null,   # the driver range this target accepts
                  "fix": str|null, "notes": [str]}],                # fix: a non-driver fix (e.g. an older CUDA)
      "status": "ok"|"conditional"|"blocked", "fix": str|null
    }
"""

from __future__ import annotations

from datetime import date
from typing import TYPE_CHECKING, Any

import typer

from gpunode.cli._params import CudaOpt, DriverOpt, GpuOpt, ImageOpt, JsonOpt, command, expected_errors
from gpunode.errors import UsageError
from gpunode.ui import labelled, node_text, out, print_json

# NVIDIA's tables are read when the command runs: `gpunode compat --help` needs only its options
if TYPE_CHECKING:
    from rich.text import Text

    from gpunode import compat as cm
    from gpunode import gpus as gpu_table

CHECK_STYLE = {"ok": "green", "conditional": "yellow", "blocked": "bold red"}


# ---------------------------------------------------------------------------------------------------------
# Building the report (pure)
# ---------------------------------------------------------------------------------------------------------


def _driver_section(query: cm.DriverQuery, today: date | None) -> dict[str, Any]:
    from gpunode import compat as cm

    t = cm.tables()
    driver = query.version
    branch_no = cm.branch_of(driver)
    branch = t.branches.get(branch_no)
    release = cm.native_release(driver)
    last_known = max((r for r in t.releases if r.min_driver is not None), key=lambda r: r.version)
    unknown = [str(r.version) for r in t.releases if r.min_driver is None and r.version > last_known.version] \
        if release is not None and release.version == last_known.version else []
    archs = []
    for name, members in cm.architecture_groups():
        supported, why = cm.driver_supports(members[0], driver)
        archs.append({"architecture": name, "compute_capabilities": [a.compute_capability for a in members],
                      "supported": supported, "reason": why})
    try:
        verify = cm.verify_image_for(driver)
    except cm.CompatError:
        verify = None
    return {
        "version": str(driver), "branch": branch_no, "branch_asked": query.branch_asked,
        "beyond_latest_known": query.beyond_latest_known,
        "branch_type": branch.type if branch else None,
        "branch_end_of_life": (branch.end_of_life or None) if branch else None,
        "branch_status": branch.status(today) if branch else "unknown",
        "branch_latest_known": str(branch.latest_known) if branch and branch.latest_known else None,
        "native_cuda": release.series if release else None,
        "native_cuda_release": str(release.version) if release else None,
        "minor_compat": [r.to_dict() for r in cm.minor_compat_ranges(driver)],
        "minor_compat_limits": list(cm.MINOR_COMPAT_LIMITS),
        "unknown_minimum": unknown,
        "architectures": archs,
        "verify_image": verify,
    }


def _branch_entry(b: cm.Branch, today: date | None) -> dict[str, Any]:
    return {"version": str(b.latest_known), "branch": b.branch, "type": b.type,
            "end_of_life": b.end_of_life or None, "status": b.status(today)}


def _cuda_section(need: cm.CudaNeed, today: date | None) -> dict[str, Any]:
    from gpunode import compat as cm

    minimum = need.native_min
    recommended = cm.recommended_drivers(minimum, None, today) if minimum is not None else []
    wanted = cm.Ver(need.series)
    archs = [{"architecture": name, "compute_capabilities": [a.compute_capability for a in members
                                                             if cm.cuda_supports(a, wanted)]}
             for name, members in cm.architecture_groups() if any(cm.cuda_supports(a, wanted) for a in members)]
    return {**need.to_dict(), "minor_compat_limits": list(cm.MINOR_COMPAT_LIMITS) if need.minor_compat_min else [],
            "recommended_drivers": [_branch_entry(b, today) for b in recommended], "architectures": archs}


def _image_section(need: cm.ImageNeed, driver: cm.Version | None, segment: str | None) -> dict[str, Any]:
    from gpunode import compat as cm

    section: dict[str, Any] = {**need.to_dict(), "driver": str(driver) if driver else None, "satisfied": None,
                               "satisfied_by": []}
    if need.requirement is None:
        section["explanation"] = cm.UNREADABLE_IMAGE
        return section
    series = cm.major_minor(need.ref.cuda) if need.ref.cuda else "?"
    text = f"{need.ref.image} requires cuda>={series}: a driver >= {need.native_min} meets it natively"
    if need.ref.cuda_from_tag_name:
        text = cm.tag_name_note(need.ref) + f"; a driver >= {need.native_min} meets cuda>={series} natively"
    if need.forward_compat:
        text += ("; its forward-compatibility clauses also admit branches "
                 + ", ".join(f"R{b}" for b in need.forward_compat.branches) + " on the brands "
                 + ", ".join(need.forward_compat.brands))
    elif not need.recorded and not need.ref.cuda_from_tag_name:
        text += "; gpunode has not recorded this tag's forward-compatibility clauses (only cuda>= is checked)"
    if driver is not None:
        answer, ways = cm.image_accepts(need, driver, segment)
        section["satisfied"], section["satisfied_by"] = answer, ways
        verdict = {True: "meets it", False: "does not meet it", None: "meets it only on some GPU brands"}[answer]
        text += f". Driver {driver} {verdict}"
        if answer is False:
            text += f" ('unsatisfied condition: cuda>={series}')"
    section["explanation"] = text
    return section


def _gpu_section(query: str, matches: list[gpu_table.Gpu], driver: cm.Version | None,
                 today: date | None) -> dict[str, Any]:
    from gpunode import compat as cm
    from gpunode import gpus as gpu_table

    t = cm.tables()
    groups: dict[str, list[gpu_table.Gpu]] = {}
    for g in matches:
        groups.setdefault(g.architecture, []).append(g)
    archs = []
    for name, members in groups.items():
        arch_rows = [gpu_table.architecture_of(g) for g in members]
        arch = arch_rows[0]
        minimum = cm.architecture_min_driver(arch)
        low_branch = cm.branch_of(minimum) if minimum else 0
        branches = [b.to_dict(today) for b in sorted(t.branches.values(), key=lambda b: b.branch)
                    if b.branch >= low_branch and (arch.last_driver_branch is None or b.branch <= arch.last_driver_branch)]
        flavour, reason = gpu_table.module_flavour([members[0].device_id], driver)
        opens = sorted({g.open_module for g in members})
        archs.append({
            "architecture": name,
            "compute_capabilities": sorted({g.compute_capability for g in members}),
            "cuda_first": cm.major_minor(arch.first_cuda),
            "cuda_last": cm.major_minor(arch.last_cuda) if arch.last_cuda else None,
            "cuda_majors": cm.cuda_majors(arch),
            "min_driver": str(minimum) if minimum else None,
            "last_driver_branch": arch.last_driver_branch,
            "supported_branches": branches,
            "kernel_module": {"open_module": opens[0] if len(opens) == 1 else "mixed", "flavour": flavour,
                              "reason": reason},
        })
    return {"query": query, "devices": [g.to_dict() for g in matches], "architectures": archs}


def _cuda_on_gpus(matches: list[gpu_table.Gpu], need: cm.CudaNeed | None,
                  image_need: cm.ImageNeed | None) -> list[cm.Check]:
    from gpunode import compat as cm
    from gpunode import gpus as gpu_table

    targets: list[tuple[str, cm.Version]] = []
    if need is not None:
        targets.append((f"CUDA {need.cuda}", cm.Ver(need.cuda)))
    if image_need is not None and image_need.ref.cuda is not None:
        targets.append((f"image {image_need.ref.image}", image_need.ref.cuda))
    checks = []
    seen: set[str] = set()
    for g in matches:
        if g.architecture in seen:
            continue
        seen.add(g.architecture)
        for target, cuda in targets:
            check = cm.check_cuda_architecture(gpu_table.architecture_of(g), cuda, target, g.name)
            if check is not None:
                checks.append(check)
    return checks


def _overall(checks: list[cm.Check]) -> str:
    statuses = {c.status for c in checks}
    return next((s for s in ("blocked", "conditional") if s in statuses), "ok")


def build_report(driver: str | None = None, cuda: str | None = None, image: str | None = None,
                 gpu: str | None = None, today: date | None = None) -> dict[str, Any]:
    """Everything `gpunode compat` prints, as the documented JSON shape. Bad input raises UsageError."""
    from gpunode import compat as cm
    from gpunode import gpus as gpu_table

    if not any((driver, cuda, image, gpu)):
        raise UsageError("compat needs at least one of --driver, --cuda, --image or --gpu",
                         fix="e.g. gpunode compat --driver 535.129.03, or --cuda 12.4, or --gpu H100")
    query = cm.driver_query(driver) if driver is not None else None
    version = query.version if query is not None else None
    need = cm.driver_needed_for_cuda(cuda) if cuda is not None else None
    image_need = cm.image_needs(image) if image is not None else None
    matches = gpu_table.find(gpu) if gpu is not None else []
    segments = sorted({g.segment for g in matches})
    segment = segments[0] if len(segments) == 1 else None

    from gpunode.runner import SCHEMA_VERSION  # the pipeline's import cost is paid here, not at start-up

    report: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "query": {"driver": driver, "cuda": cuda, "image": image, "gpu": gpu},
        "driver": _driver_section(query, today) if query is not None else None,
        "cuda": _cuda_section(need, today) if need is not None else None,
        "image": _image_section(image_need, version, segment) if image_need is not None else None,
        "gpu": _gpu_section(gpu, matches, version, today) if gpu is not None else None,
        "checks": [], "status": "ok", "fix": None,
    }
    if version is not None:
        checks: list[cm.Check] = []
        seen: set[str] = set()
        for g in matches:
            if g.architecture not in seen:
                seen.add(g.architecture)
                checks.append(cm.check_architecture(version, gpu_table.architecture_of(g), f"GPU {g.name}"))
        if need is not None:
            checks.append(cm.check_cuda(version, need.cuda))
        if image_need is not None:
            checks.append(cm.check_image(version, image_need.ref, [segment] if matches else []))
        checks += _cuda_on_gpus(matches, need, image_need)
        report["checks"] = [c.to_dict() for c in checks]
        report["status"] = _overall(checks)
        if any(not c.ok for c in checks):
            report["fix"] = cm.fix_for(checks, version, today)
    elif matches and (need is not None or image_need is not None):
        checks = _cuda_on_gpus(matches, need, image_need)
        report["checks"] = [c.to_dict() for c in checks]
        report["status"] = _overall(checks)
        if any(not c.ok for c in checks):
            report["fix"] = cm.fix_for(checks, None, today)
    return report


# ---------------------------------------------------------------------------------------------------------
# Human output
# ---------------------------------------------------------------------------------------------------------


def _kv(title: str, rows: list[tuple[str, str | Text]]) -> None:
    from rich.table import Table
    from rich.text import Text
    out.print(Text(title, style="bold"))
    table = Table(box=None, show_header=False, pad_edge=False, padding=(0, 2, 0, 2))
    table.add_column("key", style="dim", no_wrap=True)
    table.add_column("value", overflow="fold")
    for key, value in rows:
        table.add_row(key, value)
    out.print(table)


def _render_driver(d: dict[str, Any]) -> None:
    from gpunode import compat as cm

    branch = f"R{d['branch']}"
    if d["branch_type"]:
        label = cm.Branch.TYPE_LABELS.get(d["branch_type"], d["branch_type"])
        eol = d["branch_end_of_life"]
        branch += f" ({label}, " + {"supported": f"supported until {eol}", "end-of-life": f"end of life since {eol}",
                                    "unknown": "end of life not recorded"}[d["branch_status"]] + ")"
    else:
        branch += " (not in gpunode's branch table)"
    if d["branch_latest_known"]:
        branch += f"; latest known {d['branch_latest_known']}"
    if d["beyond_latest_known"]:
        branch += f"; {d['version']} is newer than every R{d['branch']} release gpunode knows"
    native = (f"CUDA up to {d['native_cuda']} (release {d['native_cuda_release']})" if d["native_cuda"]
              else "older than every CUDA release in the table")
    minor = "; ".join(f"CUDA {r['cuda_range'][0]} to {r['cuda_range'][1]} (CUDA {r['major']}.x needs >= "
                      f"{r['min_driver']})" for r in d["minor_compat"]) or "none beyond the native version"
    rows: list[tuple[str, str | Text]] = [("branch", branch), ("native", native), ("minor-version compat", minor)]
    if d["minor_compat"]:
        rows.append(("not through it", "; ".join(d["minor_compat_limits"][:2])))
    if d["unknown_minimum"]:
        rows.append(("unknown", "minimum driver not published for CUDA " + ", ".join(d["unknown_minimum"])))
    yes = [f"{a['architecture']} ({', '.join(a['compute_capabilities'])})" for a in d["architectures"] if a["supported"]]
    rows.append(("architectures", ", ".join(yes) or "none"))
    for a in d["architectures"]:
        if not a["supported"]:
            rows.append(("  not " + a["architecture"], a["reason"]))
    rows.append(("verify image", d["verify_image"] or "none known for this driver"))
    title = f"driver {d['version']}"
    if d["branch_asked"] is not None:
        title = f"driver branch R{d['branch_asked']}: answered for {d['version']}, its newest release gpunode knows"
    _kv(title, rows)


def _render_cuda(c: dict[str, Any]) -> None:
    from gpunode import compat as cm

    rows: list[tuple[str, str | Text]] = []
    rows.append(("releases", ", ".join(f"{r['version']} (>= {r['min_driver'] or 'unknown'})" for r in c["releases"])))
    rows.append(("native", f"driver >= {c['native_min_driver']}" if c["native_min_driver"]
                 else "minimum driver not published"))
    rows.append(("minor-version compat", f"driver >= {c['minor_compat_min_driver']}" if c["minor_compat_min_driver"]
                 else "none (minor-version compatibility starts with CUDA 11)"))
    if c["minor_compat_limits"]:
        rows.append(("not through it", "; ".join(c["minor_compat_limits"][:2])))
    rec = ", ".join(f"{r['version']} (R{r['branch']} {cm.Branch.TYPE_LABELS.get(r['type'], r['type'])}"
                    + (f", until {r['end_of_life']}" if r["end_of_life"] and r["status"] != "end-of-life" else "")
                    + (", end of life" if r["status"] == "end-of-life" else "") + ")" for r in c["recommended_drivers"])
    rows.append(("recommended", rec or "no known release yet"))
    rows.append(("architectures", ", ".join(f"{a['architecture']} ({', '.join(a['compute_capabilities'])})"
                                            for a in c["architectures"])))
    _kv(f"CUDA {c['version']}", rows)


def _render_image(i: dict[str, Any]) -> None:
    from rich.text import Text
    rows: list[tuple[str, str | Text]] = []
    if i["require_cuda"] is None:
        rows.append(("NVIDIA_REQUIRE_CUDA", "unknown offline"))
    else:
        cond = i["require_cuda"]
        if len(cond) > 160:
            cond = cond[:160] + f" ... ({len(i['forward_compat_branches']) * len(i['forward_compat_brands'])} brand clauses)"
        how = ("" if i["require_cuda_recorded"] else "  (read from the tag's name)" if i["cuda_from_tag_name"]
               else "  (brand clauses not recorded)")
        rows.append(("NVIDIA_REQUIRE_CUDA", cond + how))
        rows.append(("needs", f"driver >= {i['native_min_driver']} (native)"))
    if i["driver"]:
        verdict = {True: Text("yes", style="green"), False: Text("no", style="bold red"),
                   None: Text("depends on the GPU brand", style="yellow")}[i["satisfied"]]
        rows.append((f"driver {i['driver']}", verdict))
    rows.append(("", i["explanation"]))
    _kv(f"image {i['image']}", rows)


def _render_gpu(g: dict[str, Any]) -> None:
    devices = ", ".join(f"{d['name']} [{d['pci_id']}]" for d in g["devices"])
    for a in g["architectures"]:
        last = f"R{a['last_driver_branch']} (last)" if a["last_driver_branch"] else "current"
        branches = ", ".join(f"R{b['branch']}" for b in a["supported_branches"])
        rows: list[tuple[str, str | Text]] = [
            ("devices", devices),
            ("compute capability", ", ".join(a["compute_capabilities"])),
            ("CUDA", f"{a['cuda_first']} to {a['cuda_last'] or 'current'} (majors "
                     + ", ".join(map(str, a["cuda_majors"])) + ")"),
            ("driver", f">= {a['min_driver'] or 'any in the table'} up to {last}"),
            ("known branches", branches or "none"),
            ("kernel module", f"open module {a['kernel_module']['open_module']}; "
                              f"install {a['kernel_module']['flavour']}: {a['kernel_module']['reason']}"),
        ]
        _kv(f"GPU {g['query']}: {a['architecture']}", rows)


def render(report: dict[str, Any]) -> None:
    from rich.table import Table
    from rich.text import Text
    for key, fn in (("driver", _render_driver), ("cuda", _render_cuda), ("image", _render_image), ("gpu", _render_gpu)):
        if report[key] is not None:
            fn(report[key])
    if report["checks"]:
        table = Table(box=None, header_style="bold", pad_edge=False)
        for column in ("check", "status", "reason"):
            table.add_column(column, overflow="fold")
        for c in report["checks"]:
            table.add_row(node_text(c["target"]), Text(c["status"], style=CHECK_STYLE.get(c["status"], "")),
                          node_text(c["reason"]))
        out.print(table)
        for c in report["checks"]:
            for note in c["notes"]:
                out.print(labelled("note:", node_text(note, "dim"), indent=2))
        if report["fix"]:
            out.print(labelled("fix:", node_text(report["fix"], "bold green")))


@command()
def compat(
    driver: DriverOpt = None, cuda: CudaOpt = None, image: ImageOpt = None, gpu: GpuOpt = None,
    json_output: JsonOpt = False,
) -> None:
    """CUDA / driver / GPU compatibility, offline: --driver, --cuda, --image, --gpu (combinable)."""
    with expected_errors():
        report = build_report(driver, cuda, image, gpu)
    if json_output:
        print_json(report)
    else:
        render(report)
    raise typer.Exit(1 if report["status"] == "blocked" else 0)

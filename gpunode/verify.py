"""`gpunode verify`: start containers on the node with every configured engine and check that they see the GPUs.

Why run containers at all when doctor reads the configuration: the configuration can be right and the stack still
fail (docker not restarted since the toolkit arrived, an image whose NVIDIA_REQUIRE_CUDA the driver does not
meet, a hook that cannot find libnvidia-ml). Only a container proves it. Each test runs `nvidia-smi -L` inside and
compares the GPU UUIDs it lists with the host's (from the same probe doctor uses); a failure goes through
`explain`, so it comes back with its cause and fix.

What runs: docker with `--gpus all`, with a single device, and with `--runtime=nvidia` when daemon.json defines
it; containerd through nerdctl (`--gpus all`) and ctr (`--gpus 0`, and `--runc-binary` pointing at the nvidia
runtime containerd is configured with); podman through CDI. The image is the newest nvidia/cuda base image the
driver runs natively (gpunode/compat.py, `verify_image_for`), or `--image`. `--cuda-test` adds a small CUDA
workload (NVIDIA's vectorAdd sample) per engine. Containers run with `--rm`; pulled images stay on the node.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gpunode import __version__, compat, fixes, gpus
from gpunode.connection.base import Connection
from gpunode.errors import GpunodeError, UsageError
from gpunode.explain import Finding, explain
from gpunode.facts import Facts
from gpunode.facts import containers as container_facts
from gpunode.facts import driver as driver_facts
from gpunode.facts import packages as package_facts
from gpunode.facts.containers import (
    ConfigError,
    containerd_state,
    cri_disabled,
    docker_state,
    effective_containerd,
    parse_daemon_json,
    parse_toml,
    survey_engines,
)
from gpunode.facts.driver import SmiGpu, driver_state
from gpunode.record import Frozen, Record
from gpunode.verify_engines import DEFAULT_TIMEOUT, ENGINES

# NVIDIA's vectorAdd sample (the GPU Operator's validation workload), newest first: (image, CUDA it needs).
# Tags as used in NVIDIA's GPU Operator documentation and validator.
CUDA_WORKLOADS = (
    ("nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0-ubuntu22.04", "12.5"),
    ("nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda11.7.1-ubuntu20.04", "11.7"),
)
_GPU_LINE = re.compile(r"^GPU (?P<index>\d+): (?P<name>.*?) \(UUID: (?P<uuid>GPU-[0-9A-Fa-f-]+)\)", re.M)


@dataclass(frozen=True, eq=False, repr=False)
class Test(Frozen):
    engine: str  # docker | containerd | podman
    name: str  # "docker --gpus all"
    argv: tuple[str, ...]
    expect: tuple[str, ...] = ()  # GPU UUIDs nvidia-smi -L must list inside (a workload expects none)
    kind: str = "smi"  # smi | cuda
    setup: tuple[tuple[str, ...], ...] = ()  # commands that must succeed first (ctr image pull)


@dataclass(eq=False, repr=False)
class Outcome(Record):
    test: Test
    status: str  # pass | fail | skip
    reason: str
    fix: str | None = None
    exit_code: int | None = None
    seen: tuple[str, ...] = ()
    findings: list[Finding] = field(default_factory=list)
    output: str = ""  # the tail of what the container printed

    def to_dict(self) -> dict[str, object]:
        return {"engine": self.test.engine, "name": self.test.name, "kind": self.test.kind,
                "command": " ".join(self.test.argv) if self.test.argv else None, "status": self.status,
                "reason": self.reason, "fix": self.fix, "exit_code": self.exit_code,
                "expected_gpus": list(self.test.expect), "seen_gpus": list(self.seen),
                "findings": [f.to_dict() for f in self.findings], "output": self.output}


@dataclass(eq=False, repr=False)
class Report(Record):
    host: str
    node: dict[str, object]
    driver: str | None = None
    image: str | None = None
    image_source: str = ""  # "compat" (chosen for the driver) | "--image"
    image_check: compat.Check | None = None
    cuda_image: str | None = None
    host_gpus: tuple[SmiGpu, ...] = ()
    outcomes: list[Outcome] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: tuple[str, str | None] | None = None  # (message, fix) when nothing could run

    @property
    def exit_code(self) -> int:
        if self.error or not any(o.status == "pass" for o in self.outcomes):
            return 1
        return 1 if any(o.status == "fail" for o in self.outcomes) else 0

    def to_dict(self, schema_version: int) -> dict[str, object]:
        return {
            "schema_version": schema_version, "gpunode_version": __version__, "host": self.host, "node": self.node,
            "driver": self.driver, "image": self.image, "image_source": self.image_source,
            "image_check": self.image_check.to_dict() if self.image_check else None, "cuda_image": self.cuda_image,
            "host_gpus": [{"index": g.index, "uuid": g.uuid, "name": g.name, "pci": g.bus} for g in self.host_gpus],
            "tests": [o.to_dict() for o in self.outcomes],
            "summary": {s: sum(1 for o in self.outcomes if o.status == s) for s in ("pass", "fail", "skip")},
            "notes": self.notes, "exit_code": self.exit_code,
            "error": {"message": self.error[0], "fix": self.error[1]} if self.error else None,
        }


# ---- what to run (pure) --------------------------------------------------------------------------------------


def qualified(image: str) -> str:
    """ctr wants a full reference: nvidia/cuda:T -> docker.io/nvidia/cuda:T, ubuntu -> docker.io/library/ubuntu."""
    first = image.split("/", 1)[0]
    if "/" in image and ("." in first or ":" in first or first == "localhost"):
        return image
    return f"docker.io/{image}" if "/" in image else f"docker.io/library/{image}"


def cuda_workload_for(driver: str) -> str:
    """The newest vectorAdd sample whose CUDA the driver runs natively."""
    reported = compat.cuda_reported_by(driver)
    for image, cuda in CUDA_WORKLOADS:
        if reported is not None and reported >= compat.Ver(cuda):
            return image
    oldest = CUDA_WORKLOADS[-1][1]
    raise compat.CompatError(f"no known CUDA workload image runs on driver {driver} (the oldest needs CUDA {oldest})",
                             fix="pass --cuda-image IMAGE with a CUDA program built for this driver")


@dataclass(frozen=True, eq=False, repr=False)
class Engines(Frozen):
    """Which engines verify can drive on the node, and why the others are left out."""

    docker: bool = False
    docker_nvidia_runtime: bool = False
    containerd: str | None = None  # "nerdctl" | "ctr" | None
    ctr: bool = False
    containerd_runtime: str | None = None  # BinaryName of containerd's nvidia runtime
    podman: bool = False
    left_out: tuple[tuple[str, str], ...] = ()  # (engine, why)


def find_engines(facts: Facts, wanted: Sequence[str] = ()) -> Engines:
    units = facts[package_facts.UNITS]
    survey = survey_engines(facts.tools, {n: u.exists for n, u in units.items()}, facts.files)
    left: list[tuple[str, str]] = []
    docker = "docker" in survey.present and facts.has("docker")
    if survey.snap_docker and not docker:
        left.append(("docker", "docker is the snap package, which cannot use the NVIDIA runtime (see "
                               + fixes.gpunode("doctor") + ": container.snap-docker)"))
    docker_runtime = False
    if docker:
        try:
            docker_runtime = docker_state(parse_daemon_json(facts.files.get("/etc/docker/daemon.json"))).has_nvidia
        except ConfigError as exc:
            left.append(("docker", f"{exc} (docker cannot start with it)"))
            docker = False
    containerd_cli = None
    ctr = facts.has("ctr")
    runtime = None
    if "containerd" in survey.present and (facts.has("nerdctl") or ctr):
        try:
            main = parse_toml(facts.files.get("/etc/containerd/config.toml"), "/etc/containerd/config.toml")
            found = facts[container_facts.CONTAINERD_VERSION]
            effective = effective_containerd(facts.files, major=found[0] if found else 1)
            state = containerd_state(effective.config)
            runtime = state.binary if state.has_nvidia else None
            backend = docker and not facts.has("kubelet") and runtime is None
            if "containerd" not in wanted and ((main and cri_disabled(main)) or backend):
                left.append(("containerd", "this containerd serves only docker (no nvidia runtime configured, no "
                                           "kubelet); pass --engine containerd to test it anyway"))
            else:
                containerd_cli = "nerdctl" if facts.has("nerdctl") else "ctr"
        except ConfigError as exc:
            left.append(("containerd", f"{exc} (containerd cannot start with it)"))
    if "crio" in survey.present:
        left.append(("crio", "CRI-O runs pods, not single containers: check it with a Kubernetes pod "
                             "(runtimeClassName: nvidia)"))
    engines = Engines(docker, docker_runtime, containerd_cli, ctr and containerd_cli is not None, runtime,
                      facts.has("podman"), tuple(left))
    if wanted:
        engines = Engines(engines.docker and "docker" in wanted, engines.docker_nvidia_runtime,
                          engines.containerd if "containerd" in wanted else None,
                          engines.ctr and "containerd" in wanted, engines.containerd_runtime,
                          engines.podman and "podman" in wanted,
                          tuple((e, why) for e, why in engines.left_out if e in wanted))
    return engines


def plan_tests(engines: Engines, image: str, host: Sequence[SmiGpu], cuda_image: str | None = None) -> list[Test]:
    """The containers to start, in order, with the GPUs each must see."""
    every = tuple(g.uuid for g in host)
    first = tuple(g.uuid for g in host[:1])
    smi = ("nvidia-smi", "-L")
    tests: list[Test] = []
    token = secrets.token_hex(4)
    if engines.docker:
        tests.append(Test("docker", "docker --gpus all", ("docker", "run", "--rm", "--gpus", "all", image, *smi), every))
        tests.append(Test("docker", "docker --gpus device=0", ("docker", "run", "--rm", "--gpus", "device=0", image,
                                                                 *smi), first))
        if engines.docker_nvidia_runtime:
            tests.append(Test("docker", "docker --runtime=nvidia", ("docker", "run", "--rm", "--runtime=nvidia", "-e",
                                                                     "NVIDIA_VISIBLE_DEVICES=all", image, *smi), every))
    ref = qualified(image)
    pull = (("ctr", "image", "pull", ref),)
    if engines.containerd == "nerdctl":
        tests.append(Test("containerd", "nerdctl --gpus all", ("nerdctl", "run", "--rm", "--gpus", "all", image, *smi),
                          every))
    if engines.ctr:
        tests.append(Test("containerd", "ctr --gpus 0", ("ctr", "run", "--rm", "--gpus", "0", ref,
                                                         f"gpunode-verify-{token}-0", *smi), first, setup=pull))
        if engines.containerd_runtime:
            tests.append(Test("containerd", "ctr --runc-binary (containerd's nvidia runtime)",
                              ("ctr", "run", "--rm", "--runc-binary", engines.containerd_runtime, "--env",
                               "NVIDIA_VISIBLE_DEVICES=all", ref, f"gpunode-verify-{token}-1", *smi), every, setup=pull))
    if engines.podman:
        tests.append(Test("podman", "podman CDI nvidia.com/gpu=all",
                          ("podman", "run", "--rm", "--device", "nvidia.com/gpu=all", "--security-opt=label=disable",
                           image, *smi), every))
    if cuda_image:
        tests += _workloads(engines, cuda_image, token)
    return tests


def _workloads(engines: Engines, image: str, token: str) -> list[Test]:
    found = []
    if engines.docker:
        found.append(Test("docker", "docker CUDA workload", ("docker", "run", "--rm", "--gpus", "all", image),
                          kind="cuda"))
    if engines.containerd == "nerdctl":
        found.append(Test("containerd", "nerdctl CUDA workload", ("nerdctl", "run", "--rm", "--gpus", "all", image),
                          kind="cuda"))
    elif engines.ctr:
        ref = qualified(image)
        found.append(Test("containerd", "ctr CUDA workload", ("ctr", "run", "--rm", "--gpus", "0", ref,
                                                              f"gpunode-verify-{token}-cuda"), kind="cuda",
                          setup=(("ctr", "image", "pull", ref),)))
    if engines.podman:
        found.append(Test("podman", "podman CUDA workload", ("podman", "run", "--rm", "--device", "nvidia.com/gpu=all",
                                                             "--security-opt=label=disable", image), kind="cuda"))
    return found


# ---- judging what a container printed (pure) -----------------------------------------------------------------


def _tail(text: str, lines: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def judge(test: Test, code: int, stdout: str, stderr: str, host: Sequence[SmiGpu]) -> Outcome:
    text = (stdout + "\n" + stderr).strip()
    if code != 0:
        findings = explain(text)
        if findings:
            return Outcome(test, "fail", findings[0].cause, findings[0].fix, code, (), findings, _tail(text))
        last = text.splitlines()[-1] if text else f"exit status {code}"
        return Outcome(test, "fail", f"the container failed (exit {code}): {last}",
                       fixes.gpunode("doctor") + "  # and: " + fixes.gpunode("explain") + " with the output above", code, (), [], _tail(text))
    if test.kind == "cuda":
        if "PASSED" in stdout:
            return Outcome(test, "pass", "the CUDA workload ran and passed", None, code, (), [], _tail(text, 4))
        return Outcome(test, "fail", "the CUDA workload exited 0 but did not report PASSED", fixes.gpunode("doctor"), code,
                       (), explain(text), _tail(text))
    seen = tuple(m["uuid"] for m in _GPU_LINE.finditer(stdout))
    if not seen:
        return Outcome(test, "fail", "the container ran, but nvidia-smi -L listed no GPU inside it",
                       fixes.gpunode("doctor"), code, (), explain(text), _tail(text))
    missing = [u for u in test.expect if u not in seen]
    extra = [u for u in seen if u not in test.expect]
    if missing or extra:
        parts = ([f"missing {_gpus(missing, host)}"] if missing else []) + \
            ([f"not requested {_gpus(extra, host)}"] if extra else [])
        return Outcome(test, "fail", f"the container saw {len(seen)} GPU(s), expected {len(test.expect)}: "
                       + "; ".join(parts), fixes.gpunode("doctor"), code, seen, [], _tail(text))
    return Outcome(test, "pass", f"saw {_gpus(seen, host)}", None, code, seen, [], _tail(text, 4))


def _gpus(uuids: Sequence[str], host: Sequence[SmiGpu]) -> str:
    """GPU 0 (Tesla T4), or "GPU 0-7 (8 x NVIDIA H100 80GB HBM3)" for a run of identical GPUs."""
    known = {g.uuid: g for g in host}
    found = [known[u] for u in uuids if u in known]
    unknown = [u for u in uuids if u not in known]
    names = {g.name for g in found}
    if len(found) > 2 and len(names) == 1:
        indices = sorted(g.index for g in found)
        span = f"{indices[0]}-{indices[-1]}" if indices == list(range(indices[0], indices[-1] + 1)) else \
            ",".join(map(str, indices))
        shown = f"GPU {span} ({len(found)} x {names.pop()})"
    else:
        shown = ", ".join(f"GPU {g.index} ({g.name})" for g in found)
    return ", ".join([p for p in (shown, ", ".join(f"{u} (not on the host)" for u in unknown)) if p])


# ---- running ---------------------------------------------------------------------------------------------------


def run_test(conn: Connection, test: Test, host: Sequence[SmiGpu], timeout: float) -> Outcome:
    for argv in test.setup:
        result = conn.run(argv, sudo=True, timeout=timeout)
        if result.timed_out or not result.ok:
            text = (result.stdout + "\n" + result.stderr).strip()
            findings = explain(text)
            why = findings[0].cause if findings else (text.splitlines()[-1] if text else "no output")
            return Outcome(test, "fail", f"`{' '.join(argv)}` failed: {why}",
                           findings[0].fix if findings else "check the node's registry access (proxy, credentials)",
                           result.exit_code, (), findings, _tail(text))
    result = conn.run(test.argv, sudo=True, timeout=timeout)
    if result.timed_out:
        return Outcome(test, "fail", f"no answer within {timeout:.0f}s (a slow image pull?)",
                       "run again with a larger --timeout, or pull the image on the node first", None, (), [],
                       _tail(result.stdout + result.stderr))
    return judge(test, result.exit_code, result.stdout, result.stderr, host)


def _segments(facts: Facts) -> list[str | None]:
    found = {g.segment if (g := gpus.lookup_id(d.device)) else None for d in facts.gpus}
    return sorted(found, key=str) or [None]


def prepare(host_name: str, facts: Facts, image: str | None = None, engines: Sequence[str] = (),
            cuda_test: bool = False, cuda_image: str | None = None) -> tuple[Report, list[Test]]:
    """Everything decided before a container starts: host GPUs, the image, the engines and the tests. A report
    with `error` set means nothing can run."""
    report = Report(host_name, facts.summary())
    for name in engines:
        if name not in ENGINES:
            raise UsageError(f"--engine {name!r} is not an engine verify drives", fix=f"choose from {', '.join(ENGINES)}")
    if image is not None:
        compat.parse_image(image)  # UsageError for a malformed reference
    if not facts.gpus:
        report.error = ("no NVIDIA GPU was found on the node", fixes.gpunode("doctor"))
        return report, []
    state = driver_state(facts)
    if not facts.loaded_driver:
        report.error = ("the NVIDIA driver is not loaded on the node: no container can get a GPU",
                        fixes.gpunode("doctor") + "  # then " + fixes.gpunode("install", driver="VERSION"))
        return report, []
    report.driver = facts.loaded_driver.version
    report.host_gpus = facts[driver_facts.GPUS]
    if not report.host_gpus:
        findings = explain(state.smi_text) if state.smi_text else []
        why = findings[0].cause if findings else (state.smi_text.splitlines()[0] if state.smi_text else "no output")
        report.error = (f"nvidia-smi does not work on the host: {why}", findings[0].fix if findings else fixes.gpunode("doctor"))
        return report, []
    try:
        report.image = image or compat.verify_image_for(report.driver)
        report.image_source = "--image" if image else "compat"
        report.image_check = compat.check_image(compat.parse_driver(report.driver), report.image, _segments(facts))
        if cuda_test:
            report.cuda_image = cuda_image or cuda_workload_for(report.driver)
    except GpunodeError as exc:
        report.error = (exc.message, exc.fix)
        return report, []
    if report.image_check is not None and not report.image_check.ok:
        report.notes.append(f"expected to fail: {report.image_check.reason}")
    found = find_engines(facts, engines)
    for engine, why in found.left_out:
        report.outcomes.append(Outcome(Test(engine, engine, ()), "skip", why))
    if engines:
        present = {"docker": found.docker, "containerd": found.containerd is not None, "podman": found.podman}
        for name in engines:
            if not present[name] and not any(e == name for e, _ in found.left_out):
                report.outcomes.append(Outcome(Test(name, name, ()), "fail", f"--engine {name}: not on this node",
                                               fixes.gpunode("doctor")))
    if found.docker and not found.docker_nvidia_runtime:
        report.notes.append("docker's daemon.json has no nvidia runtime: --gpus works through the toolkit's hook, "
                            "--runtime=nvidia and CDI do not (" + fixes.gpunode("install", only="runtime") + ")")
    tests = plan_tests(found, report.image, report.host_gpus, report.cuda_image)
    if not tests and not report.outcomes:
        report.error = ("no container engine on the node to verify with (docker, containerd with nerdctl or ctr, "
                        "podman)", fixes.gpunode("doctor"))
    return report, tests


def verify(conn: Connection, facts: Facts, image: str | None = None, engines: Sequence[str] = (),
           cuda_test: bool = False, cuda_image: str | None = None, timeout: float = DEFAULT_TIMEOUT,
           progress: Callable[[Test], None] | None = None) -> Report:
    """Prepare, then run every test on the node (as root: the engines' sockets are root's)."""
    report, tests = prepare(conn.name, facts, image, engines, cuda_test, cuda_image)
    for test in tests:
        if progress is not None:
            progress(test)
        outcome = run_test(conn, test, report.host_gpus, timeout)
        if outcome.findings and outcome.findings[0].id == "cuda.requirement" and report.image_source == "--image" \
                and report.driver:
            try:
                outcome.fix = (outcome.fix or "") + "  # or an image this driver runs: " \
                    + fixes.gpunode("verify", image=compat.verify_image_for(report.driver))
            except GpunodeError:
                pass
        report.outcomes.append(outcome)
    return report

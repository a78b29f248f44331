"""Every fix gpunode prints is runnable as printed: each `gpunode ...` part and each `backticked` command parses
as shell words and holds no placeholder (<version>, VERSION, KEY, CERT, USER@NODE) where a value is known.

The fixes walked are the ones the doctor tests' scenarios produce (tests/doctor/test_doctor_checks.py VARIANTS,
plus fresh nodes of three GPU generations), the plans of every step on those nodes under a set of options, the
explain corpus, and the connection errors. Each is checked as written and as made runnable for a remote node
(node options inserted, node commands run through ssh)."""

from __future__ import annotations

import csv
import re
import shlex
from pathlib import Path

import pytest

from gpunode.cli._target import Target
from gpunode.connection.base import sudo_error
from gpunode.doctor import run_checks
from gpunode.explain import explain
from gpunode.facts import FULL, gather
from gpunode.options import Options
from gpunode.steps import PIPELINE
from tests.doctor.fakes import finished, fresh
from tests.doctor.test_doctor_checks import VARIANTS
from tests.fakes.connection import ROCKY_9, FakeConnection, FakeNode

CORPUS = Path(__file__).resolve().parent.parent / "fixtures" / "explain"
_COMMANDS = "plan|install|doctor|verify|status|facts|compat|explain"
_GPUNODE_PART = re.compile(rf"(?<![\w./=-])gpunode\s+(?:{_COMMANDS})\b[^`;#)\n]*")
_BACKTICKED = re.compile(r"`([^`\n]+)`")
_PLACEHOLDER = re.compile(r"<[^>\s]+>|^[A-Z][A-Z_]{2,}(@[A-Z]+)?(:[A-Z]+)?$")  # GPU names (B200) have digits
# the words of NVIDIA/Linux vocabulary that are spelled in capitals and are not placeholders
_VOCABULARY = {"NVIDIA", "CUDA", "NVML", "DKMS", "GPU", "GPUs", "PCI", "EPEL", "RHEL", "MOK", "NVRM", "CDI", "DER"}

OPTION_SETS = [
    Options(),
    Options(driver="580.95.05"),
    Options(driver="535.129.03", cuda="13.0", image="nvidia/cuda:13.0.0-base-ubuntu24.04"),
    Options(driver="580.95.05", kernel_module="proprietary"),
    Options(driver_run="/srv/installers/nvidia-driver.run"),
    Options(toolkit_version="1.17.8"),
]


def _nodes() -> list[tuple[str, FakeNode]]:
    nodes = [(f"fresh-{d:04x}", fresh(d)) for d in (0x1EB8, 0x102D, 0x2901)]
    nodes += [("finished", finished()), ("no-gpu", FakeNode(tools={"apt-get", "systemctl"})),
              ("rocky", FakeNode(os_release=ROCKY_9, tools={"dnf", "systemctl"}))]
    for check_id, expected, make, mutate, _ in VARIANTS:
        node = make()
        mutate(node)
        nodes.append((f"{check_id}-{expected}", node))
    return nodes


def _fixes() -> list[tuple[str, str]]:
    """(where it came from, text) for every fix, `also` and note the scenarios produce."""
    found: list[tuple[str, str]] = []
    for name, node in _nodes():
        facts = gather(FakeConnection(node), FULL)
        for result in run_checks(facts):
            if result.fix:
                found.append((f"doctor {result.id} on {name}", result.fix))
        for options in OPTION_SETS:
            earlier: dict = {}
            for step in PIPELINE:
                plan = step.plan_with(facts, options, earlier)
                earlier[step.name] = plan
                found += [(f"{step.name} on {name}", text) for text in (plan.fix, *plan.notes) if text]
    for row in csv.DictReader((CORPUS / "corpus.csv").open(encoding="utf-8", newline="")):
        text = (CORPUS / row["set"] / row["file"]).read_text(encoding="utf-8", errors="replace")
        for finding in explain(text):
            found += [(f"explain {finding.id} ({row['file']})", t) for t in (finding.fix, *finding.also)]
    for said in (b"sudo: not found", b"sudo: sorry, you must have a tty to run sudo",
                 b"ubuntu is not in the sudoers file.", b"sudo: a password is required", b"sudo: 1 incorrect password"):
        error = sudo_error("ubuntu@gpu-01:2222", 1, said, with_password=False)
        found.append((f"sudo {said.decode()}", error.fix or ""))
    return found


FIXES = list({text: (where, text) for where, text in reversed(_fixes())}.values())  # each text once


def problems(text: str) -> list[str]:
    """What keeps a fix from being runnable as printed."""
    found = []
    parts = [m.group(0) for m in _GPUNODE_PART.finditer(text)] + _BACKTICKED.findall(text)
    for part in parts:
        try:
            words = shlex.split(part)
        except ValueError as exc:
            found.append(f"{part!r} does not parse: {exc}")
            continue
        found += [f"{part!r}: placeholder {w!r}" for w in words
                  if _PLACEHOLDER.search(w.rstrip(",.")) and w.rstrip(",.") not in _VOCABULARY]
    return found


def test_the_scenarios_produce_the_fixes_this_audit_is_about():
    texts = [t for _, t in FIXES]
    assert len(set(texts)) > 60
    assert any(t.startswith("gpunode install --driver 580.178.04") for t in texts)  # the driver step, no --driver
    assert any("mokutil --import" in t for t in texts)  # Secure Boot, from doctor
    assert any(t.startswith("sudo ") for t in texts)  # node commands


@pytest.mark.parametrize("where,text", FIXES, ids=[f"{i}" for i in range(len(FIXES))])
def test_every_fix_is_complete_and_parses(where, text):
    assert problems(text) == [], where


REMOTE = Target(hosts=["ubuntu@gpu-01:2222"], identity=["/keys/my key"], known_hosts=[], accept_new_host_key=False,
                ssh_config=None, ask_pass=False, ask_become_pass=False, connect_timeout=15.0)


@pytest.mark.parametrize("where,text", FIXES, ids=[f"{i}" for i in range(len(FIXES))])
def test_every_fix_made_for_a_remote_node_still_parses_and_names_it(where, text):
    made = REMOTE.fix(text)
    assert made is not None and problems(made) == [], where
    for part in _GPUNODE_PART.findall(made):
        words = shlex.split(part)
        if words[1] in ("install", "plan", "doctor", "verify", "status", "facts"):
            assert words[2:4] == ["--host", "ubuntu@gpu-01:2222"], (where, made)
    if text.split(maxsplit=1)[0] == "sudo":  # a node command: run there, through ssh with the same key and port
        assert made.startswith("ssh -t -i '/keys/my key' -p 2222 ubuntu@gpu-01 "), (where, made)


def test_the_audit_catches_what_it_is_about():
    assert problems("gpunode install --driver VERSION") != []
    assert problems("run `gpunode install --driver <version>` first") != []
    assert problems("gpunode install --host 'unterminated") != []
    assert problems("log in as root (--host USER@NODE)") == []  # prose outside a command is not audited
    assert problems("`sudo mokutil --import CERT`") != []
    assert problems("gpunode install --driver 580.95.05  # the NVIDIA driver for CUDA") == []

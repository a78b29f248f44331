"""Golden `plan --json` documents for simulated nodes: a refactor of the step contract must not change what
`plan` predicts. Each case starts a node-simulator node, runs `gpunode plan --json` against it over SSH, removes
what differs from run to run (host and port, boot id, temp paths, gpunode's version) and compares with
tests/golden/plans/<case>.json.

A deliberate change of the plan is recorded by regenerating the files (GPUNODE_REGEN_GOLDEN=1) in a commit of
its own whose message lists the differences.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpunode.cli import app
from tests.nodesim.fixtures import host_guard, nodesim_available, sim_node  # noqa: F401 - pytest fixtures

pytestmark = pytest.mark.integration

PLANS = Path(__file__).parent / "plans"
REGENERATE = os.environ.get("GPUNODE_REGEN_GOLDEN") == "1"  # read at import: tests/conftest.py clears GPUNODE_*

# (case, profile, profile overrides, plan arguments)
CASES: tuple[tuple[str, str, dict[str, Any], tuple[str, ...]], ...] = (
    ("ubuntu2204-t4-fresh", "ubuntu-22.04-t4", {}, ()),
    ("ubuntu2204-t4-driver535", "ubuntu-22.04-t4", {}, ("--driver", "535.129.03")),
    ("ubuntu2204-t4-upgrade-to-570", "ubuntu-22.04-t4", {"preinstalled_driver": "535.129.03"},
     ("--driver", "570.124.04", "--cuda", "12.4")),
    ("ubuntu2204-t4-installed", "ubuntu-22.04-t4", {"preinstalled_driver": "535.129.03",
                                                    "toolkit_version": "1.17.8-1"}, ()),
    ("ubuntu2204-t4-toolkit-pin", "ubuntu-22.04-t4", {"preinstalled_driver": "535.129.03",
                                                      "toolkit_version": "1.17.8-1"},
     ("--toolkit-version", "1.18.0", "--image", "nvidia/cuda:12.2.2-base-ubuntu22.04")),
    ("rocky9-a100x8-driver535", "rocky-9-a100x8", {}, ("--driver", "535.129.03")),
    ("rocky9-t4-fresh", "rocky-9-t4", {}, ()),
    ("ubuntu2204-h100x8-driver570", "ubuntu-22.04-h100x8", {"engines": ("docker", "containerd")},
     ("--driver", "570.124.04")),
    ("ubuntu2404-h100x8-upgrade-to-580", "ubuntu-24.04-h100x8",
     {"preinstalled_driver": "550.127.05", "engines": ("containerd",)}, ("--driver", "580.105.08", "--k8s")),
    ("rocky9-h100x8-installed-580", "rocky-9-h100x8", {"preinstalled_driver": "580.105.08"}, ()),
    ("debian12-nogpu", "debian-12-nogpu", {}, ()),
    ("debian12-nogpu-driver", "debian-12-nogpu", {}, ("--driver", "535.129.03")),
    ("debian12-rtx4090-driver570", "debian-12-rtx4090", {}, ("--driver", "570.124.04")),
    ("rocky9-t4-secureboot", "rocky-9-t4", {"secure_boot": True}, ("--driver", "570.124.04")),
    # --driver-source packages, one route per distribution (issue 27)
    ("debian12-t4-packages", "debian-12-t4", {}, ("--driver-source", "packages", "--driver", "535.261.03")),
    ("ubuntu2204-t4-packages", "ubuntu-22.04-t4", {}, ("--driver-source", "packages", "--driver", "535.230.02")),
    ("ubuntu2204-t4-secureboot-packages", "ubuntu-22.04-t4", {"secure_boot": True},
     ("--driver-source", "packages", "--driver", "535.230.02")),
    ("rocky9-t4-packages-no-repo", "rocky-9-t4", {}, ("--driver-source", "packages", "--driver", "535.274.02")),
    # SLES 15 with NVIDIA's sles15 repository: zypper, the KMP for the running kernel, the compute-only userspace
    ("sles15-t4-packages", "sles-15-t4", {"cuda_repo": True}, ("--driver-source", "packages", "--driver", "580.95.05")),
    # a release only NVIDIA's CUDA repository offers, that repository not configured yet: refused, cuda-keyring fix
    ("ubuntu2204-t4-packages-cuda-no-repo", "ubuntu-22.04-t4", {},
     ("--driver-source", "packages", "--driver", "570.195.03")),
)


def normalise(doc: Any, node: Any, cache: str) -> Any:
    """The document with what changes from run to run replaced by placeholders."""
    text = json.dumps(doc, indent=2, sort_keys=True)
    text = text.replace(cache, "<cache>")
    text = text.replace(f"127.0.0.1:{node.port}", "<host>")
    text = text.replace(f"-p {node.port} root@127.0.0.1", "-p <port> root@<address>")  # ssh in node commands
    if getattr(node, "dir", None) is not None:
        text = text.replace(str(node.dir), "<node-dir>")  # the node's keys and known_hosts in fix commands
    if node.boot_id:
        text = text.replace(node.boot_id, "<boot-id>")
    out = json.loads(text)
    out["gpunode_version"] = "<version>"
    out["host"] = "<host>"
    node_info = out.get("node")
    if isinstance(node_info, dict):
        for key in ("boot_id", "host", "port"):
            if key in node_info:
                node_info[key] = f"<{key}>"
    return out


def plan_json(node: Any, args: tuple[str, ...], cache: str) -> Any:
    result = CliRunner().invoke(app, ["plan", *node.cli_args(), "--json", "--cache-dir", cache, *args])
    assert result.exit_code in (0, 1), result.output
    return normalise(json.loads(result.stdout), node, cache)


@pytest.mark.parametrize("case,profile,overrides,args", CASES, ids=[c[0] for c in CASES])
def test_plan_matches_golden(case, profile, overrides, args, sim_node, tmp_path,  # noqa: F811
                             monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("GPUNODE_DRIVER_MIRROR", "GPUNODE_CACHE_DIR"):
        monkeypatch.delenv(var, raising=False)
    node = sim_node(profile, **overrides)
    got = plan_json(node, args, str(tmp_path / "cache"))
    path = PLANS / f"{case}.json"
    if REGENERATE:
        PLANS.mkdir(exist_ok=True)
        path.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
    assert path.exists(), f"no golden file {path}: generate it with GPUNODE_REGEN_GOLDEN=1"
    want = json.loads(path.read_text())
    assert got == want, _first_difference(want, got)


def _first_difference(want: Any, got: Any, where: str = "$") -> str:
    if type(want) is not type(got):
        return f"{where}: {want!r} != {got!r}"
    if isinstance(want, dict):
        for key in sorted(set(want) | set(got)):
            if key not in want or key not in got:
                return f"{where}.{key}: only in {'golden' if key in want else 'this run'}"
            if want[key] != got[key]:
                return _first_difference(want[key], got[key], f"{where}.{key}")
    if isinstance(want, list):
        if len(want) != len(got):
            return f"{where}: {len(want)} items in golden, {len(got)} now"
        for i, (a, b) in enumerate(zip(want, got, strict=True)):
            if a != b:
                return _first_difference(a, b, f"{where}[{i}]")
    return f"{where}: golden {want!r} != now {got!r}"


def test_normalise_hides_only_run_specific_values() -> None:
    class Node:
        port = 40123
        boot_id = "b00t-1d"

    doc = {"host": "root@127.0.0.1:40123", "gpunode_version": "9.9", "node": {"boot_id": "b00t-1d", "os": "x"},
           "steps": [{"reason": "cache /tmp/x/cache/f.run, boot b00t-1d, driver 535.129.03"}]}
    out = normalise(doc, Node(), "/tmp/x/cache")
    assert out["node"] == {"boot_id": "<boot_id>", "os": "x"}
    assert out["steps"][0]["reason"] == "cache <cache>/f.run, boot <boot-id>, driver 535.129.03"
    assert re.search(r"535\.129\.03", json.dumps(out))

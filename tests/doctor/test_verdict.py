"""The readiness verdict and every format rendered from it: NHC line, k8s readiness document and reboot marker,
Prometheus textfile metrics (parsed with a strict line grammar), atomic files."""

from __future__ import annotations

import json
import os
import re

from gpunode.doctor import run_checks
from gpunode.doctor import verdict as v
from gpunode.facts import FULL, gather
from tests.doctor.fakes import finished, set_output, smi_health
from tests.fakes.connection import FakeConnection, FakeNode


def _verdict(node: FakeNode, host: str = "gpu-01") -> v.Readiness:
    facts = gather(FakeConnection(node), FULL)
    return v.readiness(host, facts, run_checks(facts))


def _xid79(node: FakeNode) -> None:
    set_output(node, "doctor_kernel_log", "@source dmesg\n"
               "[ 11.0] NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=a, GPU has fallen off the bus.\n"
               "[ 12.0] NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=a, GPU has fallen off the bus.\n"
               "[ 13.0] NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=a, Graphics SM Warp Exception\n")


def test_finished_node_is_ready_and_needs_no_reboot():
    verdict = _verdict(finished())
    assert verdict.ready and not verdict.reboot_required and verdict.reason is None
    assert v.nhc_line(verdict) is None and v.reboot_marker(verdict) is None


def test_a_failing_check_is_the_drain_reason_and_a_reboot_check_sets_the_marker():
    node = finished()
    set_output(node, "doctor_gpu_health", smi_health(["0000:18:00.0"], remap="0 1 Yes No"))
    verdict = _verdict(node)
    assert not verdict.ready and verdict.reboot_required
    assert verdict.reboot_because == ("health.row-remapping",)
    line = v.nhc_line(verdict)
    assert line is not None and "\n" not in line
    assert line.startswith("ERROR: gpunode: gpu-01: health.row-remapping: GPU 0 (0000:18:00.0): row remap pending")
    assert v.reboot_marker(verdict) == "gpunode: reboot required\nhealth.row-remapping\n"
    document = json.loads(v.readiness_document(verdict))
    assert document["ready"] is False and document["failing"] == ["health.row-remapping"]


def test_the_node_s_own_reboot_flag_counts():
    node = finished()
    set_output(node, "doctor_reboot_flag", "required\nlinux-image-5.15.0-92-generic\n")
    verdict = _verdict(node)
    assert verdict.ready and verdict.reboot_required and verdict.reboot_because == ("node: /var/run/reboot-required",)


def test_nhc_line_is_printable_ascii_whatever_the_node_says():
    node = finished()
    set_output(node, "driver_smi", "NVIDIA-SMI has failed\x1b[31m because ☃\nsecond line", 9)
    line = v.nhc_line(_verdict(node, host="gpu-\x1b7"))
    assert line is not None and re.fullmatch(r"[\x20-\x7e]+", line) and "driver.smi" in line


# one line of the text exposition format: a comment, or NAME{LABELS} VALUE with quoted, escaped label values
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\\\|\\"|\\n)*"'
_SAMPLE = re.compile(rf"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{{(?P<labels>{_LABEL}(?:,{_LABEL})*)\}})? "
                     r"(?P<value>-?[0-9]+(?:\.[0-9]+)?(?:e[+-]?[0-9]+)?)$")
_META = re.compile(r"^# (?:HELP (?P<help>[a-zA-Z_:][a-zA-Z0-9_:]*) .+|TYPE (?P<type>[a-zA-Z_:][a-zA-Z0-9_:]*) "
                   r"(?:gauge|counter))$")


def _parse(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    assert text.endswith("\n")
    typed: set[str] = set()
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        meta = _META.match(line)
        if meta:
            if meta["type"]:
                assert meta["type"] not in typed, f"second TYPE for {meta['type']}"
                typed.add(meta["type"])
            continue
        sample = _SAMPLE.match(line)
        assert sample, f"not a sample line: {line!r}"
        assert sample["name"] in typed, f"{sample['name']} has no TYPE before its samples"
        labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', sample["labels"] or ""))
        samples.setdefault(sample["name"], []).append((labels, float(sample["value"])))
    return samples


def test_prometheus_metrics_parse_and_agree_with_the_verdict():
    node = finished()
    _xid79(node)
    verdict = _verdict(node)
    metrics = _parse(v.prometheus(verdict, 1700000000.0))
    assert metrics["gpunode_node_ready"] == [({}, 0.0)] and not verdict.ready
    assert metrics["gpunode_reboot_required"] == [({}, 1.0)]
    assert sorted((s[0]["xid"], s[1]) for s in metrics["gpunode_xid_errors_total"]) == [("13", 1.0), ("79", 2.0)]
    status = {(labels["check"], labels["severity"]): value for labels, value in metrics["gpunode_check_status"]}
    assert status[("health.xid", "fail")] == 1.0 and status[("health.xid", "pass")] == 0.0
    assert len(status) == 4 * len(verdict.results)
    for r in verdict.results:  # exactly one status per check, the one the verdict holds
        assert sum(status[(r.id, s)] for s in ("pass", "warn", "fail", "skip")) == 1.0
        assert status[(r.id, r.status)] == 1.0
    assert metrics["gpunode_doctor_last_run_timestamp_seconds"] == [({}, 1700000000.0)]


def test_label_values_are_escaped():
    assert v._label('a"b\\c\nd') == 'a\\"b\\\\c\\nd'
    verdict = _verdict(finished())
    odd = v.Readiness("h", True, False, (), (), tuple(r.__class__(r.id + '"\n', r.layer, r.title, r.status,
                                                                      r.evidence) for r in verdict.results[:1]))
    assert _parse(v.prometheus(odd, 0))["gpunode_check_status"][0][0]["check"] == 'hw.gpu-present\\"\\n'


def test_write_atomic_replaces_by_rename_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "gpunode.prom"
    path.write_text("old\n")
    inode = path.stat().st_ino
    v.write_atomic(str(path), "new\n")
    assert path.read_text() == "new\n" and path.stat().st_ino != inode  # a new file renamed over the old one
    assert sorted(os.listdir(tmp_path)) == ["gpunode.prom"]


def test_remove_if_ours_leaves_someone_else_s_marker(tmp_path):
    theirs = tmp_path / "reboot-required"
    theirs.write_text("*** System restart required ***\n")
    assert not v.remove_if_ours(str(theirs), v.MARKER_HEADER) and theirs.exists()
    ours = tmp_path / "ours"
    ours.write_text(v.MARKER_HEADER + "\nx\n")
    assert v.remove_if_ours(str(ours), v.MARKER_HEADER) and not ours.exists()

"""gpunode.explain.xid: Xid lines, counted per GPU, with the meaning and action from data/xid.csv."""

from __future__ import annotations

from gpunode.explain import XIDS, explain


def _one(text: str, finding_id: str):
    found = [f for f in explain(text) if f.id == finding_id]
    assert len(found) == 1, [f.id for f in explain(text)]
    return found[0]


def test_xid_154_takes_its_severity_from_the_recovery_action():
    reset = _one("NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 "
                 "(GPU Reset Required)", "xid.154")
    assert reset.values["recovery_action"] == "GPU Reset Required" and reset.values["severity"] == "reset"
    assert reset.fix == "sudo nvidia-smi -r -i 0008:01:00.0"


def test_xid_lines_on_several_gpus_are_separate_findings_and_repeats_are_counted():
    text = "\n".join(f"NVRM: Xid (PCI:0000:{bus}:00): 13, pid={pid}, Graphics Exception" for bus, pid in
                     (("1a", 1), ("1a", 2), ("3d", 3), ("1a", 4)))
    findings = explain(text)
    assert [(f.id, f.values["pci"], f.values["count"]) for f in findings] == [("xid.13", "0000:1a:00", 3),
                                                                            ("xid.13", "0000:3d:00", 1)]
    assert findings[0].values["pids"] == ["1", "2", "4"]


def test_xid_table_entries_are_well_formed():
    for number, (meaning, severity) in XIDS.items():
        assert meaning and severity in ("info", "app", "reset", "reboot", "hardware", "nvlink"), number


# ---------------------------------------------------------------------------------------------------------
# Negative samples
# ---------------------------------------------------------------------------------------------------------

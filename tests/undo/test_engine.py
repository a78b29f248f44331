"""The uninstall engine on the fake connection: an install's records undone, a second uninstall has nothing to do,
--dry-run writes nothing, and an old journal (no undo records) removes only files that carry gpunode's marker."""

from __future__ import annotations

import hashlib
import json

from gpunode.facts import Facts
from gpunode.journal import JOURNAL_PATH
from gpunode.options import Options
from gpunode.runner import NullReporter, apply_pipeline
from gpunode.steps import PIPELINE, nouveau
from gpunode.undo import select
from gpunode.undo.engine import uninstall
from tests.fakes.connection import FakeConnection, FakeNode


def gpu_node() -> FakeNode:
    node = FakeNode(tools={"update-initramfs", "modprobe", "systemctl"})
    node.add_gpu(0x1EB8)
    return node


def test_the_nouveau_blacklist_is_undone_and_a_second_uninstall_has_nothing_to_do():
    node = gpu_node()
    node.put("/etc/modprobe.d/user.conf", "options snd power_save=1\n")
    conn = FakeConnection(node)
    apply_pipeline(conn, [s for s in PIPELINE if s.name == "nouveau"], Options())
    assert nouveau.PATH in node.files
    records = json.loads(node.files[JOURNAL_PATH])["undo"]
    assert [(r["kind"], r["path"], r["existed"]) for r in records] == [("file", nouveau.PATH, False)]

    before = len(node.calls)
    dry = uninstall(conn, select([]), Options(), dry_run=True)
    assert [o.result for o in dry.outcomes if o.step == "nouveau"] == ["planned"]
    assert node.changing_calls(before) == [] and nouveau.PATH in node.files

    report = uninstall(conn, select([]), Options())
    assert [o.result for o in report.outcomes if o.step == "nouveau"] == ["changed"] and report.exit_code == 0
    assert nouveau.PATH not in node.files and node.files["/etc/modprobe.d/user.conf"]
    assert len(node.ran("update-initramfs")) == 2  # the install's rebuild, and the uninstall's
    journal = json.loads(node.files[JOURNAL_PATH])
    assert journal["runs"][-1]["command"].startswith("uninstall") and journal["runs"][-1]["status"] == "done"
    assert all(r.get("undone") for r in journal["undo"])

    before = len(node.calls)
    again = uninstall(conn, select([]), Options())
    assert again.outcomes == [] and again.exit_code == 0 and node.changing_calls(before) == []


def test_an_old_journal_removes_only_files_with_gpunode_marker():
    node = gpu_node()
    node.put(JOURNAL_PATH, json.dumps({"schema_version": 1, "runs": [
        {"id": "a", "command": "install nouveau", "status": "done",
         "steps": [{"step": "nouveau", "result": "changed"}]}]}))
    node.put(nouveau.PATH, nouveau.desired_content(None))
    node.put("/etc/apt/sources.list.d/nvidia-container-toolkit.list", "deb https://example.invalid/ ./\n")  # user's
    conn = FakeConnection(node)
    report = uninstall(conn, select([]), Options())
    assert report.exit_code == 0 and nouveau.PATH not in node.files
    assert "/etc/apt/sources.list.d/nvidia-container-toolkit.list" in node.files  # no marker: not gpunode's
    notes = [n for o in report.outcomes for n in o.plan.notes]
    assert any("predates gpunode's undo records" in n for n in notes)
    again = uninstall(conn, select([]), Options())
    assert again.outcomes == []  # from now on the (empty) records decide


class Messages(NullReporter):
    def __init__(self) -> None:
        self.said: list[str] = []

    def message(self, host: str, text: str) -> None:
        self.said.append(text)


def journal_with(*records: dict) -> str:
    return json.dumps({"schema_version": 1, "runs": [{"id": "a", "command": "install", "status": "done", "steps": [
        {"step": "nouveau", "result": "changed"}]}], "undo": [
        {"id": f"r{i}", "run": "a", "time": "t", **r} for i, r in enumerate(records)]})


def test_a_forged_record_naming_an_unrelated_file_is_ignored_with_a_warning_and_the_file_kept():
    node = gpu_node()
    node.put("/home/alice/thesis.tex", "precious\n")
    node.put("/etc/modprobe.d/blacklist-nouveau.conf", "x\n")
    node.put("/etc/modprobe.d/blacklist-nouveau.conf.gpunode-bak.1", "user\n")
    sha = hashlib.sha256(b"precious\n").hexdigest()
    node.put(JOURNAL_PATH, journal_with(
        {"kind": "file", "step": "nouveau", "path": "/home/alice/thesis.tex", "existed": False, "sha256": sha},
        # a real path, but a "backup" elsewhere that RestoreFile would move over it
        {"kind": "file", "step": "nouveau", "path": "/etc/modprobe.d/blacklist-nouveau.conf", "existed": True,
         "backup": "/etc/shadow", "sha256": hashlib.sha256(b"x\n").hexdigest()},
        {"kind": "unit", "step": "nodesettings", "unit": "sshd.service", "was": "disabled"}))
    node.put("/etc/shadow", "root:*:1::::::\n")
    reporter = Messages()
    report = uninstall(FakeConnection(node), select([]), Options(), reporter)
    assert node.files["/home/alice/thesis.tex"] == "precious\n" and node.files["/etc/shadow"].startswith("root")
    assert not any(c[:2] == ["systemctl", "disable"] for c in node.calls)
    assert any("/home/alice/thesis.tex is not a file gpunode writes" in m for m in reporter.said)
    assert any("/etc/shadow is not a backup gpunode makes" in m for m in reporter.said)
    assert any("sshd.service is not a unit gpunode enables" in m for m in reporter.said)
    assert report.outcomes == [] and report.exit_code == 0  # nothing of gpunode's left to act on


def test_a_second_uninstall_with_the_prerequisites_kept_has_nothing_to_undo():
    node = gpu_node()
    node.put(JOURNAL_PATH, journal_with(
        {"kind": "packages", "step": "prerequisites", "manager": "apt", "installed": [["gcc", "11"]]}))
    conn = FakeConnection(node)
    assert uninstall(conn, select([]), Options()).outcomes == []
    assert uninstall(conn, select(["driver"]), Options()).outcomes == []
    asked = uninstall(conn, select(["prerequisites"]), Options(), dry_run=True)
    assert [o.step for o in asked.outcomes] == ["prerequisites"]  # still owed to --only prerequisites


def test_a_driver_record_without_its_version_never_says_none():
    node = gpu_node()
    node.put(JOURNAL_PATH, journal_with({"kind": "driver", "step": "driver", "version": None, "previous": None}))
    report = uninstall(FakeConnection(node), select(["driver"]), Options(), dry_run=True)
    [driver] = [o for o in report.outcomes if o.step == "driver"]
    assert "None" not in driver.plan.reason and "was not recorded" in driver.plan.reason
    assert driver.plan.actions == ()


def test_a_record_that_could_not_be_made_is_a_warning_at_install_time():
    from gpunode.actions.base import RunCommand
    from gpunode.plan import Status, StepPlan
    from gpunode.records import PackagesRecord
    from gpunode.runner import RunReport, StepOutcome, converge
    from gpunode.runrecord import Journal
    from gpunode.steps.base import Step

    class Unlisted(RunCommand):  # a transaction whose packages the node did not list, before or after
        def apply_recorded(self, conn):
            return self.apply(conn), [PackagesRecord(manager="apt", unknown=True)]

    reporter = Messages()
    conn = FakeConnection(gpu_node())
    ok = StepPlan("prerequisites", Status.OK, "")
    plan = StepPlan("prerequisites", Status.CHANGE, "", actions=(Unlisted("install gcc", cmd=("true",)),))
    converge(conn, Step("prerequisites", "x", lambda f, o, e: ok), plan, Facts(), Options(), lambda f: ok, reporter,
             RunReport("n", "install"), StepOutcome("prerequisites", "x", plan, "ok"), Journal(conn, "install"))
    assert any(m.startswith("warning: prerequisites: install gcc: the node did not list its packages")
               and "uninstall will keep it" in m for m in reporter.said), reporter.said


def test_files_the_probe_read_come_from_its_facts_and_only_the_others_are_looked_at():
    from gpunode.facts import RUN
    from gpunode.facts.containers import DOCKER_CONFIG
    from gpunode.records import FileRecord
    from gpunode.undo.engine import probed_file, read_state

    daemon, other, odd = '{"runtimes": {}}\n', "/etc/gpunode-test/x.conf", "/etc/containerd/conf.d/odd.toml"
    facts = Facts(files={DOCKER_CONFIG: daemon, odd: "bad \ufffd byte"}, probe=RUN)
    assert probed_file(facts, DOCKER_CONFIG) == hashlib.sha256(daemon.encode()).hexdigest()
    assert probed_file(facts, "/var/snap/docker/current/config/daemon.json") == "-"  # looked for: not there
    assert probed_file(facts, other) is None  # no file fact names it
    assert probed_file(facts, odd) is None  # not the file's bytes: the look reads it
    node = FakeNode()
    node.files[other] = "mine\n"
    node.files[odd] = "real\n"
    conn = FakeConnection(node)
    records = [FileRecord(path=p, existed=False, step="runtime") for p in (DOCKER_CONFIG, other, odd)]
    state = read_state(conn, records, facts)
    looks = [c for c in node.calls if c[3:4] == ["gpunode-undo-look"]]
    assert len(looks) == 1 and DOCKER_CONFIG not in looks[0] and other in looks[0] and odd in looks[0]
    assert state.files == {DOCKER_CONFIG: hashlib.sha256(daemon.encode()).hexdigest(),
                           other: hashlib.sha256(b"mine\n").hexdigest(), odd: hashlib.sha256(b"real\n").hexdigest()}
    assert state.texts == {DOCKER_CONFIG: daemon, other: "mine\n", odd: "real\n"}
    node.calls.clear()
    only_probed = read_state(conn, records[:1], facts)
    assert node.calls == [] and only_probed.files == {DOCKER_CONFIG: state.files[DOCKER_CONFIG]}

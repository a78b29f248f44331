"""The pipeline against a fake node: the converge quartet, reboots, failures."""

import pytest

from gpunode import runner
from gpunode.options import Options
from gpunode.plan import RunCommand, Status, change
from gpunode.runner import apply_pipeline, plan_pipeline
from gpunode.steps import PIPELINE as FULL
from gpunode.steps import nouveau
from gpunode.steps.base import Step
from tests.fakes.connection import ROCKY_9, FakeConnection, FakeNode

# Without --driver the driver step blocks a GPU node that has no driver (tests/steps/test_driver.py); these tests
# are about the runner, so they run the rest of the pipeline.
PIPELINE = tuple(s for s in FULL if s.name != "driver")


@pytest.fixture(autouse=True)
def _fast_reboots(monkeypatch):
    monkeypatch.setattr(runner, "REBOOT_POLL_SECONDS", 0.0)


def gpu_node(**kw) -> FakeNode:
    node = FakeNode(tools={"update-initramfs", "modprobe", "systemctl"}, **kw)
    node.add_gpu(0x1EB8)
    return node


def test_four_runs_plan_apply_plan_apply():
    node = gpu_node()
    conn = FakeConnection(node)
    first = plan_pipeline(conn, PIPELINE, Options())
    assert first.outcomes[0].plan.status is Status.CHANGE
    assert node.files == {}  # planning wrote nothing

    applied = apply_pipeline(conn, PIPELINE, Options())
    assert applied.outcomes[0].result == "changed" and applied.exit_code == 0
    assert "blacklist nouveau" in node.files[nouveau.PATH]
    assert len(node.ran("update-initramfs")) == 1

    second = plan_pipeline(conn, PIPELINE, Options())
    assert second.outcomes[0].plan.status is Status.OK

    calls_before = len(node.calls)
    again = apply_pipeline(conn, PIPELINE, Options())
    assert again.outcomes[0].result == "ok"
    # Only reads: the probe and the journal lookup. No write, no command, not even a journal entry.
    assert node.changing_calls(calls_before) == []


def test_loaded_nouveau_without_reboot_flag_stops_with_reboot_pending():
    node = gpu_node(modules={"nouveau"})
    report = apply_pipeline(FakeConnection(node), PIPELINE, Options())
    assert report.outcomes[0].result == "reboot-pending"
    assert "reboot required, then run the same command again" in (report.outcomes[0].error or "")
    assert report.exit_code == 3
    assert node.reboots == 0  # never reboots unless asked


def test_reboot_flag_reboots_waits_for_new_boot_id_and_converges():
    node = gpu_node(modules={"nouveau"})
    old_boot = node.boot_id
    report = apply_pipeline(FakeConnection(node), PIPELINE, Options(reboot=True))
    assert report.outcomes[0].result == "changed" and report.reboots == 1
    assert node.boot_id != old_boot and "nouveau" not in node.modules
    assert report.exit_code == 0


def test_reboot_budget_stops_a_loop():
    node = gpu_node(modules={"nouveau"})
    node.handlers["update-initramfs"] = lambda n, argv, stdin: (0, "", "")  # "forgets" the blacklist
    report = apply_pipeline(FakeConnection(node), PIPELINE, Options(reboot=True, max_reboots=2))
    assert report.outcomes[0].result == "failed"
    assert "still needs a reboot after 2 reboots" in (report.outcomes[0].error or "")
    assert node.reboots == 2


class LocalFake(FakeConnection):
    is_local = True


def test_the_machine_gpunode_runs_on_is_not_rebooted_without_the_flag():
    node = gpu_node(modules={"nouveau"})
    report = apply_pipeline(LocalFake(node), PIPELINE, Options())
    assert report.outcomes[0].result == "reboot-pending" and node.reboots == 0


def test_the_machine_gpunode_runs_on_reboots_only_when_asked_and_then_stops():
    node = gpu_node(modules={"nouveau"})
    report = apply_pipeline(LocalFake(node), PIPELINE, Options(reboot=True))
    assert node.reboots == 1  # the explicit request was honoured once...
    assert report.outcomes[0].result == "reboot-pending"  # ...and gpunode does not pretend to resume
    assert "run the same command again" in (report.outcomes[0].error or "")
    assert report.exit_code == 3


def test_rocky_uses_dracut_end_to_end():
    node = gpu_node(os_release=ROCKY_9)
    node.tools = {"dracut", "modprobe"}
    apply_pipeline(FakeConnection(node), PIPELINE, Options())
    assert node.ran("dracut") == [["dracut", "-f"]]


def test_a_failing_command_fails_the_step_and_stops_the_pipeline():
    node = gpu_node()
    node.handlers["update-initramfs"] = lambda n, argv, stdin: (1, "", "update-initramfs: disk full\n")
    later = Step("later", "Later", lambda f, o, e: change("later", "x", [RunCommand("x", ("true",))]))
    report = apply_pipeline(FakeConnection(node), (*PIPELINE, later), Options())
    assert report.outcomes[0].result == "failed" and "disk full" in (report.outcomes[0].error or "")
    assert report.outcomes[1].result == "not-run"
    assert report.exit_code == 1


def test_a_step_that_does_not_converge_fails_loudly():
    stubborn = Step("stubborn", "Stubborn", lambda f, o, e: change("stubborn", "never done",
                                                                     [RunCommand("noop", ("true",))]))
    report = apply_pipeline(FakeConnection(gpu_node()), (stubborn,), Options())
    assert report.outcomes[0].result == "failed"
    assert "did not converge" in (report.outcomes[0].error or "")


def test_plan_json_shape():
    data = plan_pipeline(FakeConnection(gpu_node(modules={"nouveau"})), PIPELINE, Options()).to_dict()
    assert data["schema_version"] == 1 and data["mode"] == "plan"
    step = data["steps"][0]
    assert step["step"] == "nouveau" and step["status"] == "change" and step["reboot_required"] is True
    kinds = [a["kind"] for a in step["actions"]]
    assert kinds == ["file", "command", "reboot"]
    assert step["actions"][0]["diff"].startswith("--- /dev/null\n+++ /etc/modprobe.d/blacklist-nouveau.conf")
    assert step["actions"][1]["commands"] == ["update-initramfs -u"]  # the fake logs in as root: no sudo
    node = gpu_node(uid=1000)
    as_user = plan_pipeline(FakeConnection(node), PIPELINE, Options()).to_dict()
    assert as_user["steps"][0]["actions"][1]["commands"] == ["sudo update-initramfs -u"]
    assert data["summary"]["changes_pending"] is True and data["summary"]["reboot_required"] is True
    assert data["node"]["gpus"] == [{"pci": "0000:17:00.0", "device_id": "10de:1eb8"}]


def test_journal_records_what_was_done_and_an_interrupted_run_is_noticed():
    import json

    from gpunode.journal import JOURNAL_PATH

    node = gpu_node()
    apply_pipeline(FakeConnection(node), PIPELINE, Options())
    journal = json.loads(node.files[JOURNAL_PATH])
    run = journal["runs"][-1]
    assert run["status"] == "done" and run["steps"][0]["step"] == "nouveau"
    assert run["steps"][0]["result"] == "changed"

    # A run that died mid-way leaves status "running"; the next install says it resumes.
    journal["runs"][-1]["status"] = "running"
    node.files[JOURNAL_PATH] = json.dumps(journal)
    node.modules.add("nouveau")  # something left to do

    messages = []

    class Recorder(runner.NullReporter):
        def message(self, host, text):
            messages.append(text)

    apply_pipeline(FakeConnection(node), PIPELINE, Options(), Recorder())
    assert any("was interrupted; resuming" in m for m in messages)
    runs = json.loads(node.files[JOURNAL_PATH])["runs"]
    assert [r["status"] for r in runs] == ["interrupted", "reboot-pending"]


def test_a_journal_that_cannot_be_written_does_not_fail_the_run():
    from gpunode.journal import JOURNAL_PATH

    node = gpu_node()
    conn = FakeConnection(node)
    real_write = conn.write_file

    def write_file(path, content, **kw):
        if path == JOURNAL_PATH:
            from gpunode.errors import CommandError
            raise CommandError("read-only file system")
        return real_write(path, content, **kw)

    conn.write_file = write_file  # type: ignore[method-assign]
    messages = []

    class Recorder(runner.NullReporter):
        def message(self, host, text):
            messages.append(text)

    report = apply_pipeline(conn, PIPELINE, Options(), Recorder())
    assert report.outcomes[0].result == "changed" and report.exit_code == 0
    assert any("could not update /var/lib/gpunode/journal.json" in m for m in messages)
    assert node.node_lock is None  # the release the failed write may not have carried ran on its own


# -- interrupts and honest final states ---------------------------------------------------------------------

def _journal_run(node):
    import json

    from gpunode.journal import JOURNAL_PATH
    return json.loads(node.files[JOURNAL_PATH])["runs"][-1]


def test_ctrl_c_between_actions_stops_at_the_safe_point_and_the_journal_says_interrupted():
    from gpunode import cancel

    node = gpu_node()
    token = cancel.CancelToken()

    class CancelAfterFirstAction(runner.NullReporter):
        def action(self, host, step, action, state, detail=""):
            if state == "done":
                token.cancel()

    with cancel.bind(token), pytest.raises(runner.RunInterrupted) as caught:
        apply_pipeline(FakeConnection(node), PIPELINE, Options(), CancelAfterFirstAction())
    report = caught.value.report
    assert caught.value.exit_code == 130 and report.exit_code == 130 and report.state == "interrupted"
    first = report.outcomes[0]
    assert first.result == "interrupted" and "stopped before nouveau: " in (first.error or "")
    assert "blacklist nouveau" in node.files[nouveau.PATH]  # the first action ran to its end...
    assert node.ran("update-initramfs") == []  # ...and the second never started
    assert {o.result for o in report.outcomes[1:]} == {"not-run"}
    run = _journal_run(node)
    assert run["status"] == "interrupted" and run["steps"][0]["result"] == "interrupted"
    assert node.node_lock is None and node.calls[-1][3] == "gpunode-write-file"  # released by that last write


def test_ctrl_c_before_a_step_starts_nothing_on_the_node():
    from gpunode import cancel

    node = gpu_node()
    token = cancel.CancelToken()
    token.cancel()
    with cancel.bind(token), pytest.raises(runner.RunInterrupted) as caught:
        apply_pipeline(FakeConnection(node), PIPELINE, Options())
    assert [o.result for o in caught.value.report.outcomes] == ["not-run"] * len(PIPELINE)
    assert "stopped before step nouveau" in (caught.value.report.outcomes[0].error or "")
    assert node.changing_calls() == [] and node.files == {}
    assert node.node_lock is None and node.lock_takes == 1


def test_a_failed_step_keeps_its_error_fix_in_the_report_and_json():
    from gpunode.errors import CommandError

    class Offline(RunCommand):
        def apply(self, conn):
            raise CommandError("cannot download the driver: no network",
                               fix="pass --driver-run FILE, or set GPUNODE_DRIVER_MIRROR")

    step = Step("dl", "Download", lambda f, o, e: change("dl", "x", [Offline("download", ("true",))]))
    report = apply_pipeline(FakeConnection(gpu_node()), (step,), Options())
    outcome = report.outcomes[0]
    assert outcome.result == "failed" and outcome.fix == "pass --driver-run FILE, or set GPUNODE_DRIVER_MIRROR"
    assert report.to_dict()["steps"][0]["fix"] == outcome.fix  # type: ignore[index]


def test_an_unexpected_exception_becomes_a_failed_step_and_the_journal_does_not_say_done():
    class Buggy(RunCommand):
        def apply(self, conn):
            raise KeyError("oops")

    node = gpu_node()
    step = Step("buggy", "Buggy", lambda f, o, e: change("buggy", "x", [Buggy("boom", ("true",))]))
    report = apply_pipeline(FakeConnection(node), (step,), Options())
    outcome = report.outcomes[0]
    assert outcome.result == "failed" and outcome.error == "internal error: KeyError: 'oops'"
    assert report.exit_code == 1 and "Traceback" in (report.traceback or "")
    run = _journal_run(node)
    assert run["status"] == "failed" and run["steps"][0]["error"] == "internal error: KeyError: 'oops'"


def test_a_reboot_wait_ends_at_once_on_abort():
    from gpunode import cancel

    node = gpu_node(modules={"nouveau"})
    node.reboot = lambda: None  # never comes back with a new boot id
    token = cancel.CancelToken()

    class AbortOnReboot(runner.NullReporter):
        def message(self, host, text):
            if text.startswith("rebooting"):
                token.abort()

    with cancel.bind(token), pytest.raises(runner.RunInterrupted) as caught:
        apply_pipeline(FakeConnection(node), PIPELINE, Options(reboot=True, reboot_timeout=600), AbortOnReboot())
    first = caught.value.report.outcomes[0]
    assert first.result == "interrupted" and "waiting for the node to come back" in (first.error or "")
    assert _journal_run(node)["status"] == "interrupted"


def test_an_owed_reboot_is_journalled_with_the_boot_id_and_cleared_by_the_next_boot():
    node = gpu_node(modules={"nouveau"})
    apply_pipeline(FakeConnection(node), PIPELINE, Options())
    pending = _journal_pending(node)
    assert [(p["effect"], p["target"], p["step"]) for p in pending] == [("reboot", node.boot_id, "nouveau")]
    node.reboot()
    apply_pipeline(FakeConnection(node), PIPELINE, Options())
    assert _journal_pending(node) == []


def test_with_reboot_the_owed_reboot_is_settled_in_the_same_run():
    node = gpu_node(modules={"nouveau"})
    apply_pipeline(FakeConnection(node), PIPELINE, Options(reboot=True))
    assert _journal_pending(node) == []
    assert _journal_run(node)["changes"][-1]["owes"][0][0] == "reboot"


def _journal_pending(node):
    import json

    from gpunode.journal import JOURNAL_PATH
    return json.loads(node.files[JOURNAL_PATH])["pending"]


def test_a_bug_while_planning_is_a_failed_run_with_a_closed_journal_not_a_traceback():
    def broken_plan(facts, options, earlier):
        raise ZeroDivisionError("division by zero")

    node = gpu_node()
    steps = (PIPELINE[0], Step("broken", "Broken", broken_plan))
    report = apply_pipeline(FakeConnection(node), steps, Options())
    assert report.state == "failed" and report.exit_code == 1
    assert report.error == "internal error: ZeroDivisionError: division by zero" and report.error_fix
    assert "Traceback" in (report.traceback or "")
    assert node.changing_calls() == []  # found while planning, before any change


def test_a_bug_in_a_plan_is_a_failed_plan_not_a_traceback():
    def broken_plan(facts, options, earlier):
        raise ZeroDivisionError("division by zero")

    report = plan_pipeline(FakeConnection(gpu_node()), (Step("broken", "Broken", broken_plan),), Options())
    assert report.state == "failed" and report.exit_code == 1
    assert report.error == "internal error: ZeroDivisionError: division by zero"


def _asking_step(query, refused_blocks: bool = False):  # type: ignore[no-untyped-def]
    """A step whose action names a query (as the packages route's install names its simulation)."""
    import dataclasses

    from gpunode.plan import blocked

    @dataclasses.dataclass(frozen=True)
    class Asking(RunCommand):
        query: object = None

    def plan(facts, options, earlier):  # type: ignore[no-untyped-def]
        found = facts.answer(query)
        if found is not None and found.error and refused_blocks:
            return dataclasses.replace(blocked("asker", f"refused: {found.error}", "choose another"), lasting=True)
        reason = "not asked" if found is None else "answered: " + ", ".join(c.show() for c in found.changes)
        return change("asker", reason, [Asking("do it", ("true",), query=query)])
    return Step("asker", "Asker", plan)


def test_a_plan_naming_a_query_is_planned_again_with_the_nodes_answer_asked_once():
    from gpunode.facts.transaction import simulation

    query = simulation("apt", ["x=1"])
    node = gpu_node()
    node.handlers["simulate"] = lambda n, argv, stdin: (0, "Inst x (1 Debian:12/stable [amd64])\n", "")
    report = plan_pipeline(FakeConnection(node), (_asking_step(query),), Options())
    assert report.outcomes[0].plan.reason == "answered: x 1"
    asked = [c for c in node.calls if c[:2] == ["sh", "-c"] and c[3] == "gpunode-simulate"]
    assert len(asked) == 1 and "x=1" in asked[0][2]


def test_a_query_the_node_refuses_stops_install_before_the_first_change():
    from gpunode.facts.transaction import simulation

    query = simulation("apt", ["x=1"])
    node = gpu_node()
    node.handlers["simulate"] = lambda n, argv, stdin: (100, "", "E: Version '1' for 'x' was not found\n")
    report = apply_pipeline(FakeConnection(node), (_asking_step(query, refused_blocks=True),), Options())
    outcome = report.outcomes[0]
    assert outcome.result == "blocked" and "E: Version '1' for 'x' was not found" in (outcome.error or "")
    assert node.changing_calls() == [] and report.exit_code != 0


# -- the node lock folded into the run's round trips (gpunode/nodelock.py) ------------------------------------

def _sent(node: FakeNode, since: int) -> list[str]:
    """The commands sent since `since`, by script name (`sh -c BODY gpunode-NAME`) or program."""
    return [c[3] if c[:2] == ["sh", "-c"] else c[0] for c in node.calls[since:]]


class _Messages(runner.NullReporter):
    def __init__(self) -> None:
        self.texts: list[str] = []

    def message(self, host, text):
        self.texts.append(text)


def test_a_converged_install_sends_two_commands_the_lock_with_the_probe_and_the_release():
    node = gpu_node()
    conn = FakeConnection(node)
    apply_pipeline(conn, PIPELINE, Options())  # converges the node
    before = len(node.calls)
    again = apply_pipeline(conn, PIPELINE, Options())
    assert again.exit_code == 0 and {o.result for o in again.outcomes} == {"ok"}
    assert _sent(node, before) == ["gpunode-node-lock", "gpunode-node-unlock"]
    lock_script = node.calls[before][2]
    assert 'echo "@' in lock_script and "@begin os_release" in lock_script  # the RUN probe rides on the lock
    assert lock_script.index("ln -s") < lock_script.index("@begin os_release")  # ... once the lock is taken
    assert again.facts is not None and again.facts.boot_id == node.boot_id  # and its answer is what was planned from
    assert node.node_lock is None and node.lock_takes == 2


def test_the_journals_last_write_carries_the_release():
    node = gpu_node()
    conn = FakeConnection(node)
    conn.run(["true"], sudo=True)  # root learned: only the run's own commands below
    report = apply_pipeline(conn, PIPELINE, Options())
    assert report.exit_code == 0 and report.outcomes[0].result == "changed"
    last = node.calls[-1]
    assert last[3] == "gpunode-write-file" and last[4] == "/var/lib/gpunode/journal.json"
    assert last[-2] == "/var/lib/gpunode/run.lock" and last[-1].startswith(f"gpunode-lock pid=- boot={node.boot_id}\n")
    assert "gpunode-node-unlock" not in _sent(node, 0)  # no round trip of its own
    assert _journal_run(node)["status"] == "done" and node.node_lock is None


def test_a_held_lock_runs_no_probe_waits_and_fails_naming_the_holder():
    from gpunode import nodelock

    node = gpu_node()
    other = nodelock.acquire(FakeConnection(node), "install driver", 0)
    conn = FakeConnection(node, name="gpu-01")
    before = len(node.calls)
    with pytest.raises(nodelock.NodeLocked) as caught:
        apply_pipeline(conn, PIPELINE, Options(lock_timeout=0))
    assert caught.value.exit_code == 2
    assert caught.value.message.startswith("gpu-01: another gpunode run holds the node: `gpunode install driver`")
    assert "--lock-timeout" in (caught.value.fix or "")
    assert [c for c in _sent(node, before) if c != "id"] == ["gpunode-node-lock"]  # nothing else: no probe, no write
    assert node.node_lock == other.text and node.files == {}


def test_a_run_waits_for_the_holder_and_plans_only_from_the_probe_that_ran_with_the_lock(monkeypatch):
    from gpunode import cancel, nodelock

    node = gpu_node()
    other = nodelock.acquire(FakeConnection(node), "uninstall", 0)
    node.modules.add("nouveau")  # what the holder's run would see; it is gone by the time ours probes
    slept = []

    def sleep(seconds):
        slept.append(seconds)
        node.modules.discard("nouveau")  # the holder finishes its work ...
        other.release()  # ... and lets go
        return False

    monkeypatch.setattr(cancel, "sleep", sleep)
    shown = _Messages()
    before = len(node.calls)
    report = apply_pipeline(FakeConnection(node), PIPELINE, Options(lock_timeout=60), shown)
    assert slept and any(t.startswith("waiting up to 60s for another gpunode run on this node: ") for t in shown.texts)
    assert [c for c in _sent(node, before) if c.startswith("gpunode-node-lock")] == ["gpunode-node-lock"] * 2
    assert "nouveau" not in report.facts.modules  # type: ignore[union-attr]  # the second try's probe
    assert node.node_lock is None


def test_a_stale_lock_is_taken_over_with_a_note_and_released():
    from gpunode import nodelock

    node = gpu_node()
    nodelock.acquire(FakeConnection(node), "install everything", 0)  # never released: that run died
    node.reboot()
    shown = _Messages()
    report = apply_pipeline(FakeConnection(node), PIPELINE, Options(), shown)
    assert report.error is None and report.exit_code == 3  # the blacklist waits for a reboot (no --reboot)
    assert any(t.startswith("took over a stale gpunode lock (its run is gone from the node): `gpunode install "
                            "everything` since ") for t in shown.texts)
    assert node.node_lock is None


def test_the_lock_is_released_when_the_probe_with_it_is_cut_short(monkeypatch):
    from gpunode.errors import CommandError

    node = gpu_node()
    monkeypatch.setattr(FakeConnection, "_probe", lambda self, script: "")  # the probe printed nothing
    with pytest.raises(CommandError, match="the fact probe printed nothing usable"):
        apply_pipeline(FakeConnection(node), PIPELINE, Options())
    assert node.node_lock is None and node.lock_takes == 1


def test_the_lock_is_released_after_a_bug(monkeypatch):
    node = gpu_node()

    def boom(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(runner, "run_steps", boom)
    report = apply_pipeline(FakeConnection(node), PIPELINE, Options())
    assert report.error and node.node_lock is None

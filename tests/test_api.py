"""gpunode/api.py: the library entry points the Ansible collection uses, on the fake connection."""

from __future__ import annotations

import pytest

from gpunode import api
from gpunode.errors import UsageError
from gpunode.steps import PIPELINE, nouveau
from tests.fakes.connection import FakeConnection, FakeNode


def gpu_node(**kw) -> FakeNode:
    node = FakeNode(tools={"update-initramfs", "modprobe", "systemctl"}, **kw)
    node.add_gpu(0x1EB8)
    return node


def nouveau_only() -> api.Request:
    return api.request({"only": ["nouveau"]})


def test_request_defaults_are_the_cli_defaults_and_never_reboot():
    chosen = api.request({})
    assert chosen.steps == PIPELINE
    assert chosen.options.reboot is False and chosen.options.lock_timeout == 600.0 and chosen.options.progress is None
    chosen = api.request({"skip": ["k8s"], "engines": ["Docker"], "mig_layout": ["1g.10gb", "1g.10gb"],
                          "driver": None, "gpu_replicas": 4})
    assert [s.name for s in chosen.steps] == [s.name for s in PIPELINE if s.name != "k8s"]
    assert chosen.options.engines == ("docker",) and chosen.options.mig_layout == ("1g.10gb", "1g.10gb")
    assert chosen.options.gpu_replicas == 4


@pytest.mark.parametrize(("values", "named", "not_named"), [
    ({"driver": "5x5"}, "driver", "--driver"),
    ({"sha256": "abc"}, "sha256", "--sha256"),
    ({"mps_thread_percentage": 50}, "mps", "--mps"),
    ({"module_signing_key": "/k.priv"}, "module_signing_cert", "--module-signing-cert"),
    ({"toolkit_version": "latest"}, "toolkit_version", "--toolkit-version"),
    ({"gpu_replicas": 0}, "gpu_replicas", "--gpu-replicas"),
    ({"only": ["driver"], "skip": ["driver"]}, "only driver", "--only"),
])
def test_bad_values_fail_with_the_cli_checks_naming_the_option_as_the_caller_spells_it(values, named, not_named):
    with pytest.raises(UsageError) as caught:
        api.request(values)
    text = caught.value.message + " " + (caught.value.fix or "")
    assert named in text and not_named not in text, text


def test_day2_options_reach_the_options_and_unset_holds_stay_unset():
    plain = api.request({}).options
    assert plain.hold_kernel is None and plain.hold_driver is None and plain.stop_gpu_services is False
    chosen = api.request({"stop_gpu_services": True, "hold_kernel": False, "hold_driver": True}).options
    assert chosen.stop_gpu_services is True and chosen.hold_kernel is False and chosen.hold_driver is True
    assert api.request({"hold_kernel": None}).options.hold_kernel is None  # Ansible's "unset"


def test_bake_selects_the_steps_the_cli_selects():
    from gpunode.bake import BAKE_STEPS
    from gpunode.cli import _inputs
    from gpunode.cli._params import PIPELINE

    chosen = api.request({"bake": True, "driver": "535.129.03", "bake_kernel": "5.15.0-92-generic"})
    assert [s.name for s in chosen.steps] == [*BAKE_STEPS, "bake"]
    assert chosen.options.bake and chosen.options.bake_kernel == "5.15.0-92-generic" and not chosen.options.reboot
    cli = _inputs.request({**{name: default for name, _, default in PIPELINE}, "bake": True,
                           "driver": "535.129.03", "bake_kernel": "5.15.0-92-generic"}, None)
    assert chosen.steps == cli.steps
    skipped = api.request({"bake": True, "driver": "535.129.03", "skip": ["toolkit", "runtime"]})
    assert [s.name for s in skipped.steps] == [*(n for n in BAKE_STEPS if n not in ("toolkit", "runtime")), "bake"]


@pytest.mark.parametrize(("values", "named", "not_named"), [
    ({"bake_kernel": "5.15.0-92-generic"}, "bake_kernel goes with bake", "--"),
    ({"bake": True, "driver": "535.129.03", "bake_kernel": "not a kernel"}, "bake_kernel", "--kernel"),
    ({"bake": True}, "needs the driver", "--driver"),
])
def test_bake_errors_name_the_options_as_the_caller_spells_them(values, named, not_named):
    with pytest.raises(UsageError) as caught:
        api.request(values)
    text = caught.value.message + " " + (caught.value.fix or "")
    assert named in text and not_named not in text, text


def test_unknown_options_and_missing_controller_files_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="unknown option reboot"):
        api.request({"reboot": True})
    with pytest.raises(UsageError, match="toolkit_packages .*no such file on this machine"):
        api.request({"toolkit_packages": [str(tmp_path / "missing.deb")]})


def test_check_mode_predicts_changed_and_the_run_reports_what_it_did():
    node = gpu_node(modules={"nouveau"})
    conn = FakeConnection(node)
    planned = api.plan(conn, nouveau_only())
    assert planned.changed and planned.changed_steps == ["nouveau"] and planned.reboot_required
    assert [f.path for f in planned.file_changes()] == [nouveau.PATH]
    assert node.files == {}

    applied = api.install(conn, nouveau_only())
    assert applied.changed and applied.changed_steps == ["nouveau"]
    assert applied.state == "reboot-pending" and applied.reboot_required and node.reboots == 0
    assert [f.path for f in applied.file_changes()] == [nouveau.PATH]
    assert applied.to_dict()["changed_steps"] == ["nouveau"]


def test_a_step_waiting_only_for_a_reboot_changes_nothing_in_check_mode_or_in_the_run():
    node = gpu_node(modules={"nouveau"})
    conn = FakeConnection(node)
    api.install(conn, nouveau_only())  # blacklisted; nouveau is still loaded until the node reboots
    planned = api.plan(conn, nouveau_only())
    assert planned.reboot_required and not planned.changed and planned.file_changes() == []
    before = len(node.calls)
    applied = api.install(conn, nouveau_only())
    assert applied.reboot_required and not applied.changed and applied.state == "reboot-pending"
    # only gpunode's own journal is written (the reboot stays owed); nothing of the node's configuration
    assert [c for c in node.changing_calls(before) if "/var/lib/gpunode/journal.json" not in c] == []
    node.reboot()
    assert api.plan(conn, nouveau_only()).changed is False
    assert api.install(conn, nouveau_only()).state == "ready"


def test_install_refuses_to_reboot():
    chosen = nouveau_only()
    rebooting = api.Request(chosen.steps, type(chosen.options)(reboot=True))
    with pytest.raises(UsageError, match="never reboots"):
        api.install(FakeConnection(gpu_node()), rebooting)


def test_doctor_is_the_doctor_json_document_with_the_verdict():
    document = api.doctor(FakeConnection(gpu_node(modules={"nouveau"}), name="gpu-01"))
    assert document["host"] == "gpu-01" and document["checks"]
    readiness = document["readiness"]
    assert isinstance(readiness, dict) and readiness["ready"] is False and readiness["reason"]
    assert document["failures"] and document["exit_code"] == 1


def test_uninstall_check_mode_predicts_the_undo_which_then_leaves_nothing_to_undo():
    node = gpu_node(modules={"nouveau"})
    conn = FakeConnection(node)
    assert api.install(conn, nouveau_only()).changed
    blacklist = node.files[nouveau.PATH]
    chosen = api.uninstall_request({"only": None, "lock_timeout": 600.0, "driver": None, "k8s": False})

    before = len(node.calls)
    check = api.uninstall(conn, chosen, dry_run=True)
    assert check.changed and check.changed_steps == ["nouveau"]
    # one name for an uninstall's dry run, the same the CLI prints (the Ansible module's check mode reports it)
    assert check.report.mode == check.to_dict()["mode"] == "uninstall-dry-run" and check.report.dry_run
    assert node.changing_calls(before) == [] and node.files[nouveau.PATH] == blacklist
    assert [(d.path, d.before, d.after) for d in check.file_diffs()] == [(nouveau.PATH, blacklist, None)]
    assert check.to_dict()["summary"]["nothing_to_undo"] is False

    done = api.uninstall(conn, chosen)
    assert done.changed and done.changed_steps == ["nouveau"] and done.state == "ready"
    assert nouveau.PATH not in node.files
    assert [(d.path, d.after) for d in done.file_diffs()] == [(nouveau.PATH, None)]

    before = len(node.calls)
    for dry_run in (True, False):
        again = api.uninstall(conn, chosen, dry_run=dry_run)
        assert not again.changed and again.report.outcomes == [] and again.to_dict()["summary"]["nothing_to_undo"]
    assert node.changing_calls(before) == []


@pytest.mark.parametrize(("values", "named"), [
    ({"driver": "535.129.03"}, "driver is an install option"),
    ({"k8s": True}, "k8s is an install option"),
    ({"only": ["kernel"]}, "only: unknown step 'kernel'"),
    ({"lock_timeout": -1}, "lock_timeout -1"),
    ({"state": "absent"}, "unknown option state"),
])
def test_uninstall_options_refuse_what_an_uninstall_would_ignore(values, named):
    with pytest.raises(UsageError, match=named.replace("(", r"\(")):
        api.uninstall_request(values)


def test_uninstall_options_reach_the_undo():
    chosen = api.uninstall_request({"only": ["prerequisites"], "lock_timeout": 0, "stop_gpu_services": True})
    assert chosen.request.steps == ("prerequisites",) and chosen.request.prerequisites
    assert chosen.request.lock_timeout == 0 and chosen.options.stop_gpu_services and not chosen.options.reboot


def test_file_diffs_include_the_files_nvidia_ctk_edits():
    """Ansible's --diff (and the library's file_diffs) show daemon.json, which nvidia-ctk writes, as plan's diff does."""
    from tests.fakes.connection import FakeConnection, FakeNode, FakeSystem

    node = FakeNode(tools={"update-initramfs", "modprobe", "systemctl", "docker", "dockerd", "apt-get", "dpkg"})
    node.add_gpu(0x1EB8)
    FakeSystem(node).unit("docker").attach()
    result = api.plan(FakeConnection(node, name="gpu-01"), api.request({"only": ["toolkit", "runtime"]}))
    diffs = {d.path: d for d in result.file_diffs()}
    assert "/etc/docker/daemon.json" in diffs
    daemon = diffs["/etc/docker/daemon.json"]
    assert daemon.before is None and '"nvidia"' in (daemon.after or "")
    runtime = next(o for o in result.report.outcomes if o.step == "runtime")
    shown = "".join(a.diff() for a in runtime.plan.actions if hasattr(a, "diff"))
    assert "/etc/docker/daemon.json" in shown  # the same file in plan's own diff


def test_a_blocked_steps_fix_is_data_the_library_takes_back_as_its_request():
    """A library user gets the fix's gpunode command as the options `api.request` takes, not as CLI text."""
    conn = FakeConnection(gpu_node())
    planned = api.plan(conn, api.request({"only": ["driver"]}))
    found = planned.fixes()
    assert [f["step"] for f in found] == ["driver"] and found[0]["result"] == "blocked"
    command = next(p for p in found[0]["parts"] if "gpunode" in p)
    assert command["gpunode"] == "install" and command["options"]["driver"]
    again = api.request({**command["options"], "only": ["driver"]})
    assert api.plan(conn, again).report.outcomes[0].result != "blocked"
    assert found[0]["fix"].startswith("gpunode install --driver ")

"""The runtime step on fake nodes: plan (with the predicted diff), apply through nvidia-ctk, converge, and a
re-run that changes nothing. Engines are only restarted when their effective configuration changes."""

from __future__ import annotations

import json

import pytest

from gpunode.facts import FULL, gather
from gpunode.facts import containers as c
from gpunode.options import Options
from gpunode.plan import Earlier, RestartService, Status, change
from gpunode.runner import apply_pipeline, plan_pipeline
from gpunode.steps import runtime, toolkit
from gpunode.steps.base import Step
from gpunode.steps.outputs import ToolkitOutputs
from tests.conftest import FIXTURES, fixture_files
from tests.fakes.connection import FakeConnection, FakeNode, FakeSystem

TOOLKIT = FakeSystem.TOOLKIT
DOCKER_FIXTURES = [p for p in fixture_files("docker-daemon-json") if p.suffix == ".json" and "INVALID" not in p.name]
CONTAINERD_FIXTURES = [p for p in fixture_files("containerd-config") if not p.name.startswith("v1_")]


def make_node(engines=("docker",), files=None, ctk="1.20.0-1", active=True, **kw):
    node = FakeNode(**kw)
    node.add_gpu(0x1EB8)
    node.tools |= {{"docker": "dockerd", "containerd": "containerd", "crio": "crio"}[e] for e in engines}
    node.files.update(files or {})
    system = FakeSystem(node, packages={p: ctk for p in TOOLKIT} if ctk else {}).attach()
    for engine in engines:
        system.unit(engine, "active" if active else "inactive")
    return node, system


def run(node, steps=(runtime.STEP,), **options):
    return apply_pipeline(FakeConnection(node), steps, Options(**options))


def plan_of(node, **options):
    return runtime.plan(gather(FakeConnection(node)), Options(**options), {})


def only_probes_since(node, start):
    """Nothing but read-only calls (the fact probe, file reads, the privilege check) since `start`."""
    return node.changing_calls(start) == []


def test_docker_plan_shows_the_exact_command_and_the_diff_nvidia_ctk_will_make():
    before = (FIXTURES / "docker-daemon-json" / "registry-mirrors-only_no-nvidia.json").read_text()
    node, _ = make_node(files={c.DOCKER_CONFIG: before})
    plan = plan_of(node)
    assert plan.status is Status.CHANGE and plan.reason == "docker: nvidia runtime missing"
    configure, restart = plan.actions
    backup, configure_line = configure.commands()  # daemon.json exists: a copy is kept first, then nvidia-ctk
    assert backup.startswith("sudo sh -c 'stamp=$(date") and backup.endswith(f"gpunode-backup-files {c.DOCKER_CONFIG}")
    assert configure_line == "sudo nvidia-ctk runtime configure --runtime=docker --config=/etc/docker/daemon.json"
    data = configure.to_dict()
    assert data["kind"] == "runtime-config" and data["files"] == [c.DOCKER_CONFIG]
    assert '+    "runtimes": {' in data["diff"] and '+            "path": "nvidia-container-runtime"' in data["diff"]
    assert isinstance(restart, RestartService) and restart.unit == "docker.service"
    assert node.files[c.DOCKER_CONFIG] == before  # planning changed nothing


def test_docker_apply_converges_keeps_user_keys_backs_up_and_a_rerun_changes_nothing():
    before = (FIXTURES / "docker-daemon-json" / "registry-mirrors-only_no-nvidia.json").read_text()
    real = (FIXTURES / "nvidia-ctk" / "docker_registry-mirrors-only_no-nvidia" /
            "output-registry-mirrors-only_no-nvidia.json").read_text()
    node, system = make_node(files={c.DOCKER_CONFIG: before})
    report = run(node)
    assert report.outcomes[0].result == "changed", report.outcomes[0].error
    assert node.files[c.DOCKER_CONFIG] == real  # what the real nvidia-ctk wrote
    assert system.restarts == ["docker.service"]
    backups = [p for p in node.files if p.startswith(c.DOCKER_CONFIG + ".gpunode-bak.")]
    assert len(backups) == 1 and node.files[backups[0]] == before
    assert report.outcomes[0].backups == [f"backup: {backups[0]}"]
    start = len(node.calls)
    again = run(node)
    assert again.outcomes[0].result == "ok" and only_probes_since(node, start)
    assert system.restarts == ["docker.service"]  # not restarted again


def test_already_configured_docker_is_left_alone_and_not_restarted():
    text = (FIXTURES / "docker-daemon-json" / "nvidia-ctk-style_args-key_default-runtime-first.json").read_text()
    node, system = make_node(files={c.DOCKER_CONFIG: text})
    plan = plan_of(node, set_as_default=True)
    assert plan.status is Status.OK and "nvidia runtime in place (nvidia-container-runtime, the default)" in plan.reason
    report = run(node, set_as_default=True)
    assert report.outcomes[0].result == "ok" and system.restarts == []


def test_equivalent_but_differently_written_entry_does_not_restart_the_engine():
    # /usr/bin path and "runtimeArgs": nvidia-ctk would only normalise it; docker already runs it
    text = (FIXTURES / "docker-daemon-json" / "hosts-tcp-unix_plus-nvidia-runtime.json").read_text()
    node, system = make_node(files={c.DOCKER_CONFIG: text})
    assert plan_of(node).status is Status.OK
    plan = plan_of(node, set_as_default=True)  # but making it the default is a real change
    assert plan.status is Status.CHANGE and plan.reason == "docker: nvidia is not the default runtime"
    assert "--set-as-default" in plan.actions[0].argv


def test_an_existing_nvidia_default_is_kept():
    text = (FIXTURES / "docker-daemon-json" / "data-root_default-runtime-nvidia.json").read_text()
    node, _ = make_node(files={c.DOCKER_CONFIG: text})
    assert plan_of(node).status is Status.OK


@pytest.mark.parametrize("path", DOCKER_FIXTURES, ids=lambda p: p.stem)
@pytest.mark.parametrize("default", [False, True])
def test_every_real_daemon_json_converges_and_keeps_its_keys(path, default):
    before = json.loads(path.read_text())
    node, _ = make_node(files={c.DOCKER_CONFIG: path.read_text()})
    report = run(node, set_as_default=default)
    assert report.outcomes[0].result in ("ok", "changed"), report.outcomes[0].error
    after = json.loads(node.files[c.DOCKER_CONFIG])
    assert set(before) <= set(after)
    for key in before:
        if key not in ("runtimes", "default-runtime"):
            assert after[key] == before[key]
    assert set(before.get("runtimes", {})) <= set(after["runtimes"])
    assert c.docker_state(after).satisfies(default)
    assert run(node, set_as_default=default).outcomes[0].result == "ok"


def test_invalid_daemon_json_is_blocked_with_a_clear_error_and_left_untouched():
    text = (FIXTURES / "docker-daemon-json" / "default-runtime-nvidia_unindented_TRAILING-COMMA-INVALID.json").read_text()
    node, system = make_node(files={c.DOCKER_CONFIG: text})
    report = run(node)
    outcome = report.outcomes[0]
    assert outcome.result == "blocked" and report.exit_code == 1
    assert outcome.plan.reason == ("docker: /etc/docker/daemon.json: not valid JSON: Expecting property name enclosed "
                                   "in double quotes (line 9, column 1)")
    assert "repair /etc/docker/daemon.json by hand" in outcome.plan.fix
    assert node.files[c.DOCKER_CONFIG] == text and not node.ran("nvidia-ctk") and system.restarts == []


@pytest.mark.parametrize("path", CONTAINERD_FIXTURES, ids=lambda p: p.stem)
def test_every_real_containerd_config_converges_with_k8s_and_keeps_its_keys(path):
    text = path.read_text()
    node, system = make_node(engines=("containerd",), files={c.CONTAINERD_CONFIG: text})
    report = run(node, k8s=True)
    already = path.stem.startswith("v2_gpu-operator")  # nvidia already the default (GPU operator's toolkit)
    assert report.outcomes[0].result == ("ok" if already else "changed"), report.outcomes[0].error
    assert system.restarts == ([] if already else ["containerd.service"])
    assert c.containerd_state(c.effective_containerd(node.files).config).satisfies(True)
    main = c.parse_toml(node.files[c.CONTAINERD_CONFIG], "x")

    def leaves(d, prefix=()):
        for k, v in d.items():
            yield from leaves(v, (*prefix, k)) if isinstance(v, dict) else [((*prefix, k), v)]

    for key, value in leaves(c.parse_toml(text, "x")):
        cursor = main
        for part in key:
            cursor = cursor[part]
        assert cursor == value, key  # every key the user had is still in config.toml, same value
    start = len(node.calls)
    assert run(node, k8s=True).outcomes[0].result == "ok" and only_probes_since(node, start)
    assert system.restarts == ([] if already else ["containerd.service"])


def test_containerd_v2_plan_shows_drop_in_and_imports_diff():
    text = (FIXTURES / "containerd-config" / "kind-node-image_v2_runc-systemdcgroup_test-handler_no-nvidia.toml").read_text()
    node, _ = make_node(engines=("containerd",), files={c.CONTAINERD_CONFIG: text})
    plan = plan_of(node, k8s=True)
    configure = plan.actions[0]
    assert configure.argv == ("nvidia-ctk", "runtime", "configure", "--runtime=containerd",
                              "--config=/etc/containerd/config.toml", "--config-source=file",
                              "--drop-in-config=/etc/containerd/conf.d/99-nvidia.toml", "--set-as-default")
    diff = configure.diff()
    assert '+imports = ["/etc/containerd/conf.d/*.toml"]' in diff
    assert "+++ /etc/containerd/conf.d/99-nvidia.toml" in diff and '+      default_runtime_name = "nvidia"' in diff
    assert configure.backups == (c.CONTAINERD_CONFIG,)
    assert any("comments do not" in n for n in plan.notes)


def test_containerd_v1_is_blocked_because_the_drop_in_would_never_be_read():
    text = (FIXTURES / "containerd-config" / "v1_implicit_plugins-cri_no-nvidia.toml").read_text()
    node, _ = make_node(engines=("containerd",), files={c.CONTAINERD_CONFIG: text})
    plan = plan_of(node)
    assert plan.status is Status.BLOCKED
    assert "config version 1" in plan.reason and "never imports" in plan.reason and "migrate" in plan.fix


def test_invalid_containerd_toml_is_blocked_and_untouched():
    node, _ = make_node(engines=("containerd",), files={c.CONTAINERD_CONFIG: "version = 2\n[plugins\n"})
    report = run(node)
    assert report.outcomes[0].result == "blocked" and "not valid TOML" in report.outcomes[0].plan.reason
    assert node.files[c.CONTAINERD_CONFIG] == "version = 2\n[plugins\n"


def test_containerd_2_with_v3_config_and_old_toolkit_edits_in_place():
    text = (FIXTURES / "containerd-config" / "v3_containerd2_top-level_runc-only_no-nvidia.toml").read_text()
    node, _ = make_node(engines=("containerd",), files={c.CONTAINERD_CONFIG: text}, ctk="1.17.8-1")
    node.outputs["containerd_version"] = ("containerd github.com/containerd/containerd/v2 v2.0.2 c507a0\n", 0)
    plan = plan_of(node)
    assert "--drop-in-config" not in " ".join(plan.actions[0].argv) and "--config-source=file" in plan.actions[0].argv
    assert run(node).outcomes[0].result == "changed"
    assert c.CONTAINERD_DROPIN not in node.files
    assert 'BinaryName = "/usr/bin/nvidia-container-runtime"' in node.files[c.CONTAINERD_CONFIG]


def test_docker_with_its_private_containerd_configures_docker_only():
    daemon = (FIXTURES / "docker-daemon-json" / "registry-mirrors-only_no-nvidia.json").read_text()
    node, system = make_node(engines=("docker", "containerd"), files={
        c.DOCKER_CONFIG: daemon, c.CONTAINERD_CONFIG: 'version = 2\ndisabled_plugins = ["cri"]\n'})
    plan = plan_of(node)
    assert plan.reason == "docker: nvidia runtime missing"
    assert any("containerd runs under docker here (its CRI plugin is disabled)" in n for n in plan.notes)
    assert plan_of(node, engines=("containerd",)).reason == "containerd: nvidia runtime missing"
    # docker-ce's own containerd.io config has no `version`: version 1, where nvidia-ctk 1.18+ cannot help
    node.files[c.CONTAINERD_CONFIG] = 'disabled_plugins = ["cri"]\n'
    assert plan_of(node, engines=("containerd",)).status is Status.BLOCKED


def test_an_engine_that_is_not_running_is_configured_but_not_started():
    node, system = make_node(active=False)
    plan = plan_of(node)
    assert [type(a).__name__ for a in plan.actions] == ["ConfigureRuntime"]
    assert any("docker.service is not running (inactive)" in n for n in plan.notes)
    assert run(node).outcomes[0].result == "changed" and system.restarts == []


def test_snap_docker_alone_is_blocked_and_explained():
    node, _ = make_node(engines=())
    FakeSystem(node).attach().unit(c.SNAP_DOCKER_UNIT)
    plan = plan_of(node)
    assert plan.status is Status.BLOCKED and "docker from the snap store" in plan.reason
    assert any("snap remove docker" in n for n in plan.notes)


def test_rootless_docker_is_explained_next_to_a_system_engine():
    node, _ = make_node(files={"/home/ann/.config/systemd/user/docker.service": "[Unit]\n"})
    plan = plan_of(node)
    assert plan.status is Status.CHANGE
    assert any("rootless docker in /home/ann" in n and "no-cgroups" in n for n in plan.notes)
    lone, _ = make_node(engines=(), files={"/home/ann/.config/systemd/user/docker.service": "[Unit]\n"})
    assert plan_of(lone).status is Status.BLOCKED


def test_engine_option_validation_and_no_engine_at_all():
    node, _ = make_node()
    assert plan_of(node, engines=("cri-o",)).status is Status.BLOCKED
    assert "--engine cri-o: no system CRI-O" in plan_of(node, engines=("cri-o",)).reason
    bare, _ = make_node(engines=())
    assert plan_of(bare).status is Status.OK and "no container engine" in plan_of(bare).reason


def test_crio_gets_a_drop_in():
    node, system = make_node(engines=("crio",), files={c.CRIO_CONFIG: "[crio.runtime]\n"})
    assert run(node, k8s=True).outcomes[0].result == "changed"
    assert c.crio_state(c.effective_crio(node.files).config).satisfies(True)
    assert system.restarts == ["crio.service"]


def test_without_nvidia_ctk_it_waits_for_the_toolkit_step():
    node, _ = make_node(ctk=None)
    facts = gather(FakeConnection(node))
    alone = runtime.plan(facts, Options(), {})
    assert alone.status is Status.BLOCKED and "--only toolkit" in alone.fix
    pending = change("toolkit", "not installed", []).with_outputs(ToolkitOutputs(True, "1.17.8-1"))
    planned = runtime.plan(facts, Options(), Earlier({"toolkit": pending}, runtime.READS))
    assert planned.status is Status.CHANGE
    assert any("predicted for nvidia-ctk 1.17.8, which the toolkit step installs first" in n for n in planned.notes)


def test_no_gpu_no_change():
    node = FakeNode()
    FakeSystem(node).attach().unit("docker")
    assert plan_of(node).status is Status.OK


def test_toolkit_then_runtime_in_one_run_on_a_fresh_node():
    node, system = make_node(ctk=None, files={c.DOCKER_CONFIG: '{"log-driver": "journald"}'})
    node.tools |= {"apt-get", "curl", "gpg"}
    system.versions.update({p: "1.18.1-1" for p in TOOLKIT})
    dry = plan_pipeline(FakeConnection(node), (toolkit.STEP, runtime.STEP), Options())
    assert [o.plan.status for o in dry.outcomes] == [Status.CHANGE, Status.CHANGE]
    report = run(node, steps=(toolkit.STEP, runtime.STEP))
    assert [o.result for o in report.outcomes] == ["changed", "changed"], [o.error for o in report.outcomes]
    assert json.loads(node.files[c.DOCKER_CONFIG])["log-driver"] == "journald"
    assert [o.result for o in run(node, steps=(toolkit.STEP, runtime.STEP)).outcomes] == ["ok", "ok"]


def test_a_failing_restart_fails_the_step():
    node, system = make_node()

    def broken(n, argv, stdin):
        return (1, "", "Job for docker.service failed\n") if "restart" in argv else system._handle(n, argv, stdin)

    node.handlers["systemctl"] = broken
    report = run(node, steps=(runtime.STEP, Step("later", "Later", lambda f, o, e: change("later", "x", []))))
    assert report.outcomes[0].result == "failed" and "restart docker" in report.outcomes[0].error
    assert report.outcomes[1].result == "not-run"


def test_cli_options_reach_the_plan_and_json_carries_the_diff(monkeypatch):
    from typer.testing import CliRunner

    from gpunode import connection
    from gpunode.cli import app

    node, _ = make_node(engines=("containerd",), files={c.CONTAINERD_CONFIG: 'version = 2\n'})
    monkeypatch.setattr(connection, "open_connection", lambda spec: FakeConnection(node, name="n"))
    cli = CliRunner()
    result = cli.invoke(app, ["plan", "--host", "n", "--only", "runtime", "--engine", "containerd", "--k8s", "--json"])
    step = json.loads(result.stdout)["steps"][0]
    assert step["status"] == "change" and step["actions"][0]["kind"] == "runtime-config"
    assert "--set-as-default" in step["actions"][0]["commands"][-1]
    assert step["outputs"] == {"engines": ["containerd"]}
    assert '+      default_runtime_name = "nvidia"' in step["actions"][0]["diff"]
    bad = cli.invoke(app, ["plan", "--host", "n", "--engine", "podman"])
    assert bad.exit_code == 2 and "is not an engine nvidia-ctk configures" in bad.output
    bad = cli.invoke(app, ["plan", "--host", "n", "--toolkit-version", "latest"])
    assert bad.exit_code == 2 and "is not a toolkit version" in bad.output


@pytest.mark.parametrize("engine", ["docker", "containerd"])
def test_install_and_doctor_agree_when_the_runtime_binary_is_gone(engine):
    from gpunode.doctor import run_checks
    text = (FIXTURES / "docker-daemon-json" / "nvidia-ctk-style_args-key_default-runtime-first.json").read_text()
    files = {c.DOCKER_CONFIG: text} if engine == "docker" else \
        c.predict_containerd(None, set_as_default=False, ctk=(1, 20, 0))
    node, system = make_node(engines=(engine,), files=files)
    check_id = f"container.{engine}-nvidia-runtime"

    def both():
        step = runtime.plan(gather(FakeConnection(node)), Options(), {})  # install's probe
        check = next(r for r in run_checks(gather(FakeConnection(node), FULL)) if r.id == check_id)  # doctor's
        return step, check

    step, check = both()
    assert step.status is Status.OK and check.status == "pass", (step.reason, check.evidence)
    node.tools.discard(c.RUNTIME_BINARY)  # the package is installed, its binary was deleted
    step, check = both()
    assert step.status is Status.BLOCKED and check.status == "fail", (step.reason, check.evidence)
    assert step.fix == check.fix == "sudo apt-get install -y --no-install-recommends --reinstall " \
                                    "nvidia-container-toolkit-base"
    assert "missing" in step.reason and c.RUNTIME_BINARY in step.reason
    report = run(node)
    assert report.outcomes[0].result == "blocked" and report.exit_code != 0
    # when the toolkit step of the same run installs the toolkit, the binary comes with it: not blocked
    later = runtime.plan(gather(FakeConnection(node)), Options(),
                         Earlier({"toolkit": change("toolkit", "x", []).with_outputs(ToolkitOutputs(True))},
                                 runtime.READS))
    assert later.status is not Status.BLOCKED

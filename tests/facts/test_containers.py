"""Engine configs: every real daemon.json / containerd config, and every real `nvidia-ctk runtime configure` run
(tests/fixtures/real/nvidia-ctk): the prediction must equal what the real tool wrote, byte for byte, and the
"configured?" check must agree with it."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from gpunode.facts import containers as c
from tests.conftest import FIXTURES, fixture_files

CTK = (1, 20, 0)  # the fixtures' nvidia-ctk (commit d34b3046, v1.20 line)
RUNS = sorted(p for p in (FIXTURES / "nvidia-ctk").iterdir() if p.is_dir())


def run_of(folder: Path) -> dict:
    argv = shlex.split((folder / "command.txt").read_text())
    opts = {a.split("=", 1)[0]: (a.split("=", 1)[1] if "=" in a else "") for a in argv if a.startswith("--")}
    source = next(folder.glob("input-*"))
    outputs = {}
    for out in folder.glob("output-*"):
        path = opts.get("--drop-in-config") if out.name == "output-conf.d-99-nvidia.toml" else opts["--config"]
        outputs[path] = out.read_text()
    return {"runtime": opts["--runtime"], "config": opts["--config"], "dropin": opts.get("--drop-in-config"),
            "default": "--set-as-default" in opts, "input": source.read_text(),
            "exit": int((folder / "exit-code").read_text()), "outputs": outputs,
            "log": (folder / "stdout-stderr.txt").read_text()}


def predict(run: dict) -> dict[str, str]:
    if run["runtime"] == "docker":
        data = c.parse_daemon_json(run["input"], run["config"])
        return {run["config"]: c.dump_daemon_json(c.configure_docker(data, run["default"]))}
    return c.predict_containerd(run["input"], config=run["config"], dropin=run["dropin"],
                                set_as_default=run["default"], ctk=CTK)


def state_of(run: dict, files: dict[str, str]) -> c.RuntimeState:
    if run["runtime"] == "docker":
        return c.docker_state(c.parse_daemon_json(files[run["config"]]))
    known = (str(Path(run["dropin"]).parent),)
    return c.containerd_state(c.effective_containerd(files, config=run["config"], known_dirs=known).config)


@pytest.mark.parametrize("folder", RUNS, ids=lambda p: p.name)
def test_prediction_equals_the_real_nvidia_ctk_byte_for_byte(folder):
    run = run_of(folder)
    if run["exit"] != 0:
        with pytest.raises(c.ConfigError, match="not valid JSON"):
            predict(run)
        assert run["outputs"][run["config"]] == run["input"]  # the real tool left it untouched too
        return
    predicted = predict(run)
    for path, text in run["outputs"].items():
        assert predicted.get(path, run["input"]) == text, path


@pytest.mark.parametrize("folder", [f for f in RUNS if run_of(f)["exit"] == 0], ids=lambda p: p.name)
def test_configured_detection_agrees_with_what_the_real_tool_wrote(folder):
    run = run_of(folder)
    after = state_of(run, dict(run["outputs"]))
    v1 = "Using config version 1" in run["log"]
    if v1:
        # nvidia-ctk 1.20 writes a v1 config's runtime to a drop-in that nothing imports: no effect on containerd
        assert not after.has_nvidia
        return
    assert after.satisfies(run["default"]), (after, run["default"])
    assert after.has_nvidia and (after.nvidia_is_default or not run["default"])
    # and on that output the prediction changes nothing the engine would see: re-running is a no-op
    again = predict({**run, "input": run["outputs"][run["config"]]})
    assert state_of(run, {**run["outputs"], **again}) == after


EXPECTED_BEFORE = {  # input -> does the engine already run the nvidia runtime (binary, default)?
    "data-root-data-docker_nvidia-runtime": (True, False),
    "data-root_default-runtime-nvidia": (True, True),
    "hosts-tcp-unix_plus-nvidia-runtime": (True, False),
    "kata-runtimes-runtimeType-options_no-nvidia-runtime": (False, False),
    "nvidia-ctk-style_args-key_default-runtime-first": (True, True),
    "registry-mirrors-only_no-nvidia": (False, False),
    "kind-node-image_v2_runc-systemdcgroup_test-handler_no-nvidia": (False, False),
    "microk8s_containerd-template_v2_nvidia-container-runtime_kata": (False, False),  # named nvidia-container-runtime
    "v1_implicit_plugins-cri_no-nvidia": (False, False),
    "v2_docker-bundled-containerd_default_no-nvidia": (False, False),
    "v2_gpu-operator-toolkit_nvidia-default_cdi-experimental-legacy_registry-mirrors": (True, True),
    "v3_containerd2_top-level_runc-only_no-nvidia": (False, False),
    "v3_nvidia-ctk-dropin_99-nvidia_nvidia-cdi-legacy": (True, False),
}


@pytest.mark.parametrize("path", [p for p in fixture_files("docker-daemon-json") if p.suffix == ".json"] +
                         fixture_files("containerd-config"), ids=lambda p: p.name)
def test_every_real_config_parses_and_is_classified(path):
    text = path.read_text()
    if "INVALID" in path.name:
        with pytest.raises(c.ConfigError) as exc:
            c.parse_daemon_json(text, "/etc/docker/daemon.json")
        assert "line 9, column 1" in str(exc.value) and exc.value.path == "/etc/docker/daemon.json"
        return
    if path.suffix == ".json":
        state = c.docker_state(c.parse_daemon_json(text))
    else:
        state = c.containerd_state(c.effective_containerd({c.CONTAINERD_CONFIG: text}).config)
    assert (state.has_nvidia, state.nvidia_is_default) == EXPECTED_BEFORE[path.stem]


def test_docker_keeps_every_user_key_and_only_replaces_the_nvidia_entry():
    for path in fixture_files("docker-daemon-json"):
        if path.suffix != ".json" or "INVALID" in path.name:
            continue
        before = json.loads(path.read_text())
        after = json.loads(c.dump_daemon_json(c.configure_docker(before, True)))
        for key, value in before.items():
            if key != "runtimes":
                assert after[key] == (value if key != "default-runtime" else "nvidia")
        for name, runtime in before.get("runtimes", {}).items():
            if name != "nvidia":
                assert after["runtimes"][name] == runtime


def test_docker_json_is_go_style():
    text = c.dump_daemon_json({"b": 1.0, "a": "<x&y>", "c": [], "d": {}})
    assert text == '{\n    "a": "\\u003cx\\u0026y\\u003e",\n    "b": 1,\n    "c": [],\n    "d": {}\n}'
    assert c.parse_daemon_json("") == {} and c.parse_daemon_json(None) == {}
    with pytest.raises(c.ConfigError, match="JSON object"):
        c.parse_daemon_json("[]")


def test_toml_emitter_quotes_keys_escapes_strings_and_keeps_floats_plain():
    text = c.dump_toml({"version": 2, "f": 0.02, "g": 1e-7, "s": 'a"b\\c\n', "plugins": {
        "io.containerd.grpc.v1.cri": {"x": True, "registry": {"mirrors": {"docker.io": {"endpoint": ["h"]}}}}}})
    assert text.splitlines()[:4] == ['f = 0.02', 'g = 0.0000001', 's = "a\\"b\\\\c\\n"', 'version = 2']
    assert '  [plugins."io.containerd.grpc.v1.cri"]\n    x = true\n' in text
    assert '        [plugins."io.containerd.grpc.v1.cri".registry.mirrors."docker.io"]\n' \
           '          endpoint = ["h"]\n' in text
    assert c.parse_toml(text, "x") == {"version": 2, "f": 0.02, "g": 1e-7, "s": 'a"b\\c\n', "plugins": {
        "io.containerd.grpc.v1.cri": {"x": True, "registry": {"mirrors": {"docker.io": {"endpoint": ["h"]}}}}}}


def test_invalid_toml_is_a_config_error_with_the_path():
    with pytest.raises(c.ConfigError) as exc:
        c.parse_toml("version = 2\n[plugins\n", "/etc/containerd/config.toml")
    assert exc.value.path == "/etc/containerd/config.toml" and "not valid TOML" in exc.value.message


def test_config_versions_and_plugin_names():
    assert c.containerd_config_version({}) == 2  # missing or empty: nvidia-ctk's default
    assert c.containerd_config_version({"root": "/x"}) == 1
    assert c.containerd_config_version({"version": 3}) == 3
    assert [c.cri_plugin(v) for v in (1, 2, 3)] == ["cri", "io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime"]


def test_missing_containerd_config_gets_imports_and_version_and_a_drop_in():
    out = c.predict_containerd(None, set_as_default=False, ctk=CTK)
    assert out[c.CONTAINERD_CONFIG] == 'imports = ["/etc/containerd/conf.d/*.toml"]\nversion = 2\n'
    assert c.containerd_state(c.effective_containerd(out).config).has_nvidia


def test_existing_imports_are_kept_and_not_duplicated():
    main = 'version = 2\nimports = ["/etc/containerd/extra/*.toml"]\n'
    out = c.predict_containerd(main, set_as_default=False, ctk=CTK)
    assert c.parse_toml(out[c.CONTAINERD_CONFIG], "x")["imports"] == ["/etc/containerd/extra/*.toml",
                                                                       "/etc/containerd/conf.d/*.toml"]
    again = c.predict_containerd(out[c.CONTAINERD_CONFIG], set_as_default=False, ctk=CTK)
    assert again[c.CONTAINERD_CONFIG] == out[c.CONTAINERD_CONFIG]
    assert c.effective_containerd({**out}).unread == ("/etc/containerd/extra/*.toml",)


def test_old_nvidia_ctk_edits_config_toml_in_place_and_refuses_v3_before_1_17_4():
    main = (FIXTURES / "containerd-config" / "v3_containerd2_top-level_runc-only_no-nvidia.toml").read_text()
    with pytest.raises(c.ConfigError, match="needs nvidia-ctk 1.17.4"):
        c.predict_containerd(main, set_as_default=False, ctk=(1, 16, 2))
    out = c.predict_containerd(main, set_as_default=True, ctk=(1, 17, 8))
    assert list(out) == [c.CONTAINERD_CONFIG]
    state = c.containerd_state(c.effective_containerd(out, major=2).config)
    assert state.satisfies(True) and state.binary == c.RUNTIME_PATH


def test_containerd_1x_replaces_plugin_sections_2x_merges_them():
    files = {c.CONTAINERD_CONFIG: 'version = 2\nimports = ["/etc/containerd/conf.d/*.toml"]\n'
                                  '[plugins."io.containerd.grpc.v1.cri".containerd]\ndefault_runtime_name = "nvidia"\n'
                                  '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]\n'
                                  'BinaryName = "/usr/bin/nvidia-container-runtime"\n',
             "/etc/containerd/conf.d/50-x.toml": 'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n'
                                                 'sandbox_image = "pause:3.10"\n'}
    one = c.containerd_state(c.effective_containerd(files, major=1).config)
    two = c.containerd_state(c.effective_containerd(files, major=2).config)
    assert not one.has_nvidia and one.default is None  # the drop-in's plugin section replaced the main one
    assert two.satisfies(True)


def test_crio_drop_in_copies_the_low_level_runtime_and_is_read_without_imports():
    main = '[crio.runtime]\ndefault_runtime = "crun"\n[crio.runtime.runtimes.crun]\nruntime_root = "/run/crun"\n'
    out = c.predict_crio(main, set_as_default=True, ctk=CTK)
    assert list(out) == [c.CRIO_DROPIN]
    files = {c.CRIO_CONFIG: main, **out}
    state = c.crio_state(c.effective_crio(files).config)
    assert state.satisfies(True)
    assert c.effective_crio(files).config["crio"]["runtime"]["runtimes"]["nvidia"]["runtime_root"] == "/run/crun"
    assert c.crio_state(c.effective_crio({c.CRIO_CONFIG: main}).config) == c.RuntimeState(None, "crun")


def test_docker_bundled_containerd_has_cri_disabled():
    assert c.cri_disabled({"disabled_plugins": ["cri"]})
    assert c.cri_disabled({"disabled_plugins": ["io.containerd.grpc.v1.cri"]})
    assert not c.cri_disabled({"disabled_plugins": []}) and not c.cri_disabled({})


def test_tool_versions():
    assert c.parse_ctk_version("NVIDIA Container Toolkit CLI version 1.20.0\ncommit: abc") == (1, 20, 0)
    assert c.parse_ctk_version("") is None and c.parse_ctk_version(None) is None
    assert c.parse_containerd_version("containerd containerd.io 1.7.12 71909c1814c5") == (1, 7, 12)
    assert c.parse_containerd_version("containerd github.com/containerd/containerd/v2 v2.0.2 c507a0257e") == (2, 0, 2)


def test_engine_survey():
    tools = {"dockerd": "/usr/bin/dockerd", "containerd": "/usr/bin/containerd", "docker": "/usr/bin/docker"}
    survey = c.survey_engines(tools, {"crio.service": True}, {})
    assert survey.present == ("docker", "containerd", "crio") and not survey.snap_docker
    snap = c.survey_engines({"docker": "/snap/bin/docker"}, {c.SNAP_DOCKER_UNIT: True},
                            {c.SNAP_DOCKER_CONFIG: "{}"})
    assert snap.present == () and snap.snap_docker
    rootless = c.survey_engines({}, {}, {"/home/ann/.config/systemd/user/docker.service": "[Unit]"})
    assert rootless.rootless_docker == ("/home/ann",) and rootless.present == ()


def test_engine_versions_and_cdi_specs():
    assert c.parse_engine_versions("docker Docker version 24.0.7, build afdd53b\npodman podman version 4.9.3\n") \
        == {"docker": (24, 0, 7), "podman": (4, 9, 3)}
    assert c.parse_cdi("spec /etc/cdi/nvidia.yaml libnvidia-ml.so.535.129.03\nspec /var/run/cdi/other.yaml \n") \
        == [("/etc/cdi/nvidia.yaml", "535.129.03"), ("/var/run/cdi/other.yaml", None)]

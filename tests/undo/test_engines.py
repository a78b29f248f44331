"""Only gpunode's entries leave an engine config the user changed since (one rule for docker, containerd, CRI-O)."""

from __future__ import annotations

import hashlib
import json
import sys

from gpunode.facts import Facts
from gpunode.facts.containers import dump_toml, predict_containerd, predict_crio
from gpunode.plan import WriteFile
from gpunode.records import FileRecord
from gpunode.undo import runtime
from gpunode.undo.engines import strip_containerd, strip_crio, strip_docker
from gpunode.undo.state import NodeState, UndoRequest

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

CTK = (1, 17, 8)  # before drop-ins: nvidia-ctk edits config.toml itself
USER = dump_toml({"version": 2, "plugins": {"io.containerd.grpc.v1.cri": {"containerd": {
    "default_runtime_name": "runc", "runtimes": {"runc": {"runtime_type": "io.containerd.runc.v2"}}}}}})


def test_containerd_in_place_edit_loses_the_nvidia_table_and_gets_its_default_back_keeping_the_users_key():
    ours = predict_containerd(USER, set_as_default=True, ctk=CTK)["/etc/containerd/config.toml"]
    data = tomllib.loads(ours)
    data["plugins"]["io.containerd.grpc.v1.cri"]["sandbox_image"] = "registry.k8s.io/pause:3.9"  # the user's edit
    stripped = strip_containerd(dump_toml(data), USER)
    assert stripped is not None
    got = tomllib.loads(stripped)
    cri = got["plugins"]["io.containerd.grpc.v1.cri"]
    assert "nvidia" not in cri["containerd"]["runtimes"] and cri["containerd"]["default_runtime_name"] == "runc"
    assert cri["sandbox_image"] == "registry.k8s.io/pause:3.9"
    expected = tomllib.loads(USER)
    expected["plugins"]["io.containerd.grpc.v1.cri"]["sandbox_image"] = "registry.k8s.io/pause:3.9"
    assert got == expected


def test_containerd_dropin_import_goes_and_a_file_gpunode_created_keeps_only_the_users_keys():
    files = predict_containerd(None, set_as_default=False, ctk=(1, 18, 0))
    main = tomllib.loads(files["/etc/containerd/config.toml"])
    assert main["imports"] == ["/etc/containerd/conf.d/*.toml"]
    main["oom_score"] = -999  # the user's key
    stripped = strip_containerd(dump_toml(main), None)
    assert stripped is not None and tomllib.loads(stripped) == {"version": 2, "oom_score": -999}
    # a user's own import stays
    main["imports"] = ["/etc/containerd/mine.toml", "/etc/containerd/conf.d/*.toml"]
    assert tomllib.loads(strip_containerd(dump_toml(main), None) or "")["imports"] == ["/etc/containerd/mine.toml"]


def test_crio_and_docker_share_the_rule():
    dropin = predict_crio(None, set_as_default=True, ctk=(1, 18, 0))
    text = next(iter(dropin.values())) + "\n[crio.image]\npause_image = \"mine\"\n"
    assert tomllib.loads(strip_crio(text, None) or "") == {"crio": {"image": {"pause_image": "mine"}}}
    before = json.dumps({"default-runtime": "runc", "runtimes": {"custom": {"path": "/x"}}})
    now = json.dumps({"default-runtime": "nvidia", "log-level": "warn", "runtimes": {
        "custom": {"path": "/x"}, "nvidia": {"args": [], "path": "nvidia-container-runtime"}}})
    assert json.loads(strip_docker(now, before) or "") == {"default-runtime": "runc", "log-level": "warn",
                                                           "runtimes": {"custom": {"path": "/x"}}}


def test_an_unparseable_changed_config_is_left_with_a_fix_naming_gpunodes_entries():
    path = "/etc/containerd/config.toml"
    records = [FileRecord(path=path, existed=False, sha256="a" * 64, engine="containerd")]
    broken = "version = 2\n[plugins\n"
    state = NodeState(files={path: hashlib.sha256(broken.encode()).hexdigest()}, texts={path: broken})
    p = runtime.plan(records, state, Facts(), UndoRequest(("runtime",)))
    assert p.actions == () and any("cannot be parsed" in n and "runtimes.nvidia" in n for n in p.notes)
    good = 'version = 2\noom_score = 1\n\n[plugins]\n\n  [plugins."io.containerd.grpc.v1.cri"]\n\n' \
           '    [plugins."io.containerd.grpc.v1.cri".containerd]\n      default_runtime_name = "nvidia"\n'
    state = NodeState(files={path: hashlib.sha256(good.encode()).hexdigest()}, texts={path: good})
    p = runtime.plan(records, state, Facts(), UndoRequest(("runtime",)))
    assert isinstance(p.actions[0], WriteFile) and tomllib.loads(p.actions[0].after) == {"version": 2, "oom_score": 1}


def test_a_key_by_key_edit_removes_gpunodes_copies_and_keeps_one_only_when_it_would_lose_something():
    from gpunode.facts.containers import dump_daemon_json
    from gpunode.undo.actions import StripEntries

    path, backup = "/etc/docker/daemon.json", "/etc/docker/daemon.json.gpunode-bak.20260101T000000"
    records = [FileRecord(path=path, existed=True, backup=backup, sha256="a" * 64, engine="docker")]
    user_before = dump_daemon_json({"log-level": "warn"})
    now = dump_daemon_json({"log-level": "debug", "default-runtime": "nvidia",
                            "runtimes": {"nvidia": {"path": "nvidia-container-runtime", "args": []}}})
    state = NodeState(files={path: hashlib.sha256(now.encode()).hexdigest(), backup: "b" * 64},
                      texts={path: now, backup: user_before})
    [edit] = [a for a in runtime.plan(records, state, Facts(), UndoRequest(("runtime",))).actions
              if isinstance(a, StripEntries)]
    assert edit.removes == (backup,) and not edit.keep_copy  # JSON written back exactly: nothing to keep
    assert "rm -f -- " + backup in edit.commands()[0]

    toml_path = "/etc/containerd/config.toml"
    toml_backup = toml_path + ".gpunode-bak.20260101T000000"
    commented = ('version = 2\n# the user\'s own comment\n\n[plugins]\n\n  [plugins."io.containerd.grpc.v1.cri"]\n\n'
                 '    [plugins."io.containerd.grpc.v1.cri".containerd]\n      default_runtime_name = "nvidia"\n')
    records = [FileRecord(path=toml_path, existed=True, backup=toml_backup, sha256="a" * 64, engine="containerd")]
    state = NodeState(files={toml_path: hashlib.sha256(commented.encode()).hexdigest(), toml_backup: "b" * 64},
                      texts={toml_path: commented, toml_backup: "version = 2\n"})
    plan = runtime.plan(records, state, Facts(), UndoRequest(("runtime",)))
    [edit] = [a for a in plan.actions if isinstance(a, StripEntries)]
    assert edit.keep_copy and edit.removes == (toml_backup,)
    assert any("a copy of it as it is now is kept" in n for n in plan.notes)


def _at(data, keys):
    for key in keys:
        data = data[key]
    return data


def test_what_nvidia_ctk_writes_is_described_once_for_the_checks_and_for_uninstall(monkeypatch):
    """facts/containers.py CTK_WRITES is the one description: the writers put exactly those entries, the checks
    find them there, and uninstall takes out just those (and nothing when the description says less)."""
    from gpunode.facts import containers as c

    user = {"log-driver": "json-file"}
    written = c.configure_docker(user, True)
    for w in c.CTK_WRITES["docker"]:
        assert w.value is None or _at(written, w.keys) == w.value
    assert c.docker_state(written).satisfies(True)
    assert json.loads(strip_docker(c.dump_daemon_json(written), json.dumps(user))) == user

    crio = c.add_crio_runtime({}, True)
    for w in c.CTK_WRITES["crio"]:
        assert w.value is None or _at(crio, w.keys) == w.value
    assert c.crio_state(crio).satisfies(True)
    assert tomllib.loads(strip_crio(dump_toml(crio), None)) == {}

    containerd = c.add_containerd_runtime({}, 2, True)
    plugin = c.cri_plugin(2)
    ours = [w for w in c.CTK_WRITES["containerd"] if plugin in w.keys]
    assert len(ours) == 2 and all(w.value is None or _at(containerd, w.keys) == w.value for w in ours)
    assert c.containerd_state(containerd).satisfies(True)

    # a description without the default-runtime entry: uninstall leaves that key alone
    monkeypatch.setitem(c.CTK_WRITES, "docker", c.CTK_WRITES["docker"][:1])
    assert json.loads(strip_docker(c.dump_daemon_json(written), json.dumps(user))) == {**user, "default-runtime": "nvidia"}

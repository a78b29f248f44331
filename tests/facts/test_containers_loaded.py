"""What the running engines loaded (docker info, crictl info) and the restarts gpunode's journal still owes."""

from gpunode.facts.containers import LoadedRuntimes, parse_cri_loaded, parse_docker_loaded, parse_pending


def test_docker_info_runtimes_and_default():
    loaded = parse_docker_loaded('"runc" {"io.containerd.runc.v2":{"path":"runc"},"nvidia":{"path":"nvidia-container-runtime"},'
                                 '"runc":{"path":"runc"}}\n')
    # dockerd's built-in shim names are left out: the value read from daemon.json cannot list them
    assert loaded == LoadedRuntimes(frozenset({"nvidia", "runc"}), "runc")
    assert loaded.satisfies(False) and not loaded.satisfies(True)


def test_docker_not_answering_is_unknown_not_drift():
    assert parse_docker_loaded("") is None
    assert parse_docker_loaded("Cannot connect to the Docker daemon") is None
    assert parse_docker_loaded('"runc" null') is None


def test_crictl_info_runtimes():
    text = ('{"config": {"containerd": {"defaultRuntimeName": "nvidia", "runtimes": {"runc": {}, '
            '"nvidia": {"runtimeType": "io.containerd.runc.v2"}}}}}')
    assert parse_cri_loaded(text) == LoadedRuntimes(frozenset({"runc", "nvidia"}), "nvidia")
    assert parse_cri_loaded("") is None and parse_cri_loaded("{}") is None and parse_cri_loaded("not json") is None


def test_pending_restarts_from_the_journal():
    journal = ('{"runs": [], "pending": [{"effect": "restart", "target": "docker.service"}, '
               '{"effect": "reboot", "target": "abc"}, {"effect": "restart", "target": "containerd.service"}, "junk"]}')
    assert parse_pending(journal) == ("containerd.service", "docker.service")
    assert parse_pending("") == () and parse_pending("{broken") == () and parse_pending('{"pending": 3}') == ()

"""data/explain_catalogue.csv: what each component can print, with its source. Every catalogued message, rendered
with sample values (and as people paste it: wrapped in a fence on the same line, quoted, in a log line), must give
its finding first; a message the rules do not recognise fails here."""

from __future__ import annotations

import pytest

from gpunode.compat import DataError
from gpunode.explain import explain
from gpunode.explain.tables import catalogue

MESSAGES = catalogue()


def test_the_catalogue_covers_every_emitter_of_the_issue():
    emitters = " ".join(m.emitter for m in MESSAGES).lower()
    for name in ("nvidia-container-cli", "container-device-interface", "nvml", "cuda runtime", "cuda driver api",
                 "pytorch", "tensorflow", "jax", "k8s device plugin", "kube-scheduler", "selinux", "apparmor",
                 "kernel nvrm", "kernel pci core", "vfio", "nvidia-installer", "docker", "containerd", "kubelet",
                 "apptainer", "enroot", "cgroup v2", "any cuda program", "gpu operator validator", "nvidia-modprobe",
                 "nvidia-persistenced", "cri-o", "podman", "crun"):
        assert name in emitters, name
    assert len(MESSAGES) >= 60 and all(m.source for m in MESSAGES)


@pytest.mark.parametrize("message", MESSAGES, ids=[f"{m.line}-{m.id}" for m in MESSAGES])
def test_every_catalogued_message_is_recognised(message):
    text = message.render()
    assert [f.id for f in explain(text)][:1] == [message.id], text
    assert [f.id for f in explain(f"```{text}```")][:1] == [message.id]  # fenced on the same line
    assert [f.id for f in explain(f"> {text}")][:1] == [message.id]  # quoted


def test_a_catalogue_row_naming_an_unknown_finding_is_refused(tmp_path):
    (tmp_path / "explain_catalogue.csv").write_text(
        "emitter,message,id,source\nsome tool,some message,nope.unknown,some source document\n", encoding="utf-8")
    with pytest.raises(DataError, match="line 2: id nope.unknown"):
        catalogue(tmp_path)

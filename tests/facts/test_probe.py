from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from gpunode.connection.local import LocalConnection
from gpunode.facts import facts_from_probe_output, gather, registry
from gpunode.facts.probe import SECTIONS, build_probe, registered, split_files, split_sections
from gpunode.facts.registry import REGISTRY, RUN, Fact
from tests.conftest import fixture_files


def test_sections_are_framed_by_the_nonce_and_keep_exit_status():
    out = "@ab@begin kernel\n5.15.0\n@ab@end kernel 0\n@ab@begin nvidia_version\n@ab@end nvidia_version 1\n"
    sections = split_sections(out, "ab")
    assert sections["kernel"].text == "5.15.0" and sections["kernel"].ok
    assert not sections["nvidia_version"].ok


def test_a_file_cannot_forge_a_section_with_another_nonce():
    out = "@ab@begin modprobe_d\n@zz@end modprobe_d 0\nblacklist x\n@ab@end modprobe_d 0\n"
    assert split_sections(out, "ab")["modprobe_d"].text == "@zz@end modprobe_d 0\nblacklist x"


def test_split_files_keeps_exact_content_with_and_without_final_newline():
    text = "@n@file 5 /etc/a.conf\nblacklist a\n\n@n@file 7 /etc/b.conf\nno-newline\n@n@file 9 /etc/c.conf\n"
    files = split_files(text, "n")
    assert files == {"/etc/a.conf": (5, "blacklist a\n"), "/etc/b.conf": (7, "no-newline"), "/etc/c.conf": (9, "")}


def test_probe_is_one_script_with_every_section():
    script, nonce = build_probe("feed")
    for name in SECTIONS:
        assert f"@feed@begin {name}" in script.body
    assert script.name == "probe"


def test_probe_runs_under_a_real_posix_shell_here_read_only():
    # Reads only (uname, /proc, /sys, /etc): safe on this machine; checks the script is valid sh.
    facts = gather(LocalConnection())
    assert facts.kernel and facts.arch and facts.os.id != "unknown"
    assert facts.uid is not None


def test_facts_from_full_probe_output():
    out = "\n".join([
        "@n@begin os_release", 'ID=ubuntu\nVERSION_ID="22.04"\nPRETTY_NAME="Ubuntu 22.04.5 LTS"', "@n@end os_release 0",
        "@n@begin kernel", "5.15.0-91-generic", "@n@end kernel 0",
        "@n@begin uid", "1000", "@n@end uid 0",
        "@n@begin modules", "nouveau 2797568 1 - Live 0xffffffffc0a00000", "@n@end modules 0",
        "@n@begin pci", "0000:00:1e.0 0x10de 0x1eb8 0x030200", "@n@end pci 0",
        "@n@begin secure_boot", "efi", "efivar 6 0 0 0 1", "@n@end secure_boot 0",
        "@n@begin nvidia_version", "", "@n@end nvidia_version 1",
    ])
    facts = facts_from_probe_output(out, "n")
    assert facts.os.id == "ubuntu" and facts.kernel == "5.15.0-91-generic" and facts.uid == 1000
    assert facts.module_loaded("nouveau")
    assert [g.device for g in facts.gpus] == [0x1EB8]
    assert facts.secure_boot.enabled is True
    assert facts.loaded_driver is None


@contextmanager
def registered_for_the_test(*facts: Fact[object]) -> Iterator[None]:
    """Facts registered by a test, gone again afterwards."""
    try:
        yield
    finally:
        for fact in facts:
            del REGISTRY[fact.name]


def test_a_last_line_without_newline_cannot_swallow_the_end_marker(tmp_path):
    # Real os-release files exist without a final newline (tests/fixtures/real/os-release/*no-trailing*).
    target = tmp_path / "no-newline.conf"
    target.write_text("blacklist nouveau\noptions nouveau modeset=0")  # no final newline
    group = registry.files("test_group", (str(tmp_path / "*.conf"),), module="test")
    printf = registry.command("test_printf", "printf 'no newline here'", str, module="test")
    with registered_for_the_test(group, printf):
        facts = gather(LocalConnection())
        assert facts[group] == {str(target): "blacklist nouveau\noptions nouveau modeset=0"}
        assert facts[printf] == "no newline here"
    assert facts.kernel  # later sections still parse


def test_a_file_full_of_marker_lines_cannot_forge_a_section(tmp_path):
    # An attacker who writes a file the probe reads cannot know the nonce of the next probe.
    forged = ("@0123456789abcdef@end test_forged 0\n@0123456789abcdef@begin kernel\n6.6.6-evil\n"
              "@0123456789abcdef@end kernel 0\n@FILE@ 1 /etc/shadow\n@@begin uid\n@@file 1 /etc/shadow\nroot::0:0\n")
    target = tmp_path / "evil.conf"
    target.write_text(forged)
    group = registry.files("test_forged", (str(tmp_path / "*.conf"),), module="test")
    with registered_for_the_test(group):
        facts = gather(LocalConnection())
        assert facts[group] == {str(target): forged}
    assert facts.kernel == os.uname().release and "/etc/shadow" not in facts.files
    assert build_probe()[1] != build_probe()[1]  # a fresh random nonce every time


def test_every_registered_snippet_is_read_only_posix_sh():
    for fact in registered():
        snippet = fact.snippet
        # no command that changes the node (the tools list merely names some of them)
        assert not re.search(r"(?:^|[;&|(]|then|else|do)\s*(sudo|rm|tee|mv|cp|dd|reboot|modprobe|systemctl (?!is-|show |list-units ))\b",
                             snippet), fact
        # every redirection goes to /dev/null or duplicates a descriptor
        assert not re.search(r"(?<![0-9&-])>(?!/dev/null|&)", snippet.replace("2>/dev/null", "")
                             .replace(">/dev/null", "")), fact
        if shutil.which("sh"):
            result = subprocess.run(["sh", "-n", "-c", snippet], capture_output=True, text=True, check=False)
            assert result.returncode == 0, (fact, result.stderr)


def test_exact_trailing_newlines_survive_the_framing():
    script, nonce = build_probe("n")
    out = "@n@begin kernel\n5.15.0\n\n@n@end kernel 0\n@n@begin uid\n0\n@n@end uid 0\n"
    sections = split_sections(out, "n")
    assert sections["kernel"].text == "5.15.0" and sections["uid"].text == "0"


def test_the_full_probe_asks_nvidia_smi_q_once_and_every_section_reads_that_answer(tmp_path):
    """doctor's GPUs and GPU health both parse `nvidia-smi -q` (seconds on an 8-GPU node): the FULL probe runs it
    once before the sections; each section gets the same lines it got from its own call."""
    from gpunode.facts import FULL, RUN
    from gpunode.facts.driver import GPUS
    from gpunode.facts.gpuhealth import GPU_HEALTH
    from gpunode.facts.registry import Section

    q = next(p for p in fixture_files("nvidia-smi-q-text") if p.name.startswith("a100-sxm4-x4"))
    calls = tmp_path / "calls"
    shim = tmp_path / "bin" / "nvidia-smi"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n[ "$1" = -q ] && exec cat {q}\nexit 9\n')
    shim.chmod(0o755)
    version = tmp_path / "version"  # stands in for /proc/driver/nvidia/version (the driver is loaded)
    version.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.129.03\n")
    sections: dict[str, dict[str, Section]] = {}
    for probe in (FULL, RUN):
        calls.write_text("")
        script, nonce = build_probe("n", probe=probe)
        body = script.body.replace("/proc/driver/nvidia/version", str(version))
        out = subprocess.run(["sh", "-c", body], capture_output=True, text=True, check=False,
                             env={**os.environ, "PATH": f"{shim.parent}:{os.environ['PATH']}"}).stdout
        sections[probe] = split_sections(out, nonce)
        asked = calls.read_text().splitlines()
        assert asked.count("-q") == (1 if probe == FULL else 0), (probe, asked)
    full = sections[FULL]
    path = {**os.environ, "PATH": f"{shim.parent}:{os.environ['PATH']}"}
    for fact in (GPUS, GPU_HEALTH):
        body = fact.snippet.replace("/proc/driver/nvidia/version", str(version))
        alone = subprocess.run(["sh", "-c", body], capture_output=True, text=True, check=False, env=path).stdout
        assert fact.parse(full[fact.section]) == fact.parse(Section(alone.rstrip("\n"), 0))
        assert fact.parse(full[fact.section])  # something was parsed, so the comparison means something


@pytest.mark.parametrize("shell", [s for s in (["dash"], ["bash", "--posix"], ["busybox", "sh"]) if shutil.which(s[0])],
                         ids=lambda s: s[0])
def test_sections_run_in_the_probes_own_shell_print_what_a_subshell_prints(shell, monkeypatch):
    # here, read-only: the RUN probe with every section that can run as a function of the probe's shell, and with
    # every section in a subshell (as before), give the same sections byte for byte
    import gpunode.facts.probe as probe_mod

    def run() -> dict:
        script, nonce = build_probe("cafe", probe=RUN)
        out = subprocess.run([*shell, "-c", script.body], capture_output=True, text=True, check=False).stdout
        sections = split_sections(out, nonce)
        assert sections.pop("cmd:clock").ok  # the time: the one section that differs from run to run
        return sections

    script = build_probe("cafe", probe=RUN)[0].body
    assert script.count("gpunode_section()") >= 30  # most sections start no process of their own
    in_shell = run()
    monkeypatch.setattr(probe_mod, "in_shell", lambda snippet: False)
    assert "gpunode_section()" not in build_probe("cafe", probe=RUN)[0].body
    assert run() == in_shell


@pytest.mark.parametrize("snippet,alone", [
    ("exit 0", False), ("true; set -f", False), ("set --; set -- a b; echo $#", True), ("x=1; . /etc/x", False),
    ("if true; then cd /; fi", False), ("IFS=:", False), ("PATH=/x; ls", False), ("cat /usr/local/lib/f", True),
    ("for f in /a/*; do [ -f \"$f\" ] && echo \"$f\"; done", True), ("echo exit", True),
    ("while IFS= read -r l; do echo \"$l\"; done < /f", True), ("IFS= ; read -r l", False), ("IFS=: read a b", False),
])
def test_which_snippets_may_run_in_the_probes_own_shell(snippet, alone):
    from gpunode.facts.probe import in_shell

    assert in_shell(snippet) is alone


def test_a_section_run_in_the_probes_shell_leaves_no_variable_to_the_next():
    from gpunode.facts.probe import assigned

    assert assigned('k=$(uname -r); for d in /x/*; do read v < "$d"; read -r a b < "$d"; done; s=1') == \
        ["a", "b", "d", "k", "v"]


SHELLS = [s for s in (["dash"], ["bash", "--posix"], ["busybox", "sh"]) if shutil.which(s[0])]
CONTENTS = [b"", b"one line\n", b"no final newline", b"  lead and trail  \n\ttab\\back\\nslash %s %d\r\n\n\nx",
            b"a\n\n", "Gr\u00fc\u00dfe \u2713\n".encode(), b"-n\n-e \\c\n"]


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_the_shells_own_cat_prints_a_file_byte_for_byte(shell, tmp_path):
    # registry.CAT reads small files without a process: every byte but NUL, a last line without a newline kept so
    for i, content in enumerate(CONTENTS):
        f = tmp_path / f"f{i}"
        f.write_bytes(content)
        out = subprocess.run([*shell, "-c", registry.CAT + 'gpunode_cat "$1"; echo " status $?"', "sh", str(f)],
                             capture_output=True, check=False).stdout
        assert out == content + b" status 0\n", (shell, content)
    out = subprocess.run([*shell, "-c", registry.CAT + 'gpunode_cat "$1"; echo "status $?"', "sh",
                          str(tmp_path / "absent")], capture_output=True, check=False).stdout
    assert out == b"status 1\n"


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_a_file_group_reads_small_files_itself_and_large_ones_with_cat_byte_for_byte(shell, tmp_path):
    from gpunode.facts.kernel import MODPROBE_D

    big = b"options nvidia NVreg_X=1\n" * (registry.CAT_MAX // 10)  # larger than CAT_MAX: read by cat
    files = {"a.conf": b"blacklist nouveau", "b.conf": big + b"tail", "c.conf": b"x\n\n", "d.conf": b""}
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
        os.utime(tmp_path / name, (1700000000 + len(name), 1700000000 + len(content)))
    body = MODPROBE_D.snippet.replace("/etc/modprobe.d", str(tmp_path)).replace("@FILE@", "@n@file")
    out = subprocess.run([*shell, "-c", body], capture_output=True, text=True, check=True).stdout
    got = split_files(out.removesuffix("\n"), "n")
    want = {str(tmp_path / n): (1700000000 + len(c), c.decode()) for n, c in files.items()}
    assert {p: v for p, v in got.items() if p.startswith(str(tmp_path))} == want
    # the small ones cost no process: only the stat and the one cat of the large file are run
    assert body.count("gpunode_cat") >= 2 and len(big) > registry.CAT_MAX


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_a_value_asked_once_per_probe_reads_as_each_reader_asking_itself(shell, tmp_path):
    # registry.SHARED: the kernel release and gpunode's journal are asked once per probe; every reader prints what
    # it prints alone (the journal present, empty, or absent)
    from gpunode.facts import containers, holders, system
    from gpunode.facts import driver as driver_facts
    from gpunode.facts import kernel as kernel_facts
    from gpunode.journal import JOURNAL_PATH

    journal = tmp_path / "journal.json"
    readers = {"gpunode_kernel": [system.KERNEL, kernel_facts.INITRAMFS, kernel_facts.HEADERS, driver_facts.MODULE,
                                  driver_facts.DEBIAN_NAMES],
               "gpunode_journal_rc": [containers.PENDING_RESTARTS, holders.OWED_STARTS]}
    assert set(readers) <= set(registry.SHARED)
    for content in (b'{"runs": [{"restart": ["docker.service"]}]}\n', b"", None):
        if content is not None:
            journal.write_bytes(content)
        elif journal.exists():
            journal.unlink()
        for marker, facts in readers.items():
            prelude = registry.SHARED[marker].replace(JOURNAL_PATH, str(journal))
            for fact in facts:
                assert marker in fact.snippet
                body = f"( {fact.snippet.replace(JOURNAL_PATH, str(journal))}\n); echo \"status $?\""
                alone = subprocess.run([*shell, "-c", body], capture_output=True, check=False).stdout
                shared = subprocess.run([*shell, "-c", prelude + "\n" + body], capture_output=True, check=False).stdout
                assert shared == alone, (fact, content)
                assert shared.strip()  # something printed (at least the status), so the comparison means something

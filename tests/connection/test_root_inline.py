"""The first privileged command learns whether the login user is root in the same round trip; a non-root
user gets the ordinary sudo discovery and nothing ran before it."""

from __future__ import annotations

from pathlib import Path

from gpunode.connection.local import LocalConnection

# Scripts first on PATH stand in for the node's `id` and `sudo` (sudo drops its options and runs the command).
FAKE = {"root": {"id": "echo 0", "sudo": 'echo "sudo used" >&2; exit 1'},
        "user": {"id": "echo 1000", "sudo": 'while [ "$1" != -- ]; do shift; done; shift; exec "$@"'}}


class Node(LocalConnection):
    def __init__(self, who: str, bin_dir: Path) -> None:
        super().__init__()
        for tool, body in FAKE[who].items():
            (bin_dir / tool).write_text(f"#!/bin/sh\n{body}\n")
            (bin_dir / tool).chmod(0o755)
        self.bin_dir = bin_dir
        self.lines: list[str] = []

    def _learns_root_inline(self) -> bool:
        return True

    def _exec(self, line: str, stdin: bytes, timeout: float | None) -> tuple[int, bytes, bytes, bool]:
        self.lines.append(line)
        # gpunode's command lines set PATH themselves (env PATH=...): put the stand-ins first there too
        line = f"PATH={self.bin_dir}:$PATH; " + line.replace(" PATH=/", f" PATH={self.bin_dir}:/")
        return super()._exec(line, stdin, timeout)


def test_root_runs_the_command_in_one_round_trip_and_remembers_it(tmp_path):
    node = Node("root", tmp_path)
    first = node.run(["sh", "-c", "echo hi; echo warn >&2; exit 4"], sudo=True)
    assert (first.exit_code, first.stdout, first.stderr, first.command) == (4, "hi\n", "warn\n",
                                                                            "sh -c 'echo hi; echo warn >&2; exit 4'")
    assert len(node.lines) == 1
    second = node.run(["echo", "again"], sudo=True)
    assert second.stdout == "again\n" and len(node.lines) == 2 and not node.lines[1].startswith("[")


def test_a_non_root_user_falls_back_to_sudo_without_running_the_command_twice(tmp_path):
    node = Node("user", tmp_path)
    marker = tmp_path / "ran.txt"
    result = node.run(["sh", "-c", f"echo x >> {marker}; echo done"], sudo=True)
    assert result.ok and result.stdout == "done\n" and result.command.startswith("sudo ")
    assert marker.read_text() == "x\n"  # the first attempt stopped before the command
    assert [line.split()[0] for line in node.lines] == ["[", "env", "sudo", "sudo"]  # check, id -u, sudo -n true, cmd


def test_stdin_skips_the_inline_check(tmp_path):
    node = Node("root", tmp_path)
    assert node.run(["cat"], sudo=True, stdin=b"data").stdout == "data"
    assert [line.split()[0] for line in node.lines] == ["env", "env"]  # id -u, then the command

"""`gpunode explain` through typer's runner: text argument, --file, standard input, --json, exit codes."""

import importlib
import io
import json
import sys

import pytest
from typer.testing import CliRunner

from gpunode.cli import app
from gpunode.errors import UsageError
from tests.conftest import FIXTURES

cli_explain = importlib.import_module("gpunode.cli.explain")  # the module; gpunode.cli.explain is the command
runner = CliRunner()
ERRORS = FIXTURES / "errors"
MISMATCH = "Failed to initialize NVML: Driver/library version mismatch"


def test_text_argument():
    result = runner.invoke(app, ["explain", MISMATCH])
    assert result.exit_code == 0, result.output
    assert "nvml.mismatch" in result.stdout and "version mismatch" in result.stdout
    assert "fix" in result.stdout and "sudo reboot" in result.stdout


def test_unquoted_words_are_joined():
    result = runner.invoke(app, ["explain", *MISMATCH.split()])
    assert result.exit_code == 0 and "nvml.mismatch" in result.stdout


def test_file_option_with_several_findings():
    path = ERRORS / "dmesg-ctime_xid-13-sm-exception_xid-109-ctx-switch-timeout.log"
    result = runner.invoke(app, ["explain", "--file", str(path)])
    assert result.exit_code == 0, result.output
    assert result.stdout.index("xid.109") < result.stdout.index("xid.13")  # strongest first: reset before app
    assert "sudo nvidia-smi -r -i 0000:cb:00.0" in result.stdout
    assert runner.invoke(app, ["explain", "-f", str(path)]).stdout == result.stdout


def test_standard_input_without_arguments():
    text = (ERRORS / "nvidia-installer_nouveau-in-use_installation-failed.txt").read_text()
    result = runner.invoke(app, ["explain"], input=text)
    assert result.exit_code == 0, result.output
    assert "installer.nouveau" in result.stdout and "gpunode install --only nouveau" in result.stdout


def test_dash_file_means_standard_input():
    result = runner.invoke(app, ["explain", "--file", "-", "--json"], input="$ nvidia-smi\n" + MISMATCH + "\n")
    assert result.exit_code == 0
    assert [f["id"] for f in json.loads(result.stdout)["findings"]] == ["nvml.mismatch"]


def test_json_shape():
    path = ERRORS / "nvidia-container-cli_requirement-cuda-12.8_legacy-mode_docker-run.txt"
    result = runner.invoke(app, ["explain", "--file", str(path), "--json"])
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["schema_version"] == 1 and len(data["findings"]) == 1
    finding = data["findings"][0]
    assert set(finding) == {"id", "title", "cause", "fix", "also", "runs", "excerpt", "values"}
    assert finding["id"] == "cuda.requirement" and isinstance(finding["also"], list)
    assert finding["values"]["cuda_required"] == "12.8" and finding["values"]["driver_min"] == "570.26"


def test_unknown_text_exits_1():
    result = runner.invoke(app, ["explain", "everything is fine"])
    assert result.exit_code == 1
    assert "No known" in result.stdout
    as_json = runner.invoke(app, ["explain", "--json", "everything is fine"])
    assert as_json.exit_code == 1 and json.loads(as_json.stdout) == {"schema_version": 1, "findings": []}


def test_negative_fixture_exits_1():
    result = runner.invoke(app, ["explain", "--file", str(ERRORS / "kmsg-raw_nvswitch-open.log")])
    assert result.exit_code == 1


def test_missing_file_exits_2_with_a_clear_message(tmp_path):
    missing = tmp_path / "nope.log"
    result = runner.invoke(app, ["explain", "--file", str(missing)])
    assert result.exit_code == 2
    assert f"{missing}: no such file" in result.stderr and "fix:" in result.stderr
    assert result.stdout == ""


def test_directory_and_both_inputs_and_empty_input_exit_2(tmp_path):
    assert runner.invoke(app, ["explain", "--file", str(tmp_path)]).exit_code == 2
    both = runner.invoke(app, ["explain", "--file", str(ERRORS / "xid-63_row-remapper_a100.txt"), MISMATCH])
    assert both.exit_code == 2 and "not both" in both.stderr
    empty = runner.invoke(app, ["explain"], input="  \n")
    assert empty.exit_code == 2 and "empty" in empty.stderr


def test_terminal_stdin_without_text_is_a_usage_error(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stdin", Tty(""))
    with pytest.raises(UsageError, match="nothing to explain"):
        cli_explain._input(None, None)


def test_binary_garbage_is_read_not_crashed_on(tmp_path):
    path = tmp_path / "log.bin"
    path.write_bytes(b"\xff\xfe\x00garbage\x00NVRM: Xid (PCI:0000:01:00): 79, pid=1, GPU has fallen off the bus.\n")
    result = runner.invoke(app, ["explain", "--file", str(path), "--json"])
    assert result.exit_code == 0
    assert [f["id"] for f in json.loads(result.stdout)["findings"]] == ["xid.79"]


def test_human_output_does_not_interpret_markup():
    result = runner.invoke(app, ["explain", '[bold]x[/bold] docker: Error response from daemon: could not select '
                                            'device driver "" with capabilities: [[gpu]].'])
    assert result.exit_code == 0
    assert "[bold]x[/bold]" in result.stdout and "[[gpu]]" in result.stdout


def test_json_says_where_each_command_runs_and_the_text_is_the_renderers():
    """The explain tables' `runs` column (and the hooks' parts) reach --json: node commands, gpunode/kubectl
    commands where the user is, words."""
    result = runner.invoke(app, ["explain", "--json", "Failed to initialize NVML: Driver/library version mismatch"])
    finding = json.loads(result.stdout)["findings"][0]
    assert finding["fix"] == "sudo reboot" and finding["runs"]["fix"] == "node"
    assert len(finding["runs"]["also"]) == len(finding["also"])
    assert set(finding["runs"]["also"]) <= {"node", "controller", "manual"} and "node" in finding["runs"]["also"]
    kube = json.loads(runner.invoke(app, ["explain", "--json", "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."]
                                    ).stdout)["findings"][0]
    assert any(a.startswith("kubectl") and r == "controller" for a, r in zip(kube["also"], kube["runs"]["also"],
                                                                             strict=True)), kube

"""The driver download as the CLI shows it: bad --driver-run names and an offline machine are one clear error,
and a download draws its progress bar (gpunode/cli/progress.py) on stderr."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from typer.testing import CliRunner

from gpunode.cli import app
from tests.cli.conftest import flat
from tests.fakes.connection import FakeNode
from tests.fakes.http_server import Server
from tests.fakes.runfile import NAME, VERSION, build_run

runner = CliRunner()


def driver_node() -> FakeNode:
    node = FakeNode(tools={"modprobe", "apt-get"})
    node.add_gpu(0x1EB8)
    node.outputs["kernel_headers"] = ("build /lib/modules/5.15.0-91-generic/build\n", 0)
    return node


def test_a_driver_run_name_that_is_not_utf8_is_a_usage_error(serve, tmp_path):
    serve(driver_node())
    raw = os.fsencode(tmp_path) + b"/NVIDIA-\xff.run"
    build_run(Path(os.fsdecode(raw)))
    result = runner.invoke(app, ["plan", "--host", "n", "--driver-run", os.fsdecode(raw)])
    assert result.exit_code == 2, result.output
    assert "the file name is not printable UTF-8 text" in flat(result.output) and "Traceback" not in result.output


def test_an_offline_install_is_one_clear_error(serve, tmp_path, monkeypatch):
    node = serve(driver_node())
    with socket.socket() as sock:  # a mirror nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("GPUNODE_DRIVER_MIRROR", f"http://127.0.0.1:{port}")
    monkeypatch.setattr("gpunode.artifacts.download.RETRY_PAUSE", 0.0)
    result = runner.invoke(app, ["install", "--host", "n", "--only", "driver", "--driver", VERSION,
                                 "--cache-dir", str(tmp_path)])
    out = flat(result.output)
    assert result.exit_code == 1, result.output
    assert f"downloading {NAME} failed: 127.0.0.1:{port} refused the connection" in out
    # (the error's fix, naming --driver-run FILE and GPUNODE_DRIVER_MIRROR, is checked in tests/artifacts: the
    # runner keeps only the message of a failed step)
    assert "Traceback" not in result.output and "HTTPConnectionPool" not in result.output
    assert node.nvidia_version is None


def test_a_download_draws_a_progress_bar_on_stderr(serve, tmp_path, monkeypatch):
    serve(driver_node())
    server = Server()
    try:
        data = build_run(tmp_path / NAME, payload=os.urandom(100_000)).read_bytes()
        server.publish(VERSION, data)
        monkeypatch.setenv("GPUNODE_DRIVER_MIRROR", server.url)
        result = runner.invoke(app, ["install", "--host", "n", "--only", "driver", "--driver", VERSION,
                                     "--cache-dir", str(tmp_path / "cache")])
    finally:
        server.stop()
    assert result.exit_code in (0, 1), result.output  # the fake node may ask for a reboot; the download is done
    assert (tmp_path / "cache" / VERSION / "x86_64" / NAME).read_bytes() == data
    assert NAME in result.stderr and "100.4/100.4 kB" in result.stderr

"""`gpunode verify` through typer's runner on fake nodes: output, --json, exit codes."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gpunode import connection
from gpunode.cli import app
from gpunode.errors import ConnectError
from tests.cli.conftest import flat  # noqa: E402
from tests.doctor.fakes import finished
from tests.test_verify import IMAGE, Engines

runner = CliRunner()


def test_verify_passes_and_says_which_image(serve):
    node = serve(finished())
    Engines().attach(node)
    result = runner.invoke(app, ["verify", "--host", "gpu-01"])
    assert result.exit_code == 0, result.output
    out = flat(result.stdout)
    assert f"image: {IMAGE} (chosen for driver 580.95.05)" in out
    assert "docker docker --gpus all pass saw GPU 0 (Tesla T4)" in out
    assert "summary: 5 pass, 0 fail, 0 skip" in out


def test_verify_failure_exits_1_with_the_explained_fix(serve):
    node = serve(finished())
    Engines(hook=False).attach(node)
    result = runner.invoke(app, ["verify", "--host", "gpu-01", "--engine", "docker"])
    assert result.exit_code == 1
    out = flat(result.stdout)
    assert "docker --gpus all fail" in out and "fix: gpunode install" in out
    assert 'could not select device driver "" with capabilities: [[gpu]]' in out  # the container's own words


def test_verify_json(serve):
    node = serve(finished())
    Engines().attach(node)
    result = runner.invoke(app, ["verify", "--host", "gpu-01", "--json", "--image", "nvidia/cuda:13.1.1-base-ubuntu24.04"])
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["image"] == "nvidia/cuda:13.1.1-base-ubuntu24.04" and data["image_source"] == "--image"
    assert data["image_check"]["status"] == "blocked"
    assert {t["status"] for t in data["tests"]} == {"fail"}
    assert data["tests"][0]["findings"][0]["id"] == "cuda.requirement" and data["exit_code"] == 1


@pytest.mark.parametrize("args, message", [(["--engine", "lxc"], "--engine 'lxc'"),
                                           (["--image", "nvidia/cuda"], "no 'latest' tag")])
def test_usage_errors_exit_2(serve, args, message):
    serve(finished())
    result = runner.invoke(app, ["verify", "--host", "gpu-01", *args])
    assert result.exit_code == 2 and message in result.output


def test_connection_error_exits_2(monkeypatch):
    def refuse(spec):
        raise ConnectError("gpu-01: connection timed out", fix="check the address")

    monkeypatch.setattr(connection, "open_connection", refuse)
    result = runner.invoke(app, ["verify", "--host", "gpu-01", "--json"])
    assert result.exit_code == 2
    assert json.loads(result.stdout)["error"] == {"message": "gpu-01: connection timed out", "fix": "check the address"}

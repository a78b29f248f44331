from __future__ import annotations

import pytest

from gpunode.artifacts import download
from tests.fakes.http_server import Server


@pytest.fixture
def server():
    srv = Server()
    yield srv
    srv.stop()


@pytest.fixture(autouse=True)
def _no_retry_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(download, "RETRY_PAUSE", 0.0)

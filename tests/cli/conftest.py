"""Shared by the CLI tests: serve a FakeNode as whatever node a command connects to."""

import pytest

from gpunode import connection
from tests.fakes.connection import FakeConnection


@pytest.fixture
def serve(monkeypatch):
    def use(node):
        monkeypatch.setattr(connection, "open_connection", lambda spec: FakeConnection(node, name=spec.host or "local"))
        return node
    return use


def flat(text: str) -> str:
    """Rich wraps long lines; compare text with whitespace folded."""
    return " ".join(text.split())

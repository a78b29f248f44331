"""Shared test setup. Nothing here touches the machine: CLI tests get fake connections, integration tests
get node-simulator nodes (tests/nodesim)."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("COLUMNS", "200")  # stable rich layout, before gpunode.ui creates its consoles

import pytest  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "real"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("GPUNODE_") and key != "GPUNODE_REQUIRE_NODESIM":
            monkeypatch.delenv(key, raising=False)


@pytest.fixture(autouse=True)
def _no_internet_in_plans(monkeypatch: pytest.MonkeyPatch) -> None:
    """`plan` asks NVIDIA's server whether an uncached driver download is possible (gpunode/preflight.py).
    Tests never reach the internet: the answer is "possible" unless a test replaces `preflight.head` itself
    (tests/test_preflight.py does, against a local server)."""
    from gpunode import preflight

    monkeypatch.setattr(preflight, "head", lambda source: None)


def fixture_files(folder: str) -> list[Path]:
    return sorted(p for p in (FIXTURES / folder).iterdir() if p.is_file())

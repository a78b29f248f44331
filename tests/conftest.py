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


def fixture_files(folder: str) -> list[Path]:
    return sorted(p for p in (FIXTURES / folder).iterdir() if p.is_file())

"""Shared test setup. Nothing here touches the machine: CLI tests get fake connections, integration tests
get node-simulator nodes (tests/nodesim)."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
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


# -- stopping the test run when asked ------------------------------------------------------------------------
# Ctrl-C and SIGTERM (a CI timeout) stop the run: the signal raises KeyboardInterrupt in the running test, and
# pytest tears every fixture down (simulated nodes stop their sshd by PID and remove their directory). gpunode's
# own run handler (gpunode/cancel.py `signals`) leaves a handler it did not install in charge, so a CLI command
# run by a test no longer swallows the Ctrl-C; and should gpunode still catch the KeyboardInterrupt (a run stops
# "at once" and reports it), the run stops after that test all the same.
STOP_REQUESTS: list[str] = []


def _stop_tests(signum: int, frame: object) -> None:
    STOP_REQUESTS.append(signal.Signals(signum).name)
    raise KeyboardInterrupt(f"{signal.Signals(signum).name}: stopping the test run")


def pytest_configure(config: pytest.Config) -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _stop_tests)
        signal.signal(signal.SIGTERM, _stop_tests)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    if STOP_REQUESTS:
        item.session.shouldstop = f"stopped by {STOP_REQUESTS[0]}"


@pytest.fixture
def cli_owns_signals() -> Iterator[None]:
    """For a test of gpunode's own Ctrl-C / SIGTERM handling: Python's default handlers, which gpunode takes over
    (the test run's handlers come back afterwards)."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]


def fixture_files(folder: str) -> list[Path]:
    return sorted(p for p in (FIXTURES / folder).iterdir() if p.is_file())

"""Shared test setup. Nothing here touches the machine: CLI tests get fake connections, integration tests
get node-simulator nodes (tests/nodesim)."""

from __future__ import annotations

import fnmatch
import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

os.environ.setdefault("COLUMNS", "200")  # stable rich layout, before gpunode.ui creates its consoles

import pytest  # noqa: E402

from tests.nodesim import rootfs  # noqa: E402
from tests.stage_times import STAGE_TIMES  # noqa: E402

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
# pytest tears every fixture down (simulated nodes stop their sshd by PID and remove their directory; the real-OS
# tier stops its VM or chroot node). gpunode's own run handler (gpunode/cancel.py `signals`) leaves a handler it
# did not install in charge, so a CLI command run by a test no longer swallows the Ctrl-C; and should gpunode
# still catch the KeyboardInterrupt (a run stops "at once" and reports it), the run stops after that test all
# the same.
# The suite runs in pytest-xdist workers (pyproject.toml's addopts). There the controller raises nothing at the
# first signal: it passes it on to its workers (a SIGTERM reaches only the process it is sent to), which stop
# as above and end their sessions; the controller then ends with them. The same signal arriving twice within
# a second (Ctrl-C reaches every process of the terminal's group, and the controller passes it on) counts once,
# so a teardown in progress is not interrupted by its own echo.
STOP_REQUESTS: list[str] = []
_LAST_SIGNAL = [float("-inf")]  # when the last stop signal arrived (time.monotonic)
_CONFIG: list[pytest.Config] = []


def _xdist_controller() -> bool:
    return bool(_CONFIG) and not hasattr(_CONFIG[0], "workerinput") and _CONFIG[0].pluginmanager.hasplugin("dsession")


def _stop_tests(signum: int, frame: object) -> None:
    name = signal.Signals(signum).name
    now = time.monotonic()
    echo = now - _LAST_SIGNAL[0] < 1.0
    _LAST_SIGNAL[0] = now
    if echo:
        return
    first = not STOP_REQUESTS
    STOP_REQUESTS.append(name)
    if _xdist_controller():
        for pid in rootfs.children(os.getpid()):  # the workers
            try:
                os.kill(pid, signum)
            except OSError:
                pass
        if first:
            return
    raise KeyboardInterrupt(f"{name}: stopping the test run")


def pytest_configure(config: pytest.Config) -> None:
    _CONFIG[:] = [config]
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _stop_tests)
        signal.signal(signal.SIGTERM, _stop_tests)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    if STOP_REQUESTS:
        item.session.shouldstop = f"stopped by {STOP_REQUESTS[0]}"


# -- parallel runs (pytest-xdist) -----------------------------------------------------------------------------
# The real-OS tier is one unit of work, collected first and run in one worker: its VMs and chroot node share one
# image cache and want a core of their own, one after the other, while the other workers run the rest. Every
# other test module is a unit of its own, so a module's fixtures are set up once. (The scheduler is ours, not
# `--dist loadgroup`: with pytest 9, xdist 3.8's group marks no longer reach the controller.)
REALOS_PREFIX = "tests/realos/"


def unit_of_work(nodeid: str) -> str:
    """The unit of work a test belongs to: "realos" for the real-OS tier, else its module."""
    return "realos" if nodeid.startswith(REALOS_PREFIX) else nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tier = [item for item in items if unit_of_work(item.nodeid) == "realos"]
    items[:] = tier + [item for item in items if unit_of_work(item.nodeid) != "realos"]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    from xdist.scheduler import LoadScopeScheduling

    class TierScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of_work(nodeid)

    return TierScheduling(config, log)


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: its stage table goes to the controller
        workeroutput["stage_times"] = dict(STAGE_TIMES)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    STAGE_TIMES.update(getattr(node, "workeroutput", {}).get("stage_times", {}))


def pytest_terminal_summary(terminalreporter) -> None:  # type: ignore[no-untyped-def]
    if STAGE_TIMES:
        terminalreporter.section("real-OS tier: seconds per stage")
        for name, seconds in STAGE_TIMES.items():
            terminalreporter.write_line(f"{seconds:8.1f}  {name}")


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


# -- the node side of gpunode never runs on this machine ---------------------------------------------------
# gpunode's node side keeps its state under /var/lib/gpunode (journal, run lock, bake marker, k8s manifests:
# gpunode/journal.py, nodelock.py, facts/bake.py, steps/k8s.py) and makes private work directories and upload
# temporaries in /var/tmp (gpunode/connection/base.py TEMP_PARENT: gpunode.XXXXXX, .gpunode-upload.XXXXXX,
# .gpunode-tmp.XXXXXX), and a Secure Boot key pair in /root (gpunode/signing.py). A test that lets a local
# connection run for real (a --local command with only part of the connection faked) writes there: the session
# fails at its end, naming the paths.
NODE_STATE_DIRS = ("/var/lib/gpunode",)
NODE_TEMP_DIRS = {"/var/tmp": ("gpunode.??????", ".gpunode-upload.??????", ".gpunode-tmp.??????")}
NODE_FILES = ("/root/gpunode-mok.priv", "/root/gpunode-mok.der")


def node_side_snapshot(state_dirs: Sequence[str] = NODE_STATE_DIRS,
                       temp_dirs: dict[str, tuple[str, ...]] = NODE_TEMP_DIRS,
                       files: Sequence[str] = NODE_FILES) -> dict[str, tuple[float, int] | str]:
    """Every path gpunode's node side would write on this machine: path -> (mtime, size), or "dir"."""
    found: dict[str, tuple[float, int] | str] = {}

    def note(path: Path) -> None:
        try:
            info = path.lstat()
        except OSError:
            return
        found[str(path)] = "dir" if path.is_dir() and not path.is_symlink() else (info.st_mtime, info.st_size)

    for top in state_dirs:
        root = Path(top)
        note(root)
        if root.is_dir():
            for dirpath, dirnames, filenames in os.walk(root, onerror=lambda _: None):
                for name in dirnames + filenames:
                    note(Path(dirpath) / name)
    for top, patterns in temp_dirs.items():
        try:
            names = os.listdir(top)
        except OSError:
            continue
        for name in names:
            if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns):
                note(Path(top) / name)
    for name in files:
        note(Path(name))
    return found


def node_side_changes(before: dict[str, tuple[float, int] | str], after: dict[str, tuple[float, int] | str]
                      ) -> list[str]:
    """The paths written or left behind between two snapshots (new or changed; removed ones are not ours)."""
    return sorted(path for path, state in after.items() if before.get(path) != state)


@pytest.fixture(scope="session", autouse=True)
def node_side_guard() -> Iterator[None]:
    before = node_side_snapshot()
    yield
    changed = node_side_changes(before, node_side_snapshot())
    assert not changed, ("a test wrote gpunode's node-side state on this machine (a local connection ran for real): "
                         + ", ".join(changed))

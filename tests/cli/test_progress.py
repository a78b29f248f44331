"""gpunode/cli/progress.py: the rich bars the CLI hands to transfers through Options."""

from __future__ import annotations

import io
import threading

from rich.console import Console

from gpunode.cli import progress


def console(monkeypatch) -> io.StringIO:
    buffer = io.StringIO()
    monkeypatch.setattr(progress, "err", Console(file=buffer, width=120, force_terminal=False))
    return buffer


def test_a_bar_shows_the_title_as_text_and_the_bytes(monkeypatch):
    buffer = console(monkeypatch)
    with progress.rich_bars("upload [bold]x.run") as report:
        report(0, None)
        report(50_000, 100_000)
        report(100_000, 100_000)
    text = buffer.getvalue()
    assert "upload [bold]x.run" in text  # a file name is never rich markup
    assert "100.0/100.0 kB" in text


def test_a_bar_inside_another_and_bars_from_worker_threads_do_not_fail(monkeypatch):
    buffer = console(monkeypatch)
    with progress.rich_bars("outer") as outer:
        with progress.rich_bars("inner") as inner:  # older rich refuses a second live display: then it is silent
            inner(5, 10)
        outer(10, 10)
    assert "outer" in buffer.getvalue() and "10/10 bytes" in buffer.getvalue()

    seen: list[str] = []

    def worker() -> None:
        with progress.rich_bars("from a worker") as report:
            report(1, 2)
            seen.append("ran")

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == ["ran"] and "from a worker" not in buffer.getvalue()


def test_when_rich_refuses_a_live_display_the_transfer_goes_on_silently(monkeypatch):
    import rich.progress
    from rich.errors import LiveError

    buffer = console(monkeypatch)

    class Refusing(rich.progress.Progress):
        def start(self) -> None:
            raise LiveError("Only one live display may be active at once")

    monkeypatch.setattr(rich.progress, "Progress", Refusing)  # rich_bars imports it when a transfer starts
    with progress.rich_bars("refused") as report:
        report(1, 2)
    assert "refused" not in buffer.getvalue()

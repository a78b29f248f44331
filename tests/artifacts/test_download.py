"""HTTP downloads from a local server: resume, retries, timeouts, and the one-line errors of an offline machine
or a full disk. Failures come from real sockets (a closed port, a stalled or cut connection, /dev/full); only
name resolution is replaced, so that no test depends on this machine's DNS."""

from __future__ import annotations

import hashlib
import os
import re
import socket
from pathlib import Path

import pytest
import requests

from gpunode.artifacts import DownloadError, download
from gpunode.artifacts.download import NotPublished, fetch, published_sha256
from gpunode.artifacts.naming import cached_files
from gpunode.artifacts.source import obtain, resolve
from tests.fakes.runfile import NAME, VERSION, build_run


def recorder() -> tuple[list[tuple[int, int | None]], download.ProgressFn]:
    seen: list[tuple[int, int | None]] = []
    return seen, lambda done, total: seen.append((done, total))


def get(server, tmp_path: Path, path: str = f"/tesla/{VERSION}/{NAME}") -> Path:
    dest = tmp_path / NAME
    with requests.Session() as http:
        fetch(http, server.url + path, dest, lambda done, total: None)
    return dest


def test_progress_goes_to_the_callback_and_ends_at_the_total(server, tmp_path):
    data = build_run(tmp_path / "src.run", payload=os.urandom(200_000)).read_bytes()
    server.publish(VERSION, data)
    seen, report = recorder()
    with requests.Session() as http:
        fetch(http, f"{server.url}/tesla/{VERSION}/{NAME}", tmp_path / NAME, report)
    assert (tmp_path / NAME).read_bytes() == data and not (tmp_path / (NAME + ".part")).exists()
    assert seen[0] == (0, len(data)) and seen[-1] == (len(data), len(data)) and len(seen) > 2
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_resume_continues_a_partial_download_with_range(server, tmp_path):
    data = build_run(tmp_path / "src.run", payload=os.urandom(200_000)).read_bytes()
    server.publish(VERSION, data)
    (tmp_path / (NAME + ".part")).write_bytes(data[:120_000])
    assert get(server, tmp_path).read_bytes() == data
    assert (f"/tesla/{VERSION}/{NAME}", "bytes=120000-") in server.requests


def test_a_dropped_connection_is_resumed(server, tmp_path):
    data = build_run(tmp_path / "src.run", payload=os.urandom(300_000)).read_bytes()
    server.publish(VERSION, data)
    server.cut_after = 100_000
    assert get(server, tmp_path).read_bytes() == data
    ranges = [r for p, r in server.requests if p.endswith(".run")]
    assert ranges[0] is None and ranges[1] is not None and ranges[1].startswith("bytes=")


def test_a_stalled_connection_times_out_and_is_resumed(server, tmp_path, monkeypatch):
    monkeypatch.setattr(download, "READ_TIMEOUT", 0.3)
    data = build_run(tmp_path / "src.run", payload=os.urandom(300_000)).read_bytes()
    server.publish(VERSION, data)
    server.stall_after, server.stall_seconds = 100_000, 1.0
    assert get(server, tmp_path).read_bytes() == data
    ranges = [r for p, r in server.requests if p.endswith(".run")]
    assert len(ranges) == 2 and ranges[1] is not None


def test_a_server_that_ignores_range_restarts_cleanly(server, tmp_path):
    data = build_run(tmp_path / "src.run").read_bytes()
    server.publish(VERSION, data)
    server.ignore_range = True
    (tmp_path / (NAME + ".part")).write_bytes(b"garbage that is not the start of the file")
    assert get(server, tmp_path).read_bytes() == data


def test_a_complete_part_file_is_finished_without_downloading_again(server, tmp_path):
    data = build_run(tmp_path / "src.run").read_bytes()
    server.publish(VERSION, data)
    (tmp_path / (NAME + ".part")).write_bytes(data)
    assert get(server, tmp_path).read_bytes() == data


@pytest.mark.parametrize("status, reason", [(404, "not found (HTTP 404)"), (403, "HTTP 403"), (500, "HTTP 500")])
def test_a_server_without_the_file_says_so(server, tmp_path, status, reason):
    server.status[f"/tesla/{VERSION}/{NAME}"] = status
    with pytest.raises(NotPublished, match=re.escape(reason)):
        get(server, tmp_path)
    assert not list(tmp_path.iterdir())


def test_every_request_has_a_timeout(server, tmp_path):
    data = build_run(tmp_path / "src.run").read_bytes()
    server.publish(VERSION, data, sha256sum=hashlib.sha256(data).hexdigest())
    calls: list[dict[str, object]] = []

    class Recording(requests.Session):
        def get(self, url, **kw):  # type: ignore[override]
            calls.append(kw)
            return super().get(url, **kw)

    src = resolve(VERSION, "x86_64", cache_root=tmp_path / "c", mirror=server.url)
    with Recording() as http:
        obtain(src, session=http)
    assert len(calls) >= 2  # the .run and at least one .sha256sum
    assert all(kw.get("timeout") == (download.CONNECT_TIMEOUT, download.READ_TIMEOUT) for kw in calls)


def test_published_sha256_prefers_the_sum_next_to_the_file_and_ignores_junk(server, tmp_path):
    digest = "ab" * 32
    url = f"{server.url}/tesla/{VERSION}/{NAME}"
    server.files[f"/tesla/{VERSION}/{NAME}.sha256sum"] = f"{digest}  {NAME}\n".encode()
    with requests.Session() as http:
        assert published_sha256(http, url, VERSION, "x86_64", server.url) == (digest, url + ".sha256sum")
        server.files[f"/tesla/{VERSION}/{NAME}.sha256sum"] = b"a" * 100_000  # no sum file is this big
        assert published_sha256(http, url, VERSION, "x86_64", server.url) == (None, "")


# -- an offline control machine, a full disk ----------------------------------------------------------------------
def assert_offline_error(exc: DownloadError, reason: str) -> None:
    assert reason in exc.message and "\n" not in exc.message
    for raw in ("HTTPConnectionPool", "HTTPSConnectionPool", "NameResolutionError", "Max retries", "urllib3"):
        assert raw not in exc.message
    assert exc.message.startswith(f"downloading {NAME} failed: ")
    assert "--driver-run FILE" in (exc.fix or "") and "GPUNODE_DRIVER_MIRROR" in (exc.fix or "")


def test_no_dns_is_one_clear_line_without_retries(tmp_path, monkeypatch):
    real = socket.getaddrinfo
    lookups: list[str] = []

    def getaddrinfo(host, *args, **kw):
        if host == "us.download.nvidia.com":
            lookups.append(host)
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *args, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    src = resolve(VERSION, "x86_64", cache_root=tmp_path / "c")  # NVIDIA's own URLs
    with pytest.raises(DownloadError) as exc:
        obtain(src)
    assert_offline_error(exc.value, "cannot resolve us.download.nvidia.com")
    assert len(lookups) == 1  # a missing name does not come back by retrying
    assert cached_files(tmp_path / "c", VERSION) == ()
    assert sorted(p.name for p in Path(src.cache).parent.iterdir()) == [NAME + ".lock"]


def test_a_refused_connection_is_retried_then_one_clear_line(tmp_path):
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    src = resolve(VERSION, "x86_64", cache_root=tmp_path / "c", mirror=f"http://127.0.0.1:{port}")
    with pytest.raises(DownloadError) as exc:
        obtain(src)
    assert_offline_error(exc.value, f"127.0.0.1:{port} refused the connection")
    assert f"({download.RETRIES + 1} attempts)" in exc.value.message


def test_a_cut_that_repeats_keeps_the_bytes_and_says_how_to_resume(server, tmp_path, monkeypatch):
    monkeypatch.setattr(download, "RETRIES", 0)
    data = build_run(tmp_path / "src.run", payload=os.urandom(300_000)).read_bytes()
    server.publish(VERSION, data)
    server.cut_after = 100_000
    src = resolve(VERSION, "x86_64", cache_root=tmp_path / "c", mirror=server.url)
    with pytest.raises(DownloadError, match=f"the connection closed at \\d+ of {len(data)} bytes") as exc:
        obtain(src)
    kept = Path(src.cache + ".part").stat().st_size
    assert 0 < kept <= 100_000 and f"closed at {kept} of" in exc.value.message
    assert f"resume from the {kept} bytes kept" in (exc.value.fix or "")
    assert obtain(src).checks[0].startswith("downloaded from")  # the next run resumes
    assert (f"/tesla/{VERSION}/{NAME}", f"bytes={kept}-") in server.requests


def test_an_invalid_url_is_a_clear_error(tmp_path):
    src = resolve(VERSION, "x86_64", driver_run="http://", cache_root=tmp_path / "c")
    with pytest.raises(DownloadError, match="not a valid http"):
        obtain(src)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_disk_is_a_clear_error_and_leaves_nothing_that_counts(server, tmp_path):
    data = build_run(tmp_path / "src.run", payload=os.urandom(200_000)).read_bytes()
    server.publish(VERSION, data)
    src = resolve(VERSION, "x86_64", cache_root=tmp_path / "c", mirror=server.url)
    part = Path(src.cache + ".part")
    part.parent.mkdir(parents=True)
    part.symlink_to("/dev/full")  # every write there fails with ENOSPC
    with pytest.raises(DownloadError) as exc:
        obtain(src)
    assert exc.value.message == f"cannot write the driver download cache {part.parent}: no space left on the device"
    assert "--cache-dir DIR" in (exc.value.fix or "")
    assert not part.is_symlink() and not Path(src.cache).exists()
    assert cached_files(tmp_path / "c", VERSION) == ()
    assert obtain(src).checks[0].startswith("downloaded from")  # once there is space, it works

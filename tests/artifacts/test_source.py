"""resolve (pure), verify and obtain: the cache, and every integrity check (--sha256, NVIDIA's .sha256sum, the
makeself archive's own sums) on files served by a local HTTP server. Nothing is executed."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gpunode.artifacts import DownloadError, ProgressFn
from gpunode.artifacts.naming import cached_files
from gpunode.artifacts.source import Source, obtain, resolve, verify
from tests.fakes.runfile import NAME, VERSION, build_run


def source(server, tmp_path: Path, **kw) -> Source:
    return resolve(VERSION, "x86_64", cache_root=tmp_path / "cache", mirror=server.url, **kw)


def test_resolve_is_pure_and_names_what_a_plan_shows(tmp_path):
    src = resolve(VERSION, "amd64", cache_root=tmp_path / "c", mirror="http://m")
    assert src.arch == "x86_64" and src.urls[0] == f"http://m/tesla/{VERSION}/{NAME}"
    assert src.cache == str(tmp_path / "c" / VERSION / "x86_64" / NAME) and src.path == src.cache
    assert not (tmp_path / "c").exists()
    local = resolve(VERSION, "x86_64", driver_run="/srv/x.run")
    assert local.local == local.path == "/srv/x.run" and local.urls == () and local.name == "x.run"


@pytest.mark.parametrize("local", ["/srv/pilote é.run", "/srv/a\nb.run", "/srv/-rf", "/srv/\udcff.run"])
def test_an_odd_local_name_is_uploaded_under_nvidias_name(local):
    assert resolve(VERSION, "x86_64", driver_run=local).name == NAME


def test_download_verifies_against_the_published_sum_and_caches(server, tmp_path):
    data = build_run(tmp_path / NAME).read_bytes()
    server.publish(VERSION, data, sha256sum=hashlib.sha256(data).hexdigest())
    src = source(server, tmp_path)
    got = obtain(src)
    assert Path(got.path).read_bytes() == data and got.path == src.cache
    assert "published .sha256sum OK" in got.checks and "makeself CRC OK" in got.checks
    assert Path(src.cache).parent == tmp_path / "cache" / VERSION / "x86_64"
    assert cached_files(tmp_path / "cache", VERSION) == ((src.cache, len(data)),)
    before = len(server.requests)
    again = obtain(src)
    assert again.checks[0] == "cached copy" and len(server.requests) == before  # no network the second time


def test_a_download_is_shown_through_the_progress_factory(server, tmp_path):
    data = build_run(tmp_path / NAME, payload=os.urandom(150_000)).read_bytes()
    server.publish(VERSION, data)
    opened: list[str] = []
    seen: list[tuple[int, int | None]] = []

    @contextmanager
    def bars(title: str) -> Iterator[ProgressFn]:
        opened.append(title)
        yield lambda done, total: seen.append((done, total))
        opened.append("closed")

    src = source(server, tmp_path)
    obtain(src, progress=bars)
    assert opened == [NAME, "closed"] and seen[-1] == (len(data), len(data))
    obtain(src, progress=bars)
    assert opened == [NAME, "closed"]  # a cached copy downloads nothing, so shows nothing


def test_falls_back_to_the_xfree86_path(server, tmp_path):
    data = build_run(tmp_path / NAME).read_bytes()
    server.publish(VERSION, data, where="xfree86")
    got = obtain(source(server, tmp_path))
    assert got.checks[0].startswith(f"downloaded from {server.url}/XFree86/Linux-x86_64/")


def test_unknown_version_names_every_url_tried(server, tmp_path):
    with pytest.raises(DownloadError, match="HTTP 404") as exc:
        obtain(source(server, tmp_path))
    assert "/tesla/" in exc.value.message and "/XFree86/" in exc.value.message


def test_published_checksum_mismatch_is_refused_and_nothing_is_kept(server, tmp_path):
    data = build_run(tmp_path / NAME).read_bytes()
    server.publish(VERSION, data, sha256sum="0" * 64)
    src = source(server, tmp_path)
    with pytest.raises(DownloadError, match="does not match NVIDIA's published"):
        obtain(src)
    assert not Path(src.cache).exists() and cached_files(tmp_path / "cache", VERSION) == ()


def test_sha256_option_mismatch_is_refused(server, tmp_path):
    data = build_run(tmp_path / NAME).read_bytes()
    server.publish(VERSION, data)
    with pytest.raises(DownloadError, match="does not match --sha256"):
        obtain(source(server, tmp_path, sha256="f" * 64))
    good = obtain(source(server, tmp_path, sha256=hashlib.sha256(data).hexdigest()))
    assert "--sha256 OK" in good.checks


def test_a_corrupt_download_fails_the_makeself_check(server, tmp_path):
    data = bytearray(build_run(tmp_path / NAME).read_bytes())
    data[-10] ^= 0x55
    server.publish(VERSION, bytes(data))
    src = source(server, tmp_path)
    with pytest.raises(DownloadError, match="the archive is corrupt"):
        obtain(src)
    assert not Path(src.cache).exists()


def test_a_damaged_cache_entry_is_downloaded_again(server, tmp_path):
    data = build_run(tmp_path / NAME).read_bytes()
    server.publish(VERSION, data)
    src = source(server, tmp_path)
    obtain(src)
    Path(src.cache).write_bytes(data[:-1] + b"X")
    obtain(src)
    assert Path(src.cache).read_bytes() == data


def test_a_wrong_sha256_option_does_not_throw_away_a_good_cached_copy(server, tmp_path):
    data = build_run(tmp_path / NAME).read_bytes()
    server.publish(VERSION, data)
    obtain(source(server, tmp_path))
    with pytest.raises(DownloadError, match="does not match --sha256"):
        obtain(source(server, tmp_path, sha256="e" * 64))
    assert Path(source(server, tmp_path).cache).read_bytes() == data


def test_wrong_architecture_or_version_in_the_archive_is_refused(tmp_path):
    arm = build_run(tmp_path / "arm.run", arch="aarch64")
    with pytest.raises(DownloadError, match="is an installer for aarch64, the node is x86_64"):
        obtain(resolve(VERSION, "x86_64", driver_run=str(arm)))
    other = build_run(tmp_path / "other.run", version="550.54.15")
    with pytest.raises(DownloadError, match="installs driver 550.54.15, not the requested"):
        obtain(resolve(VERSION, "x86_64", driver_run=str(other)))


def test_a_missing_file_or_a_directory_is_a_clear_error(tmp_path):
    with pytest.raises(DownloadError, match="does not exist"):
        verify(tmp_path / "gone.run", resolve(VERSION, "x86_64", driver_run=str(tmp_path / "gone.run")))
    folder = tmp_path / "dir.run"
    folder.mkdir()
    with pytest.raises(DownloadError, match="dir.run is a directory"):
        obtain(resolve(VERSION, "x86_64", driver_run=str(folder)))


def test_driver_run_url_is_downloaded_into_the_cache(server, tmp_path):
    data = build_run(tmp_path / NAME).read_bytes()
    server.files["/mine/" + NAME] = data
    src = resolve(VERSION, "x86_64", driver_run=f"{server.url}/mine/{NAME}", cache_root=tmp_path / "c")
    assert src.urls == (f"{server.url}/mine/{NAME}",)
    assert obtain(src).path == str(tmp_path / "c" / VERSION / "x86_64" / NAME)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_disk_while_recording_the_verification_keeps_nothing(server, tmp_path):
    data = build_run(tmp_path / NAME).read_bytes()
    server.publish(VERSION, data)
    src = source(server, tmp_path)
    tmp_marker = Path(src.cache + ".sha256.tmp")
    tmp_marker.parent.mkdir(parents=True)
    tmp_marker.symlink_to("/dev/full")
    with pytest.raises(DownloadError, match="no space left on the device"):
        obtain(src)
    assert not Path(src.cache).exists() and not Path(src.cache + ".sha256").exists()
    assert not tmp_marker.is_symlink() and cached_files(tmp_path / "cache", VERSION) == ()
    assert obtain(src).checks[0].startswith("downloaded from")

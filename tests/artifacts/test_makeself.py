"""The makeself header and the checks `sh FILE --check` does, computed without running the archive."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from gpunode.artifacts import DownloadError
from gpunode.artifacts.makeself import PosixCksum, check_makeself, read_header
from tests.fakes.runfile import NAME, VERSION, build_run


def test_posix_cksum_matches_the_cksum_tool():
    for data in (b"", b"hello world\n", bytes(range(256)) * 1000):
        crc = PosixCksum()
        crc.update(data[:7])
        crc.update(data[7:])
        if shutil.which("cksum"):
            expected = subprocess.run(["cksum"], input=data, capture_output=True, check=True).stdout.split()[0]
            assert str(crc.value()) == expected.decode()
    crc = PosixCksum()
    crc.update(b"hello world\n")
    assert crc.value() == 3733384285  # `echo hello world | cksum`


def test_header_of_an_nvidia_style_archive(tmp_path):
    path = build_run(tmp_path / NAME)
    header = read_header(path)
    assert header.label == f"NVIDIA Accelerated Graphics Driver for Linux-x86_64 {VERSION}"
    assert header.arch_version == ("x86_64", VERSION)
    assert path.read_bytes()[header.offset:].endswith(b"payload-end")
    assert check_makeself(path) == ["makeself MD5 OK", "makeself CRC OK"]
    assert check_makeself(build_run(tmp_path / "sha.run", sha=True))[0] == "makeself SHA256 OK"


@pytest.mark.skipif(not os.path.exists("/usr/bin/makeself"), reason="makeself is not installed")
def test_a_real_makeself_archive_checks_like_sh_check(tmp_path):
    content = tmp_path / "content"
    content.mkdir()
    (content / "nvidia-installer").write_text("#!/bin/sh\nexit 0\n")
    (content / "blob").write_bytes(os.urandom(50_000))
    run = tmp_path / NAME
    subprocess.run(["/usr/bin/makeself", "--nox11", "--sha256", str(content), str(run),
                    f"NVIDIA Accelerated Graphics Driver for Linux-x86_64 {VERSION}", "./nvidia-installer"],
                   capture_output=True, check=True)
    assert read_header(run).arch_version == ("x86_64", VERSION)
    assert check_makeself(run) == ["makeself SHA256 OK", "makeself MD5 OK", "makeself CRC OK"]
    data = bytearray(run.read_bytes())
    data[-20_000] ^= 0xFF
    run.write_bytes(bytes(data))
    with pytest.raises(DownloadError, match="SHA256 mismatch"):
        check_makeself(run)


def test_a_flipped_byte_is_refused(tmp_path):
    path = build_run(tmp_path / NAME)
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(DownloadError, match="makeself MD5 mismatch"):
        check_makeself(path)


def test_a_truncated_archive_is_refused(tmp_path):
    path = build_run(tmp_path / NAME)
    path.write_bytes(path.read_bytes()[:-50])
    with pytest.raises(DownloadError, match="truncated"):
        check_makeself(path)


def test_an_html_error_page_is_not_an_installer(tmp_path):
    page = tmp_path / NAME
    page.write_text("<html><body>Access denied</body></html>")
    with pytest.raises(DownloadError, match="not a makeself archive"):
        read_header(page)


def test_a_header_with_garbage_sizes_is_refused_not_a_crash(tmp_path):
    path = build_run(tmp_path / NAME)
    path.write_bytes(path.read_bytes().replace(b'filesizes="', b'filesizes="12x '))
    with pytest.raises(DownloadError, match="without a payload offset or file sizes"):
        read_header(path)


def test_an_archive_without_any_checksum_is_refused(tmp_path):
    path = build_run(tmp_path / NAME)
    data = path.read_bytes()
    header = read_header(path)
    text = data[: header.offset].decode()
    for field in ("CRCsum", "MD5"):
        start = text.index(f'{field}="') + len(field) + 2
        end = text.index('"', start)
        text = text[:start] + "0" * (end - start) + text[end:]  # makeself writes zeros for a sum it skipped
    path.write_bytes(text.encode() + data[header.offset:])
    with pytest.raises(DownloadError, match="carries no checksum"):
        check_makeself(path)

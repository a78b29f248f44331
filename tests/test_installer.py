"""Getting the .run: URL resolution, the cache, resumable downloads from a local HTTP server, and every
integrity check (--sha256, NVIDIA's .sha256sum, the makeself archive's own sums). Nothing is executed."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpunode import installer
from gpunode.errors import UsageError
from gpunode.installer import DownloadError

VERSION = "535.129.03"
NAME = f"NVIDIA-Linux-x86_64-{VERSION}.run"


# -- a makeself archive in the format of NVIDIA's .run files (built here, no makeself needed) ----------------
def build_run(path: Path, version: str = VERSION, arch: str = "x86_64", payload: bytes | None = None,
              sha: bool = False) -> Path:
    """Header like NVIDIA's (makeself 2.1.x: the line count inline in `head -n N "$1"`), then the payload."""
    payload = payload if payload is not None else os.urandom(3000) + b"payload-end"
    crc = installer.PosixCksum()
    crc.update(payload)
    lines = [
        "#!/bin/sh",
        "# This script was generated using Makeself 2.1.5",
        "",
        f'CRCsum="{crc.value()}"',
        f'MD5="{hashlib.md5(payload).hexdigest()}"',
        *([f'SHA="{hashlib.sha256(payload).hexdigest()}"'] if sha else []),
        "TMPROOT=${TMPDIR:=/tmp}",
        "",
        f'label="NVIDIA Accelerated Graphics Driver for Linux-{arch} {version}"',
        'script="./nvidia-installer"',
        f'targetdir="NVIDIA-Linux-{arch}-{version}"',
        f'filesizes="{len(payload)}"',
        "keep=y",
        "",
        "MS_Check()",
        "{",
        '    offset=`head -n 000 "$1" | wc -c | tr -d " "`',
        "}",
        "exit 0",
    ]
    at = next(i for i, line in enumerate(lines) if "head -n 000" in line)
    lines[at] = lines[at].replace("000", f"{len(lines):03d}")
    path.write_bytes(("\n".join(lines) + "\n").encode() + payload)
    return path


# -- a local HTTP server with Range support and a few ways to misbehave ---------------------------------------
class Server:
    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.requests: list[tuple[str, str | None]] = []  # (path, Range header)
        self.ignore_range = False
        self.cut_after: int | None = None  # close the connection after this many body bytes (once)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                outer.requests.append((self.path, self.headers.get("Range")))
                data = outer.files.get(self.path)
                if data is None:
                    self.send_error(404)
                    return
                start = 0
                rng = self.headers.get("Range")
                if rng and not outer.ignore_range:
                    start = int(rng.split("=")[1].split("-")[0])
                    if start >= len(data):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(data)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                body = data[start:]
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if outer.cut_after is not None:
                    cut, outer.cut_after = outer.cut_after, None
                    self.wfile.write(body[:cut])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def publish(self, version: str, data: bytes, where: str = "tesla", sha256sum: str | None = None) -> None:
        path = (f"/tesla/{version}/NVIDIA-Linux-x86_64-{version}.run" if where == "tesla"
                else f"/XFree86/Linux-x86_64/{version}/NVIDIA-Linux-x86_64-{version}.run")
        self.files[path] = data
        if sha256sum is not None:
            self.files[f"/XFree86/Linux-x86_64/{version}/NVIDIA-Linux-x86_64-{version}.run.sha256sum"] = (
                f"{sha256sum}  NVIDIA-Linux-x86_64-{version}.run\n".encode())

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    srv = Server()
    yield srv
    srv.stop()


def source(server: Server, tmp_path: Path, **kw) -> installer.Source:
    return installer.resolve(VERSION, "x86_64", cache_root=tmp_path / "cache", mirror=server.url, **kw)


# -- URL resolution and cache paths (pure) ------------------------------------------------------------------
def test_official_urls_data_center_first_then_xfree86():
    assert installer.official_urls("535.129.03", "x86_64") == (
        "https://us.download.nvidia.com/tesla/535.129.03/NVIDIA-Linux-x86_64-535.129.03.run",
        "https://us.download.nvidia.com/XFree86/Linux-x86_64/535.129.03/NVIDIA-Linux-x86_64-535.129.03.run",
    )


def test_official_urls_aarch64_and_arch_aliases():
    urls = installer.official_urls("550.54.15", "arm64")
    assert urls[0] == "https://us.download.nvidia.com/tesla/550.54.15/NVIDIA-Linux-aarch64-550.54.15.run"
    assert "https://us.download.nvidia.com/XFree86/aarch64/550.54.15/NVIDIA-Linux-aarch64-550.54.15.run" in urls
    assert "https://us.download.nvidia.com/XFree86/Linux-aarch64/550.54.15/NVIDIA-Linux-aarch64-550.54.15.run" in urls
    with pytest.raises(UsageError, match="no .run driver for architecture 'ppc64le'"):
        installer.official_urls("550.54.15", "ppc64le")


def test_mirror_replaces_the_host_and_keeps_the_layout():
    urls = installer.official_urls(VERSION, "x86_64", "http://mirror.local/nvidia/")
    assert urls[0] == f"http://mirror.local/nvidia/tesla/{VERSION}/{NAME}"


def test_checksum_urls_fall_back_to_the_xfree86_sums_for_a_data_center_download():
    tesla = installer.official_urls(VERSION, "x86_64")[0]
    sums = installer.checksum_urls(tesla, VERSION, "x86_64")
    assert sums == (tesla + ".sha256sum",
                    f"https://us.download.nvidia.com/XFree86/Linux-x86_64/{VERSION}/{NAME}.sha256sum")


@pytest.mark.parametrize("name, expected", [
    ("NVIDIA-Linux-x86_64-535.129.03.run", ("x86_64", "535.129.03")),
    ("https://h/x/NVIDIA-Linux-aarch64-550.54.15.run", ("aarch64", "550.54.15")),
    ("NVIDIA-Linux-x86_64-550.120-no-compat32.run", ("x86_64", "550.120")),
    ("driver.run", None),
])
def test_parse_runfile_name(name, expected):
    assert installer.parse_runfile_name(name) == expected


def test_cache_dir_option_then_env_then_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert installer.default_cache_root(None, {}) == tmp_path / "home/.cache/gpunode/drivers"
    assert installer.default_cache_root(None, {"GPUNODE_CACHE_DIR": "/srv/c"}) == Path("/srv/c")
    assert installer.default_cache_root("/opt/c", {"GPUNODE_CACHE_DIR": "/srv/c"}) == Path("/opt/c")
    assert installer.cache_path("/c", VERSION, "amd64") == Path(f"/c/{VERSION}/x86_64/{NAME}")


# -- makeself checks ------------------------------------------------------------------------------------------
def test_posix_cksum_matches_the_cksum_tool():
    for data in (b"", b"hello world\n", bytes(range(256)) * 1000):
        crc = installer.PosixCksum()
        crc.update(data[:7])
        crc.update(data[7:])
        if shutil.which("cksum"):
            expected = subprocess.run(["cksum"], input=data, capture_output=True, check=True).stdout.split()[0]
            assert str(crc.value()) == expected.decode()
    crc = installer.PosixCksum()
    crc.update(b"hello world\n")
    assert crc.value() == 3733384285  # `echo hello world | cksum`


def test_header_of_an_nvidia_style_archive(tmp_path):
    path = build_run(tmp_path / NAME)
    header = installer.read_header(path)
    assert header.label == f"NVIDIA Accelerated Graphics Driver for Linux-x86_64 {VERSION}"
    assert header.arch_version == ("x86_64", VERSION)
    assert path.read_bytes()[header.offset:].endswith(b"payload-end")
    assert installer.check_makeself(path) == ["makeself MD5 OK", "makeself CRC OK"]


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
    assert installer.check_makeself(run) == ["makeself SHA256 OK", "makeself MD5 OK", "makeself CRC OK"]
    data = bytearray(run.read_bytes())
    data[-20_000] ^= 0xFF
    run.write_bytes(bytes(data))
    with pytest.raises(DownloadError, match="SHA256 mismatch"):
        installer.check_makeself(run)


def test_a_flipped_byte_is_refused(tmp_path):
    path = build_run(tmp_path / NAME)
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(DownloadError, match="makeself MD5 mismatch"):
        installer.check_makeself(path)


def test_a_truncated_archive_is_refused(tmp_path):
    path = build_run(tmp_path / NAME)
    path.write_bytes(path.read_bytes()[:-50])
    with pytest.raises(DownloadError, match="truncated"):
        installer.check_makeself(path)


def test_an_html_error_page_is_not_an_installer(tmp_path):
    page = tmp_path / NAME
    page.write_text("<html><body>Access denied</body></html>")
    with pytest.raises(DownloadError, match="not a makeself archive"):
        installer.read_header(page)


def test_parse_sha256sum():
    digest = "a" * 64
    assert installer.parse_sha256sum(f"{digest}  {NAME}\n", NAME) == digest
    assert installer.parse_sha256sum(f"{digest} *{NAME}\n{'b' * 64}  other.run\n", NAME) == digest
    assert installer.parse_sha256sum("<html>nope</html>", NAME) is None


# -- downloads from a local server ----------------------------------------------------------------------------
def test_download_verifies_against_the_published_sum_and_caches(server, tmp_path):
    data = build_run(tmp_path / NAME).read_bytes()
    server.publish(VERSION, data, sha256sum=hashlib.sha256(data).hexdigest())
    src = source(server, tmp_path)
    got = installer.obtain(src, progress=False)
    assert Path(got.path).read_bytes() == data and got.path == src.cache
    assert "published .sha256sum OK" in got.checks and "makeself CRC OK" in got.checks
    assert Path(src.cache).parent == tmp_path / "cache" / VERSION / "x86_64"
    assert installer.cached_files(tmp_path / "cache", VERSION) == ((src.cache, len(data)),)
    before = len(server.requests)
    again = installer.obtain(src, progress=False)
    assert again.checks[0] == "cached copy" and len(server.requests) == before  # no network the second time


def test_resume_continues_a_partial_download_with_range(server, tmp_path):
    data = build_run(tmp_path / NAME, payload=os.urandom(200_000)).read_bytes()
    server.publish(VERSION, data)
    src = source(server, tmp_path)
    part = Path(src.cache + ".part")
    part.parent.mkdir(parents=True)
    part.write_bytes(data[:120_000])
    installer.obtain(src, progress=False)
    assert Path(src.cache).read_bytes() == data and not part.exists()
    assert (f"/tesla/{VERSION}/{NAME}", "bytes=120000-") in server.requests


def test_a_dropped_connection_is_resumed(server, tmp_path):
    data = build_run(tmp_path / NAME, payload=os.urandom(300_000)).read_bytes()
    server.publish(VERSION, data)
    server.cut_after = 100_000
    src = source(server, tmp_path)
    installer.obtain(src, progress=False)
    assert Path(src.cache).read_bytes() == data
    ranges = [r for p, r in server.requests if p.endswith(".run")]
    assert ranges[0] is None and ranges[1] is not None and ranges[1].startswith("bytes=")


def test_a_server_that_ignores_range_restarts_cleanly(server, tmp_path):
    data = build_run(tmp_path / NAME).read_bytes()
    server.publish(VERSION, data)
    server.ignore_range = True
    src = source(server, tmp_path)
    Path(src.cache).parent.mkdir(parents=True)
    Path(src.cache + ".part").write_bytes(b"garbage that is not the start of the file")
    installer.obtain(src, progress=False)
    assert Path(src.cache).read_bytes() == data


def test_a_complete_part_file_is_finished_without_downloading_again(server, tmp_path):
    data = build_run(tmp_path / NAME).read_bytes()
    server.publish(VERSION, data)
    src = source(server, tmp_path)
    Path(src.cache).parent.mkdir(parents=True)
    Path(src.cache + ".part").write_bytes(data)
    installer.obtain(src, progress=False)
    assert Path(src.cache).read_bytes() == data


def test_falls_back_to_the_xfree86_path(server, tmp_path):
    data = build_run(tmp_path / NAME).read_bytes()
    server.publish(VERSION, data, where="xfree86")
    got = installer.obtain(source(server, tmp_path), progress=False)
    assert got.checks[0].startswith(f"downloaded from {server.url}/XFree86/Linux-x86_64/")


def test_unknown_version_names_every_url_tried(server, tmp_path):
    with pytest.raises(DownloadError, match="HTTP 404") as exc:
        installer.obtain(source(server, tmp_path), progress=False)
    assert "/tesla/" in exc.value.message and "/XFree86/" in exc.value.message


def test_published_checksum_mismatch_is_refused_and_nothing_is_kept(server, tmp_path):
    data = build_run(tmp_path / NAME).read_bytes()
    server.publish(VERSION, data, sha256sum="0" * 64)
    src = source(server, tmp_path)
    with pytest.raises(DownloadError, match="does not match NVIDIA's published"):
        installer.obtain(src, progress=False)
    assert not Path(src.cache).exists() and installer.cached_files(tmp_path / "cache", VERSION) == ()


def test_sha256_option_mismatch_is_refused(server, tmp_path):
    data = build_run(tmp_path / NAME).read_bytes()
    server.publish(VERSION, data)
    with pytest.raises(DownloadError, match="does not match --sha256"):
        installer.obtain(source(server, tmp_path, sha256="f" * 64), progress=False)
    good = installer.obtain(source(server, tmp_path, sha256=hashlib.sha256(data).hexdigest()), progress=False)
    assert "--sha256 OK" in good.checks


def test_a_corrupt_download_fails_the_makeself_check(server, tmp_path):
    data = bytearray(build_run(tmp_path / NAME).read_bytes())
    data[-10] ^= 0x55
    server.publish(VERSION, bytes(data))
    src = source(server, tmp_path)
    with pytest.raises(DownloadError, match="the archive is corrupt"):
        installer.obtain(src, progress=False)
    assert not Path(src.cache).exists()


def test_a_damaged_cache_entry_is_downloaded_again(server, tmp_path):
    data = build_run(tmp_path / NAME).read_bytes()
    server.publish(VERSION, data)
    src = source(server, tmp_path)
    installer.obtain(src, progress=False)
    Path(src.cache).write_bytes(data[:-1] + b"X")
    installer.obtain(src, progress=False)
    assert Path(src.cache).read_bytes() == data


def test_wrong_architecture_or_version_in_the_archive_is_refused(tmp_path):
    arm = build_run(tmp_path / "arm.run", arch="aarch64")
    with pytest.raises(DownloadError, match="is an installer for aarch64, the node is x86_64"):
        installer.obtain(installer.resolve(VERSION, "x86_64", driver_run=str(arm)), progress=False)
    other = build_run(tmp_path / "other.run", version="550.54.15")
    with pytest.raises(DownloadError, match="installs driver 550.54.15, not the requested"):
        installer.obtain(installer.resolve(VERSION, "x86_64", driver_run=str(other)), progress=False)


def test_driver_run_url_is_downloaded_into_the_cache(server, tmp_path):
    data = build_run(tmp_path / NAME).read_bytes()
    server.files["/mine/" + NAME] = data
    src = installer.resolve(VERSION, "x86_64", driver_run=f"{server.url}/mine/{NAME}", cache_root=tmp_path / "c")
    assert src.urls == (f"{server.url}/mine/{NAME}",)
    assert installer.obtain(src, progress=False).path == str(tmp_path / "c" / VERSION / "x86_64" / NAME)


# -- the CLI's view: options -> Options fields -------------------------------------------------------------------
def test_request_reads_the_version_of_a_local_run(tmp_path):
    run = build_run(tmp_path / "renamed.run")
    fields = installer.request(None, str(run), None, "OPEN", None, None, str(tmp_path / "c"), env={})
    assert fields["driver"] == VERSION and fields["kernel_module"] == "open"
    assert fields["local_installers"] == ((str(run), run.stat().st_size),)
    with pytest.raises(UsageError, match="--driver asks for 550.54.15"):
        installer.request("550.54.15", str(run), None, None, None, None, None, env={})


def test_request_takes_the_mirror_from_the_environment(tmp_path):
    fields = installer.request(VERSION, None, None, None, None, None, None,
                               env={"GPUNODE_DRIVER_MIRROR": "http://127.0.0.1:9", "GPUNODE_CACHE_DIR": str(tmp_path)})
    assert fields["driver_mirror"] == "http://127.0.0.1:9" and fields["cache_dir"] == str(tmp_path)


def test_a_wrong_sha256_option_does_not_throw_away_a_good_cached_copy(server, tmp_path):
    data = build_run(tmp_path / NAME).read_bytes()
    server.publish(VERSION, data)
    installer.obtain(source(server, tmp_path), progress=False)
    with pytest.raises(DownloadError, match="does not match --sha256"):
        installer.obtain(source(server, tmp_path, sha256="e" * 64), progress=False)
    assert Path(source(server, tmp_path).cache).read_bytes() == data

"""Official URLs, checksum URLs, mirrors and the cache layout (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpunode.artifacts import naming
from gpunode.errors import UsageError
from tests.fakes.runfile import NAME, VERSION


def test_official_urls_data_center_first_then_xfree86():
    assert naming.official_urls("535.129.03", "x86_64") == (
        "https://us.download.nvidia.com/tesla/535.129.03/NVIDIA-Linux-x86_64-535.129.03.run",
        "https://us.download.nvidia.com/XFree86/Linux-x86_64/535.129.03/NVIDIA-Linux-x86_64-535.129.03.run",
    )


def test_official_urls_aarch64_and_arch_aliases():
    urls = naming.official_urls("550.54.15", "arm64")
    assert urls[0] == "https://us.download.nvidia.com/tesla/550.54.15/NVIDIA-Linux-aarch64-550.54.15.run"
    assert "https://us.download.nvidia.com/XFree86/aarch64/550.54.15/NVIDIA-Linux-aarch64-550.54.15.run" in urls
    assert "https://us.download.nvidia.com/XFree86/Linux-aarch64/550.54.15/NVIDIA-Linux-aarch64-550.54.15.run" in urls
    with pytest.raises(UsageError, match="no .run driver for architecture 'ppc64le'"):
        naming.official_urls("550.54.15", "ppc64le")


def test_mirror_replaces_the_host_and_keeps_the_layout():
    urls = naming.official_urls(VERSION, "x86_64", "http://mirror.local/nvidia/")
    assert urls[0] == f"http://mirror.local/nvidia/tesla/{VERSION}/{NAME}"


def test_checksum_urls_fall_back_to_the_xfree86_sums_for_a_data_center_download():
    tesla = naming.official_urls(VERSION, "x86_64")[0]
    sums = naming.checksum_urls(tesla, VERSION, "x86_64")
    assert sums == (tesla + ".sha256sum",
                    f"https://us.download.nvidia.com/XFree86/Linux-x86_64/{VERSION}/{NAME}.sha256sum")
    assert naming.checksum_urls("http://h/mine/driver.run", VERSION, "x86_64") == ("http://h/mine/driver.run.sha256sum",)


def test_cache_dir_option_then_env_then_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert naming.default_cache_root(None, {}) == tmp_path / "home/.cache/gpunode/drivers"
    assert naming.default_cache_root(None, {"GPUNODE_CACHE_DIR": "/srv/c"}) == Path("/srv/c")
    assert naming.default_cache_root("/opt/c", {"GPUNODE_CACHE_DIR": "/srv/c"}) == Path("/opt/c")
    assert naming.cache_path("/c", VERSION, "amd64") == Path(f"/c/{VERSION}/x86_64/{NAME}")


@pytest.mark.parametrize("url, name", [
    (f"http://h/x/{NAME}?token=1", NAME),
    ("http://h/x/my driver.run?x=y", "my_driver.run"),
    ("http://h/x/../..", NAME),  # never a path out of the cache folder
    ("http://h/x/.hidden", "hidden"),
    ("http://h/x/", NAME),
    ("http://h/x/pilote-é.run", "pilote-_.run"),
])
def test_a_url_file_name_is_made_safe_for_the_cache(url, name):
    path = naming.cache_path("/c", VERSION, "x86_64", url)
    assert path.parent == Path(f"/c/{VERSION}/x86_64") and path.name == name


def test_cached_files_lists_only_verified_downloads(tmp_path):
    folder = tmp_path / VERSION / "x86_64"
    folder.mkdir(parents=True)
    (folder / NAME).write_bytes(b"x" * 10)
    assert naming.cached_files(tmp_path, VERSION) == ()  # no marker: not verified
    (folder / (NAME + ".sha256")).write_text("0" * 64 + f"  {NAME}\n")
    assert naming.cached_files(tmp_path, VERSION) == ((str(folder / NAME), 10),)
    assert naming.cached_files(tmp_path, "550.54.15") == ()

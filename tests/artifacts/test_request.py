"""The CLI's view: the driver options as typed -> Options fields, and clear errors for bad ones."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpunode.artifacts.request import check_sha256_option, request
from gpunode.errors import UsageError
from tests.fakes.runfile import NAME, VERSION, build_run


def ask(driver=None, driver_run=None, sha256=None, kernel_module=None, key=None, cert=None, cache_dir=None, env=None):
    return request(driver, driver_run, sha256, kernel_module, key, cert, cache_dir, env={} if env is None else env)


def test_request_reads_the_version_of_a_local_run(tmp_path):
    run = build_run(tmp_path / "renamed.run")
    fields = ask(driver_run=str(run), kernel_module="OPEN", cache_dir=str(tmp_path / "c"))
    assert fields["driver"] == VERSION and fields["kernel_module"] == "open"
    assert fields["local_installers"] == ((str(run), run.stat().st_size),)
    with pytest.raises(UsageError, match="--driver asks for 550.54.15"):
        ask(driver="550.54.15", driver_run=str(run))


def test_request_takes_the_mirror_and_cache_from_the_environment(tmp_path):
    fields = ask(VERSION, env={"GPUNODE_DRIVER_MIRROR": "http://127.0.0.1:9", "GPUNODE_CACHE_DIR": str(tmp_path)})
    assert fields["driver_mirror"] == "http://127.0.0.1:9" and fields["cache_dir"] == str(tmp_path)
    assert fields["local_installers"] == ()


def test_request_lists_verified_cached_downloads(tmp_path):
    folder = tmp_path / VERSION / "x86_64"
    folder.mkdir(parents=True)
    (folder / NAME).write_bytes(b"x" * 7)
    (folder / (NAME + ".sha256")).write_text("0" * 64 + f"  {NAME}\n")
    assert ask(VERSION, cache_dir=str(tmp_path))["local_installers"] == ((str(folder / NAME), 7),)


def test_a_url_names_its_version(tmp_path):
    fields = ask(driver_run=f"https://example.invalid/x/{NAME}", cache_dir=str(tmp_path))
    assert fields["driver"] == VERSION and fields["driver_run"] == f"https://example.invalid/x/{NAME}"
    with pytest.raises(UsageError, match="cannot tell which driver version"):
        ask(driver_run="https://example.invalid/x/driver.run")


@pytest.mark.parametrize("kwargs, message", [
    ({"sha256": "abc"}, "is not a SHA-256 digest"),
    ({"env": {"GPUNODE_DRIVER_MIRROR": "mirror.local/nvidia"}}, "GPUNODE_DRIVER_MIRROR='mirror.local/nvidia' is not"),
    ({"driver_run": "https://h/a\nb.run"}, "control characters"),
])
def test_option_mistakes_are_usage_errors(kwargs, message):
    with pytest.raises(UsageError, match=message) as exc:
        ask(VERSION, **kwargs)
    assert exc.value.fix and exc.value.exit_code == 2


def test_sha256_is_normalised():
    assert check_sha256_option(f"  {'AB' * 32} ") == "ab" * 32
    assert check_sha256_option(None) is None


def test_a_local_file_that_is_missing_a_directory_or_not_a_run(tmp_path):
    with pytest.raises(UsageError, match="no such file"):
        ask(driver_run=str(tmp_path / "nope.run"))
    with pytest.raises(UsageError, match="is a directory"):
        ask(driver_run=str(tmp_path))
    page = tmp_path / "page.run"
    page.write_text("<html>403</html>")
    with pytest.raises(UsageError, match="not a makeself archive") as exc:
        ask(driver_run=str(page))
    assert "HTML error page" in (exc.value.fix or "")


def test_a_file_name_that_is_not_utf8_is_a_clear_error(tmp_path):
    raw = os.fsencode(tmp_path) + b"/NVIDIA-\xff.run"
    build_run(Path(os.fsdecode(raw)))  # a real file with that name
    typed = os.fsdecode(raw)  # how the name reaches gpunode from the command line (surrogate escapes)
    with pytest.raises(UsageError) as exc:
        ask(driver_run=typed)
    assert "the file name is not printable UTF-8 text" in exc.value.message
    assert "\\udcff" in exc.value.message  # shown escaped: the message itself can always be printed
    exc.value.message.encode("utf-8")
    assert "rename the file" in (exc.value.fix or "")


def test_a_file_name_with_a_newline_is_a_clear_error(tmp_path):
    odd = build_run(tmp_path / "a\nb.run")
    with pytest.raises(UsageError, match="not printable UTF-8 text") as exc:
        ask(driver_run=str(odd))
    assert "\n" not in exc.value.message

from __future__ import annotations

import hashlib

from gpunode.artifacts.checksums import parse_sha256sum, sha256_file, sha256sum_line
from tests.fakes.runfile import NAME


def test_parse_sha256sum():
    digest = "a" * 64
    assert parse_sha256sum(f"{digest}  {NAME}\n", NAME) == digest
    assert parse_sha256sum(f"{digest} *{NAME}\n{'b' * 64}  other.run\n", NAME) == digest
    assert parse_sha256sum(f"{'C' * 64}\n", NAME) == "c" * 64  # a bare digest is the file's
    assert parse_sha256sum(f"{digest}  a.run\n{'b' * 64}  b.run\n", NAME) is None  # several, none ours
    assert parse_sha256sum("<html>nope</html>", NAME) is None


def test_sha256_file_and_the_line_it_is_recorded_in(tmp_path):
    path = tmp_path / NAME
    path.write_bytes(b"x" * 3_000_000)  # more than one read
    digest = sha256_file(path)
    assert digest == hashlib.sha256(b"x" * 3_000_000).hexdigest()
    assert parse_sha256sum(sha256sum_line(digest, NAME), NAME) == digest

"""Log safety helpers: host names as file names, secrets masked in every format a node file comes in."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpunode.fleetlog import log_file_names, mask_secrets, safe_log_name


@pytest.mark.parametrize("text, secret", [
    ('{"auths": {"nvcr.io": {"auth": "JG9hdXRodG9rZW46c2VjcmV0"}}}', "JG9hdXRodG9rZW46c2VjcmV0"),
    ('  "identitytoken": "eyJhbGciOi.x.y",', "eyJhbGciOi.x.y"),
    ('[plugins."io.containerd.grpc.v1.cri".registry.configs."r".auth]\n  password = "s3cr3t"', "s3cr3t"),
    ("  token = 'abc123def'", "abc123def"),
    ('"diff": "+  auth = \\"dXNlcjpwdw==\\""', "dXNlcjpwdw=="),
    ("NGC_API_KEY=nvapi-0123456789 docker login", "nvapi-0123456789"),
    ("Authorization: Bearer eyJ0eXAiOiJKV1Qi", "eyJ0eXAiOiJKV1Qi"),
    ("deb https://user:pa55word@repo.example.com/ubuntu jammy main", "pa55word"),
])
def test_secrets_are_masked(text, secret):
    masked = mask_secrets(text)
    assert secret not in masked and "***" in masked


def test_ordinary_text_is_left_alone():
    text = '{"data-root": "/data/docker", "runtimes": {"nvidia": {"path": "nvidia-container-runtime"}}}'
    assert mask_secrets(text) == text


@given(st.text(min_size=1, max_size=40))
def test_any_host_name_becomes_one_plain_file_name(name):
    safe = safe_log_name(name)
    assert safe and "/" not in safe and "\x00" not in safe and not safe.startswith(".")
    assert safe not in (".", "..") and len(safe) <= 100


def test_names_that_sanitise_alike_get_distinct_files():
    names = log_file_names(["a/b", "a_b", "a:b", "A_B", "x"])
    assert len(set(v.lower() for v in names.values())) == 5
    assert names["a_b"] == "a_b.log" and names["x"] == "x.log"

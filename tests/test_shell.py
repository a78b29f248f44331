"""Every value that reaches a remote shell is quoted: any string goes through the real dash (the /bin/sh
of Debian and Ubuntu nodes) unchanged, as an argv word and as a Script argument. Running `dash -c` on a
generated string prints it and changes nothing on this machine."""

import shutil
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpunode.connection.base import _READ_FILE, _WRITE_FILE
from gpunode.shell import Script, quote, render

DASH = shutil.which("dash")
pytestmark = pytest.mark.skipif(DASH is None, reason="dash is not installed")

# Anything an argv can carry: every code point except NUL and lone surrogates (not encodable as UTF-8).
words = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=60)
nasty = st.sampled_from(["'", '"', "$(id)", "`id`", "$HOME", "a b", "-n", "--", "\\", "*", "~", "\n", ";rm -rf /",
                         "${x:-y}", "!", "#", "é", "\t"])
values = st.one_of(words, st.lists(nasty, max_size=6).map("".join))
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def dash(line: str) -> bytes:
    return subprocess.run([DASH, "-c", line], capture_output=True, timeout=10, check=True).stdout


@FAST
@given(values)
def test_an_argv_word_arrives_unchanged(value):
    assert dash(render(["printf", "%s", value])) == value.encode()


@FAST
@given(st.lists(values, min_size=1, max_size=4))
def test_script_arguments_arrive_unchanged_and_separate(args):
    script = Script('for a in "$@"; do printf "%s\\0" "$a"; done', tuple(args), "echo-args")
    out = dash(render(script))
    assert out.split(b"\0")[:-1] == [a.encode() for a in args]


@FAST
@given(values)
def test_quote_alone_round_trips(value):
    assert dash(f"printf %s {quote(value)}") == value.encode()


@FAST
@given(values)
def test_privilege_prefix_and_env_do_not_disturb_the_word(value):
    line = render(["printf", "%s", value], privilege=("env",))
    assert dash(line) == value.encode()


@pytest.mark.parametrize("script", [_READ_FILE, _WRITE_FILE])
def test_the_built_in_scripts_are_valid_posix_sh(script):
    subprocess.run([DASH, "-n", "-c", script.body], check=True, timeout=10)

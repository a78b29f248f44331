"""gpunode.explain.tables: the shipped tables pass their schema check, and the check catches the mistakes a table
edit can make (each as a DataError naming the file and line)."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest

from gpunode.datatables import DataError, data_dir
from gpunode.explain import IDS, XIDS
from gpunode.explain.tables import DETECTOR_TABLES, load, tables


def test_the_shipped_tables_load_and_every_row_has_a_source():
    detectors, xids = load()
    assert len(detectors) >= 40 and len(xids) >= 40
    assert all(len(d.source) >= 8 for d in detectors)
    assert len(IDS) == len(set(IDS)) and {d.id for d in detectors} == set(IDS)
    assert XIDS[79][1] == "reboot" and "fallen off the bus" in XIDS[79][0]


def test_every_first_fix_is_one_runnable_command_without_placeholders():
    for d in tables()[0]:
        command = d.fix.split("  #")[0]
        assert not re.search(r"<[a-z][^>]*>", command), (d.id, d.fix)  # %(name)s is filled from the text
        shlex.split(command)  # balanced quoting


def test_installer_failures_are_their_own_table():
    installer = [d for d in tables()[0] if d.table == "installer_failures.csv"]
    assert {d.id for d in installer} >= {"installer.nouveau", "installer.no-kernel-source", "installer.nvidia-ko-load",
                                         "installer.module-in-use", "installer.no-space", "installer.cc-mismatch"}
    assert all(d.id.startswith("installer.") for d in installer)


def _copy(tmp_path: Path) -> Path:
    for name in (*DETECTOR_TABLES, "xid.csv"):
        shutil.copy(Path(str(data_dir())) / name, tmp_path / name)
    return tmp_path


def _append(path: Path, line: str) -> int:
    text = path.read_text()
    path.write_text(text + line + "\n")
    return text.count("\n") + 1


ROW = 'test.case,,50,,{pattern},Title {title},Cause.,{fix},,{superseded},{source}'


@pytest.mark.parametrize("fields,message", [
    ({"pattern": "abc(", "title": "", "fix": "true", "superseded": "", "source": "somewhere real"},
     "not a regular expression"),
    ({"pattern": "a[b c]", "title": "", "fix": "true", "superseded": "", "source": "somewhere real"},
     "space inside"),
    ({"pattern": "abc", "title": "%(missing)s", "fix": "true", "superseded": "", "source": "somewhere real"},
     "missing is not a named group"),
    ({"pattern": "abc", "title": "", "fix": "true", "superseded": "", "source": ""}, "column source is empty"),
    ({"pattern": "abc", "title": "", "fix": "true", "superseded": "", "source": "x"}, "every row needs its source"),
    ({"pattern": "abc", "title": "", "fix": "true", "superseded": "nosuch.id", "source": "somewhere real"},
     "superseded_by names nosuch.id"),
])
def test_a_bad_detector_row_is_reported_with_file_and_line(tmp_path, fields, message):
    directory = _copy(tmp_path)
    line = _append(directory / "explain_detectors.csv", ROW.format(**fields))
    with pytest.raises(DataError) as caught:
        load(directory)
    assert message in str(caught.value)
    if "superseded_by" not in message:
        assert f"data/explain_detectors.csv line {line}" in str(caught.value)


def test_the_same_id_and_variant_twice_is_an_error(tmp_path):
    directory = _copy(tmp_path)
    first = (directory / "installer_failures.csv").read_text().splitlines()[1]
    _append(directory / "installer_failures.csv", first)
    with pytest.raises(DataError, match=r"installer_failures.csv line \d+: id installer.nouveau variant '' again"):
        load(directory)


def test_a_bad_xid_row_is_an_error(tmp_path):
    directory = _copy(tmp_path)
    _append(directory / "xid.csv", '999,something,catastrophic,"somewhere real"')
    with pytest.raises(DataError, match="column severity: 'catastrophic' is not one of"):
        load(directory)
    directory = _copy(tmp_path)
    _append(directory / "xid.csv", '79,again,reboot,"somewhere real"')
    with pytest.raises(DataError, match="duplicate xid"):
        load(directory)


def test_a_strength_out_of_range_is_an_error(tmp_path):
    directory = _copy(tmp_path)
    _append(directory / "explain_detectors.csv", ROW.replace(",50,", ",101,").format(
        pattern="abc", title="", fix="true", superseded="", source="somewhere real"))
    with pytest.raises(DataError, match="column strength: '101' is not a strength"):
        load(directory)

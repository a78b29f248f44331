"""gpunode.compat against NVIDIA's own numbers (CUDA release notes Table 2/3, the architecture matrix, the
data-center driver lifecycle). Every expected value below is copied from those tables, not from our CSV."""

from __future__ import annotations

import shutil
from datetime import date
from pathlib import Path

import pytest

from gpunode import compat
from gpunode.compat import Ver
from gpunode.errors import UsageError

TODAY = date(2026, 11, 21)
REPO_DATA = Path(__file__).resolve().parent.parent / "data"


# --- CUDA toolkit -> minimum Linux driver (Table 3), sampled across 10.x - 13.x --------------------------

@pytest.mark.parametrize("cuda, minimum", [
    ("10.0.130", "410.48"),
    ("10.1.105", "418.39"),
    ("10.2.89", "440.33"),
    ("11.0.3", "450.51.06"),
    ("11.1.0", "455.23"),
    ("11.4.0", "470.42.01"),
    ("11.4.3", "470.82.01"),
    ("11.8.0", "520.61.05"),
    ("12.0.0", "525.60.13"),
    ("12.1.1", "530.30.02"),
    ("12.2.0", "535.54.03"),
    ("12.2.2", "535.104.05"),
    ("12.3.0", "545.23.06"),
    ("12.4.0", "550.54.14"),
    ("12.4.1", "550.54.15"),
    ("12.5.0", "555.42.02"),
    ("12.6.3", "560.35.05"),
    ("12.8.0", "570.26"),
    ("12.8.1", "570.124.06"),
    ("12.9.1", "575.57.08"),
    ("13.0.0", "580.65.06"),
    ("13.0.2", "580.95.05"),
    ("13.1.0", "590.44.01"),
    ("13.2.0", "595.45.04"),
])
def test_release_minimum_driver(cuda, minimum):
    need = compat.driver_needed_for_cuda(cuda)
    assert str(need.native_min) == minimum  # printed as NVIDIA writes it (leading zeros kept)


@pytest.mark.parametrize("series, minimum", [
    ("10.1", "418.39"), ("11.8", "520.61.05"), ("12.2", "535.54.03"), ("12.4", "550.54.14"), ("12.8", "570.26"),
    ("13.0", "580.65.06"),
])
def test_series_minimum_is_the_lowest_of_its_releases(series, minimum):
    assert str(compat.driver_needed_for_cuda(series).native_min) == minimum


@pytest.mark.parametrize("driver, series", [
    # exact minimum, then one below it
    ("418.39", "10.1"), ("418.38", "10.0"),
    ("440.33", "10.2"), ("440.32", "10.1"),
    ("525.60.13", "12.0"), ("525.60.12", "11.8"),
    ("550.54.14", "12.4"), ("550.54.13", "12.3"),
    ("570.26", "12.8"), ("570.25", "12.6"),  # there is no CUDA 12.7
    ("580.65.06", "13.0"), ("580.65.05", "12.9"),
    ("590.44.01", "13.1"), ("590.44.00", "13.0"),
    # drivers in the field
    ("418.87", "10.1"),  # the seeds' example: 418.87 <-> CUDA 10.1
    ("470.256.02", "11.4"),
    ("535.129.03", "12.2"),
    ("535.288.01", "12.2"),  # nvidia-smi on this driver reports "CUDA Version: 12.2" (NVIDIA docs sample)
    ("610.57.04", "13.3"),
])
def test_native_cuda_of_a_driver(driver, series):
    assert compat.native_release(driver).series == series
    assert str(compat.cuda_reported_by(driver)) == series


def test_driver_older_than_every_row():
    assert compat.native_release("340.108") is None


# --- minor-version compatibility (Table 2) ------------------------------------------------------------------

@pytest.mark.parametrize("major, floor", [(11, "450.80.02"), (12, "525.60.13"), (13, "580")])
def test_minor_compat_floors(major, floor):
    assert str(compat.tables().minor_compat[major].min_driver) == floor
    assert str(compat.driver_needed_for_cuda(f"{major}.0").minor_compat_min) == floor


def test_no_minor_compat_before_cuda_11():
    assert compat.driver_needed_for_cuda("10.2").minor_compat_min is None
    assert compat.minor_compat_ranges("418.87") == []


@pytest.mark.parametrize("driver, ranges", [
    ("535.129.03", [(12, "12.3", "12.9")]),
    ("525.60.13", [(12, "12.1", "12.9")]),
    ("470.256.02", [(11, "11.5", "11.8")]),
    ("450.80.02", [(11, "11.1", "11.8")]),
    ("450.51.05", []),  # 11.0 GA driver: below the 11.x floor
    ("575.57.08", []),  # 12.9 native covers 12.x; 13.x needs >= 580
    ("580.65.06", [(13, "13.1", "13.4")]),
])
def test_minor_compat_ranges(driver, ranges):
    assert [(r.major, r.first, r.last) for r in compat.minor_compat_ranges(driver)] == ranges


@pytest.mark.parametrize("driver, cuda, ok, words", [
    ("535.129.03", "12.2", True, "runs natively"),
    ("535.129.03", "12.4", True, "minor-version compatibility"),
    ("535.129.03", "13.0", False, "needs a driver >= 580.65.06"),
    ("575.57.08", "13.0", False, "or >= 580 through minor-version"),  # across the 12 -> 13 boundary
    ("580.65.06", "13.2", True, "minor-version compatibility"),
    ("580.65.06", "12.4", True, "runs natively"),  # drivers are backward compatible
    ("525.60.13", "12.9", True, "minor-version compatibility"),
    ("525.60.12", "12.0", False, "needs a driver >= 525.60.13"),
    ("470.256.02", "12.0", False, "or >= 525.60.13"),
    ("450.80.02", "11.8", True, "minor-version compatibility"),
    ("450.80.01", "11.1", False, "needs a driver >= 455.23"),
    ("418.87", "10.1", True, "runs natively"),
    ("418.87", "10.2", False, "no minor-version compatibility before CUDA 11"),
])
def test_check_cuda(driver, cuda, ok, words):
    check = compat.check_cuda(Ver(driver), cuda)
    assert check.ok is ok and words in check.reason, check.reason


def test_minor_compat_note_names_ptx_jit_and_the_native_driver():
    check = compat.check_cuda(Ver("535.129.03"), "12.4")
    assert "driver 535.129.03 runs CUDA up to 12.2 natively" in check.reason
    assert any("PTX JIT" in n and "550.54.14" in n for n in check.notes)


# --- bad input ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["5x", "535", "535.129.03.1", "", "twelve", "5350.1"])
def test_bad_driver_is_a_usage_error_naming_it(value):
    with pytest.raises(UsageError) as exc:
        compat.parse_driver(value)
    assert repr(value) in exc.value.message and exc.value.exit_code == 2 and exc.value.fix


@pytest.mark.parametrize("value", ["twelve", "12", "12.x", "1.2.3.4", ""])
def test_bad_cuda_is_a_usage_error(value):
    with pytest.raises(UsageError) as exc:
        compat.driver_needed_for_cuda(value)
    assert "is not a CUDA version" in exc.value.message


def test_unknown_cuda_release_lists_known_ones():
    with pytest.raises(UsageError) as exc:
        compat.driver_needed_for_cuda("12.7")
    assert "12.7" in exc.value.message and "12.6, 12.8" in exc.value.fix
    with pytest.raises(UsageError) as exc:
        compat.driver_needed_for_cuda("12.4.7")
    assert "12.4.0, 12.4.1" in exc.value.fix


def test_cuda_prefixes_are_accepted():
    assert compat.driver_needed_for_cuda("cuda12.4").cuda == "12.4"
    assert compat.driver_needed_for_cuda("v12.4.1").cuda == "12.4.1"


def test_unknown_minimum_is_reported_as_unknown_not_guessed():
    need = compat.driver_needed_for_cuda("13.4")
    assert need.native_min is None and str(need.minor_compat_min) == "580"


# --- architectures ---------------------------------------------------------------------------------------

def arch(cc):
    return compat.architecture_for(cc)


@pytest.mark.parametrize("cc, cuda, supported", [
    ("3.7", "11.8", True), ("3.7", "12.0", False), ("3.5", "12.0", False),  # Kepler dropped by CUDA 12
    ("3.0", "10.2", True), ("3.0", "11.0", False),  # sm_30 dropped by CUDA 11
    ("5.2", "12.9", True), ("5.2", "13.0", False),  # Maxwell dropped by CUDA 13
    ("6.1", "12.9", True), ("6.0", "13.0", False),  # Pascal dropped by CUDA 13
    ("7.0", "12.9", True), ("7.0", "13.0", False),  # Volta dropped by CUDA 13
    ("7.5", "13.0", True),  # Turing is CUDA 13's floor
    ("8.6", "11.0", False), ("8.6", "11.1", True),
    ("9.0", "11.7", False), ("9.0", "11.8", True),
    ("10.0", "12.6", False), ("10.0", "12.8", True), ("12.0", "13.0", True),
])
def test_cuda_supports_architecture(cc, cuda, supported):
    assert compat.cuda_supports(arch(cc), Ver(cuda)) is supported


@pytest.mark.parametrize("cc, majors", [
    ("3.7", [7, 8, 9, 10, 11]), ("7.0", [9, 10, 11, 12]), ("7.5", [10, 11, 12, 13]), ("9.0", [11, 12, 13]),
    ("10.0", [12, 13]),
])
def test_cuda_majors(cc, majors):
    assert compat.cuda_majors(arch(cc)) == majors


@pytest.mark.parametrize("cc, driver, supported, words", [
    ("3.7", "470.256.02", True, None),
    ("3.7", "525.60.13", False, "R470 is the last driver branch for Kepler"),
    ("7.0", "580.65.06", True, None),
    ("7.0", "590.44.01", False, "R580 is the last driver branch for Volta"),
    ("6.1", "590.48.01", False, "R580 is the last driver branch for Pascal"),
    ("5.0", "595.45.04", False, "R580 is the last driver branch for Maxwell"),
    ("2.0", "418.87", False, "R390"),
    ("10.0", "565.57.01", False, "needs CUDA 12.8, i.e. a driver >= 570.26"),
    ("10.0", "570.26", True, None),
    ("9.0", "515.105.01", False, "520.61.05"),
    ("8.0", "450.36.06", True, None),
    ("7.5", "610.57.04", True, None),
])
def test_driver_supports_architecture(cc, driver, supported, words):
    ok, why = compat.driver_supports(arch(cc), Ver(driver))
    assert ok is supported
    if words:
        assert words in why


# --- branches and recommendations -------------------------------------------------------------------------

@pytest.mark.parametrize("branch, kind, eol", [
    (470, "lts", "2024-07"), (535, "lts", "2026-06"), (580, "lts", "2028-06"), (550, "production", "2025-04"),
    (570, "production", "2026-02"), (595, "production", "2027-03"), (575, "new-feature", "2026-06"),
    (610, "new-feature", "2026-08"),
])
def test_branch_table(branch, kind, eol):
    b = compat.tables().branches[branch]
    assert (b.type, b.end_of_life) == (kind, eol)


def test_branch_status_turns_at_the_end_of_the_month():
    b = compat.tables().branches[535]
    assert b.status(date(2026, 6, 30)) == "supported" and b.status(date(2026, 7, 1)) == "end-of-life"
    assert compat.tables().branches[590].status(TODAY) == "unknown"


def test_recommended_drivers_for_cuda_12_4():
    recs = compat.recommended_drivers(Ver("550.54.14"), today=TODAY)
    assert [(b.branch, str(b.latest_known)) for b in recs] == [(580, "580.178.04"), (595, "595.91.07")]
    earlier = compat.recommended_drivers(Ver("550.54.14"), today=date(2025, 1, 15))
    assert 550 in [b.branch for b in earlier] and 535 not in [b.branch for b in earlier]


def test_recommended_drivers_fall_back_to_an_end_of_life_branch_for_kepler():
    recs = compat.recommended_drivers(None, 470, today=TODAY)
    assert [str(b.latest_known) for b in recs] == ["470.256.02"]


def test_fix_names_a_driver_that_works():
    volta = compat.check_architecture(Ver("590.48.01"), arch("7.0"), "GPU V100")
    assert compat.fix_for([volta], Ver("590.48.01"), TODAY) == "use an R580 driver or older, e.g. 580.178.04 (R580 LTSB)"
    cuda = compat.check_cuda(Ver("535.129.03"), "12.4.1")
    image = compat.check_image(Ver("535.129.03"), "nvidia/cuda:12.8.0-base-ubuntu22.04", ["geforce"])
    assert compat.fix_for([cuda, image], Ver("535.129.03"), TODAY).startswith("use a driver >= 570.26, e.g. 580.178.04")


def test_fix_reports_a_conflict_no_driver_can_solve():
    kepler = compat.check_architecture(Ver("470.256.02"), arch("3.7"), "GPU K80")
    cuda = compat.check_cuda(Ver("470.256.02"), "12.4")
    assert "no single driver fits" in compat.fix_for([kepler, cuda], Ver("470.256.02"), TODAY)


def test_cuda_that_dropped_an_architecture_is_not_a_driver_problem():
    check = compat.check_cuda_architecture(arch("7.0"), Ver("13.0"), "CUDA 13.0", "V100")
    assert not check.ok and "CUDA 13.0 dropped Volta" in check.reason and check.fix == "use CUDA 12.9 or older on Volta GPUs"
    assert compat.check_cuda_architecture(arch("7.0"), Ver("12.4"), "CUDA 12.4", "V100") is None
    assert compat.check_cuda_architecture(arch("10.0"), Ver("12.4"), "CUDA 12.4", "B200").ok  # PTX JIT: a note only


# --- NVIDIA_REQUIRE_CUDA ---------------------------------------------------------------------------------

# Verbatim from gitlab.com/nvidia/container-images/cuda dist/12.2.2 (nvidia/cuda:12.2.2-*).
REQUIRE_12_2 = ("cuda>=12.2 brand=tesla,driver>=470,driver<471 brand=unknown,driver>=470,driver<471 "
                "brand=nvidia,driver>=470,driver<471 brand=nvidiartx,driver>=470,driver<471 "
                "brand=geforce,driver>=470,driver<471 brand=geforcertx,driver>=470,driver<471 "
                "brand=quadro,driver>=470,driver<471 brand=quadrortx,driver>=470,driver<471 "
                "brand=titan,driver>=470,driver<471 brand=titanrtx,driver>=470,driver<471 "
                "brand=tesla,driver>=525,driver<526 brand=unknown,driver>=525,driver<526 "
                "brand=nvidia,driver>=525,driver<526 brand=nvidiartx,driver>=525,driver<526 "
                "brand=geforce,driver>=525,driver<526 brand=geforcertx,driver>=525,driver<526 "
                "brand=quadro,driver>=525,driver<526 brand=quadrortx,driver>=525,driver<526 "
                "brand=titan,driver>=525,driver<526 brand=titanrtx,driver>=525,driver<526")


def test_parse_require_cuda_real_condition():
    req = compat.parse_require_cuda(REQUIRE_12_2)
    assert len(req.alternatives) == 21 and req.cuda_minimum == "12.2"
    assert req.alternatives[1] == (compat.Constraint("brand", "=", "tesla"), compat.Constraint("driver", ">=", "470"),
                                   compat.Constraint("driver", "<", "471"))
    assert req.evaluate(cuda="12.2", driver="535.129.03", brand="geforce") is True  # natively
    assert req.evaluate(cuda="12.0", driver="525.147.05", brand="tesla") is True  # forward-compat clause
    assert req.evaluate(cuda="12.0", driver="525.147.05", brand=None) is None  # depends on the brand
    assert req.evaluate(cuda="12.1", driver="530.30.02", brand="tesla") is False  # R530 not listed
    assert req.evaluate(cuda="11.4", driver="470.256.02", brand="geforce") is True


def test_the_shipped_12_2_2_condition_is_nvidias_text():
    assert compat.image_needs("nvidia/cuda:12.2.2-base-ubuntu22.04").requirement.text == REQUIRE_12_2


def test_parse_require_cuda_accepts_the_env_form():
    req = compat.parse_require_cuda('NVIDIA_REQUIRE_CUDA="cuda>=12.4 brand=tesla,driver>=535,driver<536"')
    assert req.cuda_minimum == "12.4" and len(req.alternatives) == 2


@pytest.mark.parametrize("text", ["cuda>>12", "brand>tesla", "foo=1", "cuda>=twelve", "", "cuda>=12.4,"])
def test_parse_require_cuda_rejects_malformed_terms(text):
    with pytest.raises(UsageError):
        compat.parse_require_cuda(text)


# --- images --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("ref, cuda", [
    ("nvidia/cuda:12.4.1-base-ubuntu22.04", "12.4.1"),
    ("nvcr.io/nvidia/cuda:13.0.2-base-ubuntu24.04", "13.0.2"),
    ("docker.io/nvidia/cuda:12.2.2-runtime-ubuntu22.04@sha256:" + "a" * 64, "12.2.2"),
    ("nvidia/cuda:11.8.0-cudnn8-runtime-ubuntu22.04", "11.8.0"),
])
def test_parse_image(ref, cuda):
    image = compat.parse_image(ref)
    assert image.is_nvidia_cuda and str(image.cuda) == cuda


@pytest.mark.parametrize("ref", ["nvidia/cuda", "nvidia/cuda:latest", "nvidia/cuda:base-ubuntu22.04", "::", ""])
def test_bad_nvidia_cuda_refs_are_usage_errors(ref):
    with pytest.raises(UsageError):
        compat.parse_image(ref)


def test_other_images_are_not_read():
    need = compat.image_needs("ubuntu:22.04")
    assert need.requirement is None and need.native_min is None


@pytest.mark.parametrize("image, minimum", [
    ("nvidia/cuda:12.4.1-base-ubuntu22.04", "550.54.14"),  # cuda>=12.4: any driver reporting 12.4
    ("nvidia/cuda:12.2.2-base-ubuntu22.04", "535.54.03"),
    ("nvidia/cuda:13.0.2-base-ubuntu24.04", "580.65.06"),
    ("nvidia/cuda:12.8.1-base-ubuntu22.04", "570.26"),
])
def test_image_native_minimum(image, minimum):
    assert str(compat.image_needs(image).native_min) == minimum


@pytest.mark.parametrize("image, driver, segment, ok, words", [
    ("nvidia/cuda:12.4.1-base-ubuntu22.04", "550.54.14", "geforce", True, "satisfied"),
    ("nvidia/cuda:12.4.1-base-ubuntu22.04", "535.129.03", "datacenter", True, "forward-compatibility clause"),
    ("nvidia/cuda:12.4.1-base-ubuntu22.04", "535.129.03", "geforce", False, "not support on GeForce"),
    ("nvidia/cuda:12.4.1-base-ubuntu22.04", "545.23.08", "datacenter", False, "unsatisfied condition: cuda>=12.4"),
    ("nvidia/cuda:12.4.0-base-ubuntu22.04", "535.129.03", "datacenter", False, "unsatisfied condition: cuda>=12.4"),
    ("nvidia/cuda:12.8.1-base-ubuntu22.04", "535.129.03", "geforce", False, "unsatisfied condition: cuda>=12.8"),
    ("nvidia/cuda:12.8.1-base-ubuntu22.04", "550.163.01", "datacenter", True, "forward-compatibility clause"),
    ("nvidia/cuda:13.0.2-base-ubuntu24.04", "580.65.06", "geforce", True, "satisfied"),
    ("nvidia/cuda:13.0.2-base-ubuntu24.04", "560.35.03", "datacenter", False, "unsatisfied condition: cuda>=13.0"),
])
def test_check_image(image, driver, segment, ok, words):
    check = compat.check_image(Ver(driver), image, [segment])
    assert check.ok is ok and words in check.reason, check.reason


def test_the_issues_example_message():
    check = compat.check_image(Ver("535.129.03"), "nvidia/cuda:12.4.0-base-ubuntu22.04", ["datacenter"])
    assert check.reason == ("driver 535.129.03 runs CUDA up to 12.2 natively; nvidia/cuda:12.4.0-base-ubuntu22.04 "
                            "fails with 'unsatisfied condition: cuda>=12.4'")
    assert compat.fix_for([check], Ver("535.129.03"), TODAY).startswith("use a driver >= 550.54.14")


# --- verify image ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("driver, image", [
    ("535.129.03", "nvidia/cuda:12.2.2-base-ubuntu22.04"),
    ("550.54.14", "nvidia/cuda:12.4.1-base-ubuntu22.04"),
    ("570.26", "nvidia/cuda:12.8.1-base-ubuntu22.04"),
    ("575.57.08", "nvidia/cuda:12.9.1-base-ubuntu22.04"),
    ("580.65.06", "nvidia/cuda:13.0.2-base-ubuntu24.04"),
    ("610.57.04", "nvidia/cuda:13.2.0-base-ubuntu24.04"),
    ("470.256.02", "nvidia/cuda:11.4.3-base-ubuntu20.04"),
    ("450.80.02", "nvidia/cuda:11.0.3-base-ubuntu20.04"),
])
def test_verify_image_for(driver, image):
    assert compat.verify_image_for(driver) == image


def test_verify_image_condition_holds_natively_for_every_known_release():
    for branch in compat.tables().branches.values():
        if branch.latest_known is None:
            continue
        image = compat.verify_image_for(branch.latest_known)
        need = compat.image_needs(image)
        assert need.native_min <= branch.latest_known, (branch.branch, image)


def test_no_verify_image_for_a_cuda_10_driver():
    with pytest.raises(compat.CompatError) as exc:
        compat.verify_image_for("418.87")
    assert "418.87" in exc.value.message and "450.36.06" in exc.value.fix


# --- loading and the schema check ---------------------------------------------------------------------------

def test_shipped_tables_load_and_every_row_has_a_source():
    t = compat.load_tables()
    assert len(t.releases) >= 70 and all(r.source for r in t.releases)
    assert all(a.source for a in t.architectures) and all(b.source for b in t.branches.values())


def test_data_dir_finds_the_tables():
    assert (compat.data_dir() / "compat_matrix.csv").is_file()


def test_data_dir_of_a_package_on_the_file_system_needs_no_importlib_resources():
    # the checkout's data/ (a wheel's gpunode/data/ is looked for first), found without importing importlib.resources
    # (~10 ms of imports, needed only for a package inside a zip file)
    import subprocess
    import sys
    code = ("import sys\nfrom gpunode.datatables import data_dir\nprint(data_dir())\n"
            "print('importlib.resources' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=REPO_DATA.parent).stdout.split("\n")
    assert out[:2] == [str(REPO_DATA.resolve()), "False"]


@pytest.fixture
def data_copy(tmp_path):
    target = tmp_path / "data"
    shutil.copytree(REPO_DATA, target)
    return target


def _corrupt(path: Path, needle: str, replacement: str) -> int:
    lines = path.read_text().splitlines(keepends=True)
    for number, line in enumerate(lines, 1):
        if needle in line:
            lines[number - 1] = line.replace(needle, replacement)
            path.write_text("".join(lines))
            return number
    raise AssertionError(f"{needle!r} not in {path}")


@pytest.mark.parametrize("name, needle, replacement, words", [
    ("compat_matrix.csv", "12.4.0,CUDA 12.4 GA,550.54.14", "12.4.0,CUDA 12.4 GA,55o.54.14",
     "column min_driver_linux: '55o.54.14' is not a driver version"),
    ("compat_matrix.csv", "550.54.15,https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/index.html (Table 3)",
     "550.54.15,", "column source is empty"),
    ("compat_matrix.csv", "12.4.1,CUDA 12.4 Update 1,", "12.4.0,CUDA 12.4 Update 1,", "duplicate cuda_version"),
    ("driver_branches.csv", "535,lts,2026-06", "535,lts,June 2026", "column end_of_life"),
    ("gpu_architectures.csv", "7.0,Volta,9.0,12.9,580,unsupported", "7.0,Volta,9.0,12.9,580,maybe",
     "column open_module"),
    ("gpus.csv", "2330,H100 SXM5 80GB", "2330,H100 SXM5, 80GB", "fields, expected 8"),
    ("gpus.csv", "2901,B200,B200,GB100 [B200],10.0", "2901,B200,B200,GB100 [B200],10.9",
     "compute capability 10.9 is not in data/gpu_architectures.csv"),
])
def test_malformed_row_names_file_and_line(data_copy, name, needle, replacement, words):
    line = _corrupt(data_copy / name, needle, replacement)
    with pytest.raises(compat.DataError) as exc:
        compat.load_tables(data_copy)
    assert f"data/{name} line {line}" in exc.value.message and words in exc.value.message, exc.value.message


def test_wrong_header_is_line_1(data_copy):
    _corrupt(data_copy / "cuda_minor_compat.csv", "cuda_major,", "major,")
    with pytest.raises(compat.DataError) as exc:
        compat.load_tables(data_copy)
    assert "data/cuda_minor_compat.csv line 1: expected the columns" in exc.value.message


def test_missing_table_is_a_clear_error(data_copy):
    (data_copy / "driver_branches.csv").unlink()
    with pytest.raises(compat.DataError) as exc:
        compat.load_tables(data_copy)
    assert "data/driver_branches.csv cannot be read" in exc.value.message


@pytest.mark.parametrize("segments, status", [
    ([], "conditional"),  # GPU unknown: the image's brand clauses decide
    (["datacenter"], "ok"),  # a data-center GPU meets the forward-compatibility clause
    (["geforce"], "blocked"),
])
def test_a_brand_dependent_image_is_conditional_not_ok(segments, status):
    check = compat.check_image(Ver("535.129.03"), "nvidia/cuda:12.4.1-base-ubuntu22.04", segments)
    assert check.status == status and check.to_dict()["status"] == status
    if status == "conditional":
        assert check.ok and "only on GPUs whose brand" in check.reason


def test_an_unchecked_image_is_conditional():
    check = compat.check_image(Ver("535.129.03"), "ubuntu:22.04")
    assert check.status == "conditional" and "was not checked" in check.reason

"""`gpunode compat` in each form, human and --json, and --cuda/--image on `plan`."""

from __future__ import annotations

import json
from datetime import date

import pytest
from typer.testing import CliRunner

from gpunode import compat, connection
from gpunode.cli import app
from tests.fakes.connection import FakeConnection, FakeNode

runner = CliRunner()


@pytest.fixture(autouse=True)
def fixed_today(monkeypatch):
    monkeypatch.setattr(compat, "_today", lambda: date(2026, 11, 21))


def run(*args: str):
    return runner.invoke(app, ["compat", *args])


def run_json(*args: str):
    result = run(*args, "--json")
    return result, json.loads(result.stdout)


def test_driver_human():
    result = run("--driver", "535.129.03")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "CUDA up to 12.2 (release 12.2.2)" in out
    assert "CUDA 12.3 to 12.9 (CUDA 12.x needs >= 525.60.13)" in out
    assert "PTX JIT" in out and "R535 (LTSB, end of life since 2026-06)" in out
    assert "R470 is the last driver branch for Kepler" in out
    assert "nvidia/cuda:12.2.2-base-ubuntu22.04" in out


def test_driver_json():
    result, data = run_json("--driver", "535.129.03")
    assert result.exit_code == 0 and data["cuda"] is None and data["checks"] == [] and data["status"] == "ok"
    d = data["driver"]
    assert (d["version"], d["branch"], d["branch_type"], d["branch_status"]) == ("535.129.03", 535, "lts", "end-of-life")
    assert (d["native_cuda"], d["native_cuda_release"]) == ("12.2", "12.2.2")
    assert d["minor_compat"] == [{"major": 12, "min_driver": "525.60.13", "cuda_range": ["12.3", "12.9"]}]
    assert any("PTX JIT" in x for x in d["minor_compat_limits"])
    archs = {a["architecture"]: a for a in d["architectures"]}
    assert archs["Hopper"]["supported"] and not archs["Kepler"]["supported"] and not archs["Blackwell"]["supported"]
    assert archs["Maxwell"]["compute_capabilities"] == ["5.0", "5.2"]
    assert d["verify_image"] == "nvidia/cuda:12.2.2-base-ubuntu22.04"


def test_seed_example_418_87():
    _, data = run_json("--driver", "418.87", "--cuda", "10.1")
    assert data["driver"]["native_cuda"] == "10.1" and data["driver"]["minor_compat"] == []
    assert data["cuda"]["native_min_driver"] == "418.39" and data["cuda"]["minor_compat_min_driver"] is None
    assert data["checks"][0]["status"] == "ok" and data["driver"]["verify_image"] is None


def test_cuda_human():
    result = run("--cuda", "12.4")
    assert result.exit_code == 0, result.output
    assert "driver >= 550.54.14" in result.stdout and "driver >= 525.60.13" in result.stdout
    assert "580.178.04 (R580 LTSB, until 2028-06)" in result.stdout


def test_cuda_json():
    _, data = run_json("--cuda", "12.4")
    c = data["cuda"]
    assert (c["version"], c["native_min_driver"], c["minor_compat_min_driver"]) == ("12.4", "550.54.14", "525.60.13")
    assert [r["version"] for r in c["releases"]] == ["12.4.0", "12.4.1"]
    assert [r["version"] for r in c["recommended_drivers"]] == ["580.178.04", "595.91.07"]
    assert "Kepler" not in [a["architecture"] for a in c["architectures"]]
    _, data13 = run_json("--cuda", "13.0")
    assert [a["architecture"] for a in data13["cuda"]["architectures"]][0] == "Turing"


def test_image_human_and_driver_verdict():
    result = run("--image", "nvidia/cuda:12.4.0-base-ubuntu22.04", "--driver", "535.129.03")
    assert result.exit_code == 1
    assert "unsatisfied condition: cuda>=12.4" in result.stdout
    assert "fix: use a driver >= 550.54.14, e.g. 580.178.04 (R580 LTSB)" in result.stdout


def test_image_json():
    result, data = run_json("--image", "nvidia/cuda:12.4.1-base-ubuntu22.04", "--driver", "535.129.03")
    i = data["image"]
    assert result.exit_code == 0 and i["cuda"] == "12.4.1" and i["require_cuda_recorded"] is True
    assert i["require_cuda"].startswith("cuda>=12.4 brand=tesla,driver>=470,driver<471 ")
    assert i["native_min_driver"] == "550.54.14" and i["forward_compat_branches"] == [470, 525, 535]
    assert i["satisfied"] is None  # depends on the GPU brand: no --gpu given
    assert "brand=tesla,driver>=535,driver<536" in i["satisfied_by"]
    _, native = run_json("--image", "nvidia/cuda:12.4.1-base-ubuntu22.04", "--driver", "550.54.15")
    assert native["image"]["satisfied"] is True and native["image"]["satisfied_by"][0] == "cuda>=12.4"


def test_image_with_a_geforce_gpu():
    result, data = run_json("--image", "nvidia/cuda:12.8.1-base-ubuntu22.04", "--driver", "535.129.03", "--gpu", "4090")
    assert result.exit_code == 1 and data["status"] == "blocked" and data["image"]["satisfied"] is False
    assert data["fix"].startswith("use a driver >= 570.26")


def test_other_image_is_explained_not_guessed():
    result, data = run_json("--image", "ubuntu:22.04")
    assert result.exit_code == 0 and data["image"]["require_cuda"] is None and data["image"]["satisfied"] is None
    assert "offline" in data["image"]["explanation"]
    assert "cannot read another image's NVIDIA_REQUIRE_CUDA offline" in run("--image", "ubuntu:22.04").stdout


def test_gpu_human():
    result = run("--gpu", "H100")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "Hopper" in out and "10de:2330" in out and "10de:2331" in out and "9.0" in out
    assert "majors 11, 12, 13" in out and "install open" in out


def test_gpu_json():
    _, data = run_json("--gpu", "V100", "--driver", "590.48.01")
    a = data["gpu"]["architectures"][0]
    assert (a["architecture"], a["cuda_majors"], a["last_driver_branch"]) == ("Volta", [9, 10, 11, 12], 580)
    assert a["kernel_module"]["flavour"] == "proprietary" and a["kernel_module"]["open_module"] == "unsupported"
    assert [b["branch"] for b in a["supported_branches"]][-1] == 580
    assert data["status"] == "blocked" and data["fix"].startswith("use an R580 driver or older")
    _, blackwell = run_json("--gpu", "10de:2901")
    b = blackwell["gpu"]["architectures"][0]
    assert (b["architecture"], b["min_driver"], b["kernel_module"]["open_module"]) == ("Blackwell", "570.26", "required")


@pytest.mark.parametrize("args, words", [
    (["--driver", "5x"], "--driver '5x' is not an NVIDIA driver version"),
    (["--cuda", "twelve"], "--cuda 'twelve' is not a CUDA version"),
    (["--cuda", "12.7"], "CUDA 12.7 is not a CUDA toolkit release"),
    (["--gpu", "H1000"], "close matches: H100"),
    (["--image", "nvidia/cuda:latest"], "does not start with a CUDA version"),
    ([], "needs at least one of --driver, --cuda, --image or --gpu"),
])
def test_bad_input_exits_2_with_a_clear_message(args, words):
    result = run(*args)
    assert result.exit_code == 2 and words in result.output and "Traceback" not in result.output


# --- `plan --cuda/--image` --------------------------------------------------------------------------------

@pytest.fixture
def h100_node(monkeypatch):
    node = FakeNode(tools={"update-initramfs", "modprobe"}, nvidia_version="535.129.03")
    node.add_gpu(0x2330)
    monkeypatch.setattr(connection, "open_connection", lambda spec: FakeConnection(node, name=spec.host or "local"))
    return node


def test_plan_runs_the_compat_step(h100_node):
    result = runner.invoke(app, ["plan", "--host", "n", "--json", "--only", "compat"])
    step = json.loads(result.stdout)["steps"][0]
    assert step["step"] == "compat" and step["status"] == "ok"
    assert "verify image: nvidia/cuda:12.2.2-base-ubuntu22.04" in step["notes"]


def test_plan_with_cuda_and_image_targets(h100_node):
    result = runner.invoke(app, ["plan", "--host", "n", "--json", "--only", "compat", "--cuda", "13.0"])
    step = json.loads(result.stdout)["steps"][0]
    assert result.exit_code == 1 and step["status"] == "blocked" and "580.65.06" in step["fix"]
    result = runner.invoke(app, ["plan", "--host", "n", "--only", "compat", "--image",
                                 "nvidia/cuda:12.4.0-base-ubuntu22.04"])
    assert result.exit_code == 1 and "unsatisfied condition: cuda>=12.4" in result.stdout


@pytest.mark.parametrize("args", [["--cuda", "twelve"], ["--image", "nvidia/cuda"]])
def test_plan_rejects_bad_targets_before_connecting(monkeypatch, args):
    monkeypatch.setattr(connection, "open_connection", lambda spec: pytest.fail("connected"))
    result = runner.invoke(app, ["plan", "--host", "n", *args])
    assert result.exit_code == 2 and "error:" in result.output


def test_gpu_name_as_nvidia_smi_prints_it():
    result, data = run_json("--gpu", "NVIDIA H100 80GB HBM3")
    assert result.exit_code == 0 and [d["name"] for d in data["gpu"]["devices"]] == ["H100 SXM5 80GB"]
    assert "unknown GPU" not in run("--gpu", "NVIDIA H100 80GB HBM3").output


def test_an_answer_that_depends_on_the_gpu_brand_is_conditional_not_ok():
    result, data = run_json("--image", "nvidia/cuda:12.4.1-base-ubuntu22.04", "--driver", "535.129.03")
    assert result.exit_code == 0
    assert data["status"] == "conditional" and data["checks"][0]["status"] == "conditional"
    assert "only on some GPU brands" in data["image"]["explanation"]
    human = " ".join(run("--image", "nvidia/cuda:12.4.1-base-ubuntu22.04", "--driver", "535.129.03").stdout.split())
    assert "conditional driver 535.129.03 runs CUDA up to 12.2 natively" in human
    assert " ok " not in human


def test_a_branch_is_answered_for_its_newest_known_release():
    newest = compat.tables().branches[535].latest_known
    result, data = run_json("--driver", "535")
    assert result.exit_code == 0, result.output
    assert data["driver"]["version"] == str(newest) and data["driver"]["branch_asked"] == 535
    human = run("--driver", "535")
    assert human.exit_code == 0
    assert human.stdout.splitlines()[0] == f"driver branch R535: answered for {newest}, its newest release gpunode knows"
    # a full version is not a branch question
    assert run_json("--driver", "535.129.03")[1]["driver"]["branch_asked"] is None


@pytest.mark.parametrize("driver", ["999.99.99", "999", "450", "537.10.01"])
def test_a_driver_gpunode_knows_nothing_of_is_bad_input_naming_the_known_branches(driver):
    result = run("--driver", driver)
    assert result.exit_code == 2 and "R" + driver.split(".")[0] in result.output
    known = [b for b, row in compat.tables().branches.items() if row.latest_known]
    assert all(str(b) in result.output for b in known)
    fix = next(line for line in result.output.splitlines() if line.strip().startswith("fix:"))
    assert fix.split("fix:", 1)[1].split("#")[0].split() == ["gpunode", "compat", "--driver", str(max(known))]


def test_a_release_newer_than_the_table_says_so():
    result, data = run_json("--driver", "535.999.01")
    assert result.exit_code == 0 and data["driver"]["beyond_latest_known"] is True
    assert "535.999.01 is newer than every R535 release gpunode knows" in compat_flat(run("--driver", "535.999.01"))
    assert run_json("--driver", "535.129.03")[1]["driver"]["beyond_latest_known"] is False


def compat_flat(result) -> str:
    return " ".join(result.stdout.split())


@pytest.mark.parametrize(("image", "cuda"), [("ghcr.io/acme/train:1.0-cuda12.4-ubuntu22.04", "12.4"),
                                             ("pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime", "12.1"),
                                             ("acme/app:cuda-12.8.0_cudnn9", "12.8.0")])
def test_an_image_tag_that_names_its_cuda_is_checked(image, cuda):
    series = ".".join(cuda.split(".")[:2])
    minimum = compat.series_min_driver(series)
    below = run_json("--image", image, "--driver", "525.60.13")
    assert below[0].exit_code == 1 and below[1]["image"]["cuda_from_tag_name"] is True
    assert below[1]["checks"][0]["status"] == "blocked" and below[1]["checks"][0]["min_driver"] == str(minimum)
    assert any("its tag names CUDA " + series in note for note in below[1]["checks"][0]["notes"])
    above = run_json("--image", image, "--driver", "580.178.04")
    assert above[0].exit_code == 0 and above[1]["checks"][0]["status"] == "ok"


def test_an_image_tag_without_a_cuda_word_stays_not_checked():
    for image in ("nvcr.io/nvidia/pytorch:24.01-py3", "acme/barracuda12.4:1.0", "acme/app:mycuda12.4"):
        result, data = run_json("--image", image, "--driver", "535.129.03")
        assert result.exit_code == 0 and data["checks"][0]["status"] == "conditional", image
        assert data["image"]["cuda_from_tag_name"] is False

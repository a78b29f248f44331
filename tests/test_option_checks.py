"""The checks of the pipeline options, below every front door (gpunode/option_checks.py): one message, the option
spelled as the caller spells it (the CLI's --flag, the library's name)."""

from __future__ import annotations

import pytest

from gpunode import option_checks
from gpunode.errors import UsageError
from gpunode.options import API, CLI


def _values(front: str, **given):
    return {**option_checks.defaults(front), **given}


@pytest.mark.parametrize(("given", "cli", "library"), [
    ({"kernel_module": "closed"}, "--kernel-module 'closed'", "kernel_module 'closed'"),
    ({"gpu_replicas": 99}, "--gpu-replicas 99 is out of range", "gpu_replicas 99 is out of range"),
    ({"mig_layout": "7x"}, "--mig-layout '7x'", "mig_layout '7x'"),
    ({"bake_kernel": "5.15.0-92-generic"}, "--kernel goes with --bake", "bake_kernel goes with bake"),
    ({"driver": "5x5"}, "--driver '5x5'", "driver '5x5'"),  # raised by gpunode/versions.py, spelled here
    ({"sha256": "abc"}, "--sha256 'abc'", "sha256 'abc'"),  # raised by gpunode/artifacts/request.py
    ({"engines": ["podman"]}, "--engine 'podman'", "engines 'podman'"),
    ({"driver_source": "conda"}, "--driver-source 'conda'", "driver_source 'conda'"),
    ({"driver_source": "packages", "driver": None}, "--driver-source packages needs", "driver_source packages needs"),
    ({"driver_source": "packages", "driver": "535.261.03", "sha256": "a" * 64}, "--sha256 is an option of the .run",
     "sha256 is an option of the .run"),
])
def test_one_message_spelled_per_front_door(given, cli, library):
    with pytest.raises(UsageError) as by_cli:
        option_checks.request(_values(CLI, **given))
    with pytest.raises(UsageError) as by_library:
        option_checks.request(_values(API, **given, reboot=False), lambda name: name)
    assert by_cli.value.message.startswith(cli), by_cli.value.message
    assert by_library.value.message.startswith(library), by_library.value.message
    assert "--" not in by_library.value.message.split(":")[0]


def test_an_alias_the_table_lists_is_accepted_and_a_value_outside_the_choices_is_not():
    chosen = option_checks.request(_values(CLI, engines=["cri-o", "docker"]))
    assert chosen.options.engines == ("cri-o", "docker")
    with pytest.raises(UsageError, match="--only 'bogus'|unknown step 'bogus'"):
        option_checks.request(_values(CLI, only=["bogus"]))


def test_driver_source_packages_takes_the_version_and_nothing_of_the_run():
    chosen = option_checks.request(_values(CLI, driver_source="Packages", driver="535.261.03", kernel_module="open"))
    assert (chosen.options.driver_source, chosen.options.driver, chosen.options.kernel_module) == \
        ("packages", "535.261.03", "open")
    assert chosen.options.local_installers == () and chosen.options.driver_run is None
    assert option_checks.request(_values(CLI, driver="535.129.03")).options.driver_source == "run"  # the default
    # without the driver step, no version is needed
    assert option_checks.request(_values(CLI, driver_source="packages", only=["toolkit"])).options.driver is None

"""Rules several sides read (gpunode/rules.py): which driver will be in place."""

from __future__ import annotations

from gpunode.rules import InPlace, driver_in_place
from gpunode.steps.outputs import DriverOutputs


def test_the_driver_step_decides_when_it_is_part_of_the_run():
    assert driver_in_place("535.1", "570.2", DriverOutputs("570.2", "--driver", changes=True)) == InPlace(
        "570.2", "--driver", True)
    assert driver_in_place("535.1", None, DriverOutputs("535.1", "loaded")) == InPlace("535.1", "driver step")
    assert driver_in_place("535.1", "570.2", DriverOutputs(None)) is None  # it does not know: nobody guesses


def test_without_the_driver_step_the_request_then_the_loaded_driver():
    assert driver_in_place("535.1", "570.2", None) == InPlace("570.2", "--driver")
    assert driver_in_place("535.1", None, None) == InPlace("535.1", "loaded")
    assert driver_in_place(None, None, None) is None

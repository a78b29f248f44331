"""--hold-kernel/--no-hold-kernel and --hold-driver/--no-hold-driver: tri-state options (absent: leave holds)."""

from __future__ import annotations

import inspect

from gpunode.cli import _params


def _params_of(*names: str) -> list[inspect.Parameter]:
    return [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d, annotation=a)
            for n, a, d in _params.PIPELINE if n in names]


def test_same_args_prints_the_word_for_the_value_given():
    params = _params_of("hold_kernel", "hold_driver")
    assert _params.same_args(params, {"hold_kernel": True, "hold_driver": False}) == ["--hold-kernel",
                                                                                       "--no-hold-driver"]
    assert _params.same_args(params, {"hold_kernel": None, "hold_driver": None}) == []


def test_the_cli_passes_the_three_states_to_options(monkeypatch):
    from gpunode.cli import _inputs

    base = {p: d for p, _, d in _params.PIPELINE}
    assert _inputs.pipeline_options(base, progress=False).hold_kernel is None
    chosen = _inputs.pipeline_options({**base, "hold_kernel": False, "hold_driver": True}, progress=False)
    assert (chosen.hold_kernel, chosen.hold_driver) == (False, True)

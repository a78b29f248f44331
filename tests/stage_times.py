"""Seconds per stage of the real-OS tier (tests/realos), printed at the end of pytest's report.

Filled by the tier's fixtures and tests in whichever process runs them: under pytest-xdist (README: the suite runs
on every core) that is a worker, which hands its table to the controller when it finishes (tests/conftest.py)."""

from __future__ import annotations

STAGE_TIMES: dict[str, float] = {}

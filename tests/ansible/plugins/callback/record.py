"""A test-only Ansible callback: every task result as one JSON line in $GPUNODE_TEST_RECORD (host, task, status
and the result), so the tests read structured results instead of parsing Ansible's screen output."""

from __future__ import annotations

import json
import os

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: record
type: aggregate
short_description: task results as JSON lines (gpunode tests)
description: Writes every task result to the file named by GPUNODE_TEST_RECORD.
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "record"
    CALLBACK_NEEDS_ENABLED = True

    def _write(self, status, result):
        line = {"host": result._host.get_name(), "task": result._task.get_name(), "action": result._task.action,
                "status": status, "result": result._result}
        with open(os.environ["GPUNODE_TEST_RECORD"], "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line, default=str) + "\n")

    def v2_runner_on_ok(self, result):
        self._write("ok", result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._write("failed", result)

    def v2_runner_on_unreachable(self, result):
        self._write("unreachable", result)

    def v2_runner_on_skipped(self, result):
        self._write("skipped", result)

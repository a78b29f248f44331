# Copyright: gpunode contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""gpunode.gpu.doctor: gpunode's read-only diagnosis of the task's host, returned as the fact gpunode_doctor."""

from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.gpunode.gpu.plugins.module_utils.specs import DOCTOR_SPEC
from ansible_collections.gpunode.gpu.plugins.plugin_utils.gpunode_bridge import (
    GPUNODE_IMPORT_ERROR,
    MISSING_GPUNODE,
    AnsibleNodeConnection,
    node_fixer,
    rewrite,
)

if GPUNODE_IMPORT_ERROR is None:
    from gpunode import api
    from gpunode.errors import ConnectError, GpunodeError


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        del tmp
        if GPUNODE_IMPORT_ERROR is not None:
            return {**result, "failed": True, "msg": MISSING_GPUNODE.format(GPUNODE_IMPORT_ERROR)}
        args = self.validate_argument_spec(argument_spec=DOCTOR_SPEC)[1]
        host = task_vars.get("inventory_hostname") or self._play_context.remote_addr
        conn = AnsibleNodeConnection(self, host)
        fixer = node_fixer(task_vars, host)
        try:
            document = rewrite(api.doctor(conn), task_vars, host)
        except ConnectError as exc:
            if conn.failure is not None:
                return {**result, "unreachable": True, "msg": exc.message}
            return {**result, "failed": True, "msg": exc.message, "fix": exc.fix and fixer(exc.fix)}
        except GpunodeError as exc:
            return {**result, "failed": True, "msg": exc.message, "fix": exc.fix and fixer(exc.fix),
                    "output": conn.output()}
        verdict = document["readiness"]
        result.update(
            changed=False,
            ansible_facts={"gpunode_doctor": document},
            ready=verdict["ready"],
            reboot_required=verdict["reboot_required"],
            reason=verdict["reason"],
            failed_checks=document["failures"],
            warned_checks=document["warnings"],
            summary=document["summary"],
        )
        if verdict["ready"]:
            result["msg"] = "ready: no check failed"
        else:
            first = next(c for c in document["checks"] if c["status"] == "fail")
            result["msg"] = f"not ready: {verdict['reason']}"
            result["fix"] = first["fix"]
            if args["fail_when_not_ready"]:
                result["failed"] = True
        return result

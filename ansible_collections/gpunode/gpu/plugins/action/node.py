# Copyright: gpunode contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""gpunode.gpu.node: gpunode's pipeline on the task's host, run from the controller through the task's connection.
Check mode is `gpunode plan`, otherwise `gpunode install` without reboots (reboot_required says when). With
state=absent: `gpunode uninstall` (check mode: `uninstall --dry-run`)."""

from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.gpunode.gpu.plugins.plugin_utils.gpunode_bridge import (
    GPUNODE_IMPORT_ERROR,
    MISSING_GPUNODE,
    AnsibleNodeConnection,
    fix_entry,
    node_args,
    node_fixer,
    rewrite,
)

if GPUNODE_IMPORT_ERROR is None:
    from gpunode import ansible_spec, api
    from gpunode.errors import ConnectError, GpunodeError

# what a step entry of the result keeps of gpunode's step report (file contents go to `diff` only)
_STEP_KEYS = ("step", "title", "result", "status", "reason", "fix", "error", "reboot_required", "notes", "backups")
_ACTION_KEYS = ("kind", "summary", "where", "commands", "details", "path")


def _steps(report):
    shown = []
    for step in report["steps"]:
        entry = {k: step.get(k) for k in _STEP_KEYS}
        entry["actions"] = [{k: a[k] for k in _ACTION_KEYS if k in a} for a in step["actions"]]
        shown.append(entry)
    return shown


def _diff(files):
    """FileDiff (gpunode/api.py) -> Ansible's diff entries; None before: created, None after: removed."""
    return [{"before_header": f.path if f.before is not None else "/dev/null",
             "after_header": f.path if f.after is not None else "/dev/null",
             "before": f.before or "", "after": f.after or ""} for f in files]


def _failure(data):
    """(msg, fix) of the first failed or blocked step, else of the run's own error."""
    for step in data["steps"]:
        if step["result"] in ("failed", "blocked"):
            return f"{step['step']}: {step['error'] or step['reason']}", step["fix"]
    return data.get("error") or f"gpunode ended {data['summary']['state']}", data.get("fix")


def _failed(result, msg, fix, fixes, **more):
    """A failed task: `msg` ends with the fix as Ansible users act on it (module arguments, tasks in YAML), `fix`
    is that text, `fixes` each fix with its tasks (gpunode_bridge.fix_tasks)."""
    return {**result, "failed": True, "msg": msg + (f"; fix: {fix}" if fix else ""), "fix": fix, "fixes": fixes,
            **more}


def _fixes(outcome, args):
    """The task result's `fixes`: each step that did not finish, with its fix's tasks (api.PipelineResult.fixes
    says which)."""
    found = {o.step: o.fix for o in outcome.report.outcomes}
    return [fix_entry(found[f["step"]], args, step=f["step"], result=f["result"]) for f in outcome.fixes()]


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
        # the option table's spec (gpunode/options.py); module_utils/specs.py is its copy for ansible-doc
        args = self.validate_argument_spec(argument_spec=ansible_spec.node_spec())[1]
        host = task_vars.get("inventory_hostname") or self._play_context.remote_addr
        check = bool(self._task.check_mode)
        absent = args.get("state") == "absent"
        values = {k: args.get(k) for k in ansible_spec.gpunode_options()}
        fixer, reach = node_fixer(task_vars, host), node_args(task_vars, host)

        def failed(exc, **more):
            return _failed(result, exc.message, exc.fix and fixer(exc.fix),
                           [fix_entry(exc.fix, reach)] if exc.fix else [], **more)
        try:
            chosen = api.uninstall_request(values) if absent else api.request(values)
        except GpunodeError as exc:
            return failed(exc)
        conn = AnsibleNodeConnection(self, host)
        try:
            if absent:
                outcome = api.uninstall(conn, chosen, dry_run=check)
            else:
                outcome = api.plan(conn, chosen) if check else api.install(conn, chosen)
        except ConnectError as exc:
            if conn.failure is not None:
                return {**result, "unreachable": True, "msg": exc.message}
            return failed(exc)
        except GpunodeError as exc:
            return failed(exc, output=conn.output())
        data = rewrite(outcome.to_dict(), task_vars, host)
        summary = data["summary"]
        result.update(
            changed=outcome.changed,
            changed_steps=outcome.changed_steps,
            mode=data["mode"],
            state=summary["state"],
            exit_code=outcome.report.exit_code,
            ready=summary["ready"],
            reboot_required=outcome.reboot_required,
            node=data["node"],
            steps=_steps(data),
            summary=summary,
            gpunode_version=data["gpunode_version"],
        )
        if absent:
            result["nothing_to_undo"] = summary["nothing_to_undo"]
        if self._task.diff:
            result["diff"] = _diff(outcome.file_diffs())
        if summary["state"] in ("failed", "blocked", "interrupted"):
            msg, fix = _failure(data)
            result.update(_failed(result, msg, fix, _fixes(outcome, reach), output=conn.output()))
        elif outcome.reboot_required:
            result["msg"] = ("a reboot is required before the remaining steps can run: reboot the host "
                             "(ansible.builtin.reboot), then run this task again")
        elif absent:
            result["msg"] = ("gpunode uninstall: nothing to undo" if summary["nothing_to_undo"] else
                             f"gpunode uninstall{' --dry-run' if check else ''}: "
                             + (", ".join(outcome.changed_steps) + (" undone" if not check else " would be undone")
                                if outcome.changed else summary["state"]))
        else:
            result["msg"] = f"gpunode {'plan' if check else 'install'}: {summary['state']}"
        return result

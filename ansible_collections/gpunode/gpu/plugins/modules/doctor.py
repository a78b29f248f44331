#!/usr/bin/python
# Copyright: gpunode contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: doctor
short_description: Diagnose a GPU host with gpunode doctor (read-only)
version_added: "0.1.0"
description:
  - Runs gpunode's doctor checks against the host (one batched read-only probe through the task's connection)
    and returns the document of C(gpunode doctor --json) as the fact C(gpunode_doctor), with its readiness verdict.
  - The work happens in the action plugin on the controller, which needs the C(gpunode) Python package; the host
    needs no Python.
author:
  - gpunode contributors (@gpunode)
options:
  fail_when_not_ready:
    description: Fail the task when a check fails (the host is not ready). By default only report it.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description: Read-only in both modes.
  diff_mode:
    support: none
    description: Changes nothing.
  platform:
    support: full
    platforms: posix
    description: Runs on the controller; the host needs a POSIX shell, no Python.
  facts:
    support: full
    description: Sets C(gpunode_doctor).
  action:
    support: full
    description: Implemented as an action plugin running on the controller.
  async:
    support: none
    description: Not supported.
requirements:
  - gpunode (Python package) on the controller
seealso:
  - module: gpunode.gpu.node
"""

EXAMPLES = r"""
- name: Diagnose
  gpunode.gpu.doctor:
  register: diagnosis

- name: Show what fails
  ansible.builtin.debug:
    msg: "{{ gpunode_doctor.failures }}"
  when: not diagnosis.ready
"""

RETURN = r"""
ready:
  description: No check failed (warnings do not make a host unready).
  returned: success
  type: bool
reboot_required:
  description: A warned or failed check is cleared by a reboot, or the host's packages asked for one.
  returned: success
  type: bool
reason:
  description: The first failing check and its evidence; null when ready.
  returned: success
  type: str
failed_checks:
  description: Ids of the failed checks.
  returned: success
  type: list
  elements: str
warned_checks:
  description: Ids of the checks that warned.
  returned: success
  type: list
  elements: str
summary:
  description: Count of checks per status (pass, warn, fail, skip).
  returned: success
  type: dict
ansible_facts:
  description: Facts set by the module.
  returned: success
  type: complex
  contains:
    gpunode_doctor:
      description: The C(gpunode doctor --json) document with C(readiness).
      type: dict
fix:
  description: The first failing check's fix; gpunode's own commands appear as module arguments.
  returned: when not ready
  type: str
output:
  description: When gpunode itself failed, the commands that failed on the host and the end of what they printed.
  returned: failure
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402 - after DOCUMENTATION, as Ansible modules go

from ansible_collections.gpunode.gpu.plugins.module_utils.specs import DOCTOR_SPEC, MUST_RUN_ON_CONTROLLER  # noqa: E402


def main():
    module = AnsibleModule(argument_spec=DOCTOR_SPEC, supports_check_mode=True)
    module.fail_json(msg=MUST_RUN_ON_CONTROLLER.format("doctor"))


if __name__ == "__main__":
    main()

#!/usr/bin/python
# Copyright: gpunode contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node
short_description: Turn a host with NVIDIA GPUs into a GPU container host with gpunode
version_added: "0.1.0"
description:
  - Runs gpunode's pipeline (nouveau, prerequisites, driver, compat, toolkit, runtime, fabricmanager,
    nodesettings, k8s) on the host, each step planned, applied, then planned again and required to be C(ok).
  - The work happens in the action plugin on the controller, which needs the C(gpunode) Python package. The host
    is reached only through the task's connection with POSIX shell commands; it needs no Python.
  - In check mode this is C(gpunode plan) and changes nothing; C(changed) is then what a real run would report.
  - It never reboots the host. When a step needs a reboot it returns RV(reboot_required=true) and stops before the
    steps that depend on it; reboot with M(ansible.builtin.reboot) and run the task again.
  - Use C(become) (or connect as root); gpunode then adds no sudo of its own.
  - Driver installers named by O(driver), O(driver_run) or a URL are downloaded and checked on the controller,
    then uploaded through the connection.
  - With O(state=absent) it runs C(gpunode uninstall) instead, which undoes what gpunode installed on the host
    (files, packages, units, the driver), from the host's journal, in the reverse of the pipeline's order. In check
    mode this is C(gpunode uninstall --dry-run). A host with nothing left to undo is unchanged.
author:
  - gpunode contributors (@gpunode)
options:
  state:
    description:
      - V(present) makes the host a GPU container host (C(gpunode install)).
      - V(absent) undoes what gpunode installed (C(gpunode uninstall)). It takes only O(only), O(lock_timeout) and
        O(stop_gpu_services); any other option given a value fails the task. The build prerequisites (gcc, make,
        dkms, headers) are kept unless O(only) names C(prerequisites).
    type: str
    choices: [present, absent]
    default: present
  only:
    description:
      - Run only these steps (pipeline order is kept).
      - With O(state=absent), undo only these steps.
    type: list
    elements: str
    choices: [nouveau, prerequisites, driver, compat, toolkit, runtime, fabricmanager, nodesettings, k8s]
  skip:
    description: Skip these steps.
    type: list
    elements: str
    choices: [nouveau, prerequisites, driver, compat, toolkit, runtime, fabricmanager, nodesettings, k8s]
  driver:
    description: NVIDIA driver version to install, for example C(535.129.03) (gpunode's C(--driver)).
    type: str
  driver_source:
    description:
      - Where the driver comes from (gpunode's C(--driver-source)). C(run) is NVIDIA's C(.run) installer;
        C(packages) the distribution's or NVIDIA's repository packages at exactly O(driver), held against upgrades.
    type: str
    default: run
    choices: [run, packages]
  driver_run:
    description: A C(.run) installer on the controller, or its URL, instead of NVIDIA's download.
    type: str
  sha256:
    description: Expected SHA-256 of the C(.run) installer.
    type: str
  kernel_module:
    description: Kernel module flavour. Default chosen from the GPUs.
    type: str
    choices: [open, proprietary]
  module_signing_key:
    description: Secure Boot; path on the host of the private key that signs the kernel module.
    type: str
  module_signing_cert:
    description: Secure Boot; path on the host of its DER certificate. Goes with O(module_signing_key).
    type: str
  cache_dir:
    description: Download cache on the controller. Default C($GPUNODE_CACHE_DIR) or C(~/.cache/gpunode/drivers).
    type: path
  cuda:
    description: CUDA version the host must run, for example C(12.4) (checked by the compat step).
    type: str
  image:
    description: Container image the host must run, for example C(nvidia/cuda:12.4.1-base-ubuntu22.04).
    type: str
  lock_timeout:
    description: Seconds to wait for a lock another process holds (apt/dpkg or dnf, or another gpunode run's node lock); 0 does not wait.
    type: float
    default: 600.0
  toolkit_version:
    description: Pin the NVIDIA Container Toolkit, for example C(1.17.8-1).
    type: str
  toolkit_packages:
    description: Offline; toolkit C(.deb)/C(.rpm) files on the controller to upload and install.
    type: list
    elements: path
  set_as_default:
    description: Make nvidia the default runtime of every configured container engine.
    type: bool
    default: false
  k8s:
    description: Kubernetes node; nvidia becomes the default runtime of containerd / CRI-O and the k8s step runs.
    type: bool
    default: false
  engines:
    description: Configure only these container engines. Default every engine found.
    type: list
    elements: str
    choices: [docker, containerd, crio]
  kubeconfig:
    description: Kubernetes; absolute path on the host of a kubeconfig for its kubectl.
    type: str
  gpu_replicas:
    description: Kubernetes time-slicing; each GPU is advertised this many times (1 to 64).
    type: int
    default: 1
  mps:
    description: Kubernetes; run NVIDIA's MPS control daemon as a systemd unit.
    type: bool
    default: false
  mps_thread_percentage:
    description: With O(mps=true), the share of each GPU's SMs an MPS client may use (1 to 100).
    type: int
  mig_layout:
    description: Kubernetes; MIG GPU instance profiles for every GPU, for example C([1g.10gb, 1g.10gb]).
    type: list
    elements: str
  stop_gpu_services:
    description:
      - Driver upgrade; stop the GPU services that hold the loaded driver (persistenced, fabric manager, DCGM,
        MPS), unload it, install, and start them again. Other processes holding the GPU are never stopped.
    type: bool
    default: false
  hold_kernel:
    description:
      - V(true) holds the kernel metapackages (C(apt-mark hold), C(dnf versionlock)) so upgrades cannot bring a
        kernel the driver is not built for; V(false) releases them.
      - Unset (the default) leaves the holds as they are.
    type: bool
  hold_driver:
    description:
      - V(true) holds the driver's packages, V(false) releases them (a C(.run) driver has none).
      - Unset (the default) leaves the holds as they are.
    type: bool
  bake:
    description:
      - Image build (for example Packer's ansible provisioner against the build VM); install the driver built for
        O(bake_kernel) without a GPU, load nothing, and leave C(/var/lib/gpunode/baked.json) for the boot-time
        install. Runs the steps an image can take (nouveau, prerequisites, driver, compat, toolkit, runtime), then
        the bake marker. Needs O(driver) or O(driver_run).
    type: bool
    default: false
  bake_kernel:
    description: With O(bake=true), the kernel release the image boots. Default the newest installed kernel.
    type: str
attributes:
  check_mode:
    support: full
    description: Check mode is C(gpunode plan); C(changed) predicts the real run's.
  diff_mode:
    support: full
    description: The files the run writes (or would write), before and after.
  platform:
    support: full
    platforms: posix
    description: Runs on the controller; the host needs a POSIX shell, no Python.
  action:
    support: full
    description: Implemented as an action plugin running on the controller.
  async:
    support: none
    description: Not supported.
requirements:
  - gpunode (Python package) on the controller
notes:
  - Option values are checked by gpunode's own checks; a bad value fails the task with the problem and its fix.
  - Per-command timeouts of gpunode are not enforced through Ansible connections; use the task's C(timeout).
seealso:
  - module: gpunode.gpu.doctor
  - module: ansible.builtin.reboot
"""

EXAMPLES = r"""
- name: Make the GPU hosts GPU container hosts
  hosts: gpu
  gather_facts: false
  become: true
  tasks:
    - name: Converge
      gpunode.gpu.node:
        driver: 550.127.05
      register: gpu

    - name: Reboot when gpunode asks
      ansible.builtin.reboot:
      when: gpu.reboot_required

- name: Only the container toolkit and runtimes, docker only
  gpunode.gpu.node:
    only: [toolkit, runtime]
    engines: [docker]

- name: Upgrade the driver, stopping persistenced and fabric manager for it, and hold the kernel
  gpunode.gpu.node:
    driver: 570.172.08
    stop_gpu_services: true
    hold_kernel: true

- name: Undo what gpunode installed
  gpunode.gpu.node:
    state: absent
"""

RETURN = r"""
changed:
  description: True exactly when a step changed something on the host (check mode, would change).
  returned: always
  type: bool
changed_steps:
  description: The steps that changed (or would change) something.
  returned: success
  type: list
  elements: str
  sample: [toolkit, runtime]
state:
  description:
    - Where the host stands. install, V(ready), V(reboot-pending), V(blocked) or V(failed).
    - Check mode, V(ready) (nothing to change), V(changes-pending) or V(blocked).
    - With O(state=absent) the same words describe the uninstall (V(ready) means done).
  returned: success
  type: str
  sample: ready
exit_code:
  description: gpunode's exit code for this run, 0 done, 1 failed or blocked, 3 a reboot is needed first.
  returned: success
  type: int
ready:
  description: Every step done and an NVIDIA driver loaded.
  returned: success
  type: bool
reboot_required:
  description: A step needs a reboot before it and the steps after it can finish. Reboot, then run again.
  returned: success
  type: bool
mode:
  description: V(plan) in check mode, else V(install); with O(state=absent), V(uninstall-dry-run) in check mode, else V(uninstall).
  returned: success
  type: str
node:
  description: What gpunode found on the host (OS, kernel, GPUs, driver).
  returned: success
  type: dict
steps:
  description: One entry per step, in pipeline order.
  returned: success
  type: list
  elements: dict
  contains:
    step:
      description: Step name.
      type: str
    result:
      description: ok, changed, planned, reboot-pending, blocked, unknown, failed or not-run.
      type: str
    reason:
      description: Why, in words.
      type: str
    fix:
      description: What to do when the step is blocked or failed.
      type: str
    actions:
      description: What the step does (or would do), with the exact commands.
      type: list
      elements: dict
summary:
  description: Counts of step results, state, ready, reboot_required.
  returned: success
  type: dict
nothing_to_undo:
  description: With O(state=absent), the host's journal records nothing gpunode has not undone already.
  returned: success and O(state=absent)
  type: bool
msg:
  description: The reason of the first failed or blocked step and its fix (as RV(fix)), or the run's state.
  returned: always
  type: str
fix:
  description:
    - gpunode's fix for the failure (also at the end of RV(msg)). gpunode's own commands appear as this module's
      arguments (for example C(gpunode.gpu.node) with O(only=[toolkit])), a command for the host as the task that
      runs it, one line of YAML (C(ansible.builtin.command) or C(ansible.builtin.shell) with C(become=true)).
  returned: failure
  type: str
fixes:
  description:
    - Each fix of the failure as data. C(fix) is its text as in RV(fix); C(tasks) are its commands as tasks to paste
      into a play (C(gpunode.gpu.node) with its arguments, C(ansible.builtin.command) or C(ansible.builtin.shell)
      with C(become) for a command on the host, C(delegate_to=localhost) for what runs on the controller);
      C(step) and C(result) name the step, when the fix is a step's.
  returned: failure
  type: list
  elements: dict
output:
  description:
    - The commands that failed on the host (else the last ones run), each with its exit status and the end of what
      it printed; what a fix that says to see the output refers to.
  returned: failure
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402 - after DOCUMENTATION, as Ansible modules go

from ansible_collections.gpunode.gpu.plugins.module_utils.specs import MUST_RUN_ON_CONTROLLER, NODE_SPEC  # noqa: E402


def main():
    module = AnsibleModule(argument_spec=NODE_SPEC, supports_check_mode=True)
    module.fail_json(msg=MUST_RUN_ON_CONTROLLER.format("node"))


if __name__ == "__main__":
    main()

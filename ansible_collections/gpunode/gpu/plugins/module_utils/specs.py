# Copyright: gpunode contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The argument specs of gpunode.gpu.node and gpunode.gpu.doctor, shared by the modules (documentation,
ansible-doc, ansible-test) and the action plugins that do the work on the controller."""

from __future__ import annotations

# BEGIN NODE_SPEC: written by `python -m gpunode.ansible_spec` from gpunode/options.py; do not edit
NODE_SPEC = dict(
    state=dict(type='str', choices=['present', 'absent'], default='present'),
    only=dict(
        type='list',
        elements='str',
        choices=['nouveau', 'prerequisites', 'driver', 'compat', 'toolkit', 'runtime', 'fabricmanager', 'nodesettings', 'k8s'],
    ),
    skip=dict(
        type='list',
        elements='str',
        choices=['nouveau', 'prerequisites', 'driver', 'compat', 'toolkit', 'runtime', 'fabricmanager', 'nodesettings', 'k8s'],
    ),
    driver=dict(type='str'),
    cuda=dict(type='str'),
    image=dict(type='str'),
    driver_source=dict(type='str', choices=['run', 'packages'], default='run'),
    driver_run=dict(type='str'),
    sha256=dict(type='str'),
    kernel_module=dict(type='str', choices=['open', 'proprietary']),
    module_signing_key=dict(type='str', no_log=False),
    module_signing_cert=dict(type='str'),
    cache_dir=dict(type='path'),
    lock_timeout=dict(type='float', default=600.0),
    toolkit_version=dict(type='str'),
    toolkit_packages=dict(type='list', elements='path'),
    set_as_default=dict(type='bool', default=False),
    k8s=dict(type='bool', default=False),
    engines=dict(type='list', elements='str', choices=['docker', 'containerd', 'crio']),
    kubeconfig=dict(type='str'),
    gpu_replicas=dict(type='int', default=1),
    mps=dict(type='bool', default=False),
    mps_thread_percentage=dict(type='int'),
    mig_layout=dict(type='list', elements='str'),
    bake=dict(type='bool', default=False),
    bake_kernel=dict(type='str'),
    hold_kernel=dict(type='bool'),
    hold_driver=dict(type='bool'),
    stop_gpu_services=dict(type='bool', default=False),
)
# END NODE_SPEC
# the options of NODE_SPEC that are gpunode's (gpunode/options.py OPTION_TABLE); `state` is the module's own
GPUNODE_OPTIONS = [name for name in NODE_SPEC if name != "state"]

DOCTOR_SPEC = dict(
    fail_when_not_ready=dict(type="bool", default=False),
)

MUST_RUN_ON_CONTROLLER = (
    "this module runs through its action plugin on the controller (gpunode.gpu.{0}), never on the node; "
    "call it by its full name gpunode.gpu.{0} in a play, not with ansible -m on an unpacked copy"
)

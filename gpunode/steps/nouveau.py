"""Step 1: keep nouveau off the GPUs.

The NVIDIA installer refuses to run while nouveau is loaded, and nvidia.ko cannot bind a GPU nouveau owns.
A modprobe.d blacklist stops it loading from the root filesystem; the initramfs must be rebuilt so early
boot honours it too; a nouveau that is already loaded only goes away with a reboot.
"""

from __future__ import annotations

from gpunode import bake, rules
from gpunode.facts import Facts
from gpunode.options import Options
from gpunode.plan import Action, Earlier, Reboot, RunCommand, StepPlan, WriteFile, blocked, change, ok
from gpunode.steps.base import Step

NAME = "nouveau"
TITLE = "Blacklist nouveau"
PATH = rules.NOUVEAU_BLACKLIST
DIRECTIVES = ("blacklist nouveau", "options nouveau modeset=0")
HEADER = "# Written by gpunode: nouveau must not claim the NVIDIA GPUs (the NVIDIA driver replaces it).\n"


def initramfs_command(facts: Facts) -> tuple[str, ...] | None:
    """The distro's own tool: update-initramfs on Debian/Ubuntu, dracut on the RHEL family and SUSE."""
    family = facts.os.family
    if family == "debian":
        return ("update-initramfs", "-u")
    if family in ("rhel", "suse"):
        return ("dracut", "-f")
    for tool, argv in (("update-initramfs", ("update-initramfs", "-u")), ("dracut", ("dracut", "-f")),
                       ("mkinitcpio", ("mkinitcpio", "-P"))):
        if facts.has(tool):
            return argv
    return None


def desired_content(current: str | None) -> str:
    """Our file with both directives; lines a user already keeps in it stay, in their order."""
    if not current:
        return HEADER + "\n".join(DIRECTIVES) + "\n"
    present = {" ".join(line.split()) for line in current.splitlines()}
    missing = [d for d in DIRECTIVES if d not in present]
    return current + ("" if current.endswith("\n") else "\n") + "".join(d + "\n" for d in missing)


def plan(facts: Facts, options: Options, earlier: Earlier | None = None) -> StepPlan:
    block = facts.nouveau_block()
    loaded = facts.module_loaded("nouveau")
    if not facts.gpus and not loaded and not options.bake:  # a bake blacklists it for the GPU the image boots with
        return ok(NAME, "no NVIDIA GPU on this node: nothing for nouveau to claim")

    rebuild = initramfs_command(facts)
    if options.bake:
        rebuild = _for_kernel(rebuild, bake.target_kernel(facts, options))
    actions: list[Action] = []
    if not block.effective:
        if rebuild is None:
            return blocked(NAME, f"no known initramfs tool on {facts.os}",
                           "install update-initramfs (initramfs-tools) or dracut, then run again")
        current = facts.modprobe_files.get(PATH)
        actions.append(WriteFile(f"blacklist nouveau in {PATH}", path=PATH, before=current,
                                 after=desired_content(current)))
        actions.append(RunCommand("rebuild the initramfs so early boot honours the blacklist", rebuild,
                                  timeout=900))
        reason = "nouveau is not blacklisted"
    else:
        newest_block = max((facts.mtimes.get(s.split(":", 1)[0], 0) for s in block.sources), default=0)
        stale = facts.initramfs_mtime is not None and facts.initramfs_mtime < newest_block
        if options.bake:  # the image's kernel: its initramfs must hold the blacklist, however old the running one's
            image = bake.initramfs_mtime(facts, bake.target_kernel(facts, options) or facts.kernel)
            stale = image is None or image < newest_block
        if stale and rebuild is not None:
            actions.append(RunCommand("rebuild the initramfs: it is older than the blacklist", rebuild, timeout=900))
        reason = "nouveau is blacklisted (" + "; ".join(block.sources) + ")"
        if not actions and not loaded:
            return ok(NAME, reason + " and not loaded")
        if stale:
            reason += ", but the initramfs predates the blacklist"
    if loaded:
        actions.append(Reboot("reboot: nouveau is loaded and only a reboot unloads it"))
        reason += "; nouveau is loaded now, so a reboot is required"
    return change(NAME, reason, actions)


def _for_kernel(argv: tuple[str, ...] | None, kernel: str | None) -> tuple[str, ...] | None:
    """--bake: the initramfs of the image's kernel (mkinitcpio -P already rebuilds every preset)."""
    if argv is None or kernel is None:
        return argv
    return {"update-initramfs": (*argv, "-k", kernel), "dracut": (*argv, "--kver", kernel)}.get(argv[0], argv)


STEP = Step(NAME, TITLE, plan)

"""Secure Boot: how to get the NVIDIA module signed, written once for every place that says so (the driver
step, doctor, explain). Each fix is complete as printed: the key pair gets fixed paths on the node, the
commands that make and enroll it are spelled out, and the gpunode command carries the version when it is known.
"""

from __future__ import annotations

from gpunode import fixes

KEY = "/root/gpunode-mok.priv"  # on the node; --module-signing-key
CERT = "/root/gpunode-mok.der"  # on the node; --module-signing-cert (DER, what mokutil enrolls)

MAKE_AND_ENROLL = fixes.on_node(f"sudo openssl req -new -x509 -newkey rsa:2048 -nodes -days 36500 -subj '/CN=gpunode "
                                f"module signing/' -keyout {KEY} -outform DER -out {CERT} && sudo mokutil --import {CERT}")
FLAGS = f"--module-signing-key {KEY} --module-signing-cert {CERT}"


def install_command(version: str | None) -> fixes.Fix:
    if version:
        return "`" + fixes.gpunode("install", driver=version, module_signing_key=KEY, module_signing_cert=CERT) + "`"
    return "the same " + fixes.gpunode("install") + f" command with `{FLAGS}` added"


def fix(version: str | None, os_id: str = "") -> fixes.Fix:
    """Every way out when Secure Boot would refuse an unsigned module; Ubuntu's signed packages only on Ubuntu."""
    text = ("choose one: (1) make a key pair on the node and enroll it: `" + MAKE_AND_ENROLL
            + "` (mokutil asks for a one-time password; confirm the key in MOK Manager at the next boot), then run "
            + install_command(version) + "; (2) disable Secure Boot in the firmware")
    if os_id == "ubuntu" and version:
        branch = version.split(".", 1)[0]
        text += ("; (3) use Ubuntu's signed driver packages instead of --driver: `"
                 + fixes.on_node(f"sudo ubuntu-drivers install --gpgpu nvidia:{branch}-server") + "`")
    return text


# The certificate DKMS signs what it builds with, which Secure Boot needs enrolled: dkms's own default
# /var/lib/dkms/mok.pub, made on its first build (github.com/dell/dkms README "Module signing"; Debian's dkms 3,
# seen on the real-OS tier: "Public certificate (MOK): /var/lib/dkms/mok.pub"); Ubuntu's dkms is configured to
# sign with shim-signed's MOK instead (mok_certificate=/var/lib/shim-signed/mok/MOK.der in
# /etc/dkms/framework.conf, made by update-secureboot-policy; https://wiki.ubuntu.com/UEFI/SecureBoot/DKMS).
DKMS_CERT = "/var/lib/dkms/mok.pub"
UBUNTU_DKMS_CERT = "/var/lib/shim-signed/mok/MOK.der"


def dkms_cert(os_id: str) -> str:
    return UBUNTU_DKMS_CERT if os_id == "ubuntu" else DKMS_CERT


def dkms_note(os_id: str) -> fixes.Fix:
    """What a DKMS build under Secure Boot needs: its signing certificate enrolled, with the command."""
    cert = dkms_cert(os_id)
    return (f"Secure Boot is on: DKMS signs what it builds with its own key ({cert}), which must be enrolled "
            "(confirmed in MOK Manager at the next boot) or the kernel refuses the module: `"
            + fixes.on_node(f"sudo mokutil --import {cert}") + "`")


# NVIDIA builds and signs the modules of its own repositories' prebuilt packages with its own key, not the
# distribution's: github.com/NVIDIA/yum-packaging-precompiled-kmod/issues/67 (RHEL's precompiled kmod,
# `modinfo -F signer` says NVIDIA, the module is refused under Secure Boot until that key is enrolled). SUSE's own
# build, nvidia-open-driver-G06-signed-kmp, is the one signed by SUSE's key (openSUSE release notes, "Secure Boot:
# signed Kernel Module Packages"; boo#1182641).
def prebuilt_note(package: str) -> str:
    """Secure Boot and a module NVIDIA built and signed (a SUSE KMP from NVIDIA's repository)."""
    return (f"Secure Boot is on: {package} carries a module NVIDIA signed with its own key, not the distribution's; "
            "the kernel refuses it until NVIDIA's key is enrolled in MOK (after the install `modinfo -F signer "
            "nvidia` names the signer), or use the distribution's own signed build (on SUSE "
            "nvidia-open-driver-G06-signed-kmp)")

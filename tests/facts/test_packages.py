"""Installed packages, holds, unit states and version order, from probe output."""

import shutil

import pytest

from gpunode.facts.packages import (
    compare_versions,
    held_packages,
    parse_packages,
    parse_units,
    parse_versionlock,
    parse_zypp_locks,
    pin_spec,
    unit,
    upstream_version,
)

DPKG = (
    "ii \tnvidia-container-toolkit\t1.17.8-1\n"
    "hi \tnvidia-fabricmanager-535\t535.129.03-1\n"
    "rc \tnvidia-fabricmanager-525\t525.147.05-1\n"  # removed, config files left: not installed
    "un \tnvidia-docker2\t\n"
    "ii \tlibnvidia-container1:amd64\t1.17.8-1\n"
    "garbage line\n"
)


def test_dpkg_status_installed_and_held():
    pkgs = parse_packages(DPKG)
    assert set(pkgs) == {"nvidia-container-toolkit", "nvidia-fabricmanager-535", "libnvidia-container1"}
    assert pkgs["nvidia-fabricmanager-535"].held and not pkgs["nvidia-container-toolkit"].held
    assert pkgs["nvidia-fabricmanager-535"].upstream == "535.129.03"
    assert held_packages(pkgs, {}) == {"nvidia-fabricmanager-535"}


def test_a_package_installed_for_two_architectures_is_held_when_either_is():
    # dpkg-query prints one line per architecture under the same ${Package} name, in either order
    for lines in (("hi ", "ii "), ("ii ", "hi ")):
        text = "".join(f"{status}\tlibnvidia-compute-535\t535.129.03-0ubuntu1\n" for status in lines)
        assert parse_packages(text)["libnvidia-compute-535"].held
    both = parse_packages("ii \tlibnvidia-compute-535\t535.129.03-0ubuntu1\nii \tlibnvidia-compute-535\t"
                          "535.129.03-0ubuntu1\n")
    assert not both["libnvidia-compute-535"].held
    # a line left by a removed architecture (config files only) changes nothing
    gone = parse_packages("hi \tlibnvidia-compute-535\t535.129.03-0ubuntu1\nrc \tlibnvidia-compute-535\t"
                          "535.104.05-0ubuntu1\n")["libnvidia-compute-535"]
    assert gone.held and gone.version == "535.129.03-0ubuntu1"


def test_rpm_lines_and_versionlock():
    pkgs = parse_packages("ii \tnvidia-fabric-manager\t535.129.03-1\nii \tpython3-dnf-plugin-versionlock\t4.3.0-13.el9\n")
    assert pkgs["nvidia-fabric-manager"].version == "535.129.03-1"
    lock = "# Added lock on Tue\nnvidia-fabric-manager-0:535.129.03-1.*\n!kernel-0:5.14.0-1.*\nfoo-1.2-3\n"
    assert parse_versionlock(lock) == {"nvidia-fabric-manager": "535.129.03-1", "foo": "1.2-3"}
    held = held_packages(pkgs, {"/etc/dnf/plugins/versionlock.list": lock})
    assert "nvidia-fabric-manager" in held and "kernel" not in held


def test_zypper_locks():
    text = "type: package\nmatch_exact: 1\nsolvable_name: nvidia-fabric-manager\n\ntype: package\nsolvable_name: x\n"
    assert parse_zypp_locks(text) == {"nvidia-fabric-manager", "x"}


def test_units_old_and_new_systemd():
    units = parse_units("docker.service\tactive\tenabled\ncrio.service\tinactive\t\n"
                        "containerd.service\tinactive\tnot-found\nnvidia-fabricmanager.service\tfailed\tmasked\n")
    assert units["docker.service"].is_active and units["docker.service"].exists
    assert not units["crio.service"].exists and not units["containerd.service"].exists
    assert units["nvidia-fabricmanager.service"].masked and not units["nvidia-fabricmanager.service"].is_active
    assert unit(units, "docker").is_enabled and not unit(units, "podman").exists


def test_versions():
    assert upstream_version("1:535.261.03-0ubuntu2") == "535.261.03"
    assert upstream_version("1.17.8") == "1.17.8"
    assert compare_versions("1.17.8-1", "1.18.0-1") < 0
    assert compare_versions("1.18.0-1", "1.18.0~rc.1-1") > 0  # ~ sorts before the release
    assert compare_versions("1:1.0-1", "2.0-1") > 0
    assert compare_versions("535.129.03-1", "535.129.03-1") == 0
    assert compare_versions("550.54.15-1", "535.183.01-1") > 0
    assert pin_spec("apt", "nvidia-fabricmanager-535", "535.129.03-1") == "nvidia-fabricmanager-535=535.129.03-1"
    assert pin_spec("dnf", "nvidia-fabric-manager", "535.129.03-1") == "nvidia-fabric-manager-535.129.03-1"


# a fake systemctl's answer to `list-units --all --plain --no-legend --full UNITS`: every unit in memory, loaded
LIST_ALL = ('if [ "$1" = list-units ]; then shift 5; for u; do echo "$u loaded active running $u"; done; exit 0; fi\n')


def _systemctl_show(tmp_path, output: str, shell: str):
    import subprocess

    from gpunode.facts.packages import unit_states

    tool = tmp_path / "systemctl"
    # list-units: every unit named is in systemd's memory, loaded (so each is asked of `show`)
    tool.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/calls\n{LIST_ALL}printf '%s' '{output}'\n")
    tool.chmod(0o755)
    snippet = unit_states("docker.service", "containerd.service", "crio.service", "x.timer")
    out = subprocess.run([shell, "-c", snippet], capture_output=True, text=True, check=True,
                         env={"PATH": f"{tmp_path}:/usr/bin:/bin"}).stdout
    return parse_units(out), (tmp_path / "calls").read_text().splitlines()


@pytest.mark.parametrize("shell", ["sh", "dash"])
def test_unit_states_is_one_systemctl_show_for_every_unit(tmp_path, shell):
    """Real systemd separates units by a blank line and prints Id first; the states keep the units' order
    (an alias shows its target's Id); a unit systemctl says nothing about is inactive with no file state."""
    shown = ("Id=docker.service\nActiveState=active\nUnitFileState=enabled\n\n"
             "Id=containerd.service\nActiveState=inactive\nUnitFileState=\n\n"
             "Id=cri-o.service\nActiveState=failed\nUnitFileState=masked\n")
    units, calls = _systemctl_show(tmp_path, shown, shell)
    assert calls[-1] == ("show -p Id -p ActiveState -p UnitFileState docker.service containerd.service crio.service "
                         "x.timer")
    assert len(calls) == 2 and calls[0].startswith("list-units --all ")
    assert [(u.name, u.active, u.enabled) for u in units.values()] == [
        ("docker.service", "active", "enabled"), ("containerd.service", "inactive", ""),
        ("crio.service", "failed", "masked"), ("x.timer", "inactive", "")]


def test_prerequisites_availability_is_one_dpkg_query_and_one_apt_cache_call(tmp_path):
    """apt-cache loads its whole cache on every call: the four candidates come from one `apt-cache policy`
    (an arch-qualified header, an unknown package and a `(none)` candidate included), installed packages from
    one dpkg-query; the lines are what steps/prerequisites.py parses."""
    import subprocess

    from gpunode.facts.packages import PREREQ_AVAILABLE

    tools = {
        "uname": "echo 9.9.9-test",
        "dpkg-query": "printf 'install ok installed gcc\\ndeinstall ok config-files dkms\\nhold ok installed make\\n'",
        "apt-cache": ("printf 'gcc:amd64:\\n  Installed: 12\\n  Candidate: 12\\nmake:\\n  Installed: (none)\\n"
                      "  Candidate: 4.3\\ndkms:\\n  Installed: (none)\\n  Candidate: (none)\\n'"),
    }
    for name, body in tools.items():
        (tmp_path / name).write_text(f"#!/bin/sh\necho \"{name} $*\" >> {tmp_path}/calls\n{body}\n")
        (tmp_path / name).chmod(0o755)
    out = subprocess.run(["sh", "-c", PREREQ_AVAILABLE.snippet], capture_output=True, text=True, check=True,
                         env={"PATH": f"{tmp_path}:/usr/bin:/bin"}).stdout
    assert out.splitlines() == ["installed gcc", "avail gcc", "avail make", "missing dkms",
                                "missing linux-headers-9.9.9-test"]
    calls = (tmp_path / "calls").read_text().splitlines()
    assert [c.split()[0] for c in calls if c.startswith(("dpkg-query ", "apt-cache "))] == ["dpkg-query", "apt-cache"]


# zypper -n -q search -s --match-exact gcc make dkms kernel-default-devel (zypper's table layout)
ZYPPER_SEARCH = ("S  | Name                 | Type    | Version              | Arch   | Repository\n"
                 "---+----------------------+---------+----------------------+--------+---------------------------\n"
                 "i+ | gcc                  | package | 7-150000.1.3         | x86_64 | SLE-Module-Basesystem15-SP6\n"
                 "v  | kernel-default-devel | package | RELEASE | x86_64 | SLE-Module-Basesystem15-SP6\n")


@pytest.mark.parametrize("shell", ["sh", "dash"])
def test_prereq_availability_on_suse_reads_zyppers_table_for_the_running_kernels_headers(tmp_path, shell):
    """SUSE: one `zypper search -s` for the three tools and kernel-<flavour>-devel; the headers are offered only
    when a version-release of the running kernel's version is listed (6.4.0-150600.23.25.1 for
    6.4.0-150600.23.25-default, not .23.38.1); the lines name the package as prerequisites installs it."""
    import os
    import shutil
    import subprocess

    from gpunode.facts.packages import PREREQ_AVAILABLE
    from gpunode.steps.prerequisites import parse_available

    kernel = "6.4.0-150600.23.25-default"
    for tool in ("awk", "cat"):
        os.symlink(f"/usr/bin/{tool}", tmp_path / tool)
    tools = {"uname": f"echo {kernel}", "rpm": "exit 1", "zypper": 'cat "$TABLE"'}
    for name, body in tools.items():
        (tmp_path / name).write_text(f"#!/bin/sh\necho \"{name} $*\" >> {tmp_path}/calls\n{body}\n")
        (tmp_path / name).chmod(0o755)
    found = {}
    for release in ("6.4.0-150600.23.25.1", "6.4.0-150600.23.38.1"):
        (tmp_path / "table").write_text(ZYPPER_SEARCH.replace("RELEASE", release))
        out = subprocess.run([shutil.which(shell) or shell, "-c", PREREQ_AVAILABLE.snippet], capture_output=True,
                             text=True, check=True, env={"PATH": str(tmp_path), "TABLE": str(tmp_path / "table")}).stdout
        found[release] = parse_available(out, kernel)
    now = found["6.4.0-150600.23.25.1"]
    assert now.available == {"gcc", "kernel-default-devel=6.4.0-150600.23.25"}
    assert now.missing == {"make", "dkms"}
    assert "kernel-default-devel=6.4.0-150600.23.25" in found["6.4.0-150600.23.38.1"].missing
    calls = (tmp_path / "calls").read_text().splitlines()
    assert "zypper -n -q search -s --match-exact gcc make dkms kernel-default-devel" in calls


@pytest.mark.parametrize("shell", ["sh", "dash"])
def test_sections_that_read_unit_states_share_one_systemctl_show_and_read_the_same_rows(tmp_path, shell):
    """The engines', the k8s and the GPU services' units come from ONE `systemctl show` in a probe (each section
    asked for itself before); every section still prints exactly the rows it printed alone."""
    import subprocess

    from gpunode.facts import holders, k8s, packages
    from gpunode.facts.packages import shared_units

    states = {"docker.service": ("active", "enabled"), "nvidia-persistenced.service": ("failed", "masked"),
              "kubelet.service": ("activating", "enabled-runtime")}
    cases = " ".join(f'{u}) a={a}; e={e} ;;' for u, (a, e) in states.items())
    tool = tmp_path / "systemctl"
    tool.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/calls\n{LIST_ALL}shift 7\nfor u; do a=inactive; e=; '
                    f'case $u in {cases} esac; printf "Id=%s\\nActiveState=%s\\nUnitFileState=%s\\n\\n" "$u" "$a" "$e"; '
                    'done\n')
    tool.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    facts = (packages.UNITS, k8s.UNITS, holders.GPU_SERVICE_UNITS)
    shared = shared_units(f.snippet for f in facts)
    assert shared is not None and shared_units([packages.UNITS.snippet]) is None  # one reader asks for itself
    alone = {f.name: subprocess.run([shell, "-c", f.snippet], capture_output=True, text=True, env=env).stdout
             for f in facts}
    (tmp_path / "calls").write_text("")
    marker = "@@@"
    together = subprocess.run([shell, "-c", shared + "\n" + "\n".join(f"( {f.snippet}\n); echo {marker}"
                                                                      for f in facts)],
                              capture_output=True, text=True, env=env).stdout.split(marker + "\n")
    assert [c.split()[0] for c in (tmp_path / "calls").read_text().splitlines()] == ["list-units", "show"]
    for fact, out in zip(facts, together[:-1], strict=True):
        assert out == alone[fact.name], fact
        assert parse_units(out)  # rows were printed, so the comparison means something
    assert parse_units(together[0])["docker.service"].active == "active"
    assert parse_units(together[2])["nvidia-persistenced.service"].enabled == "masked"


# ---- systemctl show asked only about the units systemd can say more of ----------------------------------------
# A model of systemd for the fake systemctl: UNIT ID LOAD ACTIVE FILESTATE MEMORY, FILESTATE "-" for empty; MEMORY
# "mem" for a unit systemd holds (list-units lists it under its Id). A unit not in the table: `show` loads it and
# finds nothing: inactive, no file state. Every row without "mem" has a file below (as in systemd: a unit known
# only by its file is loaded when asked).
SYSTEMD = """docker.service docker.service loaded active enabled mem
containerd.service containerd.service loaded inactive disabled -
gone-failed.service gone-failed.service not-found failed - mem
gone-active.service gone-active.service loaded active bad mem
kubelet.service kubelet.service not-found inactive - mem
dcgm.service nvidia-dcgm.service loaded active enabled -
nvidia-dcgm.service nvidia-dcgm.service loaded active enabled mem
masked.service masked.service masked inactive masked -
tmpl@x.service tmpl@x.service loaded inactive disabled -
gen.service gen.service loaded active generated mem
runtime.service runtime.service loaded inactive enabled-runtime -
"""
# the unit directories' contents, made in a mount namespace over tmpfs (nothing of this machine's is read)
UNIT_FILES = ("mkdir -p /etc/systemd/system /run/systemd/system/dropin.service.d /run/systemd/generator "
              "/usr/lib/systemd/system; for u in docker containerd nvidia-dcgm tmpl@; do "
              "echo '[Service]' > /usr/lib/systemd/system/$u.service; done; "
              "ln -s /usr/lib/systemd/system/nvidia-dcgm.service /etc/systemd/system/dcgm.service; "
              "ln -s /dev/null /etc/systemd/system/masked.service; echo '[Service]' > /run/systemd/generator/gen.service; "
              "echo '[Service]' > /run/systemd/system/runtime.service")
SYSTEMCTL = r"""#!/bin/sh
echo "$@" >> "$CALLS"
case $1 in
list-units) [ -z "$LIST_FAILS" ] || exit 1; shift 5
    for u; do while read -r n id load active fs mem; do
        [ "$n" = "$u" ] && [ "$n" = "$id" ] && [ "$mem" = mem ] && printf '%-22s %-9s %-8s %-7s %s\n' "$n" "$load" "$active" sub "a $n"
    done < "$TABLE"; done; exit 0 ;;
show) shift 7; sep=
    for u; do case $u in *.*) ;; *) u=$u.service ;; esac; i=$u; a=inactive; e=
        while read -r n id load active fs mem; do [ "$n" = "$u" ] && { i=$id; a=$active; e=${fs#-}; }; done < "$TABLE"
        [ -z "$sep" ] || echo; sep=1; printf 'Id=%s\nActiveState=%s\nUnitFileState=%s\n' "$i" "$a" "$e"
    done ;;
*) exit 1 ;;
esac
"""


@pytest.mark.skipif(not shutil.which("unshare"), reason="needs unshare")
@pytest.mark.parametrize("shell", [s for s in ("dash", "bash", "busybox") if shutil.which(s)])
def test_systemctl_show_is_asked_only_about_units_named_in_a_unit_directory_or_held_by_systemd(tmp_path, shell):
    """Every unit reads as `systemctl show` says of it, but `show` (a D-Bus GetAll per unit) is asked only about
    those with a file, link or drop-in directory in a unit directory, template instances, and those systemd holds
    other than as not-found; a not-found unit it holds (failed, its file gone) reads its state off list-units;
    a unit neither named nor held is inactive with no file state, what show says. Where PID 1's environment sets
    SYSTEMD_UNIT_PATH, or list-units fails, every unit is asked, as before."""
    import subprocess

    from gpunode.facts.packages import unit_states

    units = ("docker.service", "containerd.service", "crio.service", "gone-failed.service", "gone-active.service",
             "kubelet.service", "dcgm.service", "masked.service", "dropin.service", "tmpl@x.service", "gen.service",
             "runtime.service", "nvidia-dcgm.service", "docker")
    table = {row.split()[0]: row.split() for row in SYSTEMD.splitlines()}
    table["docker"] = table["docker.service"]  # show reads a name without a type as a service
    expected = {u: (table[u][3], table[u][4].strip("-")) if u in table else ("inactive", "") for u in units}
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "systemctl").write_text(SYSTEMCTL)
    (tmp_path / "bin" / "systemctl").chmod(0o755)
    (tmp_path / "table").write_text(SYSTEMD)
    hide = ("for p in /run /etc/systemd /usr/lib/systemd /lib/systemd /usr/local/lib/systemd; do "
            '[ ! -d "$p" ] || mount -t tmpfs none "$p" || exit 9; done; ')
    argv = [shell, "sh"] if shell == "busybox" else [shell]

    def probe(*env: str) -> tuple[dict[str, tuple[str, str]], list[str]]:
        calls = tmp_path / "calls"
        calls.write_text("")
        out = subprocess.run(["unshare", "-rm", "-pf", "--mount-proc", "env", "-i",
                              f"PATH={tmp_path}/bin:/usr/bin:/bin", f"TABLE={tmp_path}/table", f"CALLS={calls}",
                              *env, *argv, "-c", hide + UNIT_FILES + "\n" + unit_states(*units)],
                             capture_output=True, text=True, check=True).stdout
        return ({u.name: (u.active, u.enabled) for u in parse_units(out).values()},
                [c.split()[0] + " " + " ".join(c.split()[5 if c.startswith("list") else 7:])
                 for c in calls.read_text().splitlines()])

    got, calls = probe()
    assert got == expected
    assert calls == ["list-units " + " ".join(units),
                     "show docker.service containerd.service gone-active.service dcgm.service masked.service "
                     "dropin.service tmpl@x.service gen.service runtime.service nvidia-dcgm.service docker"]
    assert got["gone-failed.service"] == ("failed", "") and got["dcgm.service"] == ("active", "enabled")
    for twin in (("SYSTEMD_UNIT_PATH=/srv/units:",), ("LIST_FAILS=1",)):
        got, calls = probe(*twin)
        assert got == expected, twin
        assert calls[-1] == "show " + " ".join(units), twin

"""The toolkit step on fake nodes: repository per package family, pinned and unpinned installs, offline
package files, and the cases it refuses."""

from __future__ import annotations

import dataclasses

import pytest

from gpunode.actions.base import Action
from gpunode.actions.packages import PackageCommand
from gpunode.facts import gather
from gpunode.facts.registry import Section
from gpunode.options import Options
from gpunode.plan import RunCommand, Status, WriteFile
from gpunode.runner import apply_pipeline
from gpunode.shell import to_argv
from gpunode.steps import toolkit
from tests.fakes.connection import ROCKY_9, UBUNTU_2204, FakeConnection, FakeNode, FakeSystem

TOOLKIT = FakeSystem.TOOLKIT
SLES = 'NAME="SLES"\nVERSION_ID="15.5"\nID="sles"\nID_LIKE="suse"\nPRETTY_NAME="SUSE Linux Enterprise Server 15 SP5"\n'
ARCH = 'NAME="Arch Linux"\nID=arch\nPRETTY_NAME="Arch Linux"\n'


def make_node(os_release=UBUNTU_2204, packages=None, tools=("curl", "gpg"), **kw):
    node = FakeNode(os_release=os_release, **kw)
    node.add_gpu(0x1EB8)
    node.tools |= {"dockerd", *tools}
    system = FakeSystem(node, packages=dict(packages or {})).attach().unit("docker")
    system.versions.update({p: "1.18.1-1" for p in TOOLKIT})
    return node, system


def argv(action: Action) -> tuple[str, ...]:
    """The (last) command line of a package action, as argv."""
    assert isinstance(action, PackageCommand), action
    return to_argv(action.cmds[-1])


def plan_of(node, **options):
    return toolkit.plan(gather(FakeConnection(node)), Options(**options), {})


def run(node, **options):
    return apply_pipeline(FakeConnection(node), (toolkit.STEP,), Options(**options))


def test_ubuntu_fresh_install_adds_keyring_and_signed_source_then_converges():
    node, system = make_node()
    plan = plan_of(node)
    assert plan.status is Status.CHANGE and plan.reason == "nvidia-container-toolkit is not installed"
    key, source, update, install = plan.actions
    (line,) = key.commands()  # the real command line: the script in full, then its arguments
    assert line.startswith("sudo sh -c 'set -e; tmp=$(mktemp);") and "<" not in line
    assert line.endswith("' gpunode-fetch-apt-key https://nvidia.github.io/libnvidia-container/gpgkey "
                         "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg")
    assert isinstance(source, WriteFile) and source.path == toolkit.APT_LIST
    assert ("deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg] "
            "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /") in source.after
    assert argv(update) == ("apt-get", "update")
    assert isinstance(install, PackageCommand) and install.packages == ("nvidia-container-toolkit",)
    report = run(node)
    assert report.outcomes[0].result == "changed", report.outcomes[0].error
    assert {p: system.packages[p] for p in TOOLKIT} == {p: "1.18.1-1" for p in TOOLKIT}
    assert node.files[toolkit.APT_KEYRING]
    calls = len(node.calls)
    assert run(node).outcomes[0].result == "ok"
    assert node.changing_calls(calls) == []


def test_missing_curl_or_gpg_is_installed_first():
    node, _ = make_node(tools=())
    first = plan_of(node).actions[0]
    assert isinstance(first, PackageCommand) and first.packages == ("ca-certificates", "curl", "gnupg")


def test_pin_installs_all_four_and_may_go_down_a_version():
    node, system = make_node(packages={p: "1.18.1-1" for p in TOOLKIT})
    assert plan_of(node).status is Status.OK  # unpinned: whatever is installed is kept
    plan = plan_of(node, toolkit_version="1.17.8")
    install = plan.actions[-1]
    assert argv(install) == ("apt-get", "install", "-y", "--no-install-recommends", "--allow-downgrades",
                           "nvidia-container-toolkit=1.17.8-1", "nvidia-container-toolkit-base=1.17.8-1",
                           "libnvidia-container-tools=1.17.8-1", "libnvidia-container1=1.17.8-1")
    assert "--toolkit-version 1.17.8: nvidia-container-toolkit 1.18.1-1" in plan.reason
    assert run(node, toolkit_version="1.17.8").outcomes[0].result == "changed"
    assert set(system.packages.values()) == {"1.17.8-1"}
    assert plan_of(node, toolkit_version="1.17.8").status is Status.OK
    assert plan_of(node, toolkit_version="1.17.8-1").status is Status.OK


def test_mismatched_toolkit_packages_are_aligned_on_the_toolkit_version():
    node, _ = make_node(packages={**{p: "1.18.1-1" for p in TOOLKIT}, "libnvidia-container1": "1.17.8-1"})
    plan = plan_of(node)
    assert "since 1.18 all four must match" in plan.reason
    assert "libnvidia-container1=1.18.1-1" in argv(plan.actions[-1])


def test_existing_repository_is_not_duplicated_and_its_keyring_is_fetched_where_it_points():
    listing = ("deb [signed-by=/etc/apt/keyrings/nvidia.gpg] https://nvidia.github.io/libnvidia-container/stable/deb/"
               "$(ARCH) /\n#deb https://nvidia.github.io/libnvidia-container/experimental/deb/$(ARCH) /\n")
    node, _ = make_node(files={"/etc/apt/sources.list.d/nvidia-docker.list": listing})
    plan = plan_of(node)
    assert not any(isinstance(a, WriteFile) for a in plan.actions)
    assert plan.actions[0].cmd.args == (toolkit.KEY_URL, "/etc/apt/keyrings/nvidia.gpg")
    assert any("already configured in /etc/apt/sources.list.d/nvidia-docker.list" in n for n in plan.notes)
    node.files["/etc/apt/keyrings/nvidia.gpg"] = "key"
    FakeSystem(node).sync()
    assert [type(a).__name__ for a in plan_of(node).actions] == ["PackageCommand", "PackageCommand"]


def test_deb822_sources_and_deprecated_repositories():
    sources = ("Types: deb\nURIs: https://nvidia.github.io/libnvidia-container/stable/deb/amd64\nSuites: /\n"
               "Signed-By: /usr/share/keyrings/nvidia-container-toolkit-keyring.gpg\n")
    assert toolkit.apt_sources({"/etc/apt/sources.list.d/nvidia.sources": sources}) == [
        ("/etc/apt/sources.list.d/nvidia.sources", "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg")]
    assert toolkit.apt_sources({"/etc/apt/sources.list.d/nvidia.sources": sources + "Enabled: no\n"}) == []
    node, _ = make_node(files={"/etc/apt/sources.list.d/old.list":
                               "deb https://nvidia.github.io/nvidia-docker/ubuntu22.04/$(ARCH) /\n"})
    assert any("deprecated NVIDIA repositories" in n for n in plan_of(node).notes)


def test_rocky_gets_a_repo_file_and_dnf_pins():
    node, system = make_node(os_release=ROCKY_9)
    node.tools.add("dnf")
    plan = plan_of(node, toolkit_version="1.17.8-1")
    repo, install = plan.actions
    assert repo.path == toolkit.YUM_REPO and "baseurl=https://nvidia.github.io/libnvidia-container/stable/rpm/$basearch" \
        in repo.after and "repo_gpgcheck=1" in repo.after
    assert argv(install) == ("dnf", "install", "-y", "nvidia-container-toolkit-1.17.8-1",
                           "nvidia-container-toolkit-base-1.17.8-1", "libnvidia-container-tools-1.17.8-1",
                           "libnvidia-container1-1.17.8-1")
    assert run(node, toolkit_version="1.17.8-1").outcomes[0].result == "changed"
    assert run(node, toolkit_version="1.17.8-1").outcomes[0].result == "ok"
    disabled = node.files[toolkit.YUM_REPO].replace("enabled=1", "enabled=0")
    assert toolkit.rpm_repos({toolkit.YUM_REPO: disabled}, "/etc/yum.repos.d") == []


def test_sles_uses_zypper():
    node, _ = make_node(os_release=SLES)
    plan = plan_of(node, toolkit_version="1.17.8")
    repo, refresh, install = plan.actions
    assert repo.path == toolkit.ZYPP_REPO and "sslcacert" not in repo.after
    assert argv(refresh) == ("zypper", "--non-interactive", "--gpg-auto-import-keys", "refresh")
    assert argv(install)[:4] == ("zypper", "--non-interactive", "install", "--oldpackage")
    assert "nvidia-container-toolkit-1.17.8-1" in argv(install)


def test_unsupported_distribution_and_architecture_are_blocked_and_explained():
    plan = plan_of(make_node(os_release=ARCH)[0])
    assert plan.status is Status.BLOCKED and "Arch Linux has none of them" in plan.reason
    assert "--skip toolkit" in plan.fix
    plan = plan_of(make_node(arch="ppc64le")[0])
    assert plan.status is Status.BLOCKED and "not ppc64le" in plan.reason


def test_nothing_to_do_without_a_gpu_or_without_an_engine():
    assert plan_of(FakeNode()).status is Status.OK
    node = FakeNode()
    node.add_gpu(0x1EB8)
    FakeSystem(node).attach()
    plan = plan_of(node)
    assert plan.status is Status.OK and "no container engine" in plan.reason


@pytest.fixture
def debs(tmp_path):
    files = []
    for name in TOOLKIT:
        path = tmp_path / f"{name}_1.17.8-1_amd64.deb"
        path.write_text(f"deb of {name}")
        files.append(str(path))
    return tuple(files)


def test_offline_packages_are_uploaded_installed_and_cleaned_up(debs):
    node, system = make_node()
    plan = plan_of(node, toolkit_packages=debs)
    (action,) = plan.actions
    assert action.kind == "local-packages" and plan.reason.startswith("offline install of nvidia-container-toolkit")
    assert action.commands()[-1].startswith("sudo apt-get install -y --no-install-recommends --allow-downgrades "
                                            "'<private dir>/nvidia-container-toolkit_1.17.8-1_amd64.deb'")
    assert run(node, toolkit_packages=debs).outcomes[0].result == "changed"
    assert set(system.packages.values()) == {"1.17.8-1"}
    assert not [p for p in node.files if p.endswith(".deb")]  # the uploaded copies are gone
    assert not node.ran("apt-get update") and toolkit.APT_LIST not in node.files  # offline: no repository
    assert run(node, toolkit_packages=debs).outcomes[0].result == "ok"


def test_offline_packages_must_fit_the_distribution_and_be_named_like_packages(debs, tmp_path):
    rocky, _ = make_node(os_release=ROCKY_9)
    assert "is a .deb package but Rocky Linux 9.3" in plan_of(rocky, toolkit_packages=debs).reason
    odd = tmp_path / "toolkit.deb"
    odd.write_text("x")
    assert plan_of(make_node()[0], toolkit_packages=(str(odd),)).status is Status.BLOCKED
    assert toolkit.parse_package_file("nvidia-container-toolkit-1.17.8-1.x86_64.rpm") == (
        "nvidia-container-toolkit", "1.17.8-1", "rpm")
    assert toolkit.parse_package_file("/x/libnvidia-container1_1%3a1.17.8-1_arm64.deb") == (
        "libnvidia-container1", "1:1.17.8-1", "deb")
    assert plan_of(make_node()[0], toolkit_packages=debs, toolkit_version="1.18.0").status is Status.BLOCKED


def test_a_failing_install_fails_the_step():
    node, system = make_node()
    system.missing.add("nvidia-container-toolkit")
    report = run(node)
    assert report.outcomes[0].result == "failed"
    assert "Unable to locate package nvidia-container-toolkit" in report.outcomes[0].error


def test_plan_actions_are_serialisable():
    node, _ = make_node()
    for action in plan_of(node).actions:
        data = action.to_dict()
        assert data["summary"] and isinstance(data["commands"], list)
    assert isinstance(plan_of(node).actions[0], RunCommand)


def test_with_the_driver_from_packages_the_toolkit_is_held_like_the_driver():
    """--driver-source packages: the four packages are held at their versions in the same plan (recorded, so
    uninstall releases them); --no-hold-driver and the default .run source leave them free."""
    node, system = make_node(packages={p: "1.18.1-1" for p in TOOLKIT})
    assert plan_of(node).status is Status.OK  # the .run source: nothing held
    assert plan_of(node, driver_source="packages", driver="535.230.02", hold_driver=False).status is Status.OK
    plan = plan_of(node, driver_source="packages", driver="535.230.02")
    assert plan.status is Status.CHANGE and "holding it like the driver's packages" in plan.reason
    assert argv(plan.actions[-1]) == ("apt-mark", "hold", *TOOLKIT)
    report = run(node, driver_source="packages", driver="535.230.02")
    assert report.outcomes[0].result == "changed", report.outcomes[0].error
    assert set(TOOLKIT) <= system.held
    assert plan_of(node, driver_source="packages", driver="535.230.02").status is Status.OK  # held: converged
    # a pinned install holds in the same plan, at the exact version (dnf: versionlock NAME-VERSION)
    rocky, _ = make_node(os_release=ROCKY_9, tools=("dnf",))
    pinned = plan_of(rocky, driver_source="packages", driver="535.274.02", toolkit_version="1.17.8")
    assert argv(pinned.actions[-1])[:3] == ("dnf", "versionlock", "add")
    assert "nvidia-container-toolkit-1.17.8-1" in argv(pinned.actions[-1])


def answered(node, offered: str, status: int = 0, **options):
    """The plan once the node answered the read of NVIDIA's toolkit repository metadata with `offered`."""
    facts = gather(FakeConnection(node))
    query = toolkit.offers_query(facts, facts.os.package_manager)
    assert query is not None
    facts = dataclasses.replace(facts, answers={query.script: Section(offered, status)})
    return toolkit.plan(facts, Options(**options), {})


def offer_lines(**versions):
    """`offer NAME VERSION` lines (facts/offers.py's script output) for the toolkit's packages."""
    return "".join(f"offer {name} {v}\n" for name in TOOLKIT for v in versions.get(name.replace("-", "_"),
                                                                                     versions.get("all", ())))


def test_with_the_driver_from_packages_a_fresh_toolkit_is_pinned_to_the_newest_release_all_four_are_offered_at():
    """--driver-source packages, no --toolkit-version, the repository not added yet: the plan reads the
    repository's own metadata on the node before any change and installs (and holds) all four packages at the
    newest version every one of them is offered at; the .run source keeps the repository's newest unpinned."""
    node, system = make_node()
    packages = dict(driver_source="packages", driver="535.230.02")
    unanswered = plan_of(node, **packages)
    install = unanswered.actions[-2]
    assert isinstance(install, PackageCommand) and install.query is not None
    assert install.query.label == "read-offers" and "/stable/deb/amd64/Packages" in install.query.script
    assert any("before any change" in n for n in unanswered.notes)
    assert plan_of(node).actions[-1].query is None  # the .run source: nothing asked
    # libnvidia-container1 lacks 1.20.0-1 in this repository: the newest common release is 1.18.0-1
    offered = offer_lines(all=("1.17.8-1", "1.18.0-1", "1.20.0-1"), libnvidia_container1=("1.17.8-1", "1.18.0-1"))
    plan = answered(node, offered, **packages)
    assert plan.status is Status.CHANGE
    install, hold = plan.actions[-2:]
    assert argv(install)[-4:] == tuple(f"{p}=1.18.0-1" for p in TOOLKIT)
    assert argv(hold) == ("apt-mark", "hold", *TOOLKIT)
    assert plan.outputs.version == "1.18.0-1"
    assert any("offers 1.18.0-1 as its newest release of all four" in n for n in plan.notes)
    # an installed toolkit is kept, whatever the repository offers; a repository already configured is asked
    # through the package manager, not read from NVIDIA's address
    node.files[toolkit.APT_LIST] = toolkit.APT_SOURCE
    assert toolkit.offers_query(gather(FakeConnection(node)), "apt") is None
    rocky, _ = make_node(os_release=ROCKY_9, tools=("dnf",))
    query = toolkit.offers_query(gather(FakeConnection(rocky)), "dnf")
    assert query is not None and "libnvidia-container/stable/rpm/x86_64" in query.script


def test_a_toolkit_version_the_repository_lacks_or_an_unreadable_repository_blocks_before_any_change():
    node, system = make_node()
    packages = dict(driver_source="packages", driver="535.230.02")
    offered = offer_lines(all=("1.17.8-1", "1.18.0-1"))
    pinned = answered(node, offered, toolkit_version="1.17.8", **packages)
    assert pinned.status is Status.CHANGE and argv(pinned.actions[-2])[-1] == "libnvidia-container1=1.17.8-1"
    lacking = answered(node, offered, toolkit_version="1.20.0", **packages)
    assert lacking.status is Status.BLOCKED and lacking.lasting
    assert "does not offer 1.20.0-1 (--toolkit-version)" in lacking.reason and "1.18.0-1, 1.17.8-1" in lacking.reason
    assert lacking.fix == "choose one it offers: --toolkit-version 1.18.0-1"
    unreachable = answered(node, "curl: (6) Could not resolve host: nvidia.github.io\nE: cannot read "
                                 "https://nvidia.github.io/libnvidia-container/stable/deb/amd64/Packages\n", 1,
                           **packages)
    assert unreachable.status is Status.BLOCKED and unreachable.lasting
    assert "curl: (6) Could not resolve host: nvidia.github.io" in unreachable.reason
    assert "--toolkit-package FILE" in unreachable.fix
    none = answered(node, offer_lines(nvidia_container_toolkit=("1.18.0-1",)), **packages)
    assert none.status is Status.BLOCKED and "offers no version of all four packages" in none.reason
    # a whole run: the node is asked before the first change; refused there, nothing changes
    since = len(node.calls)
    node.handlers["read-offers"] = lambda node, argv, stdin: (1, "", "curl: (6) Could not resolve host: x\n")
    report = run(node, **packages)
    assert report.outcomes[0].result == "blocked"
    assert node.changing_calls(since) == [] and not system.packages
    del node.handlers["read-offers"]
    system.attach()
    report = run(node, **packages)
    assert report.outcomes[0].result == "changed", report.outcomes[0].error
    assert {p: system.packages[p] for p in TOOLKIT} == {p: "1.18.1-1" for p in TOOLKIT} and set(TOOLKIT) <= system.held


def test_with_the_driver_from_packages_a_configured_repository_is_pinned_from_the_managers_lists_at_install():
    """A toolkit repository configured already (a mirror: its versions are not read from NVIDIA's address): the
    install refreshes it and reads the package manager's own lists to pin (actions/packages.InstallOffered);
    --toolkit-version is carried as the version it must find; the .run source keeps the unpinned install."""
    from gpunode.actions.packages import InstallOffered

    node, _ = make_node()
    node.files[toolkit.APT_LIST] = toolkit.APT_SOURCE
    node.files[toolkit.APT_KEYRING] = "key"
    packages = dict(driver_source="packages", driver="535.230.02")
    plan = plan_of(node, **packages)
    install = next(a for a in plan.actions if isinstance(a, InstallOffered))
    assert install.query is None and install.version == "" and install.packages == TOOLKIT
    assert install.commands()[:2] == ["sudo apt-get update", "sudo apt-cache policy " + " ".join(TOOLKIT)
                                      + "  # read-only: the version to pin"]
    assert any("configured on the node already" in n for n in plan.notes)
    asked = next(a for a in plan_of(node, toolkit_version="1.18.0", **packages).actions
                 if isinstance(a, InstallOffered))
    assert asked.version == "1.18.0-1" and asked.commands()[-1].endswith("libnvidia-container1=1.18.0-1")
    assert not any(isinstance(a, InstallOffered) for a in plan_of(node).actions)  # the .run source

"""What a repository offers (gpunode/facts/offers.py): the parser of the node's answer, the newest version every
package is offered at, and the scripts' quoting. The scripts themselves run on the node simulator
(tests/nodesim/test_packages.py::test_the_toolkit_repository_metadata_is_read_as_the_real_layouts_publish_it)."""

from __future__ import annotations

import shlex

from gpunode.facts import offers
from gpunode.facts.registry import Section

NAMES = ("nvidia-container-toolkit", "libnvidia-container1")
URL = "https://nvidia.github.io/libnvidia-container/stable/deb/amd64"


def test_the_answer_lists_each_version_once_in_the_repositorys_order_and_the_common_newest_first():
    query = offers.apt_flat(URL, NAMES)
    found = query.parse(Section("offer nvidia-container-toolkit 1.9.0-1\noffer nvidia-container-toolkit 1.10.0-1\n"
                                "offer nvidia-container-toolkit 1.10.0-1\noffer libnvidia-container1 1.10.0-1\n"
                                "offer libnvidia-container1 1.9.0-1\nnoise line\n", 0))
    assert found.error is None and found.url == URL + "/Packages"
    assert found.versions == {"nvidia-container-toolkit": ("1.9.0-1", "1.10.0-1"),
                              "libnvidia-container1": ("1.10.0-1", "1.9.0-1")}
    assert found.common(NAMES) == ["1.10.0-1", "1.9.0-1"]  # dpkg's order: 1.10 is newer than 1.9
    assert found.common((*NAMES, "nvidia-container-toolkit-base")) == []  # one name offered at none of them
    assert found.common(()) == []


def test_an_unreadable_repository_is_an_error_naming_the_downloaders_reason():
    query = offers.rpm_md("https://nvidia.github.io/libnvidia-container/stable/rpm/x86_64", NAMES)
    found = query.parse(Section("E: cannot read https://nvidia.github.io/libnvidia-container/stable/rpm/x86_64/"
                                "repodata/repomd.xml\ncurl: (6) Could not resolve host: nvidia.github.io\n", 1))
    assert found.error == ("curl: (6) Could not resolve host: nvidia.github.io; cannot read https://nvidia.github.io/"
                           "libnvidia-container/stable/rpm/x86_64/repodata/repomd.xml")
    assert found.versions == {}
    assert query.parse(Section("", 7)).error == "exit status 7"
    assert query.parse(Section("", 0)).error is None and query.parse(Section("", 0)).common(NAMES) == []


def test_every_value_reaches_the_shell_quoted_and_the_query_is_named_for_the_node():
    odd = "https://example.com/it's here"
    for query in (offers.apt_flat(odd, ("a'b",)), offers.rpm_md(odd, ("a'b",))):
        assert shlex.quote(odd.rstrip("/") + ("/Packages" if "Packages" in query.name else "")) in query.script
        assert shlex.quote(" a'b ") in query.script
        assert query.label == "read-offers" and query.timeout == offers.OFFERS_TIMEOUT


def test_the_package_managers_own_lists_give_the_versions_all_four_share():
    """A repository already configured: what dnf, apt and zypper list of the four packages (their own listings,
    parsed by facts/driver.parse_offered), and the newest version they all share."""
    from gpunode.facts.offers import lists_command, parse_lists

    names = ("nvidia-container-toolkit", "nvidia-container-toolkit-base")
    dnf = ("Available Packages\n"
           "nvidia-container-toolkit.x86_64        1.18.0-1   nvidia-container-toolkit\n"
           "nvidia-container-toolkit.x86_64        1.21.0-1   nvidia-container-toolkit\n"
           "nvidia-container-toolkit-base.x86_64   1.18.0-1   nvidia-container-toolkit\n")
    apt = ("nvidia-container-toolkit:\n  Installed: (none)\n  Candidate: 1.21.0-1\n  Version table:\n"
           "     1.21.0-1 500\n        500 https://mirror.example/deb/amd64  Packages\n"
           "     1.18.0-1 500\n        500 https://mirror.example/deb/amd64  Packages\n"
           "nvidia-container-toolkit-base:\n  Installed: (none)\n  Candidate: 1.18.0-1\n  Version table:\n"
           "     1.18.0-1 500\n        500 https://mirror.example/deb/amd64  Packages\n")
    zypper = ("S  | Name                          | Type    | Version  | Arch   | Repository\n"
              "---+-------------------------------+---------+----------+--------+-----------\n"
              "v  | nvidia-container-toolkit      | package | 1.21.0-1 | x86_64 | mirror\n"
              "v  | nvidia-container-toolkit      | package | 1.18.0-1 | x86_64 | mirror\n"
              "v  | nvidia-container-toolkit-base | package | 1.18.0-1 | x86_64 | mirror\n")
    for text in (dnf, apt, zypper):
        offered = parse_lists(text)
        assert offered.common(names) == ["1.18.0-1"], text
        assert "1.21.0-1" in offered.versions["nvidia-container-toolkit"]
    assert lists_command("dnf", names) == "dnf -q list --showduplicates nvidia-container-toolkit " \
                                          "nvidia-container-toolkit-base"
    assert lists_command("apt", ["a b"]) == "apt-cache policy 'a b'"  # every value quoted

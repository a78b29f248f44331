import pytest

from gpunode.errors import UsageError
from gpunode.inventory import expand_host_pattern, limit, load_inventory

ANSIBLE_INI = """\
# GPU fleet
bastion ansible_host=192.0.2.1

[h100]
gpu-[01:03] ansible_user=ubuntu
gpu-10 ansible_host=10.0.0.10 ansible_port=2222 ansible_ssh_private_key_file=~/.ssh/h100

[a100]
dgx-a ansible_host=10.0.1.1  # comment after a host

[a100:vars]
ansible_user=dgxuser
ansible_become=true

[gpus:children]
h100
a100

[gpus:vars]
ansible_user=admin
ansible_port=22
"""

ANSIBLE_YAML = """\
all:
  vars:
    ansible_user: root
  hosts:
    bastion:
      ansible_host: 192.0.2.1
  children:
    gpus:
      vars:
        ansible_user: admin
      children:
        h100:
          hosts:
            gpu-[01:02]:
            gpu-10:
              ansible_host: 10.0.0.10
              ansible_port: 2222
          vars:
            ansible_become: yes
        a100:
          hosts:
            dgx-a:
              ansible_host: 10.0.1.1
              ansible_user: dgxuser
"""


def test_host_ranges():
    assert expand_host_pattern("gpu-[01:03]") == ["gpu-01", "gpu-02", "gpu-03"]
    assert expand_host_pattern("n[1:2]-[a:b]") == ["n1-a", "n1-b", "n2-a", "n2-b"]
    assert expand_host_pattern("x[0:10:5]") == ["x0", "x5", "x10"]


def test_ansible_ini_groups_children_vars_precedence(tmp_path):
    path = tmp_path / "hosts.ini"
    path.write_text(ANSIBLE_INI)
    hosts = {h.name: h for h in load_inventory(path)}
    assert set(hosts) == {"bastion", "gpu-01", "gpu-02", "gpu-03", "gpu-10", "dgx-a"}
    assert hosts["gpu-02"].user == "ubuntu" and hosts["gpu-02"].port == 22  # host var beats parent group var
    assert hosts["gpu-02"].groups == {"h100", "gpus"}
    g10 = hosts["gpu-10"]
    assert (g10.address, g10.port, g10.user, g10.identity) == ("10.0.0.10", 2222, "admin", "~/.ssh/h100")
    assert g10.target == "admin@10.0.0.10:2222"
    dgx = hosts["dgx-a"]
    assert dgx.user == "dgxuser" and dgx.become is True  # child group var beats parent group var
    assert hosts["bastion"].groups == {"ungrouped"} and hosts["bastion"].user is None


def test_ansible_yaml_groups_children_vars_precedence(tmp_path):
    path = tmp_path / "hosts.yml"
    path.write_text(ANSIBLE_YAML)
    hosts = {h.name: h for h in load_inventory(path)}
    assert set(hosts) == {"bastion", "gpu-01", "gpu-02", "gpu-10", "dgx-a"}
    assert hosts["bastion"].user == "root"
    assert hosts["gpu-01"].user == "admin" and hosts["gpu-01"].become is True
    assert hosts["gpu-01"].groups == {"gpus", "h100"}
    assert hosts["gpu-10"].target == "admin@10.0.0.10:2222"
    assert hosts["dgx-a"].user == "dgxuser" and hosts["dgx-a"].become is None


def test_gpunode_toml(tmp_path):
    path = tmp_path / "fleet.toml"
    path.write_text('[defaults]\nuser = "ops"\n\n[[hosts]]\nname = "gpu-[1:2]"\ngroups = ["h100"]\n\n'
                    '[[hosts]]\nname = "gpu-9"\naddress = "10.0.0.9"\nport = 2200\nuser = "root"\n')
    hosts = load_inventory(path)
    assert [h.target for h in hosts] == ["ops@gpu-1", "ops@gpu-2", "root@10.0.0.9:2200"]
    assert hosts[0].groups == {"h100"}


def test_gpunode_yaml(tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_text("defaults:\n  user: ops\nhosts:\n  - name: a\n    address: 10.0.0.1\n")
    assert [h.target for h in load_inventory(path)] == ["ops@10.0.0.1"]


@pytest.mark.parametrize("name,text,message", [
    ("bad.ini", "[gpus\nx\n", "bad.ini:1: unclosed section header"),
    ("bad.ini", "[gpus:vars]\nnot-a-pair\n", "bad.ini:2: expected key=value"),
    ("bad.toml", "[[hosts]]\nname = \n", "invalid TOML"),
    ("bad.toml", "[[hosts]]\nname = 'a'\nadress = 'x'\n", "unknown keys: adress"),
    ("bad.yml", "all:\n  hosts: [a, b\n", "invalid YAML"),
])
def test_bad_inventories_name_the_problem(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(UsageError, match=message):
        load_inventory(path)


def test_missing_inventory(tmp_path):
    with pytest.raises(UsageError, match="cannot read inventory"):
        load_inventory(tmp_path / "nope.ini")


def test_limit_patterns(tmp_path):
    path = tmp_path / "hosts.ini"
    path.write_text(ANSIBLE_INI)
    hosts = load_inventory(path)
    names = lambda p: sorted(h.name for h in limit(hosts, p))  # noqa: E731
    assert names("h100") == ["gpu-01", "gpu-02", "gpu-03", "gpu-10"]
    assert names("gpu-0*") == ["gpu-01", "gpu-02", "gpu-03"]
    assert names("gpus,!a100") == ["gpu-01", "gpu-02", "gpu-03", "gpu-10"]
    assert names("gpus:&a100") == ["dgx-a"]
    assert names("bastion,dgx-a") == ["bastion", "dgx-a"]
    with pytest.raises(UsageError, match="matches no host"):
        limit(hosts, "nothing-here")


def test_targets():
    from gpunode.inventory import InventoryHost

    assert InventoryHost("root@10.0.0.1:2222").target == "root@10.0.0.1:2222"  # as typed with --host
    assert InventoryHost("gpu-alias").target == "gpu-alias"
    assert InventoryHost("n", address="fe80::1", port=22).target == "[fe80::1]:22"
    assert InventoryHost("n", address="10.0.0.1", user="ops").target == "ops@10.0.0.1"

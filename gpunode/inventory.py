"""Inventories: which nodes to work on, taken as users already keep them.

Reads gpunode's own format (TOML or YAML) and Ansible inventories (INI and YAML: groups, children,
group vars, host ranges like gpu-[01:20], ansible_host/user/port/ssh_private_key_file/become).
`--limit` selects hosts by name or group, with globs, `!` to exclude and `&` to intersect.
"""

from __future__ import annotations

import fnmatch
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpunode.errors import UsageError
from gpunode.record import Frozen, Record

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@dataclass(frozen=True, eq=False, repr=False)
class InventoryHost(Frozen):
    name: str
    address: str | None = None
    user: str | None = None
    port: int | None = None
    identity: str | None = None
    become: bool | None = None
    groups: frozenset[str] = frozenset()

    @property
    def target(self) -> str:
        """`[user@]address[:port]` for the SSH connection; the name when there is no address (ssh_config alias)."""
        if self.address is None and not (self.user or self.port):
            return self.name  # an ssh_config alias, or a full [user@]host[:port] given with --host
        host = self.address or self.name
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"  # an IPv6 literal
        return f"{self.user + '@' if self.user else ''}{host}{':' + str(self.port) if self.port else ''}"


@dataclass(eq=False, repr=False)
class _Group(Record):
    hosts: list[str] = field(default_factory=list)
    children: list[str] = field(default_factory=list)
    vars: dict[str, Any] = field(default_factory=dict)


_RANGE = re.compile(r"\[([0-9a-zA-Z]+):([0-9a-zA-Z]+)(?::(\d+))?\]")


def expand_host_pattern(name: str) -> list[str]:
    """Ansible host ranges: gpu-[01:03] -> gpu-01, gpu-02, gpu-03; [a:c] letters; [0:10:5] with a step."""
    match = _RANGE.search(name)
    if not match:
        return [name]
    start, end, step = match.group(1), match.group(2), int(match.group(3) or 1)
    head, tail = name[:match.start()], name[match.end():]
    if start.isdigit() and end.isdigit():
        width = len(start) if start.startswith("0") and len(start) > 1 else 0
        values = [str(i).zfill(width) for i in range(int(start), int(end) + 1, step)]
    elif len(start) == 1 and len(end) == 1 and start.isalpha() and end.isalpha():
        values = [chr(c) for c in range(ord(start), ord(end) + 1, step)]
    else:
        raise UsageError(f"invalid host range in {name!r}", fix="use [01:20] (numbers) or [a:f] (letters)")
    return [expanded for value in values for expanded in expand_host_pattern(head + value + tail)]


def _parse_value(text: str) -> Any:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    low = text.lower()
    if low in ("true", "yes"):
        return True
    if low in ("false", "no"):
        return False
    return int(text) if text.isdigit() else text


def _split_ini_line(line: str) -> list[str]:
    """Split on whitespace, keeping quoted values together (ansible_ssh_common_args="-o A=b")."""
    return re.findall(r'(?:[^\s"\']+|"[^"]*"|\'[^\']*\')+', line)


def parse_ansible_ini(text: str, source: str = "inventory") -> dict[str, _Group]:
    groups: dict[str, _Group] = {"all": _Group(), "ungrouped": _Group()}
    host_vars: dict[str, dict[str, Any]] = {}
    section, kind = "ungrouped", "hosts"
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith(("#", ";")) else ""
        if not line:
            continue
        if line.startswith("["):
            if not line.endswith("]"):
                raise UsageError(f"{source}:{number}: unclosed section header {line!r}",
                                 fix="write group headers as [name], [name:vars] or [name:children]")
            section, _, kind = line[1:-1].partition(":")
            kind = kind or "hosts"
            if kind not in ("hosts", "vars", "children"):
                raise UsageError(f"{source}:{number}: unknown section kind {kind!r}",
                                 fix="use [group], [group:vars] or [group:children]")
            groups.setdefault(section, _Group())
            continue
        group = groups[section]
        if kind == "vars":
            key, sep, value = line.partition("=")
            if not sep:
                raise UsageError(f"{source}:{number}: expected key=value in [{section}:vars], got {line!r}",
                                 fix="write one variable per line as name=value")
            group.vars[key.strip()] = _parse_value(value)
        elif kind == "children":
            group.children.append(line.split()[0])
            groups.setdefault(line.split()[0], _Group())
        else:
            words = _split_ini_line(line)
            variables = {}
            for word in words[1:]:
                key, sep, value = word.partition("=")
                if not sep:
                    raise UsageError(f"{source}:{number}: expected key=value after the host name, got {word!r}",
                                     fix="write host variables as ansible_host=10.0.0.1")
                variables[key] = _parse_value(value)
            for name in expand_host_pattern(words[0]):
                group.hosts.append(name)
                host_vars.setdefault(name, {}).update(variables)
    groups["_hostvars"] = _Group(vars=host_vars)
    return groups


def parse_ansible_yaml(data: Mapping[str, Any], source: str = "inventory") -> dict[str, _Group]:
    groups: dict[str, _Group] = {}
    host_vars: dict[str, dict[str, Any]] = {}

    def walk(name: str, body: Any) -> None:
        group = groups.setdefault(name, _Group())
        if body is None:
            return
        if not isinstance(body, Mapping):
            raise UsageError(f"{source}: group {name!r} must be a mapping with hosts/vars/children",
                             fix="see Ansible's YAML inventory format")
        for host, variables in (body.get("hosts") or {}).items():
            for expanded in expand_host_pattern(str(host)):
                group.hosts.append(expanded)
                host_vars.setdefault(expanded, {}).update(variables or {})
        group.vars.update(body.get("vars") or {})
        for child, child_body in (body.get("children") or {}).items():
            group.children.append(str(child))
            walk(str(child), child_body)

    for name, body in data.items():
        walk(str(name), body)
    groups.setdefault("all", _Group())
    groups["_hostvars"] = _Group(vars=host_vars)
    return groups


def _resolve_groups(groups: dict[str, _Group]) -> list[InventoryHost]:
    """Flatten groups into hosts with Ansible's precedence: host vars > child group > parent group > all."""
    host_vars: dict[str, dict[str, Any]] = groups.pop("_hostvars").vars
    parents: dict[str, set[str]] = {}
    for name, group in groups.items():
        for child in group.children:
            parents.setdefault(child, set()).add(name)

    def depth(name: str, seen: frozenset[str] = frozenset()) -> int:
        if name in seen:
            raise UsageError(f"inventory: group {name!r} is its own ancestor", fix="remove the children cycle")
        return 1 + max((depth(p, seen | {name}) for p in parents.get(name, ())), default=0)

    def members(name: str, seen: frozenset[str] = frozenset()) -> set[str]:
        if name in seen:
            return set()
        group = groups.get(name, _Group())
        found = set(group.hosts)
        for child in group.children:
            found |= members(child, seen | {name})
        return found

    order: list[str] = []
    for group in groups.values():
        order.extend(h for h in group.hosts if h not in order)
    hosts = []
    for name in order:
        host_groups = [g for g in groups if name in members(g)]
        merged: dict[str, Any] = dict(groups.get("all", _Group()).vars)
        for group_name in sorted((g for g in host_groups if g != "all"), key=depth):
            merged.update(groups[group_name].vars)
        merged.update(host_vars.get(name, {}))
        hosts.append(_host_from_vars(name, merged, frozenset(g for g in host_groups if g not in ("all",))))
    return hosts


def _host_from_vars(name: str, v: Mapping[str, Any], groups: frozenset[str]) -> InventoryHost:
    def pick(*keys: str) -> Any:
        for key in keys:
            if key in v and v[key] not in (None, ""):
                return v[key]
        return None

    port = pick("ansible_port", "ansible_ssh_port", "port")
    if port is not None and not str(port).isdigit():
        raise UsageError(f"inventory: host {name!r} has a non-numeric port {port!r}", fix="ports are numbers")
    become = pick("ansible_become", "become")
    return InventoryHost(
        name=name,
        address=pick("ansible_host", "ansible_ssh_host", "address"),
        user=pick("ansible_user", "ansible_ssh_user", "user"),
        port=int(port) if port is not None else None,
        identity=pick("ansible_ssh_private_key_file", "identity"),
        become=bool(become) if become is not None else None,
        groups=groups,
    )


def parse_gpunode(data: Mapping[str, Any], source: str = "inventory") -> list[InventoryHost]:
    """gpunode's own format: optional `defaults`, a `hosts` list (or mapping name -> fields), each with
    name, address, user, port, identity, become, groups."""
    defaults = dict(data.get("defaults") or {})
    raw_hosts = data.get("hosts")
    if isinstance(raw_hosts, Mapping):
        raw_hosts = [{"name": k, **(v or {})} for k, v in raw_hosts.items()]
    if not isinstance(raw_hosts, list):
        raise UsageError(f"{source}: no `hosts` list", fix="add [[hosts]] entries with at least a name")
    hosts = []
    known = {"name", "address", "user", "port", "identity", "become", "groups"}
    for index, entry in enumerate(raw_hosts, 1):
        if not isinstance(entry, Mapping) or not entry.get("name"):
            raise UsageError(f"{source}: host #{index} has no name", fix="every host needs name = \"...\"")
        unknown = set(entry) - known
        if unknown:
            raise UsageError(f"{source}: host {entry['name']!r} has unknown keys: {', '.join(sorted(unknown))}",
                             fix=f"allowed keys: {', '.join(sorted(known))}")
        merged = {**defaults, **entry}
        for name in expand_host_pattern(str(entry["name"])):
            hosts.append(_host_from_vars(name, merged, frozenset(merged.get("groups") or ())))
    return hosts


def load_inventory(path: str | Path) -> list[InventoryHost]:
    """Detect the format from the content and parse. Errors name the file (and line where possible)."""
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read inventory {path}: {exc.strerror}", fix="check the --inventory path") from None
    source = str(path)
    if path.suffix == ".toml":
        try:
            return _dedupe(parse_gpunode(tomllib.loads(text), source))
        except tomllib.TOMLDecodeError as exc:
            raise UsageError(f"{source}: invalid TOML: {exc}", fix="fix the syntax at the position shown") from None
    if path.suffix in (".yml", ".yaml") or text.lstrip().startswith(("---", "all:")):
        import yaml  # only for a YAML inventory: a run on one --host does not pay for it

        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise UsageError(f"{source}: invalid YAML: {exc}", fix="fix the syntax at the position shown") from None
        if not isinstance(data, Mapping):
            raise UsageError(f"{source}: the top level must be a mapping", fix="see README: Inventories")
        if "hosts" in data and ("defaults" in data or isinstance(data.get("hosts"), list)):
            return _dedupe(parse_gpunode(data, source))
        return _dedupe(_resolve_groups(parse_ansible_yaml(data, source)))
    return _dedupe(_resolve_groups(parse_ansible_ini(text, source)))


def _dedupe(hosts: Iterable[InventoryHost]) -> list[InventoryHost]:
    seen: dict[str, InventoryHost] = {}
    for host in hosts:
        seen.setdefault(host.name, host)
    return list(seen.values())


def limit(hosts: list[InventoryHost], pattern: str | None) -> list[InventoryHost]:
    """Ansible-style --limit: 'a,b' or 'a:b' union, '!x' exclude, '&x' intersect; each term a host or group
    name or glob. A pattern matching nothing is an error rather than a silent no-op."""
    if not pattern:
        return hosts
    terms = [t for t in re.split(r"[,:]", pattern) if t]

    def matches(host: InventoryHost, term: str) -> bool:
        return fnmatch.fnmatch(host.name, term) or any(fnmatch.fnmatch(g, term) for g in host.groups) or (
            term == "all")

    union = [t for t in terms if not t.startswith(("!", "&"))]
    chosen = [h for h in hosts if not union or any(matches(h, t) for t in union)]
    for term in terms:
        if term.startswith("&"):
            chosen = [h for h in chosen if matches(h, term[1:])]
        elif term.startswith("!"):
            chosen = [h for h in chosen if not matches(h, term[1:])]
    if not chosen:
        raise UsageError(f"--limit {pattern!r} matches no host",
                         fix="host and group names: " + ", ".join(sorted({h.name for h in hosts})[:10]))
    return chosen

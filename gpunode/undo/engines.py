"""gpunode's entries in a container engine's config, and how to take only those out of a file the user changed
since (pure). One rule for every engine, applied to the parsed data: an entry gpunode added (absent from the
user's file before gpunode, or no such file) goes, one it changed gets the user's value back, one the user has
changed since stays; tables left empty that the user's file did not have go too. Only the format differs:
docker's daemon.json is JSON, containerd's and CRI-O's configs are TOML (read with tomllib, written like
nvidia-ctk writes them: gpunode/facts/containers.py dump_toml). A file that does not parse is not edited.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from gpunode.facts.containers import (
    CONTAINERD_DROPIN,
    CTK_WRITES,
    NVIDIA,
    ConfigError,
    CtkWrite,
    dump_daemon_json,
    dump_toml,
    parse_daemon_json,
    parse_toml,
)

_ABSENT = object()


def _get(data: Any, keys: tuple[str, ...]) -> Any:
    for key in keys:
        if not isinstance(data, Mapping) or key not in data:
            return _ABSENT
        data = data[key]
    return data


def _drop(data: dict[str, Any], keys: tuple[str, ...], original: Mapping[str, Any] | None) -> None:
    """Delete data[keys...], then every parent table left empty that the user's file did not have."""
    for depth in range(len(keys), 0, -1):
        parent = _get(data, keys[:depth - 1])
        if not isinstance(parent, dict) or keys[depth - 1] not in parent:
            return
        value = parent[keys[depth - 1]]
        if depth < len(keys) and (value or _get(original, keys[:depth]) is not _ABSENT):
            return
        del parent[keys[depth - 1]]


def strip_entries(data: Mapping[str, Any], original: Mapping[str, Any] | None, entries: tuple[CtkWrite, ...]
                  ) -> dict[str, Any]:
    """`data` without nvidia-ctk's `entries` (gpunode/facts/containers.py CTK_WRITES), given the user's data before
    gpunode (None: gpunode created the file)."""
    out = copy.deepcopy(dict(data))
    for e in entries:
        now, before = _get(out, e.keys), _get(original, e.keys)
        if e.item is not None:
            if isinstance(now, list) and e.item in now and not (isinstance(before, list) and e.item in before):
                rest = [v for v in now if v != e.item]
                parent = _get(out, e.keys[:-1])
                if rest or before is not _ABSENT:
                    parent[e.keys[-1]] = rest
                else:
                    _drop(out, e.keys, original)
            continue
        if now is _ABSENT or (e.value is not None and now != e.value) or now == before:
            continue  # not there, or the user's own value (set before gpunode, or changed since)
        if before is _ABSENT:
            _drop(out, e.keys, original)
        else:
            _get(out, e.keys[:-1])[e.keys[-1]] = copy.deepcopy(before)
    return out


def strip_docker(text: str, original: str | None = None) -> str | None:
    """daemon.json without the nvidia runtime and `default-runtime: nvidia` gpunode added; every other key stays."""
    try:
        data = parse_daemon_json(text)
        before = parse_daemon_json(original) if original is not None else None
    except ConfigError:
        return None
    stripped = strip_entries(data, before, CTK_WRITES["docker"])
    return text if stripped == data else dump_daemon_json(stripped)


def _toml_stripper(entries: tuple[CtkWrite, ...]) -> Callable[[str, str | None], str | None]:
    def strip(text: str, original: str | None = None) -> str | None:
        try:
            data = parse_toml(text, "config")
            before = parse_toml(original, "backup") if original is not None else None
        except ConfigError:
            return None
        stripped = strip_entries(data, before, entries)
        return text if stripped == data else dump_toml(stripped)
    return strip


strip_containerd = _toml_stripper(CTK_WRITES["containerd"])
strip_crio = _toml_stripper(CTK_WRITES["crio"])

STRIP = {"docker": strip_docker, "containerd": strip_containerd, "crio": strip_crio}
# what to take out by hand when the file does not parse
BY_HAND = {
    "docker": f'remove the "{NVIDIA}" entry of "runtimes" and "default-runtime": "{NVIDIA}", then restart docker',
    "containerd": f'remove the [plugins."...".containerd.runtimes.{NVIDIA}] tables, default_runtime_name = '
                  f'"{NVIDIA}" and the "{CONTAINERD_DROPIN.rsplit("/", 1)[0]}/*.toml" import, then restart containerd',
    "crio": f'remove the [crio.runtime.runtimes.{NVIDIA}] table and default_runtime = "{NVIDIA}", then restart crio',
}

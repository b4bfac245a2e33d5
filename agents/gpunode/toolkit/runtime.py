"""Container runtime configuration: enable CDI in containerd (and, on the legacy path only, register
NVIDIA's runtime handlers with containerd or CRI-O).

CDI is the default path: containerd 1.7 and later reads CDI specs once ``enable_cdi`` and
``cdi_spec_dirs`` are set in its CRI plugin (CRI-O 1.23 and later always does), and then injects the
devices the device plugin names, with no RuntimeClass and no NVIDIA binary. The ``nvidia`` handlers
are written only when asked for, and only when NVIDIA's ``nvidia-container-runtime`` binaries exist on
the host (:func:`missing_binaries`): a config naming a missing binary would fail every pod using it.

What ``gpunode-toolkit runtime configure`` does, as importable pieces:

* **Render** (pure): :func:`render_containerd` / :func:`render_crio` turn the current file texts and
  :class:`ConfigureOptions` into the new texts. The three handlers ``nvidia`` (name configurable),
  ``nvidia-cdi`` and ``nvidia-legacy`` are added as copies of the existing ``runc``/``crun`` (or
  default) runtime table, so options such as ``SystemdCgroup`` carry over, with ``runtime_type``
  (``io.containerd.runc.v2`` if unset) and ``options.BinaryName`` set (version-1 configs also get
  ``options.Runtime``, as NVIDIA's toolkit writes it). ``enable_cdi``/``cdi_spec_dirs`` go into the
  CRI plugin. Files are edited with tomlkit, so comments and formatting outside the changed keys stay
  byte for byte.
* **Plan** (reads files): :func:`plan_configure` / :func:`plan_revert` compare old and new bytes and
  return a :class:`Plan`; an empty plan means converged and nothing is touched. A config (or drop-in)
  reached through symlinks is edited at its target, resolved as the host would resolve it (absolute
  link targets taken under the host root), and a note says so; a link that climbs out of the host
  root, loops, or ends at something other than a regular file is refused with a config error naming
  the link and its target. The link itself is never replaced by a regular file.
* **Apply**: :func:`apply_plan` writes atomically (mode preserved), records what it did in a state
  JSON next to the runtime's main config (``<config>.gpunode-state.json``: which files were created,
  the original bytes of files it modified, the hash of what it wrote) and undoes its own writes when a
  later one fails. ``--revert`` uses that record to restore every file byte for byte.
* **Restart**: :func:`restart_runtime` with mode ``signal``, ``systemd`` or ``none``.

containerd config versions (a file without ``version`` is version 1; a missing or empty file is
created as version 2 unless ``--containerd-config-version`` says otherwise):

=======  ==============================================  ==========================
version  CRI plugin table                                 drop-in (``imports``)
=======  ==============================================  ==========================
1        ``plugins.cri``                                  no: edited in place
2        ``plugins."io.containerd.grpc.v1.cri"``          yes
3        ``plugins."io.containerd.cri.v1.runtime"``       yes (containerd 2.x)
=======  ==============================================  ==========================

Drop-in: containerd before 2.1 replaces a whole plugin table when an imported file has one, so the
drop-in starts as a copy of the main config's CRI plugin table (as NVIDIA's toolkit does). The source
is the file only (no ``containerd config dump``: the agent must work where containerd's binary is not
reachable); CRI settings that only live in *other* imported files are therefore not copied.

CRI-O: a drop-in ``crio.conf.d/99-nvidia.toml`` with ``[crio.runtime.runtimes.<name>]``
(``runtime_path``, ``runtime_type = "oci"``, other keys copied from the default/``crun``/``runc``
handler of the main ``crio.conf``) and ``crio.runtime.default_runtime`` when set as default. CRI-O
1.23 and later has CDI always enabled (``cdi_spec_dirs`` default ``/etc/cdi``, ``/var/run/cdi``), so
``--enable-cdi`` changes nothing there.

Restart: containerd has no configuration reload. Its SIGHUP is not handled, so ``signal`` makes the
daemon exit and relies on its supervisor (systemd ``Restart=always``, rke2/k3s) to start it again
with the new config (NVIDIA's default). CRI-O reloads on SIGHUP the options marked reloadable (the
runtime handler table among them in current versions); NVIDIA's default for CRI-O is ``systemd``.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import difflib
import fnmatch
import hashlib
import json
import os
import posixpath
import signal
import socket
import stat
import struct
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomlkit
import tomlkit.exceptions
from tomlkit.container import Container
from tomlkit.items import AoT, Item, Key, Table

from gpunode.common.atomic import atomic_write, atomic_write_json, fsync_dir
from gpunode.common.bounds import clip_tail, read_head, run_tail
from gpunode.common.cmdargs import unit_name_problem
from gpunode.common.errors import ConfigError

__all__ = [
    "CONTAINERD",
    "CRIO",
    "CRI_PLUGIN",
    "RESTART_MODES",
    "RUNTIMES",
    "ApplyError",
    "ConfigureOptions",
    "FileChange",
    "Handler",
    "Plan",
    "RestartError",
    "RevertError",
    "apply_plan",
    "cdi_enabled",
    "containerd_version",
    "decode_text",
    "default_runtime_name",
    "default_state_file",
    "handlers_from_paths",
    "imports_cover",
    "load_state",
    "local_path",
    "missing_binaries",
    "nvidia_handlers_present",
    "parse_toml",
    "plan_configure",
    "plan_revert",
    "read_file",
    "render_containerd",
    "render_crio",
    "resolve_config_path",
    "restart_runtime",
]

CONTAINERD = "containerd"
CRIO = "crio"
RUNTIMES = (CONTAINERD, CRIO)
RESTART_MODES = ("signal", "systemd", "none")

#: containerd config version -> key of the CRI plugin (the one holding ``containerd.runtimes``).
CRI_PLUGIN: Mapping[int, str] = {1: "cri", 2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}

DEFAULT_RUNTIME_TYPE = "io.containerd.runc.v2"
DEFAULT_CDI_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
NVIDIA_HANDLER_NAMES = ("nvidia", "nvidia-cdi", "nvidia-legacy")
_NVIDIA_BINARY_PREFIX = "nvidia-container-runtime"
STATE_SUFFIX = ".gpunode-state.json"
_STATE_VERSION = 1

DROP_IN_HEADER = (
    "# Written by gpunode-toolkit (runtime configure): CDI, and NVIDIA runtime handlers if asked for.\n"
    "# Regenerated on every configure; undo with `gpunode-toolkit runtime configure --revert`.\n"
)


class ApplyError(Exception):
    """A write failed; everything this apply had already written was put back."""


class RestartError(Exception):
    """The runtime could not be restarted (its configuration is already written)."""


class RevertError(Exception):
    """A revert cannot restore the recorded state safely (nothing was changed)."""


Doc = Mapping[str, Any]  # a TOML document or table as plain Python values
Obj = dict[str, Any]  # one being built (TOML), or the JSON state record
Toml = Any  # a tomlkit container or item, or the plain value one unwraps to: typed only at run time

# ------------------------------------------------------------------------------------ options


@dataclass(frozen=True)
class Handler:
    """One runtime handler: the name kubelet's RuntimeClass refers to and the binary it runs."""

    name: str
    path: str


def handlers_from_paths(
    name: str = "nvidia",
    nvidia: str = "/usr/local/nvidia/toolkit/nvidia-container-runtime",
    cdi: str = "/usr/local/nvidia/toolkit/nvidia-container-runtime.cdi",
    legacy: str = "/usr/local/nvidia/toolkit/nvidia-container-runtime.legacy",
) -> tuple[Handler, ...]:
    """The three handlers NVIDIA's toolkit registers: ``<name>``, ``nvidia-cdi``, ``nvidia-legacy``."""
    return (Handler(name, nvidia), Handler("nvidia-cdi", cdi), Handler("nvidia-legacy", legacy))


@dataclass(frozen=True)
class ConfigureOptions:
    """What to configure. Paths are host paths (as the runtime sees them)."""

    runtime: str
    config: str
    drop_in: str | None  # None or "": edit ``config`` in place
    handlers: tuple[Handler, ...] = field(default_factory=handlers_from_paths)
    set_as_default: bool = False
    enable_cdi: bool = False
    cdi_spec_dirs: tuple[str, ...] = DEFAULT_CDI_SPEC_DIRS
    config_version: int | None = None  # containerd: forced version for a missing/empty file
    runtime_type: str = DEFAULT_RUNTIME_TYPE

    @property
    def default_handler(self) -> str:
        return self.handlers[0].name


# ------------------------------------------------------------------------------------ parsing


def parse_toml(text: str, source: str) -> tomlkit.TOMLDocument:
    """Parse ``text``; :class:`ConfigError` naming ``source``, line and column when it is not TOML."""
    try:
        return tomlkit.parse(text)
    except tomlkit.exceptions.ParseError as exc:
        message = str(exc).split(" at line ")[0]
        raise ConfigError(source, [f"line {exc.line}, column {exc.col}: invalid TOML: {message}"]) from None


def _plain(value: object) -> object:
    unwrap = getattr(value, "unwrap", None)
    return unwrap() if callable(unwrap) else value


def _get(tree: Toml, path: Sequence[str]) -> Toml:
    node = tree
    for part in path:
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def containerd_version(doc: Doc, source: str = "<config>") -> int:
    """The file's ``version`` (absent: 1); :class:`ConfigError` for a version we do not know."""
    version = _plain(doc.get("version", 1))
    if isinstance(version, bool) or not isinstance(version, int) or version not in CRI_PLUGIN:
        raise ConfigError(source, [f"version: unsupported containerd config version {version!r} (1, 2, 3)"])
    return version


def _has_keys(doc: Doc) -> bool:
    return len(doc) > 0


def nvidia_handlers_present(
    config_text: str, runtime: str, *, names: Sequence[str] = NVIDIA_HANDLER_NAMES
) -> list[str]:
    """Names of the NVIDIA runtime handlers configured in one config file's text, in file order.

    A handler counts when its name is one of ``names`` or its binary (containerd ``options.BinaryName``,
    CRI-O ``runtime_path``) is an ``nvidia-container-runtime*``. containerd files are read at the CRI
    key their ``version`` implies. Raises :class:`ConfigError` when the text is not TOML.
    """
    tables = _handler_tables(config_text, runtime)
    found: list[str] = []
    for name, table in tables.items():
        if not isinstance(table, Mapping):
            continue
        binary = table.get("runtime_path") if runtime == CRIO else _get(table, ("options", "BinaryName"))
        nvidia_binary = isinstance(binary, str) and posixpath.basename(binary).startswith(
            _NVIDIA_BINARY_PREFIX
        )
        if name in names or nvidia_binary:
            found.append(str(name))
    return found


def _handler_tables(config_text: str, runtime: str) -> Doc:
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown runtime {runtime!r}; the choices are: {', '.join(RUNTIMES)}")
    doc = parse_toml(config_text, "<config>").unwrap()
    if runtime == CRIO:
        runtimes = _get(doc, ("crio", "runtime", "runtimes"))
    else:
        version = containerd_version(doc)
        runtimes = _get(doc, ("plugins", CRI_PLUGIN[version], "containerd", "runtimes"))
    return runtimes if isinstance(runtimes, Mapping) else {}


def cdi_enabled(config_text: str, runtime: str) -> bool | None:
    """containerd: the CRI plugin's ``enable_cdi`` in one config file's text (None when the file does not
    set it). CRI-O: always True (1.23 and later read CDI specs whatever the config says)."""
    if runtime == CRIO:
        return True
    doc = parse_toml(config_text, "<config>").unwrap()
    value = _get(doc, ("plugins", CRI_PLUGIN[containerd_version(doc)], "enable_cdi"))
    return value if isinstance(value, bool) else None


def missing_binaries(handlers: Sequence[Handler], host_root: str = "/") -> list[str]:
    """The handlers' binaries (host paths) that are not executable files on the host."""
    missing: list[str] = []
    for handler in handlers:
        try:
            local = local_path(host_root, handler.path)
            st = local.stat()
        except (OSError, ConfigError):
            missing.append(handler.path)
            continue
        if not stat.S_ISREG(st.st_mode) or not st.st_mode & 0o111:
            missing.append(handler.path)
    return missing


def default_runtime_name(config_text: str, runtime: str) -> str | None:
    """The default runtime handler a config file sets, or None when it sets none."""
    doc = parse_toml(config_text, "<config>").unwrap()
    if runtime == CRIO:
        value = _get(doc, ("crio", "runtime", "default_runtime"))
    else:
        version = containerd_version(doc)
        value = _get(doc, ("plugins", CRI_PLUGIN[version], "containerd", "default_runtime_name"))
    return value if isinstance(value, str) else None


def imports_cover(imports: Sequence[str], path: str, config_dir: str) -> bool:
    """Whether containerd's ``imports`` entries (globs; relative ones from the config's directory)
    already load the file ``path``."""
    for entry in imports:
        pattern = entry if posixpath.isabs(entry) else posixpath.join(config_dir, entry)
        if pattern == path or fnmatch.fnmatchcase(path, pattern):
            return True
    return False


# ------------------------------------------------------------------------------------ editing


def _runtime_entry(base: Doc | None, handler: Handler, opts: ConfigureOptions, version: int) -> Obj:
    """The desired handler table: a copy of ``base`` (runc/crun) with our type and binary."""
    table: Obj = copy.deepcopy(dict(base)) if isinstance(base, Mapping) else {}
    if opts.runtime == CRIO:
        table.pop("runtime_path", None)
        table["runtime_path"] = handler.path
        table["runtime_type"] = "oci"
        return table
    table.setdefault("runtime_type", opts.runtime_type)
    options = table.get("options")
    options = dict(options) if isinstance(options, Mapping) else {}
    options["BinaryName"] = handler.path
    if version == 1:
        options["Runtime"] = handler.path
    table["options"] = options
    return table


def _base_runtime(runtimes: object, default_name: object, ours: Sequence[str]) -> Doc | None:
    if not isinstance(runtimes, Mapping):
        return None
    for name in (default_name, "runc", "crun"):
        if isinstance(name, str) and name not in ours and isinstance(runtimes.get(name), Mapping):
            return dict(runtimes[name])
    return None


@dataclass
class _Edits:
    """Desired changes below one root table: ``sets`` (merged recursively) and ``deletes``."""

    sets: list[tuple[tuple[str, ...], object]] = field(default_factory=list)
    deletes: list[tuple[str, ...]] = field(default_factory=list)


def _section_edits(section: Doc, opts: ConfigureOptions, version: int) -> _Edits:
    """Edits relative to the CRI plugin table (containerd) or ``crio.runtime`` (CRI-O)."""
    edits = _Edits()
    ours = [h.name for h in opts.handlers]
    if opts.runtime == CRIO:
        runtimes_path: tuple[str, ...] = ("runtimes",)
        default_path: tuple[str, ...] = ("default_runtime",)
    else:
        runtimes_path = ("containerd", "runtimes")
        default_path = ("containerd", "default_runtime_name")
    runtimes = _get(section, runtimes_path)
    current_default = _get(section, default_path)
    base = _base_runtime(runtimes, current_default, ours)
    for handler in opts.handlers:
        edits.sets.append(((*runtimes_path, handler.name), _runtime_entry(base, handler, opts, version)))
    if opts.set_as_default:
        edits.sets.append((default_path, opts.default_handler))
    elif isinstance(current_default, str) and current_default in ours:
        edits.deletes.append(default_path)  # not asked to be the default: never leave ours as default
    if opts.enable_cdi and opts.runtime == CONTAINERD:
        edits.sets.append((("enable_cdi",), True))
        edits.sets.append((("cdi_spec_dirs",), list(opts.cdi_spec_dirs)))
    return edits


def _apply_plain(tree: Obj, edits: _Edits) -> None:
    for path, value in edits.sets:
        node = tree
        for part in path[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        _merge_plain(node, path[-1], value)
    for path in edits.deletes:
        parent = _get(tree, path[:-1])
        if isinstance(parent, dict):
            parent.pop(path[-1], None)


def _merge_plain(node: Obj, key: str, value: object) -> None:
    if isinstance(value, dict) and isinstance(node.get(key), dict):
        for sub_key, sub_value in value.items():
            _merge_plain(node[key], sub_key, sub_value)
    else:
        node[key] = copy.deepcopy(value)


# tomlkit, format-preserving --------------------------------------------------------------------


def _body(table: object) -> list[tuple[Key | None, Item]]:
    if isinstance(table, Table):
        return list(table.value.body)
    if isinstance(table, Container):
        return list(table.body)
    return []


def _key_indent(table: object) -> str | None:
    for key, item in _body(table):
        if key is not None and not isinstance(item, Table | AoT):
            indent = getattr(getattr(item, "trivia", None), "indent", None)
            return indent if isinstance(indent, str) else None
    return None


def _child_table_indent(table: object) -> str | None:
    for key, item in _body(table):
        if key is not None and isinstance(item, Table) and not item.is_super_table():
            return str(item.trivia.indent)
    return None


def _new_item(value: object, indent: str) -> Item:
    item = tomlkit.item(value)
    if indent:
        item.trivia.indent = indent
    return item


def _new_table(value: Doc, header: str, keys: str) -> Table:
    """A table whose header and keys carry these absolute indents (children added before the
    header indent is set, so tomlkit does not prefix them with it)."""
    table = tomlkit.table()
    step = keys[len(header) :] if keys.startswith(header) else ""
    for key, sub in value.items():
        if isinstance(sub, Mapping):
            table.add(key, _new_table(sub, keys, keys + step))
        else:
            table.add(key, _new_item(sub, keys))
    table.trivia.indent = header
    return table


def _relative(indent: str, parent: object) -> str:
    """tomlkit prefixes an item appended to an indented table with the table's indent: undo that."""
    if not isinstance(parent, Table):
        return indent
    prefix = str(parent.trivia.indent).lstrip("\n")
    prefix = prefix[len(prefix.rstrip(" ")) :]
    return indent[len(prefix) :] if prefix and indent.startswith(prefix) else indent


def _table_style(parent: object) -> tuple[str, str]:
    """(header indent, key indent) for a new table inside ``parent``, copied from its neighbours."""
    for key, item in _body(parent):
        if key is not None and isinstance(item, Table) and not item.is_super_table():
            header = str(item.trivia.indent)
            keys = _key_indent(item)
            return header, keys if keys is not None else header
    keys = _key_indent(parent)
    if keys is not None:
        parent_header = str(parent.trivia.indent) if isinstance(parent, Table) else ""
        step = keys[len(parent_header) :] if keys.startswith(parent_header) else ""
        return keys, keys + step
    return "", ""


def _set_styled(container: Toml, key: str, value: object) -> bool:
    """Make ``container[key]`` hold ``value``, merging tables; True when something changed."""
    if key in container:
        current = container[key]
        if (
            isinstance(value, Mapping)
            and isinstance(_plain(current), Mapping)
            and hasattr(current, "__setitem__")
        ):
            changed = False
            for sub_key, sub_value in value.items():
                changed |= _set_styled(current, sub_key, sub_value)
            return changed
        if _plain(current) == value:
            return False
        if isinstance(value, Mapping):
            del container[key]  # a scalar where we need a table: replace it
        else:
            container[key] = value  # tomlkit keeps the key's position
            return True
    if isinstance(value, Mapping):
        header, keys = _table_style(container)
        table = _new_table(value, header, keys)
        table.trivia.indent = _relative(header, container)
        container[key] = table
    else:
        indent = _key_indent(container)
        if indent is None and isinstance(container, Table):
            indent = _child_table_indent(container) or ""
        container[key] = _new_item(value, _relative(indent or "", container))
    return True


def _ensure_table(container: Toml, key: str) -> Toml:
    if key in container and isinstance(_plain(container[key]), Mapping):
        return container[key]
    if key in container:
        del container[key]
    table = tomlkit.table(is_super_table=True)
    container[key] = table
    return container[key]


def _apply_doc(doc: tomlkit.TOMLDocument, root: Sequence[str], edits: _Edits) -> bool:
    changed = False
    for path, value in edits.sets:
        node: Toml = doc
        full = (*root, *path)
        for part in full[:-1]:
            if part not in node or not isinstance(_plain(node[part]), Mapping):
                changed = True
            node = _ensure_table(node, part)
        changed |= _set_styled(node, full[-1], value)
    for path in edits.deletes:
        parent = _get(doc, (*root, *path[:-1]))
        if parent is not None and path[-1] in parent:
            del parent[path[-1]]
            changed = True
    return changed


def _add_import(doc: tomlkit.TOMLDocument, entry: str) -> None:
    current = doc.get("imports")
    if current is not None and isinstance(_plain(current), list) and hasattr(current, "append"):
        current.append(entry)
    else:
        doc["imports"] = [entry]


def _verify(text: str, source: str, opts: ConfigureOptions, version: int) -> None:
    """Refuse to write a rendering that does not read back as intended (a tomlkit corner case)."""
    try:
        tables = _handler_tables(text, opts.runtime) if opts.runtime == CRIO else None
        doc = tomlkit.parse(text).unwrap()
    except (tomlkit.exceptions.ParseError, ConfigError) as exc:
        raise ApplyError(
            f"{source}: the edited config does not parse back ({exc}); nothing written"
        ) from None
    if opts.runtime == CRIO:
        assert tables is not None
        ok = all(_get(tables, (h.name, "runtime_path")) == h.path for h in opts.handlers)
    else:
        runtimes = _get(doc, ("plugins", CRI_PLUGIN[version], "containerd", "runtimes"))
        ok = all(_get(runtimes, (h.name, "options", "BinaryName")) == h.path for h in opts.handlers)
    if not ok:
        raise ApplyError(
            f"{source}: the edited config does not hold the handlers as intended; nothing written"
        )


# ----------------------------------------------------------------------------------- rendering


@dataclass(frozen=True)
class Rendered:
    """New texts: ``main`` (None: leave the file alone) and ``drop_in`` (None: no drop-in)."""

    main: str | None
    drop_in: str | None
    version: int | None = None
    notes: tuple[str, ...] = ()


def render_containerd(main_text: str | None, opts: ConfigureOptions, *, source: str = "<config>") -> Rendered:
    """New containerd texts for ``opts``; ``main_text`` None means the config file does not exist.

    Pure. The drop-in (version >= 2 and ``opts.drop_in`` set) is regenerated whole: a copy of the main
    config's CRI plugin table with our handlers merged in; the main config only gains an ``imports``
    entry covering it (and ``version`` when the file was new or empty).
    """
    doc = parse_toml(main_text or "", source)
    notes: list[str] = []
    empty = not _has_keys(doc)
    if empty:
        version = opts.config_version or 2
    else:
        version = containerd_version(doc, source)
        if opts.config_version is not None and opts.config_version != version:
            raise ConfigError(
                source,
                [
                    f"version: the file is containerd config version {version} but "
                    f"--containerd-config-version is {opts.config_version} (it only applies to a new file)"
                ],
            )
    cri_key = CRI_PLUGIN[version]
    section = _get(doc.unwrap(), ("plugins", cri_key))
    if section is not None and not isinstance(section, Mapping):
        raise ConfigError(source, [f"plugins.{cri_key}: expected a table"])
    section = section or {}
    edits = _section_edits(section, opts, version)
    use_drop_in = bool(opts.drop_in) and version >= 2
    if opts.drop_in and version == 1:
        notes.append(
            f"{source}: containerd config version 1 has no imports; editing it in place "
            "instead of writing a drop-in"
        )
    if not use_drop_in:
        changed = False
        if empty and version >= 2:
            doc["version"] = version  # the file has no keys yet: nothing to keep in front
            changed = True
        changed |= _apply_doc(doc, ("plugins", cri_key), edits)
        text = tomlkit.dumps(doc) if changed else (main_text or "")
        _verify(text, source, opts, version)
        return Rendered(
            main=text if changed else main_text, drop_in=None, version=version, notes=tuple(notes)
        )

    assert opts.drop_in is not None
    # the drop-in: a copy of the whole CRI section (containerd < 2.1 replaces plugin tables on import)
    copied: Obj = copy.deepcopy(dict(section))
    _apply_plain(copied, edits)
    drop_in_doc = tomlkit.document()
    drop_in_doc["version"] = version
    drop_in_doc["plugins"] = {cri_key: copied}
    drop_in_text = DROP_IN_HEADER + tomlkit.dumps(drop_in_doc)
    _verify(drop_in_text, opts.drop_in, opts, version)

    main_changed = False
    if empty:
        doc["version"] = version  # the file has no keys yet: nothing to keep in front
        main_changed = True
    imports = _plain(doc.get("imports", []))
    if not isinstance(imports, list) or not all(isinstance(i, str) for i in imports):
        raise ConfigError(source, ["imports: expected a list of paths"])
    config_dir = posixpath.dirname(opts.config)
    if not imports_cover(imports, opts.drop_in, config_dir):
        drop_dir = posixpath.dirname(opts.drop_in)
        entry = posixpath.join(drop_dir, "*.toml") if opts.drop_in.endswith(".toml") else opts.drop_in
        _add_import(doc, entry)
        main_changed = True
    new_main = tomlkit.dumps(doc) if main_changed else main_text
    if new_main is not None:
        parse_toml(new_main, source)  # must read back
    return Rendered(main=new_main, drop_in=drop_in_text, version=version, notes=tuple(notes))


def render_crio(main_text: str | None, opts: ConfigureOptions, *, source: str = "<config>") -> Rendered:
    """New CRI-O texts: the drop-in (or, without one, the edited main config)."""
    doc = parse_toml(main_text or "", source)
    section = _get(doc.unwrap(), ("crio", "runtime"))
    if section is not None and not isinstance(section, Mapping):
        raise ConfigError(source, ["crio.runtime: expected a table"])
    section = section or {}
    edits = _section_edits(section, opts, 0)
    notes: list[str] = []
    if opts.enable_cdi:
        notes.append("CRI-O (1.23 and later) always has CDI enabled; --enable-cdi changes nothing there")
    if not edits.sets and not edits.deletes:  # CDI only: CRI-O needs no setting at all
        return Rendered(main=main_text, drop_in=None, notes=tuple(notes))
    if not opts.drop_in:
        changed = _apply_doc(doc, ("crio", "runtime"), edits)
        text = tomlkit.dumps(doc) if changed else (main_text or "")
        _verify(text, source, opts, 0)
        return Rendered(main=text if changed else main_text, drop_in=None, notes=tuple(notes))
    plain: Obj = {}
    # CRI-O merges drop-ins key by key: the drop-in holds only what we set (deletes act on crio.conf,
    # which we do not touch, so a default pointing at our handler there is left alone).
    _apply_plain(plain, _Edits(sets=edits.sets))
    drop_in_doc = tomlkit.document()
    drop_in_doc["crio"] = {"runtime": plain}
    text = DROP_IN_HEADER + tomlkit.dumps(drop_in_doc)
    _verify(text, opts.drop_in, opts, 0)
    return Rendered(main=main_text, drop_in=text, notes=tuple(notes))


# -------------------------------------------------------------------------------------- plans


@dataclass(frozen=True)
class FileChange:
    """One file's old and new bytes (None: absent) at ``path`` (where this process sees it)."""

    path: Path
    before: bytes | None
    after: bytes | None
    mode: int = 0o644

    @property
    def verb(self) -> str:
        if self.before is None:
            return "created"
        return "removed" if self.after is None else "updated"

    def diff(self) -> str:
        """A unified diff (``/dev/null`` for a side that does not exist)."""
        old = (self.before or b"").decode("utf-8", "replace").splitlines(keepends=True)
        new = (self.after or b"").decode("utf-8", "replace").splitlines(keepends=True)
        lines = difflib.unified_diff(
            old,
            new,
            fromfile=str(self.path) if self.before is not None else "/dev/null",
            tofile=str(self.path) if self.after is not None else "/dev/null",
        )
        return "".join(
            line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines
        )


@dataclass(frozen=True)
class Plan:
    """Files to change, the state record to leave behind, directories to create or remove."""

    changes: tuple[FileChange, ...]
    state_file: Path
    state: Obj | None  # the record to write; None: remove it
    make_dirs: tuple[Path, ...] = ()
    remove_dirs: tuple[Path, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.changes

    def diff(self) -> str:
        return "".join(change.diff() for change in self.changes)


def default_state_file(config: str) -> str:
    """Where the revert record lives: next to the main config, outside any drop-in directory."""
    return config + STATE_SUFFIX


def local_path(host_root: str | os.PathLike[str], host_path: str) -> Path:
    """Where this process sees ``host_path`` (the host's / is at ``host_root``)."""
    root = os.fspath(host_root)
    if root in ("", "/"):
        return Path(os.path.abspath(host_path))
    parts = Path(host_path).parts
    if not Path(host_path).is_absolute() or ".." in parts:
        raise ConfigError(host_path, ["with --host-root, paths must be absolute and free of '..'"])
    return Path(root).joinpath(*parts[1:])


_MAX_LINKS = 40  # as the kernel's path walk


def _link_refused(link: Path, target: str, why: str) -> ConfigError:
    return ConfigError(
        str(link),
        [
            f"is a symlink to {target}, which {why}; refusing to edit through it (point the link at a "
            f"regular file under the host root, or replace the link with the file)"
        ],
    )


def resolve_config_path(host_root: str | os.PathLike[str], host_path: str) -> tuple[Path, str | None]:
    """Where a config file really is: ``(local path, note)``. Symlinks in ``host_path`` (the file or a
    directory above it) are followed the way the host would follow them, with the host root as ``/``
    (an absolute target is a host path); the note says which link led where, None when no link was
    followed. :class:`ConfigError` naming the link and its target when the walk climbs above the host
    root, meets more than 40 links, or ends at an existing non-regular file. Components that do not
    exist yet are kept as written (the write creates them)."""
    literal = local_path(host_root, host_path)
    root = os.path.abspath(os.fspath(host_root) or "/")
    pending = [p for p in host_path.split("/") if p][::-1]  # a stack: the next component last
    done: list[str] = []
    hops = 0
    first_link: tuple[Path, str] | None = None
    while pending:
        part = pending.pop()
        if part == ".":
            continue
        if part == "..":
            if done:
                done.pop()
            elif first_link is not None:  # a link's target climbs out of the host root
                raise _link_refused(*first_link, "climbs above the host root")
            continue  # '/..' written in the path itself (no --host-root) is '/', as for the kernel
        local = os.path.join(root, *done, part)
        try:
            is_link = stat.S_ISLNK(os.lstat(local).st_mode)
        except OSError:  # absent (or under a non-directory): kept as written; the write says why
            is_link = False
        if not is_link:
            done.append(part)
            continue
        hops += 1
        target = os.readlink(local)
        if first_link is None:
            first_link = (Path(local), target)
        if hops > _MAX_LINKS:
            raise _link_refused(*first_link, f"goes through more than {_MAX_LINKS} links")
        if target.startswith("/"):
            done = []
        pending.extend([p for p in target.split("/") if p][::-1])
    resolved = Path(root).joinpath(*done)
    if first_link is None:
        return literal, None
    try:
        st = os.stat(resolved)
    except OSError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise _link_refused(*first_link, f"resolves to {resolved}, not a regular file")
    if resolved == literal:
        return literal, None
    link, target = first_link
    return resolved, f"{literal} is reached through a symlink ({link} -> {target}): editing {resolved}"


def read_file(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):  # the write will say why it cannot be created
        return None
    except IsADirectoryError:
        raise ConfigError(str(path), ["is a directory, expected a file"]) from None


def decode_text(data: bytes | None, source: str) -> str | None:
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(source, [f"not UTF-8 text (byte {exc.start})"]) from None


def _mode(path: Path, default: int = 0o644) -> int:
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        return default


def _sha(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def load_state(path: Path) -> Obj | None:
    """The revert record, or None when there is none; :class:`ConfigError` when unreadable."""
    data = read_file(path)
    if data is None:
        return None
    try:
        state = json.loads(data)
    except ValueError as exc:
        raise ConfigError(str(path), [f"revert record is not JSON: {exc}"]) from None
    if (
        not isinstance(state, dict)
        or state.get("version") != _STATE_VERSION
        or not isinstance(state.get("files"), dict)
    ):
        raise ConfigError(str(path), ["not a gpunode runtime revert record (version 1)"])
    return state


def _missing_dirs(path: Path) -> list[Path]:
    missing: list[Path] = []
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        missing.append(parent)
        parent = parent.parent
    return list(reversed(missing))


def plan_configure(opts: ConfigureOptions, *, host_root: str = "/", state_file: str | None = None) -> Plan:
    """Read the runtime's files and plan the writes that make them match ``opts``."""
    if opts.runtime not in RUNTIMES:
        raise ValueError(f"unknown runtime {opts.runtime!r}; the choices are: {', '.join(RUNTIMES)}")
    config_local, config_note = resolve_config_path(host_root, opts.config)
    link_notes = [config_note] if config_note else []
    main_before = read_file(config_local)
    main_text = decode_text(main_before, str(config_local))
    if opts.runtime == CONTAINERD:
        rendered = render_containerd(main_text, opts, source=str(config_local))
    else:
        rendered = render_crio(main_text, opts, source=str(config_local))

    targets: list[tuple[Path, bytes | None, str | None]] = [(config_local, main_before, rendered.main)]
    if rendered.drop_in is not None:
        assert opts.drop_in
        drop_local, drop_note = resolve_config_path(host_root, opts.drop_in)
        link_notes += [drop_note] if drop_note else []
        targets.append((drop_local, read_file(drop_local), rendered.drop_in))
    changes = tuple(
        FileChange(path, before, after.encode("utf-8"), _mode(path))
        for path, before, after in targets
        if after is not None and after.encode("utf-8") != before
    )
    state_local = local_path(host_root, state_file or default_state_file(opts.config))
    notes = (*link_notes, *rendered.notes)
    if not changes:
        return Plan((), state_local, load_state(state_local), notes=notes)

    state = load_state(state_local) or {
        "version": _STATE_VERSION,
        "runtime": opts.runtime,
        "files": {},
        "dirs": [],
    }
    make_dirs: list[Path] = []
    for change in changes:
        for directory in _missing_dirs(change.path):
            if directory not in make_dirs:
                make_dirs.append(directory)
    for directory in _missing_dirs(state_local):
        if directory not in make_dirs:
            make_dirs.append(directory)
    dirs = list(state.get("dirs", []))
    for directory in make_dirs:
        if str(directory) not in dirs:
            dirs.append(str(directory))
    state["dirs"] = dirs
    files = state["files"]
    for change in changes:
        key = str(change.path)
        if key not in files:  # the first change we make to a file: keep what was there before
            files[key] = {
                "created": change.before is None,
                "original": None
                if change.before is None
                else base64.b64encode(change.before).decode("ascii"),
                "mode": change.mode,
            }
        files[key]["written_sha256"] = _sha(change.after)
    return Plan(changes, state_local, state, tuple(make_dirs), notes=notes)


def plan_revert(state_file: Path, *, force: bool = False) -> Plan:
    """Plan the restoration of every file in the record (created ones removed) to its first state.

    Raises :class:`RevertError` when a file was changed by someone else since we wrote it (unless
    ``force``): restoring it would silently drop their edit.
    """
    state = load_state(state_file)
    if state is None:
        return Plan((), state_file, None)
    changes: list[FileChange] = []
    drifted: list[str] = []
    for key, record in state["files"].items():
        path = Path(key)
        current = read_file(path)
        if _sha(current) != record.get("written_sha256"):
            drifted.append(key)
        target = None if record.get("created") else base64.b64decode(record.get("original") or "")
        if current != target:
            changes.append(FileChange(path, current, target, int(record.get("mode", 0o644))))
    if drifted and not force:
        raise RevertError(
            "changed since gpunode-toolkit wrote them (restoring would drop those edits; "
            "--force restores anyway): " + ", ".join(drifted)
        )
    remove_dirs = tuple(Path(d) for d in reversed(state.get("dirs", [])))
    return Plan(tuple(changes), state_file, None, remove_dirs=remove_dirs)


def apply_plan(plan: Plan) -> None:
    """Carry out ``plan``: atomic writes with the recorded modes, the state record, directories.

    On a failure every file this call already changed is restored and :class:`ApplyError` raised.
    """
    created_dirs: list[Path] = []
    done: list[FileChange] = []
    old_state = read_file(plan.state_file)
    try:
        for directory in plan.make_dirs:
            if not directory.exists():
                directory.mkdir(mode=0o755)
                created_dirs.append(directory)
        if plan.state is not None:
            atomic_write_json(plan.state_file, plan.state, 0o600)
        for change in plan.changes:
            if change.after is None:
                with contextlib.suppress(FileNotFoundError):
                    change.path.unlink()
                fsync_dir(change.path.parent)
            else:
                atomic_write(change.path, change.after, change.mode)
            done.append(change)
    except OSError as exc:
        _rollback(done, plan.state_file, old_state, created_dirs)
        name = exc.filename or ""
        raise ApplyError(f"cannot write {name}: {exc.strerror or exc}; nothing was changed") from None
    if plan.state is None:
        with contextlib.suppress(FileNotFoundError):
            plan.state_file.unlink()
            fsync_dir(plan.state_file.parent)
        for directory in plan.remove_dirs:
            with contextlib.suppress(OSError):  # not empty (someone else's files) or already gone
                directory.rmdir()


def _rollback(done: list[FileChange], state_file: Path, old_state: bytes | None, dirs: list[Path]) -> None:
    for change in reversed(done):
        with contextlib.suppress(OSError):
            if change.before is None:
                change.path.unlink()
            else:
                atomic_write(change.path, change.before, change.mode)
    with contextlib.suppress(OSError):
        if old_state is None:
            state_file.unlink(missing_ok=True)
        else:
            atomic_write(state_file, old_state, 0o600)
    for directory in reversed(dirs):
        with contextlib.suppress(OSError):
            directory.rmdir()


# ------------------------------------------------------------------------------------- restart


def _peer_pid(sock_path: Path) -> int | None:
    """The pid of the process listening on a Unix socket (SO_PEERCRED), or None."""
    if not sock_path.exists():
        return None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(2.0)
        try:
            sock.connect(os.fspath(sock_path))
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        except OSError:
            return None
    pid = int(struct.unpack("3i", creds)[0])
    return pid if pid > 0 else None


def _pids_by_name(proc: Path, name: str) -> list[int]:
    pids: list[int] = []
    try:
        entries = list(proc.iterdir())
    except OSError:
        return pids
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
        except OSError:
            continue
        if comm == name:
            pids.append(int(entry.name))
    return sorted(pids)


def find_runtime_pid(
    runtime: str, *, host_root: str = "/", pid_file: str | None = None, socket_path: str | None = None
) -> tuple[int, str]:
    """(pid, how it was found): the pid file, else the socket's peer, else the process name."""
    if pid_file:
        local = local_path(host_root, pid_file)
        try:
            return int(read_head(local, 64).strip()), f"pid file {local}"  # bounded: a link to /dev/zero
        except (OSError, ValueError) as exc:
            raise RestartError(f"cannot read a pid from {local}: {exc}") from None
    if socket_path:
        local = local_path(host_root, socket_path)
        pid = _peer_pid(local)
        if pid is not None:
            return pid, f"socket {local}"
    proc = local_path(host_root, "/proc")
    pids = _pids_by_name(proc, runtime)
    if len(pids) == 1:
        return pids[0], f"process name {runtime!r} in {proc}"
    if not pids:
        raise RestartError(
            f"no {runtime} process found (socket {socket_path or '-'}, {proc}); "
            "pass --pid-file or --socket, or use --restart-mode=systemd"
        )
    raise RestartError(
        f"several {runtime} processes ({', '.join(map(str, pids))}); pass --pid-file or --socket"
    )


def restart_runtime(
    runtime: str,
    mode: str,
    *,
    host_root: str = "/",
    pid_file: str | None = None,
    socket_path: str | None = None,
    systemctl: str | None = None,
    unit: str | None = None,
    timeout: float = 120.0,
) -> str:
    """Make the runtime pick up its new configuration; returns what was done, in words.

    ``signal``: SIGHUP to the runtime's pid (containerd exits and its supervisor restarts it; CRI-O
    reloads). ``systemd``: ``systemctl restart <unit>`` (argv, no shell; ``chroot <host_root>`` in
    front when a host root is set and no ``systemctl`` path was given). ``none``: nothing.
    """
    if mode == "none":
        return f"{runtime} not restarted (--restart-mode=none)"
    if mode == "signal":
        pid, how = find_runtime_pid(runtime, host_root=host_root, pid_file=pid_file, socket_path=socket_path)
        try:
            os.kill(pid, signal.SIGHUP)
        except OSError as exc:
            raise RestartError(f"cannot signal {runtime} pid {pid} (from {how}): {exc.strerror}") from None
        return f"sent SIGHUP to {runtime} pid {pid} (from {how})"
    if mode == "systemd":
        problem = unit_name_problem(unit or runtime)
        if problem is not None:  # an argument for systemctl, never an option
            raise RestartError(f"not restarting {runtime}: {problem}")
        if systemctl:
            argv = [systemctl]
        elif host_root not in ("", "/"):
            argv = ["chroot", host_root, "systemctl"]
        else:
            argv = ["systemctl"]
        argv += ["restart", unit or runtime]
        try:
            done = run_tail(argv, timeout=timeout)  # only the output's tail is kept
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RestartError(f"{' '.join(argv)} failed: {exc}") from None
        if done.returncode != 0:
            said = done.stderr if done.stderr.total else done.stdout
            detail = clip_tail(said.text().strip())
            raise RestartError(f"{' '.join(argv)} exited {done.returncode}: {detail}")
        return f"ran {' '.join(argv)}"
    raise ValueError(f"unknown restart mode {mode!r}; the choices are: {', '.join(RESTART_MODES)}")

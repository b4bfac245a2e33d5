"""Choosing one named config file out of a directory by a node label (what NVIDIA's config-manager does).

A ConfigMap mounted as a directory holds several named configs (``default``, ``sliced``, ...); the node
label ``nvidia.com/device-plugin.config`` names the one a node should use. :func:`select_config` makes
that choice as a pure function of the names present, the label value, the default config and the
fallback strategies, so every agent that honours such a label (the device plugin now, feature discovery
later) decides the same way. :func:`list_configs` lists a directory the way the choice needs it,
leaving out the ConfigMap's own bookkeeping (``..data``, ``..2026_01_01_...``) and subdirectories.

The order, as in NVIDIA's config-manager:

1. the label value, which must name a file present;
2. else ``--default-config``;
3. else the fallback strategies in order: ``named`` (a file called ``default``), ``single`` (the only
   file there is), ``empty`` (no file at all: built-in defaults).

Unlike config-manager, a label (or default config) naming a file that is not there is not the end: the
result carries the problem in ``error`` *and* whatever the rest of the chain picks, so the caller can
report the problem and still serve (or keep what it already serves).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from gpunode.common.cli import FlagSet

__all__ = [
    "DEFAULT_FALLBACKS",
    "DEFAULT_NAME",
    "DEVICE_PLUGIN_CONFIG_LABEL",
    "FALLBACK_STRATEGIES",
    "Selection",
    "SelectionSource",
    "add_label_config_flags",
    "is_config_name",
    "list_configs",
    "parse_fallback_strategies",
    "select_config",
]

DEVICE_PLUGIN_CONFIG_LABEL = "nvidia.com/device-plugin.config"
DEFAULT_NAME = "default"  # what the ``named`` fallback looks for
FALLBACK_STRATEGIES = ("named", "single", "empty")
DEFAULT_FALLBACKS = ("named", "single")  # the GPU Operator's and the helm chart's choice

SelectionSource = Literal["label", "default-config", "named", "single", "empty"]


@dataclass(frozen=True)
class Selection:
    """The outcome of :func:`select_config`.

    ``source`` says how ``name`` was chosen; ``name`` is None for the ``empty`` fallback (no file:
    built-in defaults) and when nothing could be chosen (``source`` None too). ``error`` is a one-line
    problem to report (a label or default config naming a missing file, or no choice at all); it may
    come together with a choice made further down the chain. ``why`` is a short human explanation.
    """

    name: str | None
    source: SelectionSource | None
    why: str
    error: str | None = None

    @property
    def chosen(self) -> bool:
        """Whether anything was chosen (a file, or ``empty``)."""
        return self.source is not None


def parse_fallback_strategies(text: str | Sequence[str]) -> tuple[str, ...]:
    """``"named,single"`` (flag / env form) or a list -> ``("named", "single")``, in order, deduplicated.

    An empty text means no fallbacks; ``ValueError`` names an unknown strategy and lists the known ones.
    """
    items = text.split(",") if isinstance(text, str) else list(text)
    out: list[str] = []
    for raw in items:
        item = raw.strip().lower()
        if not item:
            continue
        if item not in FALLBACK_STRATEGIES:
            raise ValueError(
                f"unknown fallback strategy {raw.strip()!r}: must be one of {', '.join(FALLBACK_STRATEGIES)}"
            )
        if item not in out:
            out.append(item)
    return tuple(out)


def is_config_name(name: str) -> bool:
    """Whether a directory entry's name can be a config: not empty, no ``/``, not hidden.

    Hidden names cover a ConfigMap volume's internals: ``..data`` (the symlink kubelet swaps atomically),
    ``..data_tmp`` and the timestamped ``..2026_01_01_00_00_00.123`` directories, and other dotfiles.
    """
    return bool(name) and not name.startswith(".") and "/" not in name and "\0" not in name


def list_configs(directory: str | os.PathLike[str]) -> tuple[str, ...]:
    """The config names in ``directory``, sorted: regular files (symlinks followed, as a ConfigMap's
    ``name -> ..data/name`` entries are), no subdirectories, no dangling links, no ConfigMap internals.

    Raises ``OSError`` when the directory cannot be listed.
    """
    names: list[str] = []
    with os.scandir(directory) as entries:
        for entry in entries:
            if not is_config_name(entry.name):
                continue
            try:
                if entry.is_file(follow_symlinks=True):
                    names.append(entry.name)
            except OSError:  # vanished meanwhile, or unreadable: not a config we can use
                continue
    return tuple(sorted(names))


def _have(names: Sequence[str]) -> str:
    return ", ".join(names) if names else "no config files"


def select_config(
    available: Collection[str],
    label: str | None,
    *,
    default_config: str | None = None,
    fallbacks: Sequence[str] = DEFAULT_FALLBACKS,
    where: str | os.PathLike[str] = "the config directory",
) -> Selection:
    """Choose the config for a node: the label's value, else ``default_config``, else ``fallbacks``.

    ``available`` holds the names present (entries that :func:`is_config_name` rejects are ignored);
    ``label`` is the node label's value (None or ``""``: unset); ``where`` names the directory in
    messages. Pure: no file system access.
    """
    names = sorted({n for n in available if is_config_name(n)})
    place = os.fspath(where)
    problems: list[str] = []
    if label:
        if label in names:
            return Selection(label, "label", f'the node label names "{label}"')
        problems.append(f'config "{label}" not found in {place} (have: {_have(names)})')
        lead = f'the node label names "{label}", which is missing; '
    else:
        lead = "no node label; "
    if default_config:
        if default_config in names:
            return Selection(
                default_config,
                "default-config",
                lead + f'the default config "{default_config}"',
                _join(problems),
            )
        problems.append(f'default config "{default_config}" not found in {place} (have: {_have(names)})')
        lead += f'default config "{default_config}" missing; '
    for strategy in fallbacks:
        if strategy == "named" and DEFAULT_NAME in names:
            return Selection(
                DEFAULT_NAME, "named", lead + f'the file named "{DEFAULT_NAME}"', _join(problems)
            )
        if strategy == "single" and len(names) == 1:
            return Selection(names[0], "single", lead + "the only file", _join(problems))
        if strategy == "empty":
            return Selection(None, "empty", lead + "no file (built-in defaults)", _join(problems))
    tried = f"fallbacks {', '.join(fallbacks)} matched nothing" if fallbacks else "no fallbacks"
    if problems:
        problems.append(tried)
    else:
        problems.append(f"no config selected in {place}: no node label, {tried} (have: {_have(names)})")
    return Selection(None, None, lead + "nothing matched", _join(problems))


def _join(problems: Sequence[str]) -> str | None:
    return "; ".join(problems) if problems else None


def _fallback_list(text: str) -> str:
    """``"named, single"`` -> ``"named,single"``; ``ValueError`` names an unknown strategy."""
    return ",".join(parse_fallback_strategies(text))


def add_label_config_flags(flags: FlagSet) -> None:
    """config-manager's flags, for agents whose ``--config-file`` may name a directory of configs."""
    flags.add(
        "--node-label",
        env="NODE_LABEL",
        default=DEVICE_PLUGIN_CONFIG_LABEL,
        metavar="KEY",
        help="with --config-file naming a directory: the node label whose value names the config to use",
    )
    flags.add(
        "--default-config",
        env="DEFAULT_CONFIG",
        metavar="NAME",
        help="with a config directory: the config used when the node label is unset",
    )
    flags.add(
        "--fallback-strategies",
        env="FALLBACK_STRATEGIES",
        type=_fallback_list,
        default="named,single",
        metavar="LIST",
        help="with a config directory and no label or default config: named (the file 'default'), "
        "single (the only file), empty (no file), tried in order",
    )

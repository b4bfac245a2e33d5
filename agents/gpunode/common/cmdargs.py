"""Values passed to external commands, checked against their grammar first: arguments, never options.

A value from a file or a flag that ends up in another program's argv (a unit name for ``systemctl``, a
kernel release for ``modprobe -S``/``depmod``, a driver version for ``dkms``) must be the one argument
it claims to be: :func:`unit_name_problem` and :func:`release_problem` say why a value is not (None when
it is), so the caller can refuse it with its own error (a config error naming the file and key, a
usage error naming the flag) before any command runs. Callers still put ``--`` before such arguments
where the program takes it.
"""

from __future__ import annotations

import re

__all__ = ["UNIT_NAME_MAX", "UNIT_TYPES", "release_problem", "unit_name_problem"]

#: systemd's unit types (``systemd.unit(5)``); a name without one is a service (``systemctl`` adds it).
UNIT_TYPES = (
    "service",
    "socket",
    "device",
    "mount",
    "automount",
    "swap",
    "target",
    "path",
    "timer",
    "slice",
    "scope",
)
UNIT_NAME_MAX = 255  # systemd's UNIT_NAME_MAX (256) less the terminating NUL
_UNIT_CHARS = re.compile(r"[A-Za-z0-9:_.\\-]+")  # systemd's VALID_CHARS
_RELEASE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+~-]*")
RELEASE_MAX = 64  # a kernel release (utsname) holds at most 64 characters


def _show(value: str) -> str:
    return repr(value if len(value) <= 80 else value[:80] + "...")


def unit_name_problem(name: str) -> str | None:
    """Why ``name`` is not one systemd unit name (``nvidia-dcgm.service``, ``getty@tty1.service``,
    ``nvsm``), or None. Refused: empty, over 255 characters, a leading ``-`` (``systemctl`` would read
    an option), characters outside systemd's ``[A-Za-z0-9:_.\\-]`` plus one ``@`` (so no ``=``, spaces,
    ``/`` or glob patterns), an unknown ``.type`` suffix, an empty name or template prefix."""
    if not name:
        return "a unit name must not be empty"
    if len(name) > UNIT_NAME_MAX:
        return f"a unit name has at most {UNIT_NAME_MAX} characters, not {len(name)}"
    if name.startswith("-"):
        return f"{_show(name)} starts with '-': systemctl would read it as an option"
    stem, dot, suffix = name.rpartition(".")
    if not dot or suffix not in UNIT_TYPES:
        stem = name  # no unit type: systemctl takes it as a .service
    elif not stem:
        return f"{_show(name)} has no name before .{suffix}"
    prefix, at, instance = stem.partition("@")
    if not prefix:
        return f"{_show(name)} has no name before '@'"
    for part in (prefix, instance) if at else (prefix,):
        if part and not _UNIT_CHARS.fullmatch(part):
            return (
                f"{_show(name)} is not a systemd unit name (letters, digits and ':_.\\-' only, "
                f"at most one '@', then an optional .{'/.'.join(UNIT_TYPES[:3])}/... type)"
            )
    return None


def release_problem(value: str, what: str = "a version") -> str | None:
    """Why ``value`` is not a kernel release or driver version (``6.8.0-45-generic``, ``550.90.07``,
    ``5.14.0-427.el9.x86_64``), or None: 1 to 64 of ``[A-Za-z0-9._+~-]``, starting with a letter or
    digit (so never an option, never a path)."""
    if len(value) > RELEASE_MAX:
        return f"{what} has at most {RELEASE_MAX} characters, not {len(value)}"
    if not _RELEASE.fullmatch(value):
        return f"{_show(value)} is not {what} (letters, digits and '._+~-', starting with a letter or digit)"
    return None

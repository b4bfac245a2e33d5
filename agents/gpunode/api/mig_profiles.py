"""The MIG profile-name grammar: ``[<C>c.]<G>g.<GB>gb[+attr,...|-attr,...]`` (``1g.5gb``, ``1c.3g.20gb``,
``1g.10gb+me``), as mig-parted writes and reads it (shared/reference/mig.md §1.3-1.4).

Part of the file formats: the keys of a mig-parted config's ``mig-devices`` are profile names, and the
device plugin names MIG resources after them. Pure text; the NVML arithmetic that produces the names
(GB rounding, profile enums) is :mod:`gpunode.nvml.mig`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["MigProfileName", "ProfileSyntaxError", "parse_profile"]

_ATTR_RE = re.compile(r"^[A-Za-z][A-Za-z0-9.]*$")
_PROFILE_RE = re.compile(r"^(?:(?P<c>\d+)c\.)?(?P<g>\d+)g\.(?P<gb>\d+)gb(?:(?P<sign>[+-])(?P<attrs>.+))?$")


class ProfileSyntaxError(ValueError):
    """A MIG profile string does not follow `[<C>c.]<G>g.<GB>gb[+attr,...|-attr,...]`."""


@dataclass(frozen=True, order=True)
class MigProfileName:
    """A parsed profile string such as `1c.3g.20gb` or `1g.10gb+me`."""

    g: int
    gb: int
    c: int
    attrs: tuple[str, ...] = ()
    negative: tuple[str, ...] = ()

    def __str__(self) -> str:
        head = f"{self.g}g.{self.gb}gb" if self.c == self.g else f"{self.c}c.{self.g}g.{self.gb}gb"
        if self.attrs:
            head += "+" + ",".join(self.attrs)
        if self.negative:
            head += "-" + ",".join(self.negative)
        return head

    @property
    def gi_name(self) -> str:
        """The GPU-instance part of the name (the CI prefix dropped)."""
        return str(MigProfileName(self.g, self.gb, self.g, self.attrs, self.negative))


def parse_profile(text: str) -> MigProfileName:
    """Parse a profile string; raises ProfileSyntaxError with the reason."""
    m = _PROFILE_RE.match(text.strip())
    if not m:
        raise ProfileSyntaxError(
            f"{text!r} is not a MIG profile (expected e.g. 1g.5gb, 1c.3g.20gb, 1g.10gb+me)"
        )
    g = int(m["g"])
    c = int(m["c"]) if m["c"] else g
    if g <= 0 or c <= 0 or int(m["gb"]) <= 0:
        raise ProfileSyntaxError(f"{text!r}: slice and memory counts must be positive")
    if c > g:
        raise ProfileSyntaxError(f"{text!r}: compute slices ({c}c) exceed the GPU instance ({g}g)")
    attrs: tuple[str, ...] = ()
    negative: tuple[str, ...] = ()
    if m["attrs"] is not None:
        items = m["attrs"].split(",")
        for item in items:
            if not _ATTR_RE.match(item) or item.endswith("."):
                raise ProfileSyntaxError(f"{text!r}: bad attribute {item!r}")
        if len(set(items)) != len(items):
            raise ProfileSyntaxError(f"{text!r}: repeated attribute")
        if m["sign"] == "+":
            attrs = tuple(sorted(items))
        else:
            negative = tuple(sorted(items))
    return MigProfileName(g=g, gb=int(m["gb"]), c=c, attrs=attrs, negative=negative)

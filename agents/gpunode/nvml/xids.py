"""The XID classification, once: what each XID means, whether it is the application's fault, and
whether the GPU needs a reset before it can be trusted again (NVIDIA's XID catalog, abridged).

Used by the device plugin (which XIDs mark a GPU Unhealthy, and whether it may recover), the exporter
(``DCGM_FI_DEV_XID_ERRORS``'s ``err_msg``) and ``gpunode doctor`` (application errors only warn).
Pure data: importing it loads nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "APPLICATION_XIDS",
    "RESET_REQUIRED_XIDS",
    "UNKNOWN_XID_MESSAGE",
    "XIDS",
    "XID_MESSAGES",
    "Xid",
    "xid_message",
]


@dataclass(frozen=True)
class Xid:
    """One XID: its catalog message (``None``: not in our abridged list), and how it is classified.

    ``application``: an application error that NVIDIA's device plugin ignores by default (the GPU itself
    is fine). ``reset_required``: the GPU needs a reset (or a reboot) before it can be trusted again.
    """

    message: str | None
    application: bool = False
    reset_required: bool = False


UNKNOWN_XID_MESSAGE = "Unknown XID"

XIDS: Mapping[int, Xid] = {
    0: Xid("No Error"),
    8: Xid("GPU stopped processing"),
    13: Xid("Graphics Engine Exception", application=True),
    31: Xid("GPU memory page fault", application=True),
    32: Xid("Invalid or corrupted push buffer stream"),
    43: Xid("GPU stopped processing", application=True),
    45: Xid("Preemptive cleanup, due to previous errors", application=True),
    48: Xid("Double Bit ECC Error", reset_required=True),
    61: Xid("Internal micro-controller breakpoint/warning"),
    62: Xid("Internal micro-controller halt"),
    63: Xid("ECC page retirement or row remapping recording event", reset_required=True),
    64: Xid("ECC page retirement or row remapper recording failure", reset_required=True),
    68: Xid("NVDEC0 Exception", application=True),
    69: Xid("Graphics Engine class error"),
    74: Xid("NVLINK Error", reset_required=True),
    79: Xid("GPU has fallen off the bus", reset_required=True),
    92: Xid("High single-bit ECC error rate", reset_required=True),
    94: Xid("Contained ECC error", reset_required=True),
    95: Xid("Uncontained ECC error", reset_required=True),
    109: Xid("Context Switch Timeout Error", application=True),
    119: Xid("GSP RPC Timeout", reset_required=True),
    120: Xid("GSP Error", reset_required=True),
    123: Xid(None, reset_required=True),  # SPI PMU RPC failure
    140: Xid(None, reset_required=True),  # unrecovered ECC error
    154: Xid(None, reset_required=True),  # GPU recovery action changed
}

#: Application errors NVIDIA's plugin ignores by default: the GPU itself is fine.
APPLICATION_XIDS = frozenset(code for code, xid in XIDS.items() if xid.application)

#: XIDs after which the GPU needs a reset (or a reboot) before it can be trusted again: 48 double-bit
#: ECC, 63/64 ECC page retirement / row-remapping events, 74 NVLink error, 79 fell off the bus, 92 high
#: single-bit ECC rate, 94/95 contained/uncontained ECC error, 119/120 GSP timeout/error, 123 SPI PMU RPC
#: failure, 140 unrecovered ECC error, 154 recovery action.
RESET_REQUIRED_XIDS = frozenset(code for code, xid in XIDS.items() if xid.reset_required)

#: The messages of the XIDs users meet most (the exporter's ``err_msg``).
XID_MESSAGES: Mapping[int, str] = {code: xid.message for code, xid in XIDS.items() if xid.message is not None}


def xid_message(code: int) -> str:
    """The catalog message of ``code``, or ``Unknown XID``."""
    return XID_MESSAGES.get(code, UNKNOWN_XID_MESSAGE)

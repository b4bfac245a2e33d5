"""mig-parted v1 configs and GPUs for the MIG config tests (tests/unit/api) and the selection tests
(tests/unit/mig)."""

from __future__ import annotations

from gpunode.api.mig_config import GpuIdentity

EXAMPLE = """\
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-enabled:
    - devices: all
      mig-enabled: true
      mig-devices: {}
  all-balanced:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
  custom-config:
    - devices: [0, 1, 2, 3]
      mig-enabled: false
    - devices: [4]
      mig-enabled: true
      mig-devices: {"1g.5gb": 7}
    - devices: [7]
      mig-enabled: true
      mig-devices: {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1, "7g.40gb": 0}
  per-model:
    - device-filter: ["0x20B210DE", "0x20b510de"]
      devices: all
      mig-enabled: true
      mig-devices: {"1g.10gb": 7}
    - device-filter: "0x20B010DE"
      devices: all
      mig-enabled: true
      mig-devices: {"1g.10gb": 4}
  board:
    - device-filter: "0x20B510DE:0x153310DE"
      devices: all
      mig-enabled: true
      mig-devices: {"3g.40gb": 2}
  split:
    - devices: all
      mig-enabled: true
      mig-devices: {"1c.3g.20gb": 6, "1g.5gb+me": 1}
"""

A100_40 = 0x20B010DE
A100_80_PCIE = 0x20B510DE
H100 = 0x233010DE
T4 = 0x1EB810DE


def gpu(index: int, pci: int = A100_40, subsystem: int = 0x134F10DE, mig: bool = True) -> GpuIdentity:
    return GpuIdentity(index, pci, subsystem, f"GPU-{pci:08X}", mig)


def one_config(*entries: str) -> str:
    body = "\n".join("    - " + entry.strip().replace("\n", "\n      ") for entry in entries)
    return f"version: v1\nmig-configs:\n  custom:\n{body}\n"

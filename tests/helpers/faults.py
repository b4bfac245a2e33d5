"""A MIG layout change beside a lost GPU, for the fault tests of the device plugin, feature discovery and
the exporter (issue 14, item 9): the layouts, the node's own view of its MIG devices, and
``gpunode-mig apply`` run as another process, the way an admin changes a layout without a MIG manager."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from gpunode.nvml import mig
from gpunode.sim import nvml as sim

MIG_TOOL = str(Path(sys.executable).parent / "gpunode-mig")

LAYOUTS = """\
version: v1
mig-configs:
  all-balanced:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
  seven-1g-on-0-6:
    - devices: [0, 1, 2, 3, 4, 5, 6]
      mig-enabled: true
      mig-devices: {"1g.5gb": 7}
"""

# all-balanced on an A100-40GB, largest first (the driver places from the top of the slice range down)
BALANCED = {mig.GI_3_SLICE: 1, mig.GI_2_SLICE: 1, mig.GI_1_SLICE: 2}


def all_balanced(st: sim.SimNodeState) -> None:
    """Every GPU of the node in MIG mode with two 1g, one 2g and one 3g instance."""
    for gpu in range(len(st.gpus)):
        assert st.set_mig_mode(gpu, 1)[0] == 0
        st.reset_gpu(gpu)
        for enum, count in BALANCED.items():
            for _ in range(count):
                ret, gi = st.create_gi(gpu, enum, None)
                assert ret == 0
                slices = mig.GI_ENUMS[enum][0]
                ci_enum = next(e for e, c in mig.CI_ENUMS.items() if c == slices)
                assert st.create_ci(gpu, gi, ci_enum, None)[0] == 0


def node_mig_view(state: Path) -> tuple[dict[str, set[str]], set[str]]:
    """What the node holds: the MIG device UUIDs per mixed-strategy resource name, and those on lost GPUs."""
    st = sim.SimNode.open(state).state
    resources: dict[str, set[str]] = defaultdict(set)
    on_lost: set[str] = set()
    for gpu, g in enumerate(st.gpus):
        product = st.product(gpu)
        for gi, ci in st.mig_devices(gpu):
            spec = product.gi_profile(gi.profile)
            assert spec is not None
            gi_name = mig.gi_profile_name(gi.profile, product.memory_mib << 20, spec.memory_mib)
            name = "nvidia.com/mig-" + mig.ci_profile_name(gi_name, ci.size).replace("+", ".")
            uuid = st.mig_uuid(gpu, gi.id, ci.id)
            resources[name].add(uuid)
            if g.lost:
                on_lost.add(uuid)
    return dict(resources), on_lost


def apply_argv(state: Path, tmp: Path, name: str) -> list[str]:
    config = tmp / "layouts.yaml"
    config.write_text(LAYOUTS)
    journal = tmp / "mig-journal.json"  # never the real /var/lib/gpunode
    return [
        MIG_TOOL,
        "apply",
        "-f",
        str(config),
        "-c",
        name,
        "--sim-state",
        str(state),
        "--journal-file",
        str(journal),
    ]


def apply_layout(state: Path, tmp: Path, name: str) -> None:
    r = subprocess.run(apply_argv(state, tmp, name), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


async def apply_layout_async(state: Path, tmp: Path, name: str) -> None:
    """:func:`apply_layout` without blocking the event loop (a plugin under test runs on it)."""
    proc = await asyncio.create_subprocess_exec(
        *apply_argv(state, tmp, name), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await proc.communicate()
    assert proc.returncode == 0, out.decode()[-2000:]

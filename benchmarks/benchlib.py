"""What every benchmark prints about the machine it ran on."""

from __future__ import annotations

import math
import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def build_56_mig(state: Path, preset: str = "dgx-a100") -> None:
    """A shared simulated dgx-a100 (or another 8-GPU preset) with MIG on every GPU: 7 one-slice
    instances each (1g.5gb on A100, 1g.10gb on H100), 56 MIG devices."""
    from gpunode.nvml import mig
    from gpunode.sim import nvml as sim

    sim.init_state_file(state, preset, force=True)
    with sim.SimNode.open(state).mutate() as st:
        for gpu in range(8):
            st.set_mig_mode(gpu, 1)
            st.reset_gpu(gpu)
            for _ in range(7):
                ret, gi = st.create_gi(gpu, mig.GI_1_SLICE, None)
                assert ret == 0
                assert st.create_ci(gpu, gi, mig.CI_1_SLICE, None)[0] == 0


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in percent) of already sorted values; every benchmark reports with it."""
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def machine_base(**extra: Any) -> dict[str, Any]:
    """Platform, CPU and Python facts, plus whatever the benchmark adds."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable,
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        **extra,
    }

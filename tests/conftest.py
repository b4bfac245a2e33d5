"""Shared fixtures: every test that installs a simulated NVML gets pynvml reset afterwards."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpunode.sim import nvml as sim

VENV_BIN = Path(sys.executable).parent


@pytest.fixture
def nvml_sim() -> Iterator[sim.FakeNvmlLib]:
    """The dgx-a100 preset installed beneath pynvml, in memory, strict."""
    lib = sim.install("dgx-a100")
    yield lib
    sim.uninstall()


@pytest.fixture(autouse=True)
def _reset_pynvml() -> Iterator[None]:
    yield
    sim.uninstall()


@pytest.fixture
def gpunode_cmd() -> list[str]:
    """The installed `gpunode` console script (falls back to `python -m gpunode.cli`)."""
    script = VENV_BIN / "gpunode"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "gpunode.cli"]


@pytest.fixture
def sim_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("GPUNODE_SIM_STATE", None)
    env.pop("GPUNODE_SIMULATE", None)
    return env

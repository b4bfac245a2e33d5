"""How libnvidia-ml gets beneath pynvml: fails loudly if the pinned nvidia-ml-py changes its loader."""

from __future__ import annotations

import ctypes
import ctypes.util
import inspect
import shutil
from pathlib import Path
from typing import Any

import pynvml
import pytest

from gpunode.nvml import errors
from gpunode.nvml.real import LIBRARY_NAME, RealNvml, install_library, load_driver_library
from gpunode.sim import nvml as sim


def test_pynvml_keeps_the_globals_the_simulator_relies_on() -> None:
    for name in ("nvmlLib", "_nvmlGetFunctionPointer_cache", "_nvmlLib_refcount", "libLoadLock", "CDLL"):
        assert hasattr(pynvml, name), (
            f"pynvml no longer has {name}: the simulator's injection must be revisited"
        )
    source = inspect.getsource(pynvml._nvmlGetFunctionPointer)
    assert "getattr(nvmlLib, name)" in source
    assert "_nvmlGetFunctionPointer_cache" in source
    assert 'CDLL("libnvidia-ml.so.1")' in inspect.getsource(pynvml._LoadNvmlLibrary)
    assert '"nvmlInitWithFlags"' in inspect.getsource(pynvml.nvmlInitWithFlags)


def test_pynvml_loads_the_bare_soname_through_cdll(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    lib = sim.install("t4x4")
    install_library(None)

    def fake_cdll(name: str) -> Any:
        seen.append(name)
        return lib

    monkeypatch.setattr(pynvml, "CDLL", fake_cdll)
    pynvml.nvmlInit()
    assert seen == ["libnvidia-ml.so.1"]
    assert pynvml.nvmlDeviceGetCount() == 4


def test_reinstalling_clears_the_symbol_cache() -> None:
    sim.install("t4x4")
    pynvml.nvmlInit()
    assert pynvml.nvmlDeviceGetCount() == 4
    sim.install("dgx-a100")  # without clearing the cache the t4x4 library would keep answering
    pynvml.nvmlInit()
    assert pynvml.nvmlDeviceGetCount() == 8


def test_missing_library_under_a_driver_root_names_the_searched_dirs(tmp_path: Path) -> None:
    install_library(None)
    with pytest.raises(errors.LibraryNotFound) as exc:
        load_driver_library(tmp_path)
    assert str(tmp_path / "usr/lib64") in str(exc.value)


def _real_shared_library() -> Path:
    name = ctypes.util.find_library("m") or "libm.so.6"
    for d in (
        "/lib/x86_64-linux-gnu",
        "/usr/lib/x86_64-linux-gnu",
        "/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/lib64",
    ):
        p = Path(d) / name
        if p.exists():
            return p
    raise AssertionError(f"no {name} found to stand in for a driver library")


async def test_a_library_in_the_driver_root_is_what_pynvml_calls(tmp_path: Path) -> None:
    """A real shared object (libm) placed as libnvidia-ml.so.1 under a driver root is loaded and called:
    pynvml then asks it for nvmlInitWithFlags, which libm lacks, so init fails with FunctionNotFound."""
    install_library(None)
    libdir = tmp_path / "usr/lib/x86_64-linux-gnu"
    libdir.mkdir(parents=True)
    shutil.copy(_real_shared_library(), libdir / LIBRARY_NAME)
    with pytest.raises(errors.InitFailed) as exc:
        await RealNvml.open(driver_root=tmp_path)
    assert exc.value.code == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    assert isinstance(pynvml.nvmlLib, ctypes.CDLL)
    assert Path(pynvml.nvmlLib._name) == libdir / LIBRARY_NAME


async def test_an_installed_simulator_wins_over_the_driver_root(tmp_path: Path) -> None:
    sim.install("a30x4")
    nvml = await RealNvml.open(driver_root=tmp_path)  # empty root: would fail if it were searched
    try:
        assert len(await nvml.gpus()) == 4
    finally:
        await nvml.close()

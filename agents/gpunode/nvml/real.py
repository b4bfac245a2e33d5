"""The pynvml-backed NVML library: the only module that imports pynvml.

Every blocking NVML call runs on one dedicated thread; event waits run on their own thread so a long wait
never starves other calls. Vendor exceptions become `gpunode.nvml.errors`; optional features that the GPU
does not support come back as None.
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import threading
import uuid as uuidlib
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeVar, overload

import pynvml

from gpunode.common.hostpaths import HostPaths
from gpunode.nvml import errors, mig
from gpunode.nvml.api import (
    ARCHITECTURES,
    BRANDS,
    FABRIC_HEALTH,
    FABRIC_STATES,
    HEALTH_EVENTS,
    CiProfile,
    ComputeInstance,
    ComputeMode,
    EventKind,
    FabricInfo,
    GiProfile,
    GpuInfo,
    GpuInstance,
    HealthEvent,
    MigDevice,
    MigMode,
    PciInfo,
    Placement,
    SetMigModeResult,
    SystemInfo,
    Telemetry,
    TopoLevel,
    Topology,
)
from gpunode.nvml.events import EventPump

if TYPE_CHECKING:
    # pynvml carries no type information; its handles (device, GPU instance, compute instance, event set)
    # are ctypes pointers this module only hands back to pynvml, or compares by address.
    Handle: TypeAlias = ctypes._Pointer[ctypes.Structure]
    # the GPM sample buffers pynvml allocates and fills
    GpmSample: TypeAlias = object

    class _MigAttributes(Protocol):
        """The fields of pynvml's c_nvmlDeviceAttributes_t that identify a GPU-instance profile."""

        gpuInstanceSliceCount: int
        memorySizeMB: int
        sharedCopyEngineCount: int
        sharedDecoderCount: int
        sharedEncoderCount: int
        sharedJpegCount: int
        sharedOfaCount: int


T = TypeVar("T")
MIB = 1 << 20
LIBRARY_NAME = "libnvidia-ml.so.1"

_install_lock = threading.Lock()


# -- loading -------------------------------------------------------------------------------------------------
def install_library(lib: object) -> None:
    """Make `lib` the library pynvml calls (a CDLL or the simulator), resetting pynvml's caches.

    pynvml keeps the library in `nvmlLib`, caches every resolved symbol in `_nvmlGetFunctionPointer_cache`
    and counts inits in `_nvmlLib_refcount`; all three must be reset or the old library keeps answering.
    """
    with _install_lock, pynvml.libLoadLock:
        pynvml.nvmlLib = lib
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlLib_refcount = 0


def load_driver_library(driver_root: Path | str | None) -> None:
    """Load libnvidia-ml from a driver root; pynvml itself only knows the bare name `libnvidia-ml.so.1`.

    With no root (or "/"), pynvml's own loader runs on first init. A library already installed (the
    simulator, or an earlier load) is kept.
    """
    if pynvml.nvmlLib is not None:
        return
    if driver_root is None or Path(driver_root) == Path("/"):
        return
    paths = HostPaths(driver_root=driver_root)
    path = paths.find_driver_lib(LIBRARY_NAME)
    if path is None:
        searched = ", ".join(str(d) for d in paths.driver_lib_dirs())
        raise errors.LibraryNotFound(
            f"{LIBRARY_NAME} not found under driver root {driver_root} (searched {searched})"
        )
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        raise errors.LibraryNotFound(f"cannot load {path}: {exc}") from None
    install_library(lib)


def _translate(exc: pynvml.NVMLError) -> errors.NvmlError:
    code = int(getattr(exc, "value", 999))
    try:
        text = str(exc)
    except Exception:  # an unknown code whose string lookup itself failed
        text = f"NVML error {code}"
    return errors.from_code(code, text)


Tolerated: TypeAlias = tuple[type[errors.NvmlError], ...]

# what an optional feature answers where the GPU (or an older driver) lacks it
UNSUPPORTED: Tolerated = (errors.NotSupported, errors.FunctionNotFound, errors.NotFound)
# every NVML error (for frees and probes whose failure changes nothing)
ANY_ERROR: Tolerated = (errors.NvmlError,)


@overload
def _call(fn: Callable[..., T], *args: object) -> T: ...


@overload
def _call(fn: Callable[..., T], *args: object, tolerate: Tolerated) -> T | None: ...


def _call(fn: Callable[..., T], *args: object, tolerate: Tolerated = ()) -> T | None:
    """Call a pynvml function. Its NVMLError becomes the `gpunode.nvml.errors` class for the code (raised
    without the vendor exception chained); an error of a class in `tolerate` returns None instead."""
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        err = _translate(exc)
        if isinstance(err, tolerate):
            return None
        raise err from None


def _optional(fn: Callable[..., T], *args: object) -> T | None:
    """NotSupported (and FunctionNotFound on older drivers, NotFound) become None."""
    return _call(fn, *args, tolerate=UNSUPPORTED)


def _addr(handle: Handle) -> int | None:
    return ctypes.cast(handle, ctypes.c_void_p).value


# GPM metrics gpm_utilization() reports: result key -> NVML_GPM_METRIC_* id
GPM_METRICS = {
    "graphics": pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL,
    "tensor": pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    "dram": pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
    "sm_active": pynvml.NVML_GPM_METRIC_SM_UTIL,
    "sm_occupancy": pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
    "fp64": pynvml.NVML_GPM_METRIC_FP64_UTIL,
    "fp32": pynvml.NVML_GPM_METRIC_FP32_UTIL,
    "fp16": pynvml.NVML_GPM_METRIC_FP16_UTIL,
}

ALL_LINKS = 0xFFFFFFFF  # scopeId for an NVLink throughput field summed over every link
# the field values telemetry() reads in one nvmlDeviceGetFieldValues call: Telemetry attribute -> field
# (an NVLink throughput pair is summed into nvlink_raw_kib)
FIELDS: tuple[tuple[str, int | tuple[int, int]], ...] = (
    ("memory_temp_c", pynvml.NVML_FI_DEV_MEMORY_TEMP),
    ("nvlink_crc_flit_errors", pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL),
    ("nvlink_crc_data_errors", pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL),
    ("nvlink_replay_errors", pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL),
    ("nvlink_recovery_errors", pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL),
    ("violation_power_ns", pynvml.NVML_FI_DEV_PERF_POLICY_POWER),
    ("violation_thermal_ns", pynvml.NVML_FI_DEV_PERF_POLICY_THERMAL),
    ("violation_sync_boost_ns", pynvml.NVML_FI_DEV_PERF_POLICY_SYNC_BOOST),
    ("violation_board_limit_ns", pynvml.NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT),
    ("violation_low_util_ns", pynvml.NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION),
    ("violation_reliability_ns", pynvml.NVML_FI_DEV_PERF_POLICY_RELIABILITY),
    ("nvlink_raw_kib", (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX, ALL_LINKS)),
    ("nvlink_raw_kib", (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX, ALL_LINKS)),
)
_VALUE_FIELDS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def _field_number(fv: object) -> int | None:
    """The value of one nvmlFieldValue_t as an integer, or None where NVML did not supply it."""
    if int(getattr(fv, "nvmlReturn", -1)) != pynvml.NVML_SUCCESS:
        return None
    member = _VALUE_FIELDS.get(int(getattr(fv, "valueType", -1)))
    if member is None:
        return None
    return int(getattr(fv.value, member))  # type: ignore[attr-defined]


class _GpmSamples:
    """One GPU's two GPM sample buffers: the previous sample and the one the next call fills."""

    def __init__(self, previous: GpmSample, scratch: GpmSample) -> None:
        self.previous = previous
        self.scratch = scratch
        self.primed = False  # whether `previous` holds a sample

    def advance(self) -> None:
        """The sample just taken (in `scratch`) becomes the previous one; the old buffer is reused."""
        self.previous, self.scratch = self.scratch, self.previous
        self.primed = True


# -- the library ---------------------------------------------------------------------------------------------
class RealNvml:
    """`gpunode.nvml.api.Nvml` over pynvml. Create with `await RealNvml.open(...)`."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nvml")
        self._handles: dict[int, Handle] = {}
        self._uuids: dict[int, str] = {}
        self._gi_profiles: dict[int, list[GiProfile]] = {}
        self._totals: dict[int, int] = {}
        self._gpm_support: dict[int, bool] = {}
        self._gpm_samples: dict[int, _GpmSamples] = {}
        self._unsupported: set[tuple[int, str]] = set()  # (GPU, query) the GPU answered NotSupported to
        self._count = 0
        self._closed = False

    @classmethod
    async def open(cls, driver_root: Path | str | None = None) -> RealNvml:
        self = cls()
        try:
            await self._run(self._start, driver_root)
        except BaseException:
            self._pool.shutdown(wait=False)
            raise
        return self

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(*args))

    def _start(self, driver_root: Path | str | None) -> None:
        load_driver_library(driver_root)
        try:
            _call(pynvml.nvmlInit)
        except errors.NvmlError as err:
            raise errors.InitFailed(f"NVML init failed: {err}", code=err.code) from None
        self._count = _call(pynvml.nvmlDeviceGetCount)
        for i in range(self._count):
            self._cache_handle(i)

    def _cache_handle(self, index: int) -> Handle | None:
        handle: Handle | None = _call(pynvml.nvmlDeviceGetHandleByIndex, index, tolerate=(errors.GpuLost,))
        if handle is None:
            return None
        self._handles[index] = handle
        if index not in self._uuids:
            self._uuids[index] = _call(pynvml.nvmlDeviceGetUUID, handle)
        return handle

    def _handle(self, index: int) -> Handle:
        if not 0 <= index < self._count:
            raise errors.InvalidArgument(f"no GPU with index {index} (the node has {self._count})")
        handle = self._handles.get(index)
        if handle is None:
            handle = self._cache_handle(index)
            if handle is None:
                raise errors.GpuLost(f"GPU {index} is lost")
        return handle

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._run(self._shutdown)
        except errors.NvmlError:
            pass
        finally:
            self._pool.shutdown(wait=True)

    def _shutdown(self) -> None:
        for samples in self._gpm_samples.values():
            for sample in (samples.previous, samples.scratch):
                _call(pynvml.nvmlGpmSampleFree, sample, tolerate=ANY_ERROR)
        self._gpm_samples.clear()
        _call(pynvml.nvmlShutdown)

    # -- system and inventory ------------------------------------------------------------------------------
    async def system(self) -> SystemInfo:
        return await self._run(self._system)

    def _system(self) -> SystemInfo:
        return SystemInfo(
            driver_version=_call(pynvml.nvmlSystemGetDriverVersion),
            nvml_version=_call(pynvml.nvmlSystemGetNVMLVersion),
            cuda_driver_version=_call(pynvml.nvmlSystemGetCudaDriverVersion_v2),
        )

    async def gpus(self) -> list[GpuInfo]:
        return await self._run(self._gpus)

    def _gpus(self) -> list[GpuInfo]:
        out = []
        for i in range(self._count):
            try:
                out.append(self._gpu(i))
            except errors.GpuLost:
                continue
        return out

    async def lost_gpus(self) -> list[int]:
        return await self._run(self._lost)

    def _lost(self) -> list[int]:
        lost = []
        for i in range(self._count):
            try:
                self._gpu_identity_probe(i)
            except errors.GpuLost:
                lost.append(i)
        return lost

    def _gpu_identity_probe(self, index: int) -> None:
        _call(pynvml.nvmlDeviceGetMinorNumber, self._handle(index))

    def _gpu(self, index: int) -> GpuInfo:
        h = self._handle(index)
        pci = _call(pynvml.nvmlDeviceGetPciInfo_v3, h)
        mode = _optional(pynvml.nvmlDeviceGetMigMode, h)
        attrs = _optional(pynvml.nvmlDeviceGetAttributes_v2, h)
        numa = _optional(pynvml.nvmlDeviceGetNumaNodeId, h)
        arch = _optional(pynvml.nvmlDeviceGetArchitecture, h)
        brand = _optional(pynvml.nvmlDeviceGetBrand, h)
        memory = _call(pynvml.nvmlDeviceGetMemoryInfo, h)
        self._totals[index] = int(memory.total)
        return GpuInfo(
            index=index,
            minor=_call(pynvml.nvmlDeviceGetMinorNumber, h),
            uuid=self._uuids[index],
            name=_call(pynvml.nvmlDeviceGetName, h),
            serial=_optional(pynvml.nvmlDeviceGetSerial, h),
            pci=PciInfo(
                bus_id=pci.busId,
                domain=pci.domain,
                bus=pci.bus,
                device=pci.device,
                device_id=pci.pciDeviceId,
                subsystem_id=pci.pciSubSystemId,
            ),
            numa_node=numa if numa is not None and numa >= 0 else None,
            memory_total_mib=int(memory.total) // MIB,
            compute_capability=tuple(_call(pynvml.nvmlDeviceGetCudaComputeCapability, h)),
            architecture=ARCHITECTURES.get(arch, "unknown") if arch is not None else "unknown",
            brand=BRANDS.get(brand, "unknown") if brand is not None else "unknown",
            sm_count=int(attrs.multiprocessorCount) if attrs is not None else None,
            mig=MigMode(bool(mode[0]), bool(mode[1])) if mode is not None else None,
            vbios_version=_optional(pynvml.nvmlDeviceGetVbiosVersion, h),
            inforom_oem=_optional(pynvml.nvmlDeviceGetInforomVersion, h, pynvml.NVML_INFOROM_OEM),
            inforom_ecc=_optional(pynvml.nvmlDeviceGetInforomVersion, h, pynvml.NVML_INFOROM_ECC),
            inforom_power=_optional(pynvml.nvmlDeviceGetInforomVersion, h, pynvml.NVML_INFOROM_POWER),
            inforom_image=_optional(pynvml.nvmlDeviceGetInforomImageVersion, h),
        )

    # -- topology ------------------------------------------------------------------------------------------
    async def topology(self) -> Topology:
        return await self._run(self._topology)

    def _links(self, h: Handle) -> tuple[dict[str, int], int]:
        """(links per remote GPU bus id, links to NVSwitches) for one GPU."""
        peers: dict[str, int] = {}
        switch_links = 0
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            active = _call(pynvml.nvmlDeviceGetNvLinkState, h, link, tolerate=ANY_ERROR)
            if active is None:
                break
            if not active:
                continue
            kind = _optional(pynvml.nvmlDeviceGetNvLinkRemoteDeviceType, h, link)
            if kind == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                switch_links += 1
                continue
            remote = _optional(pynvml.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
            if remote is not None:
                key = str(remote.busId).lower()
                peers[key] = peers.get(key, 0) + 1
        return peers, switch_links

    def _topology(self) -> Topology:
        indices = [i for i in range(self._count) if self._handles.get(i) is not None]
        handles = [self._handles[i] for i in indices]
        bus_ids = [str(_call(pynvml.nvmlDeviceGetPciInfo_v3, h).busId).lower() for h in handles]
        links = [self._links(h) for h in handles]
        numa = [_optional(pynvml.nvmlDeviceGetNumaNodeId, h) for h in handles]
        levels: list[tuple[TopoLevel, ...]] = []
        nvlinks: list[tuple[int, ...]] = []
        for a, ha in enumerate(handles):
            row_l: list[TopoLevel] = []
            row_n: list[int] = []
            for b, hb in enumerate(handles):
                if a == b:
                    row_l.append(TopoLevel.X)
                    row_n.append(0)
                    continue
                level = _call(pynvml.nvmlDeviceGetTopologyCommonAncestor, ha, hb)
                row_l.append(TopoLevel(level))
                direct = links[a][0].get(bus_ids[b], 0)
                via_switch = min(links[a][1], links[b][1])
                row_n.append(direct + via_switch)
            levels.append(tuple(row_l))
            nvlinks.append(tuple(row_n))
        return Topology(
            indices=tuple(indices),
            levels=tuple(levels),
            nvlinks=tuple(nvlinks),
            numa_nodes=tuple(n if n is not None and n >= 0 else None for n in numa),
        )

    # -- MIG -----------------------------------------------------------------------------------------------
    async def mig_mode(self, index: int) -> MigMode | None:
        return await self._run(self._mig_mode, index)

    def _mig_mode(self, index: int) -> MigMode | None:
        mode = _optional(pynvml.nvmlDeviceGetMigMode, self._handle(index))
        return None if mode is None else MigMode(bool(mode[0]), bool(mode[1]))

    async def set_mig_mode(self, index: int, enabled: bool) -> SetMigModeResult:
        return await self._run(self._set_mig_mode, index, enabled)

    def _set_mig_mode(self, index: int, enabled: bool) -> SetMigModeResult:
        h = self._handle(index)
        status = _call(pynvml.nvmlDeviceSetMigMode, h, 1 if enabled else 0)
        mode = _call(pynvml.nvmlDeviceGetMigMode, h)
        activation = {0: "applied", 16: "reset-required", 19: "in-use"}.get(status, f"status-{status}")
        return SetMigModeResult(bool(mode[0]), bool(mode[1]), activation)

    # -- compute mode ---------------------------------------------------------------------------------------
    async def compute_mode(self, index: int) -> ComputeMode:
        return await self._run(self._compute_mode, index)

    def _compute_mode(self, index: int) -> ComputeMode:
        return ComputeMode(int(_call(pynvml.nvmlDeviceGetComputeMode, self._handle(index))))

    async def set_compute_mode(self, index: int, mode: ComputeMode) -> None:
        await self._run(self._set_compute_mode, index, mode)

    def _set_compute_mode(self, index: int, mode: ComputeMode) -> None:
        _call(pynvml.nvmlDeviceSetComputeMode, self._handle(index), int(mode))

    def _total_bytes(self, index: int) -> int:
        if index not in self._totals:
            self._totals[index] = int(_call(pynvml.nvmlDeviceGetMemoryInfo, self._handle(index)).total)
        return self._totals[index]

    async def gi_profiles(self, index: int) -> list[GiProfile]:
        return await self._run(self._gi_profile_list, index)

    def _gi_profile_list(self, index: int) -> list[GiProfile]:
        if index in self._gi_profiles:
            return self._gi_profiles[index]
        h = self._handle(index)
        total = self._total_bytes(index)
        profiles = []
        for enum in range(mig.GI_PROFILE_COUNT):
            info = _call(
                pynvml.nvmlDeviceGetGpuInstanceProfileInfo,
                h,
                enum,
                tolerate=(errors.NotSupported, errors.InvalidArgument),
            )
            if info is None:
                continue
            placements = self._placements(h, info.id)
            profiles.append(
                GiProfile(
                    enum=enum,
                    id=info.id,
                    name=mig.gi_profile_name(enum, total, info.memorySizeMB),
                    slices=info.sliceCount,
                    instance_count=info.instanceCount,
                    sm_count=info.multiprocessorCount,
                    memory_mib=info.memorySizeMB,
                    copy_engines=info.copyEngineCount,
                    decoders=info.decoderCount,
                    encoders=info.encoderCount,
                    jpeg=info.jpegCount,
                    ofa=info.ofaCount,
                    placements=placements,
                )
            )
        self._gi_profiles[index] = profiles
        return profiles

    def _placements(self, h: Handle, profile_id: int) -> tuple[Placement, ...]:
        count = ctypes.c_uint(0)
        get = pynvml.nvmlDeviceGetGpuInstancePossiblePlacements
        try:
            _call(get, h, profile_id, None, ctypes.byref(count))
            arr = (pynvml.c_nvmlGpuInstancePlacement_t * max(1, count.value))()
            _call(get, h, profile_id, arr, ctypes.byref(count))
        except errors.NotSupported:
            return ()  # MIG mode off: the driver lists placements only once it is on
        return tuple(Placement(arr[i].start, arr[i].size) for i in range(count.value))

    def _profile_by_enum(self, index: int, enum: int) -> GiProfile:
        for p in self._gi_profile_list(index):
            if p.enum == enum:
                if not p.placements:  # listed before MIG was enabled: refresh once
                    self._gi_profiles.pop(index, None)
                    return next(q for q in self._gi_profile_list(index) if q.enum == enum)
                return p
        raise errors.NotSupported(f"GPU {index} has no GPU-instance profile {enum}")

    def _profile_by_attributes(self, index: int, attrs: _MigAttributes) -> GiProfile | None:
        """The GI profile a MIG device's attributes identify (slices, memory, engines), if unique."""
        matches = [
            p
            for p in self._gi_profile_list(index)
            if p.slices == attrs.gpuInstanceSliceCount
            and p.memory_mib == attrs.memorySizeMB
            and (p.copy_engines, p.decoders, p.encoders, p.jpeg, p.ofa)
            == (
                attrs.sharedCopyEngineCount,
                attrs.sharedDecoderCount,
                attrs.sharedEncoderCount,
                attrs.sharedJpegCount,
                attrs.sharedOfaCount,
            )
        ]
        return matches[0] if len(matches) == 1 else None

    def _profile_by_id(self, index: int, profile_id: int) -> GiProfile:
        for p in self._gi_profile_list(index):
            if p.id == profile_id:
                return p
        raise errors.NotFound(f"GPU {index} has no GPU-instance profile id {profile_id}")

    async def ci_profiles(self, index: int, gi_profile_enum: int) -> list[CiProfile]:
        return await self._run(self._ci_profiles, index, gi_profile_enum)

    def _ci_profiles(self, index: int, gi_profile_enum: int) -> list[CiProfile]:
        """CI profiles of a GI profile. NVML lists them only for an existing GI, so this is computed
        from the GI profile with the same rule go-nvlib uses (C <= G, and 2C <= G+1 when C < G)."""
        gi = self._profile_by_enum(index, gi_profile_enum)
        out = []
        attrs = mig.GI_ENUMS[gi_profile_enum][1]
        for enum, c in sorted(mig.CI_ENUMS.items()):
            if enum not in (mig.CI_1_SLICE, mig.CI_2_SLICE, mig.CI_3_SLICE, mig.CI_4_SLICE, mig.CI_7_SLICE):
                continue
            if c not in mig.valid_ci_slices(gi.slices) or (attrs and c != gi.slices):
                continue
            out.append(
                CiProfile(
                    enum=enum,
                    gi_profile_enum=gi_profile_enum,
                    name=mig.ci_profile_name(gi.name, c),
                    slices=c,
                    instance_count=gi.slices // c,
                    sm_count=gi.sm_count * c // gi.slices,
                )
            )
        return out

    async def gpu_instances(self, index: int) -> list[GpuInstance]:
        return await self._run(self._gpu_instances, index)

    def _gi_from_handle(self, index: int, gi: Handle) -> GpuInstance:
        info = _call(pynvml.nvmlGpuInstanceGetInfo, gi)
        return GpuInstance(
            gpu_index=index,
            id=info.id,
            profile=self._profile_by_id(index, info.profileId),
            placement=Placement(info.placement.start, info.placement.size),
        )

    def _gpu_instances(self, index: int) -> list[GpuInstance]:
        h = self._handle(index)
        mode = _optional(pynvml.nvmlDeviceGetMigMode, h)
        if mode is None or not mode[0]:
            return []
        out = []
        for profile in self._gi_profile_list(index):
            count = ctypes.c_uint(profile.instance_count)
            arr = (pynvml.c_nvmlGpuInstance_t * max(1, profile.instance_count))()
            _call(pynvml.nvmlDeviceGetGpuInstances, h, profile.id, arr, ctypes.byref(count))
            out += [self._gi_from_handle(index, arr[i]) for i in range(count.value)]
        return sorted(out, key=lambda g: g.id)

    async def create_gpu_instance(
        self, index: int, profile_enum: int, placement: Placement | None = None
    ) -> GpuInstance:
        return await self._run(self._create_gi, index, profile_enum, placement)

    def _create_gi(self, index: int, profile_enum: int, placement: Placement | None) -> GpuInstance:
        h = self._handle(index)
        profile = self._profile_by_enum(index, profile_enum)
        if placement is None:
            gi = _call(pynvml.nvmlDeviceCreateGpuInstance, h, profile.id)
        else:
            pl = pynvml.c_nvmlGpuInstancePlacement_t(placement.start, placement.size)
            gi = _call(pynvml.nvmlDeviceCreateGpuInstanceWithPlacement, h, profile.id, ctypes.byref(pl))
        return self._gi_from_handle(index, gi)

    def _gi_handle(self, index: int, gi_id: int) -> Handle:
        h = self._handle(index)
        try:
            gi: Handle = _call(pynvml.nvmlDeviceGetGpuInstanceById, h, gi_id)
        except errors.NotFound:
            raise errors.NotFound(f"GPU {index} has no GPU instance {gi_id}") from None
        return gi

    async def destroy_gpu_instance(self, index: int, gi_id: int) -> None:
        await self._run(lambda: _call(pynvml.nvmlGpuInstanceDestroy, self._gi_handle(index, gi_id)))

    async def compute_instances(self, index: int, gi_id: int) -> list[ComputeInstance]:
        return await self._run(self._compute_instances, index, gi_id)

    def _ci_from_handle(self, index: int, gi_id: int, ci: Handle) -> ComputeInstance:
        info = _call(pynvml.nvmlComputeInstanceGetInfo, ci)
        return ComputeInstance(
            index, gi_id, info.id, info.profileId, Placement(info.placement.start, info.placement.size)
        )

    def _compute_instances(self, index: int, gi_id: int) -> list[ComputeInstance]:
        gi = self._gi_handle(index, gi_id)
        out = []
        for enum in range(mig.CI_PROFILE_COUNT):
            count = ctypes.c_uint(8)
            arr = (pynvml.c_nvmlComputeInstance_t * 8)()
            listed = _call(
                pynvml.nvmlGpuInstanceGetComputeInstances,
                gi,
                enum,
                arr,
                ctypes.byref(count),
                tolerate=(errors.NotSupported, errors.InvalidArgument),
            )
            if listed is None:
                continue
            out += [self._ci_from_handle(index, gi_id, arr[i]) for i in range(count.value)]
        return sorted(out, key=lambda c: c.id)

    async def create_compute_instance(
        self, index: int, gi_id: int, ci_profile_enum: int, placement: Placement | None = None
    ) -> ComputeInstance:
        return await self._run(self._create_ci, index, gi_id, ci_profile_enum, placement)

    def _create_ci(
        self, index: int, gi_id: int, ci_profile_enum: int, placement: Placement | None
    ) -> ComputeInstance:
        gi = self._gi_handle(index, gi_id)
        if placement is None:
            ci = _call(pynvml.nvmlGpuInstanceCreateComputeInstance, gi, ci_profile_enum)
        else:
            pl = pynvml.c_nvmlComputeInstancePlacement_t(placement.start, placement.size)
            ci = _call(
                pynvml.nvmlGpuInstanceCreateComputeInstanceWithPlacement,
                gi,
                ci_profile_enum,
                ctypes.byref(pl),
            )
        return self._ci_from_handle(index, gi_id, ci)

    async def destroy_compute_instance(self, index: int, gi_id: int, ci_id: int) -> None:
        def destroy() -> None:
            gi = self._gi_handle(index, gi_id)
            ci = _call(pynvml.nvmlGpuInstanceGetComputeInstanceById, gi, ci_id)
            _call(pynvml.nvmlComputeInstanceDestroy, ci)

        await self._run(destroy)

    async def mig_devices(self, index: int) -> list[MigDevice]:
        return await self._run(self._mig_devices, index)

    @staticmethod
    def _mig_handles(h: Handle) -> Iterator[tuple[int, Handle]]:
        """(slot, handle) of each MIG device a GPU has; empty slots are skipped."""
        for slot in range(_call(pynvml.nvmlDeviceGetMaxMigDeviceCount, h)):
            m: Handle | None = _call(
                pynvml.nvmlDeviceGetMigDeviceHandleByIndex, h, slot, tolerate=(errors.NotFound,)
            )
            if m is not None:
                yield slot, m

    def _mig_devices(self, index: int) -> list[MigDevice]:
        h = self._handle(index)
        mode = _optional(pynvml.nvmlDeviceGetMigMode, h)
        if mode is None or not mode[0]:
            return []
        gi_profiles: dict[int, GiProfile] = {}
        out = []
        for slot, m in self._mig_handles(h):
            gi_id = _call(pynvml.nvmlDeviceGetGpuInstanceId, m)
            attrs = _call(pynvml.nvmlDeviceGetAttributes_v2, m)
            mem = _optional(pynvml.nvmlDeviceGetMemoryInfo, m)
            if gi_id not in gi_profiles:
                found = self._profile_by_attributes(index, attrs)
                if found is None:  # ambiguous: ask the GPU instance itself
                    info = _call(
                        pynvml.nvmlGpuInstanceGetInfo, _call(pynvml.nvmlDeviceGetGpuInstanceById, h, gi_id)
                    )
                    found = self._profile_by_id(index, info.profileId)
                gi_profiles[gi_id] = found
            gi = gi_profiles[gi_id]
            out.append(
                MigDevice(
                    parent_index=index,
                    parent_uuid=self._uuids[index],
                    index=slot,
                    uuid=_call(pynvml.nvmlDeviceGetUUID, m),
                    name=_call(pynvml.nvmlDeviceGetName, m),
                    profile=mig.ci_profile_name(gi.name, attrs.computeInstanceSliceCount),
                    gi_id=gi_id,
                    ci_id=_call(pynvml.nvmlDeviceGetComputeInstanceId, m),
                    memory_mib=int(attrs.memorySizeMB),
                    sm_count=attrs.multiprocessorCount,
                    gi_slices=attrs.gpuInstanceSliceCount,
                    ci_slices=attrs.computeInstanceSliceCount,
                    copy_engines=attrs.sharedCopyEngineCount,
                    decoders=attrs.sharedDecoderCount,
                    encoders=attrs.sharedEncoderCount,
                    jpeg=attrs.sharedJpegCount,
                    ofa=attrs.sharedOfaCount,
                    memory_used_mib=int(mem.used) // MIB if mem is not None else None,
                    memory_free_mib=int(mem.free) // MIB if mem is not None else None,
                )
            )
        return out

    async def mig_memory(self, index: int) -> dict[str, tuple[int, int]]:
        """(used MiB, free MiB) of each MIG device of a GPU by MIG UUID: cheaper than mig_devices()."""
        return await self._run(self._mig_memory, index)

    def _mig_memory(self, index: int) -> dict[str, tuple[int, int]]:
        out: dict[str, tuple[int, int]] = {}
        for _, m in self._mig_handles(self._handle(index)):
            mem = _optional(pynvml.nvmlDeviceGetMemoryInfo, m)
            if mem is not None:
                out[_call(pynvml.nvmlDeviceGetUUID, m)] = (int(mem.used) // MIB, int(mem.free) // MIB)
        return out

    # -- NVLink fabric ------------------------------------------------------------------------------------
    async def fabric_clique(self, index: int) -> str | None:
        return await self._run(self._fabric_clique, index)

    def _fabric_clique(self, index: int) -> str | None:
        """`<cluster UUID>.<clique id>` for a GPU on an NVLink fabric (GB200 and the like), else None."""
        info = self._fabric_info(index)
        return None if info is None else info.clique

    async def fabric_info(self, index: int) -> FabricInfo | None:
        return await self._run(self._fabric_info, index)

    def _fabric_info(self, index: int) -> FabricInfo | None:
        """Fabric info v3 (health summary), v2 on drivers that predate it; None where NVML has none (a GPU
        that answered so once is not asked again)."""
        if (index, "fabric-info") in self._unsupported:
            return None
        handle = self._handle(index)
        tolerate = (errors.NotSupported, errors.FunctionNotFound, errors.InvalidArgument)
        info: Any = pynvml.c_nvmlGpuFabricInfo_v3_t()
        try:
            got = _call(pynvml.nvmlDeviceGetGpuFabricInfoV, handle, ctypes.byref(info), tolerate=tolerate)
        except errors.VersionMismatch:
            info = pynvml.c_nvmlGpuFabricInfo_v2_t()
            got = _call(pynvml.nvmlDeviceGetGpuFabricInfoV, handle, ctypes.byref(info), tolerate=tolerate)
        if got is None:
            self._unsupported.add((index, "fabric-info"))
            return None
        v3 = isinstance(info, pynvml.c_nvmlGpuFabricInfo_v3_t)
        cluster = bytes(info.clusterUuid)
        degraded = (int(info.healthMask) >> pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW) & 0x3
        return FabricInfo(
            state=FABRIC_STATES.get(int(info.state), f"unknown-{int(info.state)}"),
            status=int(info.status),
            cluster_uuid=str(uuidlib.UUID(bytes=cluster)) if any(cluster) else None,
            clique_id=int(info.cliqueId),
            degraded_bandwidth={1: True, 2: False}.get(degraded),
            health=FABRIC_HEALTH.get(int(info.healthSummary)) if v3 else None,
            health_mask=int(info.healthMask),
            health_summary=int(info.healthSummary) if v3 else None,
        )

    def _fabric_telemetry(self, index: int) -> dict[str, Any]:
        """The Telemetry fabric fields; all None for a GPU that is not on an NVLink fabric."""
        if (index, "fabric") in self._unsupported:
            return {}
        info = self._fabric_info(index)
        if info is None or info.state == "not-supported":
            self._unsupported.add((index, "fabric"))
            return {}
        return {
            "fabric_status": info.dcgm_status,
            "fabric_error": info.status if info.state == "completed" else None,
            "fabric_clique_id": info.clique_id if info.attached else None,
            "fabric_cluster_uuid": info.cluster_uuid,
            "fabric_health_mask": info.health_mask,
            "fabric_health_summary": info.health_summary,
        }

    # -- telemetry -----------------------------------------------------------------------------------------
    async def telemetry(self, index: int) -> Telemetry:
        return await self._run(self._telemetry, index)

    def _telemetry(self, index: int) -> Telemetry:
        h = self._handle(index)
        o = _optional
        util = o(pynvml.nvmlDeviceGetUtilizationRates, h)
        # v2 splits the driver's reserved memory out of "used" (total = used + free + reserved), as DCGM's
        # FB_USED / FB_RESERVED do; a driver without v2 answers v1, whose "used" includes the reserved part
        mem2 = o(pynvml.nvmlDeviceGetMemoryInfo, h, pynvml.nvmlMemory_v2)
        mem = mem2 if mem2 is not None else o(pynvml.nvmlDeviceGetMemoryInfo, h)
        used_bytes = int(mem.used) if mem is not None else None
        free_bytes = int(mem.free) if mem is not None else None
        power = o(pynvml.nvmlDeviceGetPowerUsage, h)
        enc = o(pynvml.nvmlDeviceGetEncoderUtilization, h)
        dec = o(pynvml.nvmlDeviceGetDecoderUtilization, h)
        remap = o(pynvml.nvmlDeviceGetRemappedRows, h)
        retired_sbe = o(
            pynvml.nvmlDeviceGetRetiredPages,
            h,
            pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
        )
        retired_dbe = o(
            pynvml.nvmlDeviceGetRetiredPages, h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
        )
        pending = o(pynvml.nvmlDeviceGetRetiredPagesPendingStatus, h)
        procs = o(pynvml.nvmlDeviceGetComputeRunningProcesses, h) or []

        def ecc(kind: int, counter: int) -> int | None:
            return o(pynvml.nvmlDeviceGetTotalEccErrors, h, kind, counter)

        sample = Telemetry(
            gpu_index=index,
            gpu_util=util.gpu if util is not None else None,
            mem_copy_util=util.memory if util is not None else None,
            memory_used_mib=used_bytes // MIB if used_bytes is not None else None,
            memory_free_mib=free_bytes // MIB if free_bytes is not None else None,
            memory_reserved_mib=int(mem2.reserved) // MIB if mem2 is not None else None,
            vgpu_license_status=self._vgpu_license(index, h),
            **self._field_values(index, h),
            temperature_c=o(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU),
            power_w=power / 1000 if power is not None else None,
            energy_mj=o(pynvml.nvmlDeviceGetTotalEnergyConsumption, h),
            sm_clock_mhz=o(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM),
            mem_clock_mhz=o(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_MEM),
            pcie_tx_kbs=o(pynvml.nvmlDeviceGetPcieThroughput, h, pynvml.NVML_PCIE_UTIL_TX_BYTES),
            pcie_rx_kbs=o(pynvml.nvmlDeviceGetPcieThroughput, h, pynvml.NVML_PCIE_UTIL_RX_BYTES),
            pcie_replay=o(pynvml.nvmlDeviceGetPcieReplayCounter, h),
            enc_util=enc[0] if enc is not None else None,
            dec_util=dec[0] if dec is not None else None,
            ecc_sbe_volatile=ecc(pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC),
            ecc_dbe_volatile=ecc(pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC),
            ecc_sbe_aggregate=ecc(pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC),
            ecc_dbe_aggregate=ecc(pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC),
            retired_pages_sbe=len(retired_sbe) if retired_sbe is not None else None,
            retired_pages_dbe=len(retired_dbe) if retired_dbe is not None else None,
            retired_pages_pending=bool(pending) if pending is not None else None,
            remapped_rows_correctable=remap[0] if remap is not None else None,
            remapped_rows_uncorrectable=remap[1] if remap is not None else None,
            remapped_rows_pending=bool(remap[2]) if remap is not None else None,
            remapped_rows_failure=bool(remap[3]) if remap is not None else None,
            clock_event_reasons=o(pynvml.nvmlDeviceGetCurrentClocksEventReasons, h),
            pstate=o(pynvml.nvmlDeviceGetPerformanceState, h),
            processes=tuple((int(p.pid), int(p.usedGpuMemory or 0) // MIB) for p in procs),
        )
        fabric = self._fabric_telemetry(index)
        return dataclasses.replace(sample, **fabric) if fabric else sample

    def _field_values(self, index: int, h: Handle) -> dict[str, Any]:
        """The FIELDS in one call; a field the GPU does not supply is None."""
        out: dict[str, int | None] = dict.fromkeys((name for name, _ in FIELDS), None)
        if (index, "fields") in self._unsupported:
            return out
        values = _call(pynvml.nvmlDeviceGetFieldValues, h, [f for _, f in FIELDS], tolerate=UNSUPPORTED)
        if values is None:
            self._unsupported.add((index, "fields"))
            return out
        for i, (name, _) in enumerate(FIELDS):
            number = _field_number(values[i])
            if number is not None:
                previous = out[name]
                out[name] = number if previous is None else previous + number
        return out

    def _vgpu_license(self, index: int, h: Handle) -> int | None:
        """1 when a vGPU guest holds a licence, 0 when it has none; None where NVML has no vGPU
        licensing (bare metal, passthrough). Asked once more only where the GPU answered."""
        if (index, "vgpu") in self._unsupported:
            return None
        features = _call(pynvml.nvmlDeviceGetGridLicensableFeatures_v4, h, tolerate=UNSUPPORTED)
        if features is None or not int(features.isGridLicenseSupported):
            self._unsupported.add((index, "vgpu"))
            return None
        count = int(features.licensableFeaturesCount)
        licensed = any(int(features.gridLicensableFeatures[i].featureState) == 1 for i in range(count))
        return int(licensed)

    # -- GPM (Hopper and later) ----------------------------------------------------------------------------
    async def gpm_utilization(self, index: int) -> dict[str, float] | None:
        """GPM activity of a GPU since the previous call, in percent: {"graphics", "tensor", "dram"}.

        None where the GPU has no GPM (before Hopper, or a driver without it) and on the first call for a
        GPU, which only takes the sample the next call measures from. Each call measures the interval
        since the previous call for that GPU, whoever made it: one caller per GPU should own the cadence.
        A metric the GPU cannot report is left out of the dict. Raises GpuLost for a lost GPU (the next
        call after that starts over and returns None).
        """
        return await self._run(self._gpm_utilization, index)

    def _gpm_supported(self, index: int, h: Handle) -> bool:
        supported = self._gpm_support.get(index)
        if supported is None:
            info = _optional(pynvml.nvmlGpmQueryDeviceSupport, h)
            supported = info is not None and bool(info.isSupportedDevice)
            self._gpm_support[index] = supported
        return supported

    def _gpm_buffers(self, index: int) -> _GpmSamples:
        samples = self._gpm_samples.get(index)
        if samples is None:
            first = _call(pynvml.nvmlGpmSampleAlloc)
            try:
                second = _call(pynvml.nvmlGpmSampleAlloc)
            except errors.NvmlError:
                pynvml.nvmlGpmSampleFree(first)
                raise
            samples = self._gpm_samples[index] = _GpmSamples(first, second)
        return samples

    def _gpm_utilization(self, index: int) -> dict[str, float] | None:
        h = self._handle(index)
        if not self._gpm_supported(index, h):
            return None
        samples = self._gpm_buffers(index)
        try:
            _call(pynvml.nvmlGpmSampleGet, h, samples.scratch)
        except errors.NvmlError as err:
            samples.primed = False  # no usable interval until a fresh sample is taken
            if isinstance(err, (errors.NotSupported, errors.FunctionNotFound)):
                return None
            raise
        if not samples.primed:
            samples.advance()
            return None
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GPM_METRICS)
        request.sample1 = samples.previous
        request.sample2 = samples.scratch
        for i, metric_id in enumerate(GPM_METRICS.values()):
            request.metrics[i].metricId = metric_id
        samples.advance()
        result = _optional(pynvml.nvmlGpmMetricsGet, request)
        if result is None:
            return None
        out: dict[str, float] = {}
        for i, name in enumerate(GPM_METRICS):
            metric = request.metrics[i]
            if metric.nvmlReturn == pynvml.NVML_SUCCESS:
                out[name] = max(0.0, min(100.0, float(metric.value)))
        return out

    # -- events --------------------------------------------------------------------------------------------
    def events(
        self,
        mask: int = HEALTH_EVENTS,
        indices: Sequence[int] | None = None,
        ready: asyncio.Event | None = None,
    ) -> AsyncIterator[HealthEvent]:
        """Health events from every (or the given) GPU, as an async iterator fed by its own thread;
        `ready` (an asyncio.Event) is set once the event set is registered, so nothing after is missed."""
        pump: EventPump[Handle, HealthEvent] = EventPump(
            self._pool, self._make_event_set(mask, indices), self._wait_event, self._free_event_set
        )
        return pump.run(ready)

    def _make_event_set(self, mask: int, indices: Sequence[int] | None) -> Callable[[], Handle]:
        def create() -> Handle:
            es: Handle = _call(pynvml.nvmlEventSetCreate)
            for i in indices if indices is not None else range(self._count):
                try:
                    h = self._handle(i)
                    supported = _call(pynvml.nvmlDeviceGetSupportedEventTypes, h)
                    _call(pynvml.nvmlDeviceRegisterEvents, h, mask & supported, es)
                except (errors.GpuLost, errors.NotSupported):
                    continue
            return es

        return create

    def _wait_event(self, es: Handle, timeout_ms: int) -> HealthEvent | None:
        data = _call(pynvml.nvmlEventSetWait_v2, es, timeout_ms, tolerate=(errors.Timeout,))
        if data is None:
            return None
        addr = _addr(data.device)
        index = next((i for i, h in self._handles.items() if _addr(h) == addr), -1)
        etype = int(data.eventType)
        kind = {
            pynvml.nvmlEventTypeXidCriticalError: EventKind.XID,
            pynvml.nvmlEventTypeSingleBitEccError: EventKind.SINGLE_BIT_ECC,
            pynvml.nvmlEventTypeDoubleBitEccError: EventKind.DOUBLE_BIT_ECC,
            0x100: EventKind.MIG_CONFIG,
        }.get(etype, EventKind.OTHER)
        gi = int(data.gpuInstanceId)
        ci = int(data.computeInstanceId)
        return HealthEvent(
            gpu_index=index,
            gpu_uuid=self._uuids.get(index, ""),
            kind=kind,
            xid=int(data.eventData) if kind is EventKind.XID else None,
            data=int(data.eventData),
            gi_id=None if gi == 0xFFFFFFFF else gi,
            ci_id=None if ci == 0xFFFFFFFF else ci,
        )

    def _free_event_set(self, es: Handle) -> None:
        _call(pynvml.nvmlEventSetFree, es, tolerate=ANY_ERROR)

"""A simulated libnvidia-ml: the object pynvml's unmodified wrappers call into.

pynvml resolves every C symbol with `getattr(nvmlLib, name)` and calls it with ctypes arguments exactly as
the C prototype expects (no argtypes are set). This class answers those calls with C semantics: integer
return codes, outputs written through pointers, caller-sized string buffers (INSUFFICIENT_SIZE), version
words on versioned structs, handles that are real addresses, init reference counting. Symbols it does not
implement are missing, so pynvml reports FUNCTION_NOT_FOUND as it would on an older driver.

Strict mode checks each argument's shape against the C prototype (pointer vs value) and raises
`StrictModeViolation` for calls that would crash or corrupt memory in the real library.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpunode.nvml import mig
from gpunode.sim.nvml import codes
from gpunode.sim.nvml.node import SimNode
from gpunode.sim.nvml.presets import ARCH_HOPPER, Product, links_to_switches
from gpunode.sim.nvml.state import (
    EVENT_CLOCK,
    EVENT_DBE,
    EVENT_MIG_CONFIG,
    EVENT_PSTATE,
    EVENT_SBE,
    EVENT_XID,
    INIT_FAULTS,
    Event,
    SimCiState,
    SimGiState,
    SimNodeState,
    StateError,
    telemetry,
)

MEMORY_V2 = 0x02000028
GI_PROFILE_INFO_V2 = 0x02000098
GI_PROFILE_INFO_V3 = 0x03000098
CI_PROFILE_INFO_V2 = 0x02000088
CI_PROFILE_INFO_V3 = 0x03000088
FABRIC_INFO_V2 = 0x02000024  # nvmlGpuFabricInfo_v2 (nvmlGpuFabricInfoV_t)
FABRIC_INFO_V3 = 0x03000028
MIB = 1 << 20

TOPO_INTERNAL, TOPO_MULTIPLE, TOPO_NODE, TOPO_SYSTEM = 0, 20, 40, 50
NVLINK_DEVICE_GPU, NVLINK_DEVICE_SWITCH = 0x00, 0x02
FIELD_TOTAL_ENERGY = 83
FIELD_POWER_INSTANT = 186
GPM_SUPPORT_VERSION = 1
GPM_METRICS_GET_VERSION = 1
GPM_GRAPHICS_UTIL, GPM_ANY_TENSOR_UTIL, GPM_DRAM_BW_UTIL = 1, 5, 10
GPM_TENSOR_SHARE = 0.55  # of graphics activity, spent in tensor cores
GPM_SM_UTIL, GPM_SM_OCCUPANCY, GPM_FP64_UTIL, GPM_FP32_UTIL, GPM_FP16_UTIL = 2, 3, 11, 12, 13
# shares of graphics activity for the other GPM metrics the simulator reports
GPM_SHARES = {
    GPM_SM_UTIL: 0.9,
    GPM_SM_OCCUPANCY: 0.4,
    GPM_FP64_UTIL: 0.05,
    GPM_FP32_UTIL: 0.3,
    GPM_FP16_UTIL: 0.2,
}
VBIOS_VERSION = "96.00.89.00.01"
INFOROM_IMAGE = "G520.0200.00.05"
INFOROM_OBJECTS = {0: "2.1", 1: "7.0", 2: None}  # NVML_INFOROM_OEM, _ECC, _POWER (None: not supported)
FIELD_MEMORY_TEMP = 82
FIELD_NVLINK_ERROR_TOTALS = (38, 45, 52, 59)  # CRC flit, CRC data, replay, recovery
FIELD_NVLINK_RAW_TX, FIELD_NVLINK_RAW_RX = 140, 141  # KiB since boot
NVLINK_RAW_KIB_PER_S = {FIELD_NVLINK_RAW_TX: 150_000, FIELD_NVLINK_RAW_RX: 140_000}
# perf-policy (clock event) fields 74..79 (power, thermal, sync boost, board limit, low utilisation,
# reliability): the share of time each one held the clocks back, as a violation time in ns since boot
FIELD_VIOLATION_SHARES = {74: 0.02, 75: 0.001, 76: 0.0, 77: 0.0, 78: 0.3, 79: 0.0}
GPM_POINTS = 10  # utilisation points averaged over a GPM interval
MIN_GRAPHICS_CLOCK, GRAPHICS_CLOCK_STEP = 210, 15  # supported graphics clocks: max down to 210 MHz
CArgObject = type(ctypes.byref(ctypes.c_int()))


class StrictModeViolation(TypeError):
    """An argument shape the real C library would misread (a struct by value, a count without byref)."""


# -- argument shapes ---------------------------------------------------------------------------------------
# h: opaque handle by value (device, GPU/compute instance, event set); v: scalar by value;
# p: pointer (byref, pointer, array); n: pointer or NULL; s: char buffer; c: const char* input.


_KIND_TYPES: dict[str, tuple[tuple[type, ...], bool]] = {
    "h": ((ctypes._Pointer,), False),
    "v": ((int, ctypes._SimpleCData), False),
    "p": ((CArgObject, ctypes._Pointer, ctypes.Array), False),
    "n": ((CArgObject, ctypes._Pointer, ctypes.Array), True),
    "s": ((ctypes.Array,), False),
    "c": ((bytes, ctypes.c_char_p), False),
}
_KIND_TEXT = {
    "h": "a handle by value",
    "v": "a scalar by value",
    "p": "a pointer (byref)",
    "n": "a pointer or NULL",
    "s": "a char buffer",
    "c": "a const char*",
}


def _spec(kinds: str) -> _Spec:
    return tuple(_KIND_TYPES[k] for k in kinds)


_Spec = tuple[tuple[tuple[type, ...], bool], ...]


def _check(name: str, kinds: str, spec: _Spec, args: tuple[Any, ...]) -> None:
    if len(args) != len(spec):
        raise StrictModeViolation(f"{name}: expected {len(spec)} arguments, got {len(args)}")
    for i, (a, (types, nullable)) in enumerate(zip(args, spec, strict=False)):
        if isinstance(a, types) or (nullable and a is None):
            k = kinds[i]
            if k == "v" and isinstance(a, ctypes.c_char_p):
                pass  # a string is no scalar
            elif k == "s" and getattr(a, "_type_", None) is not ctypes.c_char:
                pass
            else:
                continue
        what = _KIND_TEXT[kinds[i]]
        raise StrictModeViolation(f"{name}: argument {i + 1} must be {what}, got {type(a).__name__}")


def _out(a: Any) -> Any:
    """The object an output pointer points at."""
    if isinstance(a, CArgObject):
        return getattr(a, "_obj")  # noqa: B009 - ctypes' CArgObject is untyped
    if isinstance(a, ctypes._Pointer):
        return a.contents
    return a


def _val(a: Any) -> int:
    return int(a.value) if hasattr(a, "value") else int(a)


def _addr(handle: Any) -> int | None:
    try:
        return ctypes.addressof(handle.contents)  # the fastest way to read a pointer's value
    except (ValueError, AttributeError, TypeError):  # NULL, or not a pointer (lenient mode)
        try:
            return ctypes.cast(handle, ctypes.c_void_p).value
        except ctypes.ArgumentError:
            return None


def _text(a: Any) -> str:
    raw = a.value if isinstance(a, ctypes.c_char_p) else a
    return raw.decode() if isinstance(raw, bytes) else ""


def _put_str(buf: Any, length: Any, text: str) -> int:
    data = text.encode()
    if len(data) + 1 > _val(length):
        return codes.INSUFFICIENT_SIZE
    buf.value = data
    return codes.SUCCESS


class _Symbol:
    """One exported C function: accepts restype/argtypes like a ctypes function, counts calls."""

    __slots__ = ("argtypes", "calls", "checked", "fn", "kinds", "lib", "name", "restype", "spec")

    def __init__(self, lib: FakeNvmlLib, name: str, kinds: str, fn: Callable[..., Any]) -> None:
        self.lib, self.name, self.kinds, self.fn = lib, name, kinds, fn
        self.spec = _spec(kinds)
        self.checked: set[tuple[type, ...]] = set()  # argument type signatures already found valid
        self.restype: Any = ctypes.c_int
        self.argtypes: Any = None
        self.calls = 0

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        if self.lib.strict:
            # validity depends only on the arguments' types (ctypes array types carry their element
            # type), so each type signature is checked once
            signature = tuple(map(type, args))
            if signature not in self.checked:
                _check(self.name, self.kinds, self.spec, args)
                self.checked.add(signature)
        return self.fn(*args)


# -- handle kinds --------------------------------------------------------------------------------------
DEV, MIGDEV, GI, CI, EVSET, GPM = "dev", "mig", "gi", "ci", "evset", "gpm"


@dataclass
class _GpmSample:
    """What nvmlGpmSampleGet recorded into an allocated sample (gpu None: never filled)."""

    gpu: int | None = None
    gi: int | None = None  # GPU instance id for nvmlGpmMigSampleGet, None for the whole GPU
    time: float = 0.0
    seq: int = 0  # order in which samples were taken


class _EventSet:
    def __init__(self, cursor: int) -> None:
        self.cursor = cursor
        self.registrations: dict[int, int] = {}  # gpu -> mask
        self.watcher: Any = None

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.close()
            self.watcher = None


class FakeNvmlLib:
    """Stands in for `CDLL("libnvidia-ml.so.1")` beneath pynvml."""

    def __init__(self, node: SimNode, strict: bool = True) -> None:
        self.node = node
        self.strict = strict
        self.init_count = 0
        self._buffers: list[Any] = []
        self._by_key: dict[tuple[Any, ...], int] = {}
        self._by_addr: dict[int, tuple[Any, ...]] = {}
        self._event_sets: dict[int, _EventSet] = {}
        self._next_evset = 1
        self._gpm_samples: dict[int, _GpmSample] = {}
        self._next_gpm = 1
        self._gpm_seq = 0
        self._symbols: dict[str, _Symbol] = {}
        self._register()

    # pynvml does getattr(nvmlLib, name) under its load lock: a plain dict lookup, never a callback.
    def __getattr__(self, name: str) -> _Symbol:
        symbols = self.__dict__.get("_symbols")
        if symbols is not None and name in symbols:
            found: _Symbol = symbols[name]
            return found
        raise AttributeError(name)

    @property
    def symbols(self) -> dict[str, _Symbol]:
        return self._symbols

    # -- handles ---------------------------------------------------------------------------------------
    def _handle_addr(self, key: tuple[Any, ...]) -> int:
        addr = self._by_key.get(key)
        if addr is None:
            buf = ctypes.create_string_buffer(8)
            self._buffers.append(buf)
            addr = ctypes.addressof(buf)
            self._by_key[key] = addr
            self._by_addr[addr] = key
        return addr

    def _write_handle(self, out: Any, key: tuple[Any, ...]) -> None:
        ctypes.c_void_p.from_buffer(_out(out)).value = self._handle_addr(key)

    def _key(self, handle: Any) -> tuple[Any, ...] | None:
        addr = _addr(handle)
        return None if addr is None else self._by_addr.get(addr)

    # -- registration ----------------------------------------------------------------------------------
    def _register(self) -> None:
        for name, kinds, fn in self._table():
            self._symbols[name] = _Symbol(self, name, kinds, fn)

    def _table(self) -> list[tuple[str, str, Callable[..., Any]]]:
        d = self._device_call
        return [
            ("nvmlInitWithFlags", "v", self._init),
            ("nvmlInit_v2", "", lambda: self._init(0)),
            ("nvmlShutdown", "", self._shutdown),
            ("nvmlErrorString", "v", lambda code: codes.STRINGS.get(_val(code), "Unknown Error").encode()),
            (
                "nvmlSystemGetDriverVersion",
                "sv",
                self._sys(lambda st, b, n: _put_str(b, n, st.spec.driver_version)),
            ),
            (
                "nvmlSystemGetNVMLVersion",
                "sv",
                self._sys(
                    lambda st, b, n: _put_str(
                        b, n, f"{st.spec.cuda_driver_version // 1000}.{st.spec.driver_version}"
                    )
                ),
            ),
            (
                "nvmlSystemGetCudaDriverVersion",
                "p",
                self._sys(lambda st, p: self._set(p, st.spec.cuda_driver_version)),
            ),
            (
                "nvmlSystemGetCudaDriverVersion_v2",
                "p",
                self._sys(lambda st, p: self._set(p, st.spec.cuda_driver_version)),
            ),
            ("nvmlDeviceGetCount_v2", "p", self._sys(lambda st, p: self._set(p, len(st.gpus)))),
            ("nvmlDeviceGetHandleByIndex_v2", "vp", self._sys(self._handle_by_index)),
            ("nvmlDeviceGetHandleByUUID", "cp", self._sys(self._handle_by_uuid)),
            ("nvmlDeviceGetHandleByPciBusId_v2", "cp", self._sys(self._handle_by_bus_id)),
            ("nvmlDeviceGetName", "hsv", d(self._name, mig_ok=True)),
            ("nvmlDeviceGetUUID", "hsv", d(self._uuid, mig_ok=True)),
            ("nvmlDeviceGetSerial", "hsv", d(lambda st, k, b, n: _put_str(b, n, st.serial(k[1])))),
            ("nvmlDeviceGetIndex", "hp", d(lambda st, k, p: self._set(p, k[1]))),
            ("nvmlDeviceGetVbiosVersion", "hsv", d(lambda st, k, b, n: _put_str(b, n, VBIOS_VERSION))),
            ("nvmlDeviceGetInforomVersion", "hvsv", d(self._inforom_version)),
            ("nvmlDeviceGetInforomImageVersion", "hsv", d(lambda st, k, b, n: _put_str(b, n, INFOROM_IMAGE))),
            ("nvmlDeviceGetMinorNumber", "hp", d(lambda st, k, p: self._set(p, k[1]))),
            ("nvmlDeviceGetPciInfo_v3", "hp", d(self._pci_info, mig_ok=True)),
            ("nvmlDeviceGetMemoryInfo", "hp", d(self._memory_v1, mig_ok=True)),
            ("nvmlDeviceGetMemoryInfo_v2", "hp", d(self._memory_v2, mig_ok=True)),
            ("nvmlDeviceGetCudaComputeCapability", "hpp", d(self._cc, mig_ok=True)),
            (
                "nvmlDeviceGetArchitecture",
                "hp",
                d(lambda st, k, p: self._set(p, st.product(k[1]).architecture)),
            ),
            ("nvmlDeviceGetBrand", "hp", d(lambda st, k, p: self._set(p, st.product(k[1]).brand))),
            ("nvmlDeviceGetNumaNodeId", "hp", d(lambda st, k, p: self._set(p, st.spec.gpus[k[1]].numa_node))),
            ("nvmlDeviceGetPersistenceMode", "hp", d(lambda st, k, p: self._set(p, 1))),
            ("nvmlDeviceGetComputeMode", "hp", d(lambda st, k, p: self._set(p, st.gpus[k[1]].compute_mode))),
            ("nvmlDeviceSetComputeMode", "hv", d(self._set_compute_mode, mutates=True)),
            ("nvmlDeviceGetAttributes_v2", "hp", d(self._attributes, mig_ok=True)),
            ("nvmlDeviceGetTopologyCommonAncestor", "hhp", self._sys(self._common_ancestor)),
            ("nvmlDeviceGetP2PStatus", "hhvp", self._sys(self._p2p_status)),
            ("nvmlDeviceGetNvLinkState", "hvp", d(self._nvlink_state)),
            ("nvmlDeviceGetNvLinkVersion", "hvp", d(self._nvlink_version)),
            ("nvmlDeviceGetNvLinkRemotePciInfo_v2", "hvp", d(self._nvlink_remote_pci)),
            ("nvmlDeviceGetNvLinkRemoteDeviceType", "hvp", d(self._nvlink_remote_type)),
            # MIG
            ("nvmlDeviceGetMigMode", "hpp", d(self._get_mig_mode)),
            ("nvmlDeviceSetMigMode", "hvp", d(self._set_mig_mode, mutates=True)),
            ("nvmlDeviceGetGpuInstanceProfileInfo", "hvp", d(self._gi_profile_info_v1)),
            ("nvmlDeviceGetGpuInstanceProfileInfoV", "hvp", d(self._gi_profile_info_v)),
            ("nvmlDeviceGetGpuInstanceProfileInfoByIdV", "hvp", d(self._gi_profile_info_by_id)),
            ("nvmlDeviceGetGpuInstancePossiblePlacements_v2", "hvnp", d(self._gi_possible_placements)),
            ("nvmlDeviceGetGpuInstanceRemainingCapacity", "hvp", d(self._gi_remaining)),
            ("nvmlDeviceCreateGpuInstance", "hvp", d(self._create_gi, mutates=True)),
            ("nvmlDeviceCreateGpuInstanceWithPlacement", "hvpp", d(self._create_gi_placed, mutates=True)),
            ("nvmlDeviceGetGpuInstances", "hvnp", d(self._get_gis)),
            ("nvmlDeviceGetGpuInstanceById", "hvp", d(self._gi_by_id)),
            ("nvmlGpuInstanceDestroy", "h", self._gi_call(self._destroy_gi, mutates=True)),
            ("nvmlGpuInstanceGetInfo", "hp", self._gi_call(self._gi_info)),
            ("nvmlGpuInstanceGetComputeInstanceProfileInfo", "hvvp", self._gi_call(self._ci_profile_info_v1)),
            ("nvmlGpuInstanceGetComputeInstanceProfileInfoV", "hvvp", self._gi_call(self._ci_profile_info_v)),
            ("nvmlGpuInstanceGetComputeInstanceRemainingCapacity", "hvp", self._gi_call(self._ci_remaining)),
            (
                "nvmlGpuInstanceGetComputeInstancePossiblePlacements",
                "hvnp",
                self._gi_call(self._ci_placements),
            ),
            ("nvmlGpuInstanceCreateComputeInstance", "hvp", self._gi_call(self._create_ci, mutates=True)),
            (
                "nvmlGpuInstanceCreateComputeInstanceWithPlacement",
                "hvpp",
                self._gi_call(self._create_ci_placed, mutates=True),
            ),
            ("nvmlGpuInstanceGetComputeInstances", "hvnp", self._gi_call(self._get_cis)),
            ("nvmlGpuInstanceGetComputeInstanceById", "hvp", self._gi_call(self._ci_by_id)),
            ("nvmlComputeInstanceDestroy", "h", self._ci_call(self._destroy_ci, mutates=True)),
            ("nvmlComputeInstanceGetInfo_v2", "hp", self._ci_call(self._ci_info)),
            (
                "nvmlDeviceIsMigDeviceHandle",
                "hp",
                d(lambda st, k, p: self._set(p, int(k[0] == MIGDEV)), mig_ok=True),
            ),
            ("nvmlDeviceGetGpuInstanceId", "hp", d(self._mig_gi_id, mig_ok=True)),
            ("nvmlDeviceGetComputeInstanceId", "hp", d(self._mig_ci_id, mig_ok=True)),
            ("nvmlDeviceGetMaxMigDeviceCount", "hp", d(self._max_mig_count)),
            ("nvmlDeviceGetMigDeviceHandleByIndex", "hvp", d(self._mig_handle_by_index)),
            ("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", "hp", d(self._parent_handle, mig_ok=True)),
            # events
            ("nvmlEventSetCreate", "p", self._sys(self._event_set_create)),
            (
                "nvmlDeviceGetSupportedEventTypes",
                "hp",
                d(lambda st, k, p: self._set(p, self._supported(st, k[1]))),
            ),
            ("nvmlDeviceRegisterEvents", "hvh", d(self._register_events)),
            ("nvmlEventSetWait_v2", "hpv", self._event_wait),
            ("nvmlEventSetFree", "h", self._event_set_free),
            # telemetry
            ("nvmlDeviceGetUtilizationRates", "hp", d(self._utilization)),
            (
                "nvmlDeviceGetTemperature",
                "hvp",
                d(lambda st, k, s, p: self._set(p, self._tm(st, k).temperature_c)),
            ),
            ("nvmlDeviceGetPowerUsage", "hp", d(lambda st, k, p: self._set(p, self._tm(st, k).power_mw))),
            (
                "nvmlDeviceGetTotalEnergyConsumption",
                "hp",
                d(lambda st, k, p: self._set(p, self._tm(st, k).energy_mj)),
            ),
            (
                "nvmlDeviceGetEnforcedPowerLimit",
                "hp",
                d(lambda st, k, p: self._set(p, st.product(k[1]).tdp_w * 1000)),
            ),
            (
                "nvmlDeviceGetPowerManagementLimit",
                "hp",
                d(lambda st, k, p: self._set(p, st.product(k[1]).tdp_w * 1000)),
            ),
            ("nvmlDeviceGetClockInfo", "hvp", d(self._clock)),
            ("nvmlDeviceGetMaxClockInfo", "hvp", d(self._max_clock)),
            ("nvmlDeviceGetSupportedMemoryClocks", "hpn", d(self._supported_memory_clocks)),
            ("nvmlDeviceGetSupportedGraphicsClocks", "hvpn", d(self._supported_graphics_clocks)),
            ("nvmlDeviceGetPcieThroughput", "hvp", d(self._pcie_throughput)),
            (
                "nvmlDeviceGetPcieReplayCounter",
                "hp",
                d(lambda st, k, p: self._set(p, st.gpus[k[1]].pcie_replay)),
            ),
            (
                "nvmlDeviceGetCurrPcieLinkGeneration",
                "hp",
                d(lambda st, k, p: self._set(p, st.product(k[1]).pcie_gen)),
            ),
            (
                "nvmlDeviceGetCurrPcieLinkWidth",
                "hp",
                d(lambda st, k, p: self._set(p, st.product(k[1]).pcie_width)),
            ),
            ("nvmlDeviceGetPowerManagementLimitConstraints", "hpp", d(self._power_constraints)),
            (
                "nvmlDeviceGetPowerManagementDefaultLimit",
                "hp",
                d(lambda st, k, p: self._set(p, st.product(k[1]).tdp_w * 1000)),
            ),
            # NVLink fabric (GB200 and the like)
            ("nvmlDeviceGetGpuFabricInfo", "hp", d(self._fabric_info_v1)),
            ("nvmlDeviceGetGpuFabricInfoV", "hp", d(self._fabric_info_v)),
            ("nvmlDeviceGetEncoderUtilization", "hpp", d(self._enc_util)),
            ("nvmlDeviceGetDecoderUtilization", "hpp", d(self._dec_util)),
            ("nvmlDeviceGetEccMode", "hpp", d(self._ecc_mode)),
            ("nvmlDeviceGetTotalEccErrors", "hvvp", d(self._total_ecc)),
            ("nvmlDeviceGetRetiredPages", "hvpn", d(self._retired_pages)),
            ("nvmlDeviceGetRetiredPagesPendingStatus", "hp", d(self._retired_pending)),
            ("nvmlDeviceGetRemappedRows", "hpppp", d(self._remapped_rows)),
            ("nvmlDeviceGetCurrentClocksEventReasons", "hp", d(self._clock_reasons)),
            ("nvmlDeviceGetCurrentClocksThrottleReasons", "hp", d(self._clock_reasons)),
            ("nvmlDeviceGetPerformanceState", "hp", d(lambda st, k, p: self._set(p, self._tm(st, k).pstate))),
            ("nvmlDeviceGetFanSpeed", "hp", d(lambda st, k, p: codes.NOT_SUPPORTED)),
            ("nvmlDeviceGetComputeRunningProcesses_v3", "hpn", d(self._processes, mig_ok=True)),
            # the simulated workloads are compute processes: no graphics or MPS clients to list
            (
                "nvmlDeviceGetGraphicsRunningProcesses_v3",
                "hpn",
                d(self._no_processes("Graphics"), mig_ok=True),
            ),
            (
                "nvmlDeviceGetMPSComputeRunningProcesses_v3",
                "hpn",
                d(self._no_processes("MPSCompute"), mig_ok=True),
            ),
            ("nvmlDeviceGetFieldValues", "hvp", d(self._field_values)),
            # GPM (Hopper and later)
            ("nvmlGpmQueryDeviceSupport", "hp", d(self._gpm_support)),
            ("nvmlGpmSampleAlloc", "p", self._sys(self._gpm_alloc)),
            ("nvmlGpmSampleFree", "h", self._gpm_free),
            ("nvmlGpmSampleGet", "hh", d(self._gpm_sample_get)),
            ("nvmlGpmMigSampleGet", "hvh", d(self._gpm_mig_sample_get)),
            ("nvmlGpmMetricsGet", "p", self._sys(self._gpm_metrics_get)),
        ]

    # -- call plumbing ---------------------------------------------------------------------------------
    @staticmethod
    def _set(p: Any, value: int) -> int:
        _out(p).value = value
        return codes.SUCCESS

    def _state(self) -> SimNodeState | int:
        """The fresh node state, or an error code when the library is not usable."""
        if self.init_count <= 0:
            return codes.UNINITIALIZED
        try:
            return self.node.refresh()
        except StateError:
            return codes.UNKNOWN

    def _sys(self, fn: Callable[..., int]) -> Callable[..., int]:
        def call(*args: Any) -> int:
            with self.node.lock:
                st = self._state()
                if isinstance(st, int):
                    return st
                return fn(st, *args)

        return call

    def _resolve_device(self, st: SimNodeState, handle: Any, mig_ok: bool) -> tuple[Any, ...] | int:
        key = self._key(handle)
        if key is None or key[0] not in (DEV, MIGDEV):
            return codes.INVALID_ARGUMENT
        gpu = key[1]
        if st.gpus[gpu].lost:
            return codes.GPU_IS_LOST
        if key[0] == MIGDEV:
            if not mig_ok:
                return codes.NOT_SUPPORTED
            if self._mig_lookup(st, key) is None:
                return codes.INVALID_ARGUMENT
        return key

    def _device_call(
        self, fn: Callable[..., int], mig_ok: bool = False, mutates: bool = False
    ) -> Callable[..., int]:
        def call(handle: Any, *args: Any) -> int:
            with self.node.lock:
                st = self._state()
                if isinstance(st, int):
                    return st
                key = self._resolve_device(st, handle, mig_ok)
                if isinstance(key, int):
                    return key
                return self._apply(fn, st, key, args, mutates)

        return call

    def _instance_call(self, kind: str, fn: Callable[..., int], mutates: bool) -> Callable[..., int]:
        def call(handle: Any, *args: Any) -> int:
            with self.node.lock:
                st = self._state()
                if isinstance(st, int):
                    return st
                key = self._key(handle)
                if key is None or key[0] != kind:
                    return codes.INVALID_ARGUMENT
                if st.gpus[key[1]].lost:
                    return codes.GPU_IS_LOST
                return self._apply(fn, st, key, args, mutates)

        return call

    def _apply(
        self,
        fn: Callable[..., int],
        st: SimNodeState,
        key: tuple[Any, ...],
        args: tuple[Any, ...],
        mutates: bool,
    ) -> int:
        """Run a resolved call: a mutating one on a fresh state that is committed only if it succeeds."""
        if not mutates:
            return fn(st, key, *args)
        try:
            with self.node.mutate() as fresh:
                result = fn(fresh, key, *args)
                if result != codes.SUCCESS:
                    raise _Abort(result)
                return result
        except _Abort as abort:
            return abort.code

    def _gi_call(self, fn: Callable[..., int], mutates: bool = False) -> Callable[..., int]:
        def checked(st: SimNodeState, key: tuple[Any, ...], *args: Any) -> int:
            gi = st.find_gi(key[1], key[2])
            if gi is None:
                return codes.INVALID_ARGUMENT
            return fn(st, key, gi, *args)

        return self._instance_call(GI, checked, mutates)

    def _ci_call(self, fn: Callable[..., int], mutates: bool = False) -> Callable[..., int]:
        def checked(st: SimNodeState, key: tuple[Any, ...], *args: Any) -> int:
            gi = st.find_gi(key[1], key[2])
            ci = next((c for c in gi.cis if c.id == key[3]), None) if gi else None
            if gi is None or ci is None:
                return codes.INVALID_ARGUMENT
            return fn(st, key, gi, ci, *args)

        return self._instance_call(CI, checked, mutates)

    # -- init ------------------------------------------------------------------------------------------
    def _init(self, flags: Any) -> int:
        with self.node.lock:
            try:
                st = self.node.refresh()
            except StateError:
                return codes.UNKNOWN
            if st.init_fault is not None:
                return INIT_FAULTS[st.init_fault]
            self.init_count += 1
            return codes.SUCCESS

    def _shutdown(self) -> int:
        with self.node.lock:
            if self.init_count <= 0:
                return codes.UNINITIALIZED
            self.init_count -= 1
            return codes.SUCCESS

    # -- identity --------------------------------------------------------------------------------------
    def _handle_by_index(self, st: SimNodeState, index: Any, out: Any) -> int:
        i = _val(index)
        if not 0 <= i < len(st.gpus):
            return codes.INVALID_ARGUMENT
        if st.gpus[i].lost:
            return codes.GPU_IS_LOST
        self._write_handle(out, (DEV, i))
        return codes.SUCCESS

    def _handle_by_uuid(self, st: SimNodeState, uuid: Any, out: Any) -> int:
        text = _text(uuid)
        for i in range(len(st.gpus)):
            if st.gpu_uuid(i) == text:
                if st.gpus[i].lost:
                    return codes.GPU_IS_LOST
                self._write_handle(out, (DEV, i))
                return codes.SUCCESS
            for gi, ci in st.mig_devices(i):
                if st.mig_uuid(i, gi.id, ci.id) == text:
                    self._write_handle(out, (MIGDEV, i, gi.id, ci.id))
                    return codes.SUCCESS
        return codes.NOT_FOUND

    def _handle_by_bus_id(self, st: SimNodeState, bus_id: Any, out: Any) -> int:
        text = _text(bus_id).lower()
        for i in range(len(st.gpus)):
            full = self._bus_id(st, i).lower()
            if text in (full, full[4:]):
                if st.gpus[i].lost:
                    return codes.GPU_IS_LOST
                self._write_handle(out, (DEV, i))
                return codes.SUCCESS
        return codes.NOT_FOUND

    @staticmethod
    def _bus_id(st: SimNodeState, gpu: int) -> str:
        return st.spec.gpus[gpu].bus_id

    def _mig_lookup(self, st: SimNodeState, key: tuple[Any, ...]) -> tuple[SimGiState, SimCiState] | None:
        gi = st.find_gi(key[1], key[2])
        if gi is None or st.gpus[key[1]].mig_current != 1:
            return None
        ci = next((c for c in gi.cis if c.id == key[3]), None)
        return None if ci is None else (gi, ci)

    def _mig_profile_name(self, st: SimNodeState, gpu: int, gi: SimGiState, ci: SimCiState) -> str:
        product = st.product(gpu)
        spec = product.gi_profile(gi.profile)
        assert spec is not None
        gi_name = mig.gi_profile_name(gi.profile, product.memory_mib * MIB, spec.memory_mib)
        return mig.ci_profile_name(gi_name, ci.size)

    def _name(self, st: SimNodeState, key: tuple[Any, ...], buf: Any, n: Any) -> int:
        product = st.product(key[1])
        if key[0] == MIGDEV:
            found = self._mig_lookup(st, key)
            assert found is not None
            return _put_str(buf, n, f"{product.name} MIG {self._mig_profile_name(st, key[1], *found)}")
        return _put_str(buf, n, product.name)

    def _uuid(self, st: SimNodeState, key: tuple[Any, ...], buf: Any, n: Any) -> int:
        if key[0] == MIGDEV:
            return _put_str(buf, n, st.mig_uuid(key[1], key[2], key[3]))
        return _put_str(buf, n, st.gpu_uuid(key[1]))

    def _pci_info(self, st: SimNodeState, key: tuple[Any, ...], p: Any) -> int:
        info = _out(p)
        product = st.product(key[1])
        slot = st.spec.gpus[key[1]]
        bus = slot.bus
        info.busIdLegacy = f"{slot.domain:04X}:{bus:02X}:00.0".encode()
        info.busId = self._bus_id(st, key[1]).encode()
        info.domain = slot.domain
        info.bus = bus
        info.device = 0
        info.pciDeviceId = product.pci_device_id
        info.pciSubSystemId = product.pci_subsystem_id
        return codes.SUCCESS

    def _memory(self, st: SimNodeState, key: tuple[Any, ...]) -> tuple[int, int, int]:
        """(total, reserved, used) in bytes."""
        gpu = key[1]
        product = st.product(gpu)
        procs = st.gpus[gpu].processes
        if key[0] == MIGDEV:
            found = self._mig_lookup(st, key)
            assert found is not None
            spec = product.gi_profile(found[0].profile)
            assert spec is not None
            used = sum(p.used_mib for p in procs if p.gi == key[2]) * MIB
            return spec.memory_mib * MIB, 0, used
        total = product.memory_mib * MIB
        reserved = (product.memory_mib // 160) * MIB  # the driver keeps a slice for itself
        return total, reserved, sum(p.used_mib for p in procs) * MIB

    def _memory_v1(self, st: SimNodeState, key: tuple[Any, ...], p: Any) -> int:
        total, reserved, used = self._memory(st, key)
        mem = _out(p)
        mem.total, mem.used, mem.free = total, used + reserved, total - used - reserved
        return codes.SUCCESS

    def _memory_v2(self, st: SimNodeState, key: tuple[Any, ...], p: Any) -> int:
        mem = _out(p)
        if mem.version != MEMORY_V2:
            return codes.ARGUMENT_VERSION_MISMATCH
        total, reserved, used = self._memory(st, key)
        mem.total, mem.reserved, mem.used, mem.free = total, reserved, used, total - used - reserved
        return codes.SUCCESS

    def _cc(self, st: SimNodeState, key: tuple[Any, ...], major: Any, minor: Any) -> int:
        cc = st.product(key[1]).cc
        _out(major).value, _out(minor).value = cc
        return codes.SUCCESS

    def _attributes(self, st: SimNodeState, key: tuple[Any, ...], p: Any) -> int:
        a = _out(p)
        product = st.product(key[1])
        if key[0] == MIGDEV:
            found = self._mig_lookup(st, key)
            assert found is not None
            gi, ci = found
            spec = product.gi_profile(gi.profile)
            assert spec is not None
            a.multiprocessorCount = spec.sm_count * ci.size // spec.compute_slices
            a.sharedCopyEngineCount = spec.copy_engines
            a.sharedDecoderCount = spec.decoders
            a.sharedEncoderCount = spec.encoders
            a.sharedJpegCount = spec.jpeg
            a.sharedOfaCount = spec.ofa
            a.gpuInstanceSliceCount = spec.compute_slices
            a.computeInstanceSliceCount = ci.size
            a.memorySizeMB = spec.memory_mib
            return codes.SUCCESS
        a.multiprocessorCount = product.sm_count
        a.sharedCopyEngineCount = 0
        a.sharedDecoderCount = product.decoders
        a.sharedEncoderCount = product.encoders
        a.sharedJpegCount = 0
        a.sharedOfaCount = 0
        a.gpuInstanceSliceCount = 0
        a.computeInstanceSliceCount = 0
        a.memorySizeMB = product.memory_mib
        return codes.SUCCESS

    # -- topology --------------------------------------------------------------------------------------
    def _pair(self, st: SimNodeState, h1: Any, h2: Any) -> tuple[int, int] | int:
        k1, k2 = self._key(h1), self._key(h2)
        if k1 is None or k2 is None or k1[0] != DEV or k2[0] != DEV:
            return codes.INVALID_ARGUMENT
        if st.gpus[k1[1]].lost or st.gpus[k2[1]].lost:
            return codes.GPU_IS_LOST
        return k1[1], k2[1]

    def _common_ancestor(self, st: SimNodeState, h1: Any, h2: Any, p: Any) -> int:
        pair = self._pair(st, h1, h2)
        if isinstance(pair, int):
            return pair
        a, b = (st.spec.gpus[i] for i in pair)
        if pair[0] == pair[1]:
            level = TOPO_INTERNAL
        elif a.pcie_switch == b.pcie_switch:
            level = TOPO_MULTIPLE
        elif a.socket == b.socket:  # other root ports of the same CPU
            level = TOPO_NODE
        else:
            level = TOPO_SYSTEM
        return self._set(p, level)

    def _nvlink_count(self, st: SimNodeState, a: int, b: int) -> int:
        spec = st.spec
        if a == b:
            return 0
        if spec.nvswitches:
            return sum(links_to_switches(spec))
        return sum(n for x, y, n in spec.direct if {x, y} == {a, b})

    def _p2p_status(self, st: SimNodeState, h1: Any, h2: Any, index: Any, p: Any) -> int:
        pair = self._pair(st, h1, h2)
        if isinstance(pair, int):
            return pair
        idx = _val(index)
        if idx == 2:  # NVLINK
            ok = self._nvlink_count(st, *pair) > 0
        else:
            ok = st.spec.gpus[pair[0]].socket == st.spec.gpus[pair[1]].socket
        return self._set(p, 0 if ok else 5)  # OK / NOT_SUPPORTED

    def _links(self, st: SimNodeState, gpu: int) -> list[tuple[str, int]]:
        """Per link: ("switch", bus) or ("gpu", peer index)."""
        spec = st.spec
        links: list[tuple[str, int]] = []
        if spec.nvswitches:
            for sw, n in zip(spec.nvswitches, links_to_switches(spec), strict=True):
                links += [("switch", sw.bus)] * n
        for x, y, n in spec.direct:
            if gpu in (x, y):
                links += [("gpu", y if gpu == x else x)] * n
        return links

    def _link(self, st: SimNodeState, key: tuple[Any, ...], link: Any) -> tuple[str, int] | int:
        links = self._links(st, key[1])
        i = _val(link)
        if not links:
            return codes.NOT_SUPPORTED
        if not 0 <= i < 36:
            return codes.INVALID_ARGUMENT
        if i >= len(links):
            return codes.NOT_SUPPORTED
        return links[i]

    def _nvlink_state(self, st: SimNodeState, key: tuple[Any, ...], link: Any, p: Any) -> int:
        got = self._link(st, key, link)
        return got if isinstance(got, int) else self._set(p, 1)

    def _nvlink_version(self, st: SimNodeState, key: tuple[Any, ...], link: Any, p: Any) -> int:
        got = self._link(st, key, link)
        return got if isinstance(got, int) else self._set(p, st.product(key[1]).nvlink_version)

    def _nvlink_remote_pci(self, st: SimNodeState, key: tuple[Any, ...], link: Any, p: Any) -> int:
        got = self._link(st, key, link)
        if isinstance(got, int):
            return got
        kind, target = got
        info = _out(p)
        bus = target if kind == "switch" else st.spec.gpus[target].bus
        domain = 0 if kind == "switch" else st.spec.gpus[target].domain
        info.busIdLegacy = f"{domain:04X}:{bus:02X}:00.0".encode()
        info.busId = f"{domain:08X}:{bus:02X}:00.0".encode()
        info.domain, info.bus, info.device = domain, bus, 0
        info.pciDeviceId = 0x1AF110DE if kind == "switch" else st.product(target).pci_device_id
        info.pciSubSystemId = 0
        return codes.SUCCESS

    def _nvlink_remote_type(self, st: SimNodeState, key: tuple[Any, ...], link: Any, p: Any) -> int:
        got = self._link(st, key, link)
        if isinstance(got, int):
            return got
        return self._set(p, NVLINK_DEVICE_SWITCH if got[0] == "switch" else NVLINK_DEVICE_GPU)

    # -- MIG -------------------------------------------------------------------------------------------
    def _get_mig_mode(self, st: SimNodeState, key: tuple[Any, ...], cur: Any, pend: Any) -> int:
        if not st.product(key[1]).mig_capable:
            return codes.NOT_SUPPORTED
        g = st.gpus[key[1]]
        _out(cur).value, _out(pend).value = g.mig_current, g.mig_pending
        return codes.SUCCESS

    def _set_mig_mode(self, st: SimNodeState, key: tuple[Any, ...], mode: Any, activation: Any) -> int:
        ret, status = st.set_mig_mode(key[1], _val(mode))
        _out(activation).value = status
        if ret == codes.SUCCESS:
            return ret
        raise _Abort(ret)

    def _set_compute_mode(self, st: SimNodeState, key: tuple[Any, ...], mode: Any) -> int:
        return st.set_compute_mode(key[1], _val(mode))

    def _fill_gi_profile(self, st: SimNodeState, gpu: int, enum: int, info: Any, versioned: bool) -> int:
        ret = st.check_gi_profile(gpu, enum)
        if ret != codes.SUCCESS:
            return ret
        product = st.product(gpu)
        spec = product.gi_profile(enum)
        assert spec is not None
        if versioned and info.version == GI_PROFILE_INFO_V3:
            # v3 drops isP2pSupported and adds a capabilities word at the end; same size, other layout.
            info = _GiProfileInfoV3.from_address(ctypes.addressof(info))
            info.capabilities = 0
        else:
            info.isP2pSupported = 0
        info.id = spec.profile_id
        info.sliceCount = spec.compute_slices
        info.instanceCount = spec.max_count
        info.multiprocessorCount = spec.sm_count
        info.copyEngineCount = spec.copy_engines
        info.decoderCount = spec.decoders
        info.encoderCount = spec.encoders
        info.jpegCount = spec.jpeg
        info.ofaCount = spec.ofa
        info.memorySizeMB = spec.memory_mib
        if versioned:
            name = mig.gi_profile_name(enum, product.memory_mib * MIB, spec.memory_mib)
            info.name = f"MIG {name}".encode()
        return codes.SUCCESS

    def _gi_profile_info_v1(self, st: SimNodeState, key: tuple[Any, ...], profile: Any, p: Any) -> int:
        return self._fill_gi_profile(st, key[1], _val(profile), _out(p), versioned=False)

    def _gi_profile_info_v(self, st: SimNodeState, key: tuple[Any, ...], profile: Any, p: Any) -> int:
        info = _out(p)
        if info.version not in (GI_PROFILE_INFO_V2, GI_PROFILE_INFO_V3):
            return codes.ARGUMENT_VERSION_MISMATCH
        return self._fill_gi_profile(st, key[1], _val(profile), info, versioned=True)

    def _gi_profile_info_by_id(self, st: SimNodeState, key: tuple[Any, ...], profile_id: Any, p: Any) -> int:
        info = _out(p)
        if info.version not in (GI_PROFILE_INFO_V2, GI_PROFILE_INFO_V3):
            return codes.ARGUMENT_VERSION_MISMATCH
        product = st.product(key[1])
        if not product.mig_capable:
            return codes.NOT_SUPPORTED
        for spec in product.gi_profiles:
            if spec.profile_id == _val(profile_id):
                return self._fill_gi_profile(st, key[1], spec.enum, info, versioned=True)
        return codes.INVALID_ARGUMENT

    # Count arguments, as nvml.h documents them (tests/unit/sim/test_count_semantics.py, a table per call):
    # * output only (placements, GPU and compute instances): NVML writes every item and the count,
    #   whatever *count held; the array "must be large enough". NULL asks for the count where the
    #   header allows it (placements), and is INVALID_ARGUMENT where it does not (instances).
    # * in/out (processes, retired pages, supported clocks): *count gives the array size; too small:
    #   INSUFFICIENT_SIZE with the count needed, nothing written; none to return: SUCCESS, count 0;
    #   a NULL array only with *count = 0 (asking for the size), INVALID_ARGUMENT otherwise.
    # * input only (field values): *count entries are read and written.
    # An array shorter than what NVML writes would overflow in the real library: strict mode raises
    # StrictModeViolation; lenient mode answers INSUFFICIENT_SIZE and never writes past the array.
    def _fill_output(
        self,
        name: str,
        arr: Any,
        count_p: Any,
        items: list[Any],
        write: Callable[[Any, Any], None],
        *,
        null_counts: bool,
    ) -> int:
        """Count output only: every item written into the caller's array, then the count."""
        count = _out(count_p)
        if arr is None:
            if not null_counts:
                return codes.INVALID_ARGUMENT
            count.value = len(items)
            return codes.SUCCESS
        if not self._fits(name, arr, len(items)):
            count.value = len(items)
            return codes.INSUFFICIENT_SIZE
        _write_items(arr, items, write)
        count.value = len(items)
        return codes.SUCCESS

    def _fill_in_out(
        self, name: str, arr: Any, count_p: Any, items: list[Any], write: Callable[[Any, Any], None]
    ) -> int:
        """Count in/out: *count is the array size on input, the number of items on output."""
        count = _out(count_p)
        if count.value < len(items):
            count.value = len(items)
            return codes.INSUFFICIENT_SIZE
        if arr is None and count.value > 0:
            return codes.INVALID_ARGUMENT  # NULL is allowed only to ask for the size (*count = 0)
        count.value = len(items)
        if not items:
            return codes.SUCCESS
        if not self._fits(name, arr, len(items)):
            return codes.INSUFFICIENT_SIZE
        _write_items(arr, items, write)
        return codes.SUCCESS

    def _fits(self, name: str, arr: Any, needed: int) -> bool:
        """Whether the caller's array holds ``needed`` entries (unknown for a bare pointer: trusted)."""
        size = _capacity(arr)
        if size is None or size >= needed:
            return True
        if self.strict:
            raise StrictModeViolation(
                f"{name}: the array holds {size} entries but NVML writes {needed}"
                " (the real library would write past its end)"
            )
        return False

    def _gi_possible_placements(
        self, st: SimNodeState, key: tuple[Any, ...], profile_id: Any, arr: Any, cnt: Any
    ) -> int:
        product = st.product(key[1])
        if not product.mig_capable:
            return codes.NOT_SUPPORTED
        spec = next((s for s in product.gi_profiles if s.profile_id == _val(profile_id)), None)
        if spec is None:
            return codes.INVALID_ARGUMENT
        if st.gpus[key[1]].mig_current != 1:
            return codes.NOT_SUPPORTED

        def write(slot: Any, start: int) -> None:
            slot.start, slot.size = start, spec.memory_slices

        return self._fill_output(
            "nvmlDeviceGetGpuInstancePossiblePlacements_v2",
            arr,
            cnt,
            list(spec.starts),
            write,
            null_counts=True,
        )

    def _profile_by_id(self, st: SimNodeState, gpu: int, profile_id: int) -> int | None:
        for spec in st.product(gpu).gi_profiles:
            if spec.profile_id == profile_id:
                return spec.enum
        return None

    def _gi_remaining(self, st: SimNodeState, key: tuple[Any, ...], profile_id: Any, p: Any) -> int:
        enum = self._profile_by_id(st, key[1], _val(profile_id))
        if enum is None:
            return codes.INVALID_ARGUMENT if st.product(key[1]).mig_capable else codes.NOT_SUPPORTED
        if st.gpus[key[1]].mig_current != 1:
            return codes.NOT_SUPPORTED
        return self._set(p, st.remaining_gi_capacity(key[1], enum))

    def _create_gi(self, st: SimNodeState, key: tuple[Any, ...], profile_id: Any, out: Any) -> int:
        enum = self._profile_by_id(st, key[1], _val(profile_id))
        if enum is None:
            return codes.INVALID_ARGUMENT if st.product(key[1]).mig_capable else codes.NOT_SUPPORTED
        ret, gi_id = st.create_gi(key[1], enum, None, now=self.node.clock())
        if ret == codes.SUCCESS:
            self._write_handle(out, (GI, key[1], gi_id))
        return ret

    def _create_gi_placed(
        self, st: SimNodeState, key: tuple[Any, ...], profile_id: Any, placement: Any, out: Any
    ) -> int:
        enum = self._profile_by_id(st, key[1], _val(profile_id))
        if enum is None:
            return codes.INVALID_ARGUMENT if st.product(key[1]).mig_capable else codes.NOT_SUPPORTED
        pl = _out(placement)
        ret, gi_id = st.create_gi(key[1], enum, int(pl.start), size=int(pl.size), now=self.node.clock())
        if ret == codes.SUCCESS:
            self._write_handle(out, (GI, key[1], gi_id))
        return ret

    def _get_gis(self, st: SimNodeState, key: tuple[Any, ...], profile_id: Any, arr: Any, cnt: Any) -> int:
        enum = self._profile_by_id(st, key[1], _val(profile_id))
        if enum is None:
            return codes.INVALID_ARGUMENT if st.product(key[1]).mig_capable else codes.NOT_SUPPORTED
        if st.gpus[key[1]].mig_current != 1:
            return codes.NOT_SUPPORTED
        gis = [gi for gi in st.gpus[key[1]].gis if gi.profile == enum]

        def write(slot: Any, gi: SimGiState) -> None:
            ctypes.c_void_p.from_address(ctypes.addressof(slot)).value = self._handle_addr(
                (GI, key[1], gi.id)
            )

        return self._fill_output("nvmlDeviceGetGpuInstances", arr, cnt, gis, write, null_counts=False)

    def _gi_by_id(self, st: SimNodeState, key: tuple[Any, ...], gi_id: Any, out: Any) -> int:
        if not st.product(key[1]).mig_capable:
            return codes.NOT_SUPPORTED
        gi = st.find_gi(key[1], _val(gi_id))
        if gi is None:
            return codes.NOT_FOUND
        self._write_handle(out, (GI, key[1], gi.id))
        return codes.SUCCESS

    def _destroy_gi(self, st: SimNodeState, key: tuple[Any, ...], gi: SimGiState) -> int:
        return st.destroy_gi(key[1], gi.id, now=self.node.clock())

    def _gi_info(self, st: SimNodeState, key: tuple[Any, ...], gi: SimGiState, p: Any) -> int:
        info = _out(p)
        ctypes.c_void_p.from_buffer(info, 0).value = self._handle_addr((DEV, key[1]))
        info.id = gi.id
        spec = st.product(key[1]).gi_profile(gi.profile)
        assert spec is not None
        info.profileId = spec.profile_id
        info.placement.start, info.placement.size = gi.start, gi.size
        return codes.SUCCESS

    def _fill_ci_profile(
        self,
        st: SimNodeState,
        key: tuple[Any, ...],
        gi: SimGiState,
        ci_enum: int,
        eng: int,
        info: Any,
        versioned: bool,
    ) -> int:
        if eng != mig.CI_ENGINE_PROFILE_SHARED:
            return codes.NOT_SUPPORTED if eng < 1 else codes.INVALID_ARGUMENT
        ret = st.ci_profile_ok(key[1], gi, ci_enum)
        if ret != codes.SUCCESS:
            return ret
        spec = st.product(key[1]).gi_profile(gi.profile)
        assert spec is not None
        c = mig.CI_ENUMS[ci_enum]
        info.id = ci_enum
        info.sliceCount = c
        info.instanceCount = spec.compute_slices // c
        info.multiprocessorCount = spec.sm_count * c // spec.compute_slices
        info.sharedCopyEngineCount = spec.copy_engines
        info.sharedDecoderCount = spec.decoders
        info.sharedEncoderCount = spec.encoders
        info.sharedJpegCount = spec.jpeg
        info.sharedOfaCount = spec.ofa
        if versioned:
            product = st.product(key[1])
            gi_name = mig.gi_profile_name(gi.profile, product.memory_mib * MIB, spec.memory_mib)
            info.name = f"MIG {mig.ci_profile_name(gi_name, c)}".encode()
        return codes.SUCCESS

    def _ci_profile_info_v1(
        self, st: SimNodeState, key: tuple[Any, ...], gi: SimGiState, prof: Any, eng: Any, p: Any
    ) -> int:
        return self._fill_ci_profile(st, key, gi, _val(prof), _val(eng), _out(p), versioned=False)

    def _ci_profile_info_v(
        self, st: SimNodeState, key: tuple[Any, ...], gi: SimGiState, prof: Any, eng: Any, p: Any
    ) -> int:
        info = _out(p)
        if info.version not in (CI_PROFILE_INFO_V2, CI_PROFILE_INFO_V3):
            return codes.ARGUMENT_VERSION_MISMATCH
        return self._fill_ci_profile(st, key, gi, _val(prof), _val(eng), info, versioned=True)

    def _ci_enum(self, st: SimNodeState, key: tuple[Any, ...], gi: SimGiState, profile_id: int) -> int | None:
        ret = st.ci_profile_ok(key[1], gi, profile_id)
        return profile_id if ret == codes.SUCCESS else None

    def _ci_remaining(self, st: SimNodeState, key: tuple[Any, ...], gi: SimGiState, prof: Any, p: Any) -> int:
        enum = self._ci_enum(st, key, gi, _val(prof))
        if enum is None:
            return codes.INVALID_ARGUMENT
        trial = SimNodeState.from_json(st.to_json(), "<copy>")
        n = 0
        while trial.create_ci(key[1], gi.id, enum, None)[0] == codes.SUCCESS:
            n += 1
        return self._set(p, n)

    def _ci_placements(
        self, st: SimNodeState, key: tuple[Any, ...], gi: SimGiState, prof: Any, arr: Any, cnt: Any
    ) -> int:
        enum = self._ci_enum(st, key, gi, _val(prof))
        if enum is None:
            return codes.INVALID_ARGUMENT
        g, c = mig.GI_ENUMS[gi.profile][0], mig.CI_ENUMS[enum]

        def write(slot: Any, start: int) -> None:
            slot.start, slot.size = start, c

        starts = mig.ci_placement_starts(g, c)
        name = "nvmlGpuInstanceGetComputeInstancePossiblePlacements"
        return self._fill_output(name, arr, cnt, starts, write, null_counts=True)

    def _create_ci(self, st: SimNodeState, key: tuple[Any, ...], gi: SimGiState, prof: Any, out: Any) -> int:
        ret, ci_id = st.create_ci(key[1], gi.id, _val(prof), None, now=self.node.clock())
        if ret == codes.SUCCESS:
            self._write_handle(out, (CI, key[1], gi.id, ci_id))
        return ret

    def _create_ci_placed(
        self, st: SimNodeState, key: tuple[Any, ...], gi: SimGiState, prof: Any, placement: Any, out: Any
    ) -> int:
        pl = _out(placement)
        if int(pl.size) != mig.CI_ENUMS.get(_val(prof), -1):
            return codes.INVALID_ARGUMENT
        ret, ci_id = st.create_ci(key[1], gi.id, _val(prof), int(pl.start), now=self.node.clock())
        if ret == codes.SUCCESS:
            self._write_handle(out, (CI, key[1], gi.id, ci_id))
        return ret

    def _get_cis(
        self, st: SimNodeState, key: tuple[Any, ...], gi: SimGiState, prof: Any, arr: Any, cnt: Any
    ) -> int:
        enum = _val(prof)
        if not 0 <= enum < mig.CI_PROFILE_COUNT:
            return codes.INVALID_ARGUMENT
        cis = [ci for ci in gi.cis if ci.profile == enum]

        def write(slot: Any, ci: SimCiState) -> None:
            ctypes.c_void_p.from_address(ctypes.addressof(slot)).value = self._handle_addr(
                (CI, key[1], gi.id, ci.id)
            )

        return self._fill_output(
            "nvmlGpuInstanceGetComputeInstances", arr, cnt, cis, write, null_counts=False
        )

    def _ci_by_id(self, st: SimNodeState, key: tuple[Any, ...], gi: SimGiState, ci_id: Any, out: Any) -> int:
        ci = next((c for c in gi.cis if c.id == _val(ci_id)), None)
        if ci is None:
            return codes.NOT_FOUND
        self._write_handle(out, (CI, key[1], gi.id, ci.id))
        return codes.SUCCESS

    def _destroy_ci(self, st: SimNodeState, key: tuple[Any, ...], gi: SimGiState, ci: SimCiState) -> int:
        return st.destroy_ci(key[1], gi.id, ci.id, now=self.node.clock())

    def _ci_info(self, st: SimNodeState, key: tuple[Any, ...], gi: SimGiState, ci: SimCiState, p: Any) -> int:
        info = _out(p)
        ctypes.c_void_p.from_buffer(info, 0).value = self._handle_addr((DEV, key[1]))
        ctypes.c_void_p.from_buffer(info, ctypes.sizeof(ctypes.c_void_p)).value = self._handle_addr(
            (GI, key[1], gi.id)
        )
        info.id = ci.id
        info.profileId = ci.profile
        info.placement.start, info.placement.size = ci.start, ci.size
        return codes.SUCCESS

    def _mig_gi_id(self, st: SimNodeState, key: tuple[Any, ...], p: Any) -> int:
        return self._set(p, key[2]) if key[0] == MIGDEV else codes.INVALID_ARGUMENT

    def _mig_ci_id(self, st: SimNodeState, key: tuple[Any, ...], p: Any) -> int:
        return self._set(p, key[3]) if key[0] == MIGDEV else codes.INVALID_ARGUMENT

    def _max_mig_count(self, st: SimNodeState, key: tuple[Any, ...], p: Any) -> int:
        product = st.product(key[1])
        return self._set(p, product.max_mig_devices if st.gpus[key[1]].mig_current == 1 else 0)

    def _mig_handle_by_index(self, st: SimNodeState, key: tuple[Any, ...], index: Any, out: Any) -> int:
        if not st.product(key[1]).mig_capable:
            return codes.NOT_SUPPORTED
        devices = st.mig_devices(key[1])
        i = _val(index)
        if i >= st.product(key[1]).max_mig_devices:
            return codes.INVALID_ARGUMENT
        if i >= len(devices):
            return codes.NOT_FOUND
        gi, ci = devices[i]
        self._write_handle(out, (MIGDEV, key[1], gi.id, ci.id))
        return codes.SUCCESS

    def _parent_handle(self, st: SimNodeState, key: tuple[Any, ...], out: Any) -> int:
        if key[0] != MIGDEV:
            return codes.INVALID_ARGUMENT
        self._write_handle(out, (DEV, key[1]))
        return codes.SUCCESS

    # -- events ----------------------------------------------------------------------------------------
    @staticmethod
    def _supported(st: SimNodeState, gpu: int) -> int:
        mask = EVENT_SBE | EVENT_DBE | EVENT_PSTATE | EVENT_XID | EVENT_CLOCK
        return mask | (EVENT_MIG_CONFIG if st.product(gpu).mig_capable else 0)

    def _event_set_create(self, st: SimNodeState, out: Any) -> int:
        n = self._next_evset
        self._next_evset += 1
        es = _EventSet(st.next_seq - 1)
        if self.node.path is not None:
            es.watcher = _FileWatcher(self.node.path)  # watch from creation so no change is missed
        self._event_sets[n] = es
        self._write_handle(out, (EVSET, n))
        return codes.SUCCESS

    def _evset(self, handle: Any) -> _EventSet | None:
        key = self._key(handle)
        if key is None or key[0] != EVSET:
            return None
        return self._event_sets.get(key[1])

    def _register_events(self, st: SimNodeState, key: tuple[Any, ...], mask: Any, evset: Any) -> int:
        es = self._evset(evset)
        if es is None:
            return codes.INVALID_ARGUMENT
        m = _val(mask)
        if m & ~self._supported(st, key[1]):
            return codes.NOT_SUPPORTED
        es.registrations[key[1]] = es.registrations.get(key[1], 0) | m
        return codes.SUCCESS

    def _next_event(self, st: SimNodeState, es: _EventSet) -> Event | None:
        for ev in st.events:
            if ev.seq <= es.cursor:
                continue
            es.cursor = ev.seq
            if es.registrations.get(ev.gpu, 0) & ev.type:
                return ev
        return None

    def _event_wait(self, evset: Any, data_p: Any, timeout_ms: Any) -> int:
        deadline = time.monotonic() + _val(timeout_ms) / 1000
        while True:
            with self.node.lock:
                st = self._state()
                if isinstance(st, int):
                    return st
                es = self._evset(evset)
                if es is None:
                    return codes.INVALID_ARGUMENT
                ev = self._next_event(st, es)
                if ev is not None:
                    data = _out(data_p)
                    ctypes.c_void_p.from_buffer(data, 0).value = self._handle_addr((DEV, ev.gpu))
                    data.eventType, data.eventData = ev.type, ev.data
                    data.gpuInstanceId, data.computeInstanceId = ev.gi, ev.ci
                    return codes.SUCCESS
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return codes.TIMEOUT
                if self.node.path is None:
                    # in-process only: sleep until a change is notified or the timeout passes
                    self.node.changed.wait(remaining)
                    continue
                watcher = es.watcher
            # another process writes the file: block on inotify, never spin
            watcher.wait(remaining)

    def _event_set_free(self, evset: Any) -> int:
        with self.node.lock:
            key = self._key(evset)
            if key is None or key[0] != EVSET or key[1] not in self._event_sets:
                return codes.INVALID_ARGUMENT
            self._event_sets.pop(key[1]).close()
            return codes.SUCCESS

    # -- telemetry -------------------------------------------------------------------------------------
    def _tm(self, st: SimNodeState, key: tuple[Any, ...]) -> Any:
        return telemetry(st, key[1], self.node.clock())

    def _utilization(self, st: SimNodeState, key: tuple[Any, ...], p: Any) -> int:
        if st.gpus[key[1]].mig_current == 1:
            return codes.NOT_SUPPORTED  # NVML has no whole-GPU utilisation in MIG mode
        tm = self._tm(st, key)
        u = _out(p)
        u.gpu, u.memory = tm.gpu_util, tm.mem_util
        return codes.SUCCESS

    def _clock(self, st: SimNodeState, key: tuple[Any, ...], ctype: Any, p: Any) -> int:
        tm = self._tm(st, key)
        t = _val(ctype)
        values = {0: tm.sm_clock, 1: tm.sm_clock, 2: tm.mem_clock, 3: int(tm.sm_clock * 0.9)}
        return self._set(p, values[t]) if t in values else codes.INVALID_ARGUMENT

    def _max_clock(self, st: SimNodeState, key: tuple[Any, ...], ctype: Any, p: Any) -> int:
        product: Product = st.product(key[1])
        t = _val(ctype)
        values = {
            0: product.max_sm_clock,
            1: product.max_sm_clock,
            2: product.max_mem_clock,
            3: int(product.max_sm_clock * 0.9),
        }
        return self._set(p, values[t]) if t in values else codes.INVALID_ARGUMENT

    def _supported_memory_clocks(self, st: SimNodeState, key: tuple[Any, ...], cnt: Any, arr: Any) -> int:
        clocks = [st.product(key[1]).max_mem_clock]  # one memory clock, its maximum, as HBM GPUs report
        return self._fill_in_out("nvmlDeviceGetSupportedMemoryClocks", arr, cnt, clocks, _write_u32)

    def _supported_graphics_clocks(
        self, st: SimNodeState, key: tuple[Any, ...], mem_clock: Any, cnt: Any, arr: Any
    ) -> int:
        product = st.product(key[1])
        if _val(mem_clock) != product.max_mem_clock:
            return codes.NOT_FOUND  # not a supported memory clock
        clocks = list(range(product.max_sm_clock, MIN_GRAPHICS_CLOCK - 1, -GRAPHICS_CLOCK_STEP))
        return self._fill_in_out("nvmlDeviceGetSupportedGraphicsClocks", arr, cnt, clocks, _write_u32)

    def _pcie_throughput(self, st: SimNodeState, key: tuple[Any, ...], counter: Any, p: Any) -> int:
        tm = self._tm(st, key)
        c = _val(counter)
        if c not in (0, 1):
            return codes.INVALID_ARGUMENT
        return self._set(p, tm.pcie_tx_kbs if c == 0 else tm.pcie_rx_kbs)

    def _enc_util(self, st: SimNodeState, key: tuple[Any, ...], util: Any, period: Any) -> int:
        _out(util).value, _out(period).value = self._tm(st, key).enc_util, 167000
        return codes.SUCCESS

    def _dec_util(self, st: SimNodeState, key: tuple[Any, ...], util: Any, period: Any) -> int:
        _out(util).value, _out(period).value = self._tm(st, key).dec_util, 167000
        return codes.SUCCESS

    def _power_constraints(self, st: SimNodeState, key: tuple[Any, ...], lo: Any, hi: Any) -> int:
        product = st.product(key[1])
        _out(lo).value = (product.min_power_w or product.tdp_w) * 1000
        _out(hi).value = product.tdp_w * 1000
        return codes.SUCCESS

    def _fabric(self, st: SimNodeState, key: tuple[Any, ...], info: Any) -> int:
        fabric = st.fabric_info(key[1])
        if fabric is None:
            return codes.NOT_SUPPORTED
        ctypes.memmove(info.clusterUuid, fabric.cluster_uuid, 16)
        info.status = fabric.status
        info.cliqueId = fabric.clique_id
        info.state = fabric.state
        return codes.SUCCESS

    def _fabric_info_v1(self, st: SimNodeState, key: tuple[Any, ...], p: Any) -> int:
        return self._fabric(st, key, _out(p))

    def _fabric_info_v(self, st: SimNodeState, key: tuple[Any, ...], p: Any) -> int:
        info = _out(p)
        if info.version not in (FABRIC_INFO_V2, FABRIC_INFO_V3):
            return codes.ARGUMENT_VERSION_MISMATCH
        if info.version == FABRIC_INFO_V3:
            info = _FabricInfoV3.from_address(ctypes.addressof(info))
        ret = self._fabric(st, key, info)
        if ret == codes.SUCCESS:
            fabric = st.fabric_info(key[1])
            assert fabric is not None
            info.healthMask = fabric.health_mask
            if isinstance(info, _FabricInfoV3):
                info.healthSummary = fabric.health_summary
        return ret

    def _ecc_mode(self, st: SimNodeState, key: tuple[Any, ...], cur: Any, pend: Any) -> int:
        _out(cur).value, _out(pend).value = 1, 1
        return codes.SUCCESS

    def _total_ecc(self, st: SimNodeState, key: tuple[Any, ...], etype: Any, counter: Any, p: Any) -> int:
        g = st.gpus[key[1]]
        e, c = _val(etype), _val(counter)
        table = {
            (0, 0): g.sbe_volatile,
            (1, 0): g.dbe_volatile,
            (0, 1): g.sbe_aggregate,
            (1, 1): g.dbe_aggregate,
        }
        if (e, c) not in table:
            return codes.INVALID_ARGUMENT
        return self._set(p, table[(e, c)])

    def _retired_pages(self, st: SimNodeState, key: tuple[Any, ...], cause: Any, cnt: Any, arr: Any) -> int:
        if st.product(key[1]).architecture >= 7:
            return codes.NOT_SUPPORTED  # Ampere and later remap rows instead
        g = st.gpus[key[1]]
        n = g.retired_sbe if _val(cause) == 0 else g.retired_dbe
        base = 0x1000 if _val(cause) == 0 else 0x8000
        pages = [base + i for i in range(n)]
        return self._fill_in_out("nvmlDeviceGetRetiredPages", arr, cnt, pages, _write_u64)

    def _retired_pending(self, st: SimNodeState, key: tuple[Any, ...], p: Any) -> int:
        if st.product(key[1]).architecture >= 7:
            return codes.NOT_SUPPORTED
        return self._set(p, int(st.gpus[key[1]].retired_pending))

    def _remapped_rows(
        self, st: SimNodeState, key: tuple[Any, ...], corr: Any, unc: Any, pend: Any, fail: Any
    ) -> int:
        if st.product(key[1]).architecture < 7:
            return codes.NOT_SUPPORTED
        g = st.gpus[key[1]]
        _out(corr).value, _out(unc).value = g.remapped_correctable, g.remapped_uncorrectable
        _out(pend).value, _out(fail).value = int(g.remap_pending), int(g.remap_failure)
        return codes.SUCCESS

    def _clock_reasons(self, st: SimNodeState, key: tuple[Any, ...], p: Any) -> int:
        tm = self._tm(st, key)
        reasons = 0x1 if tm.gpu_util < 2 else 0
        if tm.power_mw > st.product(key[1]).tdp_w * 1000 * 0.95:
            reasons |= 0x4  # software power cap
        return self._set(p, reasons)

    def _processes(self, st: SimNodeState, key: tuple[Any, ...], cnt: Any, arr: Any) -> int:
        procs = st.gpus[key[1]].processes
        if key[0] == MIGDEV:
            procs = [p for p in procs if p.gi == key[2] and p.ci == key[3]]

        def write(slot: Any, proc: Any) -> None:
            slot.pid, slot.usedGpuMemory = proc.pid, proc.used_mib * MIB
            slot.gpuInstanceId, slot.computeInstanceId = proc.gi, proc.ci

        return self._fill_in_out("nvmlDeviceGetComputeRunningProcesses_v3", arr, cnt, procs, write)

    def _no_processes(self, kind: str) -> Callable[..., int]:
        name = f"nvmlDeviceGet{kind}RunningProcesses_v3"

        def call(st: SimNodeState, key: tuple[Any, ...], cnt: Any, arr: Any) -> int:
            return self._fill_in_out(name, arr, cnt, [], _write_u64)

        return call

    def _field_values(self, st: SimNodeState, key: tuple[Any, ...], count: Any, arr: Any) -> int:
        n = _val(count)
        values = _out(arr)
        if not self._fits("nvmlDeviceGetFieldValues", arr, n):  # NVML reads and writes valuesCount entries
            n = _capacity(arr) or 0
        tm = self._tm(st, key)
        stamp = int(self.node.clock() * 1e6)
        for i in range(n):
            fv = values[i]
            fv.timestamp, fv.latencyUsec = stamp, 0
            if fv.fieldId == FIELD_TOTAL_ENERGY:
                fv.valueType, fv.nvmlReturn = 4, codes.SUCCESS  # unsigned long long
                fv.value.ullVal = tm.energy_mj
            elif fv.fieldId == FIELD_POWER_INSTANT:
                fv.valueType, fv.nvmlReturn = 1, codes.SUCCESS  # unsigned int
                fv.value.uiVal = tm.power_mw
            else:
                self._more_field_values(st, key, tm, fv)
        return codes.SUCCESS

    def _more_field_values(self, st: SimNodeState, key: tuple[Any, ...], tm: Any, fv: Any) -> None:
        """Memory temperature (HBM parts: the MIG-capable ones), NVLink error and throughput counters
        (GPUs with NVLink) and clock-event violation times; anything else is NOT_SUPPORTED."""
        field, gpu = int(fv.fieldId), key[1]
        elapsed = max(0.0, self.node.clock() - st.created)
        value: int | None = None
        if field == FIELD_MEMORY_TEMP and st.product(gpu).mig_capable:
            value = tm.temperature_c + 4
        elif field in FIELD_NVLINK_ERROR_TOTALS and self._links(st, gpu):
            value = 0
        elif field in NVLINK_RAW_KIB_PER_S and self._links(st, gpu):
            value = int(elapsed * NVLINK_RAW_KIB_PER_S[field])
        elif field in FIELD_VIOLATION_SHARES:
            value = int(elapsed * 1e9 * FIELD_VIOLATION_SHARES[field])
        if value is None:
            fv.nvmlReturn = codes.NOT_SUPPORTED
        else:
            fv.valueType, fv.nvmlReturn = 3, codes.SUCCESS  # unsigned long long
            fv.value.ullVal = value

    def _inforom_version(self, st: SimNodeState, key: tuple[Any, ...], obj: Any, buf: Any, n: Any) -> int:
        if _val(obj) not in INFOROM_OBJECTS:
            return codes.INVALID_ARGUMENT
        version = INFOROM_OBJECTS[_val(obj)]
        return codes.NOT_SUPPORTED if version is None else _put_str(buf, n, version)

    # -- GPM -------------------------------------------------------------------------------------------
    def _gpm_support(self, st: SimNodeState, key: tuple[Any, ...], p: Any) -> int:
        info = _out(p)
        if info.version != GPM_SUPPORT_VERSION:
            return codes.ARGUMENT_VERSION_MISMATCH
        info.isSupportedDevice = int(st.product(key[1]).architecture >= ARCH_HOPPER)
        return codes.SUCCESS

    def _gpm_alloc(self, st: SimNodeState, out: Any) -> int:
        n = self._next_gpm
        self._next_gpm += 1
        self._gpm_samples[n] = _GpmSample()
        self._write_handle(out, (GPM, n))  # a fresh address per sample, never reused
        return codes.SUCCESS

    def _gpm_free(self, sample: Any) -> int:
        with self.node.lock:
            key = self._key(sample)
            if key is None or key[0] != GPM or key[1] not in self._gpm_samples:
                return codes.INVALID_ARGUMENT
            del self._gpm_samples[key[1]]
            self._by_addr.pop(self._by_key.pop(key))  # a freed handle is no longer a sample
            return codes.SUCCESS

    def _gpm_sample(self, handle: Any) -> _GpmSample | None:
        key = self._key(handle)
        return None if key is None or key[0] != GPM else self._gpm_samples.get(key[1])

    def _gpm_record(self, st: SimNodeState, gpu: int, gi: int | None, handle: Any) -> int:
        if st.product(gpu).architecture < ARCH_HOPPER:
            return codes.NOT_SUPPORTED
        sample = self._gpm_sample(handle)
        if sample is None:
            return codes.INVALID_ARGUMENT
        self._gpm_seq += 1
        sample.gpu, sample.gi, sample.time, sample.seq = gpu, gi, self.node.clock(), self._gpm_seq
        return codes.SUCCESS

    def _gpm_sample_get(self, st: SimNodeState, key: tuple[Any, ...], sample: Any) -> int:
        return self._gpm_record(st, key[1], None, sample)

    def _gpm_mig_sample_get(self, st: SimNodeState, key: tuple[Any, ...], gi_id: Any, sample: Any) -> int:
        if st.product(key[1]).architecture < ARCH_HOPPER:
            return codes.NOT_SUPPORTED
        gi = _val(gi_id)
        if st.gpus[key[1]].mig_current != 1 or st.find_gi(key[1], gi) is None:
            return codes.INVALID_ARGUMENT
        return self._gpm_record(st, key[1], gi, sample)

    @staticmethod
    def _gpm_average(st: SimNodeState, gpu: int, t1: float, t2: float) -> tuple[float, float]:
        """(graphics, memory) utilisation averaged over [t1, t2]: the midpoints of GPM_POINTS slices."""
        if t2 <= t1:
            points = [t2]
        else:
            step = (t2 - t1) / GPM_POINTS
            points = [t1 + (i + 0.5) * step for i in range(GPM_POINTS)]
        samples = [telemetry(st, gpu, t) for t in points]
        graphics = sum(tm.gpu_util for tm in samples) / len(samples)
        memory = sum(tm.mem_util for tm in samples) / len(samples)
        return graphics, memory

    def _gpm_metrics_get(self, st: SimNodeState, p: Any) -> int:
        mg = _out(p)
        if mg.version != GPM_METRICS_GET_VERSION:
            return codes.ARGUMENT_VERSION_MISMATCH
        s1, s2 = self._gpm_sample(mg.sample1), self._gpm_sample(mg.sample2)
        if s1 is None or s2 is None or s1.gpu is None or s2.gpu is None:
            return codes.INVALID_ARGUMENT
        if s1.gpu != s2.gpu or s1.gi != s2.gi or s1.seq >= s2.seq:
            return codes.INVALID_ARGUMENT  # two samples of one GPU (or GI), the older one first
        metrics = mg.metrics
        n = int(mg.numMetrics)
        if n > len(metrics):
            return codes.INVALID_ARGUMENT
        graphics, memory = self._gpm_average(st, s1.gpu, s1.time, s2.time)
        values = {
            GPM_GRAPHICS_UTIL: graphics,
            GPM_ANY_TENSOR_UTIL: graphics * GPM_TENSOR_SHARE,
            GPM_DRAM_BW_UTIL: memory,
            **{metric: graphics * share for metric, share in GPM_SHARES.items()},
        }
        for i in range(n):
            m = metrics[i]
            value = values.get(int(m.metricId))
            if value is None:
                m.nvmlReturn, m.value = codes.NOT_SUPPORTED, 0.0
            else:
                m.nvmlReturn, m.value = codes.SUCCESS, value
        return codes.SUCCESS


class _FabricInfoV3(ctypes.Structure):
    """nvmlGpuFabricInfo_v3_t: v2 plus the health summary byte."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("clusterUuid", ctypes.c_uint8 * 16),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint32),
        ("state", ctypes.c_uint),
        ("healthMask", ctypes.c_uint32),
        ("healthSummary", ctypes.c_uint8),
    ]


class _GiProfileInfoV3(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("id", ctypes.c_uint),
        ("sliceCount", ctypes.c_uint),
        ("instanceCount", ctypes.c_uint),
        ("multiprocessorCount", ctypes.c_uint),
        ("copyEngineCount", ctypes.c_uint),
        ("decoderCount", ctypes.c_uint),
        ("encoderCount", ctypes.c_uint),
        ("jpegCount", ctypes.c_uint),
        ("ofaCount", ctypes.c_uint),
        ("memorySizeMB", ctypes.c_ulonglong),
        ("name", ctypes.c_char * 96),
        ("capabilities", ctypes.c_uint),
    ]


class _Abort(Exception):
    """Unwinds a mutation so a failed call leaves the shared state untouched."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _elements(arr: Any) -> tuple[int, Any]:
    """Base address and element type of a caller's array, however it was passed."""
    target = _out(arr) if isinstance(arr, CArgObject) else arr
    if isinstance(target, ctypes.Array):
        return ctypes.addressof(target), target._type_
    if isinstance(target, ctypes._Pointer):
        addr = ctypes.cast(target, ctypes.c_void_p).value
        assert addr is not None
        return addr, target._type_
    return ctypes.addressof(target), type(target)


def _capacity(arr: Any) -> int | None:
    """How many entries a caller's array holds; None for a bare pointer (its size is unknown)."""
    target = _out(arr) if isinstance(arr, CArgObject) else arr
    return len(target) if isinstance(target, ctypes.Array) else None


def _write_items(arr: Any, items: list[Any], write: Callable[[Any, Any], None]) -> None:
    base, elem = _elements(arr)
    for i, item in enumerate(items):
        write(elem.from_address(base + i * ctypes.sizeof(elem)), item)


def _write_u32(slot: Any, value: int) -> None:
    slot.value = value


def _write_u64(slot: Any, value: int) -> None:
    slot.value = value


class _FileWatcher:
    """Blocks until the state file is replaced or written (inotify on its directory), or a timeout."""

    def __init__(self, path: Path) -> None:
        from asyncinotify import Inotify, Mask

        self.name = path.name
        self._ino = Inotify()
        self._ino.add_watch(path.parent, Mask.MOVED_TO | Mask.CLOSE_WRITE | Mask.CREATE)

    def wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._ino.sync_timeout = max(0.001, remaining)
            ev = self._ino.sync_get()
            if ev is None:
                return
            if ev.name is not None and ev.name.name == self.name:
                return

    def close(self) -> None:
        self._ino.close()

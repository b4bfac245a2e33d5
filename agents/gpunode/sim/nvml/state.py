"""The simulated node's mutable state, its rules, and its JSON form.

`SimNodeState` is plain data (what the shared state file holds). The functions on it apply NVML's rules and
return NVML return codes, so the C surface in `lib.py` stays a thin translation layer.
"""

from __future__ import annotations

import functools
import hashlib
import math
import time
import uuid as uuidlib
from dataclasses import asdict, dataclass, field
from typing import Any

from gpunode.nvml import mig
from gpunode.sim.nvml import codes
from gpunode.sim.nvml.presets import ARCH_HOPPER, Preset, Product, get_preset

STATE_FORMAT = "gpunode-sim/v1"
ALL = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId meaning "the whole GPU"
MAX_EVENTS = 1024

EVENT_SBE = 0x1
EVENT_DBE = 0x2
EVENT_PSTATE = 0x4
EVENT_XID = 0x8
EVENT_CLOCK = 0x10
EVENT_MIG_CONFIG = 0x100

INIT_FAULTS = {"library-not-found": codes.LIBRARY_NOT_FOUND, "driver-not-loaded": codes.DRIVER_NOT_LOADED}

# NVLink fabric (nvmlGpuFabricState_t, health mask and summary as nvml.h defines them)
FABRIC_NOT_SUPPORTED, FABRIC_NOT_STARTED, FABRIC_IN_PROGRESS, FABRIC_COMPLETED = 0, 1, 2, 3
FABRIC_HEALTH_SUMMARY = {"not-supported": 0, "healthy": 1, "unhealthy": 2, "limited-capacity": 3}
FABRIC_DEGRADED_BW_TRUE, FABRIC_DEGRADED_BW_FALSE = 1, 2  # bits 0-1 of the health mask
# Faults on a fabric-attached GPU: the fabric manager has not trained it yet, is training it, training
# failed, or it is up with less bandwidth than it should have (links down).
FABRIC_FAULTS = ("not-trained", "training", "failed", "degraded")


@dataclass(frozen=True)
class FabricInfo:
    """One GPU's nvmlGpuFabricInfo: state, status (an NVML return code), cluster UUID bytes, clique."""

    state: int
    status: int
    cluster_uuid: bytes
    clique_id: int
    health_mask: int
    health_summary: int


@functools.lru_cache(maxsize=4096)
def _derived_uuid(prefix: str, name: str) -> str:
    """Stable per node: the same node id always yields the same GPU and MIG UUIDs."""
    return prefix + str(uuidlib.uuid5(uuidlib.NAMESPACE_OID, name))


class StateError(ValueError):
    """The state file is unreadable, corrupt or not ours."""


@dataclass
class SimCiState:
    id: int
    profile: int  # CI profile enum
    start: int
    size: int


@dataclass
class SimGiState:
    id: int
    profile: int  # GI profile enum
    start: int
    size: int
    cis: list[SimCiState] = field(default_factory=list)


@dataclass
class ProcessState:
    pid: int
    used_mib: int
    gi: int = ALL
    ci: int = ALL


@dataclass
class SimGpuState:
    mig_current: int = 0
    mig_pending: int = 0
    lost: bool = False
    gis: list[SimGiState] = field(default_factory=list)
    sbe_volatile: int = 0
    dbe_volatile: int = 0
    sbe_aggregate: int = 0
    dbe_aggregate: int = 0
    retired_sbe: int = 0
    retired_dbe: int = 0
    retired_pending: bool = False
    remapped_correctable: int = 0
    remapped_uncorrectable: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    pcie_replay: int = 0
    processes: list[ProcessState] = field(default_factory=list)
    fabric_fault: str | None = None  # one of FABRIC_FAULTS
    compute_mode: int = 0  # nvmlComputeMode_t (DEFAULT)
    compute_mode_locked: bool = False  # setting it fails with NO_PERMISSION (as for a non-root caller)


@dataclass
class Event:
    seq: int
    gpu: int
    type: int
    data: int
    gi: int = ALL
    ci: int = ALL
    time: float = 0.0


@dataclass
class SimNodeState:
    preset: str
    seed: int
    node_id: str
    created: float
    gpus: list[SimGpuState]
    init_fault: str | None = None
    events: list[Event] = field(default_factory=list)
    next_seq: int = 1
    generation: int = 0

    # -- construction and JSON -------------------------------------------------------------------------
    @classmethod
    def new(
        cls, preset_name: str, seed: int = 0, node_id: str | None = None, now: float | None = None
    ) -> SimNodeState:
        preset = get_preset(preset_name)
        if node_id is None:
            node_id = hashlib.sha256(f"{preset_name}:{seed}".encode()).hexdigest()[:32]
        return cls(
            preset=preset_name,
            seed=seed,
            node_id=node_id,
            created=time.time() if now is None else now,
            gpus=[SimGpuState() for _ in preset.gpus],
        )

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["format"] = STATE_FORMAT
        return data

    @classmethod
    def from_json(cls, data: Any, source: str) -> SimNodeState:
        if not isinstance(data, dict) or data.get("format") != STATE_FORMAT:
            raise StateError(
                f"{source}: not a gpunode simulator state file (expected format {STATE_FORMAT!r})"
            )
        try:
            preset = get_preset(data["preset"])
            gpus = [
                SimGpuState(
                    **{
                        **g,
                        "gis": [
                            SimGiState(**{**gi, "cis": [SimCiState(**ci) for ci in gi["cis"]]})
                            for gi in g["gis"]
                        ],
                        "processes": [ProcessState(**p) for p in g["processes"]],
                    }
                )
                for g in data["gpus"]
            ]
            if len(gpus) != len(preset.gpus):
                raise StateError(
                    f"{source}: {len(gpus)} GPUs recorded but preset {preset.name} has {len(preset.gpus)}"
                )
            for g in gpus:
                if g.fabric_fault is not None and g.fabric_fault not in FABRIC_FAULTS:
                    raise StateError(f"{source}: unknown fabric fault {g.fabric_fault!r}")
            fault = data.get("init_fault")
            if fault is not None and fault not in INIT_FAULTS:
                raise StateError(f"{source}: unknown init fault {fault!r}")
            return cls(
                preset=preset.name,
                seed=int(data["seed"]),
                node_id=str(data["node_id"]),
                created=float(data["created"]),
                gpus=gpus,
                init_fault=fault,
                events=[Event(**e) for e in data["events"]],
                next_seq=int(data["next_seq"]),
                generation=int(data["generation"]),
            )
        except StateError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise StateError(f"{source}: corrupt simulator state ({type(exc).__name__}: {exc})") from None

    # -- identity --------------------------------------------------------------------------------------
    @property
    def spec(self) -> Preset:
        return get_preset(self.preset)

    def product(self, gpu: int) -> Product:
        return self.spec.gpus[gpu].product

    def gpu_uuid(self, gpu: int) -> str:
        return _derived_uuid("GPU-", f"{self.node_id}/gpu/{gpu}")

    def mig_uuid(self, gpu: int, gi: int, ci: int) -> str:
        return _derived_uuid("MIG-", f"{self.node_id}/gpu/{gpu}/gi/{gi}/ci/{ci}")

    def serial(self, gpu: int) -> str:
        digest = int(hashlib.sha256(f"{self.node_id}/serial/{gpu}".encode()).hexdigest(), 16)
        return f"1{digest % 10**12:012d}"

    # -- events ----------------------------------------------------------------------------------------
    def emit(
        self, gpu: int, etype: int, data: int = 0, gi: int = ALL, ci: int = ALL, now: float = 0.0
    ) -> Event:
        ev = Event(self.next_seq, gpu, etype, data, gi, ci, now)
        self.next_seq += 1
        self.events.append(ev)
        if len(self.events) > MAX_EVENTS:
            del self.events[: len(self.events) - MAX_EVENTS]
        return ev

    # -- MIG -------------------------------------------------------------------------------------------
    def find_gi(self, gpu: int, gi_id: int) -> SimGiState | None:
        for gi in self.gpus[gpu].gis:
            if gi.id == gi_id:
                return gi
        return None

    def set_mig_mode(self, gpu: int, mode: int) -> tuple[int, int]:
        """Returns (return code, activation status)."""
        product, st = self.product(gpu), self.gpus[gpu]
        if not product.mig_capable:
            return codes.NOT_SUPPORTED, codes.NOT_SUPPORTED
        if mode not in (0, 1):
            return codes.INVALID_ARGUMENT, codes.INVALID_ARGUMENT
        if st.gis or st.processes:
            return codes.IN_USE, codes.IN_USE
        st.mig_pending = mode
        if st.mig_current == mode:
            return codes.SUCCESS, codes.SUCCESS
        if product.mig_needs_reset:
            # Ampere: the change waits for a GPU reset; the simulated driver never resets by itself.
            return codes.SUCCESS, codes.RESET_REQUIRED
        st.mig_current = mode
        return codes.SUCCESS, codes.SUCCESS

    def set_compute_mode(self, gpu: int, mode: int) -> int:
        """nvmlDeviceSetComputeMode: a return code (0..3 are valid modes; 1 is deprecated but accepted)."""
        st = self.gpus[gpu]
        if mode not in (0, 1, 2, 3):
            return codes.INVALID_ARGUMENT
        if st.compute_mode_locked:
            return codes.NO_PERMISSION
        st.compute_mode = mode
        return codes.SUCCESS

    def reset_gpu(self, gpu: int) -> int:
        st = self.gpus[gpu]
        if st.lost:
            return codes.GPU_IS_LOST
        if st.gis or st.processes:
            return codes.IN_USE
        st.mig_current = st.mig_pending
        st.sbe_volatile = st.dbe_volatile = 0
        st.retired_pending = False
        st.remap_pending = False
        return codes.SUCCESS

    def gi_compute_slices_used(self, gpu: int) -> int:
        product = self.product(gpu)
        total = 0
        for gi in self.gpus[gpu].gis:
            spec = product.gi_profile(gi.profile)
            total += spec.compute_slices if spec else 0
        return total

    def _gi_fits(self, gpu: int, enum: int, start: int) -> bool:
        product = self.product(gpu)
        spec = product.gi_profile(enum)
        assert spec is not None
        lo, hi = start, start + spec.memory_slices
        for gi in self.gpus[gpu].gis:
            if lo < gi.start + gi.size and gi.start < hi:
                return False
        if self.gi_compute_slices_used(gpu) + spec.compute_slices > product.compute_slices:
            return False
        media = "me" in mig.GI_ENUMS[enum][1]
        if media and any("me" in mig.GI_ENUMS[gi.profile][1] for gi in self.gpus[gpu].gis):
            return False
        count = sum(1 for gi in self.gpus[gpu].gis if gi.profile == enum)
        return count < spec.max_count

    def check_gi_profile(self, gpu: int, enum: int) -> int:
        product = self.product(gpu)
        if not product.mig_capable:
            return codes.NOT_SUPPORTED
        if not 0 <= enum < mig.GI_PROFILE_COUNT:
            return codes.INVALID_ARGUMENT
        if product.gi_profile(enum) is None:
            return codes.NOT_SUPPORTED
        return codes.SUCCESS

    def free_gi_starts(self, gpu: int, enum: int) -> list[int]:
        spec = self.product(gpu).gi_profile(enum)
        assert spec is not None
        return [s for s in spec.starts if self._gi_fits(gpu, enum, s)]

    def remaining_gi_capacity(self, gpu: int, enum: int) -> int:
        """How many more GIs of this profile fit, placing each at the driver's next choice."""
        trial = SimNodeState.from_json(self.to_json(), "<copy>")
        n = 0
        while True:
            ret, _ = trial.create_gi(gpu, enum, None, emit=False)
            if ret != codes.SUCCESS:
                return n
            n += 1

    def create_gi(
        self,
        gpu: int,
        enum: int,
        start: int | None,
        *,
        emit: bool = True,
        now: float = 0.0,
        size: int | None = None,
    ) -> tuple[int, int]:
        """Returns (return code, GI id)."""
        st = self.gpus[gpu]
        ret = self.check_gi_profile(gpu, enum)
        if ret != codes.SUCCESS:
            return ret, 0
        if st.mig_current != 1:
            return codes.NOT_SUPPORTED, 0
        product = self.product(gpu)
        spec = product.gi_profile(enum)
        assert spec is not None
        if start is None:
            free = self.free_gi_starts(gpu, enum)
            if not free:
                return codes.INSUFFICIENT_RESOURCES, 0
            # The driver fills from the top of the memory-slice range down, which is why
            # `-cgi 19,19,14,9` fails on an A100 while `9,19,14,19` works (MIG user guide).
            start = max(free)
        else:
            if start not in spec.starts or (size is not None and size != spec.memory_slices):
                return codes.INVALID_ARGUMENT, 0
            if not self._gi_fits(gpu, enum, start):
                return codes.INSUFFICIENT_RESOURCES, 0
        gi_id = mig.gpu_instance_id(start, spec.memory_slices, product.memory_slices)
        st.gis.append(SimGiState(gi_id, enum, start, spec.memory_slices))
        st.gis.sort(key=lambda g: g.id)
        if emit:
            self.emit(gpu, EVENT_MIG_CONFIG, 0, gi_id, ALL, now)
        return codes.SUCCESS, gi_id

    def destroy_gi(self, gpu: int, gi_id: int, now: float = 0.0) -> int:
        st = self.gpus[gpu]
        gi = self.find_gi(gpu, gi_id)
        if gi is None:
            return codes.INVALID_ARGUMENT
        if gi.cis or any(p.gi == gi_id for p in st.processes):
            return codes.IN_USE
        st.gis.remove(gi)
        self.emit(gpu, EVENT_MIG_CONFIG, 0, gi_id, ALL, now)
        return codes.SUCCESS

    def ci_profile_ok(self, gpu: int, gi: SimGiState, ci_enum: int) -> int:
        if not 0 <= ci_enum < mig.CI_PROFILE_COUNT:
            return codes.INVALID_ARGUMENT
        if ci_enum not in (mig.CI_1_SLICE, mig.CI_2_SLICE, mig.CI_3_SLICE, mig.CI_4_SLICE, mig.CI_7_SLICE):
            return codes.NOT_SUPPORTED
        g, attrs = mig.GI_ENUMS[gi.profile]
        c = mig.CI_ENUMS[ci_enum]
        if c not in mig.valid_ci_slices(g):
            return codes.NOT_SUPPORTED
        if attrs and c != g:  # media-extension GIs take only the full compute instance
            return codes.NOT_SUPPORTED
        return codes.SUCCESS

    def _ci_fits(self, gi: SimGiState, ci_enum: int, start: int) -> bool:
        g = mig.GI_ENUMS[gi.profile][0]
        c = mig.CI_ENUMS[ci_enum]
        if start not in mig.ci_placement_starts(g, c):
            return False
        if sum(1 for ci in gi.cis if ci.profile == ci_enum) >= g // c:
            return False
        return all(not (start < ci.start + ci.size and ci.start < start + c) for ci in gi.cis)

    def free_ci_starts(self, gi: SimGiState, ci_enum: int) -> list[int]:
        g = mig.GI_ENUMS[gi.profile][0]
        c = mig.CI_ENUMS[ci_enum]
        return [s for s in mig.ci_placement_starts(g, c) if self._ci_fits(gi, ci_enum, s)]

    def create_ci(
        self, gpu: int, gi_id: int, ci_enum: int, start: int | None, now: float = 0.0
    ) -> tuple[int, int]:
        gi = self.find_gi(gpu, gi_id)
        if gi is None:
            return codes.INVALID_ARGUMENT, 0
        ret = self.ci_profile_ok(gpu, gi, ci_enum)
        if ret != codes.SUCCESS:
            return ret, 0
        if start is None:
            free = self.free_ci_starts(gi, ci_enum)
            if not free:
                return codes.INSUFFICIENT_RESOURCES, 0
            start = free[0]
        elif not self._ci_fits(gi, ci_enum, start):
            g = mig.GI_ENUMS[gi.profile][0]
            if start not in mig.ci_placement_starts(g, mig.CI_ENUMS[ci_enum]):
                return codes.INVALID_ARGUMENT, 0
            return codes.INSUFFICIENT_RESOURCES, 0
        used = {ci.id for ci in gi.cis}
        ci_id = next(i for i in range(64) if i not in used)
        gi.cis.append(SimCiState(ci_id, ci_enum, start, mig.CI_ENUMS[ci_enum]))
        gi.cis.sort(key=lambda c: c.id)
        self.emit(gpu, EVENT_MIG_CONFIG, 0, gi_id, ci_id, now)
        return codes.SUCCESS, ci_id

    def destroy_ci(self, gpu: int, gi_id: int, ci_id: int, now: float = 0.0) -> int:
        gi = self.find_gi(gpu, gi_id)
        if gi is None:
            return codes.INVALID_ARGUMENT
        for ci in gi.cis:
            if ci.id == ci_id:
                if any(p.gi == gi_id and p.ci == ci_id for p in self.gpus[gpu].processes):
                    return codes.IN_USE
                gi.cis.remove(ci)
                self.emit(gpu, EVENT_MIG_CONFIG, 0, gi_id, ci_id, now)
                return codes.SUCCESS
        return codes.INVALID_ARGUMENT

    def mig_devices(self, gpu: int) -> list[tuple[SimGiState, SimCiState]]:
        """MIG devices in NVML's enumeration order (GI id, then CI id)."""
        if self.gpus[gpu].mig_current != 1:
            return []
        return [(gi, ci) for gi in self.gpus[gpu].gis for ci in gi.cis]

    # -- NVLink fabric ---------------------------------------------------------------------------------
    def fabric_info(self, gpu: int) -> FabricInfo | None:
        """None: the GPU predates fabric reporting (NVML answers NOT_SUPPORTED); Hopper and later without
        a multi-node fabric report the state NOT_SUPPORTED."""
        product, fabric = self.product(gpu), self.spec.fabric
        if product.architecture < ARCH_HOPPER:
            return None
        if fabric is None:
            return FabricInfo(FABRIC_NOT_SUPPORTED, codes.SUCCESS, bytes(16), 0, 0, 0)
        cluster = uuidlib.UUID(fabric.cluster_uuid).bytes
        fault = self.gpus[gpu].fabric_fault
        if fault == "not-trained":
            return FabricInfo(FABRIC_NOT_STARTED, codes.SUCCESS, bytes(16), 0, 0, 0)
        if fault == "training":
            return FabricInfo(FABRIC_IN_PROGRESS, codes.SUCCESS, bytes(16), 0, 0, 0)
        if fault == "failed":
            return FabricInfo(
                FABRIC_COMPLETED, codes.UNKNOWN, bytes(16), 0, 0, FABRIC_HEALTH_SUMMARY["unhealthy"]
            )
        if fault == "degraded":
            return FabricInfo(
                FABRIC_COMPLETED,
                codes.SUCCESS,
                cluster,
                fabric.clique_id,
                FABRIC_DEGRADED_BW_TRUE,
                FABRIC_HEALTH_SUMMARY["limited-capacity"],
            )
        healthy = FABRIC_HEALTH_SUMMARY["healthy"]
        return FabricInfo(
            FABRIC_COMPLETED, codes.SUCCESS, cluster, fabric.clique_id, FABRIC_DEGRADED_BW_FALSE, healthy
        )

    def set_fabric_fault(self, gpu: int, fault: str | None) -> None:
        if fault is not None and fault not in FABRIC_FAULTS:
            raise StateError(f"unknown fabric fault {fault!r}; choose one of: {', '.join(FABRIC_FAULTS)}")
        self.gpus[gpu].fabric_fault = fault

    # -- faults ----------------------------------------------------------------------------------------
    def inject_xid(self, gpu: int, xid: int, gi: int = ALL, ci: int = ALL, now: float = 0.0) -> Event:
        return self.emit(gpu, EVENT_XID, xid, gi, ci, now)

    def inject_ecc(self, gpu: int, kind: str, count: int = 1, now: float = 0.0) -> Event:
        st = self.gpus[gpu]
        turing = self.product(gpu).architecture < 7
        if kind == "sbe":
            st.sbe_volatile += count
            st.sbe_aggregate += count
            if not turing:
                st.remapped_correctable += count
            return self.emit(gpu, EVENT_SBE, count, now=now)
        st.dbe_volatile += count
        st.dbe_aggregate += count
        if turing:
            st.retired_dbe += count
            st.retired_pending = True
        else:
            st.remapped_uncorrectable += count
            st.remap_pending = True
        self.emit(gpu, EVENT_DBE, count, now=now)
        return self.emit(gpu, EVENT_XID, 48, now=now)

    def lose(self, gpu: int, now: float = 0.0) -> None:
        if not self.gpus[gpu].lost:
            self.emit(gpu, EVENT_XID, 79, now=now)
        self.gpus[gpu].lost = True

    def restore(self, gpu: int | None = None) -> None:
        targets = range(len(self.gpus)) if gpu is None else [gpu]
        for i in targets:
            st = self.gpus[i]
            st.lost = False
            st.retired_pending = False
            st.remap_pending = False
            st.remap_failure = False
            st.fabric_fault = None
        if gpu is None:
            self.init_fault = None


@dataclass(frozen=True)
class Telemetry:
    gpu_util: int
    mem_util: int
    power_mw: int
    energy_mj: int
    temperature_c: int
    sm_clock: int
    mem_clock: int
    pcie_tx_kbs: int
    pcie_rx_kbs: int
    dec_util: int
    enc_util: int
    pstate: int


def _phases(seed: int, gpu: int) -> tuple[float, float, float]:
    h = hashlib.sha256(f"{seed}/{gpu}".encode()).digest()
    return (
        h[0] / 255 * 2 * math.pi,
        h[1] / 255 * 2 * math.pi,
        0.6 + h[2] / 255 * 0.45,
    )  # load scale keeps u(t) below 100


_P1, _P2 = 97.0, 23.0  # periods in seconds of the two load waves


def _util(t: float, ph: tuple[float, float, float]) -> float:
    """Utilisation in [5, 95]: two sine waves, never clipped, so its integral stays exact."""
    return 50 + 30 * math.sin(2 * math.pi * t / _P1 + ph[0]) + 15 * math.sin(2 * math.pi * t / _P2 + ph[1])


def _util_integral(t: float, ph: tuple[float, float, float]) -> float:
    return (
        50 * t
        - 30 * _P1 / (2 * math.pi) * math.cos(2 * math.pi * t / _P1 + ph[0])
        - 15 * _P2 / (2 * math.pi) * math.cos(2 * math.pi * t / _P2 + ph[1])
    )


def telemetry(state: SimNodeState, gpu: int, now: float) -> Telemetry:
    """Deterministic for a given seed and time: moves plausibly, energy is the exact integral of power."""
    product = state.product(gpu)
    ph = _phases(state.seed, gpu)
    t = now - state.created
    util = _util(t, ph) * ph[2] if state.gpus[gpu].processes else _util(t, ph) * 0.1 * ph[2]
    util = max(0.0, min(100.0, util))
    span = (product.tdp_w - product.idle_w) * 1000 * 0.9
    busy_scale = ph[2] if state.gpus[gpu].processes else 0.1 * ph[2]
    power_mw = product.idle_w * 1000 + span * util / 100
    # energy: integral of idle + span * busy_scale * u(t)/100 from 0 to t
    energy = product.idle_w * 1000 * t + span * busy_scale / 100 * (
        _util_integral(t, ph) - _util_integral(0, ph)
    )
    return Telemetry(
        gpu_util=int(util),
        mem_util=int(util * 0.6),
        power_mw=int(power_mw),
        energy_mj=max(0, int(energy)),
        temperature_c=int(30 + util * 0.45),
        sm_clock=int(product.max_sm_clock * (0.3 + 0.7 * min(1.0, util / 60))) if util > 1 else 210,
        mem_clock=product.max_mem_clock,
        pcie_tx_kbs=int(util * 120 + 200),
        pcie_rx_kbs=int(util * 250 + 400),
        dec_util=int(util * 0.1) if product.decoders else 0,
        enc_util=int(util * 0.05) if product.encoders else 0,
        pstate=0 if util > 1 else 8,
    )

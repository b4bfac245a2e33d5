"""The MIG planner: live GPU state + desired devices -> an exact, explicit plan per GPU.

Pure and deterministic: it takes the GPUs as data and returns data; nothing here touches NVML.
Unlike mig-parted (shared/reference/mig.md §2.2-2.3) it does not try creation orders against the
driver's automatic placement. It resolves profiles on each GPU, packs compute instances into GPU
instances, searches explicit memory-slice placements exactly (so infeasibility is known before
anything is touched), keeps every GPU instance that can stay, and changes the mode (and resets) only
the GPUs whose mode is wrong.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from gpunode.api.mig_profiles import MigProfileName, ProfileSyntaxError, parse_profile
from gpunode.nvml import mig
from gpunode.nvml.api import CiProfile, GiProfile, Placement

# CI profile enum for a CI size, used when the GPU lists no CI profiles (NVML lists them only per GI).
CI_ENUM_FOR_SLICES: dict[int, int] = {
    1: mig.CI_1_SLICE,
    2: mig.CI_2_SLICE,
    3: mig.CI_3_SLICE,
    4: mig.CI_4_SLICE,
    7: mig.CI_7_SLICE,
    8: mig.CI_8_SLICE,
    6: mig.CI_6_SLICE,
}

# A memory fraction this far below a power of two still rounds up to it (drivers report a little
# less memory for a GI than size x per-slice memory; the full profile loses some too).
_SIZE_SLACK = Fraction(1, 4)


# -- inputs ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CiState:
    id: int
    profile_enum: int
    slices: int
    start: int


@dataclass(frozen=True)
class GiState:
    id: int
    profile: GiProfile
    start: int
    size: int
    cis: tuple[CiState, ...]


@dataclass(frozen=True)
class GpuMigState:
    """The live MIG state of one GPU, as :func:`gpunode.mig.state.read_state` reads it."""

    index: int
    name: str
    mig_capable: bool
    mode_current: bool
    mode_pending: bool
    reset_for_mode: bool  # a mode change needs a GPU reset (Ampere) or not (Hopper and later)
    compute_slices: int  # 7 (A100/H100/H200), 4 (A30); 0 if not capable
    memory_slices: int  # 8, or 4 on A30
    gi_profiles: tuple[GiProfile, ...]  # placements may be empty: then they are derived
    ci_profiles: Mapping[int, tuple[CiProfile, ...]]  # by GI profile enum; may be empty: then derived
    instances: tuple[GiState, ...]
    processes: tuple[int, ...] = ()  # pids using the GPU


@dataclass(frozen=True)
class DesiredGpu:
    """What one GPU should become: MIG on or off, and the devices it should hold."""

    mig_enabled: bool
    devices: Mapping[str, int] = field(default_factory=dict)  # profile string -> count (> 0)


# -- outputs --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CiCreate:
    profile_enum: int
    start: int
    slices: int
    name: str


@dataclass(frozen=True)
class GiCreate:
    profile_enum: int
    start: int
    size: int
    name: str
    cis: tuple[CiCreate, ...]


Target = tuple[int, int | None]  # (gi_id, ci_id), ci_id None: the GI itself


@dataclass(frozen=True)
class GpuPlan:
    index: int
    set_mode: bool | None = None  # None: the mode stays
    reset: bool = False  # reset this GPU (only this one) for its mode change
    destroy: tuple[Target, ...] = ()  # CIs first, then GIs
    create_cis: tuple[tuple[int, CiCreate], ...] = ()  # new CIs inside kept GIs
    create: tuple[GiCreate, ...] = ()  # new GIs with their CIs, explicit placements
    keep: tuple[int, ...] = ()  # GI ids that stay (possibly gaining CIs from create_cis)
    disrupted_processes: tuple[int, ...] = ()  # pids on this GPU when the plan destroys or changes mode
    name: str = ""  # the GPU's product name, for messages
    labels: tuple[tuple[Target, str], ...] = ()  # "3g.20gb @4:4" for kept/destroyed GIs and CIs

    @property
    def empty(self) -> bool:
        return not (self.set_mode is not None or self.reset or self.destroy or self.create_cis or self.create)

    def describe(self) -> list[str]:
        """One human line for --dry-run."""
        labels = dict(self.labels)

        def gi(gi_id: int) -> str:
            label = labels.get((gi_id, None))
            return f"GI {gi_id} ({label})" if label else f"GI {gi_id}"

        parts: list[str] = []
        if self.keep:
            parts.append("keep " + ", ".join(gi(i) for i in self.keep))
        gone = [g for g, c in self.destroy if c is None]
        ci_only = [(g, c) for g, c in self.destroy if c is not None and g not in gone]
        if ci_only:
            parts.append(
                "destroy "
                + ", ".join(
                    f"CI {c} in GI {g}" + (f" ({labels[(g, c)]})" if (g, c) in labels else "")
                    for g, c in ci_only
                )
            )
        if gone:
            parts.append("destroy " + ", ".join(gi(g) for g in gone))
        if self.set_mode is not None:
            parts.append("enable MIG" if self.set_mode else "disable MIG")
        if self.reset:
            parts.append("reset GPU")
        if self.create_cis:
            parts.append(
                "create " + ", ".join(f"CI {ci.name} @{ci.start} in GI {g}" for g, ci in self.create_cis)
            )
        if self.create:
            parts.append("create " + ", ".join(_describe_create(c) for c in self.create))
        if self.disrupted_processes:
            parts.append("disrupts pids " + ", ".join(str(p) for p in self.disrupted_processes))
        return [f"GPU {self.index}: " + ("; ".join(parts) if parts else "nothing to do")]


def _describe_create(c: GiCreate) -> str:
    cis = ", ".join(f"CI {ci.name} @{ci.start}" for ci in c.cis)
    return f"{c.name} @{c.start}:{c.size}" + (f" [{cis}]" if cis else "")


@dataclass(frozen=True)
class NodePlan:
    gpus: tuple[GpuPlan, ...] = ()  # only GPUs with something to do
    #: why the config changes nothing here: none of its entries matches a GPU of this node (a warning)
    no_gpu_matched: str | None = None

    @property
    def empty(self) -> bool:
        return all(g.empty for g in self.gpus)

    def describe(self) -> list[str]:
        if self.empty:
            return ["nothing to do"]
        return [line for g in self.gpus if not g.empty for line in g.describe()]


class Infeasible(Exception):
    """The desired layout cannot exist on this GPU; raised before anything is changed."""

    def __init__(self, gpu: int, name: str, reason: str) -> None:
        super().__init__(f"GPU {gpu} ({name}): {reason}")
        self.gpu = gpu
        self.name = name
        self.reason = reason


class _Fail(Exception):
    """Internal: one planning attempt failed, with a reason for the user."""


# -- public functions -----------------------------------------------------------------------------------
def current_devices(state: GpuMigState) -> dict[str, int]:
    """The live layout as mig-parted counts it: one profile string per CI; GIs without CIs don't count."""
    out: Counter[str] = Counter()
    for gi in sorted(state.instances, key=lambda g: g.id):
        for ci in sorted(gi.cis, key=lambda c: c.id):
            out[_ci_name(gi.profile, ci.slices)] += 1
    return dict(out)


def plan_node(
    states: Sequence[GpuMigState], desired: Mapping[int, DesiredGpu], *, mode_only: bool = False
) -> NodePlan:
    """Plan every GPU named in `desired`; raises Infeasible for the first one that cannot be satisfied."""
    by_index = {s.index: s for s in states}
    for index in sorted(desired):
        if index not in by_index:
            raise Infeasible(index, "unknown", "no such GPU on this node")
    plans = [plan_gpu(by_index[i], desired[i], mode_only=mode_only) for i in sorted(by_index) if i in desired]
    return NodePlan(tuple(p for p in plans if not p.empty))


def plan_gpu(state: GpuMigState, desired: DesiredGpu, *, mode_only: bool = False) -> GpuPlan:
    """The plan that turns this GPU's live state into `desired`."""
    try:
        return _plan_gpu(state, desired, mode_only)
    except _Fail as e:
        raise Infeasible(state.index, state.name, str(e)) from None


def derived_placements(state: GpuMigState) -> dict[int, tuple[Placement, ...]]:
    """Placements per GI profile enum: the listed ones, or derived where the driver listed none."""
    return dict(_placements(state.gi_profiles, state.memory_slices, state.compute_slices))


# -- mode -----------------------------------------------------------------------------------------------
def _plan_gpu(state: GpuMigState, desired: DesiredGpu, mode_only: bool) -> GpuPlan:
    if not state.mig_capable:
        if desired.mig_enabled:
            raise _Fail("MIG is not supported on this GPU")
        return GpuPlan(state.index, name=state.name)

    set_mode: bool | None = None
    reset = False
    if desired.mig_enabled != state.mode_current:
        if state.mode_pending == desired.mig_enabled and state.reset_for_mode:
            reset = True  # the change is already pending: only the reset is missing
        else:
            set_mode = desired.mig_enabled
            reset = state.reset_for_mode

    if set_mode is not None or reset:
        # The driver refuses a mode change (and a reset) while GPU instances exist.
        destroy = _destroy_all(state.instances)
        creates: tuple[GiCreate, ...] = ()
        if desired.mig_enabled and not mode_only:
            gpu = _Gpu(state)
            creates = _layout(gpu, desired.devices, ()).creates(gpu)
        return _finish(state, set_mode, reset, destroy, (), creates, ())

    if not desired.mig_enabled or mode_only:
        return GpuPlan(state.index, name=state.name)

    gpu = _Gpu(state)
    layout = _layout(gpu, desired.devices, state.instances)
    kept_ids = {s.gi_id for s in layout.kept}
    destroy = _destroy_all(tuple(g for g in state.instances if g.id not in kept_ids))
    create_cis = tuple(
        (s.gi_id, ci) for s in sorted(layout.kept, key=lambda s: s.gi_id) for ci in s.new_cis(gpu)
    )
    return _finish(state, None, False, destroy, create_cis, layout.creates(gpu), tuple(sorted(kept_ids)))


def _destroy_all(gis: Sequence[GiState]) -> tuple[Target, ...]:
    ordered = sorted(gis, key=lambda g: g.id)
    cis = [(g.id, c.id) for g in ordered for c in sorted(g.cis, key=lambda c: c.id)]
    return (*cis, *((g.id, None) for g in ordered))


def _finish(
    state: GpuMigState,
    set_mode: bool | None,
    reset: bool,
    destroy: tuple[Target, ...],
    create_cis: tuple[tuple[int, CiCreate], ...],
    create: tuple[GiCreate, ...],
    keep: tuple[int, ...],
) -> GpuPlan:
    disruptive = bool(destroy) or set_mode is not None or reset
    labels: list[tuple[Target, str]] = []
    for gi in sorted(state.instances, key=lambda g: g.id):
        labels.append(((gi.id, None), f"{gi.profile.name} @{gi.start}:{gi.size}"))
        for ci in sorted(gi.cis, key=lambda c: c.id):
            labels.append(((gi.id, ci.id), f"{_ci_name(gi.profile, ci.slices)} @{ci.start}"))
    return GpuPlan(
        index=state.index,
        set_mode=set_mode,
        reset=reset,
        destroy=destroy,
        create_cis=create_cis,
        create=create,
        keep=keep,
        disrupted_processes=tuple(state.processes) if disruptive else (),
        name=state.name,
        labels=tuple(labels),
    )


# -- per-GPU facts --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _CiOption:
    enum: int
    cap: int  # most CIs of this size in one GI


class _Gpu:
    """The GPU's profiles resolved once: by name, placements, CI options."""

    def __init__(self, state: GpuMigState) -> None:
        self.state = state
        self.by_enum = {p.enum: p for p in state.gi_profiles}
        self.by_name: dict[MigProfileName, GiProfile] = {}
        for p in state.gi_profiles:
            parsed = _parse(p.name)
            if parsed is not None:
                self.by_name.setdefault(parsed, p)
        self.placements = _placements(state.gi_profiles, state.memory_slices, state.compute_slices)
        self._ci: dict[int, dict[int, _CiOption]] = {}
        self._caps: dict[int, tuple[tuple[int, int], ...]] = {}

    def ci_options(self, profile: GiProfile) -> dict[int, _CiOption]:
        """CI size -> (CI enum, per-GI cap) for a GI profile."""
        opts = self._ci.get(profile.enum)
        if opts is None:
            opts = {}
            listed = self.state.ci_profiles.get(profile.enum, ())
            if listed:
                for cp in sorted(listed, key=lambda c: c.enum):
                    if cp.slices not in opts and cp.slices > 0:
                        cap = cp.instance_count or profile.slices // cp.slices
                        opts[cp.slices] = _CiOption(cp.enum, cap)
            else:
                parsed = _parse(profile.name)
                restricted = parsed is None or bool(parsed.attrs or parsed.negative)
                sizes = [profile.slices] if restricted else mig.valid_ci_slices(profile.slices)
                for c in sizes:
                    if c in CI_ENUM_FOR_SLICES:
                        opts[c] = _CiOption(CI_ENUM_FOR_SLICES[c], profile.slices // c)
            self._ci[profile.enum] = opts
        return opts

    def ci_caps(self, profile: GiProfile) -> tuple[tuple[int, int], ...]:
        caps = self._caps.get(profile.enum)
        if caps is None:
            caps = self._caps[profile.enum] = tuple(
                sorted((c, o.cap) for c, o in self.ci_options(profile).items())
            )
        return caps

    def profile_list(self) -> str:
        names = sorted(self.by_name, key=lambda n: (n.g, n.gb, n.attrs, n.negative))
        return ", ".join(str(n) for n in names)


@functools.lru_cache(maxsize=1024)
def _parse(name: str) -> MigProfileName | None:
    try:
        return parse_profile(name)
    except ProfileSyntaxError:
        return None


def _ci_name(profile: GiProfile, slices: int) -> str:
    if slices == profile.slices:
        return profile.name
    try:
        return mig.ci_profile_name(profile.name, slices)
    except ProfileSyntaxError:
        return f"{slices}c.{profile.name}"


def _has_media(profile: GiProfile) -> bool:
    parsed = _parse(profile.name)
    return parsed is not None and any(a == "me" or a.startswith("me.") for a in parsed.attrs)


@functools.lru_cache(maxsize=256)
def _placements(
    profiles: tuple[GiProfile, ...], memory_slices: int, compute_slices: int
) -> dict[int, tuple[Placement, ...]]:
    """Listed placements, or derived ones: size from the memory share (rounded up to a power of two),
    starts aligned to the size, as many as the compute slices allow (7 x 1g, 3 x 2g, 2 x 3g on A100)."""
    out: dict[int, tuple[Placement, ...]] = {}
    biggest = max(profiles, key=lambda p: (p.slices, p.memory_mib), default=None)
    for p in profiles:
        if p.placements:
            out[p.enum] = tuple(p.placements)
            continue
        if biggest is None or biggest.memory_mib <= 0 or memory_slices <= 0 or p.slices <= 0:
            out[p.enum] = ()
            continue
        share = Fraction(p.memory_mib * memory_slices, biggest.memory_mib)
        size = 1 << max(0, math.ceil(share - _SIZE_SLACK) - 1).bit_length()
        starts = [s for s in range(0, memory_slices, size) if s + size <= memory_slices]
        keep = min(len(starts), compute_slices // p.slices) if compute_slices else len(starts)
        out[p.enum] = tuple(Placement(s, size) for s in starts[:keep])
    return out


# -- desired devices -> GPU instances -------------------------------------------------------------------
@dataclass
class _Slot:
    """One GI of the target layout: kept (gi set) or new; `fixed` CIs stay, `new` ones get created."""

    profile: GiProfile
    gi: GiState | None = None
    fixed: tuple[tuple[int, int], ...] = ()  # (start, slices) of the CIs that stay
    new: list[int] = field(default_factory=list)  # slices of the CIs to create, largest first
    starts: tuple[int, ...] = ()  # where `new` go, in the same order
    placement: Placement | None = None  # for new GIs

    @property
    def gi_id(self) -> int:
        assert self.gi is not None
        return self.gi.id

    def new_cis(self, gpu: _Gpu) -> list[CiCreate]:
        opts = gpu.ci_options(self.profile)
        cis = [
            CiCreate(opts[c].enum, s, c, _ci_name(self.profile, c))
            for c, s in zip(self.new, self.starts, strict=True)
        ]
        return sorted(cis, key=lambda c: c.start)


@dataclass
class _Layout:
    kept: list[_Slot]
    new: list[_Slot]

    def creates(self, gpu: _Gpu) -> tuple[GiCreate, ...]:
        out = []
        for s in self.new:
            assert s.placement is not None
            p = s.placement
            out.append(GiCreate(s.profile.enum, p.start, p.size, s.profile.name, tuple(s.new_cis(gpu))))
        return tuple(sorted(out, key=lambda c: c.start))


@dataclass
class _Want:
    """What the desired devices ask of one GI profile."""

    profile: GiProfile
    sizes: list[int]  # CI sizes, largest first
    devices: list[str]  # the desired names, for messages


def _resolve(gpu: _Gpu, devices: Mapping[str, int]) -> dict[int, _Want]:
    wants: dict[int, _Want] = {}
    for text in sorted(devices):
        count = devices[text]
        if count <= 0:
            continue  # mig-parted pitfall: an explicit 0 must not make the layouts differ
        try:
            parsed = parse_profile(text)
        except ProfileSyntaxError as e:
            raise _Fail(str(e)) from None
        key = MigProfileName(parsed.g, parsed.gb, parsed.g, parsed.attrs, parsed.negative)
        profile = gpu.by_name.get(key)
        if profile is None:
            raise _Fail(f"unknown MIG profile {text}; this GPU has {gpu.profile_list()}")
        opts = gpu.ci_options(profile)
        c = parsed.c if parsed.c != parsed.g else profile.slices
        if c not in opts:
            sizes = ", ".join(f"{s}c" if s != profile.slices else profile.name for s in sorted(opts))
            raise _Fail(f"{text}: a {profile.name} GPU instance offers compute instances {sizes}")
        want = wants.setdefault(profile.enum, _Want(profile, [], []))
        want.sizes.extend([c] * count)
        want.devices.append(f"{count} x {parsed}" if count > 1 else str(parsed))
    for want in wants.values():
        want.sizes.sort(reverse=True)
    return wants


@functools.lru_cache(maxsize=4096)
def _fit_cis(
    g: int, fixed: tuple[tuple[int, int], ...], sizes: tuple[int, ...], caps: tuple[tuple[int, int], ...]
) -> tuple[int, ...] | None:
    """Starts for CIs of `sizes` (largest first) in a GI of `g` slices around the `fixed` ones."""
    counts = Counter(c for _, c in fixed) + Counter(sizes)
    cap = dict(caps)
    if any(n > cap.get(c, 0) for c, n in counts.items()):
        return None
    mask = 0
    for s, c in fixed:
        mask |= ((1 << c) - 1) << s
    options = [[(s, ((1 << c) - 1) << s) for s in mig.ci_placement_starts(g, c)] for c in sizes]
    chosen: list[int] = []

    def place(i: int, used: int, low: int) -> bool:
        if i == len(sizes):
            return True
        for k, (s, m) in enumerate(options[i]):
            if k < low or m & used:
                continue
            chosen.append(s)
            nxt = i + 1
            if place(nxt, used | m, k + 1 if nxt < len(sizes) and sizes[nxt] == sizes[i] else 0):
                return True
            chosen.pop()
        return False

    return tuple(chosen) if place(0, mask, 0) else None


def _add_ci(gpu: _Gpu, slot: _Slot, c: int) -> bool:
    g = slot.profile.slices
    if sum(n for _, n in slot.fixed) + sum(slot.new) + c > g:
        return False
    sizes = tuple(sorted([*slot.new, c], reverse=True))
    starts = _fit_cis(g, slot.fixed, sizes, gpu.ci_caps(slot.profile))
    if starts is None:
        return False
    slot.new, slot.starts = list(sizes), starts
    return True


def _layout(gpu: _Gpu, devices: Mapping[str, int], existing: Sequence[GiState]) -> _Layout:
    """The target layout keeping as many existing GIs as a feasible plan allows."""
    wants = _resolve(gpu, devices)
    eligible = sorted(
        (gi for gi in existing if gi.profile.enum in wants and gi.profile.enum in gpu.by_enum),
        key=lambda gi: (-gi.profile.slices, -len(gi.cis), gi.id),
    )
    first = _taken(wants, eligible)
    try:
        return _attempt(gpu, wants, first)
    except _Fail:
        if not first:
            raise
    fresh = _attempt(gpu, wants, ())  # raises the empty-GPU reason when nothing can work
    # Fewer keeps: every distinct set that can stay, most GIs (then most slices) first.
    rank = {gi.id: i for i, gi in enumerate(eligible)}
    tried = tuple(gi.id for gi in first)
    options: dict[tuple[int, ...], tuple[GiState, ...]] = {}
    for r in range(len(eligible) - 1, 0, -1):
        for subset in itertools.combinations(eligible, r):
            taken = _taken(wants, subset)
            key = tuple(gi.id for gi in taken)
            if taken and key != tried:
                options.setdefault(key, taken)
    for taken in sorted(
        options.values(),
        key=lambda t: (-len(t), -sum(gi.profile.slices for gi in t), [rank[gi.id] for gi in t]),
    ):
        try:
            return _attempt(gpu, wants, taken)
        except _Fail:
            continue
    return fresh


def _taken(wants: dict[int, _Want], keepable: Sequence[GiState]) -> tuple[GiState, ...]:
    """The existing GIs that can stay: all their CIs are wanted (or they have none, to be filled)."""
    pools: dict[int, Counter[int]] = {e: Counter(w.sizes) for e, w in wants.items()}
    taken = []
    for gi in keepable:
        have = Counter(ci.slices for ci in gi.cis)
        pool = pools[gi.profile.enum]
        if have and have <= pool:
            pool.subtract(have)
        elif have:
            continue
        taken.append(gi)
    return tuple(taken)


def _attempt(gpu: _Gpu, wants: dict[int, _Want], taken: Sequence[GiState]) -> _Layout:
    """Pack the wanted CIs into the taken GIs, then new ones; check and place the new ones."""
    kept: dict[int, list[_Slot]] = {}
    pools: dict[int, Counter[int]] = {e: Counter(w.sizes) for e, w in wants.items()}
    for gi in taken:
        pools[gi.profile.enum].subtract(ci.slices for ci in gi.cis)
        fixed = tuple(sorted((ci.start, ci.slices) for ci in gi.cis))
        kept.setdefault(gi.profile.enum, []).append(_Slot(gpu.by_enum[gi.profile.enum], gi, fixed))
    new: list[_Slot] = []
    for enum in sorted(wants):
        want = wants[enum]
        slots = sorted(kept.get(enum, []), key=lambda s: (not s.fixed, s.gi.id if s.gi else 0))
        fresh: list[_Slot] = []
        for c in sorted(pools[enum].elements(), reverse=True):
            if any(_add_ci(gpu, s, c) for s in (*slots, *fresh)):
                continue
            slot = _Slot(want.profile)
            if not _add_ci(gpu, slot, c):
                raise _Fail(f"{want.profile.name} cannot hold a {c}-slice compute instance")
            fresh.append(slot)
        kept[enum] = [s for s in slots if s.fixed or s.new]  # empty GIs that got nothing go
        new.extend(fresh)
    kept_slots = [s for slots in kept.values() for s in slots]
    _check_and_place(gpu, wants, kept_slots, new)
    return _Layout(kept_slots, new)


def _check_and_place(gpu: _Gpu, wants: dict[int, _Want], kept: list[_Slot], new: list[_Slot]) -> None:
    state = gpu.state
    every = [s.profile for s in (*kept, *new)]
    per_profile = Counter(p.enum for p in every)
    for enum in sorted(per_profile):
        profile = gpu.by_enum[enum]
        n = per_profile[enum]
        if n > profile.instance_count:
            want = wants[enum]
            if want.sizes == [profile.slices] * len(want.sizes):
                what = f"{n} x {profile.name}"
            else:
                what = f"{', '.join(want.devices)} need {n} x {profile.name} GPU instances"
            raise _Fail(f"{what}: at most {profile.instance_count} on this GPU")
    media = [p for p in every if _has_media(p)]
    if len(media) > 1:
        names = " and ".join(sorted({p.name for p in media}))
        raise _Fail(f"{names}: only one GPU instance can own the media engines")
    compute = sum(p.slices for p in every)
    if compute > state.compute_slices:
        raise _Fail(f"needs {compute} compute slices ({_summary(every)}), the GPU has {state.compute_slices}")
    sizes = {p.enum: (gpu.placements.get(p.enum) or (Placement(0, 0),))[0].size for p in every}
    memory = sum(sizes[p.enum] for p in every)
    if memory > state.memory_slices:
        raise _Fail(f"needs {memory} memory slices ({_summary(every)}), the GPU has {state.memory_slices}")
    for s in new:
        if not gpu.placements.get(s.profile.enum):
            raise _Fail(f"{s.profile.name} lists no placements on this GPU")
    _place_gis(gpu, kept, new)


def _summary(profiles: Sequence[GiProfile]) -> str:
    counts = Counter(p.name for p in sorted(profiles, key=lambda p: (-p.slices, p.name)))
    return ", ".join(f"{n} x {name}" if n > 1 else name for name, n in counts.items())


def _mask(p: Placement) -> int:
    return ((1 << p.size) - 1) << p.start


def _place_gis(gpu: _Gpu, kept: list[_Slot], new: list[_Slot]) -> None:
    """Exact search: new GIs (largest first) onto free placements around the kept ones."""
    base = 0
    taken: list[str] = []
    for s in sorted(kept, key=lambda s: s.gi.start if s.gi else 0):
        assert s.gi is not None
        base |= ((1 << s.gi.size) - 1) << s.gi.start
        taken.append(f"{s.profile.name} @{s.gi.start}:{s.gi.size}")
    order = sorted(
        new, key=lambda s: (-gpu.placements[s.profile.enum][0].size, -s.profile.slices, s.profile.enum)
    )
    # Highest start first, as the driver itself fills: a big GI then takes the 8th memory slice that
    # 1-slice GIs cannot use, and a lone 3g/2g leaves the low slices free for what comes later.
    options = [[(p, _mask(p)) for p in reversed(gpu.placements[s.profile.enum])] for s in order]
    same = [i > 0 and order[i].profile.enum == order[i - 1].profile.enum for i in range(len(order))]
    chosen: list[Placement] = []
    failed: set[tuple[int, int, int]] = set()
    deepest: list[Placement] = []
    stuck = [-1]

    def place(i: int, used: int, low: int) -> bool:
        if i == len(order):
            return True
        if (i, used, low) in failed:
            return False
        for k, (p, m) in enumerate(options[i]):
            if k < low or m & used:
                continue
            chosen.append(p)
            if place(i + 1, used | m, k + 1 if i + 1 < len(order) and same[i + 1] else 0):
                return True
            chosen.pop()
        if i > stuck[0]:
            stuck[0] = i
            deepest[:] = chosen
        failed.add((i, used, low))
        return False

    if place(0, base, 0):
        for s, p in zip(order, chosen, strict=True):
            s.placement = p
        return
    blocked = order[stuck[0]].profile
    around = taken + [f"{s.profile.name} @{p.start}:{p.size}" for s, p in zip(order, deepest, strict=False)]
    starts = ",".join(str(p.start) for p in gpu.placements[blocked.enum])
    size = gpu.placements[blocked.enum][0].size
    where = f" with {', '.join(around)}" if around else ""
    raise _Fail(f"no placement {{{starts}}}:{size} fits {blocked.name}{where}")

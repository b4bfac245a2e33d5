"""gpunode.feature_discovery.labels: GFD's label rules as tables (sanitiser, families, MIG, sharing)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import pytest

from gpunode.api.plugin_types import SharedResource, TimeSlicing
from gpunode.feature_discovery.labels import (
    LabelResult,
    NodeFacts,
    compute_labels,
    family,
    make_valid,
    sanitize,
    split_driver_version,
    valid_label_value,
)
from gpunode.nvml.api import GpuInfo, MigDevice, MigMode, PciInfo, SystemInfo

N = "nvidia.com/"
A100 = "NVIDIA A100-SXM4-40GB"
T4 = "Tesla T4"
SYSTEM = SystemInfo(driver_version="550.54.15", nvml_version="12.550.54.15", cuda_driver_version=12040)

# profile -> (GI slices, CI slices, memory MiB, SMs, copy, decoders, jpeg, ofa), A100-40GB figures
PROFILES = {
    "1g.5gb": (1, 1, 4864, 14, 1, 0, 0, 0),
    "1g.5gb+me": (1, 1, 4864, 14, 1, 1, 1, 1),
    "1g.10gb+me": (1, 1, 9856, 14, 1, 1, 0, 0),
    "2g.10gb": (2, 2, 9856, 28, 2, 1, 0, 0),
    "3g.20gb": (3, 3, 19968, 42, 3, 2, 0, 0),
}


# ------------------------------------------------------------------------------------------ fixtures


def gpu(
    i: int,
    *,
    name: str = A100,
    mig: bool | None = False,
    memory: int = 40960,
    cc: tuple[int, int] = (8, 0),
) -> GpuInfo:
    """GPU ``i``; ``mig=None``: not MIG-capable, else whether MIG is currently enabled."""
    return GpuInfo(
        index=i,
        minor=i,
        uuid=f"GPU-00000000-0000-0000-0000-{i:012d}",
        name=name,
        serial=None,
        pci=PciInfo(f"00000000:{i + 7:02X}:00.0", 0, i + 7, 0, 0x20B010DE, 0x134F10DE),
        numa_node=None,
        memory_total_mib=memory,
        compute_capability=cc,
        architecture="ampere",
        brand="nvidia",
        sm_count=108,
        mig=None if mig is None else MigMode(mig, mig),
    )


def migdev(parent: int, slot: int, profile: str) -> MigDevice:
    gi, ci, memory, sms, copy, dec, jpeg, ofa = PROFILES[profile]
    return MigDevice(
        parent_index=parent,
        parent_uuid=f"GPU-00000000-0000-0000-0000-{parent:012d}",
        index=slot,
        uuid=f"MIG-{parent:04d}-{slot:04d}",
        name=f"{A100} MIG {profile}",
        profile=profile,
        gi_id=slot + 1,
        ci_id=0,
        memory_mib=memory,
        sm_count=sms,
        gi_slices=gi,
        ci_slices=ci,
        copy_engines=copy,
        decoders=dec,
        encoders=0,
        jpeg=jpeg,
        ofa=ofa,
    )


def facts(
    gpus: Sequence[GpuInfo],
    migs: Mapping[int, Sequence[str]] | None = None,
    *,
    classes: Mapping[int, int | None] | None = None,
    machine: str | None = "DGX A100",
    system: SystemInfo | None = SYSTEM,
    cliques: Mapping[int, str | None] | None = None,
    vgpu: bool = False,
) -> NodeFacts:
    migs = migs or {}
    return NodeFacts(
        system=system,
        gpus=tuple(gpus),
        mig_devices={i: tuple(migdev(i, s, p) for s, p in enumerate(ps)) for i, ps in migs.items()},
        pci_classes=dict(classes) if classes is not None else {g.index: 0x030200 for g in gpus},
        machine=machine,
        vgpu_present=vgpu,
        cliques=cliques or {},
    )


def label(
    f: NodeFacts, strategy: str = "none", sharing: TimeSlicing | None = None, timestamp: int | None = None
) -> LabelResult:
    result = compute_labels(f, mig_strategy=strategy, sharing=sharing, timestamp=timestamp)
    bad = {k: v for k, v in result.labels.items() if not valid_label_value(v)}
    assert not bad, f"invalid label values written: {bad}"
    assert all(k.startswith(N) for k in result.labels)
    return result


def gpu_block(labels: Mapping[str, str], prefix: str = "gpu") -> dict[str, str]:
    keys = ("product", "count", "replicas", "sharing-strategy", "memory")
    return {k: labels[f"{N}{prefix}.{k}"] for k in keys if f"{N}{prefix}.{k}" in labels}


def ts(*resources: SharedResource, rename_by_default: bool = False) -> TimeSlicing:
    return TimeSlicing(rename_by_default=rename_by_default, resources=resources)


GPU4 = SharedResource(name="nvidia.com/gpu", replicas=4)


# ------------------------------------------------------------------------------------------ helpers


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a space separated string", "a-space-separated-string"),
        ("some(thing)else", "somethingelse"),
        ("some ( thing )else", "some-thing-else"),
        ("NVIDIA-TITAN-X-(Pascal)", "NVIDIA-TITAN-X-Pascal"),
        (" input  with multiple   spaces   ", "input-with-multiple-spaces"),
        ("some [ / thing / ]else", "some-thing-else"),
        ("some / thing /else", "some-thing-else"),
        ("some-thing.else_new", "some-thing.else_new"),
        ("NVIDIA A100-SXM4-40GB", "NVIDIA-A100-SXM4-40GB"),
        ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),
        ("Tesla T4", "Tesla-T4"),
        ("X9SRA/X9SRA-3", "X9SRAX9SRA-3"),
        ("", ""),
    ],
)
def test_sanitize(text: str, expected: str) -> None:
    assert sanitize(text) == expected


@pytest.mark.parametrize(
    ("cc", "expected"),
    [
        ((0, 0), "undefined"),
        ((1, 3), "tesla"),
        ((2, 1), "fermi"),
        ((3, 5), "kepler"),
        ((4, 0), "undefined"),
        ((5, 2), "maxwell"),
        ((6, 1), "pascal"),
        ((7, 0), "volta"),
        ((7, 2), "volta"),
        ((7, 4), "volta"),
        ((7, 5), "turing"),
        ((8, 0), "ampere"),
        ((8, 6), "ampere"),
        ((8, 8), "ampere"),
        ((8, 9), "ada-lovelace"),
        ((9, 0), "hopper"),
        ((10, 0), "blackwell"),
        ((11, 0), "undefined"),
        ((12, 0), "blackwell"),
        ((13, 0), "rubin"),
        ((14, 0), "undefined"),
    ],
    ids=lambda v: ".".join(map(str, v)) if isinstance(v, tuple) else v,
)
def test_family(cc: tuple[int, int], expected: str) -> None:
    assert family(*cc) == expected


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("550.54.15", ("550", "54", "15")),
        ("400.300", ("400", "300", "")),
        ("470.08", ("470", "08", "")),
        ("535.05.01", ("535", "05", "01")),
    ],
)
def test_split_driver_version(version: str, expected: tuple[str, str, str]) -> None:
    assert split_driver_version(version) == expected


@pytest.mark.parametrize("version", ["550", "1.2.3.4", "", "unknown"])
def test_split_driver_version_rejects(version: str) -> None:
    with pytest.raises(ValueError, match=r"major\.minor"):
        split_driver_version(version)


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        ("", True),
        ("a", True),
        ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", True),
        ("a" * 63, True),
        ("a" * 64, False),
        ("-a", False),
        ("a.", False),
        ("a b", False),
        ("NVIDIA-TITAN-X-(Pascal)", False),
        ("é", False),
    ],
)
def test_valid_label_value(value: str, valid: bool) -> None:
    assert valid_label_value(value) is valid


LONG_MODEL = "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition"  # k8s-device-plugin#1876


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("gpu.product", "NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-SXM4-40GB"),
        ("gpu.machine", "X9SRA/X9SRA-3", "X9SRAX9SRA-3"),
        ("gpu.machine", "(Pascal)", "Pascal"),
        ("gpu.machine", "-edge_.", "edge"),
        ("gpu.machine", "two words", "two-words"),
        ("gpu.machine", "()", ""),
        ("gpu.machine", "", ""),
    ],
)
def test_make_valid_short(key: str, value: str, expected: str) -> None:
    assert make_valid(N + key, value) == expected


def test_make_valid_truncates_with_a_hash_and_stays_unique() -> None:
    a, b = "x" * 60 + "-first-variant", "x" * 60 + "-second-variant"
    va, vb = make_valid(N + "gpu.machine", a), make_valid(N + "gpu.machine", b)
    assert va != vb
    for v in (va, vb):
        assert valid_label_value(v)
        assert len(v) == 63
        assert v.startswith("x" * 40)
    assert make_valid(N + "gpu.machine", a) == va  # deterministic
    assert make_valid(N + "gpu.machine", va) == va  # idempotent


def test_make_valid_keeps_the_product_tail() -> None:
    product = sanitize(LONG_MODEL) + "-MIG-1g.24gb-SHARED"
    assert len(product) > 63
    written = make_valid(N + "mig-1g.24gb.product", product)
    assert valid_label_value(written)
    assert written.startswith("NVIDIA-RTX-PRO-6000")
    assert written.endswith("-MIG-1g.24gb-SHARED")
    other = make_valid(N + "mig-1g.24gb.product", sanitize(LONG_MODEL + " Two") + "-MIG-1g.24gb-SHARED")
    assert other != written


def test_make_valid_long_value_with_bad_characters() -> None:
    value = "(" + "A/" * 50 + ")"
    written = make_valid(N + "gpu.machine", value)
    assert valid_label_value(written)
    assert written.startswith("AAAA")


# ------------------------------------------------------------------------------------- whole label sets


def test_no_gpus_only_vgpu_and_timestamp() -> None:
    assert label(facts([])).labels == {N + "vgpu.present": "false"}
    result = label(facts([], vgpu=True), timestamp=1_700_000_000)
    assert result.labels == {N + "vgpu.present": "true", N + "gfd.timestamp": "1700000000"}
    assert any("no GPUs" in w for w in result.warnings)


def test_full_node_none_strategy() -> None:
    result = label(facts([gpu(i) for i in range(8)]), timestamp=1_700_000_000)
    assert result.labels == {
        N + "gfd.timestamp": "1700000000",
        N + "cuda.driver.major": "550",
        N + "cuda.driver.minor": "54",
        N + "cuda.driver.rev": "15",
        N + "cuda.driver-version.major": "550",
        N + "cuda.driver-version.minor": "54",
        N + "cuda.driver-version.revision": "15",
        N + "cuda.driver-version.full": "550.54.15",
        N + "cuda.runtime.major": "12",
        N + "cuda.runtime.minor": "4",
        N + "cuda.runtime-version.major": "12",
        N + "cuda.runtime-version.minor": "4",
        N + "cuda.runtime-version.full": "12.4",
        N + "gpu.machine": "DGX-A100",
        N + "gpu.count": "8",
        N + "gpu.product": "NVIDIA-A100-SXM4-40GB",
        N + "gpu.memory": "40960",
        N + "gpu.replicas": "1",
        N + "gpu.sharing-strategy": "none",
        N + "gpu.family": "ampere",
        N + "gpu.compute.major": "8",
        N + "gpu.compute.minor": "0",
        N + "gpu.mode": "compute",
        N + "mig.capable": "true",
        N + "mps.capable": "false",
        N + "vgpu.present": "false",
    }
    assert result.warnings == ()
    assert result.adjusted == ()


def test_two_part_driver_version_has_empty_revision() -> None:
    system = SystemInfo(driver_version="400.300", nvml_version="8.400.300", cuda_driver_version=8000)
    labels = label(facts([gpu(0)], system=system)).labels
    assert labels[N + "cuda.driver.rev"] == ""
    assert labels[N + "cuda.driver-version.revision"] == ""
    assert labels[N + "cuda.driver-version.full"] == "400.300"
    assert labels[N + "cuda.runtime-version.full"] == "8.0"


def test_bad_driver_version_drops_only_the_driver_labels() -> None:
    system = SystemInfo(driver_version="550", nvml_version="12.550", cuda_driver_version=12040)
    result = label(facts([gpu(0)], system=system))
    assert not any(k.startswith(N + "cuda.driver") for k in result.labels)
    assert result.labels[N + "cuda.runtime-version.full"] == "12.4"
    assert any("550" in w for w in result.warnings)


@pytest.mark.parametrize(
    ("machine", "expected"),
    [
        (None, "unknown"),
        ("", "unknown"),
        ("   \n", "unknown"),
        ("DGX A100\n", "DGX-A100"),
        ("X9SRA/X9SRA-3", "X9SRAX9SRA-3"),
    ],
)
def test_machine(machine: str | None, expected: str) -> None:
    assert label(facts([gpu(0)], machine=machine)).labels[N + "gpu.machine"] == expected


@pytest.mark.parametrize(
    ("classes", "mode"),
    [
        ([0x030000], "graphics"),
        ([0x030200], "compute"),
        ([0x068000], "unknown"),
        ([0x030200] * 3, "compute"),
        ([0x030000] * 3, "graphics"),
        ([0x030000, 0x030200, 0x030000], "unknown"),
        ([0x030200, None], "unknown"),
    ],
)
def test_gpu_mode(classes: list[int | None], mode: str) -> None:
    gpus = [gpu(i) for i in range(len(classes))]
    result = label(facts(gpus, classes=dict(enumerate(classes))))
    assert result.labels[N + "gpu.mode"] == mode
    assert (mode == "unknown") == bool(result.warnings)


def test_mig_capable_false_without_mig_support() -> None:
    labels = label(facts([gpu(i, name=T4, mig=None, cc=(7, 5)) for i in range(2)])).labels
    assert labels[N + "mig.capable"] == "false"
    assert labels[N + "gpu.family"] == "turing"


def test_zero_memory_and_zero_compute_capability_are_omitted() -> None:
    labels = label(facts([gpu(0, memory=0, cc=(0, 0))])).labels
    assert N + "gpu.memory" not in labels
    assert not any(k.startswith((N + "gpu.family", N + "gpu.compute")) for k in labels)


def test_vgpu_present() -> None:
    assert label(facts([gpu(0)], vgpu=True)).labels[N + "vgpu.present"] == "true"


def test_invalid_strategy() -> None:
    with pytest.raises(ValueError, match="bogus"):
        compute_labels(facts([gpu(0)]), mig_strategy="bogus", sharing=None, timestamp=None)


# ------------------------------------------------------------------------------------------------ MIG

INVALID = {
    "product": "NVIDIA-A100-SXM4-40GB-MIG-INVALID",
    "count": "0",
    "replicas": "0",
    "sharing-strategy": "",
    "memory": "0",
}


@pytest.mark.parametrize(
    ("gpus", "migs"),
    [
        pytest.param([gpu(0, mig=True)], {}, id="mig-enabled-but-empty"),
        pytest.param([gpu(0, mig=True)], {0: ["1g.5gb", "3g.20gb"]}, id="two-profiles"),
        pytest.param([gpu(0, mig=True), gpu(1)], {0: ["1g.5gb"]}, id="mig-enabled-and-disabled"),
        pytest.param(
            [gpu(0, mig=True), gpu(1), gpu(2, mig=True)], {0: ["1g.5gb"]}, id="enabled-disabled-and-empty"
        ),
        pytest.param(
            [gpu(0, mig=True), gpu(1, mig=True)], {0: ["1g.5gb"], 1: ["2g.10gb"]}, id="profiles-per-gpu"
        ),
    ],
)
def test_single_invalid(gpus: list[GpuInfo], migs: dict[int, list[str]]) -> None:
    for sharing in (None, ts(GPU4)):
        result = label(facts(gpus, migs), "single", sharing)
        assert gpu_block(result.labels) == INVALID
        assert result.labels[N + "mig.strategy"] == "single"
        assert result.labels[N + "gpu.family"] == "ampere"  # full-GPU labels stay
        assert not any(k.startswith((N + "gpu.slices", N + "gpu.engines")) for k in result.labels)
        assert any("invalid MIG configuration" in w for w in result.warnings)


def test_single_without_mig_enabled_labels_as_none() -> None:
    gpus = [gpu(0), gpu(1)]
    none = label(facts(gpus)).labels
    single = label(facts(gpus), "single").labels
    assert single == {**none, N + "mig.strategy": "single"}


def test_single_valid() -> None:
    gpus = [gpu(0, mig=True), gpu(1, mig=True)]
    result = label(facts(gpus, {0: ["3g.20gb"] * 2, 1: ["3g.20gb"] * 2}), "single")
    assert gpu_block(result.labels) == {
        "product": "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb",
        "count": "4",
        "replicas": "1",
        "sharing-strategy": "none",
        "memory": "19968",
    }
    assert result.labels[N + "gpu.multiprocessors"] == "42"
    assert result.labels[N + "gpu.slices.gi"] == "3"
    assert result.labels[N + "gpu.engines.decoder"] == "2"
    assert result.labels[N + "gpu.family"] == "ampere"


def test_single_me_profile_product_uses_a_dot() -> None:
    result = label(facts([gpu(0, mig=True)], {0: ["1g.5gb+me"]}), "single")
    assert result.labels[N + "gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb.me"
    assert result.labels[N + "gpu.engines.ofa"] == "1"


def test_mixed_me_profile_keys_use_a_dot() -> None:
    labels = label(facts([gpu(0, mig=True)], {0: ["1g.10gb+me", "1g.5gb+me", "3g.20gb"]}), "mixed").labels
    assert labels[N + "mig-1g.10gb.me.count"] == "1"
    assert labels[N + "mig-1g.10gb.me.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.10gb.me"
    assert labels[N + "mig-1g.5gb.me.memory"] == "4864"
    assert labels[N + "mig-3g.20gb.slices.ci"] == "3"
    assert not any("+" in k for k in labels)
    assert len([k for k in labels if k.startswith(N + "mig-")]) == 3 * 13


def test_mixed_ignores_empty_mig_gpus_and_keeps_the_full_view() -> None:
    gpus = [gpu(0, mig=True), gpu(1, mig=True), gpu(2)]
    labels = label(facts(gpus, {0: ["1g.5gb", "1g.5gb"]}), "mixed").labels
    assert labels[N + "mig-1g.5gb.count"] == "2"
    assert labels[N + "gpu.count"] == "3"
    assert labels[N + "gpu.product"] == "NVIDIA-A100-SXM4-40GB"


# -------------------------------------------------------------------------------------------- sharing


@pytest.mark.parametrize(
    ("sharing", "replicas", "strategy", "product"),
    [
        pytest.param(None, "1", "none", "NVIDIA-A100-SXM4-40GB", id="no-sharing"),
        pytest.param(
            ts(SharedResource(name="nvidia.com/not-gpu", replicas=2)),
            "1",
            "none",
            "NVIDIA-A100-SXM4-40GB",
            id="other-resource",
        ),
        pytest.param(ts(GPU4), "4", "time-slicing", "NVIDIA-A100-SXM4-40GB-SHARED", id="replicas-4"),
        pytest.param(
            ts(GPU4, rename_by_default=True),
            "4",
            "time-slicing",
            "NVIDIA-A100-SXM4-40GB",
            id="renameByDefault",
        ),
        pytest.param(
            ts(SharedResource(name="nvidia.com/gpu", replicas=2, rename="nvidia.com/gpu.shared")),
            "2",
            "time-slicing",
            "NVIDIA-A100-SXM4-40GB",
            id="renamed-entry",
        ),
    ],
)
def test_sharing_full_gpus(sharing: TimeSlicing | None, replicas: str, strategy: str, product: str) -> None:
    labels = label(facts([gpu(0), gpu(1)]), sharing=sharing).labels
    assert gpu_block(labels) == {
        "product": product,
        "count": "2",
        "replicas": replicas,
        "sharing-strategy": strategy,
        "memory": "40960",
    }
    assert labels[N + "mps.capable"] == "false"


@pytest.mark.parametrize("strategy", ["none", "mixed"])
def test_sharing_mig_enabled_gpus_in_the_full_view_have_no_replicas(strategy: str) -> None:
    gpus = [gpu(0, mig=True), gpu(1, mig=True)]
    labels = label(facts(gpus, {0: ["1g.5gb"], 1: ["1g.5gb"]}), strategy, ts(GPU4)).labels
    assert gpu_block(labels) == {
        "product": "NVIDIA-A100-SXM4-40GB",
        "count": "2",
        "replicas": "0",
        "sharing-strategy": "none",
        "memory": "40960",
    }


def test_sharing_full_gpu_beside_mig_gpu_of_the_same_model_wins() -> None:
    labels = label(facts([gpu(0, mig=True), gpu(1)], {0: ["1g.5gb"]}), "none", ts(GPU4)).labels
    assert gpu_block(labels) == {
        "product": "NVIDIA-A100-SXM4-40GB-SHARED",
        "count": "2",
        "replicas": "4",
        "sharing-strategy": "time-slicing",
        "memory": "40960",
    }


def test_sharing_mig_single() -> None:
    gpus = [gpu(0, mig=True), gpu(1, mig=True)]
    labels = label(facts(gpus, {0: ["1g.5gb"] * 7, 1: ["1g.5gb"] * 7}), "single", ts(GPU4)).labels
    assert gpu_block(labels) == {
        "product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED",
        "count": "14",
        "replicas": "4",
        "sharing-strategy": "time-slicing",
        "memory": "4864",
    }


def test_sharing_mig_mixed_only_the_named_profile() -> None:
    gpus = [gpu(0, mig=True)]
    sharing = ts(SharedResource(name="nvidia.com/mig-1g.5gb", replicas=2))
    labels = label(facts(gpus, {0: ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"]}), "mixed", sharing).labels
    assert gpu_block(labels, "mig-1g.5gb") == {
        "product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED",
        "count": "2",
        "replicas": "2",
        "sharing-strategy": "time-slicing",
        "memory": "4864",
    }
    for other in ("mig-2g.10gb", "mig-3g.20gb"):
        block = gpu_block(labels, other)
        assert (block["replicas"], block["sharing-strategy"], block["count"]) == ("1", "none", "1")
        assert not block["product"].endswith("SHARED")
    assert (labels[N + "gpu.replicas"], labels[N + "gpu.sharing-strategy"]) == ("0", "none")


def test_sharing_entries_that_disagree_warn() -> None:
    sharing = ts(
        SharedResource(name="nvidia.com/gpu", replicas=2, devices=("0",), rename="nvidia.com/gpu-a"),
        SharedResource(name="nvidia.com/gpu", replicas=8, devices=("1",), rename="nvidia.com/gpu-b"),
    )
    result = label(facts([gpu(0), gpu(1)]), sharing=sharing)
    assert result.labels[N + "gpu.replicas"] == "2"
    assert any("several time-slicing entries" in w for w in result.warnings)


# ----------------------------------------------------------------------------------- heterogeneous


@pytest.mark.parametrize(
    ("names", "product", "count"),
    [
        pytest.param([A100, A100, T4, T4], "NVIDIA-A100-SXM4-40GB", "2", id="tie-lowest-index-a100"),
        pytest.param([T4, A100, A100, T4], "Tesla-T4", "2", id="tie-lowest-index-t4"),
        pytest.param([A100, T4, T4, T4], "Tesla-T4", "3", id="most-gpus"),
    ],
)
def test_heterogeneous_node_is_deterministic(names: list[str], product: str, count: str) -> None:
    gpus = [
        gpu(i, name=n, mig=None if n == T4 else False, cc=(7, 5) if n == T4 else (8, 0))
        for i, n in enumerate(names)
    ]
    for order in (gpus, list(reversed(gpus))):
        result = label(facts(order))
        assert result.labels[N + "gpu.product"] == product
        assert result.labels[N + "gpu.count"] == count
        assert result.labels[N + "mig.capable"] == "true"  # any GPU
        assert any("multiple GPU models" in w for w in result.warnings)


# ------------------------------------------------------------------------------- clique, validity


CLUSTER = "7b968a6d-c8aa-45e1-9e07-e1e51be99c31"


@pytest.mark.parametrize(
    ("cliques", "expected", "warns"),
    [
        ({}, None, False),
        ({0: None, 1: None}, None, False),
        ({0: f"{CLUSTER}.1", 1: f"{CLUSTER}.1"}, "1", False),
        ({0: f"{CLUSTER}.1", 1: None}, "1", False),
        ({0: f"{CLUSTER}.1", 1: f"{CLUSTER}.2"}, None, True),
    ],
)
def test_clique(cliques: dict[int, str | None], expected: str | None, warns: bool) -> None:
    result = label(facts([gpu(0), gpu(1)], cliques=cliques))
    value = result.labels.get(N + "gpu.clique")
    if expected is None:
        assert value is None
    else:
        assert value == f"{CLUSTER}.{expected}"
    assert any("clique" in w for w in result.warnings) is warns


def test_long_product_is_adjusted_and_recorded() -> None:
    g = replace(gpu(0, mig=True), name=LONG_MODEL)
    result = label(facts([g], {0: ["1g.5gb"] * 2}), "mixed")
    key = N + "mig-1g.5gb.product"
    original = sanitize(LONG_MODEL) + "-MIG-1g.5gb"
    assert result.adjusted == ((key, original, result.labels[key]),)
    assert result.labels[key].endswith("-MIG-1g.5gb")
    assert result.labels[N + "gpu.product"] == sanitize(LONG_MODEL)  # 55 characters: unchanged


# ------------------------------------------------------------------------------------------------ MPS


def mps(*resources: SharedResource, rename_by_default: bool = False) -> TimeSlicing:
    return TimeSlicing(rename_by_default, True, resources, "mps")


@pytest.mark.parametrize(
    ("sharing", "product"),
    [
        pytest.param(mps(GPU4), "NVIDIA-A100-SXM4-40GB-SHARED", id="default-name"),
        pytest.param(mps(GPU4, rename_by_default=True), "NVIDIA-A100-SXM4-40GB", id="renamed"),
    ],
)
def test_mps_labels_as_nvidias_gfd(sharing: TimeSlicing, product: str) -> None:
    labels = label(facts([gpu(0), gpu(1)]), sharing=sharing).labels
    assert gpu_block(labels) == {
        "product": product,
        "count": "2",
        "replicas": "4",
        "sharing-strategy": "mps",
        "memory": "40960",
    }
    assert labels[N + "mps.capable"] == "true"


@pytest.mark.parametrize("strategy", ["none", "single"])
def test_mps_with_mig_enabled_is_refused_as_nvidias_gfd_fails(strategy: str) -> None:
    from gpunode.feature_discovery.labels import MpsMigRefused

    gpus = [gpu(0), gpu(1, mig=True)]
    with pytest.raises(MpsMigRefused, match=r"^sharing\.mps: MPS sharing is not supported for MIG devices"):
        label(facts(gpus, {1: ["3g.20gb"]}), strategy, mps(GPU4))

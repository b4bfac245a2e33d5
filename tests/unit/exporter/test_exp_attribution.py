"""attribute(): PodResources answers mapped onto GPUs and MIG devices, by table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from gpunode._proto.podresources.v1 import api_pb2 as pb
from gpunode.exporter.podresources import Attribution, PodRef, attribute, is_gpu_resource

GPU0 = "GPU-11111111-0000-0000-0000-000000000000"
GPU1 = "GPU-22222222-0000-0000-0000-000000000000"
MIG_A = "MIG-aaaaaaaa-0000-0000-0000-000000000000"
MIG_B = "MIG-bbbbbbbb-0000-0000-0000-000000000000"
MIGS = {MIG_A: (0, 1), MIG_B.removeprefix("MIG-"): (1, 7)}  # the prefix is optional in the table
GKE = {"nvidia0": GPU0, "nvidia1": GPU1}


def dev(resource: str, *ids: str) -> dict[str, Any]:
    return {"resource_name": resource, "device_ids": list(ids)}


def pod(name: str, namespace: str, *containers: tuple[str, list[dict[str, Any]]]) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": namespace,
        "containers": [{"name": c, "devices": d} for c, d in containers],
    }


def ref(p: str, ns: str, c: str, vgpu: str | None = None) -> PodRef:
    return PodRef(pod=p, namespace=ns, container=c, vgpu=vgpu)


@dataclass
class Case:
    id: str
    pods: list[dict[str, Any]]
    gpus: dict[str, tuple[PodRef, ...]] = field(default_factory=dict)
    mig: dict[tuple[int, int], tuple[PodRef, ...]] = field(default_factory=dict)
    unmatched: int = 0
    resource_names: tuple[str, ...] = ()
    gke: dict[str, str] | None = None


CASES = [
    Case("empty", []),
    Case("pod-without-devices", [pod("p", "ns", ("c", []))]),
    Case(
        "full-gpus",
        [pod("train", "ml", ("main", [dev("nvidia.com/gpu", GPU0, GPU1)]))],
        gpus={GPU0: (ref("train", "ml", "main"),), GPU1: (ref("train", "ml", "main"),)},
    ),
    Case(
        "time-slicing-replicas-keep-every-pod",
        [
            pod("b", "ml", ("c", [dev("nvidia.com/gpu", f"{GPU0}::3")])),
            pod("a", "ml", ("c", [dev("nvidia.com/gpu", f"{GPU0}::10")])),
            pod("z", "dev", ("c", [dev("nvidia.com/gpu", f"{GPU0}::0")])),
        ],
        gpus={GPU0: (ref("z", "dev", "c", "0"), ref("a", "ml", "c", "10"), ref("b", "ml", "c", "3"))},
    ),
    Case(
        "replicas-of-one-gpu-in-one-container-ordered-numerically",
        [pod("p", "ns", ("c", [dev("nvidia.com/gpu", f"{GPU0}::10", f"{GPU0}::2")]))],
        gpus={GPU0: (ref("p", "ns", "c", "2"), ref("p", "ns", "c", "10"))},
    ),
    Case(
        "renamed-shared-resource-accepted-by-prefix",
        [pod("p", "ns", ("c", [dev("nvidia.com/gpu.shared", f"{GPU1}::1")]))],
        gpus={GPU1: (ref("p", "ns", "c", "1"),)},
    ),
    Case(
        "extra-resource-name",
        [pod("p", "ns", ("c", [dev("example.com/gpu-slice", GPU0)]))],
        gpus={GPU0: (ref("p", "ns", "c"),)},
        resource_names=("example.com/gpu-slice",),
    ),
    Case(
        "foreign-resources-ignored-not-counted",
        [
            pod(
                "p",
                "ns",
                (
                    "c",
                    [
                        dev("example.com/foo", GPU0, "x"),
                        dev("nvidia.com/gpux", GPU1),
                        dev("amd.com/gpu", "0"),
                    ],
                ),
            )
        ],
    ),
    Case(
        "mig-uuids-with-and-without-table-prefix",
        [
            pod("p", "ns", ("c", [dev("nvidia.com/mig-1g.10gb", MIG_A)])),
            pod("q", "ns", ("c", [dev("nvidia.com/mig-3g.40gb", MIG_B)])),
        ],
        mig={(0, 1): (ref("p", "ns", "c"),), (1, 7): (ref("q", "ns", "c"),)},
    ),
    Case(
        "shared-mig-replica",
        [pod("p", "ns", ("c", [dev("nvidia.com/mig-1g.10gb.shared", f"{MIG_A}::4")]))],
        mig={(0, 1): (ref("p", "ns", "c", "4"),)},
    ),
    Case(
        "mig-single-strategy-under-nvidia.com/gpu",
        [pod("p", "ns", ("c", [dev("nvidia.com/gpu", MIG_A)]))],
        mig={(0, 1): (ref("p", "ns", "c"),)},
    ),
    Case(
        "unknown-ids-counted",
        [
            pod(
                "p",
                "ns",
                (
                    "c",
                    [
                        dev(
                            "nvidia.com/gpu", GPU0, "MIG-ffffffff", "bogus", "GPU-", f"{GPU1}::", f"{GPU1}::x"
                        ),
                        dev("nvidia.com/gpu", "nvidia0"),  # a GKE name without a device-name table
                    ],
                ),
            )
        ],
        gpus={GPU0: (ref("p", "ns", "c"),)},
        unmatched=6,
    ),
    Case(
        "several-containers-and-pods-ordered",
        [
            pod("web", "b", ("side", [dev("nvidia.com/gpu", GPU0)]), ("main", [dev("nvidia.com/gpu", GPU0)])),
            pod("job", "a", ("worker", [dev("nvidia.com/gpu", GPU0)])),
            pod("api", "b", ("main", [dev("nvidia.com/gpu", GPU0)])),
        ],
        gpus={
            GPU0: (
                ref("job", "a", "worker"),
                ref("api", "b", "main"),
                ref("web", "b", "main"),
                ref("web", "b", "side"),
            )
        },
    ),
    Case(
        "same-id-twice-kept-once",
        [pod("p", "ns", ("c", [dev("nvidia.com/gpu", GPU0), dev("nvidia.com/gpu.shared", GPU0)]))],
        gpus={GPU0: (ref("p", "ns", "c"),)},
    ),
    Case(
        "gke-full-and-shared",
        [
            pod("p", "ns", ("c", [dev("nvidia.com/gpu", "nvidia0")])),
            pod("q", "ns", ("c", [dev("nvidia.com/gpu", "nvidia1/vgpu2")])),
            pod("r", "ns", ("c", [dev("nvidia.com/gpu", "nvidia7", "nvidia1/vgpux")])),
        ],
        gpus={GPU0: (ref("p", "ns", "c"),), GPU1: (ref("q", "ns", "c", "2"),)},
        unmatched=2,
        gke=GKE,
    ),
    Case(
        "gke-mig-and-shared-mig",
        [
            pod("p", "ns", ("c", [dev("nvidia.com/gpu", "nvidia0/gi3")])),
            pod("q", "ns", ("c", [dev("nvidia.com/gpu", "nvidia1/gi2/vgpu5")])),
        ],
        mig={(0, 3): (ref("p", "ns", "c"),), (1, 2): (ref("q", "ns", "c", "5"),)},
        gke=GKE,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_attribute(case: Case) -> None:
    response = pb.ListPodResourcesResponse(pod_resources=case.pods)
    got = attribute(
        response, resource_names=case.resource_names, mig_by_uuid=MIGS, gpu_by_device_name=case.gke
    )
    assert dict(got.by_gpu_uuid) == case.gpus
    assert dict(got.by_mig) == case.mig
    assert got.unmatched == case.unmatched


def test_lookups_default_to_no_pods() -> None:
    got = attribute(
        pb.ListPodResourcesResponse(
            pod_resources=[pod("p", "ns", ("c", [dev("nvidia.com/gpu", GPU0, MIG_A)]))]
        ),
        resource_names=(),
        mig_by_uuid=MIGS,
    )
    assert got.pods_for_gpu(GPU0) == (ref("p", "ns", "c"),)
    assert got.pods_for_gpu(GPU1) == ()
    assert got.pods_for_mig(0, 1) == (ref("p", "ns", "c"),)
    assert got.pods_for_mig(0, 2) == ()
    assert Attribution().pods_for_gpu(GPU0) == ()
    assert Attribution().unmatched == 0


@pytest.mark.parametrize(
    ("name", "kept"),
    [
        ("nvidia.com/gpu", True),
        ("nvidia.com/gpu.shared", True),
        ("nvidia.com/gpu.mps", True),
        ("nvidia.com/mig-1g.5gb", True),
        ("nvidia.com/mig-3g.40gb.shared", True),
        ("nvidia.com/gpus", False),
        ("nvidia.com/gpu-x", False),
        ("nvidia.com/migration", False),
        ("example.com/foo", False),
        ("cpu", False),
    ],
)
def test_is_gpu_resource(name: str, kept: bool) -> None:
    assert is_gpu_resource(name) is kept


def test_plain_objects_are_enough() -> None:
    """attribute() reads the response structurally; it needs no protobuf messages."""

    @dataclass
    class D:
        resource_name: str
        device_ids: list[str]

    @dataclass
    class C:
        name: str
        devices: list[D]

    @dataclass
    class P:
        name: str
        namespace: str
        containers: list[C]

    @dataclass
    class R:
        pod_resources: list[P]

    got = attribute(
        R([P("p", "ns", [C("c", [D("nvidia.com/gpu", [f"{GPU0}::1"])])])]), resource_names=(), mig_by_uuid={}
    )
    assert got.by_gpu_uuid == {GPU0: (ref("p", "ns", "c", "1"),)}

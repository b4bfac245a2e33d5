"""The generated kubelet API code: faithful to the wire contract (that it is up to date with the .proto
files is checked by regenerating it, in tests/integration/proto).

The field tables below are transcribed from shared/reference/device-plugin.md §1.3 (Device Plugin
v1beta1) and §1.5 (PodResources v1), independently of the .proto files they check.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor, ServiceDescriptor

from gpunode._proto.deviceplugin.v1beta1 import api_pb2 as dp
from gpunode._proto.podresources.v1 import api_pb2 as pr

F = FieldDescriptor
STRING, BOOL, INT32, INT64, UINT64, MESSAGE = (
    F.TYPE_STRING,
    F.TYPE_BOOL,
    F.TYPE_INT32,
    F.TYPE_INT64,
    F.TYPE_UINT64,
    F.TYPE_MESSAGE,
)

# (message, field, number, type, repeated, message type name or "map" or None)
Row = tuple[str, str, int, int, bool, str | None]

DEVICE_PLUGIN_FIELDS: list[Row] = [
    ("DevicePluginOptions", "pre_start_required", 1, BOOL, False, None),
    ("DevicePluginOptions", "get_preferred_allocation_available", 2, BOOL, False, None),
    ("RegisterRequest", "version", 1, STRING, False, None),
    ("RegisterRequest", "endpoint", 2, STRING, False, None),
    ("RegisterRequest", "resource_name", 3, STRING, False, None),
    ("RegisterRequest", "options", 4, MESSAGE, False, "DevicePluginOptions"),
    ("ListAndWatchResponse", "devices", 1, MESSAGE, True, "Device"),
    ("TopologyInfo", "nodes", 1, MESSAGE, True, "NUMANode"),
    ("NUMANode", "ID", 1, INT64, False, None),
    ("Device", "ID", 1, STRING, False, None),
    ("Device", "health", 2, STRING, False, None),
    ("Device", "topology", 3, MESSAGE, False, "TopologyInfo"),
    ("PreStartContainerRequest", "devices_ids", 1, STRING, True, None),
    (
        "PreferredAllocationRequest",
        "container_requests",
        1,
        MESSAGE,
        True,
        "ContainerPreferredAllocationRequest",
    ),
    ("ContainerPreferredAllocationRequest", "available_deviceIDs", 1, STRING, True, None),
    ("ContainerPreferredAllocationRequest", "must_include_deviceIDs", 2, STRING, True, None),
    ("ContainerPreferredAllocationRequest", "allocation_size", 3, INT32, False, None),
    (
        "PreferredAllocationResponse",
        "container_responses",
        1,
        MESSAGE,
        True,
        "ContainerPreferredAllocationResponse",
    ),
    ("ContainerPreferredAllocationResponse", "deviceIDs", 1, STRING, True, None),
    ("AllocateRequest", "container_requests", 1, MESSAGE, True, "ContainerAllocateRequest"),
    ("ContainerAllocateRequest", "devices_ids", 1, STRING, True, None),
    ("AllocateResponse", "container_responses", 1, MESSAGE, True, "ContainerAllocateResponse"),
    ("ContainerAllocateResponse", "envs", 1, MESSAGE, True, "map"),
    ("ContainerAllocateResponse", "mounts", 2, MESSAGE, True, "Mount"),
    ("ContainerAllocateResponse", "devices", 3, MESSAGE, True, "DeviceSpec"),
    ("ContainerAllocateResponse", "annotations", 4, MESSAGE, True, "map"),
    ("ContainerAllocateResponse", "cdi_devices", 5, MESSAGE, True, "CDIDevice"),
    ("CDIDevice", "name", 1, STRING, False, None),
    ("Mount", "container_path", 1, STRING, False, None),
    ("Mount", "host_path", 2, STRING, False, None),
    ("Mount", "read_only", 3, BOOL, False, None),
    ("DeviceSpec", "container_path", 1, STRING, False, None),
    ("DeviceSpec", "host_path", 2, STRING, False, None),
    ("DeviceSpec", "permissions", 3, STRING, False, None),
]
DEVICE_PLUGIN_EMPTY = ["Empty", "PreStartContainerResponse"]

POD_RESOURCES_FIELDS: list[Row] = [
    ("AllocatableResourcesResponse", "devices", 1, MESSAGE, True, "ContainerDevices"),
    ("AllocatableResourcesResponse", "cpu_ids", 2, INT64, True, None),
    ("AllocatableResourcesResponse", "memory", 3, MESSAGE, True, "ContainerMemory"),
    ("ListPodResourcesResponse", "pod_resources", 1, MESSAGE, True, "PodResources"),
    ("PodResources", "name", 1, STRING, False, None),
    ("PodResources", "namespace", 2, STRING, False, None),
    ("PodResources", "containers", 3, MESSAGE, True, "ContainerResources"),
    ("ContainerResources", "name", 1, STRING, False, None),
    ("ContainerResources", "devices", 2, MESSAGE, True, "ContainerDevices"),
    ("ContainerResources", "cpu_ids", 3, INT64, True, None),
    ("ContainerResources", "memory", 4, MESSAGE, True, "ContainerMemory"),
    ("ContainerResources", "dynamic_resources", 5, MESSAGE, True, "DynamicResource"),
    ("ContainerMemory", "memory_type", 1, STRING, False, None),
    ("ContainerMemory", "size", 2, UINT64, False, None),
    ("ContainerMemory", "topology", 3, MESSAGE, False, "TopologyInfo"),
    ("ContainerDevices", "resource_name", 1, STRING, False, None),
    ("ContainerDevices", "device_ids", 2, STRING, True, None),
    ("ContainerDevices", "topology", 3, MESSAGE, False, "TopologyInfo"),
    ("TopologyInfo", "nodes", 1, MESSAGE, True, "NUMANode"),
    ("NUMANode", "ID", 1, INT64, False, None),
    ("DynamicResource", "claim_name", 2, STRING, False, None),
    ("DynamicResource", "claim_namespace", 3, STRING, False, None),
    ("DynamicResource", "claim_resources", 4, MESSAGE, True, "ClaimResource"),
    ("ClaimResource", "cdi_devices", 1, MESSAGE, True, "CDIDevice"),
    ("ClaimResource", "driver_name", 2, STRING, False, None),
    ("ClaimResource", "pool_name", 3, STRING, False, None),
    ("ClaimResource", "device_name", 4, STRING, False, None),
    ("CDIDevice", "name", 1, STRING, False, None),
    ("GetPodResourcesRequest", "pod_name", 1, STRING, False, None),
    ("GetPodResourcesRequest", "pod_namespace", 2, STRING, False, None),
    ("GetPodResourcesResponse", "pod_resources", 1, MESSAGE, False, "PodResources"),
]
POD_RESOURCES_EMPTY = ["ListPodResourcesRequest", "AllocatableResourcesRequest"]

# (module, service, method, input, output, server streaming)
METHODS = [
    (dp, "Registration", "Register", "RegisterRequest", "Empty", False),
    (dp, "DevicePlugin", "GetDevicePluginOptions", "Empty", "DevicePluginOptions", False),
    (dp, "DevicePlugin", "ListAndWatch", "Empty", "ListAndWatchResponse", True),
    (
        dp,
        "DevicePlugin",
        "GetPreferredAllocation",
        "PreferredAllocationRequest",
        "PreferredAllocationResponse",
        False,
    ),
    (dp, "DevicePlugin", "Allocate", "AllocateRequest", "AllocateResponse", False),
    (dp, "DevicePlugin", "PreStartContainer", "PreStartContainerRequest", "PreStartContainerResponse", False),
    (pr, "PodResourcesLister", "List", "ListPodResourcesRequest", "ListPodResourcesResponse", False),
    (
        pr,
        "PodResourcesLister",
        "GetAllocatableResources",
        "AllocatableResourcesRequest",
        "AllocatableResourcesResponse",
        False,
    ),
    (pr, "PodResourcesLister", "Get", "GetPodResourcesRequest", "GetPodResourcesResponse", False),
]


def _tables() -> Sequence[object]:
    return [pytest.param(dp, *row, id=f"v1beta1.{row[0]}.{row[1]}") for row in DEVICE_PLUGIN_FIELDS] + [
        pytest.param(pr, *row, id=f"v1.{row[0]}.{row[1]}") for row in POD_RESOURCES_FIELDS
    ]


def test_package_names_are_the_wire_names() -> None:
    assert dp.DESCRIPTOR.package == "v1beta1"
    assert pr.DESCRIPTOR.package == "v1"
    assert dp.DESCRIPTOR.GetOptions().go_package == "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
    assert pr.DESCRIPTOR.GetOptions().go_package == "k8s.io/kubelet/pkg/apis/podresources/v1"


@pytest.mark.parametrize(
    ("module", "message", "field", "number", "type_", "repeated", "message_type"), _tables()
)
def test_field_matches_the_reference_table(
    module: ModuleType,
    message: str,
    field: str,
    number: int,
    type_: int,
    repeated: bool,
    message_type: str | None,
) -> None:
    file_descriptor = module.DESCRIPTOR
    descriptor: Descriptor = file_descriptor.message_types_by_name[message]
    fd = descriptor.fields_by_name[field]
    assert fd.number == number
    assert fd.type == type_
    assert fd.is_repeated == repeated
    if message_type == "map":
        entry = fd.message_type
        assert entry is not None
        assert entry.GetOptions().map_entry
        assert [(f.name, f.number, f.type) for f in entry.fields] == [
            ("key", 1, STRING),
            ("value", 2, STRING),
        ]
    elif message_type is not None:
        assert fd.message_type is not None
        assert fd.message_type.full_name == f"{file_descriptor.package}.{message_type}"
        assert not fd.message_type.GetOptions().map_entry


@pytest.mark.parametrize(
    ("module", "rows", "empty"),
    [
        pytest.param(dp, DEVICE_PLUGIN_FIELDS, DEVICE_PLUGIN_EMPTY, id="v1beta1"),
        pytest.param(pr, POD_RESOURCES_FIELDS, POD_RESOURCES_EMPTY, id="v1"),
    ],
)
def test_no_fields_or_messages_beyond_the_table(
    module: ModuleType, rows: list[Row], empty: list[str]
) -> None:
    file_descriptor = module.DESCRIPTOR
    expected: dict[str, set[str]] = {name: set() for name in empty}
    for message, field, *_ in rows:
        expected.setdefault(message, set()).add(field)
    actual = {
        name: set(descriptor.fields_by_name)
        for name, descriptor in file_descriptor.message_types_by_name.items()
    }
    assert actual == expected


def test_dynamic_resource_keeps_field_one_reserved() -> None:
    proto = descriptor_pb2.DescriptorProto()
    pr.DESCRIPTOR.message_types_by_name["DynamicResource"].CopyToProto(proto)
    assert [(r.start, r.end) for r in proto.reserved_range] == [(1, 2)]  # [1, 2): just field 1


@pytest.mark.parametrize(
    ("module", "service", "method", "input_", "output", "server_streaming"),
    [pytest.param(*row, id=f"/{row[0].DESCRIPTOR.package}.{row[1]}/{row[2]}") for row in METHODS],
)
def test_method_paths_and_kinds(
    module: ModuleType, service: str, method: str, input_: str, output: str, server_streaming: bool
) -> None:
    file_descriptor = module.DESCRIPTOR
    package = file_descriptor.package
    sd: ServiceDescriptor = file_descriptor.services_by_name[service]
    md = sd.methods_by_name[method]
    assert f"/{sd.full_name}/{md.name}" == f"/{package}.{service}/{method}"
    assert md.input_type.full_name == f"{package}.{input_}"
    assert md.output_type.full_name == f"{package}.{output}"
    assert md.client_streaming is False
    assert md.server_streaming is server_streaming


def test_services_have_only_the_listed_methods() -> None:
    expected: dict[str, set[str]] = {}
    for module, service, method, *_ in METHODS:
        expected.setdefault(f"{module.DESCRIPTOR.package}.{service}", set()).add(method)
    actual = {
        sd.full_name: set(sd.methods_by_name)
        for module in (dp, pr)
        for sd in module.DESCRIPTOR.services_by_name.values()
    }
    assert actual == expected


def test_grpc_stubs_use_the_wire_paths() -> None:
    from gpunode._proto.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
    from gpunode._proto.podresources.v1 import api_pb2_grpc as pr_grpc

    sources = Path(dp_grpc.__file__).read_text() + Path(pr_grpc.__file__).read_text()
    for module, service, method, *_ in METHODS:
        assert f"'/{module.DESCRIPTOR.package}.{service}/{method}'" in sources
    # The package-relative import resolves to the very module the messages come from.
    assert getattr(dp_grpc, "deviceplugin_dot_v1beta1_dot_api__pb2") is dp  # noqa: B009
    assert getattr(pr_grpc, "podresources_dot_v1_dot_api__pb2") is pr  # noqa: B009


def test_numa_node_zero_is_an_empty_message_on_the_wire() -> None:
    response = dp.ListAndWatchResponse(
        devices=[dp.Device(ID="GPU-0", health="Healthy", topology=dp.TopologyInfo(nodes=[dp.NUMANode(ID=0)]))]
    )
    wire = response.SerializeToString()
    assert dp.NUMANode(ID=0).SerializeToString() == b""
    # ListAndWatchResponse.devices (1) > Device: ID (1), health (2), topology (3) > one empty NUMANode.
    device = b"\x0a\x05GPU-0" + b"\x12\x07Healthy" + b"\x1a\x02" + b"\x0a\x00"
    assert wire == b"\x0a" + bytes([len(device)]) + device
    decoded = dp.ListAndWatchResponse.FromString(wire)
    assert decoded == response
    assert decoded.devices[0].topology.nodes[0].ID == 0
    assert dp.NUMANode(ID=1).SerializeToString() == b"\x08\x01"

"""The kubelet PodResources v1 messages, built from their descriptors at import.

No generated ``_pb2`` module: the few messages otel-gpu needs are described here field by field,
as ``k8s.io/kubelet/pkg/apis/podresources/v1/api.proto`` defines them (package ``v1``, service
``v1.PodResourcesLister``), and turned into message classes in a private descriptor pool (so they
never clash with another copy of the API in the same process). Fields we do not describe are
kept as unknown fields by protobuf and ignored.

::

    service PodResourcesLister {
        rpc List(ListPodResourcesRequest) returns (ListPodResourcesResponse) {}
        rpc GetAllocatableResources(AllocatableResourcesRequest)
            returns (AllocatableResourcesResponse) {}                    // not used
        rpc Get(GetPodResourcesRequest) returns (GetPodResourcesResponse) {}
    }
    message ListPodResourcesRequest {}
    message ListPodResourcesResponse { repeated PodResources pod_resources = 1; }
    message PodResources {
        string name = 1; string namespace = 2; repeated ContainerResources containers = 3;
    }
    message ContainerResources {
        string name = 1; repeated ContainerDevices devices = 2; repeated int64 cpu_ids = 3;
        repeated ContainerMemory memory = 4; repeated DynamicResource dynamic_resources = 5;
    }
    message ContainerMemory { string memory_type = 1; uint64 size = 2; TopologyInfo topology = 3; }
    message ContainerDevices {
        string resource_name = 1; repeated string device_ids = 2; TopologyInfo topology = 3;
    }
    message TopologyInfo { repeated NUMANode nodes = 1; }
    message NUMANode { int64 ID = 1; }
    message DynamicResource {
        string claim_name = 2; string claim_namespace = 3; repeated ClaimResource claim_resources = 4;
    }
    message ClaimResource {
        repeated CDIDevice cdi_devices = 1; string driver_name = 2; string pool_name = 3;
        string device_name = 4;
    }
    message CDIDevice { string name = 1; }
    message GetPodResourcesRequest { string pod_name = 1; string pod_namespace = 2; }
    message GetPodResourcesResponse { PodResources pod_resources = 1; }
"""

from __future__ import annotations

from typing import Any

from google.protobuf import (  # type: ignore[import-untyped, unused-ignore]
    descriptor_pb2,
    descriptor_pool,
    message_factory,
)

__all__ = [
    "GET_METHOD",
    "LIST_METHOD",
    "SERVICE",
    "ContainerDevices",
    "ContainerResources",
    "GetPodResourcesRequest",
    "GetPodResourcesResponse",
    "ListPodResourcesRequest",
    "ListPodResourcesResponse",
    "PodResources",
]

SERVICE = "v1.PodResourcesLister"
LIST_METHOD = f"/{SERVICE}/List"
GET_METHOD = f"/{SERVICE}/Get"

_STRING, _INT64, _UINT64, _MESSAGE = 9, 3, 4, 11
_OPTIONAL, _REPEATED = 1, 3

# message name -> (field name, number, type, label, message type or "")
_MESSAGES: dict[str, tuple[tuple[str, int, int, int, str], ...]] = {
    "ListPodResourcesRequest": (),
    "ListPodResourcesResponse": (("pod_resources", 1, _MESSAGE, _REPEATED, "PodResources"),),
    "PodResources": (
        ("name", 1, _STRING, _OPTIONAL, ""),
        ("namespace", 2, _STRING, _OPTIONAL, ""),
        ("containers", 3, _MESSAGE, _REPEATED, "ContainerResources"),
    ),
    "ContainerResources": (
        ("name", 1, _STRING, _OPTIONAL, ""),
        ("devices", 2, _MESSAGE, _REPEATED, "ContainerDevices"),
        ("cpu_ids", 3, _INT64, _REPEATED, ""),
        ("memory", 4, _MESSAGE, _REPEATED, "ContainerMemory"),
        ("dynamic_resources", 5, _MESSAGE, _REPEATED, "DynamicResource"),
    ),
    "ContainerMemory": (
        ("memory_type", 1, _STRING, _OPTIONAL, ""),
        ("size", 2, _UINT64, _OPTIONAL, ""),
        ("topology", 3, _MESSAGE, _OPTIONAL, "TopologyInfo"),
    ),
    "ContainerDevices": (
        ("resource_name", 1, _STRING, _OPTIONAL, ""),
        ("device_ids", 2, _STRING, _REPEATED, ""),
        ("topology", 3, _MESSAGE, _OPTIONAL, "TopologyInfo"),
    ),
    "TopologyInfo": (("nodes", 1, _MESSAGE, _REPEATED, "NUMANode"),),
    "NUMANode": (("ID", 1, _INT64, _OPTIONAL, ""),),
    "DynamicResource": (
        ("claim_name", 2, _STRING, _OPTIONAL, ""),
        ("claim_namespace", 3, _STRING, _OPTIONAL, ""),
        ("claim_resources", 4, _MESSAGE, _REPEATED, "ClaimResource"),
    ),
    "ClaimResource": (
        ("cdi_devices", 1, _MESSAGE, _REPEATED, "CDIDevice"),
        ("driver_name", 2, _STRING, _OPTIONAL, ""),
        ("pool_name", 3, _STRING, _OPTIONAL, ""),
        ("device_name", 4, _STRING, _OPTIONAL, ""),
    ),
    "CDIDevice": (("name", 1, _STRING, _OPTIONAL, ""),),
    "GetPodResourcesRequest": (
        ("pod_name", 1, _STRING, _OPTIONAL, ""),
        ("pod_namespace", 2, _STRING, _OPTIONAL, ""),
    ),
    "GetPodResourcesResponse": (("pod_resources", 1, _MESSAGE, _OPTIONAL, "PodResources"),),
}


def _build() -> dict[str, Any]:
    proto = descriptor_pb2.FileDescriptorProto(
        name="otel_gpu/attribution/podresources/v1/api.proto", package="v1", syntax="proto3"
    )
    for message, fields in _MESSAGES.items():
        desc = proto.message_type.add(name=message)
        for name, number, kind, label, type_name in fields:
            field = desc.field.add(name=name, number=number, type=kind, label=label)
            if type_name:
                field.type_name = f".v1.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"v1.{name}"))
        for name in _MESSAGES
    }


_CLASSES = _build()
ListPodResourcesRequest: Any = _CLASSES["ListPodResourcesRequest"]
ListPodResourcesResponse: Any = _CLASSES["ListPodResourcesResponse"]
PodResources: Any = _CLASSES["PodResources"]
ContainerResources: Any = _CLASSES["ContainerResources"]
ContainerDevices: Any = _CLASSES["ContainerDevices"]
GetPodResourcesRequest: Any = _CLASSES["GetPodResourcesRequest"]
GetPodResourcesResponse: Any = _CLASSES["GetPodResourcesResponse"]

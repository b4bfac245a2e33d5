"""The device plugin agent: advertises GPUs, MIG devices and time-sliced replicas to the kubelet.

Pure modules: :mod:`.config` (NVIDIA's ``version: v1`` config file and the effective settings),
:mod:`.devices` (NVML inventory -> advertised resources) and :mod:`.allocation` (Allocate and
GetPreferredAllocation logic). The gRPC server, registration, health and supervision build on them.
"""

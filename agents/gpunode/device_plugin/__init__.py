"""The device plugin agent: advertises GPUs, MIG devices and time-sliced replicas to the kubelet.

Pure modules: :mod:`.settings` (the effective settings from the resolved flags and the ``version: v1``
file of :mod:`gpunode.api.plugin_config`), :mod:`.devices` (NVML inventory -> advertised resources),
:mod:`.allocation` (Allocate and GetPreferredAllocation logic) and :mod:`.health` (which events are
fatal, when a GPU recovers). The command line: :mod:`.flags` (every flag, declared once) and
:mod:`.cli` (``SPEC`` and ``start``). The running agent: :mod:`.server` (one gRPC server per resource),
:mod:`.resources` (servers kept in line with the node), :mod:`.registrar` (kubelet registration kept
current, over :mod:`.registration`'s one call), :mod:`.healthwatch` (NVML events and the probe),
:mod:`.configwatch` (config file, SIGHUP and node-label reloads), wired together in :mod:`.plugin`.
"""

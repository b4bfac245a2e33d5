"""The readiness files under ``/run/nvidia/validations``: their names and their text.

NVIDIA's contract between the driver container, the operator validator and the operands that wait on
them (shared/reference 3.1): the driver loader writes ``.driver-ctr-ready`` and ``driver-ready``, the
validator writes ``driver-ready`` too after checking a host driver, and the daemons' status goes to
``.driver-daemons-status``. Both writers take the text from here, so it cannot drift.
"""

from __future__ import annotations

__all__ = [
    "CTR_READY",
    "DAEMONS_STATUS",
    "DRIVER_READY",
    "ctr_ready_text",
    "driver_ready_text",
]

CTR_READY = ".driver-ctr-ready"
DRIVER_READY = "driver-ready"
DAEMONS_STATUS = ".driver-daemons-status"


def ctr_ready_text(rdma: bool) -> str:
    return f"GDRCOPY_ENABLED: false\nGDS_ENABLED: false\nGPU_DIRECT_RDMA_ENABLED: {str(rdma).lower()}\n"


def driver_ready_text(*, host_driver: bool, driver_root: str) -> str:
    """The validator's ``driver-ready`` (reference 3.1): roots as seen on the host and in containers.

    A host driver, or ours installed in the host's own ``/``: ``/`` on the host, ``/host`` in containers
    (where operands mount the host). A driver root elsewhere (``/run/nvidia/driver``) is mounted at the
    same path. The device nodes we create are in the host's ``/dev``, so the dev root is always ``/``.
    """
    root = "/" if host_driver else driver_root
    ctr = "/host" if root == "/" else root
    return (
        f"IS_HOST_DRIVER={str(host_driver).lower()}\n"
        f"NVIDIA_DRIVER_ROOT={root}\n"
        f"DRIVER_ROOT_CTR_PATH={ctr}\n"
        "NVIDIA_DEV_ROOT=/\n"
        "DEV_ROOT_CTR_PATH=/host\n"
    )

"""The GPU Operator MIG manager's host GPU-clients file (``GPU_CLIENTS_FILE``), read strictly::

    version: v1
    systemd-services:
      - nvidia-persistenced.service
      - nvidia-dcgm.service

The services are stopped around a MIG change and started again afterwards; that is the MIG agent's
business (``gpunode.mig.clients``).
"""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gpunode.common.config import load_config

__all__ = ["load_gpu_clients"]


class _GpuClientsFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    version: Literal["v1"]
    systemd_services: tuple[str, ...] = Field(default=(), alias="systemd-services")


def load_gpu_clients(path: str | os.PathLike[str]) -> tuple[str, ...]:
    """The services a ``GPU_CLIENTS_FILE`` lists, in order (a ConfigError names what is wrong)."""
    return load_config(os.fspath(path), _GpuClientsFile).systemd_services

"""The GPU Operator MIG manager's host GPU-clients file (``GPU_CLIENTS_FILE``), read strictly::

    version: v1
    systemd-services:
      - nvidia-persistenced.service
      - nvidia-dcgm.service

The services are stopped around a MIG change and started again afterwards; that is the MIG agent's
business (``gpunode.mig.clients``). Each must be a systemd unit name (``gpunode.common.cmdargs``): a
value such as ``--host=evil`` is a config error naming the file and the list entry, never an option
that reaches ``systemctl``.
"""

from __future__ import annotations

import os
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from gpunode.common.cmdargs import unit_name_problem
from gpunode.common.config import load_config

__all__ = ["load_gpu_clients"]


def _unit_name(name: str) -> str:
    problem = unit_name_problem(name)
    if problem is not None:
        raise ValueError(problem)
    return name


class _GpuClientsFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    version: Literal["v1"]
    systemd_services: tuple[Annotated[str, AfterValidator(_unit_name)], ...] = Field(
        default=(), alias="systemd-services"
    )


def load_gpu_clients(path: str | os.PathLike[str]) -> tuple[str, ...]:
    """The services a ``GPU_CLIENTS_FILE`` lists, in order (a ConfigError names what is wrong)."""
    return load_config(os.fspath(path), _GpuClientsFile).systemd_services

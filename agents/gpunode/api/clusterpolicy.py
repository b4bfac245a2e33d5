"""The ClusterPolicy subset gpunode understands (``apiVersion: nvidia.com/v1``, ``kind: ClusterPolicy``).

:func:`load_policy` reads a policy file. Fields gpunode does not know, and GPU Operator fields it does not
support (``nodeStatusExporter``, ``gds``, per-component images, ...), are removed before validation and
returned as warnings naming their YAML path; ``strict=True`` turns them into a :class:`ConfigError`
(exit 2). Everything left is validated strictly with the project's :class:`ConfigModel` rules, so a
malformed policy is a :class:`ConfigError` naming the file, the YAML path and the reason.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from gpunode.common.config import (
    ConfigError,
    ConfigModel,
    format_loc,
    format_validation_error,
    json_default,
    parse_yaml,
    read_config_text,
)

__all__ = [
    "ClusterPolicy",
    "LoadedPolicy",
    "load_policy",
    "parse_policy_text",
]

# GPU Operator ClusterPolicy fields gpunode recognises but does not implement (warned as "unsupported").
UNSUPPORTED_SPEC_KEYS = frozenset(
    {
        "nodeStatusExporter",
        "dcgm",
        "gds",
        "gdrcopy",
        "vgpuManager",
        "vgpuDeviceManager",
        "vfioManager",
        "sandboxWorkloads",
        "sandboxDevicePlugin",
        "kataManager",
        "ccManager",
        "cdi",
        "psa",
        "psp",
        "hostPaths",
    }
)
UNSUPPORTED_COMPONENT_KEYS = frozenset(
    {
        "repository",
        "image",
        "version",
        "imagePullPolicy",
        "imagePullSecrets",
        "args",
        "resources",
        "hostNetwork",
        "startupProbe",
        "livenessProbe",
        "readinessProbe",
        "licensingConfig",
        "virtualTopology",
        "kernelModuleConfig",
        "repoConfig",
        "certConfig",
        "upgradePolicy",
        "usePrecompiled",
        "useOpenKernelModules",
        "useNvidiaDriverCRD",
        "installDir",
        "metricsConfig",
        "hostPort",
        "serviceMonitor",
        "config",
        "mps",
    }
)


class EnvVar(ConfigModel):
    name: str = Field(min_length=1, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
    value: str = ""


class Toleration(ConfigModel):
    key: str | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


class Operator(ConfigModel):
    default_runtime: Literal["containerd", "crio", "docker"] = "containerd"
    runtime_class: str = Field(default="nvidia", min_length=1)


class Daemonsets(ConfigModel):
    tolerations: tuple[Toleration, ...] = (
        Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"),
    )
    priority_class_name: str = Field(default="system-node-critical", min_length=1)
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}


class ImageSpec(ConfigModel):
    """gpunode's extension (``spec.gpunode``): the one image every agent runs from."""

    repository: str = "ghcr.io/gpunode"
    image: str = "gpunode"
    version: str | None = None
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    image_pull_secrets: tuple[str, ...] = ()


class Rdma(ConfigModel):
    enabled: bool = False


class DriverManager(ConfigModel):
    env: tuple[EnvVar, ...] = ()


class Driver(ConfigModel):
    enabled: bool = True
    version: str | None = None
    kernel_module_type: Literal["auto", "open", "proprietary", "precompiled", "runcompiled"] = "auto"
    rdma: Rdma = Rdma()
    manager: DriverManager = DriverManager()
    env: tuple[EnvVar, ...] = ()


class Toolkit(ConfigModel):
    enabled: bool = True
    env: tuple[EnvVar, ...] = ()


class NamedConfig(ConfigModel):
    """``config``: an existing ConfigMap (``name``), or one to create from ``data`` (``create: true``)."""

    create: bool = False
    name: str = ""
    default: str = ""
    data: dict[str, str] = {}


class DevicePlugin(ConfigModel):
    enabled: bool = True
    config: NamedConfig = NamedConfig()
    env: tuple[EnvVar, ...] = ()


class ServiceMonitor(ConfigModel):
    enabled: bool = False
    interval: str = Field(default="15s", pattern=r"^[0-9]+(ms|s|m|h)$")
    honor_labels: bool = False
    additional_labels: dict[str, str] = {}


class DcgmExporter(ConfigModel):
    enabled: bool = True
    service_monitor: ServiceMonitor = ServiceMonitor()
    env: tuple[EnvVar, ...] = ()


class Gfd(ConfigModel):
    enabled: bool = True
    env: tuple[EnvVar, ...] = ()


class MigManager(ConfigModel):
    enabled: bool = True
    config: NamedConfig = NamedConfig(default="all-disabled")
    env: tuple[EnvVar, ...] = ()


class Mig(ConfigModel):
    strategy: Literal["none", "single", "mixed"] = "single"


class Nfd(ConfigModel):
    enabled: bool = True


class Validator(ConfigModel):
    env: tuple[EnvVar, ...] = ()


class Spec(ConfigModel):
    operator: Operator = Operator()
    daemonsets: Daemonsets = Daemonsets()
    gpunode: ImageSpec = ImageSpec()
    driver: Driver = Driver()
    toolkit: Toolkit = Toolkit()
    device_plugin: DevicePlugin = DevicePlugin()
    dcgm_exporter: DcgmExporter = DcgmExporter()
    gfd: Gfd = Gfd()
    mig_manager: MigManager = MigManager()
    mig: Mig = Mig()
    nfd: Nfd = Nfd()
    validator: Validator = Validator()


class Metadata(ConfigModel):
    name: str = Field(default="cluster-policy", min_length=1)
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}


class ClusterPolicy(ConfigModel):
    api_version: Literal["nvidia.com/v1"]
    kind: Literal["ClusterPolicy"]
    metadata: Metadata = Metadata()
    spec: Spec = Spec()


@dataclass(frozen=True)
class LoadedPolicy:
    policy: ClusterPolicy
    warnings: tuple[str, ...]


def default_policy() -> ClusterPolicy:
    return ClusterPolicy(api_version="nvidia.com/v1", kind="ClusterPolicy")


def load_policy(path: str | os.PathLike[str], *, strict: bool = False) -> LoadedPolicy:
    name = os.fspath(path)
    return parse_policy_text(read_config_text(name), name, strict=strict)


def parse_policy_text(text: str, source_name: str, *, strict: bool = False) -> LoadedPolicy:
    data = parse_yaml(text, source_name)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(source_name, ["top level must be a mapping (a ClusterPolicy object)"])
    try:
        data = json.loads(json.dumps(data, default=json_default, allow_nan=False))
    except ValueError:
        raise ConfigError(source_name, ["values must be finite numbers (no .inf or .nan)"]) from None
    warnings: list[str] = []
    pruned = _prune(data, ClusterPolicy, (), warnings)
    if strict and warnings:
        raise ConfigError(source_name, [f"{w} (--strict)" for w in warnings])
    try:
        policy = ClusterPolicy.model_validate_json(json.dumps(pruned), strict=True)
    except ValidationError as exc:
        raise ConfigError(source_name, format_validation_error(exc, ClusterPolicy)) from None
    return LoadedPolicy(policy, tuple(warnings))


def _prune(data: object, model: type[BaseModel], loc: tuple[int | str, ...], out: list[str]) -> object:
    """Drop keys ``model`` does not declare, recording a warning for each; recurse into sub-models."""
    if not isinstance(data, dict):
        return data  # let validation report the wrong type
    fields = {(f.alias or n): f for n, f in model.model_fields.items()}
    kept: dict[str, Any] = {}
    for key, value in data.items():
        where = format_loc((*loc, str(key)))
        if key not in fields:
            top = loc == ("spec",) and key in UNSUPPORTED_SPEC_KEYS
            component = len(loc) == 2 and loc[0] == "spec" and key in UNSUPPORTED_COMPONENT_KEYS
            if top or component:
                out.append(f"{where}: not supported by gpunode (ignored)")
            else:
                out.append(f"{where}: unknown field (ignored)")
            continue
        kept[str(key)] = _prune_value(value, fields[str(key)].annotation, (*loc, str(key)), out)
    return kept


def _prune_value(value: object, annotation: object, loc: tuple[int | str, ...], out: list[str]) -> object:
    sub = _model_of(annotation)
    if sub is not None:
        return _prune(value, sub, loc, out)
    item = _item_model(annotation)
    if item is not None and isinstance(value, list):
        return [_prune(v, item, (*loc, i), out) for i, v in enumerate(value)]
    return value


def _model_of(annotation: object) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _item_model(annotation: object) -> type[BaseModel] | None:
    args: Mapping[int, object] = dict(enumerate(getattr(annotation, "__args__", ())))
    first = args.get(0)
    return _model_of(first)

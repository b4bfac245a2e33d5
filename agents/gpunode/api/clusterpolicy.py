"""The ClusterPolicy gpunode reads (``apiVersion: nvidia.com/v1``, ``kind: ClusterPolicy``).

:func:`load_policy` reads a policy file. Every field of NVIDIA's ClusterPolicy CRD is accepted
(:mod:`gpunode.api.clusterpolicy_fields` lists them): the ones gpunode does not implement
(``nodeStatusExporter``, ``gds``, per-component images, ...) are removed before validation and returned as
warnings ``<path>: accepted, ignored: <reason>``, never an error, ``--strict`` included. A field outside
NVIDIA's CRD and gpunode's extensions is removed with the warning ``<path>: unknown field (ignored)``;
``strict=True`` turns those into a :class:`ConfigError` (exit 2). Everything left is validated strictly with
the project's :class:`ConfigModel` rules, so a malformed policy is a :class:`ConfigError` naming the file,
the YAML path and the reason.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from gpunode.api.clusterpolicy_fields import ignored_reason, leaf_paths, nvidia_spec_schema, schema_at
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
    "FieldRow",
    "LoadedPolicy",
    "field_table",
    "field_table_markdown",
    "load_policy",
    "parse_policy_text",
]


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


class AlertsSpec(ConfigModel):
    enabled: bool = True


class DashboardSpec(ConfigModel):
    enabled: bool = False


class ImageSpec(ConfigModel):
    """gpunode's extension (``spec.gpunode``): the one image every agent runs from, and monitoring:
    ``alerts`` (the PrometheusRule, rendered beside the exporter's ServiceMonitor; default on) and
    ``dashboard`` (the Grafana dashboard ConfigMap; default off). See docs/alerts.md."""

    repository: str = "ghcr.io/gpunode"
    image: str = "gpunode"
    version: str | None = None
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    image_pull_secrets: tuple[str, ...] = ()
    alerts: AlertsSpec = AlertsSpec()
    dashboard: DashboardSpec = DashboardSpec()


class Rdma(ConfigModel):
    enabled: bool = False


class DriverManager(ConfigModel):
    env: tuple[EnvVar, ...] = ()


class UpgradeWaitForCompletion(ConfigModel):
    """``driver.upgradePolicy.waitForCompletion``: pods (a label selector) to wait for before evicting,
    up to ``timeoutSeconds`` (0: forever)."""

    pod_selector: str = ""
    timeout_seconds: int = 0


class UpgradePodDeletion(ConfigModel):
    """``driver.upgradePolicy.podDeletion`` (Helm ``gpuPodDeletion``): evicting the pods that use GPUs."""

    force: bool = False
    timeout_seconds: int = 300
    delete_empty_dir: bool = False


class UpgradeDrain(ConfigModel):
    """``driver.upgradePolicy.drain``: draining the node when the GPU pods would not leave."""

    enable: bool = False
    force: bool = False
    pod_selector: str = ""
    timeout_seconds: int = 300
    delete_empty_dir: bool = False


class UpgradePolicy(ConfigModel):
    """``driver.upgradePolicy``: the cluster-wide rolling driver upgrade (gpunode-operator's upgrade
    controller, docs/upgrades.md). The limits are checked by the operator, which names a bad field in the
    ClusterPolicy's ``Error`` condition: ``maxUnavailable`` a count >= 0 or a percentage <= 100%."""

    auto_upgrade: bool = False
    max_parallel_upgrades: int = 1
    max_unavailable: int | str = "25%"
    wait_for_completion: UpgradeWaitForCompletion = UpgradeWaitForCompletion()
    pod_deletion: UpgradePodDeletion = UpgradePodDeletion()
    drain: UpgradeDrain = UpgradeDrain()


class Driver(ConfigModel):
    enabled: bool = True
    version: str | None = None
    kernel_module_type: Literal["auto", "open", "proprietary", "precompiled", "runcompiled"] = "auto"
    rdma: Rdma = Rdma()
    manager: DriverManager = DriverManager()
    env: tuple[EnvVar, ...] = ()
    upgrade_policy: UpgradePolicy = UpgradePolicy()


class Toolkit(ConfigModel):
    enabled: bool = True
    env: tuple[EnvVar, ...] = ()


class Cdi(ConfigModel):
    """``spec.cdi.enabled`` (default true, as NVIDIA's chart): the runtime injects devices from the CDI
    spec (containerd ``enable_cdi``), the device plugin hands out CDI names; false: the legacy path,
    NVIDIA's runtime handlers and a RuntimeClass (NVIDIA's runtime must be on the host)."""

    enabled: bool = True


class NamedConfig(ConfigModel):
    """``config``: an existing ConfigMap (``name``), or one to create from ``data`` (``create: true``)."""

    create: bool = False
    name: str = ""
    default: str = ""
    data: dict[str, str] = {}


class DevicePluginMps(ConfigModel):
    """``devicePlugin.mps``: where the MPS control daemon keeps its pipe directories, shm and ``.ready``."""

    root: str = "/run/nvidia/mps"

    @field_validator("root")
    @classmethod
    def _root(cls, value: str) -> str:
        if not value.startswith("/") or value.rstrip("/") == "":
            raise ValueError(f"must be an absolute directory other than / (got {value!r})")
        return value.rstrip("/")


class DevicePlugin(ConfigModel):
    enabled: bool = True
    config: NamedConfig = NamedConfig()
    env: tuple[EnvVar, ...] = ()
    mps: DevicePluginMps = DevicePluginMps()


_DURATION = r"^[0-9]+(ms|s|m|h)$"
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def _seconds(duration: str) -> float:
    """A Prometheus duration already matched by ``_DURATION`` (``15s``, ``500ms``) in seconds."""
    unit = "ms" if duration.endswith("ms") else duration[-1]
    return int(duration[: -len(unit)]) * _DURATION_UNITS[unit]


class ServiceMonitor(ConfigModel):
    enabled: bool = False
    interval: str = Field(default="15s", pattern=_DURATION)
    # NVIDIA's chart sets 10s; unset, Prometheus uses its global scrape_timeout.
    scrape_timeout: str | None = Field(default=None, pattern=_DURATION)
    honor_labels: bool = False
    additional_labels: dict[str, str] = {}

    @model_validator(mode="after")
    def _timeout_within_interval(self) -> ServiceMonitor:
        # Prometheus refuses a target whose scrape timeout exceeds its interval; say so here, not there.
        if self.scrape_timeout is not None and _seconds(self.scrape_timeout) > _seconds(self.interval):
            raise ValueError(
                f"scrapeTimeout {self.scrape_timeout} is longer than interval {self.interval}; "
                "Prometheus refuses such a target (make scrapeTimeout <= interval)"
            )
        return self


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
    cdi: Cdi = Cdi()
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
    """``warnings``: every field dropped, NVIDIA's ignored ones and unknown ones, in document order;
    ``unknown``: those outside NVIDIA's CRD (the ones ``strict`` refuses)."""

    policy: ClusterPolicy
    warnings: tuple[str, ...]
    unknown: tuple[str, ...] = ()


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
    unknown: list[str] = []
    pruned = _prune(data, ClusterPolicy, (), warnings, unknown)
    if strict and unknown:
        raise ConfigError(source_name, [f"{w} (--strict)" for w in unknown])
    try:
        policy = ClusterPolicy.model_validate_json(json.dumps(pruned), strict=True)
    except ValidationError as exc:
        raise ConfigError(source_name, format_validation_error(exc, ClusterPolicy)) from None
    return LoadedPolicy(policy, tuple(warnings), tuple(unknown))


def _prune(
    data: object,
    model: type[BaseModel],
    loc: tuple[int | str, ...],
    out: list[str],
    unknown: list[str],
) -> object:
    """Drop keys ``model`` does not declare, recording a warning for each; recurse into sub-models."""
    if not isinstance(data, dict):
        return data  # let validation report the wrong type
    fields = {(f.alias or n): f for n, f in model.model_fields.items()}
    kept: dict[str, Any] = {}
    for key, value in data.items():
        where = format_loc((*loc, str(key)))
        if key not in fields:
            reason = _nvidia_reason((*loc, str(key)))
            if reason is not None:
                out.append(f"{where}: accepted, ignored: {reason}")
            else:
                out.append(f"{where}: unknown field (ignored)")
                unknown.append(out[-1])
            continue
        kept[str(key)] = _prune_value(value, fields[str(key)].annotation, (*loc, str(key)), out, unknown)
    return kept


_NVIDIA_SPEC: dict[str, Any] = {}


def _nvidia_spec() -> dict[str, Any]:
    if not _NVIDIA_SPEC:
        _NVIDIA_SPEC.update(nvidia_spec_schema())
    return _NVIDIA_SPEC


def _schema_path(loc: tuple[int | str, ...]) -> tuple[str, ...]:
    return tuple("[]" if isinstance(part, int) else part for part in loc)


def _dotted(path: tuple[str, ...]) -> str:
    return ".".join(path).replace(".[]", "[]")


def _nvidia_reason(loc: tuple[int | str, ...]) -> str | None:
    """Why the NVIDIA field at ``loc`` is ignored; ``None`` when ``loc`` is not a field of NVIDIA's CRD."""
    path = _schema_path(loc)
    if len(path) < 2 or path[0] != "spec" or schema_at(_nvidia_spec(), path[1:]) is None:
        return None
    return ignored_reason(_dotted(path)) or "not implemented by gpunode"


def _prune_value(
    value: object, annotation: object, loc: tuple[int | str, ...], out: list[str], unknown: list[str]
) -> object:
    sub = _model_of(annotation)
    if sub is not None:
        return _prune(value, sub, loc, out, unknown)
    item = _item_model(annotation)
    if item is not None and isinstance(value, list):
        return [_prune(v, item, (*loc, i), out, unknown) for i, v in enumerate(value)]
    return value


def _model_of(annotation: object) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _item_model(annotation: object) -> type[BaseModel] | None:
    args: Mapping[int, object] = dict(enumerate(getattr(annotation, "__args__", ())))
    first = args.get(0)
    return _model_of(first)


# -- the field table -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FieldRow:
    """One leaf of gpunode's ClusterPolicy CRD: its path, OpenAPI type and what gpunode does with it."""

    path: str
    type: str
    honoured: bool
    note: str  # "gpunode extension" for gpunode's own fields; the reason for an ignored one


def field_table() -> list[FieldRow]:
    """Every leaf field of the CRD's ``spec``, in schema order: honoured (the model declares it) or
    accepted and ignored with its reason."""
    from gpunode.api.clusterpolicy_fields import spec_schema

    nvidia = _nvidia_spec()
    rows = []
    for path, kind in leaf_paths(spec_schema(), "spec"):
        parts = tuple(path.replace("[]", ".[]").split("."))
        depth = _undeclared_at(parts[1:], Spec)
        if depth is None:
            ext = schema_at(nvidia, parts[1:]) is None
            rows.append(FieldRow(path, kind, True, "gpunode extension" if ext else ""))
        else:
            rows.append(FieldRow(path, kind, False, _nvidia_reason(parts[: depth + 2]) or ""))
    return rows


def _undeclared_at(path: tuple[str, ...], model: type[BaseModel]) -> int | None:
    """The index of the first step of ``path`` the model does not declare (where loading drops the
    field), or ``None`` when it declares the whole path (a map's keys and a list's scalars end the walk)."""
    current: type[BaseModel] | None = model
    for index, part in enumerate(path):
        if part == "[]":
            continue
        if current is None:
            return None  # inside a declared map or scalar list
        fields = {(f.alias or n): f for n, f in current.model_fields.items()}
        if part not in fields:
            return index
        annotation = fields[part].annotation
        current = _model_of(annotation) or _item_model(annotation)
    return None


def field_table_markdown() -> str:
    """:func:`field_table` as the Markdown table of ``docs/clusterpolicy.md``."""
    lines = ["| field | type | gpunode |", "|---|---|---|"]
    for row in field_table():
        if row.honoured:
            what = f"honoured ({row.note})" if row.note else "honoured"
        else:
            what = f"accepted, ignored: {row.note}"
        lines.append(f"| `{row.path}` | {row.type} | {what} |")
    return "\n".join(lines) + "\n"

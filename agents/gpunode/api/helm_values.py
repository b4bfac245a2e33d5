"""The GPU Operator Helm chart's values format -> a ClusterPolicy, as NVIDIA's chart template makes it.

Most GPU Operator users configure it through the chart's values (``helm install -f values.yaml``); the
chart turns them into the one ``ClusterPolicy`` the operator reads. :func:`map_values` does the same
mapping without Helm, using NVIDIA's field names, so ``gpunode render --values FILE`` accepts a values file
unchanged:

- a value the chart copies into the ClusterPolicy goes to the same place, renamed where the chart
  renames it (``driver.nvidiaDriverCRD.enabled`` -> ``spec.driver.useNvidiaDriverCRD``,
  ``driver.upgradePolicy.gpuPodDeletion`` -> ``spec.driver.upgradePolicy.podDeletion``); values the
  template writes only when set (``{{- if }}``) are dropped when empty, ``false`` or zero, versions are
  written as strings (the template quotes them);
- the chart's defaults are applied where they decide what gets deployed: each component's ``enabled``
  switch, ``nfd.enabled``, ``mig.strategy``, ``migManager.config.default`` and the
  DaemonSets' tolerations and priority class; the upgrade policy's defaults when an upgrade policy is
  given. Other chart defaults (NVIDIA's images and versions) are left out: gpunode runs its own image;
- ``devicePlugin.config`` / ``migManager.config`` with ``create: true`` and ``data``: the chart creates
  that ConfigMap itself; the ClusterPolicy carries ``create`` and ``data`` (gpunode's render then
  creates it);
- chart values that configure something other than the ClusterPolicy (the operator's own Deployment,
  the NFD subchart, ``extraObjects``, ...) are listed in :attr:`MappedValues.outside`;
- a key the chart does not have is a warning naming its YAML path (``driver.verison: ...``).

The result is a plain document: :func:`load_values` validates it with the ClusterPolicy model, and the
model's problems are reported at the values' paths (``driver.enabled: must be a boolean``).
"""

from __future__ import annotations

import difflib
import functools
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpunode.common.errors import ConfigError

if TYPE_CHECKING:
    from gpunode.api.clusterpolicy import ClusterPolicy

__all__ = [
    "CHART_DEFAULTS",
    "LoadedValues",
    "MappedValues",
    "chart_keys",
    "load_values",
    "map_values",
]

# How a chart value reaches the ClusterPolicy:
_IF = "if"  # written when set and not empty/false/zero (the template's `{{- if .Values.x }}`), as given
_STR = "str"  # likewise, as a string (the template's `| quote`)
_ALWAYS = "always"  # written whenever the file (or CHART_DEFAULTS) sets it, even false or empty
_OUTSIDE = "outside"  # a chart value that configures something other than the ClusterPolicy
_SPECIAL = "special"  # mapped by one of the functions at the end of this module

# The chart's defaults that decide what gets deployed (deployments/gpu-operator/values.yaml).
CHART_DEFAULTS: dict[str, Any] = {
    "nfd": {"enabled": True},
    # Not cdi.enabled (true): gpunode's toolkit writes CDI specs whatever it says; written when given.
    "mig": {"strategy": "single"},
    "daemonsets": {
        "priorityClassName": "system-node-critical",
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    },
    "driver": {"enabled": True},
    "toolkit": {"enabled": True},
    "devicePlugin": {"enabled": True},
    "dcgmExporter": {"enabled": True},
    "gfd": {"enabled": True},
    "migManager": {"enabled": True, "config": {"default": "all-disabled"}},
}

# The chart's defaults of driver.upgradePolicy, merged under the file's when it gives an upgrade policy.
_UPGRADE_DEFAULTS: dict[str, Any] = {
    "autoUpgrade": True,
    "maxParallelUpgrades": 1,
    "maxUnavailable": "25%",
    "waitForCompletion": {"timeoutSeconds": 0},
    "gpuPodDeletion": {"force": False, "timeoutSeconds": 300, "deleteEmptyDir": False},
    "drain": {"enable": False, "force": False, "timeoutSeconds": 300, "deleteEmptyDir": False},
}

_UPGRADE_KEYS = ("autoUpgrade", "maxParallelUpgrades", "maxUnavailable")
_UPGRADE_SECTIONS = (
    ("waitForCompletion", "waitForCompletion", ("timeoutSeconds", "podSelector")),
    ("gpuPodDeletion", "podDeletion", ("force", "timeoutSeconds", "deleteEmptyDir")),
    ("drain", "drain", ("enable", "force", "podSelector", "timeoutSeconds", "deleteEmptyDir")),
)

_IMAGE = ("repository", "image", "imagePullPolicy", "imagePullSecrets")


def _component(
    name: str,
    dest: str | None = None,
    *,
    enabled: str | None = _ALWAYS,
    more: Mapping[str, str] | None = None,
    keys: tuple[str, ...] = ("resources", "env", "args"),
) -> dict[str, tuple[str, str]]:
    """The rows every operand shares: enabled, image fields, version (quoted), resources, env, args."""
    where = f"spec.{dest or name}"
    rows: dict[str, tuple[str, str]] = {}
    if enabled is not None:
        rows[f"{name}.enabled"] = (enabled, f"{where}.enabled")
    for key in _IMAGE:
        rows[f"{name}.{key}"] = (_IF, f"{where}.{key}")
    rows[f"{name}.version"] = (_STR, f"{where}.version")
    for key in keys:
        rows[f"{name}.{key}"] = (_IF, f"{where}.{key}")
    for key, kind in (more or {}).items():
        rows[f"{name}.{key}"] = (kind, f"{where}.{key}")
    return rows


def _driver_manager(name: str) -> dict[str, tuple[str, str]]:
    rows = {
        f"{name}.{k}": (_IF, f"spec.{name}.{k}") for k in ("repository", "image", "imagePullPolicy", "env")
    }
    rows[f"{name}.version"] = (_STR, f"spec.{name}.version")
    return rows


def _validator_rows() -> dict[str, tuple[str, str]]:
    rows = _component("validator", enabled=None)
    for sub in ("plugin", "cuda", "driver", "toolkit", "vfioPCI", "vgpuManager", "vgpuDevices"):
        rows[f"validator.{sub}.env"] = (_SPECIAL, f"spec.validator.{sub}.env")
    return rows


_OPERATOR_DEPLOYMENT = (
    "repository",
    "image",
    "version",
    "imagePullPolicy",
    "imagePullSecrets",
    "priorityClassName",
    "cleanupCRD",
    "upgradeCRD",
    "tolerations",
    "annotations",
    "podAnnotations",
    "labels",
    "podLabels",
    "affinity",
    "nodeSelector",
    "logging",
    "resources",
)

# values path -> (how, ClusterPolicy path). A row covers everything below it; a path that is a prefix of
# rows (``driver``, ``driver.manager``) is a section whose keys are checked against the rows.
_ROWS: dict[str, tuple[str, str]] = {
    # The chart's own settings and subcharts.
    "platform": (_OUTSIDE, ""),
    "nameOverride": (_OUTSIDE, ""),
    "fullnameOverride": (_OUTSIDE, ""),
    "global": (_OUTSIDE, ""),
    "cluster": (_OUTSIDE, ""),
    "extraObjects": (_OUTSIDE, ""),
    "node-feature-discovery": (_OUTSIDE, ""),
    "nfd.enabled": (_ALWAYS, "spec.nfd.enabled"),  # NVIDIA: the NFD subchart; gpunode: spec.nfd
    "nfd.nodefeaturerules": (_OUTSIDE, ""),
    "psa.enabled": (_ALWAYS, "spec.psa.enabled"),
    "psp.enabled": (_ALWAYS, "spec.psp.enabled"),
    "cdi.enabled": (_ALWAYS, "spec.cdi.enabled"),
    "cdi.default": (_IF, "spec.cdi.default"),
    "cdi.nriPluginEnabled": (_SPECIAL, "spec.cdi.nriPluginEnabled"),
    "sandboxWorkloads.enabled": (_ALWAYS, "spec.sandboxWorkloads.enabled"),
    "sandboxWorkloads.defaultWorkload": (_IF, "spec.sandboxWorkloads.defaultWorkload"),
    "sandboxWorkloads.mode": (_IF, "spec.sandboxWorkloads.mode"),
    "hostPaths.rootFS": (_ALWAYS, "spec.hostPaths.rootFS"),
    "hostPaths.driverInstallDir": (_ALWAYS, "spec.hostPaths.driverInstallDir"),
    "daemonsets.labels": (_IF, "spec.daemonsets.labels"),
    "daemonsets.annotations": (_IF, "spec.daemonsets.annotations"),
    "daemonsets.tolerations": (_IF, "spec.daemonsets.tolerations"),
    "daemonsets.priorityClassName": (_IF, "spec.daemonsets.priorityClassName"),
    "daemonsets.updateStrategy": (_IF, "spec.daemonsets.updateStrategy"),
    "daemonsets.rollingUpdate.maxUnavailable": (_SPECIAL, "spec.daemonsets.rollingUpdate.maxUnavailable"),
    **_validator_rows(),
    **{f"operator.{k}": (_OUTSIDE, "") for k in _OPERATOR_DEPLOYMENT},
    "operator.defaultRuntime": (_IF, "spec.operator.defaultRuntime"),
    "operator.runtimeClass": (_IF, "spec.operator.runtimeClass"),
    "operator.defaultGPUMode": (_IF, "spec.operator.defaultGPUMode"),
    "operator.use_ocp_driver_toolkit": (_IF, "spec.operator.use_ocp_driver_toolkit"),
    **{f"operator.initContainer.{k}": (_IF, f"spec.operator.initContainer.{k}") for k in _IMAGE},
    "operator.initContainer.version": (_STR, "spec.operator.initContainer.version"),
    "mig.strategy": (_IF, "spec.mig.strategy"),
    **_component(
        "driver",
        more={
            "kernelModuleType": _ALWAYS,
            "useOpenKernelModules": _ALWAYS,
            "usePrecompiled": _ALWAYS,
            "startupProbe": _IF,
            "livenessProbe": _IF,
            "readinessProbe": _IF,
            "rdma.enabled": _ALWAYS,
            "rdma.useHostMofed": _ALWAYS,
            "repoConfig": _IF,
            "certConfig": _IF,
            "licensingConfig": _IF,
            "virtualTopology": _IF,
            "kernelModuleConfig": _IF,
            "secretEnv": _IF,
        },
    ),
    "driver.nvidiaDriverCRD.enabled": (_ALWAYS, "spec.driver.useNvidiaDriverCRD"),
    "driver.nvidiaDriverCRD.deployDefaultCR": (_OUTSIDE, ""),
    "driver.nvidiaDriverCRD.driverType": (_OUTSIDE, ""),
    "driver.nvidiaDriverCRD.nodeSelector": (_OUTSIDE, ""),
    **_driver_manager("driver.manager"),
    **{f"driver.upgradePolicy.{k}": (_SPECIAL, f"spec.driver.upgradePolicy.{k}") for k in _UPGRADE_KEYS},
    **{
        f"driver.upgradePolicy.{s}.{k}": (_SPECIAL, f"spec.driver.upgradePolicy.{d}.{k}")
        for s, d, keys in _UPGRADE_SECTIONS
        for k in keys
    },
    **_component("toolkit", more={"installDir": _IF}),
    **_component("devicePlugin", more={"mps.root": _IF}),
    "devicePlugin.config.name": (_SPECIAL, "spec.devicePlugin.config.name"),
    "devicePlugin.config.default": (_SPECIAL, "spec.devicePlugin.config.default"),
    "devicePlugin.config.create": (_SPECIAL, "spec.devicePlugin.config.create"),
    "devicePlugin.config.data": (_SPECIAL, "spec.devicePlugin.config.data"),
    **_component("dcgm", more={"hostPort": _IF}),
    **_component(
        "dcgmExporter",
        more={
            "serviceMonitor": _IF,
            "service": _IF,
            "hostPID": _IF,
            "hostNetwork": _IF,
            "hpcJobMapping": _IF,
            "podMetrics": _IF,
        },
    ),
    "dcgmExporter.config.name": (_IF, "spec.dcgmExporter.config.name"),
    "dcgmExporter.config.create": (_OUTSIDE, ""),
    "dcgmExporter.config.data": (_OUTSIDE, ""),
    **_component("gfd"),
    **_component("migManager", more={"gpuClientsConfig": _IF}),
    "migManager.config.name": (_SPECIAL, "spec.migManager.config.name"),
    "migManager.config.default": (_SPECIAL, "spec.migManager.config.default"),
    "migManager.config.create": (_SPECIAL, "spec.migManager.config.create"),
    "migManager.config.data": (_SPECIAL, "spec.migManager.config.data"),
    **_component("nodeStatusExporter"),
    **_component("gds", enabled=_SPECIAL, keys=("env", "args")),
    **_component("gdrcopy", enabled=_SPECIAL, keys=("env", "args")),
    **_component("vgpuManager"),
    **_driver_manager("vgpuManager.driverManager"),
    **_component("vgpuDeviceManager", more={"config": _IF}),
    **_component("vfioManager"),
    **_driver_manager("vfioManager.driverManager"),
    **_component("kataManager", more={"config": _IF}),
    **_component("sandboxDevicePlugin", enabled=_IF),
    **_component("kataSandboxDevicePlugin", enabled=_IF),
    **_component("ccManager", more={"defaultMode": _SPECIAL}),
}

_SECTIONS = frozenset(p.rsplit(".", i)[0] for p in _ROWS for i in range(1, p.count(".") + 1))


@functools.cache
def _children(section: str) -> tuple[str, ...]:
    """The chart's keys directly under ``section`` ("" for the top level), for "did you mean"."""
    depth = section.count(".") + 1 if section else 0
    prefix = section + "." if section else ""
    found = {
        p.split(".")[depth] for p in (*_ROWS, *_SECTIONS) if p.startswith(prefix) and p.count(".") >= depth
    }
    return tuple(sorted(found))


def chart_keys() -> dict[str, str]:
    """Every chart value known here -> its ClusterPolicy path ("" for values outside the ClusterPolicy)."""
    return {path: dest for path, (_, dest) in _ROWS.items()}


@dataclass(frozen=True)
class MappedValues:
    """A ClusterPolicy ``document`` made from chart values, what the file set outside it, and warnings.

    ``origins`` maps each ClusterPolicy path written to the values path it came from, so a problem the
    ClusterPolicy model finds can be reported where the user wrote it.
    """

    document: dict[str, Any]
    warnings: tuple[str, ...] = ()
    outside: tuple[str, ...] = ()
    origins: dict[str, str] = field(default_factory=dict)

    def values_path(self, policy_path: str) -> str:
        """``spec.daemonsets.tolerations[0].key`` -> ``daemonsets.tolerations[0].key`` (best match)."""
        best = ""
        for dest in self.origins:
            if _is_prefix(dest, policy_path) and len(dest) > len(best):
                best = dest
        if not best:
            return policy_path
        return self.origins[best] + policy_path[len(best) :]


def _is_prefix(prefix: str, path: str) -> bool:
    return path == prefix or (path.startswith(prefix) and path[len(prefix)] in ".[")


def _truthy(value: object) -> bool:
    """Go template truthiness: false, 0, "", null and empty lists and mappings are false."""
    return value not in (None, False, 0, "") and value != [] and value != {}


def _quote(value: object) -> object:
    """Helm's ``quote`` of a scalar: ``550.54`` (a YAML number) -> ``"550.54"``, ``true`` -> ``"true"``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if value is None:
        return ""
    return value  # strings as they are; anything else for the model to refuse


def _deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Helm's values merge: mappings merged key by key, anything else replaced by the file's value."""
    out = dict(base)
    for key, value in over.items():
        old = out.get(key)
        if isinstance(old, dict) and isinstance(value, dict):
            out[key] = _deep_merge(old, value)
        else:
            out[key] = value
    return out


def _fmt(path: tuple[str | int, ...]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class _Mapper:
    def __init__(self, values: Mapping[str, Any]) -> None:
        self.given = values
        self.values = _deep_merge(CHART_DEFAULTS, values)
        self.spec: dict[str, Any] = {}
        self.origins: dict[str, str] = {}
        self.warnings: list[str] = []
        self.outside: list[str] = []
        self.problems: list[str] = []

    # ------------------------------------------------------------------------------------- reading values

    def lookup(self, path: str, values: Mapping[str, Any] | None = None) -> tuple[bool, Any]:
        current: Any = self.values if values is None else values
        for part in path.split("."):
            if not isinstance(current, dict) or part not in current:
                return False, None
            current = current[part]
        return True, current

    def put(self, dest: str, value: Any, origin: str) -> None:
        parts = dest.split(".")
        assert parts[0] == "spec"
        node = self.spec
        for part in parts[1:-1]:
            nxt = node.get(part)
            if not isinstance(nxt, dict):
                nxt = node[part] = {}
            node = nxt
        node[parts[-1]] = value
        self.origins[dest] = origin
        # The sections above, where both paths agree (spec.driver <- driver): a problem the model finds
        # with a whole section is reported at the section the user wrote.
        inner, outer = parts[1:], origin.split(".")
        for i in range(1, min(len(inner), len(outer))):
            if inner[:i] != outer[:i]:
                break
            self.origins.setdefault("spec." + ".".join(inner[:i]), ".".join(outer[:i]))

    # ------------------------------------------------------------------------------------ checking keys

    def check(self, data: Mapping[Any, Any], prefix: tuple[str | int, ...]) -> None:
        """Warn about keys the chart does not have; sections must be mappings."""
        section = ".".join(str(p) for p in prefix)
        for key, value in data.items():
            path = (*prefix, str(key))
            dotted = f"{section}.{key}" if section else str(key)
            if dotted in _ROWS:
                if _ROWS[dotted][0] == _OUTSIDE:
                    self.outside.append(_fmt(path))
                continue
            if dotted in _SECTIONS:
                if value is None:
                    continue
                if not isinstance(value, dict):
                    self.problems.append(f"{_fmt(path)}: must be a mapping (a section of the chart's values)")
                    continue
                self.check(value, path)
                continue
            self.warnings.append(f"{_fmt(path)}: {self.unknown(section, str(key))}")

    def unknown(self, section: str, key: str) -> str:
        message = "not a value of the GPU Operator chart (ignored)"
        close = difflib.get_close_matches(key, _children(section), n=1, cutoff=0.6)
        if close:
            message += f"; did you mean {close[0]}?"
        return message

    # ------------------------------------------------------------------------------------------ mapping

    def run(self) -> None:
        self.check(self.given, ())
        if self.problems:
            return
        for path, (kind, dest) in _ROWS.items():
            if kind in (_OUTSIDE, _SPECIAL):
                continue
            found, value = self.lookup(path)
            if not found:
                continue
            if kind == _ALWAYS:
                self.put(dest, value, path)
            elif _truthy(value):
                self.put(dest, _quote(value) if kind == _STR else value, path)
        for special in _SPECIALS:
            special(self)


def _validator_envs(m: _Mapper) -> None:
    for sub in ("plugin", "cuda", "driver", "toolkit", "vfioPCI", "vgpuManager", "vgpuDevices"):
        found, section = m.lookup(f"validator.{sub}")
        if found and _truthy(section):
            env = section.get("env") if isinstance(section, dict) else None
            m.put(f"spec.validator.{sub}.env", env if _truthy(env) else [], f"validator.{sub}.env")


def _cdi(m: _Mapper) -> None:
    _, enabled = m.lookup("cdi.enabled")
    found, nri = m.lookup("cdi.nriPluginEnabled")
    if found and _truthy(enabled) and _truthy(nri):
        m.put("spec.cdi.nriPluginEnabled", nri, "cdi.nriPluginEnabled")


def _rolling_update(m: _Mapper) -> None:
    found, section = m.lookup("daemonsets.rollingUpdate")
    if found and _truthy(section):
        value = section.get("maxUnavailable") if isinstance(section, dict) else None
        m.put(
            "spec.daemonsets.rollingUpdate.maxUnavailable",
            _quote(value),
            "daemonsets.rollingUpdate.maxUnavailable",
        )


def _upgrade_policy(m: _Mapper) -> None:
    found, given = m.lookup("driver.upgradePolicy")
    if not found or not _truthy(given) or not isinstance(given, dict):
        if found and given is not None and not isinstance(given, dict):
            m.problems.append("driver.upgradePolicy: must be a mapping (a section of the chart's values)")
        return
    policy = _deep_merge(_UPGRADE_DEFAULTS, given)

    def get(path: str, default: object = None) -> object:
        found, value = m.lookup(path, policy)
        if default is not None and not _truthy(value):  # the template's `| default x`
            return default
        return value if found else None

    out: dict[str, Any] = {
        "autoUpgrade": get("autoUpgrade", False),
        "maxParallelUpgrades": get("maxParallelUpgrades", 0),
        "maxUnavailable": get("maxUnavailable", "25%"),
        "waitForCompletion": {"timeoutSeconds": get("waitForCompletion.timeoutSeconds")},
        "podDeletion": {
            "force": get("gpuPodDeletion.force", False),
            "timeoutSeconds": get("gpuPodDeletion.timeoutSeconds"),
            "deleteEmptyDir": get("gpuPodDeletion.deleteEmptyDir", False),
        },
        "drain": {
            "enable": get("drain.enable", False),
            "force": get("drain.force", False),
            "timeoutSeconds": get("drain.timeoutSeconds"),
            "deleteEmptyDir": get("drain.deleteEmptyDir", False),
        },
    }
    for section, key in (("waitForCompletion", "podSelector"), ("drain", "podSelector")):
        value = get(f"{section}.{key}")
        if _truthy(value):
            out[section][key] = value
    m.put("spec.driver.upgradePolicy", out, "driver.upgradePolicy")
    for section, dest, _ in _UPGRADE_SECTIONS:
        m.origins[f"spec.driver.upgradePolicy.{dest}"] = f"driver.upgradePolicy.{section}"


def _named_config(name: str, *, default_always: bool) -> Callable[[_Mapper], None]:
    """``<component>.config``: name and default into the ClusterPolicy; create/data too (the chart makes
    that ConfigMap itself, gpunode's render does it from the ClusterPolicy)."""

    def apply(m: _Mapper) -> None:
        found, config = m.lookup(f"{name}.config")
        if not found or not isinstance(config, dict):
            return
        cname = config.get("name")
        if default_always:  # migManager: whenever config is set; the default always, quoted
            if not _truthy(config):
                return
        elif not _truthy(cname):  # devicePlugin: only with a ConfigMap name
            return
        if _truthy(cname):
            m.put(f"spec.{name}.config.name", cname, f"{name}.config.name")
        m.put(f"spec.{name}.config.default", _quote(config.get("default")), f"{name}.config.default")
        if config.get("create") is True:
            m.put(f"spec.{name}.config.create", True, f"{name}.config.create")
            if "data" in config:
                m.put(f"spec.{name}.config.data", config["data"], f"{name}.config.data")

    return apply


def _optional_section(name: str) -> Callable[[_Mapper], None]:
    """gds / gdrcopy: the whole section written only when the file has one (enabled defaults to false)."""

    def apply(m: _Mapper) -> None:
        found, section = m.lookup(name)
        if found and _truthy(section) and isinstance(section, dict):
            m.put(f"spec.{name}.enabled", bool(_truthy(section.get("enabled"))), f"{name}.enabled")

    return apply


def _cc_manager(m: _Mapper) -> None:
    found, mode = m.lookup("ccManager.defaultMode")
    if found:
        m.put("spec.ccManager.defaultMode", _quote(mode), "ccManager.defaultMode")


_SPECIALS: tuple[Callable[[_Mapper], None], ...] = (
    _validator_envs,
    _cdi,
    _rolling_update,
    _upgrade_policy,
    _named_config("devicePlugin", default_always=False),
    _named_config("migManager", default_always=True),
    _optional_section("gds"),
    _optional_section("gdrcopy"),
    _cc_manager,
)


def _order(spec: dict[str, Any]) -> dict[str, Any]:
    """Sections in the order of the chart's template (gds/gdrcopy/... are written by later passes)."""
    order = [p.split(".")[1] for _, (_, p) in _ROWS.items() if p.startswith("spec.")]
    rank = {key: i for i, key in reversed(list(enumerate(order)))}
    return dict(sorted(spec.items(), key=lambda kv: rank.get(kv[0], len(rank))))


def map_values(values: Mapping[str, Any], source_name: str = "values") -> MappedValues:
    """Chart values (one parsed YAML mapping) -> :class:`MappedValues`; a :class:`ConfigError` naming
    ``source_name`` when a section of the chart is not a mapping or the file is a ClusterPolicy."""
    if values.get("kind") == "ClusterPolicy" or "apiVersion" in values:
        raise ConfigError(source_name, ["a ClusterPolicy, not Helm chart values: use --policy"])
    mapper = _Mapper(values)
    mapper.run()
    if mapper.problems:
        raise ConfigError(source_name, mapper.problems)
    document = {
        "apiVersion": "nvidia.com/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": "cluster-policy"},
        "spec": _order(mapper.spec),
    }
    return MappedValues(document, tuple(mapper.warnings), tuple(mapper.outside), mapper.origins)


# ------------------------------------------------------------------------------------------------ loading


@dataclass(frozen=True)
class LoadedValues:
    """A values file read, mapped and validated: the policy, warnings (values paths), chart values the
    ClusterPolicy does not carry (``outside``), and the mapped document."""

    policy: ClusterPolicy
    warnings: tuple[str, ...]
    outside: tuple[str, ...]
    mapped: MappedValues


def load_values(path: str | os.PathLike[str], *, strict: bool = False) -> LoadedValues:
    """Read a chart values file with the safe YAML loader, map it and validate the ClusterPolicy.

    Problems name the file and the values' YAML path. Keys the chart does not have are warnings, and
    with ``strict`` a :class:`ConfigError` (so are the model's warnings, as for ``--policy``).
    """
    from gpunode.api.clusterpolicy import parse_policy_text
    from gpunode.common.config import json_default, parse_yaml, read_config_text

    name = os.fspath(path)
    data = parse_yaml(read_config_text(name), name)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(name, ["top level must be a mapping (the GPU Operator chart's values)"])
    try:
        data = json.loads(json.dumps(data, default=json_default, allow_nan=False))
    except ValueError:
        raise ConfigError(name, ["values must be finite numbers (no .inf or .nan)"]) from None
    mapped = map_values(data, name)
    if strict and mapped.warnings:
        raise ConfigError(name, [f"{w} (--strict)" for w in mapped.warnings])
    try:
        loaded = parse_policy_text(json.dumps(mapped.document), name, strict=strict)
    except ConfigError as exc:
        raise ConfigError(name, [_at_values_path(mapped, p) for p in exc.problems]) from None
    model_warnings = tuple(_at_values_path(mapped, w) for w in loaded.warnings)
    return LoadedValues(loaded.policy, mapped.warnings + model_warnings, mapped.outside, mapped)


def _at_values_path(mapped: MappedValues, problem: str) -> str:
    """A ClusterPolicy model problem (``spec.driver.enabled: ...``) at the values path it came from."""
    where, sep, rest = problem.partition(": ")
    if not sep or not where.startswith("spec."):
        return problem
    return f"{mapped.values_path(where)}: {rest}"

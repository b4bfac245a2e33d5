"""Every config value NVIDIA accepts, in every form it accepts, fed to every agent's config loader.

Random valid NVIDIA-form files (booleans as YAML booleans or Go ``ParseBool`` strings, intervals as
integers, floats or duration strings, strategies as a list or a comma string, device lists of indices,
MIG indices and UUIDs) must load and resolve to settings: never a traceback. Random damage to a valid
file must give :class:`ConfigError` (or the usage/value error the agents map to exit 2) naming the path.
Loaders: the device plugin / feature discovery ``version: v1`` file (model + settings resolution), the
mig-parted ``version: v1`` spec, and the ClusterPolicy (every field of NVIDIA's CRD, by its schema).
"""

from __future__ import annotations

import string
from collections.abc import Callable
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpunode.api import clusterpolicy_fields
from gpunode.api.clusterpolicy import parse_policy_text
from gpunode.api.mig_config import parse_spec
from gpunode.api.plugin_config import PluginConfig
from gpunode.common.cli import parse_interval, values_from_model
from gpunode.common.config import parse_config_text
from gpunode.common.errors import ConfigError, UsageError
from gpunode.common.settings import flags_of, resolve
from gpunode.device_plugin.settings import PluginSettings, settings_from_config
from gpunode.feature_discovery.config import sharing_of
from gpunode.feature_discovery.settings import FdSettings

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ------------------------------------------------------------------------------------------ the forms

GO_BOOL_WORDS = ["true", "false", "True", "False", "TRUE", "FALSE", "1", "0", "t", "f", "T", "F"]
bools = st.booleans() | st.sampled_from(GO_BOOL_WORDS)


def _positive(text: str) -> bool:
    seconds = parse_interval(text)
    return seconds is not None and seconds > 0


def _duration_text(parts: list[tuple[int, str]]) -> str:
    return "".join(f"{n}{unit}" for n, unit in parts)


durations = (
    st.integers(1, 10**6)
    | st.floats(0.001, 10**6, allow_nan=False, allow_infinity=False)
    | st.integers(1, 10**6).map(str)
    | st.lists(
        st.tuples(st.integers(1, 999), st.sampled_from(["h", "m", "s", "ms", "us"])), min_size=1, max_size=3
    )
    .map(_duration_text)
    .filter(_positive)
    | st.sampled_from(["infinite", "Infinite", "60s", "1h30m", "500ms"])
)

STRATEGIES = ["envvar", "volume-mounts", "cdi-annotations", "cdi-cri"]
strategy_lists = st.lists(st.sampled_from(STRATEGIES), min_size=1, max_size=4, unique=True)
device_list_strategy = strategy_lists | strategy_lists.map(",".join)

_dns_label = st.text(string.ascii_lowercase + string.digits, min_size=1, max_size=12)
resource_names = st.sampled_from(
    ["gpu", "nvidia.com/gpu", "mig-1g.5gb", "nvidia.com/mig-3g.20gb", "gpu-shared"]
)
renames = st.builds(lambda a, b: f"{a}-{b}", _dns_label, _dns_label) | st.sampled_from(
    ["gpu.shared", "nvidia.com/x"]
)
uuids = st.uuids().map(lambda u: f"GPU-{u}") | st.uuids().map(lambda u: f"MIG-{u}")
device_refs = (
    st.integers(0, 15)
    | st.integers(0, 15).map(str)
    | st.builds("{}:{}".format, st.integers(0, 7), st.integers(0, 6))
    | uuids
)
devices = (
    st.just("all")
    | st.integers(1, 64)
    | st.lists(device_refs, min_size=1, max_size=6, unique_by=lambda r: str(r))
)


def optional(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A mapping holding any subset of ``fields``."""
    return st.fixed_dictionaries({}, optional=fields)


shared_resources = st.builds(
    lambda name, replicas, extra: {"name": name, "replicas": replicas, **extra},
    resource_names,
    st.integers(2, 64),
    optional(rename=renames, devices=devices),
)

plugin_files = optional(
    version=st.sampled_from(["v1", ""]),
    flags=optional(
        migStrategy=st.sampled_from(["none", "single", "mixed"]),
        failOnInitError=bools,
        nvidiaDriverRoot=st.sampled_from(["/", "/run/nvidia/driver"]),
        nvidiaDevRoot=st.sampled_from(["/", "/run/nvidia/driver"]),
        mpsRoot=st.just("/run/nvidia/mps"),
        gdsEnabled=bools,
        mofedEnabled=bools,
        gdrcopyEnabled=bools,
        deviceDiscoveryStrategy=st.sampled_from(["auto", "nvml", "tegra"]),
        useNodeFeatureAPI=bools,
        gfd=optional(
            oneshot=bools,
            noTimestamp=bools,
            sleepInterval=durations,
            outputFile=st.sampled_from(["", "/etc/kubernetes/node-feature-discovery/features.d/gfd"]),
            machineTypeFile=st.just("/sys/class/dmi/id/product_name"),
        ),
        plugin=optional(
            passDeviceSpecs=bools,
            deviceListStrategy=device_list_strategy,
            deviceIDStrategy=st.sampled_from(["uuid", "index"]),
            cdiAnnotationPrefix=st.just("cdi.k8s.io/"),
            nvidiaCTKPath=st.just("/usr/bin/nvidia-ctk"),
            containerDriverRoot=st.just("/driver-root"),
        ),
        gpunode=optional(timeSlicingExtensions=bools),
    ),
    resources=optional(
        gpus=st.lists(st.fixed_dictionaries({"pattern": st.just("*A100*"), "name": renames}), max_size=2),
        mig=st.lists(st.fixed_dictionaries({"pattern": st.just("1g.5gb"), "name": renames}), max_size=2),
    ),
    sharing=optional(
        timeSlicing=st.builds(
            lambda resources, extra: {"resources": resources, **extra},
            st.lists(
                shared_resources,
                min_size=1,
                max_size=4,
                unique_by=lambda r: (r["name"].removeprefix("nvidia.com/"), str(r.get("devices", "all"))),
            ),
            optional(renameByDefault=bools, failRequestsGreaterThanOne=bools),
        )
    ),
    imex=optional(channelIDs=st.sampled_from([[], [0]]), required=bools),
)


def dump(doc: object) -> str:
    return yaml.safe_dump(doc, sort_keys=False)


def load_all(text: str) -> tuple[PluginConfig, PluginSettings, FdSettings]:
    """What the device plugin and feature discovery make of ``text``: the model, then their settings."""
    cfg = parse_config_text(text, "config.yaml", PluginConfig)
    plugin = settings_from_config(cfg, {})
    fd, _ = resolve(FdSettings, {}, {}, values_from_model(flags_of(FdSettings), cfg))
    parse_interval(fd.sleep_interval)
    sharing_of(cfg)
    cfg.ignored_fields()
    return cfg, plugin, fd


# -------------------------------------------------------------------------- the device plugin and GFD


@SETTINGS
@given(plugin_files)
def test_every_nvidia_form_loads_for_the_plugin_and_feature_discovery(doc: dict[str, Any]) -> None:
    cfg, plugin, fd = load_all(dump(doc))
    flags = doc.get("flags", {})
    for key, setting in (("failOnInitError", plugin.fail_on_init_error), ("gdsEnabled", plugin.gds_enabled)):
        if key in flags:
            assert setting is (str(flags[key]) in ("True", "true", "TRUE", "1", "t", "T"))
    assert isinstance(fd.oneshot, bool)
    assert isinstance(fd.no_timestamp, bool)
    if "oneshot" in flags.get("gfd", {}):
        assert fd.oneshot is (str(flags["gfd"]["oneshot"]) in ("True", "true", "TRUE", "1", "t", "T"))
    strategy = flags.get("plugin", {}).get("deviceListStrategy")
    if strategy is not None:
        want = strategy.split(",") if isinstance(strategy, str) else strategy
        assert plugin.device_list_strategies == tuple(want)
    ts = plugin.sharing
    if ts is not None and not cfg.extensions:  # NVIDIA's semantics: every device, the default names
        assert all(r.devices == "all" and r.rename is None for r in ts.resources)
        assert plugin.gpu_resources == () == plugin.mig_resources


def _paths(doc: object, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = [prefix] if prefix else []
    if isinstance(doc, dict):
        for key, value in doc.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            out += _paths(value, (*prefix, index))
    return out


def _replace(doc: Any, path: tuple[Any, ...], value: object) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(doc, dict):
        return {**doc, head: _replace(doc[head], rest, value)}
    copy = list(doc)
    copy[head] = _replace(doc[head], rest, value)
    return copy


junk = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**20), 10**20)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
    | st.sampled_from(["yes", "no", "on", "-5s", "1x", "infinite", "GPU-", "0:", "all,", ""]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)


@SETTINGS
@given(plugin_files, st.data())
def test_damaged_files_are_config_errors_naming_the_path(doc: dict[str, Any], data: st.DataObject) -> None:
    paths = _paths(doc)
    if paths:
        doc = _replace(doc, data.draw(st.sampled_from(paths)), data.draw(junk))
    error = refusal(lambda: load_all(dump(doc)))
    if isinstance(error, ConfigError):
        assert error.problems
        assert all(problem.strip() for problem in error.problems)
    elif error is not None:  # a UsageError or ValueError: the agents' start turns these into exit 2 too
        assert str(error)


def refusal(load: Callable[[], object]) -> Exception | None:
    """The error ``load`` refuses its input with (exit 2 in the agents); None when it loads. Any other
    exception propagates: that would be a traceback."""
    try:
        load()
    except (ConfigError, UsageError, ValueError) as exc:
        return exc
    return None


# ------------------------------------------------------------------------------------------- mig-parted

PROFILES = ["1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb", "1g.5gb+me", "1c.3g.20gb"]
pci_ids = st.sampled_from(["0x20B010DE", "0x20B210DE", "0x233510DE", "0x20B010DE:0x134F10DE"])
mig_entries = st.builds(
    lambda devices, enabled, profiles, extra: {
        "devices": devices,
        "mig-enabled": enabled,
        **({"mig-devices": profiles} if enabled else {}),
        **extra,
    },
    st.just("all") | st.lists(st.integers(0, 7), min_size=1, max_size=8, unique=True),
    st.booleans(),  # mig-parted reads mig-enabled into a Go bool: a quoted "true" is refused there too
    st.dictionaries(st.sampled_from(PROFILES[:6]), st.integers(1, 7), max_size=3),
    optional(**{"device-filter": pci_ids | st.lists(pci_ids, min_size=1, max_size=3, unique=True)}),
)
mig_specs = st.builds(
    lambda configs: {"version": "v1", "mig-configs": configs},
    st.dictionaries(
        st.text(string.ascii_lowercase + string.digits + "-.", min_size=1, max_size=16),
        st.lists(mig_entries, min_size=1, max_size=3),
        min_size=1,
        max_size=4,
    ),
)


@SETTINGS
@given(mig_specs)
def test_every_mig_parted_form_loads(doc: dict[str, Any]) -> None:
    spec = parse_spec(dump(doc), "config.yaml")
    for name, entries in doc["mig-configs"].items():
        parsed = spec.select(name)
        for entry, raw in zip(parsed, entries, strict=True):
            assert entry.mig_enabled is raw["mig-enabled"]


@SETTINGS
@given(mig_specs, st.data())
def test_damaged_mig_specs_are_config_errors(doc: dict[str, Any], data: st.DataObject) -> None:
    doc = _replace(doc, data.draw(st.sampled_from(_paths(doc))), data.draw(junk))
    error = refusal(lambda: parse_spec(dump(doc), "config.yaml"))
    assert error is None or (isinstance(error, ConfigError) and error.problems)


# -------------------------------------------------------------------------------------- ClusterPolicy


def _from_schema(schema: dict[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
    """Values valid for one OpenAPI schema of NVIDIA's CRD (objects with any subset of their fields)."""
    if "anyOf" in schema:  # int-or-string (quantities: a number, or a number with a suffix)
        if "pattern" in schema:
            return st.integers(0, 64) | st.sampled_from(["100m", "1Gi", "512Mi", "2"])
        return st.integers(0, 64) | st.sampled_from(["25%", "1", "0"])
    kind = schema.get("type")
    if kind == "boolean":
        return st.booleans()
    if kind == "integer":
        return st.integers(schema.get("minimum", 0), 3600)
    if kind == "string":
        if "enum" in schema:
            return st.sampled_from(schema["enum"])
        if "pattern" in schema:
            return st.from_regex(schema["pattern"], fullmatch=True).filter(lambda s: 0 < len(s) < 30)
        return st.text(string.ascii_letters + string.digits + "-./:", min_size=1, max_size=20)
    if kind == "array":
        return st.lists(_from_schema(schema.get("items", {"type": "string"}), depth + 1), max_size=2)
    if kind == "object":
        props = schema.get("properties")
        if props:
            required = set(schema.get("required", ()))
            return st.fixed_dictionaries(
                {k: _from_schema(v, depth + 1) for k, v in props.items() if k in required},
                optional={k: _from_schema(v, depth + 1) for k, v in props.items() if k not in required},
            )
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            return st.dictionaries(
                st.sampled_from(["a", "b", "cpu", "memory"]), _from_schema(extra, depth + 1), max_size=2
            )
        return st.just({})
    return st.none()


policy_specs = _from_schema(clusterpolicy_fields.nvidia_spec_schema())


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(policy_specs)
def test_every_cluster_policy_field_in_nvidias_forms_loads(spec: dict[str, Any]) -> None:
    doc = {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "p"}, "spec": spec}
    error = refusal(lambda: parse_policy_text(dump(doc), "policy.yaml"))
    # Loads; or, where the schema allows what Kubernetes refuses later (an env var named "0", an empty
    # priorityClassName), a ConfigError naming the spec path and the reason: never a traceback.
    if error is not None:
        assert isinstance(error, ConfigError), error
        assert all(p.startswith("spec.") and ": " in p for p in error.problems), error.problems

"""gpunode.api.plugin_config: NVIDIA's v1 config file, strictly, and the settings it gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpunode.api.plugin_config import PluginConfig
from gpunode.api.plugin_types import (
    ResourcePattern,
    SharedResource,
    TimeSlicing,
    normalize_resource_name,
    parse_device_list_strategy,
)
from gpunode.common.config import ConfigError, load_config, parse_config_text
from gpunode.device_plugin.settings import PluginSettings, settings_from_config

# NVIDIA's documented example (shared/reference/device-plugin.md §2.3), every key present.
NVIDIA_EXAMPLE = """\
version: v1
flags:
  migStrategy: none
  failOnInitError: true
  nvidiaDriverRoot: /
  nvidiaDevRoot: /
  mpsRoot: /run/nvidia/mps
  gdsEnabled: false
  mofedEnabled: false
  gdrcopyEnabled: false
  deviceDiscoveryStrategy: auto
  useNodeFeatureAPI: false
  gfd:
    oneshot: false
    sleepInterval: 60s
  plugin:
    passDeviceSpecs: false
    deviceListStrategy: [envvar]
    deviceIDStrategy: uuid
    cdiAnnotationPrefix: cdi.k8s.io/
    nvidiaCTKPath: /usr/bin/nvidia-ctk
    containerDriverRoot: /driver-root
    sharedDevicesAllocationPolicy: distributed
resources:
  gpus: [{pattern: "*", name: gpu}]
  mig:  [{pattern: "1g.5gb", name: mig-1g.5gb}]
sharing:
  timeSlicing:
    renameByDefault: false
    failRequestsGreaterThanOne: false
    resources:
    - name: nvidia.com/gpu
      replicas: 10
      devices: all
      rename: my-gpu
imex:
  channelIDs: [0]
  required: false
"""


def parse(text: str) -> PluginConfig:
    return parse_config_text(text, "config.yaml", PluginConfig)


def problems(text: str) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as info:
        parse(text)
    return info.value.problems


def sharing_yaml(entry: str, extra: str = "") -> str:
    return f"version: v1\nsharing:\n  timeSlicing:\n{extra}    resources:\n    - {entry}\n"


# ------------------------------------------------------------------------------------------ parsing


def test_nvidia_example_parses_key_for_key() -> None:
    cfg = parse(NVIDIA_EXAMPLE)
    assert cfg.version == "v1"
    assert cfg.flags.mig_strategy == "none"
    assert cfg.flags.use_node_feature_api is False
    assert cfg.flags.gfd == {"oneshot": False, "sleepInterval": "60s"}
    assert cfg.flags.plugin is not None
    assert cfg.flags.plugin.device_list_strategy == ("envvar",)
    assert cfg.flags.plugin.device_id_strategy == "uuid"
    assert cfg.flags.plugin.nvidia_ctk_path == "/usr/bin/nvidia-ctk"
    assert cfg.resources.gpus[0].name == "nvidia.com/gpu"
    assert cfg.resources.mig[0].name == "nvidia.com/mig-1g.5gb"
    assert cfg.sharing.time_slicing is not None
    entry = cfg.sharing.time_slicing.resources[0]
    assert (entry.name, entry.replicas, entry.devices, entry.rename) == (
        "nvidia.com/gpu",
        10,
        "all",
        "nvidia.com/my-gpu",
    )
    assert cfg.imex.channel_ids == (0,)


def test_nvidia_example_gives_nvidias_settings() -> None:
    """As NVIDIA's plugin: ``resources`` and the entry's ``rename`` ignored, each with NVIDIA's warning."""
    cfg = parse(NVIDIA_EXAMPLE)
    settings = settings_from_config(cfg, {})
    assert settings == PluginSettings(
        mps_root="/run/nvidia/mps",
        sharing=TimeSlicing(resources=(SharedResource("nvidia.com/gpu", 10),)),
        imex_channel_ids=(0,),
    )
    assert cfg.ignored_fields() == (
        "Customizing the 'resources' field is not yet supported in the config. Ignoring...",
        "Setting the 'rename' field in sharing.timeSlicing.resources is not yet supported in the config. "
        "Ignoring...",
    )


def test_nvidia_example_with_gpunode_extensions_gives_settings() -> None:
    cfg = parse(NVIDIA_EXAMPLE.replace("flags:\n", "flags:\n  gpunode: {timeSlicingExtensions: true}\n", 1))
    assert cfg.ignored_fields() == ()
    settings = settings_from_config(cfg, {})
    assert settings == PluginSettings(
        mps_root="/run/nvidia/mps",
        sharing=TimeSlicing(
            resources=(SharedResource("nvidia.com/gpu", 10, "all", "nvidia.com/my-gpu"),),
        ),
        imex_channel_ids=(0,),
        gpu_resources=(ResourcePattern("*", "nvidia.com/gpu"),),
        mig_resources=(ResourcePattern("1g.5gb", "nvidia.com/mig-1g.5gb"),),
    )


def test_load_config_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(NVIDIA_EXAMPLE)
    assert load_config(path, PluginConfig) == parse(NVIDIA_EXAMPLE)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty-file"),
        pytest.param("version: v1\n", id="version-only"),
        pytest.param("version: ''\n", id="empty-version"),
        pytest.param("version:\n", id="null-version"),
        pytest.param("flags: {}\n", id="no-version"),
    ],
)
def test_minimal_files_are_v1_with_defaults(text: str) -> None:
    cfg = parse(text)
    assert cfg.version == "v1"
    assert settings_from_config(cfg, {}) == PluginSettings()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("envvar", ("envvar",), id="single-string"),
        pytest.param("[cdi-annotations, cdi-cri]", ("cdi-annotations", "cdi-cri"), id="list"),
        pytest.param("volume-mounts,envvar", ("volume-mounts", "envvar"), id="comma-string"),
        pytest.param("[envvar, envvar]", ("envvar",), id="duplicates-dropped"),
    ],
)
def test_device_list_strategy_forms(value: str, expected: tuple[str, ...]) -> None:
    cfg = parse(f"flags:\n  plugin:\n    deviceListStrategy: {value}\n")
    assert settings_from_config(cfg, {}).device_list_strategies == expected


@pytest.mark.parametrize(
    ("devices", "expected"),
    [
        pytest.param("all", "all", id="all"),
        pytest.param("3", 3, id="count"),
        pytest.param('[0, "1:0", GPU-abc, MIG-def]', ("0", "1:0", "GPU-abc", "MIG-def"), id="references"),
        pytest.param('["2"]', ("2",), id="index-as-string"),
    ],
)
def test_time_slicing_devices_forms(devices: str, expected: object) -> None:
    cfg = parse(sharing_yaml(f"{{name: gpu, replicas: 2, devices: {devices}}}"))
    assert cfg.sharing.time_slicing is not None
    assert cfg.sharing.time_slicing.resources[0].devices == expected


def test_fail_requests_greater_than_one_unset_is_false() -> None:
    settings = settings_from_config(parse(sharing_yaml("{name: gpu, replicas: 4}")), {})
    assert settings.sharing == TimeSlicing(resources=(SharedResource("nvidia.com/gpu", 4),))


# ------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("version: v2\n", 'version: must be v1 (got "v2")', id="bad-version"),
        pytest.param(
            "flags: {migStrategy: auto}\n",
            'flags.migStrategy: must be one of none, single, mixed (got "auto")',
            id="bad-mig-strategy",
        ),
        pytest.param(
            "flags: {failOnInitError: 'yes'}\n",
            "flags.failOnInitError: must be a boolean (true or false), not a string",
            id="string-bool",
        ),
        pytest.param(
            "flags: {deviceDiscoveryStrategy: wsl}\n",
            'flags.deviceDiscoveryStrategy: must be one of auto, nvml, tegra (got "wsl")',
            id="bad-discovery",
        ),
        pytest.param(
            "flags: {plugin: {deviceListStrategy: [envvar, bogus]}}\n",
            "flags.plugin.deviceListStrategy: invalid device list strategy 'bogus': "
            "must be one of envvar, volume-mounts, cdi-annotations, cdi-cri",
            id="bad-device-list-strategy",
        ),
        pytest.param(
            "flags: {plugin: {deviceListStrategy: []}}\n",
            "flags.plugin.deviceListStrategy: no device list strategy given",
            id="empty-device-list-strategy",
        ),
        pytest.param(
            "flags: {plugin: {deviceIDStrategy: serial}}\n",
            'flags.plugin.deviceIDStrategy: must be one of uuid, index (got "serial")',
            id="bad-id-strategy",
        ),
        pytest.param(
            "flags: {plugin: {sharedDevicesAllocationPolicy: spread}}\n",
            'flags.plugin.sharedDevicesAllocationPolicy: must be one of distributed, packed (got "spread")',
            id="bad-policy",
        ),
        pytest.param(
            "flags: {failOnInitErr: true}\n",
            "flags.failOnInitErr: unknown key (did you mean failOnInitError?)",
            id="unknown-key-suggests",
        ),
        pytest.param("colour: blue\n", "colour: unknown key", id="unknown-top-level-key"),
        pytest.param(
            "flags: {plugin: {deviceIdStrategy: uuid}}\n",
            "flags.plugin.deviceIdStrategy: unknown key (did you mean deviceIDStrategy?)",
            id="nvidia-spelling-only",
        ),
        pytest.param(
            sharing_yaml("{name: gpu, replicas: 1}"),
            "sharing.timeSlicing.resources[0].replicas: must be at least 2",
            id="replicas-below-2",
        ),
        pytest.param(
            sharing_yaml("{name: gpu}"),
            "sharing.timeSlicing.resources[0].replicas: required key is missing",
            id="replicas-missing",
        ),
        pytest.param(
            "sharing:\n  timeSlicing:\n    renameByDefault: true\n",
            "sharing.timeSlicing.resources: required key is missing",
            id="resources-missing",
        ),
        pytest.param(
            "sharing:\n  timeSlicing:\n    resources: []\n",
            "sharing.timeSlicing.resources: must list at least one resource to share",
            id="resources-empty",
        ),
        pytest.param(
            sharing_yaml("{name: gpu, replicas: 2, devices: some}"),
            'sharing.timeSlicing.resources[0].devices: must be "all"',
            id="devices-bad-word",
        ),
        pytest.param(
            sharing_yaml("{name: gpu, replicas: 2, devices: 0}"),
            "sharing.timeSlicing.resources[0].devices: a device count must be at least 1 (got 0)",
            id="devices-zero",
        ),
        pytest.param(
            sharing_yaml("{name: gpu, replicas: 2, devices: [0, 0]}"),
            "sharing.timeSlicing.resources[0].devices: [1]: '0' is listed twice",
            id="devices-duplicate",
        ),
        pytest.param(
            sharing_yaml("{name: gpu, replicas: 2, devices: [gpu0]}"),
            "sharing.timeSlicing.resources[0].devices: [0]: 'gpu0' is not a device reference",
            id="devices-bad-reference",
        ),
        pytest.param(
            sharing_yaml("{name: gpu, replicas: 2, devices: true}"),
            'sharing.timeSlicing.resources[0].devices: must be "all"',
            id="devices-bool",
        ),
        pytest.param(
            sharing_yaml("{name: GPU, replicas: 2}"),
            "sharing.timeSlicing.resources[0].name: resource name 'nvidia.com/GPU': 'GPU' must be a "
            "DNS-1123 subdomain",
            id="name-upper-case",
        ),
        pytest.param(
            sharing_yaml("{name: gpu, replicas: 2, rename: " + "x" * 60 + "}"),
            "sharing.timeSlicing.resources[0].rename: resource name 'nvidia.com/"
            + "x" * 60
            + "' is 71 characters long; at most 63 are allowed",
            id="rename-too-long",
        ),
        pytest.param(
            sharing_yaml("{name: example.com/gpu, replicas: 2}"),
            "sharing.timeSlicing.resources[0].name: resource name 'example.com/gpu': only resources in "
            "the nvidia.com/ domain are allowed",
            id="foreign-domain",
        ),
        pytest.param(
            "sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 2}\n"
            "    - {name: nvidia.com/gpu, replicas: 4}\n",
            "sharing.timeSlicing.resources: [1] repeats [0] (nvidia.com/gpu with the same devices)",
            id="duplicate-entry",
        ),
        pytest.param(
            "flags: {migStrategy: mixed}\nsharing:\n  mps:\n    resources:\n    - {name: gpu, replicas: 2}\n",
            "sharing: MPS sharing (sharing.mps) is not supported with mig-strategy mixed",
            id="mps-with-mixed-refused",
        ),
        pytest.param(
            "sharing:\n  mps:\n    resources:\n    - {name: gpu, replicas: 1}\n",
            "sharing.mps.resources[0].replicas: must be at least 2 (got 1)",
            id="mps-replicas",
        ),
        pytest.param(
            "imex: {channelIDs: [1]}\n", "imex.channelIDs: must be [] or [0] (got [1])", id="imex-channel"
        ),
        pytest.param(
            "resources:\n  gpus: [{pattern: '', name: gpu}]\n",
            "resources.gpus[0].pattern: must not be empty",
            id="empty-pattern",
        ),
        pytest.param(
            "resources:\n  mig: [{pattern: '1g.5gb', name: 'Mig_1g'}]\n",
            "resources.mig[0].name: resource name 'nvidia.com/Mig_1g'",
            id="bad-pattern-name",
        ),
    ],
)
def test_errors_name_their_yaml_path(text: str, expected: str) -> None:
    found = problems(text)
    assert any(p.startswith(expected) for p in found), found


def test_every_problem_is_reported_at_once() -> None:
    text = (
        "version: v3\n"
        "flags: {migStrategy: all, plugin: {deviceListStrategy: nope}}\n"
        "sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 1}\n"
        "  mps:\n    resources:\n    - {name: gpu, replicas: 1}\n"
    )
    paths = [p.split(":", 1)[0] for p in problems(text)]
    assert paths == [
        "version",
        "flags.migStrategy",
        "flags.plugin.deviceListStrategy",
        "sharing.timeSlicing.resources[0].replicas",
        "sharing.mps.resources[0].replicas",
    ]


# ----------------------------------------------------------------------------------------- helpers


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param("gpu", "nvidia.com/gpu", id="prefix-added"),
        pytest.param("nvidia.com/gpu", "nvidia.com/gpu", id="prefix-kept"),
        pytest.param("gpu.shared", "nvidia.com/gpu.shared", id="dotted"),
        pytest.param("mig-1g.10gb.me", "nvidia.com/mig-1g.10gb.me", id="mig-name"),
        pytest.param("a" * 52, "nvidia.com/" + "a" * 52, id="exactly-63"),
    ],
)
def test_normalize_resource_name(name: str, expected: str) -> None:
    assert normalize_resource_name(name) == expected


@pytest.mark.parametrize(
    ("name", "message"),
    [
        pytest.param("a" * 53, "is 64 characters long; at most 63", id="64-chars"),
        pytest.param("", "is empty", id="empty"),
        pytest.param("nvidia.com/", "is empty", id="prefix-only"),
        pytest.param("-gpu", "DNS-1123 subdomain", id="leading-dash"),
        pytest.param("gpu_shared", "DNS-1123 subdomain", id="underscore"),
        pytest.param("gpu..x", "DNS-1123 subdomain", id="empty-label"),
        pytest.param("a/b", "only resources in the nvidia.com/ domain", id="other-domain"),
    ],
)
def test_normalize_resource_name_rejects(name: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        normalize_resource_name(name)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("envvar", ("envvar",), id="one"),
        pytest.param("envvar,cdi-cri", ("envvar", "cdi-cri"), id="two"),
        pytest.param(" cdi-annotations , cdi-cri ,", ("cdi-annotations", "cdi-cri"), id="spaces-trailing"),
        pytest.param(["volume-mounts"], ("volume-mounts",), id="list"),
    ],
)
def test_parse_device_list_strategy(text: str | list[str], expected: tuple[str, ...]) -> None:
    assert parse_device_list_strategy(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("envvar,mounts", "invalid device list strategy 'mounts': must be one of", id="bad"),
        pytest.param("", "no device list strategy given", id="empty"),
        pytest.param(" , ", "no device list strategy given", id="only-commas"),
    ],
)
def test_parse_device_list_strategy_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_device_list_strategy(text)


def test_models_and_settings_are_frozen() -> None:
    cfg = parse(NVIDIA_EXAMPLE)
    with pytest.raises(ValueError, match="frozen"):
        cfg.version = "v1"
    settings = settings_from_config(cfg, {})
    with pytest.raises(AttributeError):
        settings.mig_strategy = "mixed"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("pattern", "text", "matches"),
    [
        pytest.param("*", "NVIDIA A100-SXM4-40GB", True, id="star"),
        pytest.param("*a100*", "NVIDIA A100-SXM4-40GB", True, id="case-insensitive"),
        pytest.param("A100", "NVIDIA A100-SXM4-40GB", False, id="anchored"),
        pytest.param("1g.5gb", "1g.5gb", True, id="exact"),
        pytest.param("1g.5gb", "1gx5gb", False, id="dot-is-literal"),
        pytest.param("1g.*", "1g.10gb+me", True, id="prefix"),
    ],
)
def test_resource_pattern_matching(pattern: str, text: str, matches: bool) -> None:
    assert ResourcePattern(pattern, "nvidia.com/x").matches(text) is matches

"""Runtime configuration (gpunode.toolkit.runtime): rendering, plans, revert records, handler checks."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import tomlkit

from gpunode.common.errors import ConfigError
from gpunode.toolkit import runtime as rt

BIN = "/usr/local/nvidia/toolkit/nvidia-container-runtime"

CTD_V1 = """\
# legacy containerd config: no version key, so version 1
root = "/var/lib/containerd"
oom_score = -999

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins.cri]
  sandbox_image = "k8s.gcr.io/pause:3.6"   # old pause image
  [plugins.cri.containerd]
    snapshotter = "overlayfs"
    [plugins.cri.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.cri.containerd.runtimes.runc.options]
        SystemdCgroup = true   # systemd cgroup driver
"""

CTD_V2 = """\
# containerd config, managed by hand
version = 2
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"   # the CRI socket

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "registry.k8s.io/pause:3.9"   # pinned
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes]
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
          runtime_type = "io.containerd.runc.v2"
          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
            SystemdCgroup = true    # cgroup v2 + systemd
    [plugins."io.containerd.grpc.v1.cri".registry]
      config_path = "/etc/containerd/certs.d"
"""

# flat headers, dotted keys, single quotes, a table between two parts of the CRI section
CTD_V2_FLAT = """\
version = 2
imports = ['/etc/containerd/extra.toml']  # site extras

[plugins.'io.containerd.grpc.v1.cri'.containerd.runtimes.runc]
runtime_type = 'io.containerd.runc.v2'
options.SystemdCgroup = true  # dotted key

[metrics]
address = '127.0.0.1:1338'

[plugins.'io.containerd.grpc.v1.cri'.registry.mirrors.'docker.io']
endpoint = ['https://mirror.example.com']
"""

CTD_V3 = """\
# containerd 2.x
version = 3
root = '/var/lib/containerd'

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'

  [plugins.'io.containerd.cri.v1.runtime']
    enable_selinux = false
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes]
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
          runtime_type = 'io.containerd.runc.v2'
          [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
            SystemdCgroup = true
"""

CRIO_CONF = """\
# crio.conf (distribution default, trimmed)
[crio]
log_dir = "/var/log/crio/pods"

[crio.runtime]
default_runtime = "crun"   # crun is faster

[crio.runtime.runtimes.crun]
runtime_path = "/usr/bin/crun"
runtime_root = "/run/crun"
monitor_path = "/usr/libexec/crio/conmon"
allowed_annotations = ["io.containers.trace-syscall"]
"""

CONTAINERD_CONFIGS = {"v1": CTD_V1, "v2": CTD_V2, "v2-flat": CTD_V2_FLAT, "v3": CTD_V3}
CRI_KEY = {"v1": "cri", "v2": "io.containerd.grpc.v1.cri", "v2-flat": "io.containerd.grpc.v1.cri"}
CRI_KEY["v3"] = "io.containerd.cri.v1.runtime"


def opts(runtime: str = "containerd", *, drop_in: str | None = None, **kw: object) -> rt.ConfigureOptions:
    config = "/etc/containerd/config.toml" if runtime == "containerd" else "/etc/crio/crio.conf"
    return rt.ConfigureOptions(runtime=runtime, config=config, drop_in=drop_in, **kw)  # type: ignore[arg-type]


def runtimes_of(text: str, key: str) -> dict[str, object]:
    doc = tomlkit.parse(text).unwrap()
    return dict(doc["plugins"][key]["containerd"]["runtimes"])


# ------------------------------------------------------------------------------- in-place edit


@pytest.mark.parametrize("name", list(CONTAINERD_CONFIGS))
def test_in_place_adds_three_handlers_copying_runc(name: str) -> None:
    source = CONTAINERD_CONFIGS[name]
    out = rt.render_containerd(source, opts(enable_cdi=True)).main
    assert out is not None
    runtimes = runtimes_of(out, CRI_KEY[name])
    assert list(runtimes)[-3:] == ["nvidia", "nvidia-cdi", "nvidia-legacy"]
    nvidia = runtimes["nvidia"]
    assert isinstance(nvidia, dict)
    assert nvidia["runtime_type"] == "io.containerd.runc.v2"
    assert nvidia["options"]["BinaryName"] == BIN
    assert nvidia["options"]["SystemdCgroup"] is True  # copied from runc
    if name == "v1":
        assert nvidia["options"]["Runtime"] == BIN  # as NVIDIA writes version-1 configs
    else:
        assert "Runtime" not in nvidia["options"]
    cri = tomlkit.parse(out).unwrap()["plugins"][CRI_KEY[name]]
    assert cri["enable_cdi"] is True
    assert cri["cdi_spec_dirs"] == ["/etc/cdi", "/var/run/cdi"]
    # every original line survives, comments included, in the same order
    lines = out.splitlines()
    positions = [lines.index(line) for line in source.splitlines() if line.strip()]
    assert positions == sorted(positions)


def test_in_place_is_idempotent_and_styled() -> None:
    first = rt.render_containerd(CTD_V2, opts(set_as_default=True)).main
    assert first is not None
    assert rt.render_containerd(first, opts(set_as_default=True)).main == first
    # new tables take the indentation of their runc sibling
    assert '        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\n' in first
    assert '            BinaryName = "/usr/local/nvidia/toolkit/nvidia-container-runtime"\n' in first
    assert '      default_runtime_name = "nvidia"\n' in first


def test_not_default_removes_our_default_only() -> None:
    as_default = rt.render_containerd(CTD_V2, opts(set_as_default=True)).main
    assert as_default is not None
    back = rt.render_containerd(as_default, opts()).main
    assert back is not None
    assert rt.default_runtime_name(back, "containerd") is None  # ours removed: containerd uses runc
    # a default that is not ours stays
    assert rt.default_runtime_name(rt.render_containerd(CTD_V2, opts()).main or "", "containerd") == "runc"


def test_custom_runtime_name_and_paths() -> None:
    handlers = rt.handlers_from_paths("gpu", "/opt/a", "/opt/b", "/opt/c")
    out = rt.render_containerd(CTD_V2, opts(handlers=handlers, set_as_default=True)).main or ""
    runtimes = runtimes_of(out, "io.containerd.grpc.v1.cri")
    assert {n: r["options"]["BinaryName"] for n, r in runtimes.items() if n != "runc"} == {  # type: ignore[index]
        "gpu": "/opt/a",
        "nvidia-cdi": "/opt/b",
        "nvidia-legacy": "/opt/c",
    }
    assert rt.default_runtime_name(out, "containerd") == "gpu"


def test_v3_uses_the_cri_runtime_plugin() -> None:
    out = rt.render_containerd(CTD_V3, opts(enable_cdi=True)).main or ""
    doc = tomlkit.parse(out).unwrap()
    assert "nvidia" in doc["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]
    assert doc["plugins"]["io.containerd.cri.v1.runtime"]["enable_cdi"] is True
    assert "io.containerd.grpc.v1.cri" not in doc["plugins"]
    assert doc["plugins"]["io.containerd.cri.v1.images"] == {"snapshotter": "overlayfs"}


def test_minimal_runtime_without_runc() -> None:
    out = rt.render_containerd("version = 2\n", opts()).main or ""
    runtimes = runtimes_of(out, "io.containerd.grpc.v1.cri")
    assert runtimes["nvidia"] == {"runtime_type": "io.containerd.runc.v2", "options": {"BinaryName": BIN}}


# ------------------------------------------------------------------------------------ drop-in

DROP = "/etc/containerd/conf.d/99-nvidia.toml"


@pytest.mark.parametrize("name", ["v2", "v2-flat", "v3"])
def test_drop_in_copies_the_cri_section(name: str) -> None:
    source = CONTAINERD_CONFIGS[name]
    result = rt.render_containerd(source, opts(drop_in=DROP, set_as_default=True))
    assert result.drop_in is not None
    assert result.main is not None
    key = CRI_KEY[name]
    main_cri = tomlkit.parse(source).unwrap()["plugins"][key]
    drop = tomlkit.parse(result.drop_in).unwrap()
    version = 3 if name == "v3" else 2
    assert drop["version"] == version
    section = drop["plugins"][key]
    for k, v in main_cri.items():  # everything the user had is kept (containerd < 2.1 replaces tables)
        if k != "containerd":
            assert section[k] == v
    assert section["containerd"]["runtimes"]["runc"] == main_cri["containerd"]["runtimes"]["runc"]
    assert section["containerd"]["default_runtime_name"] == "nvidia"
    # the main config only gains the import, at the top level
    main = tomlkit.parse(result.main).unwrap()
    assert "/etc/containerd/conf.d/*.toml" in main["imports"]
    assert tomlkit.parse(source).unwrap()["plugins"] == main["plugins"]


def test_drop_in_import_appended_to_existing_list() -> None:
    result = rt.render_containerd(CTD_V2_FLAT, opts(drop_in=DROP))
    assert result.main is not None
    assert result.main.splitlines()[1] == (
        "imports = ['/etc/containerd/extra.toml', \"/etc/containerd/conf.d/*.toml\"]  # site extras"
    )


@pytest.mark.parametrize(
    ("imports", "covered"),
    [
        (["/etc/containerd/conf.d/*.toml"], True),
        (["/etc/containerd/conf.d/99-nvidia.toml"], True),
        (["conf.d/*.toml"], True),  # relative to the config's directory
        (["/etc/containerd/conf.d/*.conf"], False),
        ([], False),
    ],
)
def test_imports_cover(imports: list[str], covered: bool) -> None:
    assert rt.imports_cover(imports, DROP, "/etc/containerd") is covered
    text = "version = 2\nimports = " + json.dumps(imports) + "\n"
    result = rt.render_containerd(text, opts(drop_in=DROP))
    assert (result.main == text) is covered


def test_v1_ignores_drop_in_and_says_so() -> None:
    result = rt.render_containerd(CTD_V1, opts(drop_in=DROP))
    assert result.drop_in is None
    assert result.main is not None
    assert "nvidia" in rt.nvidia_handlers_present(result.main, "containerd")
    assert any("version 1 has no imports" in note for note in result.notes)


@pytest.mark.parametrize(("forced", "expected"), [(None, 2), (2, 2), (3, 3), (1, 1)])
def test_new_file_version(forced: int | None, expected: int) -> None:
    result = rt.render_containerd(None, opts(drop_in=DROP, config_version=forced))
    assert result.main is not None
    main = tomlkit.parse(result.main).unwrap()
    assert main.get("version", 1) == expected
    if expected == 1:
        assert result.drop_in is None
        assert "cri" in main["plugins"]
    else:
        assert main["imports"] == ["/etc/containerd/conf.d/*.toml"]
        assert result.drop_in is not None
        assert rt.CRI_PLUGIN[expected] in tomlkit.parse(result.drop_in).unwrap()["plugins"]


def test_forced_version_conflicts_with_file() -> None:
    with pytest.raises(ConfigError, match="version 2 but --containerd-config-version is 3"):
        rt.render_containerd(CTD_V2, opts(config_version=3), source="/x/config.toml")


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("version = 2\n[plugins\n", "line 2"),
        ('version = 2\nroot = "/var\n', "line 2"),
        ("version = 2\n\n\nkey = = 1\n", "line 4"),
    ],
)
def test_bad_toml_names_file_and_line(text: str, where: str) -> None:
    with pytest.raises(ConfigError) as info:
        rt.render_containerd(text, opts(), source="/etc/containerd/config.toml")
    assert str(info.value).startswith("/etc/containerd/config.toml: " + where)


def test_unknown_version_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unsupported containerd config version 7"):
        rt.render_containerd("version = 7\n", opts())


# --------------------------------------------------------------------------------------- CRI-O


def test_crio_drop_in() -> None:
    result = rt.render_crio(CRIO_CONF, opts("crio", drop_in="/etc/crio/crio.conf.d/99-nvidia.toml"))
    assert result.main == CRIO_CONF
    assert result.drop_in is not None
    drop = tomlkit.parse(result.drop_in).unwrap()
    nvidia = drop["crio"]["runtime"]["runtimes"]["nvidia"]
    assert nvidia == {
        "runtime_root": "/run/crun",
        "monitor_path": "/usr/libexec/crio/conmon",
        "allowed_annotations": ["io.containers.trace-syscall"],
        "runtime_path": BIN,
        "runtime_type": "oci",
    }
    assert "default_runtime" not in drop["crio"]["runtime"]
    as_default = rt.render_crio(CRIO_CONF, opts("crio", drop_in="/d/99.toml", set_as_default=True))
    assert tomlkit.parse(as_default.drop_in or "").unwrap()["crio"]["runtime"]["default_runtime"] == "nvidia"


def test_crio_in_place_and_cdi_note() -> None:
    result = rt.render_crio(CRIO_CONF, opts("crio", set_as_default=True, enable_cdi=True))
    assert result.main is not None
    assert rt.nvidia_handlers_present(result.main, "crio") == ["nvidia", "nvidia-cdi", "nvidia-legacy"]
    assert rt.default_runtime_name(result.main, "crio") == "nvidia"
    assert rt.render_crio(result.main, opts("crio", set_as_default=True)).main == result.main
    assert any("always has CDI enabled" in note for note in result.notes)


# ---------------------------------------------------------------------------- handler checks


@pytest.mark.parametrize(
    ("text", "runtime", "expected"),
    [
        pytest.param(CTD_V2, "containerd", [], id="v2-none"),
        pytest.param(CRIO_CONF, "crio", [], id="crio-none"),
        pytest.param("", "containerd", [], id="empty"),
        pytest.param(
            '[plugins.cri.containerd.runtimes.nvidia.options]\nBinaryName = "/x"\n',
            "containerd",
            ["nvidia"],
            id="v1-by-name",
        ),
        pytest.param(
            'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.gpu.options]\n'
            'BinaryName = "/usr/bin/nvidia-container-runtime"\n',
            "containerd",
            ["gpu"],
            id="v2-by-binary",
        ),
        pytest.param(
            'version = 2\n[plugins.cri.containerd.runtimes.nvidia.options]\nBinaryName = "/x"\n',
            "containerd",
            [],
            id="v2-wrong-key",
        ),
        pytest.param(
            "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia-cdi]\n",
            "containerd",
            ["nvidia-cdi"],
            id="v3",
        ),
        pytest.param(
            '[crio.runtime.runtimes.nvidia]\nruntime_path = "/usr/bin/nvidia-container-runtime"\n',
            "crio",
            ["nvidia"],
            id="crio",
        ),
    ],
)
def test_nvidia_handlers_present(text: str, runtime: str, expected: list[str]) -> None:
    assert rt.nvidia_handlers_present(text, runtime) == expected


def test_nvidia_handlers_present_after_configure() -> None:
    for name, text in CONTAINERD_CONFIGS.items():
        out = rt.render_containerd(text, opts()).main or ""
        assert rt.nvidia_handlers_present(out, "containerd") == list(rt.NVIDIA_HANDLER_NAMES), name


def test_nvidia_handlers_present_rejects_bad_input() -> None:
    with pytest.raises(ConfigError, match="line 1"):
        rt.nvidia_handlers_present("[[[", "containerd")
    with pytest.raises(ValueError, match="containerd, crio"):
        rt.nvidia_handlers_present("", "docker")


# ------------------------------------------------------------------------- plan, apply, revert


def _snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mode & 0o7777)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_plan_apply_revert_round_trip(tmp_path: Path) -> None:
    config = tmp_path / "etc/containerd/config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(CTD_V2)
    config.chmod(0o600)
    before = _snapshot(tmp_path)
    o = rt.ConfigureOptions(
        runtime="containerd",
        config=str(config),
        drop_in=str(tmp_path / "etc/containerd/conf.d/99-nvidia.toml"),
    )
    plan = rt.plan_configure(o)
    assert [c.verb for c in plan.changes] == ["updated", "created"]
    assert plan.make_dirs == (tmp_path / "etc/containerd/conf.d",)
    rt.apply_plan(plan)
    assert config.stat().st_mode & 0o7777 == 0o600  # mode preserved
    state = json.loads(Path(str(config) + ".gpunode-state.json").read_text())
    assert base64.b64decode(state["files"][str(config)]["original"]) == CTD_V2.encode()
    assert state["files"][str(tmp_path / "etc/containerd/conf.d/99-nvidia.toml")]["created"] is True
    assert rt.plan_configure(o).empty
    rt.apply_plan(rt.plan_revert(plan.state_file))
    assert _snapshot(tmp_path) == before
    assert not (tmp_path / "etc/containerd/conf.d").exists()


def test_revert_refuses_drifted_files(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(CTD_V2)
    rt.apply_plan(
        rt.plan_configure(rt.ConfigureOptions(runtime="containerd", config=str(config), drop_in=None))
    )
    config.write_text(config.read_text() + "# edited later\n")
    state_file = Path(str(config) + rt.STATE_SUFFIX)
    with pytest.raises(rt.RevertError, match="changed since"):
        rt.plan_revert(state_file)
    rt.apply_plan(rt.plan_revert(state_file, force=True))
    assert config.read_text() == CTD_V2
    assert not state_file.exists()


def test_apply_failure_rolls_back(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(CTD_V2)
    (tmp_path / "conf.d").write_text("not a directory")
    o = rt.ConfigureOptions(
        runtime="containerd", config=str(config), drop_in=str(tmp_path / "conf.d/99.toml")
    )
    before = _snapshot(tmp_path)
    with pytest.raises(rt.ApplyError, match="cannot write"):
        rt.apply_plan(rt.plan_configure(o))
    assert _snapshot(tmp_path) == before


def test_diff_of_new_and_removed_files(tmp_path: Path) -> None:
    change = rt.FileChange(tmp_path / "a.toml", None, b"x = 1\n")
    assert change.diff().startswith(f"--- /dev/null\n+++ {tmp_path / 'a.toml'}\n")
    gone = rt.FileChange(tmp_path / "a.toml", b"x = 1", None)
    assert "+++ /dev/null" in gone.diff()
    assert "\\ No newline at end of file" in gone.diff()

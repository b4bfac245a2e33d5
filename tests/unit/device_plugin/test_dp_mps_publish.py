"""The device plugin publishes the config it serves for ``gpunode-mps-control-daemon --follow-device-plugin``:
the file's bytes (or ``version: v1`` for the built-in defaults) under the MPS root, atomically, 0644, only
when changed; the root made when missing; a failed write logged once and counted, never fatal."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpunode.common.hostpaths import HostPaths
from gpunode.common.logging import get_logger
from gpunode.device_plugin.configwatch import ConfigWatch
from gpunode.device_plugin.mps import MpsWatch
from gpunode.kube.labelconfig import InForce, LabelConfigOptions

ROOT = "/run/nvidia/mps"


@dataclass
class Errors:
    counted: list[str] = field(default_factory=list)

    def count_error(self, reason: str) -> None:
        self.counted.append(reason)


@dataclass
class Settings:
    mps_root: str | None = ROOT
    sharing: Any = None


@dataclass
class State:
    settings: Settings = field(default_factory=Settings)


@dataclass
class Resources:  # what MpsWatch and ConfigWatch read of the plugin's resources
    state: State = field(default_factory=State)
    base_metrics: Errors = field(default_factory=Errors)


def watch(tmp_path: Path) -> tuple[MpsWatch, Resources, Path]:
    res = Resources()
    mps = MpsWatch(res, HostPaths(root=tmp_path), log=get_logger("test"))  # type: ignore[arg-type]
    return mps, res, tmp_path / ROOT.lstrip("/") / ".device-plugin-config.yaml"


def test_published_atomically_with_its_mode_only_when_changed(tmp_path: Path) -> None:
    mps, _, target = watch(tmp_path)
    assert mps.publish_config(b"version: v1\nsharing: {}\n") is True  # the root is made
    assert target.read_bytes() == b"version: v1\nsharing: {}\n"
    assert oct(target.stat().st_mode & 0o777) == "0o644"
    assert oct(target.parent.stat().st_mode & 0o777) == "0o755"
    inode = target.stat().st_ino
    assert mps.publish_config(b"version: v1\nsharing: {}\n") is False  # unchanged: not touched
    assert target.stat().st_ino == inode
    assert mps.publish_config(None) is True  # no file: the built-in defaults
    assert target.read_bytes() == b"version: v1\n"
    assert target.stat().st_ino != inode  # replaced by a rename, never written in place
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # no temporary left


def test_a_failed_write_is_logged_once_and_counted_never_a_crash(tmp_path: Path) -> None:
    mps, res, target = watch(tmp_path)
    target.parent.parent.mkdir(parents=True)
    target.parent.write_text("not a directory")
    assert mps.publish_config(b"a") is False
    assert mps.publish_config(b"b") is False
    assert res.base_metrics.counted == ["mps-config"]


def configs(tmp_path: Path, **kw: Any) -> tuple[ConfigWatch, list[bytes | None]]:
    got: list[bytes | None] = []
    cw = ConfigWatch(
        Resources(),  # type: ignore[arg-type]
        load_settings=lambda c: None,  # type: ignore[arg-type,return-value]
        config=None,
        kube=None,
        log=get_logger("test"),
        publish=got.append,
        **kw,
    )
    return cw, got


def test_the_file_in_force_or_none_is_what_is_published(tmp_path: Path) -> None:
    f = tmp_path / "config.yaml"
    f.write_text("version: v1\n# mine\n")
    cw, got = configs(tmp_path, config_file=f, config_dir=None)
    cw.publish()
    assert got == [b"version: v1\n# mine\n"]
    flags_only, got2 = configs(tmp_path, config_file=None, config_dir=None)
    flags_only.publish()
    assert got2 == [None]


def test_in_a_directory_the_chosen_files_bytes_unless_changed_since_applied(tmp_path: Path) -> None:
    d = tmp_path / "available"
    d.mkdir()
    (d / "mps").write_text("version: v1\nsharing: {mps: {resources: [{name: nvidia.com/gpu, replicas: 2}]}}")
    options = LabelConfigOptions(directory=d, node_label="nvidia.com/device-plugin.config")
    cw, got = configs(tmp_path, config_file=None, config_dir=options)
    digest = hashlib.sha256((d / "mps").read_bytes()).hexdigest()
    cw.publish(InForce("mps", "label", digest))
    assert got == [(d / "mps").read_bytes()]
    (d / "mps").write_text("version: v1\n")  # changed after it was applied: its own apply publishes it
    cw.publish(InForce("mps", "label", digest))
    assert len(got) == 1
    cw.publish(InForce(None, "empty", None))  # no file in force: the defaults
    assert got[-1] is None

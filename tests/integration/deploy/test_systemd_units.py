"""systemd/*.service: `systemd-analyze verify` and `security --offline=yes`, plus the shape DESIGN.md §5 asks.

verify checks that every Exec*= binary exists; /usr/bin/gpunode-* do not exist on a test machine. Rather
than rewriting the units, each one is verified unchanged inside a scratch root (`--root=`): the host's unit
directory is copied there (for sysinit.target and friends) and an executable stub is placed at every
absolute Exec*= path. Any output from verify (unknown keys, bad values) fails the test, since verify exits 0
on a mere warning. Skipped only when systemd-analyze is not installed.
"""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
UNIT_DIR = ROOT / "systemd"
UNITS = sorted(p.name for p in UNIT_DIR.glob("*.service"))
ROOT_UNITS = {"gpunode-driver-loader.service": 5.0, "gpunode-mig-manager.service": 5.0}
NON_ROOT_LIMIT = 2.0
EXPECTED = {
    "gpunode-driver-loader.service",
    "gpunode-mig-manager.service",
    "gpunode-device-plugin.service",
    "gpunode-feature-discovery.service",
    "gpunode-exporter.service",
}
CLIENTS = ["gpunode-device-plugin.service", "gpunode-feature-discovery.service", "gpunode-exporter.service"]

ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed")


def _directives(unit: str) -> dict[str, list[str]]:
    """KEY -> every value, across sections ("Section.Key"); repeated keys kept in order."""
    out: dict[str, list[str]] = {}
    section = ""
    for raw in (UNIT_DIR / unit).read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out.setdefault(f"{section}.{key.strip()}", []).append(value.strip())
    return out


def _words(d: dict[str, list[str]], key: str) -> list[str]:
    return [w for v in d.get(key, []) for w in v.split()]


def test_every_unit_is_there() -> None:
    assert set(UNITS) >= EXPECTED
    for unit in UNITS:
        configparser.ConfigParser(strict=False, interpolation=None).read_string(
            "\n".join(line for line in (UNIT_DIR / unit).read_text().splitlines() if not line.startswith("#"))
        )


@pytest.mark.parametrize("unit", UNITS)
def test_unit_shape(unit: str) -> None:
    d = _directives(unit)
    assert d["Service.Type"] == ["notify"]
    assert d["Service.NotifyAccess"] == ["main"]
    assert d["Service.WatchdogSec"] == ["30s"]
    assert d["Service.Restart"] == ["on-failure"]
    assert d["Service.EnvironmentFile"] == [f"-/etc/default/{unit.removesuffix('.service')}"]
    assert d["Service.ExecStart"][0].startswith(f"/usr/bin/{unit.removesuffix('.service')}")
    assert d["Service.DevicePolicy"] == ["closed"]
    assert d.get("Service.DeviceAllow"), "DevicePolicy=closed with an allow list"
    assert d.get("Service.PrivateDevices", ["no"]) != ["yes"], "PrivateDevices=yes hides /dev/nvidia*"
    for key, value in {
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "NoNewPrivileges": "yes",
        "ProtectKernelLogs": "yes",
        "ProtectControlGroups": "yes",
        "LockPersonality": "yes",
        "RestrictNamespaces": "yes",
        "RestrictSUIDSGID": "yes",
        "SystemCallArchitectures": "native",
    }.items():
        assert d.get(f"Service.{key}") == [value], key
    assert "@system-service" in _words(d, "Service.SystemCallFilter")
    assert d.get("Service.RestrictAddressFamilies")
    assert "Service.CapabilityBoundingSet" in d
    if unit not in ROOT_UNITS:
        assert d["Service.CapabilityBoundingSet"] == [""], "no capability for a unit that needs no root"


@pytest.mark.parametrize("unit", [u for u in EXPECTED if u not in ROOT_UNITS])
def test_gpu_clients_see_only_nvidia_devices(unit: str) -> None:
    allowed = _directives(unit)["Service.DeviceAllow"]
    assert "char-nvidia-frontend rw" in allowed
    assert "/dev/nvidiactl rw" in allowed
    assert all("nvidia" in a for a in allowed)


def test_ordering_chain() -> None:
    """driver loader -> MIG manager -> (device plugin, feature discovery, exporter, kubelet)."""
    loader = _directives("gpunode-driver-loader.service")
    mig = _directives("gpunode-mig-manager.service")
    assert "gpunode-mig-manager.service" in _words(loader, "Unit.Before")
    assert "gpunode-driver-loader.service" in _words(mig, "Unit.After")
    for client in [*CLIENTS, "kubelet.service"]:
        assert client in _words(loader, "Unit.Before"), client
        assert client in _words(mig, "Unit.Before"), client
    for client in CLIENTS:
        after = _words(_directives(client), "Unit.After")
        assert "gpunode-driver-loader.service" in after
        assert "gpunode-mig-manager.service" in after
        assert "gpunode-driver-loader.service" in _words(_directives(client), "Unit.Wants")
    # The device plugin registers with the kubelet: after it, never before it.
    assert "kubelet.service" in _words(_directives("gpunode-device-plugin.service"), "Unit.After")


@pytest.fixture(scope="module")
def scratch_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A root with the host's unit files, our units, and a stub at every absolute Exec*= path."""
    root = tmp_path_factory.mktemp("sysroot")
    system = root / "etc" / "systemd" / "system"
    system.mkdir(parents=True)
    for lib in (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system")):
        if lib.is_dir():
            shutil.copytree(
                lib, root / "usr" / "lib" / "systemd" / "system", symlinks=True, dirs_exist_ok=True
            )
            break
    for unit in UNITS:
        shutil.copy(UNIT_DIR / unit, system / unit)
        for key, values in _directives(unit).items():
            if not key.startswith("Service.Exec"):
                continue
            for value in values:
                exe = value.lstrip("@-:+!").split()[0]
                if exe.startswith("/"):
                    stub = root / exe.lstrip("/")
                    stub.parent.mkdir(parents=True, exist_ok=True)
                    stub.write_text("#!/bin/sh\n")
                    stub.chmod(0o755)
    return root


@needs_analyze
@pytest.mark.parametrize("unit", UNITS)
def test_systemd_analyze_verify(unit: str, scratch_root: Path) -> None:
    assert ANALYZE is not None
    proc = subprocess.run(
        [ANALYZE, "verify", f"--root={scratch_root}", unit], capture_output=True, text=True, timeout=60
    )
    output = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 0, output
    assert output == "", output


@needs_analyze
def test_verify_catches_a_typo(scratch_root: Path) -> None:
    """The check above can fail: a misspelt key is reported."""
    assert ANALYZE is not None
    text = (UNIT_DIR / "gpunode-exporter.service").read_text().replace("LockPersonality=", "LockPersonalty=")
    (scratch_root / "etc/systemd/system/gpunode-typo.service").write_text(text)
    proc = subprocess.run(
        [ANALYZE, "verify", f"--root={scratch_root}", "gpunode-typo.service"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "LockPersonalty" in proc.stdout + proc.stderr


def _exposure(unit_path: Path) -> float:
    assert ANALYZE is not None
    proc = subprocess.run(
        [ANALYZE, "security", "--offline=yes", "--no-pager", str(unit_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    match = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", proc.stdout + proc.stderr)
    assert match, proc.stdout + proc.stderr
    return float(match.group(1))


@needs_analyze
@pytest.mark.parametrize("unit", UNITS)
def test_systemd_analyze_security(unit: str) -> None:
    limit = ROOT_UNITS.get(unit, NON_ROOT_LIMIT)
    level = _exposure(UNIT_DIR / unit)
    assert level <= limit, f"{unit}: exposure {level} > {limit}"

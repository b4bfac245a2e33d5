"""systemd/*.service: `systemd-analyze verify` and `security --offline=yes`, plus the shape DESIGN.md §5 asks
and issue 14's hardening (localhost-only IP, one bindable port, memory and task limits, per-unit choices).

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
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
UNIT_DIR = ROOT / "systemd"
UNITS = sorted(p.name for p in UNIT_DIR.glob("*.service"))
# Units that keep capabilities (the MPS control daemon: CAP_SETUID/CAP_SETGID to start MPS servers as
# their clients' users).
ROOT_UNITS = {
    "gpunode-driver-loader.service",
    "gpunode-mig-manager.service",
    "gpunode-mps-control-daemon.service",
}
# `systemd-analyze security --offline=yes` overall exposure, at most: the units' values (was 5.0 for the
# two root units and 2.0 for the others; before issue 14's hardening: loader 3.5, MIG manager 3.2,
# device plugin 1.8, feature discovery 1.8, exporter 1.4).
EXPOSURE = {
    "gpunode-driver-loader.service": 3.1,
    "gpunode-mig-manager.service": 2.8,
    "gpunode-device-plugin.service": 1.6,
    "gpunode-feature-discovery.service": 1.6,
    "gpunode-exporter.service": 1.3,
    "gpunode-mps-control-daemon.service": 2.4,  # 2.2 before CAP_SYS_ADMIN (the GPUs' compute mode)
}
EXPECTED = {
    "gpunode-driver-loader.service",
    "gpunode-mig-manager.service",
    "gpunode-device-plugin.service",
    "gpunode-feature-discovery.service",
    "gpunode-exporter.service",
    "gpunode-mps-control-daemon.service",
}
CLIENTS = ["gpunode-device-plugin.service", "gpunode-feature-discovery.service", "gpunode-exporter.service"]


@dataclass(frozen=True)
class Hardening:
    """What each unit adds beyond the common shape (issue 14): the one port it may bind (the agent's HTTP
    port, as its env file and the agent's default say), its limits, and the choices that differ by unit.
    ``rss_mb`` is the agent's measured working set, which ``MemoryMax=`` must leave room for."""

    agent: str  # registry key
    verb: str  # registry verb ("" for an agent without verbs)
    port: int
    memory_max: str
    tasks_max: int
    umask: str
    protect_proc: str | None  # None: not set (the default, every process visible), on purpose
    capabilities: frozenset[str]
    rss_mb: int


HARDENING = {
    "gpunode-device-plugin.service": Hardening(
        "device-plugin", "", 9451, "512M", 256, "0077", "invisible", frozenset(), 54
    ),
    "gpunode-feature-discovery.service": Hardening(
        "feature-discovery", "", 9452, "256M", 128, "0077", "invisible", frozenset(), 45
    ),
    # ProtectProc=invisible would hide the processes on a GPU, which the exporter names from /proc.
    "gpunode-exporter.service": Hardening("exporter", "", 9400, "256M", 128, "0077", None, frozenset(), 35),
    # A module build (make -j<CPUs>) runs in the loader's unit: its limits scale with the machine. Its
    # in-use check names processes from /proc, and its helpers' files must stay world-readable (0022).
    "gpunode-driver-loader.service": Hardening(
        "driver",
        "init",
        9454,
        "25%",
        4096,
        "0022",
        None,
        frozenset({"CAP_SYS_MODULE", "CAP_MKNOD", "CAP_CHOWN", "CAP_FOWNER"}),
        30,
    ),
    # The agents to SIGHUP are found in /proc; hooks and nvidia-modprobe run with its umask.
    # The control daemons and their MPS servers run in the unit as well: limits for them; UMask 0022 so
    # that the clients' users reach the pipe directories.
    "gpunode-mps-control-daemon.service": Hardening(
        "mps-control-daemon",
        "",
        9456,
        "1G",
        1024,
        "0022",
        "invisible",
        frozenset({"CAP_SETUID", "CAP_SETGID", "CAP_SYS_ADMIN"}),  # SYS_ADMIN: the GPUs' compute mode
        30,
    ),
    "gpunode-mig-manager.service": Hardening(
        "mig-manager",
        "",
        9453,
        "1G",
        512,
        "0022",
        None,
        frozenset({"CAP_SYS_ADMIN", "CAP_MKNOD", "CAP_DAC_OVERRIDE"}),
        40,
    ),
}

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


def _bytes(size: str) -> int:
    """systemd's MemoryMax= size (K, M, G, T: powers of 1024) in bytes."""
    match = re.fullmatch(r"(\d+)([KMGT]?)", size)
    assert match, size
    return int(match.group(1)) << (10 * " KMGT".index(match.group(2) or " "))


def test_hardening_table_covers_every_unit() -> None:
    assert set(HARDENING) == set(UNITS) == set(EXPOSURE)


@pytest.mark.parametrize("unit", UNITS)
def test_ip_traffic_is_localhost_only(unit: str) -> None:
    """IPAddressDeny=any: the health endpoints listen on 127.0.0.1 under systemd; an API server or remote
    scrapers are allowed by a drop-in (docs/systemd.md), never by the shipped unit."""
    d = _directives(unit)
    assert d["Service.IPAddressDeny"] == ["any"]
    assert d["Service.IPAddressAllow"] == ["localhost"]


@pytest.mark.parametrize("unit", UNITS)
def test_binds_only_its_http_port(unit: str) -> None:
    d = _directives(unit)
    assert d["Service.SocketBindDeny"] == ["any"]
    assert d["Service.SocketBindAllow"] == [f"tcp:{HARDENING[unit].port}"]


@pytest.mark.parametrize("unit", UNITS)
def test_bind_port_is_the_env_files_and_the_agents_default(unit: str) -> None:
    """The port SocketBindAllow= opens is the one the agent binds unless told otherwise: its default (from
    the registry), the default documented in its env file and, for the exporter, the unit's listen address."""
    from gpunode import registry

    h = HARDENING[unit]
    env = (UNIT_DIR / "env" / f"{unit.removesuffix('.service')}.env").read_text()
    assert registry.spec(h.agent, h.verb).default_http_port == h.port
    if h.agent == "exporter":
        environment = _directives(unit)["Service.Environment"]
        assert f"DCGM_EXPORTER_LISTEN=127.0.0.1:{h.port}" in environment
        documented = re.search(r"^#DCGM_EXPORTER_LISTEN=:(\d+)\s", env, re.MULTILINE)
    else:
        documented = re.search(r"^#GPUNODE_HTTP_PORT=(\d+)\s", env, re.MULTILINE)
    assert documented, f"{unit}: the env file documents no port"
    assert int(documented.group(1)) == h.port
    assert "SocketBindAllow" in env, "the env file says a changed port needs a drop-in"


@pytest.mark.parametrize("unit", UNITS)
def test_env_file_lines_uncomment_cleanly(unit: str) -> None:
    """Each `#NAME=value` line becomes a working assignment once the `#` goes: NAME is a setting of the
    unit's command (as is every Environment= of the unit), and the value carries no trailing comment,
    which systemd's EnvironmentFile= would keep as part of the value."""
    from gpunode import registry
    from gpunode.common.settings import flags_of

    h = HARDENING[unit]
    spec = registry.spec(h.agent, h.verb)
    settings = {env for flag in flags_of(spec.settings_type) for env in flag.envs}
    env = (UNIT_DIR / "env" / f"{unit.removesuffix('.service')}.env").read_text()
    assignments = re.findall(r"^#([A-Za-z_][A-Za-z0-9_]*)=(.*)$", env, re.MULTILINE)
    assert assignments
    for name, value in assignments:
        assert name in settings, f"{unit}: {name} is not a setting of {spec.prog}"
        assert "#" not in value, f"{unit}: {name}={value!r} would keep its comment"
    for value in _directives(unit).get("Service.Environment", []):
        assert value.partition("=")[0] in settings, value


@pytest.mark.parametrize("unit", UNITS)
def test_resource_limits(unit: str) -> None:
    d = _directives(unit)
    h = HARDENING[unit]
    assert d["Service.TasksMax"] == [str(h.tasks_max)]
    assert d["Service.MemoryMax"] == [h.memory_max]
    if h.memory_max.endswith("%"):
        assert 0 < int(h.memory_max.removesuffix("%")) < 100
    else:
        assert _bytes(h.memory_max) >= 5 * h.rss_mb * 2**20, "room over the measured RSS"


@pytest.mark.parametrize("unit", UNITS)
def test_mounts_umask_proc_and_capabilities(unit: str) -> None:
    d = _directives(unit)
    h = HARDENING[unit]
    assert d["Service.PrivateMounts"] == ["yes"]
    assert d["Service.UMask"] == [h.umask]
    assert d.get("Service.ProtectProc") == ([h.protect_proc] if h.protect_proc else None)
    assert set(_words(d, "Service.CapabilityBoundingSet")) == h.capabilities
    assert d["Service.AmbientCapabilities"] == [""]


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


@needs_analyze
@pytest.mark.parametrize(
    ("good", "bad"),
    [
        ("IPAddressAllow=localhost", "IPAddressAllow=localhots"),
        ("SocketBindAllow=tcp:9400", "SocketBindAllow=tcp:94000"),
        ("MemoryMax=256M", "MemoryMax=256Q"),
        ("TasksMax=128", "TasksMax=lots"),
        ("PrivateMounts=yes", "PrivateMounts=maybe"),
        ("UMask=0077", "UMask=0999"),
    ],
)
def test_verify_catches_a_bad_value(good: str, bad: str, scratch_root: Path) -> None:
    """An unparsable value of each directive issue 14 added is reported (systemd ignores it otherwise)."""
    assert ANALYZE is not None
    text = (UNIT_DIR / "gpunode-exporter.service").read_text()
    assert f"\n{good}\n" in text
    name = f"gpunode-bad-{good.partition('=')[0].lower()}.service"
    (scratch_root / "etc/systemd/system" / name).write_text(text.replace(f"\n{good}\n", f"\n{bad}\n"))
    proc = subprocess.run(
        [ANALYZE, "verify", f"--root={scratch_root}", name], capture_output=True, text=True, timeout=60
    )
    assert bad.partition("=")[2] in proc.stdout + proc.stderr


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
    limit = EXPOSURE[unit]
    level = _exposure(UNIT_DIR / unit)
    assert level <= limit, f"{unit}: exposure {level} > {limit}"

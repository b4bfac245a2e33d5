"""`gpunode-toolkit runtime`: configure / revert / dry-run / status end to end, restarts with real
processes, and Debian's real containerd reading what we wrote."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpunode.toolkit import runtime_cli

CONTAINERD = "/usr/bin/containerd"

CTD_V1 = """\
# legacy containerd config: no version key
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
oom_score = 0

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

CTD_V3 = """\
# containerd 2.x
version = 3

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'

  [plugins.'io.containerd.cri.v1.runtime']
    enable_selinux = false
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          SystemdCgroup = true
"""

CRIO_CONF = """\
# crio.conf
[crio.runtime]
default_runtime = "crun"   # crun is faster

[crio.runtime.runtimes.crun]
runtime_path = "/usr/bin/crun"
runtime_root = "/run/crun"
"""

CONFIGS = {1: CTD_V1, 2: CTD_V2, 3: CTD_V3}


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file and directory under root, with bytes and mode."""
    out: dict[str, tuple[bytes, int]] = {}
    for path in sorted(root.rglob("*")):
        mode = path.stat().st_mode & 0o7777
        out[str(path.relative_to(root))] = (path.read_bytes() if path.is_file() else b"<dir>", mode)
    return out


TOOLKIT_DIR = "usr/local/nvidia/toolkit"
RUNTIME_BINARIES = (
    "nvidia-container-runtime",
    "nvidia-container-runtime.cdi",
    "nvidia-container-runtime.legacy",
)


def fake_nvidia_runtime(root: Path) -> Path:
    """Stand-ins for NVIDIA's runtime binaries under ``root``: the legacy handlers need them to exist."""
    bin_dir = root / TOOLKIT_DIR
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in RUNTIME_BINARIES:
        (bin_dir / name).write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / name).chmod(0o755)
    return bin_dir


class Node:
    """A fake host root with a runtime config; `run` calls the CLI in-process (with ``legacy``, the
    default here, asking for NVIDIA's handlers, whose stand-in binaries live under the root)."""

    def __init__(self, root: Path, runtime: str, text: str | None) -> None:
        self.root = root
        self.runtime = runtime
        self.bin_dir = fake_nvidia_runtime(root)
        base = root / ("etc/containerd" if runtime == "containerd" else "etc/crio")
        base.mkdir(parents=True)
        self.config = base / ("config.toml" if runtime == "containerd" else "crio.conf")
        self.drop_in = base / (
            "conf.d/99-nvidia.toml" if runtime == "containerd" else "crio.conf.d/99-nvidia.toml"
        )
        if text is not None:
            self.config.write_text(text)

    @property
    def legacy_flags(self) -> list[str]:
        paths = [self.bin_dir / name for name in RUNTIME_BINARIES]
        return [
            "--nvidia-runtime-handlers",
            f"--nvidia-runtime-path={paths[0]}",
            f"--nvidia-cdi-runtime-path={paths[1]}",
            f"--nvidia-legacy-runtime-path={paths[2]}",
        ]

    def run(
        self,
        capsys: pytest.CaptureFixture[str],
        *args: str,
        env: dict[str, str] | None = None,
        legacy: bool = True,
    ) -> tuple[int, str, str]:
        argv = [
            *(args or ("configure",)),
            f"--runtime={self.runtime}",
            f"--config={self.config}",
            f"--drop-in-config={self.drop_in}",
            "--restart-mode=none",
            "--log-format=json",
            *(self.legacy_flags if legacy else []),
        ]
        code = runtime_cli.main(argv, env or {})
        out, err = capsys.readouterr()
        return code, out, err


# ------------------------------------------------------------------------------ round trips


@pytest.mark.parametrize("version", [1, 2, 3])
@pytest.mark.parametrize("as_default", [False, True], ids=["plain", "as-default"])
def test_containerd_round_trip(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], version: int, as_default: bool
) -> None:
    node = Node(tmp_path, "containerd", CONFIGS[version])
    before = snapshot(tmp_path)
    extra = ["--set-as-default"] if as_default else []
    code, out, _ = node.run(capsys, "configure", "--enable-cdi", *extra)
    assert code == 0
    assert "not restarted" in out
    configured = snapshot(tmp_path)
    if version == 1:  # no imports in version 1: in place
        assert f"updated {node.config}" in out
        assert not node.drop_in.exists()
    else:
        assert f"created {node.drop_in}" in out
        assert f"updated {node.config}" in out
    code, out, _ = node.run(capsys, "configure", "--enable-cdi", *extra)
    assert (code, out.splitlines()[-1]) == (0, "no change")
    assert ("version 1 has no imports; editing it in place" in out) is (version == 1)
    assert snapshot(tmp_path) == configured
    code, out, _ = node.run(capsys, "status")
    assert code == 0
    assert "nvidia handlers configured: nvidia, nvidia-cdi, nvidia-legacy" in out
    assert ("default runtime: nvidia" in out) is as_default
    code, out, _ = node.run(capsys, "configure", "--revert")
    assert code == 0
    assert snapshot(tmp_path) == before
    code, out, _ = node.run(capsys, "configure", "--revert")
    assert (code, out.strip()) == (0, "no change")


@pytest.mark.parametrize(
    ("flag", "env"),
    [("--drop-in-config=", {}), ("--restart-mode=none", {"RUNTIME_DROP_IN_CONFIG": "none"})],
    ids=["empty-flag", "env-none"],
)
def test_containerd_in_place_without_drop_in(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, env: dict[str, str]
) -> None:
    node = Node(tmp_path, "containerd", CTD_V2)
    before = snapshot(tmp_path)
    argv = ["configure", "--runtime=containerd", f"--config={node.config}", "--restart-mode=none", flag]
    assert runtime_cli.main([*argv, *node.legacy_flags], env) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"updated {node.config}"
    text = node.config.read_text()
    assert "runtimes.nvidia-legacy]" in text
    assert "imports" not in text
    assert not node.drop_in.parent.exists()
    assert (
        runtime_cli.main(
            [
                "configure",
                "--runtime=containerd",
                f"--config={node.config}",
                "--revert",
                "--restart-mode=none",
            ],
            {},
        )
        == 0
    )
    assert snapshot(tmp_path) == before


def test_containerd_new_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = Node(tmp_path, "containerd", None)
    shutil.rmtree(node.config.parent)
    before = snapshot(tmp_path)
    code, _out, _ = node.run(capsys, "configure", "--containerd-config-version=3")
    assert code == 0
    assert node.config.read_text() == f'version = 3\nimports = ["{node.drop_in.parent}/*.toml"]\n'
    assert "io.containerd.cri.v1.runtime" in node.drop_in.read_text()
    assert node.run(capsys, "configure", "--revert")[0] == 0
    assert snapshot(tmp_path) == before  # files and the directories we made are gone


@pytest.mark.parametrize("as_default", [False, True], ids=["plain", "as-default"])
def test_crio_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str], as_default: bool) -> None:
    node = Node(tmp_path, "crio", CRIO_CONF)
    before = snapshot(tmp_path)
    extra = ["--set-as-default"] if as_default else []
    code, out, _ = node.run(capsys, "configure", *extra)
    assert code == 0
    assert f"created {node.drop_in}" in out.splitlines()
    assert node.config.read_text() == CRIO_CONF
    drop = node.drop_in.read_text()
    assert '[crio.runtime.runtimes.nvidia]\nruntime_root = "/run/crun"' in drop
    assert 'runtime_type = "oci"' in drop
    assert ('default_runtime = "nvidia"' in drop) is as_default
    configured = snapshot(tmp_path)
    code, out, _ = node.run(capsys, "configure", *extra)
    assert (code, out.splitlines()[-1]) == (0, "no change")
    assert snapshot(tmp_path) == configured
    assert node.run(capsys, "configure", "--check")[0] == 0
    assert node.run(capsys, "configure", "--revert")[0] == 0
    assert snapshot(tmp_path) == before


def test_status_before_configure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = Node(tmp_path, "containerd", CTD_V2)
    code, out, _ = node.run(capsys, "status")
    assert code == 1
    assert "NOT configured: missing nvidia, nvidia-cdi, nvidia-legacy" in out


# ---------------------------------------------------------------------------------- dry run


def test_dry_run_prints_diff_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = Node(tmp_path, "containerd", CTD_V2)
    before = snapshot(tmp_path)
    code, out, _ = node.run(capsys, "configure", "--dry-run", "--set-as-default")
    assert code == 0
    assert snapshot(tmp_path) == before
    assert f"--- {node.config}\n+++ {node.config}\n" in out
    assert f'+imports = ["{node.drop_in.parent}/*.toml"]\n' in out
    assert f"--- /dev/null\n+++ {node.drop_in}\n" in out
    assert '+default_runtime_name = "nvidia"\n' in out
    assert "dry run: 2 file(s) would change; nothing written" in out
    # a dry-run revert shows the way back, and also writes nothing
    assert node.run(capsys, "configure")[0] == 0
    configured = snapshot(tmp_path)
    code, out, _ = node.run(capsys, "configure", "--revert", "--dry-run")
    assert code == 0
    assert "+++ /dev/null" in out
    assert "-imports" in out
    assert snapshot(tmp_path) == configured


# -------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("text", "line"),
    [("version = 2\n[plugins\n", 2), ('version = 2\n\n# fine\nroot = "/var/lib\n', 4)],
)
def test_bad_toml_exit_2_names_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, line: int
) -> None:
    node = Node(tmp_path, "containerd", text)
    before = snapshot(tmp_path)
    code, _, err = node.run(capsys, "configure")
    assert code == 2
    assert f"{node.config}: line {line}, column" in err
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    ("argv", "env"),
    [(["configure", "--runtime", "docker"], {}), (["configure"], {"RUNTIME": "docker"}), (["status"], {})],
    ids=["flag", "env", "missing"],
)
def test_unknown_runtime_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], env: dict[str, str]
) -> None:
    assert runtime_cli.main(argv, env) == 2
    assert "containerd, crio" in capsys.readouterr().err


def test_version_conflict_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = Node(tmp_path, "containerd", CTD_V2)
    code, _, err = node.run(capsys, "configure", "--containerd-config-version=3")
    assert code == 2
    assert "--containerd-config-version is 3" in err


def test_unwritable_drop_in_dir_exit_1_nothing_half_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node = Node(tmp_path, "containerd", CTD_V2)
    node.drop_in.parent.write_text("a file where the drop-in directory should be")  # fails even as root
    before = snapshot(tmp_path)
    code, _, err = node.run(capsys, "configure")
    assert code == 1
    assert "cannot write" in err
    assert "nothing was changed" in err
    assert snapshot(tmp_path) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_config_dir_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = Node(tmp_path, "containerd", CTD_V2)
    node.config.parent.chmod(0o555)
    try:
        before = snapshot(tmp_path)
        code, _, err = node.run(capsys, "configure")
        assert code == 1
        assert "cannot write" in err
        assert snapshot(tmp_path) == before
    finally:
        node.config.parent.chmod(0o755)


def test_revert_refuses_file_edited_since(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = Node(tmp_path, "containerd", CTD_V2)
    assert node.run(capsys, "configure")[0] == 0
    node.drop_in.write_text(node.drop_in.read_text() + "# hand edit\n")
    code, _, err = node.run(capsys, "configure", "--revert")
    assert code == 1
    assert "--force" in err
    assert node.run(capsys, "configure", "--revert", "--force")[0] == 0
    assert node.config.read_text() == CTD_V2
    assert not node.drop_in.exists()


# ---------------------------------------------------------------------------------- restarts


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def configure_argv(node: Node, *extra: str) -> list[str]:
    return [
        "configure",
        f"--runtime={node.runtime}",
        f"--config={node.config}",
        f"--drop-in-config={node.drop_in}",
        *node.legacy_flags,
        *extra,
    ]


def test_restart_systemd_with_fake_systemctl(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = Node(tmp_path / "host", "crio", CRIO_CONF)
    calls = tmp_path / "calls"
    systemctl = tmp_path / "systemctl"
    systemctl.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    systemctl.chmod(0o755)
    env = {"GPUNODE_SYSTEMCTL": str(systemctl)}  # crio's default restart mode is systemd
    assert runtime_cli.main(configure_argv(node), env) == 0
    assert f"ran {systemctl} restart crio" in capsys.readouterr().out
    assert calls.read_text() == "restart crio\n"
    assert runtime_cli.main(configure_argv(node), env) == 0  # no change: no restart
    assert calls.read_text() == "restart crio\n"
    assert runtime_cli.main(configure_argv(node, "--revert", "--systemd-unit=crio.service"), env) == 0
    assert calls.read_text() == "restart crio\nrestart crio.service\n"


def test_restart_systemd_failure_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = Node(tmp_path / "host", "containerd", CTD_V2)
    systemctl = tmp_path / "systemctl"
    systemctl.write_text("#!/bin/sh\necho 'Unit containerd.service not found.' >&2\nexit 5\n")
    systemctl.chmod(0o755)
    code = runtime_cli.main(configure_argv(node, "--restart-mode=systemd", f"--systemctl={systemctl}"), {})
    assert code == 1
    assert "exited 5: Unit containerd.service not found." in capsys.readouterr().err


def test_restart_signal_via_pid_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sleeper: subprocess.Popen[bytes]
) -> None:
    node = Node(tmp_path, "containerd", CTD_V2)
    pid_file = tmp_path / "containerd.pid"
    pid_file.write_text(f"{sleeper.pid}\n")
    assert runtime_cli.main(configure_argv(node, "--restart-mode=signal", f"--pid-file={pid_file}"), {}) == 0
    assert f"sent SIGHUP to containerd pid {sleeper.pid}" in capsys.readouterr().out
    assert sleeper.wait(timeout=10) == -signal.SIGHUP


def test_no_restart_without_change(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    sleeper: subprocess.Popen[bytes],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = Node(tmp_path, "containerd", CTD_V2)
    assert node.run(capsys, "configure")[0] == 0
    pid_file = tmp_path / "containerd.pid"
    pid_file.write_text(f"{sleeper.pid}\n")
    signals: list[tuple[int, int]] = []
    kill = os.kill

    def counting_kill(pid: int, sig: int) -> None:
        signals.append((pid, sig))
        kill(pid, sig)

    monkeypatch.setattr(os, "kill", counting_kill)
    assert runtime_cli.main(configure_argv(node, "--restart-mode=signal", f"--pid-file={pid_file}"), {}) == 0
    assert capsys.readouterr().out.strip() == "no change"
    assert [s for s in signals if s[0] == sleeper.pid] == []  # no signal was sent ...
    assert sleeper.poll() is None  # ... and the runtime runs on


def test_restart_signal_by_process_name_under_host_root(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sleeper: subprocess.Popen[bytes]
) -> None:
    host = tmp_path / "host"
    node = Node(host, "containerd", CTD_V2)
    (host / f"proc/{sleeper.pid}").mkdir(parents=True)
    (host / f"proc/{sleeper.pid}/comm").write_text("containerd\n")
    (host / "proc/1").mkdir()
    (host / "proc/1/comm").write_text("systemd\n")
    argv = [
        "configure",
        "--runtime=containerd",
        "--config=/etc/containerd/config.toml",
        "--drop-in-config=/etc/containerd/conf.d/99-nvidia.toml",
        f"--host-root={host}",
        "--restart-mode=signal",
    ]
    assert runtime_cli.main(argv, {}) == 0
    out = capsys.readouterr().out
    assert f"created {host}/etc/containerd/conf.d/99-nvidia.toml" in out
    assert f"sent SIGHUP to containerd pid {sleeper.pid} (from process name" in out
    assert sleeper.wait(timeout=10) == -signal.SIGHUP
    # the import names the host path, not where this process sees it
    assert 'imports = ["/etc/containerd/conf.d/*.toml"]' in node.config.read_text()


def test_restart_signal_via_socket_peer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sock = tmp_path / "crio.sock"
    flag = tmp_path / "hup"
    script = textwrap.dedent(
        f"""
        import signal, socket, sys, time
        def hup(*_):
            open({str(flag)!r}, "w").write("reloaded")
            sys.exit(0)
        signal.signal(signal.SIGHUP, hup)
        s = socket.socket(socket.AF_UNIX)
        s.bind({str(sock)!r}); s.listen(8)
        print("ready", flush=True)
        while True:
            conn, _ = s.accept(); conn.close()
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"ready"
        node = Node(tmp_path / "host", "crio", CRIO_CONF)
        argv = configure_argv(node, "--restart-mode=signal", f"--socket={sock}")
        assert runtime_cli.main(argv, {}) == 0
        assert f"sent SIGHUP to crio pid {proc.pid} (from socket {sock})" in capsys.readouterr().out
        assert proc.wait(timeout=10) == 0
        assert flag.read_text() == "reloaded"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_restart_signal_no_process_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    host = tmp_path / "host"
    Node(host, "containerd", CTD_V2)
    (host / "proc").mkdir()
    argv = ["configure", "--runtime=containerd", f"--host-root={host}", "--restart-mode=signal"]
    assert runtime_cli.main(argv, {}) == 1
    assert "no containerd process found" in capsys.readouterr().err


# ------------------------------------------------------------------ the real containerd reads it


def _containerd_version() -> tuple[int, int]:
    out = subprocess.run([CONTAINERD, "--version"], capture_output=True, text=True, check=True).stdout
    match = re.search(r"\s v?(\d+)\.(\d+)", out)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def _containerd_major() -> int:
    return _containerd_version()[0]


@pytest.mark.skipif(not Path(CONTAINERD).exists(), reason=f"{CONTAINERD} is not installed")
@pytest.mark.parametrize("mode", ["drop-in", "in-place"])
@pytest.mark.parametrize("version", [1, 2, 3])
def test_real_containerd_accepts_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], version: int, mode: str
) -> None:
    if version == 3 and _containerd_major() < 2:
        pytest.skip("config version 3 needs containerd 2.x; the installed one is 1.x (it ignores v3 plugins)")
    node = Node(tmp_path, "containerd", CONFIGS[version])
    argv = configure_argv(node, "--restart-mode=none", "--set-as-default", "--enable-cdi")
    if mode == "in-place":
        argv.append("--drop-in-config=")
    assert runtime_cli.main(argv, {}) == 0
    capsys.readouterr()
    if mode == "drop-in" and version >= 2:
        assert node.drop_in.exists()
    dump = subprocess.run(
        [CONTAINERD, "--config", str(node.config), "config", "dump"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert dump.returncode == 0, dump.stderr
    cri = "io.containerd.cri.v1.runtime" if version == 3 else "io.containerd.grpc.v1.cri"
    for name, suffix in (("nvidia", ""), ("nvidia-cdi", ".cdi"), ("nvidia-legacy", ".legacy")):
        table = f'[plugins."{cri}".containerd.runtimes.{name}.options]'
        assert table in dump.stdout, name
        section = dump.stdout.split(table, 1)[1].split("[", 1)[0]
        assert f'BinaryName = "{node.bin_dir}/nvidia-container-runtime{suffix}"' in section
        assert "SystemdCgroup = true" in section  # copied from runc
    assert 'default_runtime_name = "nvidia"' in dump.stdout
    if _containerd_version() >= (1, 7):  # enable_cdi is new in 1.7 (Debian 12 has 1.6, which drops it)
        assert "enable_cdi = true" in dump.stdout
    if version == 2:  # the drop-in replaced the CRI table: the user's settings must have come along
        assert 'sandbox_image = "registry.k8s.io/pause:3.9"' in dump.stdout


def test_status_ignores_drop_in_not_imported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = Node(tmp_path, "containerd", CTD_V2)
    assert node.run(capsys, "configure")[0] == 0
    node.config.write_text(CTD_V2)  # someone dropped our import
    code, out, _ = node.run(capsys, "status")
    assert code == 1
    assert f"{node.drop_in}: not imported by {node.config}" in out


# ------------------------------------------------------------------------------ symlinked configs


def _host_configure(host: Path, *extra: str) -> list[str]:
    return [
        "configure",
        "--runtime=containerd",
        f"--host-root={host}",
        "--config=/etc/containerd/config.toml",
        "--drop-in-config=",
        "--restart-mode=none",
        *extra,
    ]


def test_symlinked_config_is_edited_at_its_target(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = Node(tmp_path, "containerd", None)
    real = tmp_path / "etc/containerd/real/config.toml"
    real.parent.mkdir()
    real.write_text(CTD_V2)
    node.config.symlink_to("real/config.toml")
    code, out, _ = node.run(capsys, "configure")
    assert code == 0
    assert f"note: {node.config} is reached through a symlink ({node.config} -> real/config.toml)" in out
    assert f"updated {real}" in out
    assert node.config.is_symlink()  # never replaced by a regular file
    assert os.readlink(node.config) == "real/config.toml"
    assert f"{node.drop_in.parent}/*.toml" in real.read_text()  # imports the drop-in
    assert node.run(capsys, "configure", "--revert")[0] == 0
    assert real.read_text() == CTD_V2
    assert node.config.is_symlink()


def test_an_absolute_link_is_resolved_under_the_host_root(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    host = tmp_path / "host"
    (host / "etc/containerd").mkdir(parents=True)
    (host / "opt/ctd").mkdir(parents=True)
    (host / "opt/ctd/config.toml").write_text(CTD_V1)
    link = host / "etc/containerd/config.toml"
    link.symlink_to("/opt/ctd/config.toml")  # the host's /opt, not ours
    assert runtime_cli.main(_host_configure(host), {}) == 0
    out = capsys.readouterr().out
    assert f"editing {host / 'opt/ctd/config.toml'}" in out
    assert "enable_cdi = true" in (host / "opt/ctd/config.toml").read_text()
    assert link.is_symlink()


@pytest.mark.parametrize("case", ["escapes", "directory", "device", "loop"])
def test_a_link_out_of_the_host_root_or_to_a_non_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    host = tmp_path / "host"
    (host / "etc/containerd").mkdir(parents=True)
    outside = tmp_path / "outside.toml"
    outside.write_text(CTD_V2)
    link = host / "etc/containerd/config.toml"
    target = {
        "escapes": "../../../outside.toml",
        "directory": "/etc",
        "device": "/dev/null",
        "loop": "config.toml",
    }[case]
    if case == "device":
        (host / "dev").mkdir()
        os.symlink("/dev/null", host / "dev/null")  # the host's /dev/null: a link again, to ours
    link.symlink_to(target)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    assert runtime_cli.main(_host_configure(host), {}) == 2
    err = capsys.readouterr().err
    assert f"{link}: is a symlink to {target}" in err
    assert "refusing to edit through it" in err
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before  # nothing created, nothing replaced
    assert os.readlink(link) == target
    assert outside.read_text() == CTD_V2


def test_systemd_unit_must_be_a_unit_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = Node(tmp_path / "host", "containerd", CTD_V2)
    calls = tmp_path / "calls"
    systemctl = tmp_path / "systemctl"
    systemctl.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    systemctl.chmod(0o755)
    argv = configure_argv(
        node, "--restart-mode=systemd", f"--systemctl={systemctl}", "--systemd-unit=--host=evil"
    )
    assert runtime_cli.main(argv, {}) == 1
    assert "starts with '-'" in capsys.readouterr().err
    assert not calls.exists()


# ------------------------------------------------------------------------ CDI, the default path


@pytest.mark.parametrize("version", [1, 2, 3])
def test_cdi_by_default_no_handlers(tmp_path: Path, capsys: pytest.CaptureFixture[str], version: int) -> None:
    node = Node(tmp_path, "containerd", CONFIGS[version])
    before = snapshot(tmp_path)
    code, out, err = node.run(capsys, "configure", legacy=False)
    assert code == 0, err
    written = (node.config if version == 1 else node.drop_in).read_text()
    assert "enable_cdi = true" in written
    assert 'cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]' in written
    assert "nvidia" not in written.replace("99-nvidia.toml", "")  # no handler, no NVIDIA binary named
    code, out, _ = node.run(capsys, "status", legacy=False)
    assert code == 0
    assert "CDI: enabled" in out
    assert "nvidia handlers: none (not needed with CDI)" in out
    assert node.run(capsys, "configure", "--revert", legacy=False)[0] == 0
    assert snapshot(tmp_path) == before


def test_cdi_status_says_when_not_enabled(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = Node(tmp_path, "containerd", CTD_V2)
    code, out, _ = node.run(capsys, "status", legacy=False)
    assert code == 1
    assert "CDI NOT enabled" in out


def test_crio_needs_nothing_for_cdi(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = Node(tmp_path, "crio", CRIO_CONF)
    before = snapshot(tmp_path)
    code, out, _ = node.run(capsys, "configure", legacy=False)
    assert (code, out.splitlines()[-1]) == (0, "no change")
    assert snapshot(tmp_path) == before
    code, out, _ = node.run(capsys, "status", legacy=False)
    assert code == 0
    assert "CRI-O reads CDI specs by itself" in out


@pytest.mark.parametrize("how", ["flag", "no-cdi"])
def test_legacy_handlers_need_nvidias_runtime_on_the_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    host = tmp_path / "host"
    node = Node(host, "containerd", CTD_V2)
    shutil.rmtree(host / TOOLKIT_DIR)  # a host with only gpunode: no NVIDIA binary
    before = snapshot(tmp_path)
    ask = "--nvidia-runtime-handlers" if how == "flag" else "--no-enable-cdi"
    argv = ["configure", "--runtime=containerd", f"--host-root={host}", "--restart-mode=none", ask]
    assert runtime_cli.main(argv, {}) == 2
    err = capsys.readouterr().err
    assert "/usr/local/nvidia/toolkit/nvidia-container-runtime" in err
    assert "not on this host" in err
    assert "nothing written" in err
    assert snapshot(tmp_path) == before  # never a config naming a missing binary
    fake_nvidia_runtime(host)
    assert runtime_cli.main(argv, {}) == 0
    assert "runtimes.nvidia-legacy" in node.drop_in.read_text()
    assert ("enable_cdi" in node.drop_in.read_text()) is (how == "flag")


def test_set_as_default_without_handlers_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node = Node(tmp_path, "containerd", CTD_V2)
    code, _, err = node.run(capsys, "configure", "--set-as-default", legacy=False)
    assert code == 2
    assert "needs --nvidia-runtime-handlers" in err

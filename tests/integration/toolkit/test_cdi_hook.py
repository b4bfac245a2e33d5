"""gpunode's CDI hook end to end without a container runtime: `cdi generate` installs gpunode-cdi-hook
under the host root (once), checks any other --hook-path, and the installed program (run by /bin/sh,
as a runtime runs it: no environment, OCI state on stdin) makes the spec's links and the container's
ld.so.cache in a bundle's root, refusing malformed state without touching anything. Also: `cdi list
| head -1`, --mode management, --disable-hook, and `hook install|uninstall`."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpunode.sim import nvml as sim
from gpunode.toolkit.hook import DEFAULT_HOOK_PATH, hook_program

TOOLKIT = str(Path(sys.executable).parent / "gpunode-toolkit")
DRIVER_ROOT = "/run/nvidia/driver"
VERSION = "550.54.15"
LIBDIR = "usr/lib/x86_64-linux-gnu"
SONAMES = {"libcuda": "libcuda.so.1", "libnvidia-ml": "libnvidia-ml.so.1"}


def _cc() -> str:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the fake driver's shared libraries")
    return cc


def _library(path: Path, soname: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    src = path.with_suffix(".c")
    src.write_text("int gpunode_fake(void) { return 0; }\n")
    subprocess.run(
        [_cc(), "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(path), str(src)], check=True
    )
    src.unlink()


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """A host tree whose driver root has real shared libraries (with their sonames) and no links, in
    NVIDIA's test-driver layout (lib/x86_64-linux-gnu, not merged under usr)."""
    root = tmp_path / "host"
    base = root / DRIVER_ROOT.lstrip("/")
    for name, soname in SONAMES.items():
        _library(base / "lib/x86_64-linux-gnu" / f"{name}.so.{VERSION}", soname)
    for node in ("nvidiactl", "nvidia-uvm", "nvidia0", "nvidia1"):
        (base / "dev").mkdir(parents=True, exist_ok=True)
        (base / "dev" / node).write_text("")
    return root


@pytest.fixture
def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith(("GPUNODE_", "NVIDIA_"))}
    out["LOG_FORMAT"] = "json"
    return out


@pytest.fixture
def state(tmp_path: Path) -> Path:
    path = tmp_path / "node.json"
    sim.init_state_file(path, "t4x4", force=True)
    return path


def toolkit(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([TOOLKIT, *args], env=env, capture_output=True, text=True, timeout=60)


def generate(
    state: Path, host: Path, out: Path, env: dict[str, str], *extra: str
) -> subprocess.CompletedProcess[str]:
    args = [
        "cdi",
        "generate",
        "--sim-state",
        str(state),
        "--host-root",
        str(host),
        "--driver-root",
        DRIVER_ROOT,
    ]
    return toolkit([*args, "--output", str(out), *extra], env)


def events(proc: subprocess.CompletedProcess[str], name: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    return [e for e in lines if e.get("event") == name]


def hooks(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return list(spec["containerEdits"].get("hooks", []))


# ------------------------------------------------------------------------------------- generate


def test_generate_installs_the_hook_once_and_the_spec_runs_it(
    tmp_path: Path, host: Path, state: Path, env: dict[str, str]
) -> None:
    out = tmp_path / "cdi" / "nvidia.yaml"
    first = generate(state, host, out, env)
    assert first.returncode == 0, first.stderr
    installed = host / DEFAULT_HOOK_PATH.lstrip("/")
    assert installed.read_bytes() == hook_program()
    assert stat.S_IMODE(installed.stat().st_mode) == 0o755
    assert len(events(first, "cdi_hook_installed")) == 1
    inode = installed.stat().st_ino
    again = generate(state, host, out, env)
    assert again.returncode == 0, again.stderr
    assert events(again, "cdi_hook_installed") == []  # idempotent: nothing rewritten
    assert installed.stat().st_ino == inode

    spec = yaml.safe_load(out.read_text())
    assert spec["cdiVersion"] == "0.5.0"  # Debian 12's podman 4.3 reads at most 0.5.0
    assert {h["path"] for h in hooks(spec)} == {DEFAULT_HOOK_PATH}
    libdir = "/lib/x86_64-linux-gnu"
    (hook,) = hooks(spec)  # gpunode's hook: every step in one process, joined by --then
    assert hook["args"] == [
        "gpunode-cdi-hook",
        "create-symlinks",
        "--link",
        f"libcuda.so.1::{libdir}/libcuda.so",
        "--link",
        f"libcuda.so.{VERSION}::{libdir}/libcuda.so.1",
        "--link",
        f"libnvidia-ml.so.{VERSION}::{libdir}/libnvidia-ml.so.1",
        "--then",
        "enable-cuda-compat",
        f"--host-driver-version={VERSION}",
        "--then",
        "update-ldcache",
        "--folder",
        libdir,
        "--then",
        "disable-device-node-modification",
    ]
    assert f"NVIDIA_CTK_LIBCUDA_DIR={libdir}" in spec["containerEdits"]["env"]
    mount = spec["containerEdits"]["mounts"][0]
    assert mount["options"] == ["ro", "nosuid", "nodev", "rbind", "rprivate"]


def test_a_hook_path_naming_no_program_exits_2_and_writes_no_spec(
    tmp_path: Path, host: Path, state: Path, env: dict[str, str]
) -> None:
    out = tmp_path / "nvidia.yaml"
    proc = generate(state, host, out, env, "--hook-path", "/usr/bin/nvidia-cdi-hook")
    assert proc.returncode == 2
    assert "--hook-path /usr/bin/nvidia-cdi-hook: no such program on the host" in proc.stderr
    assert not out.exists()
    assert "Traceback" not in proc.stderr
    # NVIDIA's hook where it is installed: used as is (nvidia-ctk gets its `hook` word)
    ctk = host / "usr/bin/nvidia-ctk"
    ctk.parent.mkdir(parents=True, exist_ok=True)
    ctk.write_text("#!/bin/sh\nexit 0\n")
    ctk.chmod(0o755)
    proc = generate(state, host, out, env, "--hook-path", "/usr/bin/nvidia-ctk")
    assert proc.returncode == 0, proc.stderr
    assert {tuple(h["args"][:2]) for h in hooks(yaml.safe_load(out.read_text()))} == {("nvidia-ctk", "hook")}
    assert not (host / DEFAULT_HOOK_PATH.lstrip("/")).exists()
    ctk.chmod(0o644)
    proc = generate(state, host, out, env, "--hook-path", "/usr/bin/nvidia-ctk")
    assert proc.returncode == 2
    assert "not executable" in proc.stderr


def test_disable_hook_all_needs_no_hook_program(
    tmp_path: Path, host: Path, state: Path, env: dict[str, str]
) -> None:
    out = tmp_path / "nvidia.yaml"
    proc = generate(state, host, out, env, "--disable-hook", "all", "--hook-path", "/nowhere/nvidia-cdi-hook")
    assert proc.returncode == 0, proc.stderr
    assert hooks(yaml.safe_load(out.read_text())) == []
    assert not (host / DEFAULT_HOOK_PATH.lstrip("/")).exists()
    bad = generate(state, host, out, env, "--disable-hook", "frobnicate")
    assert bad.returncode == 2
    assert "unknown hook 'frobnicate'" in bad.stderr


def test_management_mode(tmp_path: Path, host: Path, state: Path, env: dict[str, str]) -> None:
    out = tmp_path / "management.yaml"
    proc = generate(state, host, out, env, "--mode", "management")
    assert proc.returncode == 0, proc.stderr
    spec = yaml.safe_load(out.read_text())
    assert spec["kind"] == "management.nvidia.com/gpu"
    assert [d["name"] for d in spec["devices"]] == ["all"]
    assert [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]] == [
        "/dev/nvidia0",
        "/dev/nvidia1",
    ]


def test_unwritable_spec_directory_exits_1_without_a_partial_file(
    tmp_path: Path, host: Path, state: Path, env: dict[str, str]
) -> None:
    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir()
    out = spec_dir / "nvidia.yaml"
    out.write_text("old spec\n")
    if os.geteuid() == 0:  # root writes through modes: make the directory a file's child instead
        blocked = tmp_path / "file"
        blocked.write_text("")
        out = blocked / "nvidia.yaml"
    else:
        spec_dir.chmod(0o555)
    try:
        proc = generate(state, host, out, env)
    finally:
        spec_dir.chmod(0o755)
    assert proc.returncode == 1
    assert "cannot write" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in spec_dir.iterdir()) == ["nvidia.yaml"]
    assert (spec_dir / "nvidia.yaml").read_text() == "old spec\n"


def test_list_into_a_closed_pipe_is_quiet(
    tmp_path: Path, host: Path, state: Path, env: dict[str, str]
) -> None:
    out = tmp_path / "nvidia.yaml"
    assert generate(state, host, out, env).returncode == 0
    many = yaml.safe_load(out.read_text())
    many["devices"] = [{"name": f"d{i}", "containerEdits": {}} for i in range(20000)]
    big = tmp_path / "big.json"
    big.write_text(json.dumps(many))
    proc = subprocess.run(
        f"'{TOOLKIT}' cdi list --spec '{big}' | head -1", shell=True, env=env, capture_output=True, text=True
    )
    assert proc.stdout == "nvidia.com/gpu=d0\n"
    assert proc.stderr == ""
    for args in (
        "--help",
        "cdi generate --help",
        "runtime status --runtime crio --help",
        "hook install --help",
    ):
        proc = subprocess.run(
            f"'{TOOLKIT}' {args} | head -c 1", shell=True, env=env, capture_output=True, text=True
        )
        assert proc.stderr == "", args


# ------------------------------------------------------------------------------ the hook program


def bundle(tmp_path: Path) -> tuple[Path, Path, str]:
    """An OCI bundle whose rootfs looks like a Debian image after the runtime applied the spec's mounts:
    the driver's libraries at their container paths, /lib a link to usr/lib (merged /usr)."""
    b = tmp_path / "bundle"
    rootfs = b / "rootfs"
    (rootfs / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)
    (rootfs / "lib").symlink_to("usr/lib")
    (rootfs / "etc/ld.so.conf.d").mkdir(parents=True)
    (rootfs / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    for name, soname in SONAMES.items():
        _library(rootfs / "usr/lib/x86_64-linux-gnu" / f"{name}.so.{VERSION}", soname)
    (b / "config.json").write_text(json.dumps({"ociVersion": "1.0.2", "root": {"path": "rootfs"}}, indent=2))
    state = json.dumps({"ociVersion": "1.0.2", "id": "c1", "status": "creating", "pid": 1, "bundle": str(b)})
    return b, rootfs, state


def run_hook(hook: Path, args: list[str], stdin: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["/bin/sh", str(hook), *args], input=stdin, env={}, capture_output=True, text=True, timeout=30
    )


@pytest.fixture
def hook(tmp_path: Path, env: dict[str, str]) -> Path:
    proc = toolkit(["hook", "install", "--host-root", str(tmp_path / "h")], env)
    assert proc.returncode == 0, proc.stderr
    return tmp_path / "h" / DEFAULT_HOOK_PATH.lstrip("/")


def test_hook_makes_the_links_and_the_ld_cache(tmp_path: Path, hook: Path) -> None:
    if shutil.which("ldconfig") is None and not Path("/sbin/ldconfig").exists():
        pytest.skip("no ldconfig on this host")
    _, rootfs, state = bundle(tmp_path)
    links = [
        "--link",
        "libcuda.so.1::/lib/x86_64-linux-gnu/libcuda.so",
        "--link",
        f"libcuda.so.{VERSION}::/lib/x86_64-linux-gnu/libcuda.so.1",
        "--link",
        f"libnvidia-ml.so.{VERSION}::/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
    ]
    for _ in range(2):  # twice: the second run finds everything in place
        proc = run_hook(hook, ["create-symlinks", *links], state)
        assert proc.returncode == 0, proc.stderr
    lib = rootfs / "usr/lib/x86_64-linux-gnu"
    assert os.readlink(lib / "libcuda.so") == "libcuda.so.1"
    assert os.readlink(lib / "libcuda.so.1") == f"libcuda.so.{VERSION}"
    proc = run_hook(hook, ["update-ldcache", "--folder", "/lib/x86_64-linux-gnu"], state)
    assert proc.returncode == 0, proc.stderr
    assert (rootfs / "etc/ld.so.conf.d/00-gpunode-cdi.conf").read_text().splitlines()[
        -1
    ] == "/lib/x86_64-linux-gnu"
    cache = subprocess.run(["ldconfig", "-r", str(rootfs), "-p"], capture_output=True, text=True, check=True)
    assert "libcuda.so.1 " in cache.stdout
    assert "libnvidia-ml.so.1 " in cache.stdout
    proc = run_hook(hook, ["enable-cuda-compat", f"--host-driver-version={VERSION}"], state)
    assert proc.returncode == 0, proc.stderr  # no /usr/local/cuda/compat in the image: nothing to do
    _library(rootfs / "usr/local/cuda/compat/libcuda.so.570.86.10", "libcuda.so.1")
    proc = run_hook(hook, ["enable-cuda-compat", f"--host-driver-version={VERSION}"], state)
    assert proc.returncode == 0, proc.stderr
    assert (rootfs / "etc/ld.so.conf.d/00-compat-gpunode.conf").read_text() == "/usr/local/cuda/compat\n"
    assert run_hook(hook, ["disable-device-node-modification"], state).returncode == 0
    unknown = run_hook(hook, ["some-future-hook", "--x"], state)
    assert unknown.returncode == 0
    assert "unknown command" in unknown.stderr


def _tree(rootfs: Path) -> dict[str, str]:
    """Every link (-> its text) and regular file under rootfs, but the library caches."""
    out: dict[str, str] = {}
    for path in sorted(rootfs.rglob("*")):
        rel = str(path.relative_to(rootfs))
        if path.is_symlink():
            out[rel] = "-> " + os.readlink(path)
        elif path.is_file() and path.name not in ("ld.so.cache", "aux-cache"):
            out[rel] = "file"
    return out


def test_chained_steps_in_one_run_leave_what_separate_runs_leave(tmp_path: Path, hook: Path) -> None:
    """gpunode's spec runs every step in one process (--then). There the soname links are left to
    ldconfig and checked after it; a link ldconfig does not make (here libodd.so.1, whose library's
    soname is another name) is made by the hook and the cache rebuilt. The container ends up with the
    same links, config files and library cache as with one hook run per step."""
    if shutil.which("ldconfig") is None and not Path("/sbin/ldconfig").exists():
        pytest.skip("no ldconfig on this host")
    steps = [
        [
            "create-symlinks",
            "--link",
            "libcuda.so.1::/lib/x86_64-linux-gnu/libcuda.so",
            "--link",
            f"libcuda.so.{VERSION}::/lib/x86_64-linux-gnu/libcuda.so.1",
            "--link",
            f"libnvidia-ml.so.{VERSION}::/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
            "--link",
            f"libodd.so.{VERSION}::/lib/x86_64-linux-gnu/libodd.so.1",
        ],
        ["enable-cuda-compat", f"--host-driver-version={VERSION}"],
        ["update-ldcache", "--folder", "/lib/x86_64-linux-gnu"],
        ["disable-device-node-modification"],
    ]
    results = []
    for name, runs in (
        ("separate", steps),
        ("chained", [[a for i, step in enumerate(steps) for a in (["--then"] if i else []) + step]]),
    ):
        _, rootfs, state = bundle(tmp_path / name)
        _library(rootfs / f"usr/lib/x86_64-linux-gnu/libodd.so.{VERSION}", f"libodd-other.so.{VERSION}")
        for args in runs:
            proc = run_hook(hook, args, state)
            assert proc.returncode == 0, proc.stderr
            assert proc.stderr == ""
        cache = subprocess.run(
            ["ldconfig", "-r", str(rootfs), "-p"], capture_output=True, text=True, check=True
        )
        results.append((_tree(rootfs), sorted(cache.stdout.splitlines()[1:])))
        lib = rootfs / "usr/lib/x86_64-linux-gnu"
        assert os.readlink(lib / "libcuda.so") == "libcuda.so.1"
        assert os.readlink(lib / "libcuda.so.1") == f"libcuda.so.{VERSION}"
        assert os.readlink(lib / "libnvidia-ml.so.1") == f"libnvidia-ml.so.{VERSION}"
        assert os.readlink(lib / "libodd.so.1") == f"libodd.so.{VERSION}"
        assert "libcuda.so.1 " in cache.stdout
        assert "libnvidia-ml.so.1 " in cache.stdout
    assert results[0] == results[1]
    # run again on the finished tree (a second spec's hook): nothing to do, nothing changed
    again = run_hook(
        hook, [a for i, step in enumerate(steps) for a in (["--then"] if i else []) + step], state
    )
    assert again.returncode == 0, again.stderr
    assert _tree(rootfs) == results[1][0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["create-symlinks", "--link", "a::/usr/lib/a.so", "--then"], "--then needs a command"),
        (["create-symlinks", "--then", "create-symlinks"], "given twice"),
        (
            ["create-symlinks", "--link", "a::/usr/lib/a.so", "--then", "update-ldcache", "--folder", "rel"],
            "absolute",
        ),
        (["create-symlinks", "--link", "a::/usr/lib/a.so", "--then", "--then", "update-ldcache"], "--then"),
    ],
)
def test_chained_usage_errors_exit_2_and_change_nothing(
    tmp_path: Path, hook: Path, args: list[str], message: str
) -> None:
    _, rootfs, state = bundle(tmp_path)
    before = _tree(rootfs)
    proc = run_hook(hook, args, state)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("gpunode-cdi-hook: error: ")
    assert message in proc.stderr
    assert _tree(rootfs) == before


@pytest.mark.parametrize(
    "state",
    [
        "",
        "not json",
        '{"ociVersion": "1.0.2"}',
        '{"bundle": "relative/path"}',
        '{"bundle": "/nonexistent/bundle"}',
        '{"bundle": "BUNDLE_WITHOUT_ROOT"}',
        '{"bundle": "BUNDLE_WITH_EMPTY_ROOT"}',
    ],
)
def test_hook_refuses_malformed_state_and_makes_no_link(tmp_path: Path, hook: Path, state: str) -> None:
    b, rootfs, _ = bundle(tmp_path)
    if "BUNDLE_WITHOUT_ROOT" in state:
        (b / "config.json").write_text('{"ociVersion": "1.0.2"}')
        state = state.replace("BUNDLE_WITHOUT_ROOT", str(b))
    if "BUNDLE_WITH_EMPTY_ROOT" in state:
        (b / "config.json").write_text('{"ociVersion": "1.0.2", "root": {"path": ""}}')
        state = state.replace("BUNDLE_WITH_EMPTY_ROOT", str(b))
    before = sorted(str(p) for p in rootfs.rglob("*"))
    link = ["create-symlinks", "--link", "libcuda.so.1::/lib/x86_64-linux-gnu/libcuda.so"]
    for args in (link, [*link, "--then", "update-ldcache", "--folder", "/lib/x86_64-linux-gnu"]):
        proc = run_hook(hook, args, state)
        assert proc.returncode == 1
        assert proc.stderr.startswith("gpunode-cdi-hook: error: ")
        assert sorted(str(p) for p in rootfs.rglob("*")) == before


def test_hook_keeps_writes_inside_the_container_root(tmp_path: Path, hook: Path) -> None:
    _, rootfs, state = bundle(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (rootfs / "opt").mkdir()
    (rootfs / "opt/lib").symlink_to(str(outside))  # an absolute link in the image, meant for the container
    proc = run_hook(hook, ["create-symlinks", "--link", "x::/opt/lib/libx.so"], state)
    assert proc.returncode == 0, proc.stderr
    assert list(outside.iterdir()) == []
    assert os.readlink(rootfs / str(outside).lstrip("/") / "libx.so") == "x"


def test_hook_undoes_its_links_when_one_cannot_be_made(tmp_path: Path, hook: Path) -> None:
    _, rootfs, state = bundle(tmp_path)
    (rootfs / "blocker").write_text("")  # a file where a directory is needed
    links = ["--link", "a::/usr/lib/x86_64-linux-gnu/first.so", "--link", "b::/blocker/sub/second.so"]
    proc = run_hook(hook, ["create-symlinks", *links], state)
    assert proc.returncode == 1
    assert "removed" in proc.stderr
    assert not (rootfs / "usr/lib/x86_64-linux-gnu/first.so").is_symlink()


def test_hook_usage_errors_exit_2(tmp_path: Path, hook: Path) -> None:
    _, _, state = bundle(tmp_path)
    for args in (["create-symlinks", "--link", "no-separator"], ["update-ldcache", "--folder", "rel"], []):
        proc = run_hook(hook, args, state)
        assert proc.returncode == 2, args
        assert "gpunode-cdi-hook: error:" in proc.stderr


def test_hook_uninstall_leaves_foreign_files(tmp_path: Path, env: dict[str, str]) -> None:
    root = tmp_path / "h"
    foreign = root / DEFAULT_HOOK_PATH.lstrip("/")
    foreign.parent.mkdir(parents=True)
    foreign.write_text("#!/bin/sh\n# someone else's program\n")
    proc = toolkit(["hook", "uninstall", "--host-root", str(root)], env)
    assert proc.returncode == 1
    assert "not gpunode's hook" in proc.stderr
    assert foreign.exists()
    foreign.unlink()
    assert toolkit(["hook", "install", "--host-root", str(root)], env).returncode == 0
    proc = toolkit(["hook", "uninstall", "--host-root", str(root)], env)
    assert proc.returncode == 0, proc.stderr
    assert not (root / "usr/local/gpunode").exists()


def test_also_kind_writes_the_plugins_spec_beside(
    tmp_path: Path, host: Path, state: Path, env: dict[str, str]
) -> None:
    out = tmp_path / "cdi" / "nvidia.yaml"
    proc = generate(state, host, out, env, "--also-kind", "k8s.device-plugin.nvidia.com/gpu,nvidia.com/gpu")
    assert proc.returncode == 0, proc.stderr
    plugin = out.parent / "k8s.device-plugin.nvidia.com-gpu.yaml"
    main, extra = yaml.safe_load(out.read_text()), yaml.safe_load(plugin.read_text())
    assert sorted(p.name for p in out.parent.iterdir()) == [
        "k8s.device-plugin.nvidia.com-gpu.yaml",
        "nvidia.yaml",
    ]
    assert extra["kind"] == "k8s.device-plugin.nvidia.com/gpu"
    assert {**extra, "kind": main["kind"]} == main
    assert [e["path"] for e in events(proc, "cdi_spec_written")] == [str(out), str(plugin)]
    bad = generate(state, host, out, env, "--also-kind", "not-a-kind")
    assert bad.returncode == 2


BUSYBOX_TOOLS = (
    "sh",
    "awk",
    "sed",
    "tr",
    "head",
    "ln",
    "mkdir",
    "mv",
    "rm",
    "readlink",
    "cat",
    "grep",
    "mount",
)


def test_hook_runs_with_busybox_alone(tmp_path: Path, hook: Path) -> None:
    """Only busybox's sh and applets on PATH (plus the host's ldconfig): a host without coreutils or bash."""
    busybox = shutil.which("busybox")
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    if busybox is None or not Path(ldconfig).exists():
        pytest.skip("no busybox (or no ldconfig) on this machine")
    tools = tmp_path / "busybox-bin"
    tools.mkdir()
    for tool in BUSYBOX_TOOLS:
        (tools / tool).symlink_to(busybox)
    (tools / "ldconfig").symlink_to(ldconfig)
    script = tmp_path / "hook-busybox"
    text = hook.read_text()
    assert "\nPATH=/usr/sbin:/usr/bin:/sbin:/bin\n" in text
    script.write_text(text.replace("\nPATH=/usr/sbin:/usr/bin:/sbin:/bin\n", f"\nPATH={tools}\n"))
    _, rootfs, state = bundle(tmp_path)

    def run(*args: str, stdin: str = state) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [busybox, "sh", str(script), *args],
            input=stdin,
            env={},
            capture_output=True,
            text=True,
            timeout=30,
        )

    links = ["--link", "libcuda.so.1::/lib/x86_64-linux-gnu/libcuda.so"]
    links += ["--link", f"libcuda.so.{VERSION}::/lib/x86_64-linux-gnu/libcuda.so.1"]
    assert run("create-symlinks", *links).returncode == 0
    assert os.readlink(rootfs / "usr/lib/x86_64-linux-gnu/libcuda.so.1") == f"libcuda.so.{VERSION}"
    done = run("update-ldcache", "--folder", "/lib/x86_64-linux-gnu")
    assert done.returncode == 0, done.stderr
    cache = subprocess.run([ldconfig, "-r", str(rootfs), "-p"], capture_output=True, text=True, check=True)
    assert "libcuda.so.1 " in cache.stdout
    bad = run("create-symlinks", *links, stdin="{}")
    assert bad.returncode == 1
    assert "bundle" in bad.stderr


def test_management_mode_needs_no_nvml(tmp_path: Path, host: Path, env: dict[str, str]) -> None:
    """No --sim-state, no NVML here: the driver version comes from the host's /proc or its libraries."""
    out = tmp_path / "management.yaml"
    args = ["cdi", "generate", "--mode", "management", "--host-root", str(host), "--driver-root", DRIVER_ROOT]
    proc = toolkit([*args, "--output", str(out)], env)
    assert proc.returncode == 0, proc.stderr  # libnvidia-ml.so.550.54.15 in the driver root tells the version
    spec = yaml.safe_load(out.read_text())
    assert [d["name"] for d in spec["devices"]] == ["all"]
    assert f"--host-driver-version={VERSION}" in hooks(spec)[0]["args"]
    version = host / "proc/driver/nvidia/version"
    version.parent.mkdir(parents=True)
    version.write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.10  Thu Jan  1 00:00:00 UTC 2026\n"
    )
    proc = toolkit([*args, "--output", str(out)], env)
    assert proc.returncode == 1  # the loaded module is 570.86.10: the 550.54.15 libraries are not its own
    assert "no driver libraries of version 570.86.10" in proc.stderr


def test_disable_device_node_modification_in_a_mount_namespace(tmp_path: Path, hook: Path) -> None:
    """The driver's params file (a stand-in: this machine has no NVIDIA driver) says ModifyDeviceFiles: 1;
    inside a private mount namespace (as the runtime's, where createContainer hooks run) the container's
    copy reads 0 after the hook, and the host's file is untouched."""
    unshare = shutil.which("unshare")
    if unshare is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1) for a private mount namespace")
    params = tmp_path / "driver-params"
    params.write_text("ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 1\nDeviceFileUID: 0\n")
    script = tmp_path / "hook-params"
    text = hook.read_text()
    assert "    params=/proc/driver/nvidia/params\n" in text
    script.write_text(text.replace("    params=/proc/driver/nvidia/params\n", f"    params={params}\n"))
    b, rootfs, state = bundle(tmp_path)
    inside = rootfs / str(params).lstrip("/")  # the container's view of the same path
    inside.parent.mkdir(parents=True)
    inside.write_text(params.read_text())
    (tmp_path / "state.json").write_text(state)
    shell = f"sh '{script}' disable-device-node-modification < '{tmp_path / 'state.json'}' && cat '{inside}'"
    proc = subprocess.run([unshare, "-m", "sh", "-c", shell], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert "ModifyDeviceFiles: 0\n" in proc.stdout
    assert "DeviceFileUID: 0\n" in proc.stdout
    assert "ModifyDeviceFiles: 1" in params.read_text()
    assert "ModifyDeviceFiles: 1" in inside.read_text()  # outside that namespace: no mount left behind
    assert (b / "gpunode-nvidia-params").exists()

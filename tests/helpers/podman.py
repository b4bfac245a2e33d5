"""Podman as a real CDI consumer for tests and benchmarks: its settings for these machines, the local base
image, the shared CDI spec directory, and a check script run inside containers.

Debian 12's podman 4.3 reads CDI specs only from ``/etc/cdi`` and ``/var/run/cdi``, which the whole host
shares: :func:`cdi_spec` holds an exclusive lock on ``/var/run/cdi/.gpunode-tests.lock`` while a spec of
ours is there, and removes the spec on the way out. Other test processes that write there must take the
same lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "BASE_IMAGE",
    "CDI_DIR",
    "CHECK_SCRIPT",
    "CONTAINERS_CONF",
    "REPO",
    "SpecFile",
    "cdi_spec",
    "ensure_base_image",
    "inspect_container",
    "podman",
    "podman_env",
    "why_podman_cannot_run",
]

REPO = Path(__file__).resolve().parents[2]
CONTAINERS_CONF = REPO / "containers" / "ci" / "containers.conf"
BASE_SCRIPT = REPO / "containers" / "ci" / "base-image.sh"
BASE_IMAGE = os.environ.get("GPUNODE_BASE_IMAGE", "localhost/gpunode-debian12-py:latest")
CDI_DIR = Path("/var/run/cdi")
LOCK = CDI_DIR / ".gpunode-tests.lock"


def podman_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for podman: ours, with CONTAINERS_CONF naming containers/ci/containers.conf
    unless the caller's environment names one already."""
    env = dict(os.environ)
    env.setdefault("CONTAINERS_CONF", str(CONTAINERS_CONF))
    env.update(extra or {})
    return env


def podman(
    *args: str, timeout: float = 120, check: bool = False, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``podman ARGS`` with our settings, output captured."""
    out = subprocess.run(
        ["podman", *args],
        env=podman_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        input=input,
    )
    if check and out.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {out.returncode}:\n{out.stderr[-3000:]}")
    return out


def ensure_base_image(timeout: float = 600) -> str:
    """The base image (containers/ci/base-image.sh makes it once per machine); RuntimeError if it cannot
    be made."""
    out = subprocess.run(
        [str(BASE_SCRIPT)], env=podman_env(), capture_output=True, text=True, timeout=timeout
    )
    if out.returncode != 0:
        raise RuntimeError(f"{BASE_SCRIPT} exited {out.returncode}: {out.stderr.strip()[-2000:]}")
    return BASE_IMAGE


def why_podman_cannot_run() -> str | None:
    """None when podman can start a container here (as root, with the base image); else why not."""
    if shutil.which("podman") is None:
        return "podman is not installed (apt-get install podman buildah mmdebstrap runc uidmap)"
    if os.geteuid() != 0:
        return "the container tests need root (device nodes with mknod, /var/run/cdi)"
    info = podman("info", "--format", "{{.Host.OCIRuntime.Name}}", timeout=60)
    if info.returncode != 0:
        return f"podman info failed: {info.stderr.strip()[-500:]}"
    try:
        image = ensure_base_image()
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        return f"no base image: {exc}"
    probe = podman("run", "--rm", "--network", "none", image, "true", timeout=120)
    if probe.returncode != 0:
        return f"podman cannot run a container here: {probe.stderr.strip()[-500:]}"
    return None


class SpecFile:
    """One spec file of ours in /var/run/cdi; :meth:`write` replaces its content atomically."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.siblings: list[SpecFile] = []

    def sibling(self, name: str) -> SpecFile:
        """Another spec file of ours next to this one (another kind), removed with it."""
        other = SpecFile(self.path.with_name(name))
        self.siblings.append(other)
        return other

    def write(self, text: str) -> Path:
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, self.path)
        return self.path


def foreign_specs(ours: Path, kind: str = "nvidia.com/gpu") -> list[Path]:
    """Spec files other than ``ours`` in the directories podman reads that declare ``kind``."""
    found = []
    for directory in (Path("/etc/cdi"), CDI_DIR):
        for path in sorted(directory.glob("*")) if directory.is_dir() else ():
            if path == ours or path.suffix not in (".yaml", ".yml", ".json") or path.name.startswith("."):
                continue
            with contextlib.suppress(OSError, UnicodeDecodeError):
                if re.search(rf'^\s*"?kind"?\s*:\s*"?{re.escape(kind)}"?\s*,?\s*$', path.read_text(), re.M):
                    found.append(path)
    return found


@contextlib.contextmanager
def cdi_spec(name: str = "gpunode-test.yaml") -> Iterator[SpecFile]:
    """/var/run/cdi/NAME for the block (written with ``.write``), under the directory's test lock;
    removed on the way out."""
    CDI_DIR.mkdir(parents=True, exist_ok=True)
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        spec = SpecFile(CDI_DIR / name)
        others = foreign_specs(spec.path)
        if others:
            raise AssertionError(
                "other CDI specs name devices of the same kind and would conflict with ours "
                f"(podman then resolves none): {', '.join(map(str, others))}"
            )
        try:
            yield spec
        finally:
            for f in (spec, *spec.siblings):
                for p in (f.path, f.path.with_name(f".{f.path.name}.tmp")):
                    with contextlib.suppress(FileNotFoundError):
                        p.unlink()


# Run inside the container (python3 -c): what the container sees of the GPUs, as one JSON line.
#  nodes: /dev/nvidia* and /dev/nvidia-caps/* -> [major, minor]
#  open_errno: the errno opening each node gives (ENXIO: allowed, no driver behind it)
#  probe: for each "major:minor" asked for, the errno opening a node made here with mknod gives
#         (ENXIO: the devices cgroup allows it; EPERM: it does not)
#  cgroup: the devices cgroup's allow list (cgroup v1), or null
#  env, ldconfig (the sonames `ldconfig -p` lists), nvml/cuda (what nvmlInit_v2/cuInit answer)
CHECK_SCRIPT = r"""
import ctypes, errno, json, os, stat, subprocess, sys
out = {"nodes": {}, "open_errno": {}, "probe": {}, "cgroup": None}
paths = [os.path.join("/dev", n) for n in os.listdir("/dev") if n.startswith("nvidia")]
if os.path.isdir("/dev/nvidia-caps"):
    paths += [os.path.join("/dev/nvidia-caps", n) for n in os.listdir("/dev/nvidia-caps")]
for p in sorted(paths):
    st = os.lstat(p)
    if not stat.S_ISCHR(st.st_mode):
        continue
    out["nodes"][p] = [os.major(st.st_rdev), os.minor(st.st_rdev)]
    try:
        os.close(os.open(p, os.O_RDWR))
        out["open_errno"][p] = 0
    except OSError as e:
        out["open_errno"][p] = e.errno
for i, spec in enumerate(sys.argv[1:]):
    major, minor = (int(x) for x in spec.split(":"))
    node = "/tmp/probe%d" % i
    os.mknod(node, 0o600 | stat.S_IFCHR, os.makedev(major, minor))
    try:
        os.close(os.open(node, os.O_RDWR))
        out["probe"][spec] = 0
    except OSError as e:
        out["probe"][spec] = e.errno
    os.unlink(node)
try:
    with open("/sys/fs/cgroup/devices/devices.list") as f:
        out["cgroup"] = f.read().split("\n")
except OSError:
    pass
out["env"] = dict(os.environ)
ld = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
out["ldconfig"] = sorted({l.split()[0] for l in ld.splitlines()[1:] if l.strip()})
try:
    out["nvml"] = ctypes.CDLL("libnvidia-ml.so.1").nvmlInit_v2()
except OSError as e:
    out["nvml"] = "load failed: %s" % e
try:
    out["cuda"] = ctypes.CDLL("libcuda.so.1").cuInit(0)
except OSError as e:
    out["cuda"] = "load failed: %s" % e
print(json.dumps(out))
"""


def inspect_container(
    devices: Sequence[str], *, probes: Sequence[str] = (), image: str = BASE_IMAGE, timeout: float = 120
) -> dict[str, Any]:
    """Start a container with ``--device`` for each of ``devices`` (CDI names), run
    :data:`CHECK_SCRIPT` in it, and return what it saw. AssertionError when podman fails."""
    args = ["run", "--rm", "--network", "none"]
    for d in devices:
        args += ["--device", d]
    out = podman(*args, image, "python3", "-c", CHECK_SCRIPT, *probes, timeout=timeout)
    if out.returncode != 0:
        raise AssertionError(
            f"podman run {' '.join(devices)} exited {out.returncode}:\n"
            f"{out.stderr[-3000:]}\n{out.stdout[-1000:]}"
        )
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no JSON from the container:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"
    result: dict[str, Any] = json.loads(lines[-1])
    return result

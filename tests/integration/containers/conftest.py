"""Real containers on a simulated node: podman (the CDI consumer), a fake driver root, gpunode's spec and
hook program, and what a container sees.

Every test here starts containers with podman. They are skipped, with the reason printed, only where
podman cannot run a container at all (not installed, not root, no base image could be made); with
GPUNODE_REQUIRE_CONTAINERS=1 (set by .ci/run) that is a failure instead. They run one at a time: the
specs go to /var/run/cdi, which the host shares (see helpers.podman.cdi_spec).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import podman
from helpers.fakedriver import FakeDriver, build_fake_driver

#: NVIDIA's programs that must not be on the host: the spec has to work with gpunode alone
NVIDIA_PROGRAMS = (
    "nvidia-cdi-hook",
    "nvidia-ctk",
    "nvidia-container-runtime",
    "nvidia-container-runtime-hook",
    "nvidia-container-cli",
)


@pytest.fixture(scope="session")
def podman_ready() -> str:
    """The base image, once podman is known to run containers here; skip (or fail in CI) otherwise."""
    reason = podman.why_podman_cannot_run()
    if reason is not None:
        message = f"podman cannot run containers on this machine: {reason}"
        if os.environ.get("GPUNODE_REQUIRE_CONTAINERS") == "1":
            pytest.fail(message + " (GPUNODE_REQUIRE_CONTAINERS=1)")
        print(f"\nSKIPPING the container tests: {message}", file=sys.stderr)
        pytest.skip(message)
    found = {p: shutil.which(p) for p in NVIDIA_PROGRAMS}
    found = {p: w for p, w in found.items() if w}
    assert not found, f"NVIDIA's programs are on this host; the tests must run without them: {found}"
    return podman.BASE_IMAGE


@pytest.fixture(scope="session")
def library_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the fake driver's libraries are built once for the session."""
    return tmp_path_factory.mktemp("driver-libraries")


@pytest.fixture(scope="session")
def driver(tmp_path_factory: pytest.TempPathFactory, podman_ready: str, library_cache: Path) -> FakeDriver:
    """The fake driver root of an 8-GPU node (the simulator's driver version), libraries under
    usr/lib/x86_64-linux-gnu."""
    return build_fake_driver(tmp_path_factory.mktemp("fake-driver"), library_cache=library_cache)


@pytest.fixture(scope="session")
def hook(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Where the spec's hooks find gpunode's hook program: `gpunode-toolkit cdi generate` installs it
    there itself (a temp dir, reached through the fake host root: nothing is installed on the host
    running the tests)."""
    return str(tmp_path_factory.mktemp("toolkit") / "gpunode-cdi-hook")


@pytest.fixture
def cdi_dir() -> Iterator[podman.SpecFile]:
    """Our spec file in /var/run/cdi for the test (under the directory's test lock), removed after it."""
    with podman.cdi_spec(f"gpunode-test-{os.getpid()}.yaml") as spec:
        yield spec

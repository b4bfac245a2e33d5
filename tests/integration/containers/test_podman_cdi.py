"""gpunode's CDI spec applied by a real CDI consumer: podman starts containers with `--device
nvidia.com/gpu=...` on a simulated dgx-a100 with a fake driver root, with only gpunode on the host (its
hook program, no NVIDIA binary). Each container must see exactly its devices (nodes, the devices cgroup,
nodes made inside it), the spec's environment, the driver libraries in `ldconfig -p`, and load
libnvidia-ml.so.1 and libcuda.so.1 with ctypes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpunode.sim import nvml as sim
from helpers.fakedriver import FakeDriver, build_fake_driver
from helpers.gpucontainers import expect_gpus, expect_mig, generate_spec, inventory, mig_apply, run_and_check
from helpers.podman import SpecFile

# The first test may bootstrap the base image (containers/ci/base-image.sh, up to ~2 minutes on 2 busy
# cores) in its session fixture: more than the default per-test timeout.
pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def node(tmp_path: Path) -> Path:
    state = tmp_path / "node.json"
    sim.init_state_file(state, "dgx-a100")
    return state


async def test_one_gpu_by_index_and_by_uuid(
    node: Path, driver: FakeDriver, hook: str, cdi_dir: SpecFile, tmp_path: Path
) -> None:
    spec = generate_spec(node, driver, hook, tmp_path / "spec.yaml")
    cdi_dir.write((tmp_path / "spec.yaml").read_text())
    gpus, _ = await inventory(node)
    gpu0 = next(g for g in gpus if g.index == 0)
    run_and_check(["nvidia.com/gpu=0"], driver, spec, expect_gpus(gpu0.minor))
    gpu5 = next(g for g in gpus if g.index == 5)
    run_and_check([f"nvidia.com/gpu={gpu5.uuid}"], driver, spec, expect_gpus(gpu5.minor))


async def test_all_and_two_devices_at_once(
    node: Path, driver: FakeDriver, hook: str, cdi_dir: SpecFile, tmp_path: Path
) -> None:
    spec = generate_spec(node, driver, hook, tmp_path / "spec.yaml")
    cdi_dir.write((tmp_path / "spec.yaml").read_text())
    gpus, _ = await inventory(node)
    run_and_check(["nvidia.com/gpu=all"], driver, spec, expect_gpus(*(g.minor for g in gpus)))
    by_index = {g.index: g for g in gpus}
    run_and_check(
        ["nvidia.com/gpu=1", f"nvidia.com/gpu={by_index[6].uuid}"],
        driver,
        spec,
        expect_gpus(by_index[1].minor, by_index[6].minor),
    )


async def test_mig_device_after_all_balanced(
    node: Path, driver: FakeDriver, hook: str, cdi_dir: SpecFile, tmp_path: Path
) -> None:
    mig_apply(node, "all-balanced")
    spec = generate_spec(node, driver, hook, tmp_path / "spec.yaml")
    cdi_dir.write((tmp_path / "spec.yaml").read_text())
    gpus, migs = await inventory(node)
    assert all(len(migs[g.index]) == 4 for g in gpus), "all-balanced: 2 x 1g + 2g + 3g on every A100"
    gpu = next(g for g in gpus if g.index == 2)
    mig = next(m for m in migs[2] if m.profile == "3g.20gb")
    run_and_check([f"nvidia.com/gpu={mig.uuid}"], driver, spec, expect_mig(driver, gpu, mig))
    # by its index name too, together with a MIG device of another GPU: both GPUs, four capabilities
    other_gpu = next(g for g in gpus if g.index == 7)
    other = migs[7][0]
    first, second = expect_mig(driver, gpu, mig), expect_mig(driver, other_gpu, other)
    run_and_check(
        [f"nvidia.com/gpu=2:{mig.index}", f"nvidia.com/gpu={other.uuid}"],
        driver,
        spec,
        type(first)(first.gpu_minors | second.gpu_minors, first.cap_minors | second.cap_minors),
    )


@pytest.mark.parametrize("libdir", ["lib/x86_64-linux-gnu", "usr/lib64"])
async def test_other_driver_layouts(
    libdir: str,
    node: Path,
    podman_ready: str,
    library_cache: Path,
    hook: str,
    cdi_dir: SpecFile,
    tmp_path: Path,
) -> None:
    """Libraries under lib/x86_64-linux-gnu (NVIDIA's test driver root; /lib is a link to /usr/lib in
    the container) or usr/lib64 reach the container and its linker cache all the same."""
    driver = build_fake_driver(tmp_path / "driver-tree", libdir=libdir, library_cache=library_cache)
    spec = generate_spec(node, driver, hook, tmp_path / "spec.yaml")
    cdi_dir.write((tmp_path / "spec.yaml").read_text())
    mounted = {m["containerPath"] for m in spec["containerEdits"]["mounts"]}
    assert f"/{libdir}/libnvidia-ml.so.{driver.version}" in mounted, sorted(mounted)
    gpus, _ = await inventory(node)
    gpu3 = next(g for g in gpus if g.index == 3)
    run_and_check(["nvidia.com/gpu=3"], driver, spec, expect_gpus(gpu3.minor))

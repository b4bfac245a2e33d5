"""`gpunode-toolkit cdi` as a real process on simulated nodes: specs checked against the published CDI
JSON schema and the golden files, `cdi list`, unwritable outputs, `--watch` after MIG changes, and the
device plugin's CDI names resolving in the spec.

Golden specs live in tests/golden/cdi/<case>.yaml. To change them on purpose:
``GPUNODE_UPDATE_GOLDEN=1 pytest tests/integration/toolkit/test_cdi_cli.py``, then review the diff.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from referencing import Registry
from referencing.jsonschema import DRAFT7

from gpunode.agent.nvml import open_nvml
from gpunode.device_plugin.allocation import CDI_KIND as PLUGIN_CDI_KIND
from gpunode.device_plugin.allocation import allocate_response
from gpunode.device_plugin.devices import build_inventory
from gpunode.device_plugin.settings import PluginSettings
from gpunode.nvml import mig
from gpunode.nvml.caps import parse_mig_minors
from gpunode.sim import nvml as sim

TOOLKIT = str(Path(sys.executable).parent / "gpunode-toolkit")
REPO = Path(__file__).resolve().parents[3]
GOLDEN = REPO / "tests" / "golden" / "cdi"
SCHEMA_DIR = Path(os.environ.get("GPUNODE_CDI_SCHEMA_DIR", "/work/shared/reference/cdi-schema"))
UPDATE_ENV = "GPUNODE_UPDATE_GOLDEN"
DRIVER_ROOT = "/run/nvidia/driver"
VERSION = "550.54.15"
LIBDIR = "usr/lib/x86_64-linux-gnu"
PRESETS = (
    "dgx-a100",
    "dgx-a100-80gb",
    "dgx-h100",
    "hgx-h200",
    "a30x4",
    "t4x4",
    "mixed",
    "dgx-b200",
    "gb200-nvl4",
    "h100-nvl",
    "l4x8",
    "l40sx4",
    "a10x4",
    "a2x2",
    "mixed-ada-ampere",
)
BLACKWELL_VERSION = "570.124.06"  # the Blackwell presets' driver (R570)


# ------------------------------------------------------------------------------------- fixtures


def _touch(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")


def mig_minors_table(gpus: int = 8) -> str:
    """/proc/driver/nvidia-caps/mig-minors as the driver writes it: 15 GIs x (1 + 8 CIs) per GPU."""
    lines = ["config 1", "monitor 2"]
    minor = 3
    for g in range(gpus):
        for gi in range(15):
            lines.append(f"gpu{g}/gi{gi}/access {minor}")
            minor += 1
            for ci in range(8):
                lines.append(f"gpu{g}/gi{gi}/ci{ci}/access {minor}")
                minor += 1
    return "\n".join(lines) + "\n"


def fake_host(root: Path, version: str = VERSION) -> Path:
    """A host tree: the driver's files under /run/nvidia/driver (libraries of the simulator's driver
    version with their .so links, binaries, firmware, control nodes) and /proc's mig-minors."""
    base = root / DRIVER_ROOT.lstrip("/")
    lib = base / LIBDIR
    for name in ("libnvidia-ml", "libcuda", "libnvidia-ptxjitcompiler", "libnvidia-nvvm", "libnvidia-cfg"):
        _touch(lib / f"{name}.so.{version}")
        (lib / f"{name}.so.1").symlink_to(f"{name}.so.{version}")
    (lib / "libcuda.so").symlink_to("libcuda.so.1")
    for binary in ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control"):
        _touch(base / "usr/bin" / binary)
    _touch(base / f"lib/firmware/nvidia/{version}/gsp_ga10x.bin")
    for node in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"):
        _touch(base / "dev" / node)
    minors = root / "proc/driver/nvidia-caps/mig-minors"
    minors.parent.mkdir(parents=True)
    minors.write_text(mig_minors_table())
    return root


@pytest.fixture
def host(tmp_path: Path) -> Path:
    return fake_host(tmp_path / "host")


@pytest.fixture
def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith(("GPUNODE_", "NVIDIA_"))}
    out["LOG_FORMAT"] = "json"
    return out


def build_mig_layout(state: Path, preset: str = "dgx-a100") -> None:
    """MIG on GPUs 0-3: 7 x 1g (1g.5gb on dgx-a100); 3g + 2g + 1g; one 7g; enabled but empty. 4-7 whole."""
    sim.init_state_file(state, preset, force=True)
    layout = {
        0: [mig.GI_1_SLICE] * 7,
        1: [mig.GI_3_SLICE, mig.GI_2_SLICE, mig.GI_1_SLICE],
        2: [mig.GI_7_SLICE],
        3: [],
    }
    ci_for = {
        mig.GI_1_SLICE: mig.CI_1_SLICE,
        mig.GI_2_SLICE: mig.CI_2_SLICE,
        mig.GI_3_SLICE: mig.CI_3_SLICE,
        mig.GI_7_SLICE: mig.CI_7_SLICE,
    }
    with sim.SimNode.open(state).mutate() as st:
        for g, profiles in layout.items():
            st.set_mig_mode(g, 1)
            st.reset_gpu(g)
            for profile in profiles:
                ret, gi = st.create_gi(g, profile, None)
                assert ret == 0
                assert st.create_ci(g, gi, ci_for[profile], None)[0] == 0


def make_state(tmp_path: Path, case: str) -> Path:
    """A shared simulated node for ``case`` with fixed UUIDs: a state file gets a random node id (so
    two files are two nodes); give it the one of ``--simulate PRESET`` so the goldens stay put."""
    state = tmp_path / "node.json"
    if case.endswith("-mig"):
        build_mig_layout(state, case.removesuffix("-mig"))
    else:
        sim.init_state_file(state, case, force=True)
    preset = sim.read_state_file(state).preset
    with sim.SimNode.open(state).mutate() as st:
        st.node_id = sim.SimNodeState.new(preset).node_id
    return state


def toolkit(args: list[str], env: dict[str, str], *, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([TOOLKIT, *args], env=env, capture_output=True, text=True, timeout=timeout)


def generate(
    state: Path, host: Path, output: Path, env: dict[str, str], *extra: str
) -> subprocess.CompletedProcess[str]:
    return toolkit(
        [
            "cdi",
            "generate",
            "--sim-state",
            str(state),
            "--host-root",
            str(host),
            "--driver-root",
            DRIVER_ROOT,
            "--output",
            str(output),
            *extra,
        ],
        env,
    )


def load(path: Path) -> dict[str, Any]:
    doc = json.loads(path.read_text()) if path.suffix == ".json" else yaml.safe_load(path.read_text())
    assert isinstance(doc, dict)
    return doc


def validator() -> jsonschema.Draft7Validator:
    schema = json.loads((SCHEMA_DIR / "schema.json").read_text())
    defs = json.loads((SCHEMA_DIR / "defs.json").read_text())
    # defs.json declares no $schema: tell referencing it is draft-07, like schema.json that refers to it
    registry: Registry[Any] = Registry().with_resource("defs.json", DRAFT7.create_resource(defs))
    return jsonschema.Draft7Validator(schema, registry=registry)


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / f"{name}.yaml"
    if os.environ.get(UPDATE_ENV) == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path}; run with {UPDATE_ENV}=1 to create it"
    assert text == path.read_text(), f"{path} differs; if intended, rerun with {UPDATE_ENV}=1 and review"


# ---------------------------------------------------------------------------------------- tests


def test_schema_accepts_its_own_example_and_rejects_a_bad_spec() -> None:
    v = validator()
    v.validate(json.loads((SCHEMA_DIR / "example-good.json").read_text()))
    bad = {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [{"name": "0", "containerEdits": {"deviceNodes": [{"hostPath": "/x"}]}}],
    }
    assert list(v.iter_errors(bad))


@pytest.mark.parametrize("case", [*PRESETS, "dgx-a100-mig", "dgx-b200-mig"])
def test_generate_matches_schema_and_golden(
    case: str, tmp_path: Path, host: Path, env: dict[str, str]
) -> None:
    state = make_state(tmp_path, case)
    if case.startswith(("dgx-b200", "gb200")):  # R570: the host carries that driver's files
        host = fake_host(tmp_path / "host-r570", BLACKWELL_VERSION)
    out = tmp_path / "cdi" / "nvidia.yaml"
    proc = generate(state, host, out, env)
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_mode & 0o777 == 0o644
    doc = load(out)
    validator().validate(doc)
    assert doc["kind"] == "nvidia.com/gpu"
    assert doc["cdiVersion"] == "0.5.0"
    names = [d["name"] for d in doc["devices"]]
    assert names[-1] == "all"
    assert len(names) == len(set(names))
    assert "0" in names
    assert any(n.startswith("GPU-") for n in names)
    if case == "dgx-a100-mig":
        assert {"0:6", "1:2", "2:0"} <= set(names)
        assert "3:0" not in names
        assert sum(n.startswith("MIG-") for n in names) == 7 + 3 + 1
        dev = next(d for d in doc["devices"] if d["name"] == "0:0")
        assert dev["containerEdits"]["deviceNodes"][0]["path"] == "/dev/nvidia0"
        assert len(dev["containerEdits"]["deviceNodes"]) == 3
    written = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    assert any(e["event"] == "cdi_spec_written" and e["devices"] == len(names) for e in written)
    check_golden(case, out.read_text())


def test_json_output_and_list(tmp_path: Path, host: Path, env: dict[str, str]) -> None:
    state = make_state(tmp_path, "dgx-a100-mig")
    yaml_out, json_out = tmp_path / "nvidia.yaml", tmp_path / "nvidia.json"
    assert generate(state, host, yaml_out, env).returncode == 0
    assert generate(state, host, json_out, env).returncode == 0
    assert json.loads(json_out.read_text()) == load(yaml_out)
    forced = tmp_path / "forced.json"
    assert generate(state, host, forced, env, "--format", "yaml").returncode == 0
    assert yaml.safe_load(forced.read_text()) == load(yaml_out)

    expected = [f"nvidia.com/gpu={d['name']}" for d in load(yaml_out)["devices"]]
    listed = toolkit(["cdi", "list", "--sim-state", str(state), "--host-root", str(host)], env)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines() == expected
    from_file = toolkit(["cdi", "list", "--spec", str(json_out)], env)
    assert from_file.returncode == 0
    assert from_file.stdout.splitlines() == expected


def test_kind_from_env_and_stdout(tmp_path: Path, host: Path, env: dict[str, str]) -> None:
    state = make_state(tmp_path, "t4x4")
    bare = tmp_path / "bare"
    bare.mkdir()
    # no driver tree: no driver library is an error, naming the root and the layouts searched
    proc = toolkit(["cdi", "generate", "--sim-state", str(state), "--host-root", str(bare), "-o", "-"], env)
    assert proc.returncode == 1
    assert f"under the driver root {bare}" in proc.stderr
    assert "usr/lib/x86_64-linux-gnu, usr/lib/aarch64-linux-gnu, lib64, lib/x86_64-linux-gnu" in proc.stderr
    assert not proc.stdout
    env = {**env, "GPUNODE_CDI_ALLOW_MISSING_LIBRARIES": "true"}
    proc = toolkit(
        ["cdi", "generate", "--sim-state", str(state), "--output", "-", "--format", "json"],
        {**env, "NVIDIA_CTK_CDI_KIND": "example.com/accel"},
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["kind"] == "example.com/accel"
    # no driver tree: device nodes only, no mounts or control nodes
    assert doc["containerEdits"] == {"env": ["NVIDIA_VISIBLE_DEVICES=void"]}
    assert "cdi_discovery_warning" in proc.stderr
    proc = toolkit(
        ["cdi", "generate", "--sim-state", str(state), "--output", "-", "--kind", "a.com/b"],
        {**env, "GPUNODE_CDI_KIND": "c.com/d", "NVIDIA_CTK_CDI_KIND": "e.com/f"},
    )
    assert yaml.safe_load(proc.stdout)["kind"] == "a.com/b"
    proc = toolkit(
        ["cdi", "list", "--sim-state", str(state)],
        {**env, "GPUNODE_CDI_KIND": "c.com/d", "NVIDIA_CTK_CDI_KIND": "e.com/f"},
    )
    assert proc.stdout.splitlines()[0] == "c.com/d=0"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kind", "nvidia"], "vendor/class"),
        (["--device-name-strategy", "bogus"], "unknown device name strategy"),
        (["--watch", "--output", "-"], "--watch needs"),
    ],
)
def test_usage_errors_exit_2(args: list[str], message: str, tmp_path: Path, env: dict[str, str]) -> None:
    state = make_state(tmp_path, "t4x4")
    proc = toolkit(["cdi", "generate", "--sim-state", str(state), *args], env)
    assert proc.returncode == 2
    assert message in proc.stderr


def test_unwritable_output_exits_1_without_a_partial_file(
    tmp_path: Path, host: Path, env: dict[str, str]
) -> None:
    state = make_state(tmp_path, "t4x4")
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    proc = generate(state, host, blocker / "cdi" / "nvidia.yaml", env)
    assert proc.returncode == 1
    assert "cannot write" in proc.stderr
    assert "nvidia.yaml" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through directory permissions")
def test_read_only_directory_exits_1(tmp_path: Path, host: Path, env: dict[str, str]) -> None:
    state = make_state(tmp_path, "t4x4")
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "nvidia.yaml").write_text("old\n")
    ro.chmod(0o555)
    try:
        proc = generate(state, host, ro / "nvidia.yaml", env)
    finally:
        ro.chmod(0o755)
    assert proc.returncode == 1
    assert "cannot write" in proc.stderr
    assert sorted(p.name for p in ro.iterdir()) == ["nvidia.yaml"]
    assert (ro / "nvidia.yaml").read_text() == "old\n"


def test_unchanged_spec_is_not_rewritten(tmp_path: Path, host: Path, env: dict[str, str]) -> None:
    state = make_state(tmp_path, "a30x4")
    out = tmp_path / "nvidia.yaml"
    assert generate(state, host, out, env).returncode == 0
    inode = out.stat().st_ino
    proc = generate(state, host, out, env)
    assert proc.returncode == 0
    assert "cdi_spec_unchanged" in proc.stderr
    assert out.stat().st_ino == inode


# ------------------------------------------------------------------------------------------ watch


@pytest.fixture
def watcher(
    tmp_path: Path, host: Path, env: dict[str, str]
) -> Iterator[tuple[subprocess.Popen[str], Path, Path]]:
    state = tmp_path / "node.json"
    sim.init_state_file(state, "dgx-a100", force=True)
    with sim.SimNode.open(state).mutate() as st:
        st.set_mig_mode(0, 1)
        st.reset_gpu(0)
    out = tmp_path / "cdi" / "nvidia.yaml"
    log = (tmp_path / "watch.log").open("w")
    proc = subprocess.Popen(
        [
            TOOLKIT,
            "cdi",
            "generate",
            "--sim-state",
            str(state),
            "--host-root",
            str(host),
            "--driver-root",
            DRIVER_ROOT,
            "--output",
            str(out),
        ],
        env={**env, "GPUNODE_CDI_WATCH": "true"},
        stdout=subprocess.DEVNULL,
        stderr=log,
        text=True,
    )
    try:
        yield proc, state, out
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


def _wait_for(predicate: Any, timeout: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        time.sleep(0.02)
    raise AssertionError(f"condition not met within {timeout} s")


def _names(out: Path) -> list[str]:
    try:
        return [d["name"] for d in load(out)["devices"]]
    except (OSError, yaml.YAMLError, AssertionError):
        return []


def _events(tmp_path: Path, name: str) -> list[dict[str, Any]]:
    lines = (tmp_path / "watch.log").read_text().splitlines()
    return [e for e in (json.loads(line) for line in lines if line.startswith("{")) if e.get("event") == name]


def test_watch_rewrites_after_a_mig_change(
    tmp_path: Path, watcher: tuple[subprocess.Popen[str], Path, Path]
) -> None:
    proc, state, out = watcher
    _wait_for(lambda: "all" in _names(out), 30)
    _wait_for(lambda: len(_events(tmp_path, "cdi_spec_written")) == 1, 5)
    assert not any(n.startswith("MIG-") for n in _names(out))
    inode = out.stat().st_ino

    # a GPU instance without a compute instance is no MIG device: an event, but the same content
    with sim.SimNode.open(state).mutate() as st:
        ret, gi = st.create_gi(0, mig.GI_3_SLICE, None)
        assert ret == 0
    _wait_for(lambda: len(_events(tmp_path, "cdi_spec_unchanged")) >= 1, 5)
    assert out.stat().st_ino == inode

    with sim.SimNode.open(state).mutate() as st:
        assert st.create_ci(0, gi, mig.CI_3_SLICE, None)[0] == 0
    took = _wait_for(lambda: "0:0" in _names(out), 5)
    assert took < 2.5, f"the spec was rewritten {took:.2f} s after the MIG change"
    assert sum(n.startswith("MIG-") for n in _names(out)) == 1
    written = _events(tmp_path, "cdi_spec_written")
    assert len(written) == 2
    assert written[-1]["path"] == str(out)
    assert written[-1]["devices"] == len(_names(out))

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0


# ---------------------------------------------------------------------- device plugin resolution


async def _inventory(state: Path) -> tuple[list[Any], dict[int, list[Any]]]:
    nvml = await open_nvml(sim_state=state)
    try:
        gpus = await nvml.gpus()
        migs = {g.index: await nvml.mig_devices(g.index) for g in gpus if g.mig is not None and g.mig.current}
    finally:
        await nvml.close()
    return gpus, migs


@pytest.mark.parametrize("case", ["dgx-a100-mig", "mixed", "t4x4"])
async def test_device_plugin_cdi_names_resolve(
    case: str, tmp_path: Path, host: Path, env: dict[str, str]
) -> None:
    state = make_state(tmp_path, case)
    out = tmp_path / "plugin.json"
    # the plugin names its devices k8s.device-plugin.nvidia.com/gpu=<id>; a spec of that kind serves it
    assert generate(state, host, out, env, "--kind", PLUGIN_CDI_KIND).returncode == 0
    doc = load(out)
    spec_nodes = {d["name"]: [n["path"] for n in d["containerEdits"]["deviceNodes"]] for d in doc["devices"]}
    resolvable = {f"{doc['kind']}={name}" for name in spec_nodes}
    gpus, migs = await _inventory(state)
    minors = parse_mig_minors(mig_minors_table())
    checked = 0
    for mig_strategy in ("none", "mixed"):
        for id_strategy in ("uuid", "index"):
            settings = PluginSettings(
                mig_strategy=mig_strategy,
                device_id_strategy=id_strategy,
                device_list_strategies=("cdi-annotations", "cdi-cri"),
            )
            inventory = build_inventory(gpus, migs, settings, numa=lambda g: None, mig_minors=minors)
            for resource in inventory.resources:
                for device in resource.devices:
                    alloc = allocate_response(
                        [device], settings, dev_root_exists=lambda p: True, annotation_key="cdi.k8s.io/x"
                    )
                    assert alloc.cdi_devices
                    assert set(alloc.annotations["cdi.k8s.io/x"].split(",")) == set(alloc.cdi_devices)
                    for name in alloc.cdi_devices:
                        assert name in resolvable, f"{name} ({mig_strategy}/{id_strategy}) is not in the spec"
                        assert spec_nodes[name.split("=", 1)[1]] == list(device.device_nodes)
                        checked += 1
    assert checked > 0
    if case == "dgx-a100-mig":
        assert checked == 2 * 8 + 2 * (4 + 11)  # none: 8 GPUs; mixed: 4 whole GPUs + 11 MIG devices

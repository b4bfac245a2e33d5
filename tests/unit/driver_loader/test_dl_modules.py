"""The driver loader's pure parts: module types, parameter files, modprobe.d, digest, /proc parsing, plans."""

from __future__ import annotations

import pytest

from gpunode.driver_loader import modules as m
from gpunode.driver_loader.modules import Observed, ParamFile, PlanInputs

K = "5.15.0-100-generic"


@pytest.mark.parametrize(
    ("text", "source", "flavour", "installer"),
    [
        pytest.param("auto", "auto", None, None, id="auto"),
        pytest.param("precompiled", "precompiled", None, None, id="precompiled"),
        pytest.param("runcompiled", "runcompiled", None, None, id="runcompiled"),
        pytest.param("open", "auto", "open", "kernel-open", id="nvidia-open"),
        pytest.param("Proprietary", "auto", "proprietary", "kernel", id="nvidia-proprietary-any-case"),
    ],
)
def test_module_type(text: str, source: str, flavour: str | None, installer: str | None) -> None:
    parsed = m.parse_module_type(text)
    assert (parsed.source, parsed.flavour, parsed.installer_type) == (source, flavour, installer)


def test_unknown_module_type_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="auto, precompiled, runcompiled, open, proprietary"):
        m.parse_module_type("dkms")


@pytest.mark.parametrize(
    ("text", "params"),
    [
        pytest.param("", (), id="empty"),
        pytest.param("NVreg_EnableGpuFirmware=0", ("NVreg_EnableGpuFirmware=0",), id="one"),
        pytest.param("a=1 b=2\nc=3\n", ("a=1", "b=2", "c=3"), id="spaces-and-newlines"),
        pytest.param("# all comment\na=1 # trailing\n  \n", ("a=1",), id="comments"),
        pytest.param(
            'NVreg_RegistryDwords="RMA=1;RMB=2 x" z=1',
            ('NVreg_RegistryDwords="RMA=1;RMB=2 x"', "z=1"),
            id="quoted-value-with-space",
        ),
        pytest.param('k="a#b"', ('k="a#b"',), id="hash-inside-quotes"),
        pytest.param("uvm_perf_prefetch_enable", ("uvm_perf_prefetch_enable",), id="bare-flag"),
    ],
)
def test_parse_params(text: str, params: tuple[str, ...]) -> None:
    assert m.parse_params(text) == params


@pytest.mark.parametrize(
    ("text", "error"),
    [
        pytest.param('a="unterminated', "line 1: unterminated", id="quote"),
        pytest.param("ok=1\n$(reboot)=1", "line 2", id="shell-ish"),
        pytest.param("=1", "not a module parameter", id="no-name"),
    ],
)
def test_parse_params_errors_name_the_line(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error.replace("$", r"\$").replace("(", r"\(")):
        m.parse_params(text)


def _pf(module: str, *params: str) -> ParamFile:
    return ParamFile(module, f"/drivers/{module}.conf", " ".join(params), params)


def test_modprobe_conf_appends_coherent_mode_for_nvidia() -> None:
    text = m.render_modprobe_conf(
        [_pf("nvidia", "NVreg_EnableGpuFirmware=0"), _pf("nvidia-uvm", "uvm_perf_prefetch_enable=0")],
        coherent=True,
    )
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert lines == [
        "options nvidia NVreg_EnableGpuFirmware=0 NVreg_CoherentGPUMemoryMode=driver",
        "options nvidia-uvm uvm_perf_prefetch_enable=0",
    ]


def test_modprobe_conf_keeps_the_users_coherent_mode_and_old_branches_get_none() -> None:
    user = m.render_modprobe_conf([_pf("nvidia", "NVreg_CoherentGPUMemoryMode=numa")], coherent=True)
    assert "options nvidia NVreg_CoherentGPUMemoryMode=numa\n" in user
    assert "driver" not in user.split("\n", 1)[1]
    assert "options" not in m.render_modprobe_conf([], coherent=False)
    assert m.render_modprobe_conf([], coherent=True).endswith(
        "options nvidia NVreg_CoherentGPUMemoryMode=driver\n"
    )


@pytest.mark.parametrize(
    ("version", "wanted"),
    [("580.65.06", True), ("590.1", True), ("570.124.06", False), ("535.104.05", False), (None, True)],
)
def test_coherent_param_from_branch_580(version: str | None, wanted: bool) -> None:
    assert m.wants_coherent_param(version) is wanted


def test_digest_changes_with_every_input_and_only_then() -> None:
    base = {
        "driver_version": "580.65.06",
        "driver_root": "/",
        "module_type": "auto",
        "kernel": K,
        "params": [_pf("nvidia", "a=1")],
        "rdma": False,
    }
    digest = m.config_digest(**base)  # type: ignore[arg-type]
    assert digest == m.config_digest(**base)  # type: ignore[arg-type]
    assert len(digest) == 64
    changes = {
        "driver_version": "580.65.07",
        "driver_root": "/run/nvidia/driver",
        "module_type": "open",
        "kernel": "6.8.0-1-generic",
        "params": [_pf("nvidia", "a=2")],
        "rdma": True,
    }
    for key, value in changes.items():
        assert m.config_digest(**{**base, key: value}) != digest, key  # type: ignore[arg-type]


def test_proc_devices_character_section_only() -> None:
    text = (
        "Character devices:\n  1 mem\n195 nvidia-frontend\n235 nvidia-caps\n508 nvidia-uvm\n\n"
        "Block devices:\n  8 sd\n195 nvidia-frontend\n"
    )
    assert m.parse_proc_devices(text) == {
        "mem": 1,
        "nvidia-frontend": 195,
        "nvidia-caps": 235,
        "nvidia-uvm": 508,
    }


def test_gpu_minor_and_capabilities_and_version() -> None:
    info = "Model: \t\t NVIDIA H100\nBus Location: \t 0000:07:00.0\nDevice Minor: \t 3\nGPU Excluded:\t No\n"
    assert m.parse_gpu_minor(info) == 3
    assert m.parse_gpu_minor("Model: x\n") is None
    assert m.parse_capability("DeviceFileMinor: 12\nDeviceFileMode: 292\n") == m.Capability(12, 0o444)
    assert m.parse_capability("DeviceFileMinor: 1\n") == m.Capability(1, 0o444)
    assert m.parse_capability("nothing\n") is None
    proprietary = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"
    open_ = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  (dvs)\n"
    assert m.parse_driver_version(proprietary) == "535.104.05"
    assert m.parse_driver_version(open_) == "580.65.06"
    assert m.parse_driver_version("garbage") is None


@pytest.mark.parametrize(
    ("module", "present", "holders", "expected"),
    [
        pytest.param(
            "nvidia", ("nvidia", "nvidia_uvm", "nvidia_modeset"), None, 2, id="static-two-dependents"
        ),
        pytest.param("nvidia", ("nvidia", "nvidia_uvm", "nvidia_peermem"), None, 2, id="static-peermem"),
        pytest.param("nvidia", ("nvidia",), None, 0, id="alone"),
        pytest.param(
            "nvidia_modeset", ("nvidia", "nvidia_modeset", "nvidia_drm"), None, 1, id="drm-on-modeset"
        ),
        pytest.param("nvidia", ("nvidia",), ["nvidia_uvm", "gdrdrv"], 1, id="holders-count-only-ours"),
    ],
)
def test_expected_refs(
    module: str, present: tuple[str, ...], holders: list[str] | None, expected: int
) -> None:
    assert m.expected_refs(module, present, holders) == expected


@pytest.mark.parametrize(
    ("os_id", "package"),
    [
        ("ubuntu", f"linux-headers-{K}"),
        ("rhel", f"kernel-devel-{K}"),
        ("sles", "kernel-default-devel"),
        (None, K),
    ],
)
def test_headers_hint(os_id: str | None, package: str) -> None:
    assert package in m.headers_hint(K, os_id)


# ----------------------------------------------------------------------------------------- plans

DIGEST = "d" * 64


def _inputs(**kw: object) -> PlanInputs:
    base: dict[str, object] = {
        "digest": DIGEST,
        "module_type": m.parse_module_type("auto"),
        "rdma": False,
        "force_reinstall": False,
        "driver_version": "580.65.06",
        "modules_target": f"/lib/modules/{K}/kernel/drivers/video",
    }
    base.update(kw)
    return PlanInputs(**base)  # type: ignore[arg-type]


def test_plan_host_driver_only_writes_readiness() -> None:
    plan = m.plan_init(Observed(kernel=K, host_driver="550.54.15"), _inputs())
    assert plan.host_driver == "550.54.15"
    assert plan.load == ()
    assert plan.source is None
    assert plan.describe() == ["host driver 550.54.15 is installed: only write the readiness files"]


def test_plan_clean_host_with_precompiled_modules() -> None:
    obs = Observed(kernel=K, modules_dir="/x/video", persistenced="/usr/bin/nvidia-persistenced")
    plan = m.plan_init(obs, _inputs())
    assert plan.source is not None
    assert plan.source.kind == "present"
    assert plan.load == ("nvidia", "nvidia-uvm", "nvidia-modeset")
    assert not plan.fast_path
    assert plan.unload == ()
    assert m.plan_init(obs, _inputs(rdma=True)).load[-1] == "nvidia-peermem"


def test_plan_fast_path_loads_only_what_is_missing() -> None:
    obs = Observed(kernel=K, loaded=("nvidia",), recorded_digest=DIGEST)
    plan = m.plan_init(obs, _inputs())
    assert plan.fast_path
    assert plan.unload == ()
    assert plan.source is None
    assert plan.load == ("nvidia-uvm", "nvidia-modeset")
    full = Observed(kernel=K, loaded=("nvidia", "nvidia_uvm", "nvidia_modeset"), recorded_digest=DIGEST)
    assert m.plan_init(full, _inputs()).load == ()


@pytest.mark.parametrize(
    ("recorded", "force"),
    [pytest.param("other", False, id="digest-changed"), pytest.param(DIGEST, True, id="force-reinstall")],
)
def test_plan_reloads_a_driver_loaded_with_another_configuration(recorded: str, force: bool) -> None:
    obs = Observed(
        kernel=K,
        loaded=("nvidia_modeset", "nvidia_uvm", "nvidia"),
        recorded_digest=recorded,
        modules_dir="/v",
    )
    plan = m.plan_init(obs, _inputs(force_reinstall=force))
    assert not plan.fast_path
    assert plan.unload == ("nvidia_modeset", "nvidia_uvm", "nvidia")  # dependents first
    assert plan.load == ("nvidia", "nvidia-uvm", "nvidia-modeset")


def test_plan_build_with_the_installer_when_headers_exist() -> None:
    obs = Observed(
        kernel=K, headers="/usr/src/linux-headers-x", installer="/bin/nvidia-installer", dkms="/bin/dkms"
    )
    plan = m.plan_init(obs, _inputs(module_type=m.parse_module_type("open")))
    assert plan.source is not None
    assert plan.source.kind == "installer"
    argv = plan.source.argv
    assert argv[:2] == ("/bin/nvidia-installer", "--kernel-module-only")
    assert f"--kernel-name={K}" in argv
    assert "--kernel-source-path=/usr/src/linux-headers-x" in argv
    assert "-m=kernel-open" in argv
    assert "--skip-module-load" in argv
    assert "--no-nouveau-check" in argv
    old = m.plan_init(obs, _inputs(driver_version="535.104.05")).source
    assert old is not None
    assert "--skip-module-load" not in old.argv
    assert not any(a.startswith("-m=") for a in old.argv)


def test_plan_build_with_dkms_without_installer() -> None:
    obs = Observed(kernel=K, headers="/h", dkms="/usr/sbin/dkms")
    plan = m.plan_init(obs, _inputs())
    assert plan.source is not None
    assert plan.source.argv == (
        "/usr/sbin/dkms",
        "install",
        "nvidia/580.65.06",
        "-k",
        K,
    )
    no_version = m.plan_init(obs, _inputs(driver_version=None))
    assert no_version.source is None
    assert "DRIVER_VERSION" in (no_version.source_error or "")


def test_plan_runcompiled_builds_even_with_precompiled_modules() -> None:
    obs = Observed(kernel=K, modules_dir="/v", headers="/h", installer="/i")
    plan = m.plan_init(obs, _inputs(module_type=m.parse_module_type("runcompiled")))
    assert plan.source is not None
    assert plan.source.kind == "installer"


@pytest.mark.parametrize(
    ("obs", "module_type", "words"),
    [
        pytest.param(
            Observed(kernel=K, os_id="ubuntu"),
            "auto",
            [K, f"linux-headers-{K}", "no kernel headers"],
            id="no-headers",
        ),
        pytest.param(
            Observed(kernel=K, headers="/h"), "precompiled", [K, "never builds"], id="precompiled-missing"
        ),
        pytest.param(
            Observed(kernel=K, headers="/h"), "auto", ["neither nvidia-installer nor dkms"], id="no-builder"
        ),
    ],
)
def test_plan_explains_why_there_is_no_module_source(
    obs: Observed, module_type: str, words: list[str]
) -> None:
    plan = m.plan_init(obs, _inputs(module_type=m.parse_module_type(module_type)))
    assert plan.source is None
    for word in words:
        assert word in (plan.source_error or "")
    assert any("ERROR" in line for line in plan.describe())


def test_plan_nouveau() -> None:
    assert m.plan_init(Observed(kernel=K, nouveau="module", modules_dir="/v"), _inputs()).nouveau == "unload"
    assert (
        m.plan_init(Observed(kernel=K, nouveau="builtin", modules_dir="/v"), _inputs()).nouveau == "builtin"
    )

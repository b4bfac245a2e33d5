"""XID policy (NVIDIA's env vars) and the health tracker's recovery rules, by table."""

from __future__ import annotations

import pytest

from gpunode.device_plugin.health import (
    Health,
    HealthConfigError,
    HealthTracker,
    XidPolicy,
)
from gpunode.nvml.xids import APPLICATION_XIDS


@pytest.mark.parametrize(
    ("disable", "enable", "xid", "fatal"),
    [
        pytest.param("", "", 79, True, id="default-79-fatal"),
        pytest.param("", "", 13, False, id="default-13-ignored"),
        pytest.param("", "", 109, False, id="default-109-ignored"),
        pytest.param("48", "", 48, False, id="disable-extra-48"),
        pytest.param("48", "", 79, True, id="disable-48-keeps-79"),
        pytest.param("all", "", 79, False, id="disable-all"),
        pytest.param("xids", "", 48, False, id="disable-xids"),
        pytest.param("", "13", 13, True, id="enable-13-over-default-ignore"),
        pytest.param("13", "13", 13, True, id="enable-wins-over-disable"),
        pytest.param("", "all", 31, True, id="enable-all"),
        pytest.param("all", "79", 79, True, id="disable-all-enable-79"),
        pytest.param("all", "79", 48, False, id="disable-all-enable-79-not-48"),
        pytest.param(" 48 , 63 ", "", 63, False, id="spaces"),
        pytest.param("0x30", "", 48, False, id="hex"),
    ],
)
def test_xid_policy_from_env(disable: str, enable: str, xid: int, fatal: bool) -> None:
    env = {"DP_DISABLE_HEALTHCHECKS": disable, "DP_ENABLE_HEALTHCHECKS": enable}
    assert XidPolicy.from_env(env).is_fatal(xid) is fatal


def test_defaults_ignore_nvidias_application_xids() -> None:
    policy = XidPolicy.from_env({})
    assert policy.enabled
    assert policy.ignored == APPLICATION_XIDS == {13, 31, 43, 45, 68, 109}


@pytest.mark.parametrize("name", ["DP_DISABLE_HEALTHCHECKS", "DP_ENABLE_HEALTHCHECKS"])
def test_bad_values_name_the_variable(name: str) -> None:
    with pytest.raises(HealthConfigError, match=name):
        XidPolicy.from_env({name: "48,sometimes"})


def test_recoverable_xid_recovers_after_the_hold_down_only() -> None:
    t = HealthTracker(recovery_period=60)
    policy = XidPolicy()
    assert t.on_xid("GPU-a", 32, policy, now=100)
    assert t.health("GPU-a") is Health.UNHEALTHY
    assert t.health("GPU-b") is Health.HEALTHY
    assert not t.on_probe("GPU-a", True, now=150)
    assert not t.on_probe("GPU-a", False, now=155)  # NVML failed: the hold-down starts again
    assert not t.on_probe("GPU-a", True, now=200)
    assert t.on_probe("GPU-a", True, now=215)
    assert t.health("GPU-a") is Health.HEALTHY


def test_new_fatal_event_restarts_the_hold_down() -> None:
    t = HealthTracker(recovery_period=60)
    t.on_xid("GPU-a", 32, XidPolicy(), now=0)
    assert not t.on_xid("GPU-a", 32, XidPolicy(), now=50)  # already unhealthy: no change reported
    assert not t.on_probe("GPU-a", True, now=100)
    assert t.on_probe("GPU-a", True, now=110)


@pytest.mark.parametrize("xid", [48, 63, 64, 74, 79, 92, 94, 95, 119, 120])
def test_reset_required_xids_never_recover(xid: int) -> None:
    t = HealthTracker(recovery_period=1)
    t.on_xid("GPU-a", xid, XidPolicy(), now=0)
    assert not t.on_probe("GPU-a", True, now=1000)
    assert t.health("GPU-a") is Health.UNHEALTHY


def test_a_milder_event_does_not_make_a_reset_required_gpu_recoverable() -> None:
    t = HealthTracker(recovery_period=1)
    t.on_xid("GPU-a", 48, XidPolicy(), now=0)
    t.on_xid("GPU-a", 32, XidPolicy(), now=1)
    assert not t.on_probe("GPU-a", True, now=1000)


def test_lost_gpu_recovers_once_it_answers_for_the_hold_down() -> None:
    t = HealthTracker(recovery_period=30)
    assert t.on_lost("GPU-a", now=0)
    assert not t.on_probe("GPU-a", True, now=100)  # answers again: the hold-down starts now
    assert t.reason("GPU-a") == "recovering from a lost GPU"
    assert not t.on_probe("GPU-a", True, now=120)
    assert t.on_probe("GPU-a", True, now=131)


def test_recovery_disabled_with_zero_period() -> None:
    t = HealthTracker(recovery_period=0)
    t.on_xid("GPU-a", 32, XidPolicy(), now=0)
    assert not t.on_probe("GPU-a", True, now=10**6)


def test_double_bit_ecc_is_fatal_and_permanent() -> None:
    t = HealthTracker(recovery_period=1)
    assert t.on_double_bit_ecc("GPU-a", XidPolicy(), now=0)
    assert not t.on_probe("GPU-a", True, now=100)
    assert not HealthTracker().on_double_bit_ecc("GPU-a", XidPolicy(enabled=False), now=0)


def test_forget_drops_gpus_no_longer_present() -> None:
    t = HealthTracker()
    t.on_xid("GPU-a", 79, XidPolicy(), now=0)
    t.forget(["GPU-b"])
    assert t.unhealthy() == {}

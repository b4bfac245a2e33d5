"""gpunode.common.metrics: a per-agent registry with the standard metrics."""

from __future__ import annotations

import platform

from prometheus_client import generate_latest

from gpunode.common.metrics import create_metrics


def test_build_info_and_errors_are_exposed() -> None:
    metrics = create_metrics("device-plugin", "1.2.3", revision="abc123", process_metrics=False)
    metrics.count_error("kubelet_register")
    metrics.count_error("kubelet_register")
    metrics.count_error("health_stream", 3)
    text = generate_latest(metrics.registry).decode()
    python = platform.python_version()
    labels = f'agent="device-plugin",python_version="{python}",revision="abc123",version="1.2.3"'
    build_info = f"gpunode_build_info{{{labels}}} 1.0"
    assert build_info in text
    assert 'gpunode_errors_total{agent="device-plugin",reason="kubelet_register"} 2.0' in text
    assert metrics.error_count("health_stream") == 3.0
    assert metrics.error_count("never") == 0.0


def test_registries_are_independent_per_agent() -> None:
    a = create_metrics("a", "1", process_metrics=False)
    b = create_metrics("b", "1", process_metrics=False)
    a.count_error("x")
    assert a.error_count("x") == 1.0
    assert b.error_count("x") == 0.0
    assert 'agent="a"' not in generate_latest(b.registry).decode()


def test_mark_success_uses_the_clock() -> None:
    metrics = create_metrics("exporter", "1", process_metrics=False, clock=lambda: 1700000000.0)
    metrics.mark_success("sampler")
    value = metrics.registry.get_sample_value(
        "gpunode_last_success_timestamp_seconds", {"agent": "exporter", "loop": "sampler"}
    )
    assert value == 1700000000.0


def test_process_and_python_collectors_are_optional() -> None:
    with_process = generate_latest(create_metrics("a", "1").registry).decode()
    without = generate_latest(create_metrics("a", "1", process_metrics=False).registry).decode()
    assert "python_info" in with_process
    assert "process_cpu_seconds_total" in with_process
    assert "python_info" not in without


def test_version_defaults_to_the_package_version() -> None:
    from gpunode import __version__

    metrics = create_metrics("a", process_metrics=False)
    assert f'version="{__version__}"' in generate_latest(metrics.registry).decode()

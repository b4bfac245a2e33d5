"""Importing gpunode.common has no side effects and does not reach for NVML."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from helpers.importcheck import assert_import_is_inert

MODULES = (
    "atomic",
    "cli",
    "config",
    "errors",
    "hostpaths",
    "http",
    "logging",
    "metrics",
    "runtime",
    "sdnotify",
)


def test_import_does_not_load_nvml_or_configure_anything() -> None:
    assert_import_is_inert("gpunode.common." + name for name in MODULES)


def test_agents_load_the_kubernetes_client_only_when_they_use_it() -> None:
    """lightkube costs start-up time and memory; an agent run without Kubernetes must not pay for it."""
    code = textwrap.dedent(
        """
        import sys
        for name in ("gpunode.device_plugin.cli", "gpunode.feature_discovery.cli", "gpunode.exporter.cli"):
            __import__(name)
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("lightkube", "httpx2"))
        print(",".join(loaded) or "none")
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "none"

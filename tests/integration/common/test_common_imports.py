"""Importing gpunode.common has no side effects and does not reach for NVML."""

from __future__ import annotations

import subprocess
import sys
import textwrap

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
    code = textwrap.dedent(
        f"""
        import builtins, logging, socket, sys
        opened = []
        real_open = builtins.open
        def spy_open(file, *args, **kwargs):
            opened.append(str(file))
            return real_open(file, *args, **kwargs)
        builtins.open = spy_open
        class NoSockets(socket.socket):
            def __init__(self, *args, **kwargs):
                raise AssertionError("socket created at import time")
        socket.socket = NoSockets
        for name in {MODULES!r}:
            __import__("gpunode.common." + name)
        builtins.open = real_open
        assert "pynvml" not in sys.modules, "pynvml imported"
        assert not [m for m in sys.modules if m.startswith("gpunode.nvml")], "gpunode.nvml imported"
        assert logging.getLogger().handlers == [], "logging configured at import"
        assert opened == [], opened
        print("ok")
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


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

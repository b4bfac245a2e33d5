"""Importing gpunode.kube has no side effects nor NVML, and only its client loads lightkube."""

from __future__ import annotations

import subprocess
import sys
import textwrap

MODULES = ("api", "client", "drain", "operands", "selectors")


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
            __import__("gpunode.kube." + name)
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


def test_types_errors_and_rules_load_without_the_client_library() -> None:
    """Type hints, except clauses, operand pausing and drain rules cost no lightkube / httpx2 / pydantic."""
    code = textwrap.dedent(
        """
        import sys
        import gpunode.kube
        import gpunode.kube.api, gpunode.kube.drain, gpunode.kube.operands, gpunode.kube.selectors
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("lightkube", "httpx2", "pydantic"))
        print(",".join(loaded) or "none")
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "none"

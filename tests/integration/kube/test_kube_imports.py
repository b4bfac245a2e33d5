"""Importing gpunode.kube has no side effects nor NVML, and only its client loads lightkube."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from helpers.importcheck import assert_import_is_inert

MODULES = ("api", "client", "cluster", "drain", "operands", "selectors")


def test_import_does_not_load_nvml_or_configure_anything() -> None:
    assert_import_is_inert("gpunode.kube." + name for name in MODULES)


def test_types_errors_and_rules_load_without_the_client_library() -> None:
    """Type hints, except clauses, operand pausing and drain rules cost no lightkube / httpx2 / pydantic."""
    code = textwrap.dedent(
        """
        import sys
        import gpunode.kube
        import gpunode.kube.api, gpunode.kube.cluster, gpunode.kube.drain, gpunode.kube.operands
        import gpunode.kube.selectors
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("lightkube", "httpx2", "pydantic"))
        print(",".join(loaded) or "none")
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "none"
